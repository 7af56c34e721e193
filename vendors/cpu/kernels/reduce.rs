//! Reductions (sum, mean, max, min, argmax) over any set of axes. Each output element is one
//! lane: the reduced dimensions are coalesced into one strided run when they allow it, and
//! gathered by a precomputed offset list otherwise. Sums accumulate in f64.

use super::util::{coalesce, floats, gather, offsets, par_chunks, Float, Ptr};
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelRegistry, Params};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Sum,
    Mean,
    Max,
    Min,
    Argmax,
}

/// Sum in f64 with four accumulators (vectorisable, and more exact than f32).
fn sum_f64(v: &[f32]) -> f64 {
    let mut acc = [0f64; 4];
    let chunks = v.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..4 {
            acc[l] += c[l] as f64;
        }
    }
    acc.iter().sum::<f64>() + rest.iter().map(|&x| x as f64).sum::<f64>()
}

fn fold(kind: Kind, v: &[f32]) -> f64 {
    match kind {
        Kind::Sum => sum_f64(v),
        Kind::Mean => sum_f64(v) / v.len() as f64,
        Kind::Max | Kind::Min => {
            let mut best = v[0];
            for &x in &v[1..] {
                if x.is_nan() || best.is_nan() {
                    best = f32::NAN;
                } else if (kind == Kind::Max && x > best) || (kind == Kind::Min && x < best) {
                    best = x;
                }
            }
            best as f64
        }
        Kind::Argmax => {
            let mut at = 0usize;
            for (i, &x) in v.iter().enumerate().skip(1) {
                let b = v[at];
                if !b.is_nan() && (x > b || x.is_nan()) {
                    at = i;
                }
            }
            at as f64
        }
    }
}

fn reduce<T: Float>(call: &KernelCall<'_>, kind: Kind) -> Result<()> {
    let Params::Reduce { axes, .. } = call.params else {
        return Err(Error::Internal(format!(
            "{}: parameters {:?}",
            call.op, call.params
        )));
    };
    let (x, out) = (&call.inputs[0], &call.outputs[0]);
    let (shape, strides) = (x.layout.shape(), x.layout.strides());
    let (mut kept_shape, mut kept_strides, mut red_shape, mut red_strides) =
        (vec![], vec![], vec![], vec![]);
    for d in 0..shape.len() {
        if axes.contains(&d) {
            red_shape.push(shape[d]);
            red_strides.push(strides[d]);
        } else {
            kept_shape.push(shape[d]);
            kept_strides.push(strides[d]);
        }
    }
    let (rs, rst) = coalesce(&red_shape, [&red_strides[..]]);
    let red_len: usize = red_shape.iter().product();
    // One strided run, or an offset list for reductions that cannot be coalesced.
    let run: Option<usize> = match rs.len() {
        0 => Some(1),
        1 => Some(rst[0][0]),
        _ => None,
    };
    let list = if run.is_none() {
        offsets(&red_shape, &red_strides)
    } else {
        Vec::new()
    };
    let lanes: usize = kept_shape.iter().product();
    let (px, po) = (Ptr::<T>::of(x), out.ptr() as usize);
    par_chunks(lanes, red_len, |range| {
        let mut buf = vec![0f32; red_len];
        for i in range {
            let mut base = 0usize;
            let mut rem = i;
            for d in (0..kept_shape.len()).rev() {
                base += (rem % kept_shape[d]) * kept_strides[d];
                rem /= kept_shape[d];
            }
            // SAFETY: the lane lies inside the checked input view.
            unsafe {
                match run {
                    Some(s) => gather(px.at(base), s, &mut buf),
                    None => {
                        for (b, &o) in buf.iter_mut().zip(&list) {
                            *b = (*px.at(base + o)).to_f32();
                        }
                    }
                }
            }
            let v = if red_len == 0 {
                if kind == Kind::Sum {
                    0.0
                } else {
                    f64::NAN
                }
            } else {
                fold(kind, &buf)
            };
            // SAFETY: the output is contiguous (the plan fixes it) with one element per lane.
            unsafe {
                if kind == Kind::Argmax {
                    *(po as *mut i64).add(i) = v as i64;
                } else {
                    *(po as *mut T).add(i) = T::from_f32(v as f32);
                }
            }
        }
    });
    Ok(())
}

fn sum<T: Float>(c: &KernelCall<'_>) -> Result<()> {
    reduce::<T>(c, Kind::Sum)
}
fn mean<T: Float>(c: &KernelCall<'_>) -> Result<()> {
    reduce::<T>(c, Kind::Mean)
}
fn max<T: Float>(c: &KernelCall<'_>) -> Result<()> {
    reduce::<T>(c, Kind::Max)
}
fn min<T: Float>(c: &KernelCall<'_>) -> Result<()> {
    reduce::<T>(c, Kind::Min)
}
fn argmax<T: Float>(c: &KernelCall<'_>) -> Result<()> {
    reduce::<T>(c, Kind::Argmax)
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, "sum", sum);
    floats!(reg, "mean", mean);
    floats!(reg, "max", max);
    floats!(reg, "min", min);
    floats!(reg, "argmax", argmax);
}
