//! softmax, log_softmax and causal softmax, one lane at a time through an f32 buffer.

use super::util::{floats, gather, par_chunks, scatter, Float, Lanes, Ptr};
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelRegistry, Params};

/// softmax of `v[..visible]` in place (log-softmax when `log`); `v[visible..]` become 0
/// (masked keys of a causal row).
fn softmax_lane(v: &mut [f32], visible: usize, log: bool) {
    let (seen, masked) = v.split_at_mut(visible.min(v.len()));
    masked
        .iter_mut()
        .for_each(|x| *x = if log { f32::NEG_INFINITY } else { 0.0 });
    if seen.is_empty() {
        return;
    }
    let max = seen.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if log {
        let sum: f32 = seen.iter().map(|&x| (x - max).exp()).sum();
        let lse = max + sum.ln();
        seen.iter_mut().for_each(|x| *x -= lse);
    } else {
        let mut sum = 0f32;
        for x in seen.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        let inv = 1.0 / sum;
        seen.iter_mut().for_each(|x| *x *= inv);
    }
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
    par_chunks(lanes.count(), lanes.len, |range| {
        let mut buf = vec![0f32; lanes.len];
        for i in range {
            let [oo, ox] = lanes.offsets(i);
            let visible = match causal {
                Some(offset) => (i % q_len) + offset + 1,
                None => lanes.len,
            };
            // SAFETY: both lanes lie in their checked views; the input lane is read whole
            // before the output lane (possibly the same elements) is written.
            unsafe {
                gather(px.at(ox), lanes.stride[1], &mut buf);
                softmax_lane(&mut buf, visible, log);
                scatter(&buf, po.at(oo), lanes.stride[0]);
            }
        }
    });
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, "softmax", softmax);
    floats!(reg, "log_softmax", softmax);
    floats!(reg, "causal_softmax", softmax);
}
