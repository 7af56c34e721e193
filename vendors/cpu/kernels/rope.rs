//! Rotary embedding: the angles `pos · theta^(−2i/d)` are computed once per launch in f64
//! (a `seq × d/2` table of cos/sin), then every (position, head) row rotates in f32.

use super::util::{floats, gather, par_chunks, read_index, scatter, simd, Float, Lanes, Ptr};
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelRegistry, Params};

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
    let (mut cos, mut sin) = (vec![0f32; seq * half], vec![0f32; seq * half]);
    for s in 0..seq {
        // SAFETY: element s of the checked position view.
        let p = unsafe { read_index(pos, s * pos.layout.strides()[0]) } as f64;
        for i in 0..half {
            let angle = p * theta.powf(-2.0 * i as f64 / d as f64);
            cos[s * half + i] = angle.cos() as f32;
            sin[s * half + i] = angle.sin() as f32;
        }
    }
    let lanes = Lanes::new([&out.layout, &x.layout], nd - 1);
    let (po, px) = (Ptr::<T>::of(out), Ptr::<T>::of(x));
    par_chunks(lanes.count(), d, |range| {
        let mut buf = vec![0f32; d];
        for l in range {
            let s = (l / heads) % seq;
            let [oo, ox] = lanes.offsets(l);
            // SAFETY: row l of both checked views; read whole before writing.
            unsafe { gather(px.at(ox), lanes.stride[1], &mut buf) };
            let (c, sn) = (
                &cos[s * half..(s + 1) * half],
                &sin[s * half..(s + 1) * half],
            );
            simd!(rotate(&mut buf, c, sn, interleaved));
            // SAFETY: as above.
            unsafe { scatter(&buf, po.at(oo), lanes.stride[0]) };
        }
    });
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, "rope", rope);
}
