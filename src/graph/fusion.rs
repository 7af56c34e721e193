//! Fusion, in two passes over consecutive steps where each consumes the previous one's
//! result (an intermediate nobody else reads):
//!
//! - **Epilogues** (`fuse_epilogues`): a matmul followed by elementwise steps — bias,
//!   activation, residual, a SwiGLU gate — becomes one `matmul_epilogue` step
//!   ([`crate::ops::matmul::matmul_epilogue`]): the product is never stored. The other
//!   operands may be broadcast (a bias of shape `[n]`) and have any layout.
//! - **Elementwise chains** (`fuse_chains`): the chains left become one `fused_elementwise`
//!   step ([`crate::ops::fused`]). Only chains whose operands are all contiguous and of the
//!   output's shape fuse.
//!
//! A fused kernel runs at most [`MAX_FUSED_STEPS`] steps: a longer chain (or epilogue) is cut
//! into kernels of that many, each reading the previous one's result, so a long graph never
//! asks a shader compiler for one enormous kernel.
//!
//! Each pass fuses only where the device registers the fused operator's kernel for the
//! dtype: a backend without one runs the steps unfused, with the same result.

use std::collections::HashMap;

use super::graph::{BufferId, BufferRole, Graph, NodeKind, Operand};
use super::plan::Step;
use crate::error::Result;
use crate::ops::fused::{
    fused_elementwise, FusedProgram, FusedSrc, FusedStep, FUSED_ELEMENTWISE, MAX_FUSED_STEPS,
};
use crate::ops::matmul::{matmul_epilogue, MATMUL_EPILOGUE, MAX_EPILOGUE_OPERANDS};
use crate::ops::{BinaryOp, Params, Plan, UnaryOp};
use crate::tensor::Layout;

/// The elementwise operator a step is, if it can join a chain.
fn as_elementwise(step: &Step) -> Option<ElementOp> {
    let NodeKind::Op(plan) = &step.kind else {
        return None;
    };
    let out = step.outputs.first()?;
    let contiguous = |o: &Operand| {
        o.layout.shape() == out.layout.shape()
            && o.layout.strides() == Layout::contiguous(out.layout.shape()).strides()
            && o.dtype == out.dtype
    };
    if step.outputs.len() != 1 || !step.inputs.iter().chain(&step.outputs).all(contiguous) {
        return None;
    }
    element_op(plan)
}

/// The elementwise operator a step is, if it can join a matmul's epilogue: one output of
/// `shape` and `dtype`, every operand of `dtype` and broadcasting to `shape`.
fn as_epilogue_op(step: &Step, shape: &[usize], dtype: crate::tensor::DType) -> Option<ElementOp> {
    let NodeKind::Op(plan) = &step.kind else {
        return None;
    };
    let [out] = step.outputs.as_slice() else {
        return None;
    };
    let fits = |o: &Operand| o.dtype == dtype && o.layout.broadcast_to(shape).is_ok();
    if out.layout.shape() != shape || !fits(out) || !step.inputs.iter().all(fits) {
        return None;
    }
    element_op(plan)
}

/// The elementwise operator `plan` runs, if any.
fn element_op(plan: &Plan) -> Option<ElementOp> {
    let name = plan.op();
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
    let uses = Uses::of(&steps);
    let device = graph.device();
    let private_link = |prev: &Step, next: &Step| uses.private_link(graph, keep, prev, next);
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
                // A chain as long as one kernel runs ends here; the next begins with this step.
                let joins = chain.len() < MAX_FUSED_STEPS
                    && chain.last().is_some_and(|(prev, _)| {
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

/// How often each buffer is read and written across a plan.
struct Uses {
    reads: HashMap<BufferId, usize>,
    writes: HashMap<BufferId, usize>,
}

impl Uses {
    fn of(steps: &[Step]) -> Self {
        let mut uses = Uses {
            reads: HashMap::new(),
            writes: HashMap::new(),
        };
        for s in steps {
            for o in &s.inputs {
                *uses.reads.entry(o.buffer).or_default() += 1;
            }
            for o in &s.outputs {
                *uses.writes.entry(o.buffer).or_default() += 1;
            }
        }
        uses
    }

    /// Whether `prev`'s result is an intermediate that only `next` reads, written once and
    /// not kept: a link a fused kernel can keep in registers.
    fn private_link(&self, graph: &Graph, keep: &[BufferId], prev: &Step, next: &Step) -> bool {
        let Some(o) = prev.outputs.first() else {
            return false;
        };
        let b = o.buffer;
        graph.buffers()[b.0].role == BufferRole::Intermediate
            && !keep.contains(&b)
            && self.reads.get(&b) == Some(&1)
            && self.writes.get(&b) == Some(&1)
            && o.layout.offset() == 0
            && next.inputs.iter().any(|i| i.buffer == b)
            && !next.outputs.iter().any(|x| x.buffer == b)
    }
}

/// Fuses every matmul (with `beta = 0`) that is followed by elementwise steps reading its
/// result into one `matmul_epilogue` step; returns the new steps and how many were fused.
/// `keep` are buffers that must stay materialised (the graph's outputs).
pub(crate) fn fuse_epilogues(
    graph: &Graph,
    steps: Vec<Step>,
    keep: &[BufferId],
) -> Result<(Vec<Step>, usize)> {
    let uses = Uses::of(&steps);
    let device = graph.device();
    let mut out = Vec::with_capacity(steps.len());
    let mut fused = 0;
    let mut i = 0;
    while i < steps.len() {
        let mut chain = Epilogue::start(&steps[i], device);
        let mut j = i + 1;
        if let Some(c) = &mut chain {
            while j < steps.len()
                && uses.private_link(graph, keep, &steps[j - 1], &steps[j])
                && c.push(&steps[j - 1], &steps[j])
            {
                j += 1;
            }
        }
        let step = match chain.filter(|_| j > i + 1) {
            Some(c) => c.finish(&steps[i..j], device)?,
            None => None,
        };
        match step {
            Some(step) => {
                out.push(step);
                fused += 1;
                i = j;
            }
            None => {
                out.push(steps[i].clone());
                i += 1;
            }
        }
    }
    Ok((out, fused))
}

/// A matmul's epilogue as it grows, step by step.
struct Epilogue {
    alpha: f64,
    /// The product's shape and dtype: every step's.
    shape: Vec<usize>,
    dtype: crate::tensor::DType,
    extras: Vec<Operand>,
    program: FusedProgram,
}

impl Epilogue {
    /// The start of an epilogue at `step`, if it is a matmul that can have one here.
    fn start(step: &Step, device: crate::Device) -> Option<Epilogue> {
        let NodeKind::Op(plan) = &step.kind else {
            return None;
        };
        let Params::Matmul { alpha, beta } = *plan.params() else {
            return None;
        };
        let [out] = step.outputs.as_slice() else {
            return None;
        };
        let registered = crate::ops::is_registered(MATMUL_EPILOGUE, device.kind, out.dtype);
        (plan.op() == "matmul" && beta == 0.0 && registered).then(|| Epilogue {
            alpha,
            shape: out.layout.shape().to_vec(),
            dtype: out.dtype,
            extras: Vec::new(),
            program: FusedProgram::default(),
        })
    }

    /// Adds `next`, which reads `prev`'s result, if it is an elementwise step that fits (its
    /// other operands within [`MAX_EPILOGUE_OPERANDS`], the program within
    /// [`MAX_FUSED_STEPS`]).
    fn push(&mut self, prev: &Step, next: &Step) -> bool {
        // As long as one kernel runs: the rest of the chain fuses on its own.
        if self.program.steps.len() >= MAX_FUSED_STEPS {
            return false;
        }
        let Some(op) = as_epilogue_op(next, &self.shape, self.dtype) else {
            return false;
        };
        let link = &prev.outputs[0];
        let here = match self.program.steps.len() {
            0 => FusedSrc::Input(0),
            n => FusedSrc::Step(n - 1),
        };
        let mut extras = self.extras.clone();
        let mut src = |o: &Operand| -> FusedSrc {
            if o == link {
                return here;
            }
            let k = extras.iter().position(|x| x == o).unwrap_or_else(|| {
                extras.push(o.clone());
                extras.len() - 1
            });
            FusedSrc::Input(1 + k)
        };
        let a = src(&next.inputs[0]);
        let b = next.inputs.get(1).map(&mut src);
        let step = match (op, b) {
            (ElementOp::Unary(u), None) => FusedStep::Unary(u, a),
            (ElementOp::Scalar(o, s), None) => FusedStep::Scalar(o, a, s),
            (ElementOp::Binary(o), Some(b)) => FusedStep::Binary(o, a, b),
            (ElementOp::Swiglu, Some(b)) => FusedStep::Swiglu(a, b),
            _ => return false,
        };
        // The link is read as itself only: no other view of its (never stored) buffer.
        if extras.len() > MAX_EPILOGUE_OPERANDS || extras.iter().any(|x| x.buffer == link.buffer) {
            return false;
        }
        self.extras = extras;
        self.program.steps.push(step);
        true
    }

    /// The fused step for `chain` (the matmul and the steps pushed), or `None` where the
    /// device cannot plan it or the output would overwrite an operand it still reads.
    fn finish(self, chain: &[Step], device: crate::Device) -> Result<Option<Step>> {
        let (mm, last) = (&chain[0], &chain[chain.len() - 1]);
        let out = &last.outputs[0];
        let mut inputs = mm.inputs.clone();
        inputs.extend(self.extras.iter().cloned());
        if inputs.iter().any(|i| i.buffer == out.buffer) {
            return Ok(None);
        }
        let descs: Vec<_> = self.extras.iter().map(|o| o.desc(device)).collect();
        let plan = match matmul_epilogue(
            &mm.inputs[0].desc(device),
            &mm.inputs[1].desc(device),
            &descs,
            self.alpha,
            self.program,
            &out.desc(device),
        ) {
            Ok(p) => p,
            Err(crate::Error::Unsupported { .. } | crate::Error::UnsupportedKernel { .. }) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        Ok(Some(Step {
            kind: NodeKind::Op(plan),
            inputs,
            outputs: last.outputs.clone(),
            nodes: chain.iter().flat_map(|s| s.nodes.iter().copied()).collect(),
            unsafe_reason: None,
        }))
    }
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
