//! What the operator cases share: the per-dtype tolerances (the one place they are written
//! down), seeded random tensors with their exact stored values, host-side views for the f64
//! references, the comparison, and the macro that names cases `ops::<op>::<dtype>::<what>`.

use unirt::error::Error;
use unirt::tensor::{DType, Layout, Tensor};
use unirt::Device;

use crate::{Ctx, Failure};

/// `(atol, rtol)` for results of `dtype` against an f64 reference computed from the stored
/// inputs: each kernel computes in f32 and rounds once into `dtype`, so the bound is a few
/// units in the last place of f32 (libm functions, accumulation order), or half an ulp of the
/// output dtype plus that.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-4),
        DType::F16 => (1e-3, 2e-3),
        DType::BF16 => (8e-3, 1e-2),
        // Integer and bool results are exact.
        _ => (0.0, 0.0),
    }
}

/// Extra absolute error allowed per unit of `Σ|term|` in accumulations (sums, dot
/// products): f32 accumulation of up to a few thousand terms.
pub const ACCUMULATION: f64 = 2e-6;

/// A failure with a formatted message.
pub fn fail(msg: impl Into<String>) -> Failure {
    Failure::Failed(msg.into())
}

/// Any unirt error as a failure of `what`.
pub fn err(what: &str) -> impl Fn(Error) -> Failure + '_ {
    move |e| match e {
        Error::Unsupported { .. } => Failure::Unsupported(format!("{what}: {e}")),
        e => fail(format!("{what}: unexpected error {} ({e})", e.kind_name())),
    }
}

/// A float dtype other than `dt`: the operand of a dtype-mismatch check.
pub fn another_dtype(dt: DType) -> DType {
    if dt == DType::F32 {
        DType::F16
    } else {
        DType::F32
    }
}

/// A seeded random tensor of `dtype` with values in `[lo, hi)`, and its stored values
/// (after rounding to `dtype`) read back.
pub fn random(
    shape: &[usize],
    lo: f64,
    hi: f64,
    seed: u64,
    dtype: DType,
    device: Device,
) -> Result<(Tensor, Vec<f64>), Failure> {
    let t =
        Tensor::rand_uniform(shape, lo, hi, seed, dtype, device).map_err(err("rand_uniform"))?;
    let v = t.to_f64_vec().map_err(err("reading a random tensor"))?;
    Ok((t, v))
}

/// The row-major values of the view `layout` of a storage whose elements are `base`.
pub fn host_view(base: &[f64], layout: &Layout) -> Vec<f64> {
    let shape = layout.shape();
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (mut rem, mut off) = (i, layout.offset());
        for d in (0..shape.len()).rev() {
            off += (rem % shape[d]) * layout.strides()[d];
            rem /= shape[d];
        }
        out.push(base[off]);
    }
    out
}

/// Row-major index → multi-index.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d].max(1);
        i /= shape[d].max(1);
    }
    idx
}

/// Multi-index → row-major index with broadcasting of `shape` (aligned at the right) into
/// an index of a larger shape.
pub fn bcast_index(idx: &[usize], shape: &[usize]) -> usize {
    let lead = idx.len() - shape.len();
    let mut off = 0;
    for (d, &n) in shape.iter().enumerate() {
        off = off * n + if n == 1 { 0 } else { idx[lead + d] };
    }
    off
}

/// Compares `got` with the f64 reference `want` under `dtype`'s tolerance; `scale[i]` (when
/// given) is `Σ|terms|` of an accumulation behind element `i`.
pub fn close(
    what: &str,
    got: &[f64],
    want: &[f64],
    dtype: DType,
    scale: Option<&[f64]>,
) -> Result<(), Failure> {
    if got.len() != want.len() {
        return Err(fail(format!(
            "{what}: {} values, expected {}",
            got.len(),
            want.len()
        )));
    }
    let (atol, rtol) = tolerance(dtype);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let s = scale.map_or(0.0, |s| s[i]);
        let bound = atol + rtol * w.abs() + ACCUMULATION * s + rtol * ACCUMULATION * s;
        // An infinite expectation is met only exactly (its bound would be infinite too).
        let ok =
            (g.is_nan() && w.is_nan()) || (g == w) || (w.is_finite() && (g - w).abs() <= bound);
        if !ok {
            return Err(fail(format!(
                "{what}: element {i} is {g}, expected {w} (|diff| {:.3e} > {bound:.3e}, {dtype})",
                (g - w).abs()
            )));
        }
    }
    Ok(())
}

/// The values of a tensor (waits for its work; a stream error fails the case).
pub fn values(t: &Tensor, what: &str) -> Result<Vec<f64>, Failure> {
    t.to_f64_vec().map_err(err(what))
}

/// Checks that `r` failed with one of the error kinds `kinds` (by `Error::kind_name`).
pub fn expect_kind<T>(r: Result<T, Error>, kinds: &[&str], what: &str) -> Result<(), Failure> {
    match r {
        Err(e) if kinds.contains(&e.kind_name()) => Ok(()),
        Err(e) => Err(fail(format!(
            "{what}: expected {kinds:?}, got {} ({e})",
            e.kind_name()
        ))),
        Ok(_) => Err(fail(format!("{what}: expected {kinds:?}, got Ok"))),
    }
}

/// Another device than `ctx`'s, for device-mismatch checks (the CPU unless `ctx` is the CPU;
/// then the first other device discovered, if any).
pub fn other_device(ctx: &Ctx) -> Option<Device> {
    if ctx.device != Device::CPU {
        return Some(Device::CPU);
    }
    unirt::discover()
        .backends
        .iter()
        .filter(|b| b.reason.is_none())
        .flat_map(|b| b.devices.iter().map(move |d| Device::new(b.kind, d.index)))
        .find(|d| *d != ctx.device)
}

/// The element sizes every elementwise family runs: 0, 1, odd sizes and one large.
pub const SIZES: &[usize] = &[0, 1, 7, 257, 4099, 1 << 20];

/// Declares operator cases: for each `module = "op" : [dtypes] => [whats] via runner;` one
/// case `ops::<op>::<dtype>::<what>` per dtype and what, each calling
/// `runner(ctx, "op", dtype, "what")` (a function of the invoking module). `cases()` lists
/// them.
#[macro_export]
macro_rules! op_cases {
    ($($m:ident = $op:literal : [$($dt:ident),*] => $whats:tt via $runner:ident;)*) => {
        $(
            #[allow(non_snake_case, clippy::module_inception)]
            mod $m {
                $( $crate::op_cases!(@dt $op, $dt, $whats, $runner); )*
                pub(crate) fn push(v: &mut Vec<$crate::Case>) {
                    $( $dt::push(v); )*
                }
            }
        )*
        /// The cases this file declares.
        pub(crate) fn cases() -> Vec<$crate::Case> {
            let mut v = Vec::new();
            $( $m::push(&mut v); )*
            v
        }
    };
    (@dt $op:literal, $dt:ident, [$($what:ident),*], $runner:ident) => {
        #[allow(non_snake_case)]
        pub(crate) mod $dt {
            $(
                pub(crate) fn $what(ctx: &$crate::Ctx) -> Result<(), $crate::Failure> {
                    let dtype: unirt::tensor::DType = stringify!($dt)
                        .parse()
                        .map_err(|e| $crate::Failure::Failed(format!("{e}")))?;
                    super::super::$runner(ctx, $op, dtype, stringify!($what))
                }
            )*
            pub(crate) fn push(v: &mut Vec<$crate::Case>) {
                $(
                    v.push($crate::Case {
                        name: concat!("ops::", $op, "::", stringify!($dt), "::", stringify!($what)),
                        needs: &[],
                        run: $what,
                    });
                )*
            }
        }
    };
}

/// Runs `run` on the values `v`, as a `dt` tensor of `shape` placed 0, 1, 2 and 3 elements
/// into its buffer, and requires bitwise-equal results: where a tensor lies must not change
/// what an operator computes (wgpu takes quad and texture variants for tensors that start on
/// a multiple of four elements, one element at a time otherwise), or a replayed graph, whose
/// tensors lie in an arena, could differ from the same operators run eagerly. Returns the
/// tensor that starts its buffer and its result.
pub fn same_wherever_placed(
    ctx: &Ctx,
    v: &[f32],
    shape: &[usize],
    dt: DType,
    what: &str,
    run: impl Fn(&Tensor) -> unirt::Result<Tensor>,
) -> Result<(Tensor, Vec<f64>), Failure> {
    let n = v.len();
    let mut first: Option<(Tensor, Vec<f64>)> = None;
    for shift in 0..4 {
        let w = format!("{what}, {shift} elements into its buffer");
        let mut host = vec![0.0f32; shift];
        host.extend_from_slice(v);
        let x = Tensor::from_slice(&host, &[shift + n], ctx.device)
            .and_then(|t| t.to_dtype(dt))
            .and_then(|t| t.narrow(0, shift, n))
            .and_then(|t| t.reshape(shape))
            .map_err(err(&w))?;
        let got = values(&run(&x).map_err(err(&w))?, &w)?;
        match &first {
            None => first = Some((x, got)),
            Some((_, want)) => {
                if let Some(i) = (0..want.len()).find(|&i| want[i].to_bits() != got[i].to_bits()) {
                    return Err(fail(format!(
                        "{w}: element {i} is {}, but {} when the tensor starts its buffer",
                        got[i], want[i]
                    )));
                }
            }
        }
    }
    first.ok_or_else(|| fail(format!("{what}: no placement ran")))
}
