//! random_sample over the last dimension (see `ops::sample` for the rule), one row per item.

use super::util::{check_per_thread, floats, gather, try_par_chunks, Float, Lanes, Ptr, Scratch};
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

/// The `k` smallest [`order_key`]s of a row (its `k` best logits), in no particular order,
/// in one pass: candidates collect in a buffer of `4k` (at least 2048); when it fills, a
/// selection keeps the best `k` and the worst of them becomes the floor, and a logit below
/// the floor is skipped after one float comparison, without computing its key. Random rows
/// skip nearly every logit (1 × 128 256, top-k 50: 0.09 ms against 0.26 for a selection over
/// all keys). An ascending row (each logit a new best) would compact every `3k` logits:
/// after four compactions the rest of the row's keys are taken whole for one selection, as
/// the plain selection over all keys does.
fn best_keys(logits: &[f32], k: usize) -> Vec<u64> {
    let cap = (4 * k).max(2048);
    let mut kept: Vec<u64> = Vec::with_capacity(cap);
    // Nothing is below the first floor; NaN (fewer than k numbers kept) skips nothing either.
    let mut floor = f32::NEG_INFINITY;
    let mut compactions = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v < floor {
            continue;
        }
        kept.push(order_key(v, i));
        if kept.len() == cap {
            if compactions == 4 {
                // The floor keeps rising (ascending logits): the rest's keys all go in,
                // in one vectorised pass, for one selection.
                let rest = logits[i + 1..].iter().enumerate();
                kept.extend(rest.map(|(j, &v)| order_key(v, i + 1 + j)));
                break;
            }
            compactions += 1;
            keep_smallest(&mut kept, k);
            floor = logits[key_index(kept[k - 1])];
        }
    }
    keep_smallest(&mut kept, k);
    kept
}

/// Keeps the `k` smallest keys of `keys` (in no particular order, the largest of them last).
fn keep_smallest(keys: &mut Vec<u64>, k: usize) {
    if keys.len() > k {
        keys.select_nth_unstable(k - 1);
        keys.truncate(k);
    }
}

/// The logit index an [`order_key`] holds.
fn key_index(key: u64) -> usize {
    (key & 0xffff_ffff) as usize
}

/// The weight of logit `x` in a row of maximum `max` (see `ops::sample`): NaN 0, the maximum
/// 1 (+∞ and −∞ included), one infinitely below it 0 at every temperature, else
/// exp((x − max) / T).
fn weight(x: f64, max: f64, temperature: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else if x == max {
        1.0
    } else if x - max == f64::NEG_INFINITY {
        0.0
    } else {
        ((x - max) / temperature).exp()
    }
}

/// The index picked from one row of logits (at most 2^32 of them: the key holds the index in
/// 32 bits, and `random_sample` refuses longer rows). NaN logits rank last and weigh nothing.
fn pick(logits: &[f32], random: f64, temperature: f64, top_k: usize, top_p: f64) -> usize {
    // The first maximum, NaN ranking last (0 when every logit is NaN).
    let first_max = |v: &[f32]| {
        let mut at = 0;
        for (i, &x) in v.iter().enumerate() {
            if x > v[at] || (v[at].is_nan() && !x.is_nan()) {
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
    let mut order: Vec<u64> = if k * 16 <= n {
        best_keys(logits, k)
    } else {
        let mut all: Vec<u64> = logits
            .iter()
            .enumerate()
            .map(|(i, &v)| order_key(v, i))
            .collect();
        keep_smallest(&mut all, k);
        all
    };
    order.sort_unstable();
    let max = logits[key_index(order[0])] as f64;
    let mut cum = Vec::with_capacity(k);
    let mut total = 0f64;
    for &key in &order {
        total += weight(logits[key_index(key)] as f64, max, temperature);
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
    key_index(order[at])
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
    // The row as f32, and `pick`'s keys (8 bytes a logit at most) and cumulative weights.
    let per_logit = if temperature == 0.0 || top_k == 1 {
        4
    } else {
        20
    };
    check_per_thread("random_sample", lanes.len.saturating_mul(per_logit))?;
    try_par_chunks(lanes.count(), lanes.len * 8, |range| {
        let mut buf = Scratch::zeroed(lanes.len)?;
        for i in range {
            let [ox] = lanes.offsets(i);
            // SAFETY: row i of the checked input; element i of the contiguous output.
            unsafe {
                gather(px.at(ox), lanes.stride[0], &mut buf);
                *po.at(i) = pick(&buf, random, temperature, top_k, top_p) as i64;
            }
        }
        Ok(())
    })?;
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, "random_sample", random_sample);
}
