//! Scaled dot-product attention, one (batch, query head, query) row per work item: scores
//! against the visible keys, softmax, weighted sum of values, all in f32. Keys and values are
//! read row by row (contiguous f32 rows in place, others converted through a buffer), so
//! decode (one query over a long cache) streams K and V once per head at memory speed.

use super::util::{
    axpy, check_per_thread, dot, exp_nonpositive_f32, floats, gather, max_f32, scatter, simd,
    sum_f32, try_par_chunks, Float, Ptr, Scratch,
};
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelRegistry, Params};
use crate::tensor::DType;

/// `s ← exp(s − max s)`; returns the sum.
#[inline(always)]
fn exp_normalised(s: &mut [f32]) -> f32 {
    let max = max_f32(s);
    s.iter_mut()
        .for_each(|x| *x = exp_nonpositive_f32(*x - max));
    sum_f32(s)
}

fn attention<T: Float>(call: &KernelCall<'_>) -> Result<()> {
    let Params::Attention { scale, causal } = *call.params else {
        return Err(Error::Internal(format!(
            "attention: parameters {:?}",
            call.params
        )));
    };
    let (q, k, v, o) = (
        &call.inputs[0],
        &call.inputs[1],
        &call.inputs[2],
        &call.outputs[0],
    );
    let [b, hq, lq, d]: [usize; 4] = q
        .layout
        .shape()
        .try_into()
        .map_err(|_| Error::Internal("attention: q is not 4-D".into()))?;
    let (hkv, lkv) = (k.layout.shape()[1], k.layout.shape()[2]);
    let group = hq / hkv;
    let (qs, ks, vs, os) = (
        q.layout.strides(),
        k.layout.strides(),
        v.layout.strides(),
        o.layout.strides(),
    );
    let (pq, pk, pv, po) = (
        Ptr::<T>::of(q),
        Ptr::<T>::of(k),
        Ptr::<T>::of(v),
        Ptr::<T>::of(o),
    );
    let scale = scale as f32;
    let rows = b * hq * lq;
    let k_direct = T::DTYPE == DType::F32 && ks[3] == 1;
    let v_direct = T::DTYPE == DType::F32 && vs[3] == 1;
    // A row's scores over every key (k and v may be broadcast views of any length).
    let scratch = lkv.checked_add(3 * d).and_then(|f| f.checked_mul(4));
    check_per_thread("attention", scratch.unwrap_or(usize::MAX))?;
    try_par_chunks(rows, lkv * d * 2, |range| {
        let (mut qrow, mut krow, mut acc) = (
            Scratch::zeroed(d)?,
            Scratch::zeroed(d)?,
            Scratch::zeroed(d)?,
        );
        let mut scores = Scratch::zeroed(lkv)?;
        for r in range {
            let (bi, h, i) = (r / (hq * lq), (r / lq) % hq, r % lq);
            let kh = h / group;
            let visible = if causal {
                (i + lkv - lq + 1).min(lkv)
            } else {
                lkv
            };
            // SAFETY: every row read lies in its checked view (indices below the shapes).
            unsafe {
                gather(pq.at(bi * qs[0] + h * qs[1] + i * qs[2]), qs[3], &mut qrow);
                let kbase = bi * ks[0] + kh * ks[1];
                if k_direct {
                    // Contiguous f32 keys are read in place.
                    let (pk, ks2) = (Ptr(pk.0 as *mut f32), ks[2]);
                    simd!(for (j, s) in scores[..visible].iter_mut().enumerate() {
                        let kr = std::slice::from_raw_parts(pk.at(kbase + j * ks2), d);
                        *s = dot(&qrow, kr) * scale;
                    });
                } else {
                    for (j, s) in scores[..visible].iter_mut().enumerate() {
                        gather(pk.at(kbase + j * ks[2]), ks[3], &mut krow);
                        *s = simd!(dot(&qrow, &krow)) * scale;
                    }
                }
            }
            let seen = &mut scores[..visible];
            let sum = simd!(exp_normalised(seen));
            acc.fill(0.0);
            let vbase = bi * vs[0] + kh * vs[1];
            if v_direct {
                // Contiguous f32 values are read in place.
                let (pv, vs2) = (Ptr(pv.0 as *mut f32), vs[2]);
                simd!(for (j, &p) in seen.iter().enumerate() {
                    // SAFETY: value row j of the checked view, d contiguous f32s.
                    let vr = unsafe { std::slice::from_raw_parts(pv.at(vbase + j * vs2), d) };
                    axpy(&mut acc, p, vr);
                });
            } else {
                for (j, &p) in seen.iter().enumerate() {
                    // SAFETY: value row j of the checked view.
                    unsafe { gather(pv.at(vbase + j * vs[2]), vs[3], &mut krow) };
                    simd!(axpy(&mut acc, p, &krow));
                }
            }
            let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            acc.iter_mut().for_each(|x| *x *= inv);
            // SAFETY: output row (bi, h, i) of the checked view; no overlap with the inputs.
            unsafe { scatter(&acc, po.at(bi * os[0] + h * os[1] + i * os[2]), os[3]) };
        }
        Ok(())
    })?;
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, "attention", attention);
}
