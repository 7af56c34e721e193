//! The rows of `unirt bench ops` whose shapes change every step, as an eager generation
//! loop's do, so every step is a new shape and a new plan; they measure what a kernel
//! specialised per shape costs such a loop.
//!
//! - `decode_growing_cache`: decode attention over a KV cache that grows by one key per step
//!   (appended with `concat`). On the software adapters a flat texture's width once followed
//!   the exact size, and each step compiled a new attention kernel.
//! - `decode_f16_cache`: a preallocated f16 cache (each step's key and value written into
//!   it), read through views narrowed to the keys so far and cast to f32 for the attention.
//!   On the software adapters the strided cast's kernel held the view's extents in its code,
//!   and each step compiled one; now the structure's fourth shape on takes a shape-generic
//!   kernel (the wgpu backend's `kernels/shapes.rs`).
//! - `narrowed_add_cycling`: the steady state of such a loop, its kernels compiled: an add
//!   of views narrowed to lengths that cycle.

use std::time::Instant;

use unirt::tensor::{DType, Tensor};
use unirt::Device;

use super::ops::Row;
use crate::CliResult;

/// The rows (the decode rows `steps` steps each).
pub(super) fn rows(dev: Device, steps: usize) -> CliResult<Vec<Row>> {
    let row = |op: &str, dtype: &str, (ms, shape): (f64, String)| Row {
        op: op.into(),
        dtype: dtype.into(),
        shape,
        ms,
        gflops: None,
        gbps: None,
    };
    Ok(vec![
        row(
            "decode_growing_cache",
            "f32",
            decode_growing_cache(dev, steps)?,
        ),
        row("decode_f16_cache", "f16", decode_f16_cache(dev, steps)?),
        row("narrowed_add_cycling", "f32", narrowed_add_cycling(dev)?),
    ])
}

/// Lengths `narrowed_add_cycling` cycles through.
const CYCLE: std::ops::Range<usize> = 600..610;

/// `narrowed_add_cycling`: `a + b` over views of two `[8, 1024, 64]` caches narrowed to
/// `len` keys, `len` cycling through ten lengths — the steady state of a loop whose shapes
/// keep changing, once every kernel it needs is compiled (one pass over the lengths
/// untimed). On the software adapters it times the kernel that reads the length from the
/// plan's constants (`UNIRT_WGPU_LITERAL_SHAPES`; the wgpu backend's `kernels/shapes.rs`).
fn narrowed_add_cycling(dev: Device) -> CliResult<(f64, String)> {
    let r = |seed| Tensor::rand_uniform(&[8, 1024, 64], -1.0, 1.0, seed, DType::F32, dev);
    let (a, b) = (r(1)?, r(2)?);
    let add = |len| -> CliResult<Tensor> { Ok(a.narrow(1, 0, len)?.add(&b.narrow(1, 0, len)?)?) };
    for len in CYCLE {
        add(len)?.to_vec::<f32>()?;
    }
    // The median of five timed passes of ten rounds each (this row moves little data, so
    // one stall of the machine would show in a single pass).
    const ROUNDS: usize = 10;
    let mut passes = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let mut out = None;
        for _ in 0..ROUNDS {
            for len in CYCLE {
                out = Some(add(len)?);
            }
        }
        if let Some(o) = out {
            o.to_vec::<f32>()?;
        }
        passes.push(t.elapsed().as_secs_f64() * 1e3 / (ROUNDS * CYCLE.len()) as f64);
    }
    let ms = super::stats::median(&mut passes);
    Ok((ms, format!("8x{}..{}x64", CYCLE.start, CYCLE.end - 1)))
}

/// Heads and head dim of the row (a small model's, so the row times planning more than math).
const HEADS: usize = 8;
const DIM: usize = 64;
/// Keys in the cache before the first timed step: past the software adapters' texture
/// threshold (16 Ki elements of K).
const FIRST: usize = 512;

/// Milliseconds per step of `step(len)` over `steps` steps, `len` the keys the cache holds
/// after the step (one step untimed first: the kernels every step shares), and the row's
/// shape.
fn time_steps(
    steps: usize,
    mut step: impl FnMut(usize) -> CliResult<Tensor>,
) -> CliResult<(f64, String)> {
    step(FIRST + 1)?.to_vec::<f32>()?;
    let t = Instant::now();
    let mut out = None;
    for len in FIRST + 2..FIRST + 2 + steps {
        out = Some(step(len)?);
    }
    if let Some(o) = out {
        o.to_vec::<f32>()?;
    }
    let ms = t.elapsed().as_secs_f64() * 1e3 / steps.max(1) as f64;
    let shape = format!("1x{HEADS}x{}..{}x{DIM}", FIRST + 2, FIRST + 1 + steps);
    Ok((ms, shape))
}

/// `decode_growing_cache`: the cache grows by `concat`, a key per step.
fn decode_growing_cache(dev: Device, steps: usize) -> CliResult<(f64, String)> {
    let r = |shape: &[usize], seed| Tensor::rand_uniform(shape, -1.0, 1.0, seed, DType::F32, dev);
    let q = r(&[1, HEADS, 1, DIM], 1)?;
    let mut k = r(&[1, HEADS, FIRST, DIM], 2)?;
    let mut v = r(&[1, HEADS, FIRST, DIM], 3)?;
    let (k_new, v_new) = (r(&[1, HEADS, 1, DIM], 4)?, r(&[1, HEADS, 1, DIM], 5)?);
    time_steps(steps, |_| {
        k = Tensor::concat(&[&k, &k_new], 2)?;
        v = Tensor::concat(&[&v, &v_new], 2)?;
        Ok(q.attention(&k, &v, false)?)
    })
}

/// Keys the f16 cache holds.
const CAPACITY: usize = 1024;

/// `decode_f16_cache`: the key and value written into the preallocated cache, which is read
/// through views narrowed to `len` keys.
fn decode_f16_cache(dev: Device, steps: usize) -> CliResult<(f64, String)> {
    let r = |shape: &[usize], seed| Tensor::rand_uniform(shape, -1.0, 1.0, seed, DType::F32, dev);
    let q = r(&[1, HEADS, 1, DIM], 1)?;
    let k_cache = r(&[1, HEADS, CAPACITY, DIM], 2)?.to_dtype(DType::F16)?;
    let v_cache = r(&[1, HEADS, CAPACITY, DIM], 3)?.to_dtype(DType::F16)?;
    let (k_new, v_new) = (
        r(&[1, HEADS, 1, DIM], 4)?.to_dtype(DType::F16)?,
        r(&[1, HEADS, 1, DIM], 5)?.to_dtype(DType::F16)?,
    );
    time_steps(steps, |len| {
        k_cache.narrow(2, len - 1, 1)?.copy_from(&k_new)?;
        v_cache.narrow(2, len - 1, 1)?.copy_from(&v_new)?;
        let k = k_cache.narrow(2, 0, len)?.to_dtype(DType::F32)?;
        let v = v_cache.narrow(2, 0, len)?.to_dtype(DType::F32)?;
        Ok(q.attention(&k, &v, false)?)
    })
}
