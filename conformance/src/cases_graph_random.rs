//! Random operator graphs (`graph::random_graphs_replay_as_eager`): seeded random programs
//! of elementwise, broadcast, matmul-with-epilogue, normalisation, reduction and transposed-view
//! steps, run eagerly and recorded, then replayed through a fused plan, an unfused plan and
//! `Runtime::run`, with the inputs changed between replays. Every output must be bitwise the
//! eager result on the same device: a memory plan that lets two live intermediates share
//! bytes, a fusion that drops or reorders a step, an epilogue that reads a stale operand or a
//! replay that keeps an old input shows up as a difference.
//!
//! `UNIRT_GRAPH_FUZZ_SEEDS` (default 10) sets the number of programs; `UNIRT_GRAPH_FUZZ_SEED`
//! the first seed (default fixed, so a failure names a seed that replays it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use unirt::graph::{self, HostFn, PlanOptions};
use unirt::tensor::{DType, SplitMix64, Tensor};
use unirt::{CapturePlan, Runtime};

use crate::{ensure, env_u64, Case, Ctx, Failure};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "graph::random_graphs_replay_as_eager",
            needs: &[],
            run: random_graphs,
        },
        Case {
            name: "graph::random_graphs_from_several_threads",
            needs: &[],
            run: random_graphs_threads,
        },
        Case {
            name: "graph::recorded_on_one_thread_replayed_on_another",
            needs: &[],
            run: other_thread,
        },
    ]
}

/// The two column counts values alternate between through matmuls (rows and dtype are drawn
/// per program).
const COLS: [usize; 2] = [16, 37];

/// The program's inputs: two activations, per column count a bias, a norm weight and the
/// weight that maps it to the other column count.
struct Inputs {
    x: Tensor,
    y: Tensor,
    bias: [Tensor; 2],
    norm: [Tensor; 2],
    /// `weight[i]`: `COLS[i] × COLS[1 - i]`.
    weight: [Tensor; 2],
}

impl Inputs {
    fn new(ctx: &Ctx, seed: u64, rows: usize, dtype: DType) -> Result<Inputs, Failure> {
        let r = |shape: &[usize], s: u64| {
            Tensor::rand_uniform(shape, -1.5, 1.5, seed ^ s, dtype, ctx.device)
        };
        Ok(Inputs {
            x: r(&[rows, COLS[0]], 1)?,
            y: r(&[rows, COLS[0]], 2)?,
            bias: [r(&[COLS[0]], 3)?, r(&[COLS[1]], 4)?],
            norm: [r(&[COLS[0]], 5)?, r(&[COLS[1]], 6)?],
            weight: [r(&[COLS[0], COLS[1]], 7)?, r(&[COLS[1], COLS[0]], 8)?],
        })
    }
}

/// A value of the program: a tensor of `rows × COLS[width]` (a transposed view's transpose
/// back included), and whether an operator produced it (only those may be outputs).
struct Value {
    t: Tensor,
    width: usize,
    computed: bool,
}

/// The steps a program draws from, each used only where the device registers its kernel.
const UNARY: &[&str] = &["tanh", "relu", "gelu", "silu", "sigmoid"];
const BINARY: &[&str] = &["add", "sub", "mul", "maximum"];

/// Runs program `seed` on `inp` (eagerly, or recorded when recording is on) and returns the
/// tensors it names as outputs.
fn program(seed: u64, inp: &Inputs, has: &dyn Fn(&str) -> bool) -> unirt::Result<Vec<Tensor>> {
    let mut rng = SplitMix64::new(seed);
    let mut below = |n: usize| rng.below(n as u64) as usize;
    let mut vals = vec![
        Value {
            t: inp.x.clone(),
            width: 0,
            computed: false,
        },
        Value {
            t: inp.y.clone(),
            width: 0,
            computed: false,
        },
    ];
    let steps = 6 + below(10);
    for _ in 0..steps {
        // Mostly the latest value, so that chains (which fusion needs) form.
        let i = if below(3) == 0 {
            below(vals.len())
        } else {
            vals.len() - 1
        };
        let (a, w) = (vals[i].t.clone(), vals[i].width);
        // A second operand of the same width (often the latest value, so chains form).
        let same: Vec<usize> = (0..vals.len()).filter(|&j| vals[j].width == w).collect();
        let j = if below(2) == 0 {
            *same.last().unwrap_or(&i)
        } else {
            same[below(same.len())]
        };
        let b = vals[j].t.clone();
        // Whether the step's result is an operator's output (a contiguous() of a tensor that
        // already is contiguous returns the tensor itself).
        let mut computed = true;
        let (t, width) = match below(11) {
            0 | 1 => {
                let op = UNARY[below(UNARY.len())];
                if !has(op) {
                    continue;
                }
                let t = match op {
                    "tanh" => a.tanh()?,
                    "relu" => a.relu()?,
                    "gelu" => a.gelu()?,
                    "silu" => a.silu()?,
                    _ => a.sigmoid()?,
                };
                (t, w)
            }
            2 | 3 => {
                let op = BINARY[below(BINARY.len())];
                if !has(op) {
                    continue;
                }
                let t = match op {
                    "add" => a.add(&b)?,
                    "sub" => a.sub(&b)?,
                    "mul" => a.mul(&b)?,
                    _ => a.maximum(&b)?,
                };
                (t, w)
            }
            4 => {
                let s = [0.5, -1.25, 2.0][below(3)];
                let t = if below(2) == 0 {
                    a.add_scalar(s)?
                } else {
                    a.mul_scalar(s)?
                };
                (t, w)
            }
            5 => (a.add(&inp.bias[w])?, w),
            6 | 7 => {
                // A matmul, often with the epilogue a planner fuses: bias, activation,
                // residual.
                let mut t = a.matmul(&inp.weight[w])?;
                let w2 = 1 - w;
                if below(2) == 0 {
                    t = t.add(&inp.bias[w2])?;
                }
                if below(2) == 0 && has("relu") {
                    t = t.relu()?;
                }
                let others: Vec<usize> = (0..vals.len()).filter(|&k| vals[k].width == w2).collect();
                if !others.is_empty() && below(2) == 0 {
                    t = t.add(&vals[others[below(others.len())]].t)?;
                }
                (t, w2)
            }
            8 => {
                let t = match below(4) {
                    0 if has("softmax") => a.softmax(-1)?,
                    1 if has("rms_norm") => a.rms_norm(&inp.norm[w], 1e-5)?,
                    2 if has("swiglu") => a.swiglu(&b)?,
                    _ => {
                        if !has("sum") {
                            continue;
                        }
                        // A row sum broadcast back over the row.
                        a.mul(&a.sum(&[-1], true)?)?
                    }
                };
                (t, w)
            }
            9 => {
                // Work on transposed views: (aᵀ + bᵀ)ᵀ, a strided value for later steps.
                let t = a.transpose(0, 1)?.add(&b.transpose(0, 1)?)?;
                (t.transpose(0, 1)?, w)
            }
            _ => {
                if !has("rearrange") {
                    continue;
                }
                computed = vals[i].computed;
                (a.transpose(0, 1)?.contiguous()?.transpose(0, 1)?, w)
            }
        };
        vals.push(Value { t, width, computed });
    }
    // The last value and, sometimes, one earlier computed contiguous value.
    let mut outs = Vec::new();
    if let Some(last) = vals
        .iter()
        .rev()
        .find(|v| v.computed && v.t.is_contiguous())
    {
        outs.push(last.t.clone());
    }
    let earlier: Vec<&Value> = vals
        .iter()
        .filter(|v| v.computed && v.t.is_contiguous())
        .collect();
    if earlier.len() > 1 && below(2) == 0 {
        let e = earlier[below(earlier.len() - 1)];
        outs.push(e.t.clone());
    }
    Ok(outs)
}

fn bytes(ts: &[Tensor]) -> unirt::Result<Vec<Vec<u8>>> {
    ts.iter().map(|t| t.to_bytes()).collect()
}

/// What one program exercised: recorded nodes, fused chains, fused epilogues.
#[derive(Default)]
struct Tally {
    nodes: usize,
    chains: usize,
    epilogues: usize,
}

/// Program `seed`: eager, recorded, `Runtime::run`, fused and unfused replays (twice, then
/// with new inputs) — every output bitwise the eager one.
fn check_program(ctx: &Ctx, seed: u64, tally: &mut Tally) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let kind = ctx.device.kind;
    // Mostly f32; f16 and bf16 programs where the device registers them.
    let mut draw = SplitMix64::new(!seed);
    let dtype = [DType::F32, DType::F32, DType::F16, DType::BF16][draw.below(4) as usize];
    let rows = [1, 6, 6, 33][draw.below(4) as usize];
    if dtype != DType::F32 && !unirt::ops::is_registered("matmul", kind, dtype) {
        return Ok(());
    }
    let has = move |op: &str| unirt::ops::is_registered(op, kind, dtype);
    let inp = Inputs::new(ctx, seed, rows, dtype)?;
    let want = bytes(&program(seed, &inp, &has)?)?;
    rt.start_graph_recording()?;
    let recorded = program(seed, &inp, &has);
    let mut g = rt.stop_graph_recording()?;
    let outs = recorded?;
    ensure!(
        outs.len() == want.len(),
        "seed {seed:#x} ({dtype}, {rows} rows): {} outputs recorded, {} eager",
        outs.len(),
        want.len()
    );
    if outs.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = (0..outs.len()).map(|i| format!("out{i}")).collect();
    for (n, t) in names.iter().zip(&outs) {
        g.mark_output(n, t)?;
    }
    // A program may leave x or y unused; then it is no input of the graph. One it uses must
    // be nameable however a node first read it (a transposed view, say).
    let x_used = g.buffer_of(&inp.x).is_some();
    let y_used = g.buffer_of(&inp.y).is_some();
    for (name, t, used) in [("x", &inp.x, x_used), ("y", &inp.y, y_used)] {
        if used {
            g.mark_input(name, t)?;
        }
    }
    rt.run(&g)?;
    ensure!(
        bytes(&outs)? == want,
        "seed {seed:#x} ({dtype}, {rows} rows): Runtime::run differs from eager ({} nodes: {:?})",
        g.nodes().len(),
        g.nodes().iter().map(|n| n.name()).collect::<Vec<_>>()
    );
    let fused = g.plan()?;
    tally.chains += fused.fused_chains();
    tally.epilogues += fused.fused_epilogues();
    tally.nodes += g.nodes().len();
    let unfused = CapturePlan::with_options(&g, PlanOptions { fuse: false })?;
    // New inputs for the second round of replays, and what eager gives for them.
    let next = Inputs::new(ctx, seed ^ 0x5555, rows, dtype)?;
    let moved = Inputs {
        x: if x_used { next.x } else { inp.x.clone() },
        y: if y_used { next.y } else { inp.y.clone() },
        bias: inp.bias.clone(),
        norm: inp.norm.clone(),
        weight: inp.weight.clone(),
    };
    let want_next = bytes(&program(seed, &moved, &has)?)?;
    for (what, plan) in [("fused", &fused), ("unfused", &unfused)] {
        // Every other seed gives each intermediate a block of its own (an overrun leaves the
        // allocation, where a memory checker sees it); the rest follow the allocator's mode.
        let exec = plan.instantiate_with(graph::ExecOptions {
            exact_memory: (seed % 2 == 1).then_some(true),
            ..Default::default()
        })?;
        for round in 0..2 {
            exec.replay()?;
            for (k, n) in names.iter().enumerate() {
                ensure!(
                    exec.output(n)?.to_bytes()? == want[k],
                    "seed {seed:#x} ({dtype}, {rows} rows): {what} replay {round}, output {k} differs from eager \
                     ({} steps, {} fused chains: {:?})",
                    plan.steps().len(),
                    plan.fused_chains(),
                    g.nodes().iter().map(|n| n.name()).collect::<Vec<_>>()
                );
            }
        }
        if x_used {
            exec.set_input("x", &moved.x)?;
        }
        if y_used {
            exec.set_input("y", &moved.y)?;
        }
        exec.replay()?;
        for (k, n) in names.iter().enumerate() {
            ensure!(
                exec.output(n)?.to_bytes()? == want_next[k],
                "seed {seed:#x} ({dtype}, {rows} rows): {what} replay with new inputs, output {k} differs from \
                 eager ({:?})",
                g.nodes().iter().map(|n| n.name()).collect::<Vec<_>>()
            );
        }
    }
    Ok(())
}

fn random_graphs(ctx: &Ctx) -> Result<(), Failure> {
    let kind = ctx.device.kind;
    let seeds = env_u64("UNIRT_GRAPH_FUZZ_SEEDS").unwrap_or(10);
    let first = env_u64("UNIRT_GRAPH_FUZZ_SEED").unwrap_or(0x6a09_e667_f3bc_c908);
    // How much fusion the programs exercised: a planner that stopped fusing would otherwise
    // pass unnoticed.
    let mut t = Tally::default();
    for seed in first..first + seeds {
        check_program(ctx, seed, &mut t)?;
    }
    if std::env::var_os("UNIRT_GRAPH_FUZZ_SEEDS").is_some() {
        eprintln!(
            "{}: {} nodes, {} fused chains, {} epilogues",
            ctx.device, t.nodes, t.chains, t.epilogues
        );
    }
    let has = |op: &str| unirt::ops::is_registered(op, kind, DType::F32);
    if seeds >= 10 {
        ensure!(
            t.chains > 0 || !has("fused_elementwise"),
            "{seeds} programs and no fused chain ({} nodes)",
            t.nodes
        );
        ensure!(
            t.epilogues > 0 || !has("matmul_epilogue"),
            "{seeds} programs and no fused matmul epilogue ({} nodes)",
            t.nodes
        );
    }
    Ok(())
}

/// Four threads check programs of their own at once (eager steps, recordings — each thread's
/// own — plans and replays interleaving on one device), while they also replay one shared exec
/// and check its output after each of their replays.
fn random_graphs_threads(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let seeds = env_u64("UNIRT_GRAPH_FUZZ_SEEDS").unwrap_or(10).div_ceil(2);
    let first = env_u64("UNIRT_GRAPH_FUZZ_SEED").unwrap_or(0x6a09_e667_f3bc_c908);
    // The shared exec: a chain of eight steps over a 6 × 16 input, planned unfused, so that
    // its arena slots hold different intermediates in turn.
    let inp = Inputs::new(ctx, first, 6, DType::F32)?;
    let model = |x: &Tensor| {
        x.matmul(&inp.weight[0])?
            .matmul(&inp.weight[1])?
            .tanh()?
            .mul_scalar(1.5)?
            .add(x)?
            .relu()?
            .add_scalar(0.25)?
            .mul(x)
    };
    let want = model(&inp.x)?.to_bytes()?;
    // Host steps at its start and end count the replays inside the exec at once.
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let (enter, leave) = (inside.clone(), inside.clone());
    let seen = overlaps.clone();
    rt.start_graph_recording()?;
    let y = (|| -> unirt::Result<Tensor> {
        let enter: HostFn = Arc::new(move |_: &[Tensor]| {
            if enter.fetch_add(1, Ordering::SeqCst) != 0 {
                seen.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        });
        graph::host_op("enter", &[&inp.x], enter)?;
        let y = model(&inp.x)?;
        let leave: HostFn = Arc::new(move |_: &[Tensor]| {
            leave.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        });
        graph::host_op("leave", &[&y], leave)?;
        Ok(y)
    })();
    let mut g = rt.stop_graph_recording()?;
    let y = y?;
    g.mark_input("x", &inp.x)?;
    g.mark_output("y", &y)?;
    let shared = CapturePlan::with_options(&g, PlanOptions { fuse: false })?.instantiate()?;
    let turn = std::sync::Mutex::new(());
    let (shared, want, turn, rt) = (&shared, &want, &turn, &rt);
    std::thread::scope(|s| {
        let workers = (0..4u64)
            .map(|w| {
                s.spawn(move || -> Result<(), Failure> {
                    let mut t = Tally::default();
                    for i in 0..seeds {
                        check_program(ctx, first ^ (w << 32) ^ ((i + 1) * 0x9e37_79b9), &mut t)?;
                        // Replays of one exec from several threads, each read back before
                        // another thread's replay rewrites the output (the lock).
                        let out = {
                            let _turn = turn.lock().unwrap_or_else(|e| e.into_inner());
                            shared.replay()?;
                            shared.output("y")?.to_bytes()?
                        };
                        ensure!(
                            &out == want,
                            "thread {w}: the shared exec's output differs after replay {i}"
                        );
                    }
                    Ok(())
                })
            })
            .collect();
        crate::join_workers(workers)
    })?;
    // Replays from several threads at once, without a lock, each on its thread's stream: they
    // are ordered (as CUDA orders the launches of one graph exec), so once all have finished
    // the output is a replay's result, not a mix of intermediates two replays shared.
    std::thread::scope(|s| {
        let workers = (0..4)
            .map(|_| {
                s.spawn(move || -> Result<(), Failure> {
                    for _ in 0..50 {
                        shared.replay()?;
                    }
                    Ok(rt.sync_stream()?)
                })
            })
            .collect();
        crate::join_workers(workers)
    })?;
    ensure!(
        &shared.output("y")?.to_bytes()? == want,
        "after concurrent replays the shared exec's output differs"
    );
    let n = overlaps.load(Ordering::SeqCst);
    ensure!(
        n == 0,
        "replays of one exec from several threads overlapped {n} times"
    );
    Ok(())
}

/// A graph recorded on one thread over tensors that thread is still computing, instantiated
/// without warm-up (so its first use of them is inside the capture) and replayed on another.
fn other_thread(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let kind = ctx.device.kind;
    let has = move |op: &str| unirt::ops::is_registered(op, kind, DType::F32);
    let seed = 0x243f_6a88_85a3_08d3;
    let (g, outs, want) = std::thread::scope(|s| {
        s.spawn(|| -> Result<_, Failure> {
            let inp = Inputs::new(ctx, seed, 33, DType::F32)?;
            let inp = Inputs {
                // Still queued when the other thread takes over.
                x: inp.x.mul_scalar(1.0)?.add_scalar(0.0)?,
                ..inp
            };
            let want = bytes(&program(seed, &inp, &has)?)?;
            rt.start_graph_recording()?;
            let outs = program(seed, &inp, &has);
            let mut g = rt.stop_graph_recording()?;
            let outs = outs?;
            for (i, t) in outs.iter().enumerate() {
                g.mark_output(&format!("out{i}"), t)?;
            }
            Ok((g, outs, want))
        })
        .join()
        .unwrap_or_else(|_| Err(Failure::Failed("the recording thread panicked".into())))
    })?;
    for capture in [true, false] {
        let exec = g.plan()?.instantiate_with(graph::ExecOptions {
            warmups: 0,
            capture,
            ..Default::default()
        })?;
        exec.replay()?;
        for (k, want) in want.iter().enumerate().take(outs.len()) {
            ensure!(
                exec.output(&format!("out{k}"))?.to_bytes()? == *want,
                "output {k} replayed on another thread (capture {capture}) differs from eager"
            );
        }
    }
    Ok(())
}
