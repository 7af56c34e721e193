//! Reductions (sum, mean, max, min, argmax) over any set of axes. Each output element is one
//! lane: the reduced dimensions are coalesced into one strided run when they allow it, and
//! gathered by a precomputed offset list otherwise; a lane is folded in blocks of
//! [`BLOCK`] elements ([`LaneFold`]), read in place when it is contiguous f32. Sums
//! accumulate in f64.

use std::sync::Mutex;

use super::util::{
    coalesce, first_index_f32, floats, gather, max_f32, min_f32, offsets, simd, try_par_chunks,
    Float, Ptr, Scratch,
};
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelRegistry, Params};
use crate::tensor::DType;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Sum,
    Mean,
    Max,
    Min,
    Argmax,
}

/// Elements of a lane folded at a time: converted (f16, bf16) or gathered (strided) into a
/// buffer that stays in L1, where a whole lane's buffer (32 MiB for a sum over 8 Mi
/// elements) cost a page fault per 4 KiB on every launch. A multiple of 4 and of 16, so that
/// the lanes of the sums and extremes below run the same over blocks as over the whole lane.
const BLOCK: usize = 4096;

/// Elements of a lane's segment: lanes of at least two segments are folded a segment per
/// task (a multiple of [`BLOCK`], and large enough that a task outweighs its fork).
const SEGMENT: usize = 256 * 1024;

/// One lane's reduction, fed its elements block by block in order.
///
/// Sums accumulate in f64 with four accumulators (vectorisable, and more exact than f32),
/// the same over blocks as over the whole lane: every block but the last is whole quads.
/// max and min are NaN when any element is NaN, else the first element equal to the
/// extreme (its sign, for tied zeros); argmax is the index of the first NaN, else of the
/// first element equal to the maximum. A block's extreme is found sixteen lanes at a time
/// and the index by a second, vectorised pass (an element at a time, the compare-and-branch
/// chain ran at a twentieth of a sum's rate).
struct LaneFold {
    kind: Kind,
    acc: [f64; 4],
    rest: f64,
    /// The extreme so far (argmax: the maximum) and the index of its first element.
    best: f32,
    at: usize,
    /// The first NaN's index, once one is seen.
    nan: Option<usize>,
    seen: usize,
}

impl LaneFold {
    fn new(kind: Kind) -> Self {
        let best = if kind == Kind::Min {
            f32::INFINITY
        } else {
            f32::NEG_INFINITY
        };
        LaneFold {
            kind,
            acc: [0.0; 4],
            rest: 0.0,
            best,
            at: usize::MAX,
            nan: None,
            seen: 0,
        }
    }

    /// Folds in the lane's next `v.len()` elements.
    #[inline(always)]
    fn add(&mut self, v: &[f32]) {
        let base = self.seen;
        self.seen += v.len();
        match self.kind {
            Kind::Sum | Kind::Mean => {
                let chunks = v.chunks_exact(4);
                self.rest = chunks.remainder().iter().map(|&x| x as f64).sum::<f64>();
                // Indexed: the zipped form ran at two thirds of the rate (bench ops sum_all).
                #[allow(clippy::needless_range_loop)]
                for c in chunks {
                    for l in 0..4 {
                        self.acc[l] += c[l] as f64;
                    }
                }
            }
            _ if self.nan.is_some() => {}
            kind => {
                let m = if kind == Kind::Min {
                    min_f32(v)
                } else {
                    max_f32(v)
                };
                if m.is_nan() {
                    self.nan = Some(base + first_index_f32(v, m));
                } else if (kind == Kind::Min && m < self.best)
                    || (kind != Kind::Min && m > self.best)
                    || self.at == usize::MAX
                {
                    let i = first_index_f32(v, m);
                    (self.best, self.at) = (v[i], base + i);
                }
            }
        }
    }

    /// Folds in `o`, the fold of the elements right after this one's (segments merged in
    /// order: ties keep the earlier element, the first NaN stays first).
    fn merge(&mut self, o: &LaneFold) {
        for l in 0..4 {
            self.acc[l] += o.acc[l];
        }
        self.rest += o.rest;
        self.seen = o.seen;
        if self.nan.is_some() {
            return;
        }
        let better = match self.kind {
            Kind::Min => o.best < self.best,
            _ => o.best > self.best,
        };
        if o.nan.is_some() {
            self.nan = o.nan;
        } else if o.at != usize::MAX && (self.at == usize::MAX || better) {
            (self.best, self.at) = (o.best, o.at);
        }
    }

    /// The lane's result (argmax: its index as f64).
    fn finish(&self) -> f64 {
        let sum = || self.acc.iter().sum::<f64>() + self.rest;
        match (self.kind, self.nan) {
            (Kind::Sum, _) => sum(),
            (Kind::Mean, _) => sum() / self.seen as f64,
            (Kind::Argmax, Some(i)) => i as f64,
            (Kind::Argmax, None) => self.at as f64,
            (_, Some(_)) => f64::NAN,
            _ => self.best as f64,
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
        // Sorted (`Params::Reduce`): a search, not a scan per dimension (quadratic in rank).
        if axes.binary_search(&d).is_ok() {
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
    // A long lane is cut into segments folded in parallel (a whole-tensor sum ran on one
    // thread) and merged in order. The cut depends on the lane's length only, never on the
    // thread count, so the result does not either.
    let segment = if red_len >= 2 * SEGMENT {
        SEGMENT
    } else {
        red_len.max(1)
    };
    let segs = red_len.div_ceil(segment).max(1);
    let parts: Vec<Mutex<Option<LaneFold>>> = (0..if segs > 1 { lanes * segs } else { 0 })
        .map(|_| Mutex::new(None))
        .collect();
    let (px, po) = (Ptr::<T>::of(x), out.ptr() as usize);
    let store = |i: usize, fold: &LaneFold| {
        let v = match (red_len, kind) {
            (0, Kind::Sum) => 0.0,
            (0, _) => f64::NAN,
            _ => fold.finish(),
        };
        // SAFETY: the output is contiguous (the plan fixes it) with one element per lane.
        unsafe {
            if kind == Kind::Argmax {
                *(po as *mut i64).add(i) = v as i64;
            } else {
                *(po as *mut T).add(i) = T::from_f32(v as f32);
            }
        }
    };
    try_par_chunks(lanes * segs, segment, |range| {
        // A contiguous f32 lane is read where it lies; others pass through `buf`.
        let in_place = T::DTYPE == DType::F32 && run == Some(1);
        let mut buf = Scratch::zeroed(if in_place { 0 } else { segment.min(BLOCK) })?;
        for item in range {
            let (i, seg) = (item / segs, item % segs);
            let mut base = 0usize;
            let mut rem = i;
            for d in (0..kept_shape.len()).rev() {
                base += (rem % kept_shape[d]) * kept_strides[d];
                rem /= kept_shape[d];
            }
            let (first, end) = (seg * segment, ((seg + 1) * segment).min(red_len));
            let mut fold = LaneFold::new(kind);
            fold.seen = first;
            for start in (first..end).step_by(BLOCK) {
                let len = BLOCK.min(end - start);
                let block: &[f32] = if in_place {
                    // SAFETY: the block lies inside the checked input view, contiguous, and T
                    // is f32.
                    unsafe { std::slice::from_raw_parts(px.at(base + start) as *const f32, len) }
                } else {
                    let b = &mut buf[..len];
                    // SAFETY: the block lies inside the checked input view.
                    unsafe {
                        match run {
                            Some(s) => gather(px.at(base + start * s), s, b),
                            None => {
                                for (b, &o) in b.iter_mut().zip(&list[start..]) {
                                    *b = (*px.at(base + o)).to_f32();
                                }
                            }
                        }
                    }
                    b
                };
                simd!(fold.add(block));
            }
            if segs == 1 {
                store(i, &fold);
            } else if let Ok(mut part) = parts[item].lock() {
                *part = Some(fold);
            }
        }
        Ok(())
    })?;
    for (i, lane) in parts.chunks(segs).enumerate() {
        let mut folds = lane
            .iter()
            .filter_map(|p| p.lock().ok().and_then(|mut p| p.take()));
        if let Some(mut fold) = folds.next() {
            folds.for_each(|o| fold.merge(&o));
            store(i, &fold);
        }
    }
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
