//! `unirt bench graph --device D [--json F]`: operator graphs, eager vs replayed.
//!
//! - `tiny_ops_x100`: 100 elementwise operators on 64 floats — the eager Tensor API (plan,
//!   allocate, launch per operator) against one replay of the recorded graph, planned without
//!   fusion so every operator still runs (per-operator overhead = replay time / 100).
//! - `decode_step`: one decode step of the tiny Llama model (hidden 256, 2 layers) eager vs
//!   replayed (fused, and planned without fusion), with the planned and
//!   one-buffer-per-tensor peak of intermediate memory.
//! - `decode_step_device`: the same step without its host step (the token is not read back;
//!   every run computes the same one): the device work that a framework's CUDA-graph replay
//!   times (`ci/bench_graph_torch.py`), eager vs replayed.
//! - `elementwise_chain4_16MiB`: `relu(x·y + 0.5)·2` over 4 Mi floats (memory-bound: four
//!   passes over 16 MiB unfused, one fused), eager, replayed fused (one `fused_elementwise`
//!   pass) and replayed unfused.
//! - `matmul_bias_relu_residual`: `relu(x·w + b) + r` with x 64×256, w 256×4096 (a
//!   projection's epilogue over a 1 MiB result), eager, replayed fused (one
//!   `matmul_epilogue` kernel) and replayed unfused (matmul and three elementwise passes).
//!
//! - `planning`: a chain of 100 000 elementwise operators on 16 floats (10 000 with
//!   `--quick`) — what recording, planning (unfused and fused), instantiating and one replay
//!   cost on a long graph, beside one eager run of it (`Runtime::run`), timed once each.
//!
//! Every figure is the median of repeated timed runs, each ending with a stream sync; the
//! sides of a workload are sampled in turn, so load from other processes hits them alike, and
//! each timed run follows untimed runs of the same side (the steady state of a replay loop).
//! The two fused rows also give fused against unfused sampled back to back without that
//! untimed run ("interleaved"): on a CPU, whether an exec's output is still cached when it
//! is written decides much of a memory-bound pass's time, so both regimes are shown. And they
//! give them "batched": [`BATCH`] runs queued back to back and one sync, per run — the
//! throughput of a replay loop, without the fixed cost of one host synchronisation per run
//! (on a GPU that cost, about 7 µs, is a fifth of a fused 16 MiB pass and caps the ratio).

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use serde::Serialize;
use unirt::graph::{ExecOptions, PlanOptions};
use unirt::tensor::{DType, Tensor};
use unirt::{CapturePlan, Device, Runtime};

use super::stats::median;
use crate::llama_model::{self as model, Config};
use crate::CliResult;

#[derive(Serialize, Default)]
struct Row {
    workload: &'static str,
    eager_ms: f64,
    replay_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    per_op_replay_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    per_op_eager_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    peak_bytes_planned: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    peak_bytes_naive: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fused_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unfused_ms: Option<f64>,
    /// Fused and unfused replays sampled [`Sampling::Interleaved`] (the other columns are
    /// [`Sampling::Steady`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    fused_interleaved_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unfused_interleaved_ms: Option<f64>,
    /// Fused and unfused replays sampled [`Sampling::Batched`], per run.
    #[serde(skip_serializing_if = "Option::is_none")]
    fused_batched_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unfused_batched_ms: Option<f64>,
}

/// How a side of a workload is sampled within a round.
#[derive(Clone, Copy)]
enum Sampling {
    /// Each side runs [`STEADY_WARMUPS`] times untimed, then once timed: its own buffers are
    /// as warm as in a loop of replays (the steady state of a graph replayed many times).
    Steady,
    /// Each side runs once, timed, right after the previous side: its outputs are wherever
    /// the other side's work left them (on a CPU whose last-level cache holds one side's
    /// working set but not both, an evicted output costs a read of every line it writes).
    Interleaved,
    /// Each side runs [`STEADY_WARMUPS`] times untimed, then [`BATCH`] times queued back to
    /// back before one sync, timed; the sample is the time per run (a replay loop's
    /// throughput: the host's wait for the device is paid once per batch, not once per run).
    Batched,
}

/// Runs per timed sample in [`Sampling::Batched`].
const BATCH: usize = 10;

impl Sampling {
    /// Untimed runs (each synced) before a sample, and the runs the sample times.
    fn runs(self) -> (usize, usize) {
        match self {
            Sampling::Steady => (STEADY_WARMUPS, 1),
            Sampling::Interleaved => (0, 1),
            Sampling::Batched => (STEADY_WARMUPS, BATCH),
        }
    }
}

/// Untimed runs before each timed one in [`Sampling::Steady`]. On the 2-core Intel VM a pass
/// over 16 MiB whose buffers another pass had evicted took about twice its warm time and came
/// back to it over three to five passes (the last-level cache admits lines gradually), so one
/// untimed run was not enough.
const STEADY_WARMUPS: usize = 4;

/// Median milliseconds of each of `fs` over `reps` rounds (after one untimed round), the
/// sides sampled in turn within every round so that load from other processes hits them
/// alike. A side only queues its work; `sync` waits for it (after each run, or after each
/// batch when [`Sampling::Batched`]).
fn time_ms<const N: usize>(
    reps: usize,
    sampling: Sampling,
    sync: &dyn Fn() -> unirt::Result<()>,
    mut fs: [&mut dyn FnMut() -> unirt::Result<()>; N],
) -> unirt::Result<[f64; N]> {
    for f in fs.iter_mut() {
        f()?;
        sync()?;
    }
    let (warmups, runs) = sampling.runs();
    let mut v: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(reps));
    for _ in 0..reps {
        for (f, samples) in fs.iter_mut().zip(v.iter_mut()) {
            for _ in 0..warmups {
                f()?;
                sync()?;
            }
            let t = Instant::now();
            for _ in 0..runs {
                f()?;
            }
            sync()?;
            samples.push(t.elapsed().as_secs_f64() * 1e3 / runs as f64);
        }
    }
    Ok(v.map(|mut s| median(&mut s)))
}

fn tiny_ops(x: &Tensor) -> unirt::Result<Tensor> {
    let mut h = x.clone();
    for i in 0..100 {
        h = if i % 2 == 0 {
            h.mul_scalar(1.0001)?
        } else {
            h.add_scalar(0.5)?
        };
    }
    Ok(h)
}

fn chain4(x: &Tensor, y: &Tensor) -> unirt::Result<Tensor> {
    x.mul(y)?.add_scalar(0.5)?.relu()?.mul_scalar(2.0)
}

fn projection(x: &Tensor, w: &Tensor, b: &Tensor, r: &Tensor) -> unirt::Result<Tensor> {
    x.matmul(w)?.add(b)?.relu()?.add(r)
}

/// A row of `g` (recorded from what `eager` runs): eager, replayed as planned with fusion and
/// replayed as planned without, both execs instantiated with `options`, sampled steadily; with
/// `regimes`, the fused and unfused replays are also sampled interleaved and batched. Also
/// returns the fused plan.
fn replay_row(
    workload: &'static str,
    reps: usize,
    g: &unirt::Graph,
    (options, regimes): (ExecOptions, bool),
    sync: &dyn Fn() -> unirt::Result<()>,
    eager: &mut dyn FnMut() -> unirt::Result<()>,
) -> unirt::Result<(Row, CapturePlan)> {
    let fused = g.plan()?;
    let unfused = CapturePlan::with_options(g, PlanOptions { fuse: false })?;
    let (fx, ux) = (
        fused.instantiate_with(options)?,
        unfused.instantiate_with(options)?,
    );
    let mut fused_side = || fx.replay();
    let mut unfused_side = || ux.replay();
    let [eager_ms, fused_ms, unfused_ms] = time_ms(
        reps,
        Sampling::Steady,
        sync,
        [&mut *eager, &mut fused_side, &mut unfused_side],
    )?;
    let mut row = Row {
        workload,
        eager_ms,
        replay_ms: fused_ms,
        fused_ms: Some(fused_ms),
        unfused_ms: Some(unfused_ms),
        ..Row::default()
    };
    if regimes {
        // The same three sides back to back, each right after the other's work.
        let [_, fi, ui] = time_ms(
            reps,
            Sampling::Interleaved,
            sync,
            [&mut *eager, &mut fused_side, &mut unfused_side],
        )?;
        // Replays queued in batches: throughput without a host wait per replay.
        let [fb, ub] = time_ms(
            reps,
            Sampling::Batched,
            sync,
            [&mut fused_side, &mut unfused_side],
        )?;
        (row.fused_interleaved_ms, row.unfused_interleaved_ms) = (Some(fi), Some(ui));
        (row.fused_batched_ms, row.unfused_batched_ms) = (Some(fb), Some(ub));
    }
    Ok((row, fused))
}

fn record(
    device: Device,
    inputs: &[&Tensor],
    f: impl FnOnce() -> unirt::Result<Tensor>,
) -> unirt::Result<unirt::Graph> {
    let (mut g, out) = unirt::graph::record(device, f)?;
    g.mark_output("out", &out)?;
    for (i, t) in inputs.iter().enumerate() {
        g.mark_input(&format!("in{i}"), t)?;
    }
    Ok(g)
}

pub fn run(device: &str, json: Option<&Path>, quick: bool) -> CliResult<ExitCode> {
    // Rounds per workload (tiny ops, decode step, 16 MiB chain).
    let reps = if quick { [5, 3, 2] } else { [500, 200, 21] };
    let device: Device = device.parse()?;
    let missing = model::missing_kernels(device);
    if !missing.is_empty() {
        println!(
            "{device}: graph benchmarks not run, no kernels for {}",
            missing.join(", ")
        );
        return Ok(ExitCode::SUCCESS);
    }
    let rt = Runtime::get(device)?;
    let sync = || rt.sync_stream();
    let mut rows = Vec::new();

    // 100 tiny operators.
    let x = Tensor::rand_uniform(&[64], -1.0, 1.0, 1, DType::F32, device)?;
    let g = record(device, &[&x], || tiny_ops(&x))?;
    let exec = CapturePlan::with_options(&g, PlanOptions { fuse: false })?.instantiate()?;
    let [eager, replay] = time_ms(
        reps[0],
        Sampling::Steady,
        &sync,
        [&mut || tiny_ops(&x).map(drop), &mut || exec.replay()],
    )?;
    rows.push(Row {
        workload: "tiny_ops_x100",
        eager_ms: eager,
        replay_ms: replay,
        per_op_eager_us: Some(eager * 10.0),
        per_op_replay_us: Some(replay * 10.0),
        ..Row::default()
    });

    // One decode step of the tiny model (the host step included on both sides).
    let cfg = Config::TINY;
    let w = model::Weights::new(cfg, 42, device)?;
    let st = model::State::new(&cfg, 1, device)?;
    let st2 = model::State::new(&cfg, 1, device)?;
    let (g, _) = model::record_step(&w, &st2)?;
    let captured = ExecOptions {
        warmups: 0,
        capture: true,
        ..Default::default()
    };
    let (row, plan) = replay_row(
        "decode_step",
        reps[1],
        &g,
        (captured, false),
        &sync,
        &mut || model::decode_step(&w, &st).map(drop),
    )?;
    println!(
        "decode step: {} operators planned as {} steps ({} matmul epilogues, {} elementwise chains fused)",
        g.nodes().len(),
        plan.steps().len(),
        plan.fused_epilogues(),
        plan.fused_chains()
    );
    rows.push(Row {
        peak_bytes_planned: Some(plan.memory().arena_bytes),
        peak_bytes_naive: Some(plan.memory().naive_bytes),
        ..row
    });

    // The same step without its host step (the argmax stays on the device; every run
    // computes the same token): the device work alone, which is what a CUDA-graph replay of a
    // framework's step times (ci/bench_graph_torch.py reads its token back outside the timing).
    let st3 = model::State::new(&cfg, 1, device)?;
    let (g, _) = model::record_step_device(&w, &st3)?;
    let (row, _) = replay_row(
        "decode_step_device",
        reps[1],
        &g,
        (captured, false),
        &sync,
        &mut || model::decode_step_device(&w, &st).map(drop),
    )?;
    rows.push(row);

    // A chain of 4 elementwise operators over 16 MiB.
    let n = 4 << 20;
    let x = Tensor::rand_uniform(&[n], -1.0, 1.0, 2, DType::F32, device)?;
    let y = Tensor::rand_uniform(&[n], -1.0, 1.0, 3, DType::F32, device)?;
    let g = record(device, &[&x, &y], || chain4(&x, &y))?;
    let (row, fused) = replay_row(
        "elementwise_chain4_16MiB",
        reps[2],
        &g,
        (ExecOptions::default(), true),
        &sync,
        &mut || chain4(&x, &y).map(drop),
    )?;
    rows.push(row);
    if fused.fused_chains() == 0 {
        println!("note: {device} registers no fused_elementwise kernel; the chain ran unfused");
    }

    // A projection and its epilogue: bias, ReLU, residual.
    let (m, k, n) = (64, 256, 4096);
    let rnd =
        |shape: &[usize], seed| Tensor::rand_uniform(shape, -1.0, 1.0, seed, DType::F32, device);
    let (x, w, b, r) = (
        rnd(&[m, k], 4)?,
        rnd(&[k, n], 5)?,
        rnd(&[n], 6)?,
        rnd(&[m, n], 7)?,
    );
    let g = record(device, &[&x, &r], || projection(&x, &w, &b, &r))?;
    let (row, fused) = replay_row(
        "matmul_bias_relu_residual",
        reps[2],
        &g,
        (ExecOptions::default(), true),
        &sync,
        &mut || projection(&x, &w, &b, &r).map(drop),
    )?;
    rows.push(row);
    if fused.fused_epilogues() == 0 {
        println!("note: {device} registers no matmul_epilogue kernel; the projection ran unfused");
    }

    let planning = planning(device, if quick { 10_000 } else { 100_000 })?;
    println!(
        "{:<26} {:>11} {:>11} {:>8}  extra",
        "workload", "eager ms", "replay ms", "speedup"
    );
    for r in &rows {
        let mut extra = String::new();
        if let Some(us) = r.per_op_replay_us {
            extra += &format!(
                "per op: {us:.3} µs replay, {:.3} µs eager",
                r.per_op_eager_us.unwrap_or(0.0)
            );
        }
        if let (Some(p), Some(n)) = (r.peak_bytes_planned, r.peak_bytes_naive) {
            extra += &format!(
                "intermediates: {p} B planned vs {n} B naive ({:.2}x)",
                p as f64 / n.max(1) as f64
            );
        }
        if let (Some(f), Some(u)) = (r.fused_ms, r.unfused_ms) {
            if !extra.is_empty() {
                extra += "; ";
            }
            extra += &format!("fused {f:.3} ms vs unfused {u:.3} ms ({:.2}x)", u / f);
            if let (Some(fi), Some(ui)) = (r.fused_interleaved_ms, r.unfused_interleaved_ms) {
                extra += &format!(", interleaved {fi:.3} vs {ui:.3} ms ({:.2}x)", ui / fi);
            }
            if let (Some(fb), Some(ub)) = (r.fused_batched_ms, r.unfused_batched_ms) {
                extra += &format!(
                    ", batched ({BATCH} per sync) {fb:.3} vs {ub:.3} ms ({:.2}x)",
                    ub / fb
                );
            }
        }
        println!(
            "{:<26} {:>11.4} {:>11.4} {:>7.2}x  {extra}",
            r.workload,
            r.eager_ms,
            r.replay_ms,
            r.eager_ms / r.replay_ms
        );
    }
    println!(
        "planning, a chain of {} operators: record {:.1} ms, eager run {:.1} ms, plan unfused \
         {:.1} ms, plan fused {:.1} ms ({} steps), instantiate {:.1} ms, replay {:.1} ms",
        planning.operators,
        planning.record_ms,
        planning.eager_run_ms,
        planning.plan_unfused_ms,
        planning.plan_fused_ms,
        planning.fused_steps,
        planning.instantiate_ms,
        planning.replay_ms
    );
    if let Some(p) = json {
        let report = serde_json::json!({
            "device": device.to_string(),
            "rows": rows,
            "planning": planning,
        });
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What a long graph costs to record, plan and instantiate (see the module docs).
#[derive(Serialize)]
struct Planning {
    operators: usize,
    record_ms: f64,
    eager_run_ms: f64,
    plan_unfused_ms: f64,
    plan_fused_ms: f64,
    fused_steps: usize,
    instantiate_ms: f64,
    replay_ms: f64,
}

fn planning(device: Device, operators: usize) -> CliResult<Planning> {
    let rt = Runtime::get(device)?;
    let x = Tensor::rand_uniform(&[16], -1.0, 1.0, 8, DType::F32, device)?;
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let g = record(device, &[&x], || {
        let mut h = x.clone();
        for i in 0..operators {
            h = match i % 3 {
                0 => h.add_scalar(0.001)?,
                1 => h.mul_scalar(0.999)?,
                _ => h.relu()?,
            };
        }
        Ok(h)
    })?;
    let record_ms = ms(t);
    let t = Instant::now();
    rt.run(&g)?;
    rt.sync_stream()?;
    let eager_run_ms = ms(t);
    let t = Instant::now();
    let unfused = CapturePlan::with_options(&g, PlanOptions { fuse: false })?;
    let plan_unfused_ms = ms(t);
    let t = Instant::now();
    let fused = g.plan()?;
    let plan_fused_ms = ms(t);
    let t = Instant::now();
    let exec = unfused.instantiate_with(ExecOptions {
        warmups: 0,
        ..Default::default()
    })?;
    let instantiate_ms = ms(t);
    let t = Instant::now();
    exec.replay()?;
    exec.synchronize()?;
    Ok(Planning {
        operators,
        record_ms,
        eager_run_ms,
        plan_unfused_ms,
        plan_fused_ms,
        fused_steps: fused.steps().len(),
        instantiate_ms,
        replay_ms: ms(t),
    })
}
