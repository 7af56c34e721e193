//! `ops::matmul_epilogue::<dtype>::…` and `graph::matmul_epilogue_…`: a matmul whose
//! elementwise successors (bias, activation, residual, SwiGLU gate) run where the GEMM stores
//! its result, checked bitwise against the unfused operators on the same device — on every
//! GEMM form a backend has (tiles, GEMV, the host adapters' quad variants, f16/bf16 through
//! f32), with broadcast and strided operands, batches and a strided output.

use unirt::graph::PlanOptions;
use unirt::ops::fused::{FusedProgram, FusedSrc, FusedStep};
use unirt::ops::matmul::matmul_epilogue;
use unirt::ops::{BinaryOp, UnaryOp};
use unirt::tensor::{DType, Tensor};
use unirt::Runtime;

use crate::{ensure, expect_err, Case, Ctx, Failure};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "ops::matmul_epilogue::f32::matches_unfused",
            needs: &[],
            run: |c| epilogue_op(c, DType::F32),
        },
        Case {
            name: "ops::matmul_epilogue::f16::matches_unfused",
            needs: &[],
            run: |c| epilogue_op(c, DType::F16),
        },
        Case {
            name: "ops::matmul_epilogue::bf16::matches_unfused",
            needs: &[],
            run: |c| epilogue_op(c, DType::BF16),
        },
        Case {
            name: "ops::matmul_epilogue::f32::bad_input",
            needs: &[],
            run: bad_input,
        },
        Case {
            name: "graph::matmul_epilogue_fusion_matches_unfused",
            needs: &[],
            run: graph_fusion,
        },
    ]
}

use FusedSrc::{Input, Step};

fn rand(ctx: &Ctx, shape: &[usize], seed: u64, dtype: DType) -> Result<Tensor, Failure> {
    Ok(Tensor::rand_uniform(
        shape, -1.0, 1.0, seed, dtype, ctx.device,
    )?)
}

/// Runs `program` as a `matmul_epilogue` of `a·b` into `out` (any layout).
fn run_into(
    a: &Tensor,
    b: &Tensor,
    extras: &[&Tensor],
    alpha: f64,
    program: FusedProgram,
    out: &Tensor,
) -> Result<(), Failure> {
    let descs: Vec<_> = extras.iter().map(|t| t.desc()).collect();
    let plan = matmul_epilogue(&a.desc(), &b.desc(), &descs, alpha, program, &out.desc())?;
    let ws = match plan.workspace_size() {
        0 => None,
        n => Some(Tensor::empty(&[n], DType::U8, a.device())?),
    };
    let mut inputs = vec![a, b];
    inputs.extend(extras);
    plan.launch(&inputs, &[out], ws.as_ref(), a.stream()?)?;
    Ok(())
}

fn same(got: &Tensor, want: &Tensor, what: &str) -> Result<(), Failure> {
    ensure!(
        got.contiguous()?.to_bytes()? == want.to_bytes()?,
        "{what}: the epilogue differs from the unfused operators"
    );
    Ok(())
}

fn epilogue_op(ctx: &Ctx, dtype: DType) -> Result<(), Failure> {
    let r = |shape: &[usize], seed| rand(ctx, shape, seed, dtype);
    // Batched (B broadcast over the batch), edges off every tile: relu(a·b + bias) + res.
    let (a, b) = (r(&[2, 37, 70], 1)?, r(&[70, 45], 2)?);
    let (bias, res) = (r(&[45], 3)?, r(&[2, 37, 45], 4)?);
    let prog = FusedProgram {
        steps: vec![
            FusedStep::Binary(BinaryOp::Add, Input(0), Input(1)),
            FusedStep::Unary(UnaryOp::Relu, Step(0)),
            FusedStep::Binary(BinaryOp::Add, Step(1), Input(2)),
        ],
    };
    let want = a.matmul(&b)?.add(&bias)?.relu()?.add(&res)?;
    let got = Tensor::empty(&[2, 37, 45], dtype, ctx.device)?;
    run_into(&a, &b, &[&bias, &res], 1.0, prog.clone(), &got)?;
    same(&got, &want, "batched, bias and residual")?;

    // The same into a transposed output (strided stores).
    let t = Tensor::empty(&[2, 45, 37], dtype, ctx.device)?.transpose(1, 2)?;
    run_into(&a, &b, &[&bias, &res], 1.0, prog, &t)?;
    same(&t, &want, "strided output")?;

    // Shapes the host adapters' quad variant takes (k, n multiples of four), a per-row scale
    // of shape [m, 1] (read a lane at a time there), alpha: gelu(0.5·a·b · s) - bias.
    let (a, b) = (r(&[33, 64], 5)?, r(&[64, 128], 6)?);
    let (scale, bias) = (r(&[33, 1], 7)?, r(&[128], 8)?);
    let prog = FusedProgram {
        steps: vec![
            FusedStep::Binary(BinaryOp::Mul, Input(0), Input(1)),
            FusedStep::Unary(UnaryOp::Gelu, Step(0)),
            FusedStep::Binary(BinaryOp::Sub, Step(1), Input(2)),
        ],
    };
    let want = a
        .matmul(&b)?
        .mul_scalar(0.5)?
        .mul(&scale)?
        .gelu()?
        .sub(&bias)?;
    // The plain matmul with alpha is what the epilogue's product is: compare against it.
    let scaled = unirt::ops::matmul::matmul(&a.desc(), &b.desc(), 0.5)?.run1(&[&a, &b])?;
    let want_alpha = scaled.mul(&scale)?.gelu()?.sub(&bias)?;
    let got = Tensor::empty(&[33, 128], dtype, ctx.device)?;
    run_into(&a, &b, &[&scale, &bias], 0.5, prog.clone(), &got)?;
    same(&got, &want_alpha, "quad shapes, per-row scale, alpha")?;
    // alpha·x is exact in binary floating point for 0.5: both spellings agree.
    same(&got, &want, "alpha as a separate multiply")?;

    // Quad shapes with a bias row and a residual of C's shape (the host adapters read both
    // through textures, beside A and B): relu(a·b + bias) + res.
    let (a2, b2) = (r(&[40, 64], 21)?, r(&[64, 128], 22)?);
    let (bias2, res2) = (r(&[128], 23)?, r(&[40, 128], 24)?);
    let prog2 = FusedProgram {
        steps: vec![
            FusedStep::Binary(BinaryOp::Add, Input(0), Input(1)),
            FusedStep::Unary(UnaryOp::Relu, Step(0)),
            FusedStep::Binary(BinaryOp::Add, Step(1), Input(2)),
        ],
    };
    let want2 = a2.matmul(&b2)?.add(&bias2)?.relu()?.add(&res2)?;
    let got2 = Tensor::empty(&[40, 128], dtype, ctx.device)?;
    run_into(&a2, &b2, &[&bias2, &res2], 1.0, prog2.clone(), &got2)?;
    same(&got2, &want2, "quad shapes, bias row and residual")?;

    // The same with B a matrix per batch and rows of C shorter than a workgroup's columns
    // (attention's p·v over a small head dim: the host adapters give each invocation fewer
    // quads of columns — one for 6 rows, two for 16 — and some invocations none).
    for (i, &(batch, m)) in [(3, 6), (2, 16)].iter().enumerate() {
        let seed = 25 + 4 * i as u64;
        let (a3, b3) = (r(&[batch, m, 64], seed)?, r(&[batch, 64, 40], seed + 1)?);
        let (bias3, res3) = (r(&[40], seed + 2)?, r(&[batch, m, 40], seed + 3)?);
        let want3 = a3.matmul(&b3)?.add(&bias3)?.relu()?.add(&res3)?;
        let got3 = Tensor::empty(&[batch, m, 40], dtype, ctx.device)?;
        run_into(&a3, &b3, &[&bias3, &res3], 1.0, prog2.clone(), &got3)?;
        same(&got3, &want3, "quad shapes, short rows, B per batch")?;
    }

    // Tensors starting 1 and 2 elements into their buffers (the scalar variant there).
    let a_off = r(&[33 * 64 + 1], 9)?
        .narrow(0, 1, 33 * 64)?
        .reshape(&[33, 64])?;
    let s_off = r(&[35], 10)?.narrow(0, 2, 33)?.reshape(&[33, 1])?;
    let want = scaled_mm(&a_off, &b)?.mul(&s_off)?.gelu()?.sub(&bias)?;
    let got = Tensor::empty(&[33, 128], dtype, ctx.device)?;
    run_into(&a_off, &b, &[&s_off, &bias], 0.5, prog, &got)?;
    same(&got, &want, "operands off a multiple of four")?;

    // Decode (one row, the GEMV forms) with a transposed weight: swiglu(up, a·wᵀ).
    let (x, w, up) = (r(&[1, 96], 11)?, r(&[200, 96], 12)?, r(&[1, 200], 13)?);
    let wt = w.transpose(0, 1)?;
    let prog = FusedProgram {
        steps: vec![FusedStep::Swiglu(Input(1), Input(0))],
    };
    let want = up.swiglu(&x.matmul(&wt)?)?;
    let got = Tensor::empty(&[1, 200], dtype, ctx.device)?;
    run_into(&x, &wt, &[&up], 1.0, prog.clone(), &got)?;
    same(&got, &want, "one row, transposed weight")?;
    let w2 = r(&[96, 200], 14)?;
    let want = up.swiglu(&x.matmul(&w2)?)?;
    run_into(&x, &w2, &[&up], 1.0, prog.clone(), &got)?;
    same(&got, &want, "one row")?;

    // One row over weights large enough that the CPU splits k as well as n (two column
    // blocks; the epilogue runs once a block's segments are summed), and over a large
    // transposed weight (read four columns at a time): swiglu(up, x·w).
    let (x, up) = (r(&[1, 520], 30)?, r(&[1, 4100], 31)?);
    for (i, w) in [r(&[520, 4100], 32)?, r(&[4100, 520], 33)?.transpose(0, 1)?]
        .iter()
        .enumerate()
    {
        let want = up.swiglu(&x.matmul(w)?)?;
        let got = Tensor::empty(&[1, 4100], dtype, ctx.device)?;
        run_into(&x, w, &[&up], 1.0, prog.clone(), &got)?;
        same(
            &got,
            &want,
            ["one row, large weight", "one row, large transposed weight"][i],
        )?;
    }
    // Three rows over a large weight and a large transposed one (read in place for all rows
    // at once on the CPU).
    let (x3, up3, w3) = (r(&[3, 520], 34)?, r(&[3, 1030], 35)?, r(&[520, 1030], 36)?);
    let want = up3.swiglu(&x3.matmul(&w3)?)?;
    let got = Tensor::empty(&[3, 1030], dtype, ctx.device)?;
    run_into(&x3, &w3, &[&up3], 1.0, prog.clone(), &got)?;
    same(&got, &want, "three rows, large weight")?;
    let w3t = r(&[1030, 520], 37)?.transpose(0, 1)?;
    let want = up3.swiglu(&x3.matmul(&w3t)?)?;
    run_into(&x3, &w3t, &[&up3], 1.0, prog.clone(), &got)?;
    same(&got, &want, "three rows, large transposed weight")?;

    // Large enough that the CPU splits it into parallel panels: silu(a·b) · a·b is not
    // expressible (the product is read once per step), so: silu(a·b + res).
    let (a, b, res) = (r(&[300, 64], 15)?, r(&[64, 260], 16)?, r(&[300, 260], 17)?);
    let prog = FusedProgram {
        steps: vec![
            FusedStep::Binary(BinaryOp::Add, Input(1), Input(0)),
            FusedStep::Unary(UnaryOp::Silu, Step(0)),
        ],
    };
    let want = res.add(&a.matmul(&b)?)?.silu()?;
    let got = Tensor::empty(&[300, 260], dtype, ctx.device)?;
    run_into(&a, &b, &[&res], 1.0, prog, &got)?;
    same(&got, &want, "parallel panels, residual first")?;

    // Enough 128×128 tiles for a GPU's large-tile GEMM (wgpu), edges partial both ways. Not
    // on the GL adapter forced into the GPU forms (CI's UNIRT_WGPU_GPU_FORMS=1 stage): llvmpipe
    // runs this product there as one dispatch of about 6 s, and the next call's wait for the
    // GL context, which the dispatch holds, ends in wgpu-hal's panic after 6 s (a 2-core CI
    // run failed so). lavapipe runs the same kernel in that stage.
    let gl_gpu_forms = unirt::Backend::info(&**ctx).api == "gl"
        && std::env::var_os("UNIRT_WGPU_GPU_FORMS").is_some();
    if gl_gpu_forms {
        return Ok(());
    }
    let (a, b, res) = (
        r(&[1030, 13], 18)?,
        r(&[13, 2060], 19)?,
        r(&[1030, 2060], 20)?,
    );
    let prog = FusedProgram {
        steps: vec![
            FusedStep::Binary(BinaryOp::Add, Input(0), Input(1)),
            FusedStep::Unary(UnaryOp::Relu, Step(0)),
        ],
    };
    let want = a.matmul(&b)?.add(&res)?.relu()?;
    let got = Tensor::empty(&[1030, 2060], dtype, ctx.device)?;
    run_into(&a, &b, &[&res], 1.0, prog, &got)?;
    same(&got, &want, "large tiles")?;
    Ok(())
}

fn scaled_mm(a: &Tensor, b: &Tensor) -> Result<Tensor, Failure> {
    Ok(unirt::ops::matmul::matmul(&a.desc(), &b.desc(), 0.5)?.run1(&[a, b])?)
}

fn bad_input(ctx: &Ctx) -> Result<(), Failure> {
    let r = |shape: &[usize], seed| rand(ctx, shape, seed, DType::F32);
    let (a, b, out) = (r(&[4, 8], 1)?, r(&[8, 6], 2)?, r(&[4, 6], 3)?);
    let relu = |src| FusedProgram {
        steps: vec![FusedStep::Unary(UnaryOp::Relu, src)],
    };
    let plan =
        |extras: &[&Tensor], prog: FusedProgram, out: &Tensor| -> unirt::Result<unirt::ops::Plan> {
            let descs: Vec<_> = extras.iter().map(|t| t.desc()).collect();
            matmul_epilogue(&a.desc(), &b.desc(), &descs, 1.0, prog, &out.desc())
        };
    let bias = r(&[6], 4)?;
    expect_err(
        plan(&[&bias], relu(Input(1)), &out),
        &["bad_param"],
        "a program that never reads the product",
    )?;
    expect_err(
        plan(&[], relu(Input(1)), &out),
        &["bad_param"],
        "a step reading an operand that does not exist",
    )?;
    expect_err(
        plan(&[], FusedProgram::default(), &out),
        &["bad_param"],
        "an empty program",
    )?;
    let add = FusedProgram {
        steps: vec![FusedStep::Binary(BinaryOp::Add, Input(0), Input(1))],
    };
    expect_err(
        plan(&[&r(&[5], 5)?], add.clone(), &out),
        &["not_broadcastable"],
        "an operand that does not broadcast to the output",
    )?;
    let five: Vec<&Tensor> = vec![&bias; 5];
    expect_err(
        plan(&five, add.clone(), &out),
        &["bad_param"],
        "five extra operands",
    )?;
    expect_err(
        plan(&[&bias], add.clone(), &r(&[4, 7], 6)?),
        &["shape_mismatch"],
        "an output of the wrong shape",
    )?;
    let half = Tensor::rand_uniform(&[6], -1.0, 1.0, 7, DType::F16, ctx.device)?;
    expect_err(
        plan(&[&half], add.clone(), &out),
        &["dtype_mismatch"],
        "an operand of another dtype",
    )?;
    // The output may not be an operand the epilogue reads.
    let res = r(&[4, 6], 8)?;
    let p = plan(&[&res], add, &res)?;
    expect_err(
        p.launch(&[&a, &b, &res], &[&res], None, a.stream()?),
        &["aliasing"],
        "the output overlapping an operand",
    )?;
    Ok(())
}

/// A projection with bias and GELU, a residual, and a SwiGLU MLP: the planner fuses three
/// epilogues where the device has the kernel, and replay is bitwise eager either way.
fn graph_fusion(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let r = |shape: &[usize], seed| rand(ctx, shape, seed, DType::F32);
    let (x, w1, b1) = (r(&[6, 32], 1)?, r(&[32, 48], 2)?, r(&[48], 3)?);
    let (wg, wu, wd) = (r(&[48, 64], 4)?, r(&[48, 64], 5)?, r(&[64, 48], 6)?);
    let model = |x: &Tensor| -> unirt::Result<Tensor> {
        let h = x.matmul(&w1)?.add(&b1)?.gelu()?;
        let gate = h.matmul(&wg)?;
        let mlp = h.matmul(&wu)?.swiglu(&gate)?;
        mlp.matmul(&wd)?.add(&h)
    };
    rt.start_graph_recording()?;
    let y = model(&x);
    let mut g = rt.stop_graph_recording()?;
    let y = y?;
    g.mark_input("x", &x)?;
    g.mark_output("y", &y)?;
    let fused = g.plan()?;
    let unfused = unirt::CapturePlan::with_options(&g, PlanOptions { fuse: false })?;
    let can = unirt::ops::is_registered("matmul_epilogue", ctx.device.kind, DType::F32);
    let (want_fused, want_steps) = if can { (3, 4) } else { (0, 8) };
    ensure!(
        fused.fused_epilogues() == want_fused && fused.steps().len() == want_steps,
        "{} epilogues fused into {} steps (expected {want_fused} into {want_steps})",
        fused.fused_epilogues(),
        fused.steps().len()
    );
    ensure!(
        unfused.fused_epilogues() == 0 && unfused.steps().len() == 8,
        "the unfused plan has {} steps",
        unfused.steps().len()
    );
    let fx = fused.instantiate()?;
    let ux = unfused.instantiate()?;
    for i in 0..3u64 {
        let nx = r(&[6, 32], 100 + i)?;
        let want = model(&nx)?.to_bytes()?;
        for (what, exec) in [("fused", &fx), ("unfused", &ux)] {
            exec.set_input("x", &nx)?;
            exec.replay()?;
            ensure!(
                exec.output("y")?.to_bytes()? == want,
                "{what} replay {i} differs from eager execution"
            );
        }
    }
    Ok(())
}
