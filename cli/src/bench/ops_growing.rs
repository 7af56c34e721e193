//! The `decode_growing_cache` row of `unirt bench ops`: eager decode attention over a KV cache
//! that grows by one key per step (appended with `concat`, as an eager generation loop keeps
//! it), so every step is a new shape and a new plan. It measures what a kernel specialised
//! per shape costs such a loop: on the software adapters a flat texture's width once followed
//! the exact size, and each step compiled a new attention kernel.

use std::time::Instant;

use unirt::tensor::{DType, Tensor};
use unirt::Device;

use crate::CliResult;

/// Heads and head dim of the row (a small model's, so the row times planning more than math).
const HEADS: usize = 8;
const DIM: usize = 64;
/// Keys in the cache before the first timed step: past the software adapters' texture
/// threshold (16 Ki elements of K).
const FIRST: usize = 512;

/// Milliseconds per step over `steps` steps, and the row's shape.
pub(super) fn decode_growing_cache(dev: Device, steps: usize) -> CliResult<(f64, String)> {
    let r = |shape: &[usize], seed| Tensor::rand_uniform(shape, -1.0, 1.0, seed, DType::F32, dev);
    let q = r(&[1, HEADS, 1, DIM], 1)?;
    let mut k = r(&[1, HEADS, FIRST, DIM], 2)?;
    let mut v = r(&[1, HEADS, FIRST, DIM], 3)?;
    let (k_new, v_new) = (r(&[1, HEADS, 1, DIM], 4)?, r(&[1, HEADS, 1, DIM], 5)?);
    // One step untimed: the kernels every step shares (concat's, attention's plain forms).
    let step = |k: &mut Tensor, v: &mut Tensor| -> CliResult<Tensor> {
        *k = Tensor::concat(&[&*k, &k_new], 2)?;
        *v = Tensor::concat(&[&*v, &v_new], 2)?;
        Ok(q.attention(k, v, false)?)
    };
    step(&mut k, &mut v)?.to_vec::<f32>()?;
    let t = Instant::now();
    let mut out = None;
    for _ in 0..steps {
        out = Some(step(&mut k, &mut v)?);
    }
    if let Some(o) = out {
        o.to_vec::<f32>()?;
    }
    let ms = t.elapsed().as_secs_f64() * 1e3 / steps.max(1) as f64;
    let shape = format!("1x{HEADS}x{}..{}x{DIM}", FIRST + 2, FIRST + 1 + steps);
    Ok((ms, shape))
}
