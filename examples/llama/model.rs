//! A small Llama-style decoder with seeded random weights, written once on the eager Tensor
//! API and run two ways: eagerly, and recorded into an operator graph that is planned once
//! and replayed (`examples/llama_block.rs`, the CLI's main job and `unirt bench graph` share
//! this file).
//!
//! One decode step: embedding → per layer (rms_norm, fused QKV matmul, rope, grouped-query
//! attention over a KV cache, output projection, residual, rms_norm, SwiGLU MLP, residual) →
//! final norm → LM head → argmax → the token back to the host. The KV cache has a fixed
//! length: the new key/value row is written with `where` under a one-hot position mask, and
//! attention masks the positions not written yet, so every step has the same shapes and the
//! same addresses — what a captured replay needs. The host step reads the argmax and writes
//! the next step's token, position and masks (a data-dependent host step: the one part a
//! replay runs eagerly).

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use unirt::ops::elementwise::where_;
use unirt::tensor::{DType, Tensor};
use unirt::{Device, Result};

/// The model's sizes.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    pub max_seq: usize,
}

impl Config {
    /// hidden 256, 2 layers, 8 query / 2 key-value heads of 32.
    pub const TINY: Config = Config {
        vocab: 512,
        hidden: 256,
        layers: 2,
        heads: 8,
        kv_heads: 2,
        ffn: 512,
        max_seq: 64,
    };

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

/// Every (operator, dtype) the decode step launches: a device must register them all.
pub const KERNELS: &[(&str, DType)] = &[
    ("embedding", DType::F32),
    ("rms_norm", DType::F32),
    ("matmul", DType::F32),
    ("rope", DType::F32),
    ("where", DType::F32),
    ("mul_scalar", DType::F32),
    ("masked_fill", DType::F32),
    ("softmax", DType::F32),
    ("rearrange", DType::F32),
    ("add", DType::F32),
    ("swiglu", DType::F32),
    ("argmax", DType::F32),
    ("rearrange", DType::I64),
    ("rearrange", DType::U8),
];

/// The kernels `device` lacks for the decode step (empty: it can run it).
pub fn missing_kernels(device: Device) -> Vec<String> {
    KERNELS
        .iter()
        .filter(|(op, dt)| !unirt::ops::is_registered(op, device.kind, *dt))
        .map(|(op, dt)| format!("{op}/{dt}"))
        .collect()
}

struct Layer {
    norm1: Tensor,
    wqkv: Tensor,
    wo: Tensor,
    norm2: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
}

/// The weights (seeded: the same values on every device).
pub struct Weights {
    pub cfg: Config,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Tensor,
}

impl Weights {
    pub fn new(cfg: Config, seed: u64, device: Device) -> Result<Weights> {
        let mut s = seed;
        let mut w = |shape: &[usize], fan_in: usize| {
            s += 1;
            let std = 1.0 / (fan_in as f64).sqrt();
            Tensor::rand_normal(shape, 0.0, std, s, DType::F32, device)
        };
        let (h, d) = (cfg.hidden, cfg.head_dim());
        let qkv = (cfg.heads + 2 * cfg.kv_heads) * d;
        let mut layers = Vec::new();
        for _ in 0..cfg.layers {
            layers.push(Layer {
                norm1: Tensor::ones(&[h], DType::F32, device)?,
                wqkv: w(&[h, qkv], h)?,
                wo: w(&[cfg.heads * d, h], h)?,
                norm2: Tensor::ones(&[h], DType::F32, device)?,
                w_gate_up: w(&[h, 2 * cfg.ffn], h)?,
                w_down: w(&[cfg.ffn, h], cfg.ffn)?,
            });
        }
        Ok(Weights {
            embed: w(&[cfg.vocab, h], 1)?,
            layers,
            norm: Tensor::ones(&[h], DType::F32, device)?,
            lm_head: w(&[h, cfg.vocab], h)?,
            cfg,
        })
    }
}

/// What a generation keeps between steps: the KV caches, the next step's token, position and
/// masks (device tensors the host step rewrites), and the tokens generated so far.
pub struct State {
    pub k_cache: Vec<Tensor>,
    pub v_cache: Vec<Tensor>,
    /// `[1]` i64: the token fed to the next step.
    pub token: Tensor,
    /// `[1]` i64: its position.
    pub pos: Tensor,
    /// `[max_seq]` u8: 1 where attention must not look (positions after `pos`).
    pub hide: Tensor,
    /// `[1, max_seq, 1]` u8: 1 at `pos` (where the new key and value are written).
    pub write: Tensor,
    /// Tokens the host step has read back, in order.
    pub generated: Arc<Mutex<Vec<i64>>>,
}

impl State {
    pub fn new(cfg: &Config, first_token: i64, device: Device) -> Result<State> {
        let d = cfg.head_dim();
        let cache = || Tensor::zeros(&[cfg.kv_heads, cfg.max_seq, d], DType::F32, device);
        let s = State {
            k_cache: (0..cfg.layers).map(|_| cache()).collect::<Result<_>>()?,
            v_cache: (0..cfg.layers).map(|_| cache()).collect::<Result<_>>()?,
            token: Tensor::from_slice(&[first_token], &[1], device)?,
            pos: Tensor::from_slice(&[0i64], &[1], device)?,
            hide: Tensor::zeros(&[cfg.max_seq], DType::U8, device)?,
            write: Tensor::zeros(&[1, cfg.max_seq, 1], DType::U8, device)?,
            generated: Arc::new(Mutex::new(Vec::new())),
        };
        write_position(cfg.max_seq, 0, &s.hide, &s.write)?;
        Ok(s)
    }
}

/// Sets the masks for position `pos`.
fn write_position(max_seq: usize, pos: usize, hide: &Tensor, write: &Tensor) -> Result<()> {
    let hv: Vec<u8> = (0..max_seq).map(|i| u8::from(i > pos)).collect();
    let wv: Vec<u8> = (0..max_seq).map(|i| u8::from(i == pos)).collect();
    hide.copy_from_slice(&hv)?;
    write.copy_from_slice(&wv)
}

/// `cache[:, pos, :] = new` in place: `where(write, new, cache)` into the cache itself.
fn update_cache(cache: &Tensor, new: &Tensor, write: &Tensor) -> Result<()> {
    let plan = where_(&write.desc(), &new.desc(), &cache.desc())?;
    plan.launch(&[write, new, cache], &[cache], None, cache.stream()?)
}

/// One decode step; returns the logits `[1, vocab]`. Eagerly it runs now; while the thread
/// records a graph on the device it is recorded.
pub fn decode_step(w: &Weights, st: &State) -> Result<Tensor> {
    let (logits, next) = decode_step_device(w, st)?;
    host_step(w.cfg, st, &next)?;
    Ok(logits)
}

/// The device part of [`decode_step`]: the logits and their argmax (`[1]` i64), with the
/// token, position and masks left as they are (replayed, it runs the same step again — what
/// a CUDA-graph replay of a framework's step times, with the token read back outside it).
pub fn decode_step_device(w: &Weights, st: &State) -> Result<(Tensor, Tensor)> {
    let cfg = w.cfg;
    let (d, hq, hkv) = (cfg.head_dim(), cfg.heads, cfg.kv_heads);
    let group = hq / hkv;
    let eps = 1e-5;
    let mut x = w.embed.embedding(&st.token)?; // [1, hidden]
    for (l, layer) in w.layers.iter().enumerate() {
        let h = x.rms_norm(&layer.norm1, eps)?;
        let qkv = h.matmul(&layer.wqkv)?; // [1, (hq + 2 hkv)·d]
        let q = qkv.narrow(1, 0, hq * d)?.reshape(&[1, hq, d])?;
        let k = qkv.narrow(1, hq * d, hkv * d)?.reshape(&[1, hkv, d])?;
        let v = qkv
            .narrow(1, (hq + hkv) * d, hkv * d)?
            .reshape(&[1, hkv, d])?;
        let q = q.rope(&st.pos, 10000.0, false)?;
        let k = k.rope(&st.pos, 10000.0, false)?;
        update_cache(&st.k_cache[l], &k.transpose(0, 1)?, &st.write)?;
        update_cache(&st.v_cache[l], &v.transpose(0, 1)?, &st.write)?;
        // Grouped-query attention: the `group` query heads of a kv head are the rows of one
        // matmul against that head's cache.
        let q = q.reshape(&[hkv, group, d])?;
        let scores = q
            .matmul(&st.k_cache[l].transpose(1, 2)?)?
            .mul_scalar(1.0 / (d as f64).sqrt())?
            .masked_fill(&st.hide, -1e9)?;
        let attn = scores.softmax(-1)?.matmul(&st.v_cache[l])?; // [hkv, group, d]
        x = x.add(&attn.reshape(&[1, hq * d])?.matmul(&layer.wo)?)?;
        let h = x.rms_norm(&layer.norm2, eps)?;
        let gu = h.matmul(&layer.w_gate_up)?; // [1, 2·ffn]
        let act = gu
            .narrow(1, cfg.ffn, cfg.ffn)?
            .swiglu(&gu.narrow(1, 0, cfg.ffn)?)?;
        x = x.add(&act.matmul(&layer.w_down)?)?;
    }
    let logits = x.rms_norm(&w.norm, eps)?.matmul(&w.lm_head)?;
    let next = logits.argmax(-1, false)?; // [1] i64
    Ok((logits, next))
}

/// The argmax to the host, then the next step's inputs: a data-dependent host step.
fn host_step(cfg: Config, st: &State, next: &Tensor) -> Result<()> {
    let max_seq = cfg.max_seq;
    let generated = st.generated.clone();
    unirt::graph::host_op(
        "argmax_to_host",
        &[next, &st.token, &st.pos, &st.hide, &st.write],
        Arc::new(move |t: &[Tensor]| {
            let tok = t[0].to_vec::<i64>()?[0];
            let pos = t[2].to_vec::<i64>()?[0] + 1;
            if let Ok(mut g) = generated.lock() {
                g.push(tok);
            }
            t[1].copy_from_slice(&[tok])?;
            t[2].copy_from_slice(&[pos])?;
            // Past the cache's end the position wraps (the demo generates a few tokens).
            write_position(max_seq, pos as usize % max_seq, &t[3], &t[4])
        }),
    )
}

/// A recorded decode step: the graph and its logits tensor.
pub fn record_step(w: &Weights, st: &State) -> Result<(unirt::Graph, Tensor)> {
    let (g, logits) = unirt::graph::record(st.token.device(), || decode_step(w, st))?;
    mark_step(g, st, logits)
}

/// A recorded [`decode_step_device`] (no host step: every replay computes the same token).
pub fn record_step_device(w: &Weights, st: &State) -> Result<(unirt::Graph, Tensor)> {
    let (g, (logits, next)) =
        unirt::graph::record(st.token.device(), || decode_step_device(w, st))?;
    let (mut g, logits) = mark_step(g, st, logits)?;
    g.mark_output("next", &next)?;
    Ok((g, logits))
}

fn mark_step(mut g: unirt::Graph, st: &State, logits: Tensor) -> Result<(unirt::Graph, Tensor)> {
    g.mark_output("logits", &logits)?;
    for (name, t) in [
        ("token", &st.token),
        ("pos", &st.pos),
        ("hide", &st.hide),
        ("write", &st.write),
    ] {
        g.mark_input(name, t)?;
    }
    Ok((g, logits))
}

/// What one device did: per-step logits and tokens (eager and replayed) and throughput.
pub struct DeviceRun {
    pub device: Device,
    pub logits: Vec<Vec<f32>>,
    pub tokens: Vec<i64>,
    /// Whether every replayed step's logits were bitwise the eager step's, and the tokens
    /// the same.
    pub replay_bitwise_equal: bool,
    pub eager_tokens_per_s: f64,
    pub replay_tokens_per_s: f64,
    /// (captured, eager) segments of the exec.
    pub segments: (usize, usize),
    pub arena_bytes: usize,
    pub naive_bytes: usize,
}

fn logits_of(t: &Tensor) -> Result<Vec<f32>> {
    t.to_vec::<f32>()
}

/// Generates `steps` tokens on `device` eagerly and by replay, checks them against each
/// other, then times `timed` steps of each.
pub fn run_device(device: Device, cfg: Config, steps: usize, timed: usize) -> Result<DeviceRun> {
    let w = Weights::new(cfg, 42, device)?;
    // Eager.
    let st = State::new(&cfg, 1, device)?;
    let mut eager = Vec::with_capacity(steps);
    for _ in 0..steps {
        eager.push(logits_of(&decode_step(&w, &st)?)?);
    }
    let eager_tokens = st.generated.lock().map(|g| g.clone()).unwrap_or_default();
    // Recorded once, planned once, replayed (no warm-up: a warm-up would run the host step
    // and advance the generation).
    let st = State::new(&cfg, 1, device)?;
    let (g, _) = record_step(&w, &st)?;
    let plan = g.plan()?;
    let exec = plan.instantiate_with(unirt::graph::ExecOptions {
        warmups: 0,
        capture: true,
        ..Default::default()
    })?;
    let mut replayed = Vec::with_capacity(steps);
    for _ in 0..steps {
        exec.replay()?;
        replayed.push(logits_of(exec.output("logits")?)?);
    }
    let replay_tokens = st.generated.lock().map(|g| g.clone()).unwrap_or_default();
    let bitwise = eager.len() == replayed.len()
        && eager
            .iter()
            .zip(&replayed)
            .all(|(a, b)| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()))
        && eager_tokens == replay_tokens;
    // Throughput, each on a fresh generation.
    let sync = |t: &Tensor| t.synchronize();
    let st = State::new(&cfg, 1, device)?;
    let t0 = std::time::Instant::now();
    for _ in 0..timed {
        decode_step(&w, &st)?;
    }
    sync(&st.token)?;
    let eager_s = t0.elapsed().as_secs_f64();
    let st2 = State::new(&cfg, 1, device)?;
    let (g2, _) = record_step(&w, &st2)?;
    let exec2 = g2.plan()?.instantiate_with(unirt::graph::ExecOptions {
        warmups: 0,
        capture: true,
        ..Default::default()
    })?;
    let t0 = std::time::Instant::now();
    for _ in 0..timed {
        exec2.replay()?;
    }
    exec2.synchronize()?;
    let replay_s = t0.elapsed().as_secs_f64();
    Ok(DeviceRun {
        device,
        logits: eager,
        tokens: eager_tokens,
        replay_bitwise_equal: bitwise,
        eager_tokens_per_s: timed as f64 / eager_s.max(1e-9),
        replay_tokens_per_s: timed as f64 / replay_s.max(1e-9),
        segments: exec.segment_counts(),
        arena_bytes: plan.memory().arena_bytes,
        naive_bytes: plan.memory().naive_bytes,
    })
}

/// Checks that `b` agrees with the reference `a`: logits within `tol` (absolute), and the same
/// token wherever the reference's top-two margin exceeds `tol`. Stops at the first token the
/// two may legitimately choose differently (a near-tie); returns how many steps were compared.
pub fn agree(a: &DeviceRun, b: &DeviceRun, tol: f32) -> std::result::Result<usize, String> {
    let mut compared = 0;
    for (i, (la, lb)) in a.logits.iter().zip(&b.logits).enumerate() {
        let diff = la
            .iter()
            .zip(lb)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        if diff > tol {
            return Err(format!(
                "step {i}: logits of {} and {} differ by {diff}",
                a.device, b.device
            ));
        }
        compared += 1;
        let mut sorted = la.clone();
        sorted.sort_by(|x, y| y.total_cmp(x));
        let margin = sorted[0] - sorted.get(1).copied().unwrap_or(f32::NEG_INFINITY);
        match (a.tokens.get(i), b.tokens.get(i)) {
            (Some(ta), Some(tb)) if ta != tb => {
                if margin > tol {
                    return Err(format!(
                        "step {i}: {} chose {ta}, {} chose {tb} with a margin of {margin}",
                        a.device, b.device
                    ));
                }
                break;
            }
            _ => {}
        }
    }
    Ok(compared)
}
