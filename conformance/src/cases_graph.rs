//! Operator graphs (`graph::…`): recording, capture-safe and unsafe segments, the memory
//! plan, fusion, replay after input changes, an exec outliving its graph, misuse. The
//! `fused_elementwise` operator the planner generates has its own cases (`cases_fused`).
//!
//! Every case runs operators; on a device whose vendor registers no kernel for one it needs,
//! the case is declared unsupported with that reason ([`unsupported_here`]), derived from the
//! registry as `unregistered_op` does for operator cases.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use unirt::graph::memory::GREEDY_MAX_BUFFERS;
use unirt::graph::{self, ExecOptions, GraphExec, PlanOptions};
use unirt::ops::fused::MAX_FUSED_STEPS;
use unirt::ops::BinaryOp;
use unirt::tensor::{DType, Tensor};
use unirt::CapturePlan;
use unirt::{DeviceKind, Runtime};

use crate::{ensure, expect_err, Case, Ctx, Failure};

/// The operator kernels the graph cases run (all f32).
const GRAPH_OPS: &[&str] = &[
    "mul",
    "add",
    "add_scalar",
    "mul_scalar",
    "tanh",
    "relu",
    "sub",
    "sum",
    "rearrange",
    "matmul",
    "gelu",
    "swiglu",
];

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "graph::recording_records_instead_of_running",
            needs: &[],
            run: recording,
        },
        Case {
            name: "graph::safe_and_unsafe_segments",
            needs: &[],
            run: segments,
        },
        Case {
            name: "graph::long_chains_fuse_in_pieces",
            needs: &[],
            run: long_chains,
        },
        Case {
            name: "graph::fusion_matches_unfused",
            needs: &[],
            run: fusion,
        },
        Case {
            name: "graph::replay_100_times_with_changing_inputs",
            needs: &[],
            run: replay_changing_inputs,
        },
        Case {
            name: "graph::exec_outlives_graph",
            needs: &[],
            run: exec_outlives_graph,
        },
        Case {
            name: "graph::misuse_is_an_error",
            needs: &[],
            run: misuse,
        },
        Case {
            name: "graph::builder_and_state_update",
            needs: &[],
            run: builder_state,
        },
        Case {
            name: "graph::recorded_write_to_external_tensor",
            needs: &[],
            run: recorded_write_to_external,
        },
    ]
}

/// Why a `graph::…` case cannot run on `kind`: an operator it needs has no kernel there.
pub fn unsupported_here(kind: DeviceKind, case: &str) -> Option<String> {
    if !case.starts_with("graph::") {
        return None;
    }
    let missing: Vec<&str> = GRAPH_OPS
        .iter()
        .copied()
        .filter(|op| !unirt::ops::is_registered(op, kind, DType::F32))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{kind} registers no f32 kernel for {} (the graph cases run operators; the {kind} \
             kernels belong to the {kind} operator issue)",
            missing.join(", ")
        )
    })
}

pub(super) fn bytes(t: &Tensor) -> Result<Vec<u8>, Failure> {
    Ok(t.to_bytes()?)
}

/// Records `f` with `x` as input `"x"` and its result as output `"y"`, runs the graph
/// eagerly, and returns it with the bytes of `"y"` (what every replay must give).
pub(super) fn recorded_xy(
    rt: &Runtime,
    x: &Tensor,
    f: impl FnOnce() -> unirt::Result<Tensor>,
) -> Result<(unirt::Graph, Vec<u8>), Failure> {
    rt.start_graph_recording()?;
    let r = f();
    let mut g = rt.stop_graph_recording()?;
    let y = r?;
    g.mark_input("x", x)?;
    g.mark_output("y", &y)?;
    rt.run(&g)?;
    Ok((g, bytes(&y)?))
}

pub(super) fn rand(ctx: &Ctx, shape: &[usize], seed: u64) -> Result<Tensor, Failure> {
    Ok(Tensor::rand_uniform(
        shape,
        -2.0,
        2.0,
        seed,
        DType::F32,
        ctx.device,
    )?)
}

/// `y = tanh(x·w + b)·0.5 - x` — a small chain over inputs x, w, b.
fn model(x: &Tensor, w: &Tensor, b: &Tensor) -> unirt::Result<Tensor> {
    x.mul(w)?.add(b)?.tanh()?.mul_scalar(0.5)?.sub(x)
}

fn recording(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let (x, w, b) = (
        rand(ctx, &[64, 33], 1)?,
        rand(ctx, &[64, 33], 2)?,
        rand(ctx, &[33], 3)?,
    );
    let want = bytes(&model(&x, &w, &b)?)?;
    rt.start_graph_recording()?;
    let r = (|| -> Result<Tensor, Failure> {
        let y = model(&x, &w, &b)?;
        // Nothing ran: the output holds no values yet, and reading it is refused.
        expect_err(y.to_bytes(), &["capturing"], "reading a recorded tensor")?;
        Ok(y)
    })();
    let mut g = rt.stop_graph_recording()?;
    let y = r?;
    ensure!(
        g.nodes().len() == 5,
        "recorded {} nodes, want 5: {:?}",
        g.nodes().len(),
        g.nodes()
    );
    let names: Vec<&str> = g.nodes().iter().map(|n| n.name()).collect();
    ensure!(
        names == ["mul", "add", "tanh", "mul_scalar", "sub"],
        "recorded {names:?}"
    );
    // Shapes were inferred at record time.
    ensure!(
        y.shape() == [64, 33],
        "recorded output shape {:?}",
        y.shape()
    );
    g.mark_input("x", &x)?;
    g.mark_output("y", &y)?;
    rt.run(&g)?;
    ensure!(
        bytes(&y)? == want,
        "Runtime::run differs from eager execution"
    );
    ensure!(
        bytes(&g.output("y")?)? == want,
        "the graph's output differs from eager execution"
    );
    Ok(())
}

fn segments(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let x = rand(ctx, &[256], 4)?;
    let seen = Arc::new(AtomicUsize::new(0));
    let flag = Tensor::zeros(&[256], DType::F32, ctx.device)?;
    rt.start_graph_recording()?;
    let r = (|| -> unirt::Result<Tensor> {
        let a = x.mul(&x)?.add_scalar(1.0)?; // a >= 1
        let s = a.sum(&[0], false)?;
        // A host read: the sum comes back to the host and decides what is written next.
        let seen = seen.clone();
        graph::host_op(
            "sum_to_host",
            &[&s, &flag],
            Arc::new(move |t: &[Tensor]| {
                let v = t[0].to_vec::<f32>()?[0];
                seen.fetch_add(1, Ordering::SeqCst);
                let fill = Tensor::full(
                    &[256],
                    if v > 256.0 { 2.0 } else { -1.0 },
                    DType::F32,
                    t[1].device(),
                )?;
                t[1].copy_from(&fill)
            }),
        )?;
        a.mul(&flag)?.relu()
    })();
    let mut g = rt.stop_graph_recording()?;
    let y = r?;
    g.mark_input("x", &x)?;
    g.mark_output("y", &y)?;
    let plan = g.plan()?;
    let kinds: Vec<bool> = plan.segments().iter().map(|s| s.capture_safe).collect();
    ensure!(
        kinds == [true, false, true],
        "segments {:?}, want safe, unsafe, safe",
        plan.segments()
    );
    rt.run(&g)?;
    let want = bytes(&y)?;
    let exec = plan.instantiate()?;
    let before = seen.load(Ordering::SeqCst);
    exec.replay()?;
    ensure!(
        bytes(exec.output("y")?)? == want,
        "replay differs from eager"
    );
    ensure!(
        seen.load(Ordering::SeqCst) == before + 1,
        "the host step ran {} times in one replay",
        seen.load(Ordering::SeqCst) - before
    );
    let (captured, eager) = exec.segment_counts();
    let caps = unirt::Backend::info(&*ctx.backend).capabilities.capture;
    ensure!(
        eager >= 1 && (captured == 2 || !caps),
        "{captured} captured and {eager} eager segments"
    );
    Ok(())
}

fn fusion(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let (x, w) = (rand(ctx, &[3000], 6)?, rand(ctx, &[3000], 7)?);
    let (g, want) = recorded_xy(&rt, &x, || {
        x.mul(&w)?.add_scalar(0.25)?.tanh()?.sub(&x)?.relu()
    })?;
    let fused = g.plan()?;
    let unfused = unirt::CapturePlan::with_options(&g, PlanOptions { fuse: false })?;
    let can_fuse = unirt::ops::is_registered("fused_elementwise", ctx.device.kind, DType::F32);
    if can_fuse {
        ensure!(
            fused.fused_chains() == 1 && fused.steps().len() == 1,
            "{} chains fused into {} steps",
            fused.fused_chains(),
            fused.steps().len()
        );
    } else {
        ensure!(
            fused.fused_chains() == 0 && fused.steps().len() == 5,
            "fused without a fused_elementwise kernel"
        );
    }
    ensure!(
        unfused.steps().len() == 5,
        "the unfused plan has {} steps",
        unfused.steps().len()
    );
    for (what, p) in [("fused", &fused), ("unfused", &unfused)] {
        let exec = p.instantiate()?;
        exec.replay()?;
        ensure!(
            bytes(exec.output("y")?)? == want,
            "{what} replay differs from eager"
        );
    }
    Ok(())
}

/// Chains longer than one fused kernel runs ([`MAX_FUSED_STEPS`]) fuse in pieces of at most
/// that many steps — a matmul's epilogue too — and replay bitwise as eager. (Fused whole, a
/// chain of 20 000 steps kept the software adapters' shader compilers busy for minutes.)
/// Unfused, the chain has more intermediates than the memory plan's largest-first search
/// takes ([`GREEDY_MAX_BUFFERS`]): placed in step order, they still reuse the arena and
/// replay bitwise.
fn long_chains(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let (x, z) = (rand(ctx, &[3000], 8)?, rand(ctx, &[3000], 9)?);
    let (a, w) = (rand(ctx, &[8, 16], 10)?, rand(ctx, &[16, 24], 11)?);
    let chain = (GREEDY_MAX_BUFFERS / MAX_FUSED_STEPS + 1) * MAX_FUSED_STEPS + 5;
    let tail = MAX_FUSED_STEPS + 6;
    rt.start_graph_recording()?;
    let r = (|| -> unirt::Result<(Tensor, Tensor)> {
        let mut h = x.clone();
        for i in 0..chain {
            h = match i % 4 {
                0 => h.tanh()?,
                1 => h.mul(&z)?,
                2 => h.add_scalar(0.25)?,
                _ => h.relu()?,
            };
        }
        let mut k = a.matmul(&w)?;
        for i in 0..tail {
            k = match i % 3 {
                0 => k.tanh()?,
                1 => k.mul_scalar(1.5)?,
                _ => k.add_scalar(-0.25)?,
            };
        }
        Ok((h, k))
    })();
    let mut g = rt.stop_graph_recording()?;
    let (y, k) = r?;
    g.mark_input("x", &x)?;
    g.mark_output("y", &y)?;
    g.mark_output("k", &k)?;
    rt.run(&g)?;
    let want = (bytes(&y)?, bytes(&k)?);
    let plan = g.plan()?;
    let kind = ctx.device.kind;
    let (chains, epilogues) = match (
        unirt::ops::is_registered("fused_elementwise", kind, DType::F32),
        unirt::ops::is_registered("matmul_epilogue", kind, DType::F32),
    ) {
        // y: pieces of 64 steps and one of 5; k: the matmul with 64 in its epilogue, then 6
        // fused.
        (true, true) => (chain.div_ceil(MAX_FUSED_STEPS) + 1, 1),
        (true, false) => (chain.div_ceil(MAX_FUSED_STEPS) + 2, 0),
        (false, true) => (0, 1),
        (false, false) => (0, 0),
    };
    ensure!(
        plan.fused_chains() == chains && plan.fused_epilogues() == epilogues,
        "{} fused chains and {} epilogues, expected {chains} and {epilogues}",
        plan.fused_chains(),
        plan.fused_epilogues()
    );
    let unfused = CapturePlan::with_options(&g, PlanOptions { fuse: false })?;
    let m = unfused.memory();
    ensure!(
        m.offsets.len() > GREEDY_MAX_BUFFERS && m.arena_bytes * 100 <= m.naive_bytes,
        "{} intermediates planned in {} bytes against {} naive",
        m.offsets.len(),
        m.arena_bytes,
        m.naive_bytes
    );
    for (what, plan) in [("fused", &plan), ("unfused", &unfused)] {
        let exec = plan.instantiate()?;
        for round in 0..2 {
            exec.replay()?;
            ensure!(
                (bytes(exec.output("y")?)?, bytes(exec.output("k")?)?) == want,
                "replay {round} of the long chains ({what}) differs from eager"
            );
        }
    }
    Ok(())
}

fn replay_changing_inputs(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let (x, w, b) = (
        rand(ctx, &[16, 40], 8)?,
        rand(ctx, &[16, 40], 9)?,
        rand(ctx, &[40], 10)?,
    );
    rt.start_graph_recording()?;
    let r = model(&x, &w, &b);
    let mut g = rt.stop_graph_recording()?;
    let y = r?;
    g.mark_input("x", &x)?;
    g.mark_input("w", &w)?;
    g.mark_output("y", &y)?;
    let exec = g.plan()?.instantiate()?;
    let (in_addr, out_addr) = (exec.input("x")?.base_addr(), exec.output("y")?.base_addr());
    for i in 0..100u64 {
        let (nx, nw) = (
            rand(ctx, &[16, 40], 100 + i)?,
            rand(ctx, &[16, 40], 1000 + i)?,
        );
        exec.set_input("x", &nx)?;
        exec.set_input("w", &nw)?;
        exec.replay()?;
        let want = bytes(&model(&nx, &nw, &b)?)?;
        ensure!(
            bytes(exec.output("y")?)? == want,
            "replay {i} differs from eager execution of the same inputs"
        );
    }
    ensure!(
        exec.input("x")?.base_addr() == in_addr && exec.output("y")?.base_addr() == out_addr,
        "static addresses moved"
    );
    Ok(())
}

fn exec_outlives_graph(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let (x, w, b) = (
        rand(ctx, &[500], 11)?,
        rand(ctx, &[500], 12)?,
        rand(ctx, &[500], 13)?,
    );
    let want = bytes(&model(&x, &w, &b)?)?;
    let exec: GraphExec = {
        rt.start_graph_recording()?;
        let r = model(&x, &w, &b);
        let mut g = rt.stop_graph_recording()?;
        let y = r?;
        g.mark_input("x", &x)?;
        g.mark_output("y", &y)?;
        let plan = g.plan()?;
        plan.instantiate()?
        // graph, plan and the recorded tensors drop here
    };
    // Fresh allocations of the same sizes must not land on the exec's memory.
    let churn: Vec<Tensor> = (0..8)
        .map(|i| Tensor::full(&[500], i as f64, DType::F32, ctx.device))
        .collect::<unirt::Result<_>>()?;
    exec.replay()?;
    ensure!(
        bytes(exec.output("y")?)? == want,
        "replay after the graph died differs"
    );
    for (i, t) in churn.iter().enumerate() {
        ensure!(
            t.to_vec::<f32>()?.iter().all(|&v| v == i as f32),
            "the replay wrote into memory allocated after the graph died"
        );
    }
    drop(churn);
    Ok(())
}

fn misuse(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    expect_err(
        rt.stop_graph_recording(),
        &["not_capturing"],
        "stop without start",
    )?;
    let (x, w, b) = (
        rand(ctx, &[8], 14)?,
        rand(ctx, &[8], 15)?,
        rand(ctx, &[8], 16)?,
    );
    rt.start_graph_recording()?;
    let inner = (|| -> Result<Tensor, Failure> {
        expect_err(rt.start_graph_recording(), &["capturing"], "a second start")?;
        let y = model(&x, &w, &b)?;
        Ok(y)
    })();
    let g0 = rt.stop_graph_recording()?;
    let y = inner?;
    let mut g = g0.clone();
    expect_err(
        g.mark_output("y", &x),
        &["bad_param"],
        "an external tensor as output",
    )?;
    expect_err(
        g.mark_input("x", &y),
        &["bad_param"],
        "a computed tensor as input",
    )?;
    let stranger = rand(ctx, &[8], 17)?;
    expect_err(
        g.mark_input("s", &stranger),
        &["bad_param"],
        "an unused tensor as input",
    )?;
    g.mark_input("x", &x)?;
    g.mark_output("y", &y)?;
    expect_err(
        g.mark_output("y", &y),
        &["bad_param"],
        "an output named twice",
    )?;
    let plan = g.plan()?;
    let exec = plan.instantiate()?;
    expect_err(
        exec.set_input("nope", &x),
        &["bad_param"],
        "an unknown input",
    )?;
    expect_err(
        exec.set_input("x", &rand(ctx, &[9], 18)?),
        &["shape_mismatch"],
        "an input of another shape",
    )?;
    expect_err(
        exec.set_input("x", &Tensor::zeros(&[8], DType::I32, ctx.device)?),
        &["dtype_mismatch"],
        "an input of another dtype",
    )?;
    expect_err(
        exec.output("nope").map(|_| ()),
        &["bad_param"],
        "an unknown output",
    )?;
    // While this thread records, running, instantiating and replaying are refused.
    rt.start_graph_recording()?;
    let during = (|| -> Result<(), Failure> {
        expect_err(rt.run(&g), &["capturing"], "run while recording")?;
        expect_err(
            plan.instantiate().map(|_| ()),
            &["capturing"],
            "instantiate while recording",
        )?;
        expect_err(exec.replay(), &["capturing"], "replay while recording")?;
        Ok(())
    })();
    let empty = rt.stop_graph_recording()?;
    during?;
    expect_err(
        empty.plan().map(|_| ()),
        &["bad_param"],
        "planning an empty graph",
    )?;
    // The exec still works after all that.
    exec.replay()?;
    ensure!(
        bytes(exec.output("y")?)? == bytes(&model(&x, &w, &b)?)?,
        "replay after misuse differs"
    );
    Ok(())
}

fn builder_state(ctx: &Ctx) -> Result<(), Failure> {
    use unirt::ops::elementwise::{binary, binary_scalar};
    // acc ← acc + x·2, a state tensor the graph updates in place, fed x by name.
    let acc = Tensor::zeros(&[64], DType::F32, ctx.device)?;
    let mut b = graph::GraphBuilder::new(ctx.device);
    let x = b.input("x", &[64], DType::F32)?;
    let a = b.constant(&acc)?;
    let x2 = b.op(binary_scalar(BinaryOp::Mul, &b.desc(&x), 2.0)?, &[&x])?;
    b.op_into(
        binary(BinaryOp::Add, &b.desc(&a), &b.desc(&x2[0]))?,
        &[&a, &x2[0]],
        &[&a],
    )?;
    let g = b.build()?;
    let exec = g.plan()?.instantiate_with(ExecOptions {
        warmups: 0,
        capture: true,
        ..Default::default()
    })?;
    let one = Tensor::full(&[64], 1.0, DType::F32, ctx.device)?;
    exec.set_input("x", &one)?;
    for _ in 0..10 {
        exec.replay()?;
    }
    let got = acc.to_vec::<f32>()?;
    ensure!(
        got.iter().all(|&v| v == 20.0),
        "state after 10 replays: {:?}",
        &got[..4]
    );
    Ok(())
}

/// A launch into a tensor the caller owns (`gemm_into`, `copy_from`) records a write to that
/// external tensor, which the graph's runs update in place.
fn recorded_write_to_external(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let x = rand(ctx, &[32], 30)?;
    let out = Tensor::zeros(&[32], DType::F32, ctx.device)?;
    rt.start_graph_recording()?;
    let r = (|| -> unirt::Result<()> { out.copy_from(&x.relu()?) })();
    let mut g = rt.stop_graph_recording()?;
    r?;
    g.mark_input("x", &x)?;
    let want = bytes(&x.relu()?)?;
    ensure!(
        out.to_vec::<f32>()?.iter().all(|&v| v == 0.0),
        "the recorded copy ran at record time"
    );
    let exec = g.plan()?.instantiate_with(ExecOptions {
        warmups: 0,
        capture: true,
        ..Default::default()
    })?;
    exec.replay()?;
    ensure!(
        bytes(&out)? == want,
        "the replay did not write the external tensor"
    );
    Ok(())
}
