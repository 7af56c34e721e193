//! Reduction-shaped operator cases: sum, mean, max, min, argmax along axes; softmax,
//! log_softmax, causal softmax; rms_norm and layer_norm.

use unirt::ops::{
    norm,
    reduce::{reduce, ReduceOp},
    softmax as sm,
};
use unirt::tensor::{DType, SplitMix64, Tensor};

use crate::ops_check::*;
use crate::{Ctx, Failure};

crate::op_cases! {
    sum = "sum": [f32, f16, bf16] => [axes, sizes, strided, bad_input] via reduce_case;
    mean = "mean": [f32, f16, bf16] => [axes, sizes, strided] via reduce_case;
    max = "max": [f32, f16, bf16] => [axes, sizes, strided, ties_nan, bad_input] via reduce_case;
    min = "min": [f32, f16, bf16] => [axes, sizes, strided, ties_nan] via reduce_case;
    argmax = "argmax": [f32, f16, bf16] => [axes, sizes, strided, ties_nan, bad_input] via reduce_case;
    softmax = "softmax": [f32, f16, bf16] => [rows, strided, large, specials] via softmax_case;
    log_softmax = "log_softmax": [f32, f16, bf16] => [rows, strided, large, specials] via softmax_case;
    causal_softmax = "causal_softmax": [f32, f16, bf16] => [offsets, bad_input] via softmax_case;
    rms_norm = "rms_norm": [f32, f16, bf16] => [rows, strided, large, specials, bad_input] via norm_case;
    layer_norm = "layer_norm": [f32, f16, bf16] => [rows, strided, large, specials, bad_input] via norm_case;
}

/// Groups the row-major values `v` of `shape` into lanes over `axes` (each lane in row-major
/// order of the reduced dimensions), one lane per output element.
fn lanes(v: &[f64], shape: &[usize], axes: &[usize]) -> Vec<Vec<f64>> {
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
    let nout: usize = kept.iter().map(|&d| shape[d]).product();
    let mut out = vec![Vec::new(); nout];
    for (i, &x) in v.iter().enumerate() {
        let idx = unravel(i, shape);
        let key = kept.iter().fold(0, |k, &d| k * shape[d] + idx[d]);
        out[key].push(x);
    }
    out
}

fn reduce_ref(op: ReduceOp, lane: &[f64]) -> f64 {
    match op {
        ReduceOp::Sum => lane.iter().sum(),
        ReduceOp::Mean => lane.iter().sum::<f64>() / lane.len() as f64,
        ReduceOp::Max => lane.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Min => lane.iter().copied().fold(f64::INFINITY, f64::min),
        ReduceOp::Argmax => {
            let mut at = 0;
            for (i, &x) in lane.iter().enumerate() {
                if x > lane[at] {
                    at = i;
                }
            }
            at as f64
        }
    }
}

/// The same values starting 0 … 3 elements into their buffer reduce to the same result,
/// bitwise: where a tensor lies must not change its sum (wgpu reads rows that start on a
/// multiple of four elements four at a time, the others one at a time), or a replayed graph,
/// whose tensors lie in an arena, could differ from the same operators run eagerly. Rows of
/// 65 536 are also a shape whose aligned launches read through a texture on the software
/// adapters (70 000 elements make no texture of whole 256-byte rows); rows of 300 000 are
/// too long for one invocation's loops there.
fn placement(ctx: &Ctx, op: ReduceOp, dt: DType) -> Result<(), Failure> {
    placed(ctx, op, dt, 70_000)?;
    placed(ctx, op, dt, 65_536)?;
    // Rows too long for one invocation's loops on the software adapters, as many as a CI
    // machine has cores: shared among a workgroup's invocations there.
    placed(ctx, op, dt, 300_000)
}

fn placed(ctx: &Ctx, op: ReduceOp, dt: DType, n: usize) -> Result<(), Failure> {
    let rows = 2;
    let mut r = SplitMix64::new(230);
    let v: Vec<f32> = (0..rows * n)
        .map(|_| (r.next_f64() * 4.0 - 2.0) as f32)
        .collect();
    let what = format!("{} of [{rows}, {n}] over axis 1", op.name());
    same_wherever_placed(ctx, &v, &[rows, n], dt, &what, |x| {
        reduce(op, &x.desc(), &[1], false)?.run1(&[x])
    })?;
    Ok(())
}

/// max, min and argmax over rows with tied extremes and NaNs, of 1000 elements (one
/// invocation walks a row on the software adapters) and of 70 000 (split among workgroups
/// there): max and min are NaN where a row holds one; argmax is the index of the first NaN,
/// else of the first maximum.
fn ties_nan(ctx: &Ctx, op: ReduceOp, dt: DType) -> Result<(), Failure> {
    // 40 000: shared among a workgroup's invocations on the software adapters (few rows,
    // within one invocation's loop limit); 600 000: three of the CPU's segments, folded
    // apart and merged.
    for (seed, n) in [
        (240u64, 1000usize),
        (243, 40_000),
        (241, 70_000),
        (242, 600_000),
    ] {
        let mut r = SplitMix64::new(seed);
        let mut rows: Vec<Vec<f64>> = (0..5)
            .map(|_| (0..n).map(|_| (r.next_f64() * 4.0 - 2.0).round()).collect())
            .collect();
        let late = n - 1 - n / 7;
        for &j in &[late, 3, n / 2] {
            rows[0][j] = 3.0; // the maximum three times: argmax 3
            rows[1][j] = -3.0; // the minimum three times
        }
        rows[2][late] = f64::NAN; // NaN twice and a larger value between: argmax `n / 3`
        rows[2][n / 3] = f64::NAN;
        rows[2][n / 2] = 5.0;
        rows[3].iter_mut().for_each(|v| *v = 1.5); // all equal: argmax 0
        rows[4][n - 1] = 2.5; // the maximum last
        let flat: Vec<f64> = rows.concat();
        let x = Tensor::from_f64(&flat, &[5, n], dt, ctx.device).map_err(err("from_f64"))?;
        let vx = values(&x, "the rows")?;
        let want: Vec<f64> = vx
            .chunks(n)
            .map(|row| {
                let nan = row.iter().position(|v| v.is_nan());
                let best = match op {
                    ReduceOp::Min => row.iter().copied().fold(f64::INFINITY, f64::min),
                    _ => row.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                };
                match (op, nan) {
                    (ReduceOp::Argmax, Some(i)) => i as f64,
                    (ReduceOp::Argmax, None) => {
                        row.iter().position(|&v| v == best).unwrap_or(0) as f64
                    }
                    (_, Some(_)) => f64::NAN,
                    _ => best,
                }
            })
            .collect();
        let what = format!("{} of 5 rows of {n} with ties and NaNs", op.name());
        let out = reduce(op, &x.desc(), &[1], false)
            .and_then(|p| p.run1(&[&x]))
            .map_err(err(&what))?;
        let dt = if op == ReduceOp::Argmax {
            DType::I64
        } else {
            dt
        };
        close(&what, &values(&out, &what)?, &want, dt, None)?;
    }
    Ok(())
}

fn check_reduce(
    op: ReduceOp,
    x: &Tensor,
    vx: &[f64],
    axes: &[isize],
    keepdim: bool,
) -> Result<(), Failure> {
    let what = format!(
        "{} of {:?} over {axes:?} keepdim {keepdim}",
        op.name(),
        x.shape()
    );
    let out = reduce(op, &x.desc(), axes, keepdim)
        .and_then(|p| p.run1(&[x]))
        .map_err(err(&what))?;
    let nd = x.ndim() as isize;
    let mut ax: Vec<usize> = if axes.is_empty() {
        (0..x.ndim()).collect()
    } else {
        axes.iter()
            .map(|&a| if a < 0 { (a + nd) as usize } else { a as usize })
            .collect()
    };
    ax.sort_unstable();
    let ls = lanes(vx, x.shape(), &ax);
    let want: Vec<f64> = ls.iter().map(|l| reduce_ref(op, l)).collect();
    let scale: Vec<f64> = ls
        .iter()
        .map(|l| l.iter().map(|v| v.abs()).sum::<f64>())
        .collect();
    let want_shape: Vec<usize> = (0..x.ndim())
        .filter_map(|d| match (ax.contains(&d), keepdim) {
            (false, _) => Some(x.shape()[d]),
            (true, true) => Some(1),
            _ => None,
        })
        .collect();
    if out.shape() != want_shape {
        return Err(fail(format!(
            "{what}: shape {:?}, expected {want_shape:?}",
            out.shape()
        )));
    }
    let dt = if op == ReduceOp::Argmax {
        DType::I64
    } else {
        x.dtype()
    };
    close(&what, &values(&out, &what)?, &want, dt, Some(&scale))
}

fn reduce_case(ctx: &Ctx, op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    let rop = ReduceOp::ALL
        .into_iter()
        .find(|r| r.name() == op)
        .ok_or_else(|| fail(op))?;
    let single = rop == ReduceOp::Argmax;
    match what {
        "axes" => {
            let (x, vx) = random(&[3, 4, 5], -2.0, 2.0, 200, dt, ctx.device)?;
            let sets: &[&[isize]] = if single {
                &[&[0], &[1], &[-1]]
            } else {
                &[&[0], &[1], &[-1], &[0, 2], &[]]
            };
            for axes in sets {
                for keepdim in [false, true] {
                    check_reduce(rop, &x, &vx, axes, keepdim)?;
                }
            }
            Ok(())
        }
        "sizes" => {
            // 40 001: few long rows, which the software adapters share among a workgroup's
            // invocations (and one element past the last four); 70 000: past what one
            // invocation may loop over on llvmpipe (see `ops::loop_limits`) when it walks
            // the elements alone.
            for (i, &n) in [0usize, 1, 7, 257, 4099, 70_000, 40_001].iter().enumerate() {
                if n == 0 && matches!(rop, ReduceOp::Max | ReduceOp::Min | ReduceOp::Argmax) {
                    continue;
                }
                let (x, vx) = random(&[2, n], -2.0, 2.0, 210 + i as u64, dt, ctx.device)?;
                check_reduce(rop, &x, &vx, &[1], false)?;
            }
            // Three outputs whose elements lie 3 apart (wgpu splits each among workgroups).
            let (x, vx) = random(&[70_000, 3], -2.0, 2.0, 218, dt, ctx.device)?;
            check_reduce(rop, &x, &vx, &[0], false)?;
            let (x, vx) = random(&[1 << 20], -2.0, 2.0, 219, dt, ctx.device)?;
            check_reduce(rop, &x, &vx, &[0], true)?;
            placement(ctx, rop, dt)
        }
        "ties_nan" => ties_nan(ctx, rop, dt),
        "strided" => {
            let (base, vb) = random(&[3, 4, 5], -2.0, 2.0, 220, dt, ctx.device)?;
            let x = base
                .permute(&[2, 0, 1])
                .and_then(|t| t.narrow(2, 1, 3))
                .map_err(err("view"))?;
            let hx = host_view(&vb, x.layout());
            let sets: &[&[isize]] = if single {
                &[&[0], &[2]]
            } else {
                &[&[0], &[2], &[0, 2], &[]]
            };
            for axes in sets {
                check_reduce(rop, &x, &hx, axes, true)?;
            }
            Ok(())
        }
        "bad_input" => {
            let x = Tensor::zeros(&[3, 4], dt, ctx.device).map_err(err("zeros"))?;
            expect_kind(
                reduce(rop, &x.desc(), &[2], false),
                &["axis_out_of_range"],
                "axis 2 of a matrix",
            )?;
            expect_kind(
                reduce(rop, &x.desc(), &[-3], false),
                &["axis_out_of_range"],
                "axis -3 of a matrix",
            )?;
            if single {
                expect_kind(
                    reduce(rop, &x.desc(), &[0, 1], false),
                    &["bad_param"],
                    "argmax over two axes",
                )?;
            } else {
                expect_kind(
                    reduce(rop, &x.desc(), &[1, -1], false),
                    &["bad_param"],
                    "an axis twice",
                )?;
            }
            let e = Tensor::zeros(&[3, 0], dt, ctx.device).map_err(err("zeros"))?;
            if rop == ReduceOp::Sum {
                let s = e.sum(&[1], false).map_err(err("sum of nothing"))?;
                close("sum of nothing", &values(&s, "sum")?, &[0.0; 3], dt, None)?;
            } else {
                expect_kind(
                    reduce(rop, &e.desc(), &[1], false),
                    &["bad_tensor_shape"],
                    "max of nothing",
                )?;
            }
            let i = Tensor::zeros(&[3], DType::I32, ctx.device).map_err(err("zeros"))?;
            expect_kind(
                reduce(rop, &i.desc(), &[0], false),
                &["unsupported_kernel"],
                "i32 input",
            )?;
            Ok(())
        }
        _ => Err(fail(format!("unknown case {what}"))),
    }
}

/// softmax / log_softmax of `lane`, the first `visible` entries (the rest 0, or −∞ for log).
fn softmax_ref(lane: &[f64], visible: usize, log: bool) -> Vec<f64> {
    let seen = &lane[..visible];
    let max = seen.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = seen.iter().map(|x| (x - max).exp()).sum();
    lane.iter()
        .enumerate()
        .map(|(j, &x)| match (j < visible, log) {
            (true, false) => (x - max).exp() / sum,
            (true, true) => x - max - sum.ln(),
            (false, false) => 0.0,
            (false, true) => f64::NEG_INFINITY,
        })
        .collect()
}

/// Reference softmax of row-major `v` along `axis`, in row-major output order.
fn softmax_along(v: &[f64], shape: &[usize], axis: usize, log: bool) -> Vec<f64> {
    let n = v.len();
    let mut out = vec![0.0; n];
    let inner: usize = shape[axis + 1..].iter().product();
    let len = shape[axis];
    for outer in 0..n / (len * inner).max(1) {
        for i in 0..inner {
            let idx: Vec<usize> = (0..len)
                .map(|j| outer * len * inner + j * inner + i)
                .collect();
            let lane: Vec<f64> = idx.iter().map(|&k| v[k]).collect();
            for (k, r) in idx.iter().zip(softmax_ref(&lane, len, log)) {
                out[*k] = r;
            }
        }
    }
    out
}

fn softmax_case(ctx: &Ctx, op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    let log = op == "log_softmax";
    let run = |x: &Tensor, axis: isize, w: &str| -> Result<Vec<f64>, Failure> {
        let out = sm::softmax(&x.desc(), axis, log)
            .and_then(|p| p.run1(&[x]))
            .map_err(err(w))?;
        values(&out, w)
    };
    match what {
        "rows" => {
            let cases: &[(&[usize], isize)] = &[
                (&[1, 1], -1),
                (&[7, 257], -1),
                (&[3, 4099], 1),
                (&[5, 7], 0),
                (&[4, 0], -1),
                (&[2, 3, 5], 1),
                (&[10, 36], -1),
                (&[3, 4, 12], 2),
            ];
            for (i, (shape, axis)) in cases.iter().enumerate() {
                let (x, vx) = random(shape, -4.0, 4.0, 300 + i as u64, dt, ctx.device)?;
                let w = format!("{op} {shape:?} axis {axis}");
                let ax = if *axis < 0 {
                    (*axis + shape.len() as isize) as usize
                } else {
                    *axis as usize
                };
                close(
                    &w,
                    &run(&x, *axis, &w)?,
                    &softmax_along(&vx, shape, ax, log),
                    dt,
                    None,
                )?;
            }
            Ok(())
        }
        "strided" => {
            // [6, 9] and [11, 9] (rows enough for a row-per-lane kernel), lanes strided.
            for (rows, seed) in [(6usize, 310u64), (11, 311)] {
                let (base, vb) = random(&[9, rows], -4.0, 4.0, seed, dt, ctx.device)?;
                let x = base.transpose(0, 1).map_err(err("transpose"))?;
                let hx = host_view(&vb, x.layout());
                close(
                    &format!("transposed input of {rows} rows"),
                    &run(&x, -1, "transposed")?,
                    &softmax_along(&hx, &[rows, 9], 1, log),
                    dt,
                    None,
                )?;
            }
            // Contiguous rows of 16 starting 2 elements into their buffer.
            let (flat, vf) = random(&[162], -4.0, 4.0, 312, dt, ctx.device)?;
            let x = flat
                .narrow(0, 2, 160)
                .and_then(|v| v.reshape(&[10, 16]))
                .map_err(err("offset view"))?;
            close(
                "rows 2 elements into their buffer",
                &run(&x, -1, "offset rows")?,
                &softmax_along(&vf[2..], &[10, 16], 1, log),
                dt,
                None,
            )
        }
        "large" => super::cases_ops_large::large_softmax(ctx, log, dt, softmax_along),
        "specials" => super::cases_ops_specials::softmax_specials(ctx, log, dt, softmax_along),
        "offsets" => {
            for (i, (shape, offset)) in [
                (&[2usize, 3, 7][..], None),
                (&[5, 5][..], None),
                (&[3, 9][..], Some(2usize)),
                // Rows enough for a row-per-lane kernel, with a partial last group.
                (&[2, 6, 9][..], None),
                (&[13, 16][..], Some(1)),
            ]
            .iter()
            .enumerate()
            {
                let (x, vx) = random(shape, -4.0, 4.0, 320 + i as u64, dt, ctx.device)?;
                let w = format!("causal_softmax {shape:?} offset {offset:?}");
                let out = x.causal_softmax(*offset).map_err(err(&w))?;
                let nd = shape.len();
                let (q, kv) = (shape[nd - 2], shape[nd - 1]);
                let off = offset.unwrap_or(kv - q);
                let want: Vec<f64> = vx
                    .chunks(kv)
                    .enumerate()
                    .flat_map(|(r, lane)| softmax_ref(lane, (r % q + off + 1).min(kv), false))
                    .collect();
                close(&w, &values(&out, &w)?, &want, dt, None)?;
            }
            Ok(())
        }
        "bad_input" => {
            let x = Tensor::zeros(&[4, 3], dt, ctx.device).map_err(err("zeros"))?;
            expect_kind(
                sm::causal_softmax(&x.desc(), None),
                &["bad_tensor_shape"],
                "4 queries over 3 keys",
            )?;
            let v = Tensor::zeros(&[4], dt, ctx.device).map_err(err("zeros"))?;
            expect_kind(
                sm::causal_softmax(&v.desc(), None),
                &["bad_tensor_shape"],
                "a vector",
            )?;
            expect_kind(
                sm::softmax(&x.desc(), 2, false),
                &["axis_out_of_range"],
                "axis 2",
            )?;
            Ok(())
        }
        _ => Err(fail(format!("unknown case {what}"))),
    }
}

fn norm_ref(x: &[f64], w: &[f64], b: Option<&[f64]>, eps: f64) -> Vec<f64> {
    let d = w.len();
    x.chunks(d)
        .flat_map(|row| {
            let n = d as f64;
            let (mean, denom) = match b {
                Some(_) => {
                    let m = row.iter().sum::<f64>() / n;
                    let var = row.iter().map(|v| (v - m).powi(2)).sum::<f64>() / n;
                    (m, (var + eps).sqrt())
                }
                None => (
                    0.0,
                    (row.iter().map(|v| v * v).sum::<f64>() / n + eps).sqrt(),
                ),
            };
            row.iter()
                .enumerate()
                .map(|(i, v)| (v - mean) / denom * w[i] + b.map_or(0.0, |b| b[i]))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn norm_case(ctx: &Ctx, op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    let layer = op == "layer_norm";
    let eps = 1e-5;
    let run = |x: &Tensor, vx: &[f64], seed: u64, w_: &str| -> Result<(), Failure> {
        let d = *x.shape().last().unwrap_or(&0);
        let (w, vw) = random(&[d], 0.5, 1.5, seed, dt, ctx.device)?;
        let (b, vb) = random(&[d], -0.5, 0.5, seed + 1, dt, ctx.device)?;
        let out = if layer {
            x.layer_norm(&w, &b, eps)
        } else {
            x.rms_norm(&w, eps)
        }
        .map_err(err(w_))?;
        let want = norm_ref(vx, &vw, layer.then_some(&vb[..]), eps);
        close(w_, &values(&out, w_)?, &want, dt, None)
    };
    match what {
        "rows" => {
            for (i, shape) in [
                &[1usize, 7][..],
                &[5, 257],
                &[2, 4099],
                &[3, 1, 16],
                &[0, 8],
                &[19, 33],
                &[12, 64],
                &[9, 2, 8],
            ]
            .iter()
            .enumerate()
            {
                let (x, vx) = random(shape, -2.0, 2.0, 400 + 2 * i as u64, dt, ctx.device)?;
                run(&x, &vx, 450 + 2 * i as u64, &format!("{op} {shape:?}"))?;
            }
            Ok(())
        }
        "large" => super::cases_ops_large::large_norm(ctx, layer, dt, norm_ref),
        "specials" => super::cases_ops_specials::norm_specials(ctx, layer, dt, norm_ref),
        "strided" => {
            let (base, vb) = random(&[64, 5], -2.0, 2.0, 470, dt, ctx.device)?;
            let x = base.transpose(0, 1).map_err(err("transpose"))?; // rows of 64, stride 5
            run(&x, &host_view(&vb, x.layout()), 471, "transposed rows")?;
            let (base, vb) = random(&[40, 12], -2.0, 2.0, 472, dt, ctx.device)?;
            let x = base.transpose(0, 1).map_err(err("transpose"))?; // 12 rows of 40, stride 12
            run(&x, &host_view(&vb, x.layout()), 473, "12 transposed rows")?;
            // Contiguous rows of 16 starting 2 elements into their buffer.
            let (flat, vf) = random(&[162], -2.0, 2.0, 474, dt, ctx.device)?;
            let x = flat
                .narrow(0, 2, 160)
                .and_then(|v| v.reshape(&[10, 16]))
                .map_err(err("offset view"))?;
            run(&x, &vf[2..], 475, "rows 2 elements into their buffer")
        }
        "bad_input" => {
            let z = |s: &[usize], d: DType| Tensor::zeros(s, d, ctx.device).map_err(err("zeros"));
            let x = z(&[3, 8], dt)?;
            let (w9, w8) = (z(&[9], dt)?, z(&[8], dt)?);
            let other = if dt == DType::F32 {
                DType::BF16
            } else {
                DType::F32
            };
            let wo = z(&[8], other)?;
            if layer {
                expect_kind(
                    norm::layer_norm(&x.desc(), &w9.desc(), &w8.desc(), eps),
                    &["shape_mismatch"],
                    "weight of 9 for rows of 8",
                )?;
                expect_kind(
                    norm::layer_norm(&x.desc(), &w8.desc(), &w9.desc(), eps),
                    &["shape_mismatch"],
                    "bias of 9 for rows of 8",
                )?;
                expect_kind(
                    norm::layer_norm(&x.desc(), &wo.desc(), &w8.desc(), eps),
                    &["dtype_mismatch"],
                    "weight of another dtype",
                )?;
            } else {
                expect_kind(
                    norm::rms_norm(&x.desc(), &w9.desc(), eps),
                    &["shape_mismatch"],
                    "weight of 9 for rows of 8",
                )?;
                expect_kind(
                    norm::rms_norm(&x.desc(), &wo.desc(), eps),
                    &["dtype_mismatch"],
                    "weight of another dtype",
                )?;
                let s = z(&[], dt)?;
                expect_kind(
                    norm::rms_norm(&s.desc(), &w8.desc(), eps),
                    &["bad_tensor_shape"],
                    "a scalar",
                )?;
            }
            Ok(())
        }
        _ => Err(fail(format!("unknown case {what}"))),
    }
}
