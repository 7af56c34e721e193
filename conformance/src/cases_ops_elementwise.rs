//! Elementwise operator cases: binary with broadcasting (tensor and scalar forms), unary,
//! swiglu, where, masked_fill — against f64 references on seeded random data.

use unirt::ops::{elementwise as ew, BinaryOp, UnaryOp};
use unirt::tensor::{DType, Tensor};

use crate::ops_check::*;
use crate::{Ctx, Failure};

crate::op_cases! {
    add = "add": [f32, f16, bf16] => [sizes, broadcast, strided, large, bad_input, specials] via binary_case;
    sub = "sub": [f32, f16, bf16] => [sizes, broadcast, strided, specials] via binary_case;
    mul = "mul": [f32, f16, bf16] => [sizes, broadcast, strided, large, specials] via binary_case;
    div = "div": [f32, f16, bf16] => [sizes, broadcast, strided, specials] via binary_case;
    maximum = "maximum": [f32, f16, bf16] => [sizes, broadcast, strided, specials] via binary_case;
    minimum = "minimum": [f32, f16, bf16] => [sizes, broadcast, strided, specials] via binary_case;
    pow = "pow": [f32, f16, bf16] => [sizes, broadcast, strided, specials] via binary_case;
    add_span = "add": [f32] => [span_over_binding] via binary_case;
    add_offsets = "add": [f32, f16, bf16] => [offsets] via binary_case;
    swiglu_offsets = "swiglu": [f32, f16, bf16] => [offsets] via binary_case;
    swiglu = "swiglu": [f32, f16, bf16] => [sizes, broadcast, strided, large, bad_input, specials] via binary_case;
    add_scalar = "add_scalar": [f32, f16, bf16] => [sizes, strided, specials] via scalar_case;
    sub_scalar = "sub_scalar": [f32, f16, bf16] => [sizes, strided, specials] via scalar_case;
    mul_scalar = "mul_scalar": [f32, f16, bf16] => [sizes, strided, specials] via scalar_case;
    div_scalar = "div_scalar": [f32, f16, bf16] => [sizes, strided, specials] via scalar_case;
    maximum_scalar = "maximum_scalar": [f32, f16, bf16] => [sizes, strided, specials] via scalar_case;
    minimum_scalar = "minimum_scalar": [f32, f16, bf16] => [sizes, strided, specials] via scalar_case;
    pow_scalar = "pow_scalar": [f32, f16, bf16] => [sizes, strided, specials] via scalar_case;
    neg = "neg": [f32, f16, bf16] => [sizes, strided, bad_input, specials] via unary_case;
    abs = "abs": [f32, f16, bf16] => [sizes, strided, specials] via unary_case;
    exp = "exp": [f32, f16, bf16] => [sizes, strided, specials] via unary_case;
    log = "log": [f32, f16, bf16] => [sizes, strided, specials] via unary_case;
    sqrt = "sqrt": [f32, f16, bf16] => [sizes, strided, specials] via unary_case;
    rsqrt = "rsqrt": [f32, f16, bf16] => [sizes, strided, specials] via unary_case;
    sin = "sin": [f32, f16, bf16] => [sizes, strided, specials] via unary_case;
    cos = "cos": [f32, f16, bf16] => [sizes, strided, specials] via unary_case;
    tanh = "tanh": [f32, f16, bf16] => [sizes, strided, specials] via unary_case;
    sigmoid = "sigmoid": [f32, f16, bf16] => [sizes, strided, specials] via unary_case;
    relu = "relu": [f32, f16, bf16] => [sizes, strided, specials] via unary_case;
    gelu = "gelu": [f32, f16, bf16] => [sizes, strided, specials] via unary_case;
    gelu_tanh = "gelu_tanh": [f32, f16, bf16] => [sizes, strided, specials] via unary_case;
    silu = "silu": [f32, f16, bf16] => [sizes, strided, offsets, large, specials] via unary_case;
    where_ = "where": [f32, f16, bf16] => [broadcast, bad_input] via select_case;
    masked_fill = "masked_fill": [f32, f16, bf16] => [broadcast, bad_input] via select_case;
}

/// A binary reference and the input ranges of its two operands.
pub(crate) type BinaryRef = (fn(f64, f64) -> f64, (f64, f64), (f64, f64));

pub(crate) fn binary_ref(op: &str) -> Result<BinaryRef, Failure> {
    if op == "swiglu" {
        return Ok((|u, g| u * g / (1.0 + (-g).exp()), (-3.0, 3.0), (-3.0, 3.0)));
    }
    let b = BinaryOp::ALL
        .into_iter()
        .find(|b| b.name() == op || b.scalar_name() == op)
        .ok_or_else(|| fail(format!("no binary operator {op}")))?;
    // The library's own f64 reference (special values included), as a plain function.
    let f: fn(f64, f64) -> f64 = match b {
        BinaryOp::Add => |a, b| BinaryOp::Add.eval(a, b),
        BinaryOp::Sub => |a, b| BinaryOp::Sub.eval(a, b),
        BinaryOp::Mul => |a, b| BinaryOp::Mul.eval(a, b),
        BinaryOp::Div => |a, b| BinaryOp::Div.eval(a, b),
        BinaryOp::Maximum => |a, b| BinaryOp::Maximum.eval(a, b),
        BinaryOp::Minimum => |a, b| BinaryOp::Minimum.eval(a, b),
        BinaryOp::Pow => |a, b| BinaryOp::Pow.eval(a, b),
    };
    Ok(match b {
        BinaryOp::Pow => (f, (0.25, 2.0), (-2.0, 2.0)),
        BinaryOp::Div => (f, (-2.0, 2.0), (0.5, 2.0)),
        _ => (f, (-2.0, 2.0), (-2.0, 2.0)),
    })
}

pub(crate) fn run_binary(op: &str, a: &Tensor, b: &Tensor) -> unirt::Result<Tensor> {
    match op {
        "swiglu" => a.swiglu(b),
        _ => {
            let bop = BinaryOp::ALL.into_iter().find(|x| x.name() == op);
            let bop = bop.ok_or_else(|| unirt::Error::BadParam(op.into()))?;
            ew::binary(bop, &a.desc(), &b.desc())?.run1(&[a, b])
        }
    }
}

fn plan_binary(op: &str, a: &Tensor, b: &Tensor) -> unirt::Result<unirt::ops::Plan> {
    match op {
        "swiglu" => ew::swiglu(&a.desc(), &b.desc()),
        _ => {
            let bop = BinaryOp::ALL.into_iter().find(|x| x.name() == op);
            let bop = bop.ok_or_else(|| unirt::Error::BadParam(op.into()))?;
            ew::binary(bop, &a.desc(), &b.desc())
        }
    }
}

/// Checks `a op b` for broadcast shapes against the host reference.
fn check_pair(
    ctx: &Ctx,
    op: &str,
    dt: DType,
    sa: &[usize],
    sb: &[usize],
    seed: u64,
) -> Result<(), Failure> {
    let (f, ra, rb) = binary_ref(op)?;
    let (a, va) = random(sa, ra.0, ra.1, seed, dt, ctx.device)?;
    let (b, vb) = random(sb, rb.0, rb.1, seed + 1, dt, ctx.device)?;
    let what = format!("{op} {sa:?} with {sb:?}");
    let out = run_binary(op, &a, &b).map_err(err(&what))?;
    let shape = out.shape().to_vec();
    let n: usize = shape.iter().product();
    let want: Vec<f64> = (0..n)
        .map(|i| {
            let idx = unravel(i, &shape);
            f(va[bcast_index(&idx, sa)], vb[bcast_index(&idx, sb)])
        })
        .collect();
    close(&what, &values(&out, &what)?, &want, dt, None)
}

/// A row broadcast over a matrix large enough that the software adapters read the row
/// through a texture of its own, kept while the row's bytes are unchanged (a bias, as a
/// weight): the same plan run again after the row is rewritten, by a device copy, must use
/// the new row.
fn row_rewritten(ctx: &Ctx, op: &str, dt: DType) -> Result<(), Failure> {
    let (f, ra, rb) = binary_ref(op)?;
    let (sa, sb) = ([64, 512], [512]);
    let (a, va) = random(&sa, ra.0, ra.1, 40, dt, ctx.device)?;
    let (b, vb) = random(&sb, rb.0, rb.1, 41, dt, ctx.device)?;
    let (b2, vb2) = random(&sb, rb.0, rb.1, 42, dt, ctx.device)?;
    let plan = plan_binary(op, &a, &b).map_err(err("plan"))?;
    for (round, vb) in [(0, &vb), (1, &vb2)] {
        let what = format!("{op} [64, 512] with a row [512], run {round}");
        if round == 1 {
            b.copy_from(&b2).map_err(err(&what))?;
        }
        let out = plan.run1(&[&a, &b]).map_err(err(&what))?;
        let want: Vec<f64> = (0..64 * 512).map(|i| f(va[i], vb[i % 512])).collect();
        close(&what, &values(&out, &what)?, &want, dt, None)?;
    }
    Ok(())
}

fn binary_case(ctx: &Ctx, op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    match what {
        "specials" => super::cases_ops_ew_specials::binary_specials(ctx, op, dt),
        "sizes" => {
            for (i, &n) in SIZES.iter().enumerate() {
                check_pair(ctx, op, dt, &[n], &[n], 10 + i as u64)?;
            }
            Ok(())
        }
        "broadcast" => {
            let pairs: &[(&[usize], &[usize])] = &[
                (&[3, 1, 5], &[4, 1]),
                (&[], &[7]),
                (&[7], &[1]),
                (&[2, 1], &[1, 3]),
                (&[0, 3], &[1, 3]),
                // Broadcasts in whole quads, which wgpu reads four at a time: a row repeated
                // (a bias), a column spread (a per-row scale) on either side, and a mix that
                // is neither.
                (&[6, 8], &[8]),
                (&[8, 12], &[8, 1]),
                (&[4, 1], &[4, 8]),
                (&[2, 3, 8], &[3, 1]),
            ];
            for (i, (sa, sb)) in pairs.iter().enumerate() {
                check_pair(ctx, op, dt, sa, sb, 30 + i as u64)?;
            }
            row_rewritten(ctx, op, dt)
        }
        "strided" => {
            let (f, ra, rb) = binary_ref(op)?;
            // a: a transposed [7, 5] base; b: columns 1..8 of a [5, 9] base.
            let (abase, va) = random(&[7, 5], ra.0, ra.1, 50, dt, ctx.device)?;
            let (bbase, vb) = random(&[5, 9], rb.0, rb.1, 51, dt, ctx.device)?;
            let a = abase.transpose(0, 1).map_err(err("transpose"))?;
            let b = bbase.narrow(1, 1, 7).map_err(err("narrow"))?;
            let (ha, hb) = (host_view(&va, a.layout()), host_view(&vb, b.layout()));
            let want: Vec<f64> = ha.iter().zip(&hb).map(|(&x, &y)| f(x, y)).collect();
            let out = run_binary(op, &a, &b).map_err(err("strided inputs"))?;
            close("strided inputs", &values(&out, "strided")?, &want, dt, None)?;
            // In place: the output is the first input's very view.
            let a2 = a.contiguous().map_err(err("contiguous"))?;
            let plan = plan_binary(op, &a2, &b).map_err(err("plan"))?;
            let s = a2.stream().map_err(err("stream"))?;
            plan.launch(&[&a2, &b], &[&a2], None, s)
                .map_err(err("in-place launch"))?;
            close("in place", &values(&a2, "in place")?, &want, dt, None)
        }
        "offsets" => {
            // Contiguous views starting 0–5 elements into their buffers, 4k elements (what
            // kernels that read four at a time take), in place too.
            let (f, ra, rb) = binary_ref(op)?;
            for shift in 0..6usize {
                let n = 64 + 4 * shift;
                let seed = 300 + 2 * shift as u64;
                let (abase, va) = random(&[n + shift], ra.0, ra.1, seed, dt, ctx.device)?;
                let (bbase, vb) = random(&[n + 5], rb.0, rb.1, seed + 1, dt, ctx.device)?;
                let a = abase.narrow(0, shift, n).map_err(err("narrow"))?;
                let b = bbase.narrow(0, 5 - shift, n).map_err(err("narrow"))?;
                let want: Vec<f64> = va[shift..]
                    .iter()
                    .zip(&vb[5 - shift..])
                    .map(|(&x, &y)| f(x, y))
                    .collect();
                let what = format!("{op} on views at offsets {shift} and {}", 5 - shift);
                let out = run_binary(op, &a, &b).map_err(err(&what))?;
                close(&what, &values(&out, &what)?, &want, dt, None)?;
                let plan = plan_binary(op, &a, &b).map_err(err("plan"))?;
                let s = a.stream().map_err(err("stream"))?;
                plan.launch(&[&a, &b], &[&a], None, s)
                    .map_err(err("in-place launch"))?;
                close(
                    &format!("{what}, in place"),
                    &values(&a, &what)?,
                    &want,
                    dt,
                    None,
                )?;
            }
            Ok(())
        }
        "large" => super::cases_ops_large::large_binary(ctx, op, dt, binary_ref(op)?, |a, b| {
            plan_binary(op, a, b)
        }),
        "span_over_binding" => {
            // A [5, 1] view of a 160 MiB buffer spanning just over 128 MiB (lavapipe's storage
            // binding limit): computed correctly, or refused with a typed error naming the
            // limit — never a wrong answer.
            let cols = 8 << 20;
            let base = Tensor::zeros(&[5, cols], dt, ctx.device).map_err(err("160 MiB zeros"))?;
            let a = base.narrow(1, 0, 1).map_err(err("narrow"))?;
            let (b, vb) = random(&[5, 1], -2.0, 2.0, 60, dt, ctx.device)?;
            match run_binary(op, &a, &b) {
                Ok(out) => close("span over a binding", &values(&out, "add")?, &vb, dt, None),
                Err(e) if e.kind_name() == "too_large" => {
                    let msg = e.to_string();
                    if msg.contains("binding") {
                        Ok(())
                    } else {
                        Err(fail(format!("too_large without naming the limit: {msg}")))
                    }
                }
                Err(e) => Err(fail(format!(
                    "span over a binding: {} ({e})",
                    e.kind_name()
                ))),
            }
        }
        "bad_input" => {
            let dev = ctx.device;
            let t = |shape: &[usize], d: DType| Tensor::zeros(shape, d, dev).map_err(err("zeros"));
            let (a3, a4) = (t(&[3], dt)?, t(&[4], dt)?);
            expect_kind(
                plan_binary(op, &a3, &a4),
                &["not_broadcastable"],
                "[3] with [4]",
            )?;
            let other = another_dtype(dt);
            expect_kind(
                plan_binary(op, &a3, &t(&[3], other)?),
                &["dtype_mismatch"],
                "mixed dtypes",
            )?;
            if let Some(o) = other_device(ctx) {
                if let Ok(b) = Tensor::zeros(&[3], dt, o) {
                    expect_kind(
                        plan_binary(op, &a3, &b),
                        &["device_mismatch"],
                        "two devices",
                    )?;
                }
            }
            // Launch-time checks: wrong output shape / dtype, partial overlap with an input.
            let x = t(&[16], dt)?;
            let (lo, hi) = (
                x.narrow(0, 0, 15).map_err(err("narrow"))?,
                x.narrow(0, 1, 15).map_err(err("narrow"))?,
            );
            let plan = plan_binary(op, &hi, &hi).map_err(err("plan"))?;
            let s = x.stream().map_err(err("stream"))?;
            expect_kind(
                plan.launch(&[&hi, &hi], &[&lo], None, s),
                &["aliasing"],
                "output overlapping an input",
            )?;
            expect_kind(
                plan.launch(&[&hi, &hi], &[&t(&[14], dt)?], None, s),
                &["shape_mismatch"],
                "output of the wrong shape",
            )?;
            expect_kind(
                plan.launch(&[&hi, &hi], &[&t(&[15], other)?], None, s),
                &["dtype_mismatch"],
                "output of the wrong dtype",
            )?;
            expect_kind(
                plan.launch(&[&hi], &[&lo], None, s),
                &["bad_param"],
                "one input for two",
            )?;
            let i = t(&[3], DType::I32)?;
            expect_kind(
                plan_binary(op, &i, &i),
                &["unsupported_kernel"],
                "int inputs",
            )?;
            Ok(())
        }
        _ => Err(fail(format!("unknown case {what}"))),
    }
}

fn scalar_case(ctx: &Ctx, op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    let (f, ra, _) = binary_ref(op)?;
    let bop = BinaryOp::ALL
        .into_iter()
        .find(|b| b.scalar_name() == op)
        .ok_or_else(|| fail(format!("no scalar operator {op}")))?;
    let s = if bop == BinaryOp::Pow { 1.5 } else { 0.75 };
    let check = |a: &Tensor, va: &[f64], what: &str| -> Result<(), Failure> {
        let out = ew::binary_scalar(bop, &a.desc(), s)
            .and_then(|p| p.run1(&[a]))
            .map_err(err(what))?;
        let want: Vec<f64> = va.iter().map(|&x| f(x, s)).collect();
        close(what, &values(&out, what)?, &want, dt, None)
    };
    match what {
        "specials" => super::cases_ops_ew_specials::scalar_specials(ctx, bop, dt),
        "sizes" => {
            for (i, &n) in SIZES.iter().enumerate() {
                let (a, va) = random(&[n], ra.0, ra.1, 60 + i as u64, dt, ctx.device)?;
                check(&a, &va, &format!("{op} [{n}]"))?;
            }
            Ok(())
        }
        "strided" => {
            let (base, v) = random(&[9, 6], ra.0, ra.1, 70, dt, ctx.device)?;
            let a = base
                .transpose(0, 1)
                .and_then(|t| t.narrow(1, 2, 5))
                .map_err(err("view"))?;
            check(&a, &host_view(&v, a.layout()), "transposed, sliced input")
        }
        _ => Err(fail(format!("unknown case {what}"))),
    }
}

fn unary_ref(op: &str) -> Result<(UnaryOp, (f64, f64)), Failure> {
    let u = UnaryOp::ALL
        .into_iter()
        .find(|u| u.name() == op)
        .ok_or_else(|| fail(format!("no unary operator {op}")))?;
    let range = match u {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => (0.1, 4.0),
        _ => (-4.0, 4.0),
    };
    Ok((u, range))
}

fn unary_case(ctx: &Ctx, op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    let (u, r) = unary_ref(op)?;
    let check = |a: &Tensor, va: &[f64], what: &str| -> Result<(), Failure> {
        let out = ew::unary(u, &a.desc())
            .and_then(|p| p.run1(&[a]))
            .map_err(err(what))?;
        let want: Vec<f64> = va.iter().map(|&x| u.eval(x)).collect();
        close(what, &values(&out, what)?, &want, dt, None)
    };
    match what {
        "specials" => super::cases_ops_ew_specials::unary_specials(ctx, u, dt),
        "sizes" => {
            for (i, &n) in SIZES.iter().enumerate() {
                let (a, va) = random(&[n], r.0, r.1, 80 + i as u64, dt, ctx.device)?;
                check(&a, &va, &format!("{op} [{n}]"))?;
            }
            Ok(())
        }
        "strided" => {
            let (base, v) = random(&[4, 7, 6], r.0, r.1, 90, dt, ctx.device)?;
            let a = base
                .permute(&[2, 0, 1])
                .and_then(|t| t.narrow(2, 1, 5))
                .map_err(err("view"))?;
            check(&a, &host_view(&v, a.layout()), "permuted, sliced input")
        }
        "large" => super::cases_ops_large::large_unary(ctx, u, dt, r),
        "offsets" => {
            for shift in 0..6usize {
                let n = 128 - 4 * shift;
                let (base, v) = random(&[n + shift], r.0, r.1, 310 + shift as u64, dt, ctx.device)?;
                let a = base.narrow(0, shift, n).map_err(err("narrow"))?;
                check(
                    &a,
                    &v[shift..],
                    &format!("{op} on a view at offset {shift}"),
                )?;
            }
            Ok(())
        }
        "bad_input" => {
            let x = Tensor::zeros(&[8], dt, ctx.device).map_err(err("zeros"))?;
            let plan = ew::unary(u, &x.desc()).map_err(err("plan"))?;
            let s = x.stream().map_err(err("stream"))?;
            let (a, b) = (
                x.narrow(0, 0, 7).map_err(err("narrow"))?,
                x.narrow(0, 1, 7).map_err(err("narrow"))?,
            );
            let p7 = ew::unary(u, &a.desc()).map_err(err("plan"))?;
            expect_kind(
                p7.launch(&[&a], &[&b], None, s),
                &["aliasing"],
                "shifted in-place output",
            )?;
            let bcast = Tensor::zeros(&[1], dt, ctx.device)
                .and_then(|t| t.broadcast_to(&[8]))
                .map_err(err("broadcast"))?;
            expect_kind(
                plan.launch(&[&x], &[&bcast], None, s),
                &["aliasing", "bad_tensor_strides"],
                "a broadcast output",
            )?;
            let i = Tensor::zeros(&[8], DType::I64, ctx.device).map_err(err("zeros"))?;
            expect_kind(
                ew::unary(u, &i.desc()),
                &["unsupported_kernel"],
                "i64 input",
            )?;
            Ok(())
        }
        _ => Err(fail(format!("unknown case {what}"))),
    }
}

fn mask(shape: &[usize], seed: u64, ctx: &Ctx) -> Result<(Tensor, Vec<f64>), Failure> {
    let n: usize = shape.iter().product();
    let mut rng = unirt::tensor::SplitMix64::new(seed);
    let v: Vec<f64> = (0..n).map(|_| (rng.next_u64() & 1) as f64).collect();
    let t = Tensor::from_f64(&v, shape, DType::Bool, ctx.device).map_err(err("mask"))?;
    Ok((t, v))
}

fn select_case(ctx: &Ctx, op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    let dev = ctx.device;
    match (op, what) {
        ("where", "broadcast") => {
            let (sc, sa, sb) = (&[3usize, 1, 5][..], &[4usize, 1][..], &[3usize, 4, 5][..]);
            let (c, vc) = mask(sc, 100, ctx)?;
            let (a, va) = random(sa, -2.0, 2.0, 101, dt, dev)?;
            let (b, vb) = random(sb, -2.0, 2.0, 102, dt, dev)?;
            let out = c.where_(&a, &b).map_err(err("where"))?;
            let want: Vec<f64> = (0..60)
                .map(|i| {
                    let idx = unravel(i, sb);
                    if vc[bcast_index(&idx, sc)] != 0.0 {
                        va[bcast_index(&idx, sa)]
                    } else {
                        vb[i]
                    }
                })
                .collect();
            close("where", &values(&out, "where")?, &want, dt, None)
        }
        ("masked_fill", "broadcast") => {
            let (x, vx) = random(&[3, 4, 5], -2.0, 2.0, 110, dt, dev)?;
            let (m, vm) = mask(&[4, 1], 111, ctx)?;
            let xt = x.transpose(0, 2).map_err(err("transpose"))?; // [5, 4, 3], strided
            let m2 = m.unsqueeze(0).map_err(err("unsqueeze"))?; // [1, 4, 1]
            let out = xt.masked_fill(&m2, -7.5).map_err(err("masked_fill"))?;
            let hx = host_view(&vx, xt.layout());
            let want: Vec<f64> = (0..60)
                .map(|i| {
                    let idx = unravel(i, &[5, 4, 3]);
                    if vm[idx[1]] != 0.0 {
                        -7.5
                    } else {
                        hx[i]
                    }
                })
                .collect();
            close(
                "masked_fill",
                &values(&out, "masked_fill")?,
                &want,
                dt,
                None,
            )
        }
        (_, "bad_input") => {
            let x = Tensor::zeros(&[4], dt, dev).map_err(err("zeros"))?;
            let fmask = Tensor::zeros(&[4], DType::F32, dev).map_err(err("zeros"))?;
            let (m3, _) = mask(&[3], 1, ctx)?;
            if op == "where" {
                expect_kind(
                    ew::where_(&fmask.desc(), &x.desc(), &x.desc()),
                    &["dtype_mismatch"],
                    "f32 condition",
                )?;
                expect_kind(
                    ew::where_(&m3.desc(), &x.desc(), &x.desc()),
                    &["not_broadcastable"],
                    "[3] condition over [4]",
                )?;
            } else {
                expect_kind(
                    ew::masked_fill(&x.desc(), &fmask.desc(), 1.0),
                    &["dtype_mismatch"],
                    "f32 mask",
                )?;
                expect_kind(
                    ew::masked_fill(&x.desc(), &m3.desc(), 1.0),
                    &["not_broadcastable"],
                    "[3] mask over [4]",
                )?;
                let (m24, _) = mask(&[2, 4], 2, ctx)?;
                expect_kind(
                    ew::masked_fill(&x.desc(), &m24.desc(), 1.0),
                    &["not_broadcastable"],
                    "a mask larger than x",
                )?;
            }
            Ok(())
        }
        _ => Err(fail(format!("unknown case {op}::{what}"))),
    }
}
