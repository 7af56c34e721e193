//! Rotary embedding: the angles `pos · theta^(−2i/d)` are computed in f64 (cos/sin of one
//! position at a time, shared by its heads), then every (position, head) row rotates in f32;
//! contiguous f32 rows are read and written in place, others go through a buffer.

use super::util::{floats, gather, par_chunks, read_index, scatter, simd, Float, Lanes, Ptr};
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelRegistry, Params};
use crate::tensor::DType;

/// Rotates the pairs of one row by the angles whose cosines and sines are `c` and `sn`.
#[inline(always)]
fn rotate(buf: &mut [f32], c: &[f32], sn: &[f32], interleaved: bool) {
    if interleaved {
        for ((p, &c), &sn) in buf.chunks_exact_mut(2).zip(c).zip(sn) {
            let (x0, x1) = (p[0], p[1]);
            p[0] = x0 * c - x1 * sn;
            p[1] = x0 * sn + x1 * c;
        }
    } else {
        let (lo, hi) = buf.split_at_mut(c.len());
        for (((x0, x1), &c), &sn) in lo.iter_mut().zip(hi.iter_mut()).zip(c).zip(sn) {
            let (a, b) = (*x0, *x1);
            *x0 = a * c - b * sn;
            *x1 = a * sn + b * c;
        }
    }
}

/// As [`rotate`], reading the row from `x` and writing it to `o` (distinct, same length).
#[inline(always)]
fn rotate_to(x: &[f32], o: &mut [f32], c: &[f32], sn: &[f32], interleaved: bool) {
    let h = c.len();
    if interleaved {
        for (((p, q), &c), &sn) in x.chunks_exact(2).zip(o.chunks_exact_mut(2)).zip(c).zip(sn) {
            let (x0, x1) = (p[0], p[1]);
            q[0] = x0 * c - x1 * sn;
            q[1] = x0 * sn + x1 * c;
        }
    } else {
        let ((xl, xh), (ol, oh)) = (x.split_at(h), o.split_at_mut(h));
        for ((((a, b), (y0, y1)), &c), &sn) in
            xl.iter().zip(xh).zip(ol.iter_mut().zip(oh)).zip(c).zip(sn)
        {
            *y0 = a * c - b * sn;
            *y1 = a * sn + b * c;
        }
    }
    // An odd last element has no partner and stays as it is.
    o[2 * h..].copy_from_slice(&x[2 * h..]);
}

fn rope<T: Float>(call: &KernelCall<'_>) -> Result<()> {
    let Params::Rope { interleaved, theta } = *call.params else {
        return Err(Error::Internal(format!(
            "rope: parameters {:?}",
            call.params
        )));
    };
    let (x, pos, out) = (&call.inputs[0], &call.inputs[1], &call.outputs[0]);
    let nd = x.layout.ndim();
    let (seq, heads, d) = (
        x.layout.shape()[nd - 3],
        x.layout.shape()[nd - 2],
        x.layout.shape()[nd - 1],
    );
    let half = d / 2;
    // theta^(-2i/d) once per launch; each task computes a position's cos/sin (in f64) when
    // its rows reach that position, so the angles are computed in parallel and the heads of
    // one position share them.
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| theta.powf(-2.0 * i as f64 / d as f64))
        .collect();
    let pos_stride = pos.layout.strides().first().copied().unwrap_or(0);
    let lanes = Lanes::new([&out.layout, &x.layout], nd - 1);
    let in_place_f32 = T::DTYPE == DType::F32 && lanes.stride == [1, 1] && d > 0;
    let (po, px) = (Ptr::<T>::of(out), Ptr::<T>::of(x));
    par_chunks(lanes.count(), d, |range| {
        let (mut c, mut sn) = (vec![0f32; half], vec![0f32; half]);
        let mut buf = vec![0f32; if in_place_f32 { 0 } else { d }];
        let mut angles_of = usize::MAX;
        for l in range {
            let s = (l / heads) % seq;
            if s != angles_of {
                // SAFETY: element s of the checked position view.
                let p = unsafe { read_index(pos, s * pos_stride) } as f64;
                for ((c, sn), &f) in c.iter_mut().zip(sn.iter_mut()).zip(&inv_freq) {
                    let (si, co) = (p * f).sin_cos();
                    (*c, *sn) = (co as f32, si as f32);
                }
                angles_of = s;
            }
            let [oo, ox] = lanes.offsets(l);
            if in_place_f32 {
                // SAFETY: T is f32 (checked above); row l of both checked views is a
                // contiguous run of d elements; the plan lets the output overlap the input
                // only as the very same view, so the rows are identical (one slice) or
                // disjoint (two).
                unsafe {
                    let (o, xr) = (po.at(oo) as *mut f32, px.at(ox) as *const f32);
                    let orow = std::slice::from_raw_parts_mut(o, d);
                    if std::ptr::eq(o, xr) {
                        simd!(rotate(orow, &c, &sn, interleaved));
                    } else {
                        let xrow = std::slice::from_raw_parts(xr, d);
                        simd!(rotate_to(xrow, orow, &c, &sn, interleaved));
                    }
                }
                continue;
            }
            // SAFETY: row l of both checked views; read whole before writing.
            unsafe { gather(px.at(ox), lanes.stride[1], &mut buf) };
            simd!(rotate(&mut buf, &c, &sn, interleaved));
            // SAFETY: as above.
            unsafe { scatter(&buf, po.at(oo), lanes.stride[0]) };
        }
    });
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, "rope", rope);
}
