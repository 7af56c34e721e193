//! Special values through the elementwise operators: NaN, ±∞, ±0, overflow and underflow.
//! The expected value is the operator's f64 reference (`BinaryOp::eval`, `UnaryOp::eval`)
//! rounded to the dtype: the IEEE result of its formula, with PyTorch's conventions where
//! IEEE leaves a choice — a NaN operand gives NaN (`relu`, `maximum` and `minimum` included:
//! they do not skip NaN as `fmax` does), `pow` follows C's `pow` (a negative base to an
//! integer power is real, `pow(x, 0) = 1` and `pow(1, y) = 1` even for NaN). What this catches: `tanh` as a quotient of exponentials (∞/∞ = NaN for
//! large inputs), `pow` as `exp2(y·log2 x)` (NaN for every negative base), `max(x, 0)` that
//! drops NaN, an `exp` that clamps its argument, a compiler that assumes no NaN.
//!
//! Each pattern is repeated to 20 000 elements and run at its own length too, so the scalar
//! tails, the SIMD bodies and (on the software adapters) the texture paths all see it.

use unirt::ops::elementwise::{self as ew, BinaryOp, UnaryOp};
use unirt::tensor::{DType, Tensor};
use unirt::Device;

use crate::ops_check::*;
use crate::{Ctx, Failure};

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

/// Unary inputs, exact in every float dtype.
const UNARY: [f64; 16] = [
    NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5, 100.0, -100.0, 3.0, -3.0, 20.0, -20.0, 2.0, -2.0,
];

/// Binary operand pairs, exact in every float dtype.
const PAIRS: [(f64, f64); 24] = [
    (NAN, 1.0),
    (1.0, NAN),
    (NAN, NAN),
    (INF, -INF),
    (INF, INF),
    (-INF, -INF),
    (INF, 1.0),
    (1.0, INF),
    (-INF, 2.0),
    (0.0, 0.0),
    (1.0, 0.0),
    (-1.0, 0.0),
    (0.0, INF),
    (INF, 0.0),
    (-2.0, 2.0),
    (-2.0, 3.0),
    (-8.0, 0.5),
    (2.0, -1.0),
    (0.0, -1.0),
    (0.5, INF),
    (2.0, INF),
    (NAN, 0.0),
    (1.0, 3.0),
    (-3.0, -0.5),
];

/// The scalars each scalar operator is run with.
const SCALARS: [f64; 5] = [2.0, 3.0, 0.0, -INF, NAN];

/// Length the patterns are repeated to.
const LONG: usize = 20_000;

/// `v` rounded to `dt` (overflow to ±∞), through the library's own encoding on the CPU.
fn rounded(v: &[f64], dt: DType) -> Result<Vec<f64>, Failure> {
    Tensor::from_f64(v, &[v.len()], dt, Device::CPU)
        .and_then(|t| t.to_f64_vec())
        .map_err(err("rounding the expected values"))
}

/// `pattern` at its own length and repeated to [`LONG`].
fn lengths(pattern: &[f64]) -> [Vec<f64>; 2] {
    let long = pattern.iter().copied().cycle().take(LONG).collect();
    [pattern.to_vec(), long]
}

/// Compares `out` with `want` rounded to `dt`; a mismatch names its operands
/// (`operands(i)`), not just an index into the repetition.
fn check(
    what: &str,
    out: &Tensor,
    want: &[f64],
    dt: DType,
    operands: &dyn Fn(usize) -> String,
) -> Result<(), Failure> {
    let want = rounded(want, dt)?;
    let got = values(out, what)?;
    if got.len() != want.len() {
        return close(what, &got, &want, dt, None);
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if close("", &[*g], &[*w], dt, None).is_err() {
            return Err(fail(format!(
                "{what}: {} gave {g}, expected {w} ({dt}, element {i})",
                operands(i)
            )));
        }
    }
    Ok(())
}

/// `op` over the special inputs, in `dt`.
pub(crate) fn unary_specials(ctx: &Ctx, op: UnaryOp, dt: DType) -> Result<(), Failure> {
    for x in lengths(&UNARY) {
        let what = format!("{} of {} special values", op.name(), x.len());
        let t = Tensor::from_f64(&x, &[x.len()], dt, ctx.device).map_err(err("from_f64"))?;
        let out = ew::unary(op, &t.desc())
            .and_then(|p| p.run1(&[&t]))
            .map_err(err(&what))?;
        let want: Vec<f64> = x.iter().map(|&v| op.eval(v)).collect();
        check(&what, &out, &want, dt, &|i| {
            format!("{}({})", op.name(), x[i])
        })?;
    }
    Ok(())
}

/// `op` (a [`BinaryOp`] name, or `swiglu`) over the special operand pairs, in `dt`.
pub(crate) fn binary_specials(ctx: &Ctx, op: &str, dt: DType) -> Result<(), Failure> {
    let pairs: Vec<(f64, f64)> = if op == "swiglu" {
        // The gate's ±∞ have no single answer (u·g·σ(g) is ∞·0 at −∞ by the formula, 0 in
        // the limit): finite gates and NaN only.
        PAIRS
            .iter()
            .copied()
            .filter(|(_, g)| !g.is_infinite())
            .chain([(2.0, 100.0), (2.0, -100.0), (-3.0, 20.0), (0.5, -20.0)])
            .collect()
    } else {
        PAIRS.to_vec()
    };
    // The operator's reference (`BinaryOp::eval`, or u · silu(g)) and its launch, as the
    // ordinary cases have them.
    let (want, _, _) = super::cases_ops_elementwise::binary_ref(op)?;
    let (va, vb): (Vec<f64>, Vec<f64>) = pairs.iter().copied().unzip();
    for (a, b) in lengths(&va).into_iter().zip(lengths(&vb)) {
        let what = format!("{op} of {} special pairs", a.len());
        let ta = Tensor::from_f64(&a, &[a.len()], dt, ctx.device).map_err(err("from_f64"))?;
        let tb = Tensor::from_f64(&b, &[b.len()], dt, ctx.device).map_err(err("from_f64"))?;
        let out = super::cases_ops_elementwise::run_binary(op, &ta, &tb).map_err(err(&what))?;
        let want: Vec<f64> = a.iter().zip(&b).map(|(&x, &y)| want(x, y)).collect();
        check(&what, &out, &want, dt, &|i| {
            format!("{op}({}, {})", a[i], b[i])
        })?;
    }
    Ok(())
}

/// `op` with each of [`SCALARS`] over the special inputs, in `dt`.
pub(crate) fn scalar_specials(ctx: &Ctx, op: BinaryOp, dt: DType) -> Result<(), Failure> {
    for s in SCALARS {
        for x in lengths(&UNARY) {
            let what = format!("{} by {s} of {} special values", op.scalar_name(), x.len());
            let t = Tensor::from_f64(&x, &[x.len()], dt, ctx.device).map_err(err("from_f64"))?;
            let out = ew::binary_scalar(op, &t.desc(), s)
                .and_then(|p| p.run1(&[&t]))
                .map_err(err(&what))?;
            let want: Vec<f64> = x.iter().map(|&v| op.eval(v, s)).collect();
            let name = op.scalar_name();
            check(&what, &out, &want, dt, &|i| {
                format!("{name}({}, {s})", x[i])
            })?;
        }
    }
    Ok(())
}
