//! `ops::fused_elementwise::<dtype>::…`: the operator a [`CapturePlan`](unirt::CapturePlan)
//! fuses elementwise chains into, checked bitwise against the unfused operators it replaces.

use unirt::ops::elementwise::{binary, binary_scalar, swiglu, unary};
use unirt::ops::fused::{fused_elementwise, FusedProgram, FusedSrc, FusedStep, MAX_FUSED_STEPS};
use unirt::ops::{BinaryOp, UnaryOp};
use unirt::tensor::{DType, Tensor};

use crate::{ensure, expect_err, Case, Ctx, Failure};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "ops::fused_elementwise::f32::matches_unfused_chain",
            needs: &[],
            run: |c| fused_op(c, DType::F32),
        },
        Case {
            name: "ops::fused_elementwise::f16::matches_unfused_chain",
            needs: &[],
            run: |c| fused_op(c, DType::F16),
        },
        Case {
            name: "ops::fused_elementwise::bf16::matches_unfused_chain",
            needs: &[],
            run: |c| fused_op(c, DType::BF16),
        },
    ]
}

fn fused_op(ctx: &Ctx, dtype: DType) -> Result<(), Failure> {
    // 5000 elements, then 64 Ki with `a` a view four elements into its buffer (the size from
    // which wgpu's software adapters read the operands through textures); in f32 also 20 MiB
    // and an odd tail (an output too large to stay cached, which the CPU writes with
    // non-temporal stores from its 64-byte-aligned middle on).
    let mut sizes = vec![(5000, 0), (1 << 16, 4)];
    if dtype == DType::F32 {
        sizes.push(((5 << 20) + 3, 4));
    }
    for (n, shift) in sizes {
        let mk = |n, seed| Tensor::rand_uniform(&[n], -2.0, 2.0, seed, dtype, ctx.device);
        let a = mk(n + shift, 21)?.narrow(0, shift, n)?;
        let b = mk(n, 22)?;
        fused_matches(&a, &b)?;
    }
    let mk = |seed| Tensor::rand_uniform(&[5000], -2.0, 2.0, seed, dtype, ctx.device);
    let a = mk(21)?;
    // Bad programs and operands are typed errors.
    let bad = FusedProgram {
        steps: vec![FusedStep::Unary(UnaryOp::Neg, FusedSrc::Step(0))],
    };
    expect_err(
        fused_elementwise(&[a.desc()], bad),
        &["bad_param"],
        "a step reading itself",
    )?;
    expect_err(
        fused_elementwise(&[a.desc()], FusedProgram::default()),
        &["bad_param"],
        "an empty program",
    )?;
    // As many steps as one kernel runs, and one more.
    let long = |n: usize| FusedProgram {
        steps: (0..n)
            .map(|i| match i {
                0 => FusedStep::Unary(UnaryOp::Tanh, FusedSrc::Input(0)),
                _ => FusedStep::Scalar(BinaryOp::Mul, FusedSrc::Step(i - 1), 0.99),
            })
            .collect(),
    };
    let got = fused_elementwise(&[a.desc()], long(MAX_FUSED_STEPS))?.run1(&[&a])?;
    ensure!(
        got.to_bytes()? == unfused(&long(MAX_FUSED_STEPS), &[&a])?.to_bytes()?,
        "a program of {MAX_FUSED_STEPS} steps differs from the unfused operators"
    );
    expect_err(
        fused_elementwise(&[a.desc()], long(MAX_FUSED_STEPS + 1)),
        &["bad_param"],
        "a program longer than one kernel runs",
    )?;
    let t = Tensor::rand_uniform(&[10, 20], -1.0, 1.0, 3, dtype, ctx.device)?.transpose(0, 1)?;
    let prog = FusedProgram {
        steps: vec![FusedStep::Unary(UnaryOp::Neg, FusedSrc::Input(0))],
    };
    expect_err(
        fused_elementwise(&[t.desc()], prog),
        &["bad_param"],
        "a strided operand",
    )?;
    Ok(())
}

/// Two fused chains over `a` and `b`, bitwise against the unfused operators.
fn fused_matches(a: &Tensor, b: &Tensor) -> Result<(), Failure> {
    // swiglu(a·b + 0.5, sigmoid(b)) - a, step by step and fused.
    let want = a.mul(b)?.add_scalar(0.5)?.swiglu(&b.sigmoid()?)?.sub(a)?;
    let prog = FusedProgram {
        steps: vec![
            FusedStep::Binary(BinaryOp::Mul, FusedSrc::Input(0), FusedSrc::Input(1)),
            FusedStep::Scalar(BinaryOp::Add, FusedSrc::Step(0), 0.5),
            FusedStep::Unary(UnaryOp::Sigmoid, FusedSrc::Input(1)),
            FusedStep::Swiglu(FusedSrc::Step(1), FusedSrc::Step(2)),
            FusedStep::Binary(BinaryOp::Sub, FusedSrc::Step(3), FusedSrc::Input(0)),
        ],
    };
    let got = fused_elementwise(&[a.desc(), b.desc()], prog)?.run1(&[a, b])?;
    ensure!(
        got.to_bytes()? == want.to_bytes()?,
        "the fused chain differs from the unfused operators"
    );
    // Every elementwise function, each after a multiply and an add it could be contracted
    // with, summed: bitwise the operators run one by one.
    let prog = FusedProgram::every_function();
    let got = fused_elementwise(&[a.desc(), b.desc()], prog.clone())?.run1(&[a, b])?;
    let want = unfused(&prog, &[a, b])?;
    ensure!(
        got.to_bytes()? == want.to_bytes()?,
        "the fused chain of every elementwise function differs from the unfused operators"
    );
    Ok(())
}

/// `prog` run one operator at a time.
fn unfused(prog: &FusedProgram, inputs: &[&Tensor]) -> unirt::Result<Tensor> {
    let mut done: Vec<Tensor> = Vec::new();
    for step in &prog.steps {
        let at = |s: FusedSrc| match s {
            FusedSrc::Input(k) => inputs[k].clone(),
            FusedSrc::Step(k) => done[k].clone(),
        };
        let t = match *step {
            FusedStep::Unary(u, a) => {
                let a = at(a);
                unary(u, &a.desc())?.run1(&[&a])?
            }
            FusedStep::Binary(o, a, b) => {
                let (a, b) = (at(a), at(b));
                binary(o, &a.desc(), &b.desc())?.run1(&[&a, &b])?
            }
            FusedStep::Scalar(o, a, c) => {
                let a = at(a);
                binary_scalar(o, &a.desc(), c)?.run1(&[&a])?
            }
            FusedStep::Swiglu(up, gate) => {
                let (u, g) = (at(up), at(gate));
                swiglu(&u.desc(), &g.desc())?.run1(&[&u, &g])?
            }
        };
        done.push(t);
    }
    done.pop()
        .ok_or_else(|| unirt::Error::BadParam("an empty program".into()))
}
