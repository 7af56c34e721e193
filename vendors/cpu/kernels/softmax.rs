//! softmax, log_softmax and causal softmax, one lane at a time: contiguous f32 lanes are read
//! and written in place (input → output, no buffer); other lanes go through an f32 buffer.

use super::util::{
    exp_nonpositive_f32, floats, gather, max_f32, par_chunks, prefetch_l2, scatter, simd,
    try_par_chunks, AlignedBlock, Float, Lanes, Ptr, Scratch,
};
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelRegistry, Params};
use crate::tensor::DType;

/// softmax of `v[..visible]` in place (log-softmax when `log`); `v[visible..]` become 0
/// (masked keys of a causal row).
#[inline(always)]
fn softmax_lane(v: &mut [f32], visible: usize, log: bool) {
    let inv = softmax_lane_unscaled(v, visible, log);
    if !log {
        let seen = visible.min(v.len());
        v[..seen].iter_mut().for_each(|x| *x *= inv);
    }
}

/// [`softmax_lane`] but for its last step: softmax's `exp(x − max)` are left in `v[..visible]`
/// and the factor that normalises them is returned, for the caller to apply as it stores the
/// lane (narrowing to f16/bf16 in the same pass). log-softmax is finished in place (the factor
/// is then 1 and not to be applied).
#[inline(always)]
fn softmax_lane_unscaled(v: &mut [f32], visible: usize, log: bool) -> f32 {
    let (seen, masked) = v.split_at_mut(visible.min(v.len()));
    masked
        .iter_mut()
        .for_each(|x| *x = if log { f32::NEG_INFINITY } else { 0.0 });
    if seen.is_empty() {
        return 1.0;
    }
    let max = max_f32(seen);
    if log {
        // (x − max) − ln Σ, never x − (max + ln Σ): beside a large max, ln Σ would be lost
        // in the rounding of their sum.
        let ln_sum = seen
            .iter()
            .map(|&x| exp_nonpositive_f32(x - max))
            .sum::<f32>()
            .ln();
        seen.iter_mut().for_each(|x| *x = (*x - max) - ln_sum);
        return 1.0;
    }
    1.0 / exp_sum_in_place(seen, max)
}

/// `v[j] = exp(v[j] − max)` for every element, returning their sum: one pass, summed from
/// registers with the eight accumulators of [`super::util::sum_f32`] in its order (the same bits as a
/// separate sum of the stored values).
#[inline(always)]
fn exp_sum_in_place(v: &mut [f32], max: f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut j = 0;
    for ys in v.chunks_exact_mut(16) {
        let e = exp_line(ys, max, &mut acc);
        ys.copy_from_slice(&e);
        j += 16;
    }
    if j + 8 <= v.len() {
        for l in 0..8 {
            v[j + l] = exp_nonpositive_f32(v[j + l] - max);
            acc[l] += v[j + l];
        }
        j += 8;
    }
    for y in v[j..].iter_mut() {
        *y = exp_nonpositive_f32(*y - max);
    }
    let tail: f32 = v[j..].iter().sum();
    acc.iter().sum::<f32>() + tail
}

/// `exp(x − max)` of one 16-element line (a cache line of f32), summed into `acc` from
/// registers in [`super::util::sum_f32`]'s order before the caller stores them: summing from
/// the stored line reloaded each half of a 64-byte store right after it, which store
/// forwarding does not serve (a stall per line: 1.08 → 0.86 ms at 1024 × 4096).
#[inline(always)]
fn exp_line(xs: &[f32], max: f32, acc: &mut [f32; 8]) -> [f32; 16] {
    let mut e = [0f32; 16];
    for (v, &a) in e.iter_mut().zip(xs) {
        *v = exp_nonpositive_f32(a - max);
    }
    for l in 0..8 {
        acc[l] += e[l];
    }
    for l in 0..8 {
        acc[l] += e[8 + l];
    }
    e
}

/// Stores the lane `v` to the contiguous `dst`, its first `scaled` elements multiplied by
/// `inv`: the normalisation of a softmax and the narrowing to `T` in one pass, through a small
/// f32 block (as [`scatter`] would, after a separate scaling pass over `v`).
///
/// # Safety
/// `dst` must be valid for writing `v.len()` elements.
#[inline(always)]
unsafe fn scale_store<T: Float>(v: &[f32], scaled: usize, inv: f32, dst: *mut T) {
    // SAFETY: the caller's promise.
    let out = unsafe { std::slice::from_raw_parts_mut(dst, v.len()) };
    let (vs, rest) = v.split_at(scaled);
    let (os, orest) = out.split_at_mut(scaled);
    let mut block = AlignedBlock::<256>::ZERO;
    for (x, o) in vs.chunks(256).zip(os.chunks_mut(256)) {
        let b = &mut block[..x.len()];
        for (b, &x) in b.iter_mut().zip(x) {
            *b = x * inv;
        }
        T::store(b, o);
    }
    T::store(rest, orest);
}

/// softmax of the contiguous f32 lane `x` written to `o` (log-softmax when `log`; elements
/// from `visible` on become 0 / −∞), reading `x` once from memory: the max pass reads it,
/// the exp pass writes `o` and sums it (the eight accumulators of [`sum_f32`](super::util::sum_f32), in its order,
/// so the same bits) while it prefetches the lane at `next` (when not null), and the scale
/// pass runs on `o` (now in L1).
#[inline(always)]
fn softmax_lane_to(x: &[f32], o: &mut [f32], visible: usize, log: bool, next: *const f32) {
    let v = visible.min(x.len());
    let (seen, rest) = o.split_at_mut(v);
    rest.iter_mut()
        .for_each(|y| *y = if log { f32::NEG_INFINITY } else { 0.0 });
    if v == 0 {
        return;
    }
    let x = &x[..v];
    let max = max_f32(x);
    if log {
        let ln_sum = x
            .iter()
            .map(|&a| exp_nonpositive_f32(a - max))
            .sum::<f32>()
            .ln();
        seen.iter_mut()
            .zip(x)
            .for_each(|(y, &a)| *y = (a - max) - ln_sum);
        return;
    }
    let mut acc = [0f32; 8];
    let mut j = 0;
    // 16 elements (one cache line) per step; the sums go to the accumulators 8 at a time.
    for (ys, xs) in seen.chunks_exact_mut(16).zip(x.chunks_exact(16)) {
        if !next.is_null() {
            prefetch_l2(next.wrapping_add(j));
        }
        let e = exp_line(xs, max, &mut acc);
        ys.copy_from_slice(&e);
        j += 16;
    }
    if j + 8 <= v {
        for l in 0..8 {
            seen[j + l] = exp_nonpositive_f32(x[j + l] - max);
            acc[l] += seen[j + l];
        }
        j += 8;
    }
    for (y, &a) in seen[j..].iter_mut().zip(&x[j..]) {
        *y = exp_nonpositive_f32(a - max);
    }
    let tail: f32 = seen[j..].iter().sum();
    let inv = 1.0 / (acc.iter().sum::<f32>() + tail);
    seen.iter_mut().for_each(|y| *y *= inv);
}

fn softmax<T: Float>(call: &KernelCall<'_>) -> Result<()> {
    let Params::Softmax { axis, log, causal } = *call.params else {
        return Err(Error::Internal(format!(
            "{}: parameters {:?}",
            call.op, call.params
        )));
    };
    let (x, out) = (&call.inputs[0], &call.outputs[0]);
    let lanes = Lanes::new([&out.layout, &x.layout], axis);
    let nd = x.layout.ndim();
    // For causal rows: the query index is the second-to-last dimension, which is the last
    // of the "other" dimensions the lanes run over.
    let q_len = if nd >= 2 { x.layout.shape()[nd - 2] } else { 1 };
    let (po, px) = (Ptr::<T>::of(out), Ptr::<T>::of(x));
    let visible = |i: usize| match causal {
        Some(offset) => (i % q_len) + offset + 1,
        None => lanes.len,
    };
    if T::DTYPE == DType::F32 && lanes.stride == [1, 1] && lanes.len > 0 {
        let (po, px) = (Ptr::<f32>::of(out), Ptr::<f32>::of(x));
        par_chunks(lanes.count(), lanes.len, |range| {
            for (i, [oo, ox], next) in lanes.walk(range) {
                // SAFETY: T is f32 (checked above); both lanes are contiguous runs inside
                // their checked views, and the plan lets the output overlap the input only
                // as the very same view, so the lanes are either identical (one slice) or
                // disjoint (two).
                unsafe {
                    let o = std::slice::from_raw_parts_mut(po.at(oo), lanes.len);
                    if std::ptr::eq(po.at(oo), px.at(ox)) {
                        simd!(softmax_lane(o, visible(i), log));
                    } else {
                        let x = std::slice::from_raw_parts(px.at(ox), lanes.len);
                        let next = next.map_or(std::ptr::null(), |[_, nx]| px.0.wrapping_add(nx));
                        simd!(softmax_lane_to(x, o, visible(i), log, next));
                    }
                }
            }
        });
        return Ok(());
    }
    try_par_chunks(lanes.count(), lanes.len, |range| {
        let mut buf = Scratch::zeroed(lanes.len)?;
        for i in range {
            let [oo, ox] = lanes.offsets(i);
            // SAFETY: both lanes lie in their checked views; the input lane is read whole
            // before the output lane (possibly the same elements) is written.
            unsafe {
                gather(px.at(ox), lanes.stride[1], &mut buf);
                if !log && lanes.stride[0] == 1 && lanes.len > 0 {
                    // Widen, max, exp with its sum, then scale while narrowing: four passes
                    // over the lane where scaling and narrowing apart took six (a 16 MiB bf16
                    // softmax went at a third of f32's speed per element).
                    let inv = simd!(softmax_lane_unscaled(&mut buf, visible(i), log));
                    let seen = visible(i).min(lanes.len);
                    simd!(scale_store(&buf, seen, inv, po.at(oo)));
                } else {
                    simd!(softmax_lane(&mut buf, visible(i), log));
                    scatter(&buf, po.at(oo), lanes.stride[0]);
                }
            }
        }
        Ok(())
    })?;
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, "softmax", softmax);
    floats!(reg, "log_softmax", softmax);
    floats!(reg, "causal_softmax", softmax);
}
