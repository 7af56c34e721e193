//! Names of a graph's inputs and outputs (`graph::…`): many of them, found by name in the
//! graph and in its exec, the default names of unmarked outputs, renaming an input, an input
//! first read through a view, inputs fed from the host.

use unirt::graph::{ExecOptions, GraphExec, PlanOptions};
use unirt::{CapturePlan, Runtime};

use crate::cases_graph::rand;
use crate::{ensure, expect_err, Case, Ctx, Failure};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "graph::many_named_inputs_and_outputs",
            needs: &[],
            run: many_names,
        },
        Case {
            name: "graph::input_first_read_through_a_view",
            needs: &[],
            run: input_through_view,
        },
    ]
}

/// How many outputs the case names: enough that a name search linear in their count would
/// show (once 17 s to look each of 20 000 up), few enough for a software adapter's replay.
const OUTPUTS: usize = 1500;

/// Output `i` is element `i` of `x` times 2: every name must find its own element.
fn many_names(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let x = rand(ctx, &[OUTPUTS], 41)?;
    let xs = x.to_vec::<f32>()?;
    rt.start_graph_recording()?;
    let r = (0..OUTPUTS)
        .map(|i| x.narrow(0, i, 1)?.mul_scalar(2.0))
        .collect::<unirt::Result<Vec<_>>>();
    let g0 = rt.stop_graph_recording()?;
    let ys = r?;
    // Unmarked, the outputs are every result no node reads, named in recording order.
    rt.run(&g0)?;
    for i in (0..OUTPUTS).step_by(97) {
        let got = g0.output(&format!("output{i}"))?.to_vec::<f32>()?;
        ensure!(got == [xs[i] * 2.0], "default output{i}: {got:?}");
    }
    expect_err(
        g0.output(&format!("output{OUTPUTS}")).map(|_| ()),
        &["bad_param"],
        "a default name past the last output",
    )?;
    // Marked in reverse, so that naming order and recording order differ.
    let mut g = g0.clone();
    for i in (0..OUTPUTS).rev() {
        g.mark_output(&format!("y{i}"), &ys[i])?;
    }
    expect_err(
        g.mark_output("y7", &ys[8]),
        &["bad_param"],
        "a taken output name",
    )?;
    ensure!(
        g.output("output0").is_err(),
        "default names remain after outputs were marked"
    );
    // Naming an input again renames it; its old name is free, for no one else.
    g.mark_input("x", &x)?;
    g.mark_input("x2", &x)?;
    let other = rand(ctx, &[OUTPUTS], 42)?;
    expect_err(
        g.mark_input("x2", &other),
        &["bad_param"],
        "an input name taken by another tensor",
    )?;
    ensure!(
        g.inputs().len() == 1 && g.inputs()[0].0 == "x2",
        "inputs after renaming: {:?}",
        g.inputs()
    );
    let plan = CapturePlan::with_options(&g, PlanOptions { fuse: false })?;
    let exec = GraphExec::instantiate(&plan, ExecOptions::default())?;
    let (ins, outs) = exec.names();
    ensure!(ins == ["x2"], "exec inputs {ins:?}");
    ensure!(
        outs.len() == OUTPUTS && outs[0] == format!("y{}", OUTPUTS - 1),
        "exec outputs in naming order: {} names, first {:?}",
        outs.len(),
        outs.first()
    );
    expect_err(
        exec.set_input("x", &x),
        &["bad_param"],
        "an input's old name",
    )?;
    for round in 0..2 {
        let feed = if round == 0 { x.clone() } else { other.clone() };
        let want = feed.to_vec::<f32>()?;
        exec.set_input("x2", &feed)?;
        exec.replay()?;
        for (i, &w) in want.iter().enumerate() {
            let got = exec.output(&format!("y{i}"))?.to_vec::<f32>()?;
            ensure!(
                got == [w * 2.0],
                "round {round}: y{i} = {got:?}, want {}",
                w * 2.0
            );
        }
    }
    // The graph's own names after an eager run.
    rt.run(&g)?;
    for i in (0..OUTPUTS).step_by(89) {
        let got: Vec<f32> = g.output(&format!("y{i}"))?.to_vec()?;
        ensure!(got == [xs[i] * 2.0], "graph output y{i}: {got:?}");
    }
    Ok(())
}

/// An input whose first reader sees a view of it (a transpose, a slice) is still named and fed
/// whole: once, the graph kept the first view as the input's shape, so the transposed one
/// could not be named and the sliced one took only its slice from `set_input`.
fn input_through_view(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let x = rand(ctx, &[4, 6], 43)?;
    for first in ["transpose", "slice"] {
        rt.start_graph_recording()?;
        let r = (|| {
            let v = match first {
                "transpose" => x.transpose(0, 1)?,
                _ => x.narrow(0, 1, 2)?,
            };
            let a = v.mul_scalar(3.0)?;
            let b = x.add_scalar(1.0)?;
            Ok::<_, unirt::Error>((a, b))
        })();
        let mut g = rt.stop_graph_recording()?;
        let (a, b) = r?;
        expect_err(
            g.mark_input("x", &x.narrow(0, 1, 2)?),
            &["bad_param"],
            "a slice of the input's storage as the input",
        )?;
        g.mark_input("x", &x)?;
        g.mark_output("a", &a)?;
        g.mark_output("b", &b)?;
        let exec = g.instantiate()?;
        ensure!(
            exec.input("x")?.shape() == [4, 6],
            "{first}: the static input has shape {:?}",
            exec.input("x")?.shape()
        );
        let feed = rand(ctx, &[4, 6], 44)?;
        // Fed from the host (another device, except on the CPU), then the static input fed
        // with itself (nothing to copy).
        exec.set_input("x", &feed.to(unirt::Device::CPU)?)?;
        exec.set_input("x", exec.input("x")?)?;
        exec.replay()?;
        // The same work done eagerly on the fed tensor.
        let v = match first {
            "transpose" => feed.transpose(0, 1)?,
            _ => feed.narrow(0, 1, 2)?,
        };
        let (want_a, want_b) = (v.mul_scalar(3.0)?, feed.add_scalar(1.0)?);
        for (name, want) in [("a", want_a), ("b", want_b)] {
            let got = exec.output(name)?.to_vec::<f32>()?;
            ensure!(
                got == want.to_vec::<f32>()?,
                "{first}: output {name} after set_input: {got:?}"
            );
        }
    }
    Ok(())
}
