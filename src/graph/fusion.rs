//! Fusion of elementwise chains: consecutive steps where each consumes the previous one's
//! result (an intermediate nobody else reads) become one `fused_elementwise` step
//! ([`crate::ops::fused`]). Only chains whose operands are all contiguous and of the output's
//! shape fuse, and only where the device registers a `fused_elementwise` kernel for the
//! dtype: a backend without one runs the chain unfused.

use std::collections::HashMap;

use super::graph::{BufferId, BufferRole, Graph, NodeKind, Operand};
use super::plan::Step;
use crate::error::Result;
use crate::ops::fused::{fused_elementwise, FusedProgram, FusedSrc, FusedStep, FUSED_ELEMENTWISE};
use crate::ops::{BinaryOp, Params, UnaryOp};
use crate::tensor::Layout;

/// The elementwise operator a step is, if it can join a chain.
fn as_elementwise(step: &Step) -> Option<ElementOp> {
    let NodeKind::Op(plan) = &step.kind else {
        return None;
    };
    let name = plan.op();
    let out = step.outputs.first()?;
    let contiguous = |o: &Operand| {
        o.layout.shape() == out.layout.shape()
            && o.layout.strides() == Layout::contiguous(out.layout.shape()).strides()
            && o.dtype == out.dtype
    };
    if step.outputs.len() != 1 || !step.inputs.iter().chain(&step.outputs).all(contiguous) {
        return None;
    }
    if let Some(op) = UnaryOp::ALL.into_iter().find(|u| u.name() == name) {
        return Some(ElementOp::Unary(op));
    }
    if let Some(op) = BinaryOp::ALL.into_iter().find(|b| b.name() == name) {
        return Some(ElementOp::Binary(op));
    }
    if let Some(op) = BinaryOp::ALL.into_iter().find(|b| b.scalar_name() == name) {
        if let Params::Scalar(s) = plan.params() {
            return Some(ElementOp::Scalar(op, *s));
        }
    }
    (name == "swiglu").then_some(ElementOp::Swiglu)
}

#[derive(Clone, Copy)]
enum ElementOp {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Scalar(BinaryOp, f64),
    Swiglu,
}

/// Fuses the chains of `steps`; returns the new steps and how many chains were fused.
/// `keep` are buffers that must stay materialised (the graph's outputs).
pub(crate) fn fuse_chains(
    graph: &Graph,
    steps: Vec<Step>,
    keep: &[BufferId],
) -> Result<(Vec<Step>, usize)> {
    // How often each buffer is read and written across the plan.
    let mut reads: HashMap<BufferId, usize> = HashMap::new();
    let mut writes: HashMap<BufferId, usize> = HashMap::new();
    for s in &steps {
        for o in &s.inputs {
            *reads.entry(o.buffer).or_default() += 1;
        }
        for o in &s.outputs {
            *writes.entry(o.buffer).or_default() += 1;
        }
    }
    let device = graph.device();
    // A result that only the next step reads, that is nothing else.
    let private_link = |prev: &Step, next: &Step| -> bool {
        let Some(o) = prev.outputs.first() else {
            return false;
        };
        let b = o.buffer;
        graph.buffers()[b.0].role == BufferRole::Intermediate
            && !keep.contains(&b)
            && reads.get(&b) == Some(&1)
            && writes.get(&b) == Some(&1)
            && o.layout.offset() == 0
            && next.inputs.iter().any(|i| i.buffer == b)
            && !next.outputs.iter().any(|x| x.buffer == b)
    };
    let mut out = Vec::with_capacity(steps.len());
    let mut fused = 0;
    let mut chain: Vec<(Step, ElementOp)> = Vec::new();
    let flush = |chain: &mut Vec<(Step, ElementOp)>,
                 out: &mut Vec<Step>,
                 fused: &mut usize|
     -> Result<()> {
        if chain.len() < 2 {
            out.extend(chain.drain(..).map(|(s, _)| s));
            return Ok(());
        }
        match fuse(chain, device)? {
            Some(step) => {
                out.push(step);
                chain.clear();
                *fused += 1;
            }
            None => out.extend(chain.drain(..).map(|(s, _)| s)),
        }
        Ok(())
    };
    for step in steps {
        let elem = as_elementwise(&step).filter(|_| {
            let dtype = step.outputs[0].dtype;
            crate::ops::is_registered(FUSED_ELEMENTWISE, device.kind, dtype)
        });
        match elem {
            Some(e) => {
                let joins = chain.last().is_some_and(|(prev, _)| {
                    private_link(prev, &step) && prev.outputs[0].dtype == step.outputs[0].dtype
                });
                if !joins {
                    flush(&mut chain, &mut out, &mut fused)?;
                }
                chain.push((step, e));
            }
            None => {
                flush(&mut chain, &mut out, &mut fused)?;
                out.push(step);
            }
        }
    }
    flush(&mut chain, &mut out, &mut fused)?;
    Ok((out, fused))
}

/// One fused step from a chain (at least two steps, each reading the previous one's result).
/// `None` when the chain reads more tensors than one fused kernel takes, or updates one of
/// them in place.
fn fuse(chain: &[(Step, ElementOp)], device: crate::Device) -> Result<Option<Step>> {
    let mut inputs: Vec<Operand> = Vec::new();
    let mut program = FusedProgram::default();
    let mut nodes = Vec::new();
    for (i, (step, op)) in chain.iter().enumerate() {
        let src = |o: &Operand, inputs: &mut Vec<Operand>| -> FusedSrc {
            if i > 0 && o.buffer == chain[i - 1].0.outputs[0].buffer {
                return FusedSrc::Step(i - 1);
            }
            match inputs.iter().position(|x| x == o) {
                Some(k) => FusedSrc::Input(k),
                None => {
                    inputs.push(o.clone());
                    FusedSrc::Input(inputs.len() - 1)
                }
            }
        };
        let a = src(&step.inputs[0], &mut inputs);
        let b = step.inputs.get(1).map(|o| src(o, &mut inputs));
        let fs = match (*op, b) {
            (ElementOp::Unary(u), _) => FusedStep::Unary(u, a),
            (ElementOp::Scalar(o, s), _) => FusedStep::Scalar(o, a, s),
            (ElementOp::Binary(o), Some(b)) => FusedStep::Binary(o, a, b),
            (ElementOp::Swiglu, Some(b)) => FusedStep::Swiglu(a, b),
            _ => {
                return Err(crate::Error::Internal(format!(
                    "fusion: {} lacks an operand",
                    step.name()
                )))
            }
        };
        program.steps.push(fs);
        nodes.extend(step.nodes.iter().copied());
    }
    let last = &chain[chain.len() - 1].0;
    // The fused kernel writes its output while it reads its inputs: no in-place update.
    let in_place = inputs
        .iter()
        .any(|i| last.outputs.iter().any(|o| o.buffer == i.buffer));
    if inputs.len() > crate::ops::fused::MAX_FUSED_INPUTS || in_place {
        return Ok(None);
    }
    let descs: Vec<_> = inputs.iter().map(|o| o.desc(device)).collect();
    // A device that cannot run this chain as one kernel (fewer storage bindings per stage
    // than it needs, say) runs it unfused.
    let plan = match fused_elementwise(&descs, program) {
        Ok(p) => p,
        Err(crate::Error::Unsupported { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(Step {
        kind: NodeKind::Op(plan),
        inputs,
        outputs: last.outputs.clone(),
        nodes,
        unsafe_reason: None,
    }))
}
