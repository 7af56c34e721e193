//! The memory of an instantiated graph (`graph::…`): the memory plan's arena and, with exact
//! memory, a block of its own per intermediate and per workspace size.

use unirt::graph::{ExecOptions, GraphExec, NodeKind, PlanOptions};
use unirt::tensor::{DType, Tensor};
use unirt::{CapturePlan, Runtime};

use crate::cases_graph::{bytes, rand, recorded_xy};
use crate::{ensure, Case, Ctx, Failure};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "graph::memory_plan_reuses_intermediates",
            needs: &[],
            run: memory_plan,
        },
        Case {
            name: "graph::exact_memory_gives_each_buffer_its_own_block",
            needs: &[],
            run: exact_memory,
        },
    ]
}

fn memory_plan(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let x = rand(ctx, &[1024], 5)?;
    rt.start_graph_recording()?;
    let r = (|| -> unirt::Result<Tensor> {
        let mut h = x.clone();
        for i in 0..12 {
            h = if i % 2 == 0 { h.tanh()? } else { h.add(&x)? };
        }
        Ok(h)
    })();
    let mut g = rt.stop_graph_recording()?;
    let y = r?;
    g.mark_input("x", &x)?;
    g.mark_output("y", &y)?;
    let plan = unirt::CapturePlan::with_options(&g, PlanOptions { fuse: false })?;
    let m = plan.memory();
    ensure!(
        m.naive_bytes == 12 * 4096,
        "naive bytes {} for 12 intermediates of 4 KiB",
        m.naive_bytes
    );
    ensure!(
        m.arena_bytes * 2 <= m.naive_bytes,
        "planned {} bytes against {} naive",
        m.arena_bytes,
        m.naive_bytes
    );
    // Live intermediates never share bytes.
    for (i, s) in plan.steps().iter().enumerate() {
        for o in &s.outputs {
            for inp in &s.inputs {
                let (Some(a), Some(b)) = (m.offset_of(o.buffer.0), m.offset_of(inp.buffer.0))
                else {
                    continue;
                };
                ensure!(a != b, "step {i} writes the arena slot it reads");
            }
        }
    }
    rt.run(&g)?;
    let want = bytes(&y)?;
    // Packed into the planned arena (whatever `UNIRT_ALLOC_EXACT` says).
    let exec = plan.instantiate_with(ExecOptions {
        exact_memory: Some(false),
        ..ExecOptions::default()
    })?;
    exec.replay()?;
    ensure!(
        bytes(exec.output("y")?)? == want,
        "replay differs from eager"
    );
    ensure!(
        exec.arena_bytes() == m.arena_bytes,
        "arena of {} bytes",
        exec.arena_bytes()
    );
    Ok(())
}

/// With exact memory every intermediate is a block of exactly its bytes and every workspace
/// size one of its own, so an overrun leaves the allocation; the replay is still bitwise the
/// eager result, and the shared layout (one arena, one workspace of the largest size) is what
/// the plan says.
fn exact_memory(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    // f16 where the device has these kernels in f16: the CPU's 16-bit products take
    // workspaces (packed operands), of a different size for each shape.
    let f16 = ["matmul", "tanh", "add_scalar", "sum", "relu"]
        .iter()
        .all(|op| unirt::ops::is_registered(op, ctx.device.kind, DType::F16));
    let dtype = if f16 { DType::F16 } else { DType::F32 };
    let rand = |shape: &[usize], seed| -> Result<Tensor, Failure> {
        Ok(Tensor::rand_uniform(
            shape, -1.0, 1.0, seed, dtype, ctx.device,
        )?)
    };
    let x = rand(&[48, 40], 11)?;
    let (w1, w2) = (rand(&[40, 72], 12)?, rand(&[72, 24], 13)?);
    // Odd byte sizes for the intermediates (48 × 72, 48 × 24 and 48 elements, never a
    // multiple of the arena's alignment), two products of different shapes and a reduction:
    // workspaces of several sizes where the backend's kernels take them.
    let (g, want) = recorded_xy(&rt, &x, || {
        let h = x.matmul(&w1)?.tanh()?;
        let k = h.matmul(&w2)?.add_scalar(0.5)?;
        k.sum(&[1], false)?.relu()
    })?;
    let plan = CapturePlan::with_options(&g, PlanOptions { fuse: false })?;
    let m = plan.memory();
    let own: usize = m
        .offsets
        .iter()
        .map(|&(b, _)| g.buffers()[b].tensor.storage_bytes().max(1))
        .sum();
    let mut sizes: Vec<usize> = plan
        .steps()
        .iter()
        .filter_map(|s| match &s.kind {
            NodeKind::Op(p) if p.workspace_size() > 0 => Some(p.workspace_size()),
            _ => None,
        })
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let instantiate = |exact| -> Result<GraphExec, Failure> {
        Ok(plan.instantiate_with(ExecOptions {
            exact_memory: Some(exact),
            ..ExecOptions::default()
        })?)
    };
    let (shared, exact) = (instantiate(false)?, instantiate(true)?);
    ensure!(
        shared.arena_bytes() == m.arena_bytes && exact.arena_bytes() == own,
        "arenas of {} (planned {}) and {} bytes (exact; the intermediates take {own})",
        shared.arena_bytes(),
        m.arena_bytes,
        exact.arena_bytes()
    );
    ensure!(
        shared.workspace_bytes() == sizes.last().copied().unwrap_or(0)
            && exact.workspace_bytes() == sizes.iter().sum::<usize>(),
        "workspaces of {} and {} bytes (exact) for steps taking {sizes:?}",
        shared.workspace_bytes(),
        exact.workspace_bytes()
    );
    for (what, exec) in [("shared", &shared), ("exact", &exact)] {
        for round in 0..2 {
            exec.replay()?;
            ensure!(
                bytes(exec.output("y")?)? == want,
                "replay {round} with {what} memory differs from eager"
            );
        }
    }
    // New input, both layouts again.
    let x2 = rand(&[48, 40], 14)?;
    for exec in [&shared, &exact] {
        exec.set_input("x", &x2)?;
        exec.replay()?;
    }
    ensure!(
        bytes(shared.output("y")?)? == bytes(exact.output("y")?)?,
        "shared and exact memory replay differently after set_input"
    );
    Ok(())
}
