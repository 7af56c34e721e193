//! rms_norm and layer_norm over the last dimension, one row at a time (contiguous f32 rms_norm
//! rows input → output, a large output written past the cache; others through f32 buffers),
//! with vectorised f32 sums (eight accumulators) for the statistics.

use super::util::{
    dot, floats, gather, par_chunks, prefetch_l2, scatter, simd, stream_fence, streams, sum_f32,
    try_par_chunks, write_streaming_unfenced, Float, Lanes, Ptr, Scratch,
};
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelRegistry, Params};
use crate::tensor::DType;

/// Normalises one row in place: layer norm with weight `w` and bias `b`, or RMS norm with `w`.
#[inline(always)]
fn normalize(buf: &mut [f32], w: &[f32], b: &[f32], layer: bool, eps: f64) {
    let d = buf.len();
    if layer {
        let mean = sum_f32(buf) / d as f32;
        buf.iter_mut().for_each(|v| *v -= mean);
        let var = dot(buf, buf) as f64 / d as f64;
        let inv = (1.0 / (var + eps).sqrt()) as f32;
        for ((v, w), b) in buf.iter_mut().zip(w).zip(b) {
            *v = *v * inv * w + b;
        }
    } else {
        let ms = dot(buf, buf) as f64 / d as f64;
        let inv = (1.0 / (ms + eps).sqrt()) as f32;
        for (v, w) in buf.iter_mut().zip(w) {
            *v *= inv * w;
        }
    }
}

/// RMS norm of the f32 row `x` into `o` (distinct, same length), without a buffer: the same
/// arithmetic as [`normalize`]. The scale pass (on `x`, now in L1) prefetches the row at
/// `next` when it is not null, and writes `o` with non-temporal stores when `stream` (the
/// caller fences): over 16 and 64 MiB that ran 0.65–0.82× the time of plain stores, which
/// read each output line before writing it (one process, switched per launch).
#[inline(always)]
fn rms_to(x: &[f32], o: &mut [f32], w: &[f32], eps: f64, next: *const f32, stream: bool) {
    let ms = dot(x, x) as f64 / x.len() as f64;
    let inv = (1.0 / (ms + eps).sqrt()) as f32;
    write_streaming_unfenced(
        o,
        stream,
        #[inline(always)]
        |s, o| {
            // 16 elements (one cache line) per step.
            for (j, ((ys, xs), ws)) in o
                .chunks_mut(16)
                .zip(x[s..].chunks(16))
                .zip(w[s..].chunks(16))
                .enumerate()
            {
                if !next.is_null() {
                    prefetch_l2(next.wrapping_add(s + 16 * j));
                }
                for ((y, &v), w) in ys.iter_mut().zip(xs).zip(ws) {
                    *y = v * (inv * w);
                }
            }
        },
    );
}

fn norm<T: Float>(call: &KernelCall<'_>, layer: bool) -> Result<()> {
    let Params::Norm { eps } = *call.params else {
        return Err(Error::Internal(format!(
            "{}: parameters {:?}",
            call.op, call.params
        )));
    };
    let (x, out) = (&call.inputs[0], &call.outputs[0]);
    let axis = x.layout.ndim() - 1;
    let lanes = Lanes::new([&out.layout, &x.layout], axis);
    let d = lanes.len;
    let mut w = Scratch::zeroed(d)?;
    let mut b = Scratch::zeroed(if layer { d } else { 0 })?;
    // SAFETY: the weight (and bias) are checked views of d elements.
    unsafe {
        let wt = &call.inputs[1];
        gather(Ptr::<T>::of(wt).0, wt.layout.strides()[0], &mut w);
        if layer {
            let bt = &call.inputs[2];
            gather(Ptr::<T>::of(bt).0, bt.layout.strides()[0], &mut b);
        }
    }
    let (po, px) = (Ptr::<T>::of(out), Ptr::<T>::of(x));
    if !layer && T::DTYPE == DType::F32 && lanes.stride == [1, 1] && d > 0 {
        let (po, px) = (Ptr::<f32>::of(out), Ptr::<f32>::of(x));
        let stream = streams(out.layout.numel() * 4);
        par_chunks(lanes.count(), d, |range| {
            for (_, [oo, ox], next) in lanes.walk(range) {
                // SAFETY: T is f32 (checked above); both rows are contiguous runs of d
                // elements inside their checked views, and the plan lets the output overlap
                // the input only as the very same view, so the rows are identical (one
                // slice) or disjoint (two).
                unsafe {
                    let o = std::slice::from_raw_parts_mut(po.at(oo), d);
                    if std::ptr::eq(po.at(oo), px.at(ox)) {
                        simd!(normalize(o, &w, &[], false, eps));
                    } else {
                        let x = std::slice::from_raw_parts(px.at(ox), d);
                        let next = next.map_or(std::ptr::null(), |[_, nx]| px.0.wrapping_add(nx));
                        simd!(rms_to(x, o, &w, eps, next, stream));
                    }
                }
            }
            if stream {
                stream_fence();
            }
        });
        return Ok(());
    }
    try_par_chunks(lanes.count(), d, |range| {
        let mut buf = Scratch::zeroed(d)?;
        for i in range {
            let [oo, ox] = lanes.offsets(i);
            // SAFETY: the rows lie in their checked views; read before write.
            unsafe { gather(px.at(ox), lanes.stride[1], &mut buf) };
            simd!(normalize(&mut buf, &w, &b, layer, eps));
            // SAFETY: as above.
            unsafe { scatter(&buf, po.at(oo), lanes.stride[0]) };
        }
        Ok(())
    })?;
    Ok(())
}

fn rms_norm<T: Float>(c: &KernelCall<'_>) -> Result<()> {
    norm::<T>(c, false)
}

fn layer_norm<T: Float>(c: &KernelCall<'_>) -> Result<()> {
    norm::<T>(c, true)
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, "rms_norm", rms_norm);
    floats!(reg, "layer_norm", layer_norm);
}
