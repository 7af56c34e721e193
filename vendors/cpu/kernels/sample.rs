//! random_sample over the last dimension (see `ops::sample` for the rule), one row per item.

use super::util::{floats, gather, par_chunks, Float, Lanes, Ptr};
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelRegistry, Params};

/// A logit's place in the order with its index, as one integer: a larger logit first, equal
/// logits by index; −0 and +0 alike, NaN last. Sorting these integers sorts the candidates
/// (sampling 1 × 32 000 logits took 2.7–3.2× less time than with indices sorted by a float
/// comparator; docs/BENCHMARKS.md, thirteenth session).
fn order_key(v: f32, i: usize) -> u64 {
    let key = if v.is_nan() {
        u32::MAX
    } else {
        let b = if v == 0.0 { 0 } else { v.to_bits() };
        !(if b & 0x8000_0000 != 0 {
            !b
        } else {
            b | 0x8000_0000
        })
    };
    (u64::from(key) << 32) | i as u64
}

/// The index picked from one row of logits (at most 2^32 of them: the key holds the index in
/// 32 bits, and `random_sample` refuses longer rows). NaN logits rank last and weigh nothing.
fn pick(logits: &[f32], random: f64, temperature: f64, top_k: usize, top_p: f64) -> usize {
    let first_max = |v: &[f32]| {
        let mut at = 0;
        for (i, &x) in v.iter().enumerate() {
            if x > v[at] {
                at = i;
            }
        }
        at
    };
    if temperature == 0.0 || top_k == 1 {
        return first_max(logits);
    }
    let n = logits.len();
    let k = if top_k == 0 { n } else { top_k.min(n) };
    let mut order: Vec<u64> = logits
        .iter()
        .enumerate()
        .map(|(i, &v)| order_key(v, i))
        .collect();
    if k < n {
        order.select_nth_unstable(k - 1);
        order.truncate(k);
    }
    order.sort_unstable();
    let index = |key: u64| (key & 0xffff_ffff) as usize;
    let max = logits[index(order[0])] as f64;
    let mut cum = Vec::with_capacity(k);
    let mut total = 0f64;
    for &key in &order {
        let x = logits[index(key)] as f64;
        if !x.is_nan() {
            total += ((x - max) / temperature).exp();
        }
        cum.push(total);
    }
    let keep = cum
        .iter()
        .position(|&c| c >= top_p * total)
        .map_or(k, |p| p + 1);
    let threshold = random * cum[keep - 1];
    let at = cum[..keep]
        .iter()
        .position(|&c| c > threshold)
        .unwrap_or(keep - 1);
    index(order[at])
}

fn random_sample<T: Float>(call: &KernelCall<'_>) -> Result<()> {
    let Params::Sample {
        random,
        temperature,
        top_k,
        top_p,
    } = *call.params
    else {
        return Err(Error::Internal(format!(
            "random_sample: parameters {:?}",
            call.params
        )));
    };
    let (x, out) = (&call.inputs[0], &call.outputs[0]);
    let lanes = Lanes::new([&x.layout], x.layout.ndim() - 1);
    let (px, po) = (Ptr::<T>::of(x), Ptr::<i64>::of(out));
    par_chunks(lanes.count(), lanes.len * 8, |range| {
        let mut buf = vec![0f32; lanes.len];
        for i in range {
            let [ox] = lanes.offsets(i);
            // SAFETY: row i of the checked input; element i of the contiguous output.
            unsafe {
                gather(px.at(ox), lanes.stride[0], &mut buf);
                *po.at(i) = pick(&buf, random, temperature, top_k, top_p) as i64;
            }
        }
    });
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, "random_sample", random_sample);
}
