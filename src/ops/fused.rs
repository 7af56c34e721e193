//! `fused_elementwise`: a chain of elementwise operators run as one kernel, as a
//! [`CapturePlan`](crate::graph::CapturePlan) makes it from consecutive elementwise operators.
//!
//! The chain is a [`FusedProgram`]: steps over the kernel's inputs and earlier steps' results,
//! the last step being the output. Every operand has the output's shape and is contiguous (the
//! planner fuses nothing else). Each step rounds its result to the dtype exactly as the
//! unfused operator stores it, so a fused chain gives bitwise the unfused result. The output
//! may not overlap an input.
//!
//! A backend runs fused chains once it registers a `fused_elementwise` kernel for the dtype.
//! All three do, each generating its kernel from the program: the CPU runs the steps' own
//! block functions over cache-sized blocks, wgpu and CUDA generate WGSL and CUDA C that call
//! the unfused operators' own functions, keeping every step's result opaque to the shader or
//! NVRTC compiler (no contraction across steps). Where none is registered, the planner simply
//! does not fuse.

use std::sync::Arc;

use super::{
    out_desc, same_device_dtype, BinaryOp, Params, Plan, PlanBuilder, TensorDesc, UnaryOp,
};
use crate::error::{Error, Result};
use crate::tensor::Layout;

/// The registry name of the fused operator.
pub const FUSED_ELEMENTWISE: &str = "fused_elementwise";

/// The most inputs one fused kernel takes on every backend (the planner fuses no wider
/// chain): a wgpu operator kernel binds at most eight tensors, the output included.
pub const MAX_FUSED_INPUTS: usize = 7;

/// The most steps one fused kernel runs (the planner splits a longer chain into kernels of at
/// most this many): each step is code in the generated kernel, and the shader compilers'
/// time grows faster than the code — a chain of 20 000 steps fused whole kept lavapipe's and
/// llvmpipe's compilers busy for minutes, and GPU register pressure grows with it too.
pub const MAX_FUSED_STEPS: usize = 64;

/// Where a step reads an operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedSrc {
    /// The kernel's input `i`.
    Input(usize),
    /// The result of step `i` (an earlier step).
    Step(usize),
}

/// One operator of a fused chain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FusedStep {
    Unary(UnaryOp, FusedSrc),
    Binary(BinaryOp, FusedSrc, FusedSrc),
    /// `src op scalar` (the `*_scalar` operators).
    Scalar(BinaryOp, FusedSrc, f64),
    /// `up · silu(gate)`.
    Swiglu(FusedSrc, FusedSrc),
}

impl FusedStep {
    /// The operands the step reads.
    pub fn sources(&self) -> Vec<FusedSrc> {
        match *self {
            FusedStep::Unary(_, a) | FusedStep::Scalar(_, a, _) => vec![a],
            FusedStep::Binary(_, a, b) | FusedStep::Swiglu(a, b) => vec![a, b],
        }
    }

    /// The step in `f64` (the reference of conformance checks).
    pub fn eval(&self, read: impl Fn(FusedSrc) -> f64) -> f64 {
        match *self {
            FusedStep::Unary(op, a) => op.eval(read(a)),
            FusedStep::Binary(op, a, b) => op.eval(read(a), read(b)),
            FusedStep::Scalar(op, a, s) => op.eval(read(a), s),
            FusedStep::Swiglu(u, g) => {
                let (u, g) = (read(u), read(g));
                u * g / (1.0 + (-g).exp())
            }
        }
    }
}

/// A chain of elementwise steps; the last step is the output.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FusedProgram {
    pub steps: Vec<FusedStep>,
}

impl FusedProgram {
    /// Checks that every step reads an existing input or an earlier step.
    pub fn validate(&self, inputs: usize) -> Result<()> {
        if self.steps.is_empty() {
            return Err(Error::BadParam(format!(
                "{FUSED_ELEMENTWISE}: an empty program"
            )));
        }
        if self.steps.len() > MAX_FUSED_STEPS {
            return Err(Error::BadParam(format!(
                "{FUSED_ELEMENTWISE}: {} steps (at most {MAX_FUSED_STEPS} in one kernel)",
                self.steps.len()
            )));
        }
        for (i, s) in self.steps.iter().enumerate() {
            for src in s.sources() {
                let ok = match src {
                    FusedSrc::Input(k) => k < inputs,
                    FusedSrc::Step(k) => k < i,
                };
                if !ok {
                    return Err(Error::BadParam(format!(
                        "{FUSED_ELEMENTWISE}: step {i} reads {src:?}, which does not exist yet"
                    )));
                }
            }
        }
        Ok(())
    }
}

impl FusedProgram {
    /// A program calling every elementwise function once, each after a multiply and an add it
    /// could be contracted with: `t = |a·b| + 0.5`, every unary function of `t`, every binary
    /// function of `t` and `b` and of `t` and a scalar, and SwiGLU of `t` gated by `a`, summed
    /// (inputs `a`, `b`). Conformance checks it bitwise against the operators run one by one;
    /// the CUDA ahead-of-time build compiles it.
    pub fn every_function() -> FusedProgram {
        let mut steps = vec![
            FusedStep::Binary(BinaryOp::Mul, FusedSrc::Input(0), FusedSrc::Input(1)),
            FusedStep::Unary(UnaryOp::Abs, FusedSrc::Step(0)),
            FusedStep::Scalar(BinaryOp::Add, FusedSrc::Step(1), 0.5),
        ];
        let base = FusedSrc::Step(2);
        let mut terms = Vec::new();
        let mut push = |steps: &mut Vec<FusedStep>, s| {
            steps.push(s);
            terms.push(steps.len() - 1);
        };
        for u in UnaryOp::ALL {
            push(&mut steps, FusedStep::Unary(u, base));
        }
        for o in BinaryOp::ALL {
            push(&mut steps, FusedStep::Binary(o, base, FusedSrc::Input(1)));
            push(&mut steps, FusedStep::Scalar(o, base, 1.25));
        }
        push(&mut steps, FusedStep::Swiglu(base, FusedSrc::Input(0)));
        let mut terms = terms.into_iter();
        if let Some(mut acc) = terms.next() {
            for t in terms {
                steps.push(FusedStep::Binary(
                    BinaryOp::Add,
                    FusedSrc::Step(acc),
                    FusedSrc::Step(t),
                ));
                acc = steps.len() - 1;
            }
        }
        FusedProgram { steps }
    }
}

/// A device kernel's view of a `fused_elementwise` plan: its program and output, checked to be
/// what [`fused_elementwise`] plans (a program, at most [`MAX_FUSED_INPUTS`] inputs, one output)
/// — an internal error otherwise.
pub(crate) fn planned<'a>(
    spec: &'a super::PlanSpec<'_>,
) -> Result<(&'a FusedProgram, &'a TensorDesc)> {
    let Params::Fused(prog) = spec.params else {
        return Err(Error::Internal(format!(
            "{}: unexpected parameters {:?}",
            spec.op, spec.params
        )));
    };
    let out = spec
        .outputs
        .first()
        .ok_or_else(|| Error::Internal(format!("{}: no output", spec.op)))?;
    if spec.inputs.len() > MAX_FUSED_INPUTS || prog.steps.is_empty() {
        return Err(Error::Internal(format!(
            "{}: {} inputs, {} steps (unchecked program)",
            spec.op,
            spec.inputs.len(),
            prog.steps.len()
        )));
    }
    Ok((prog, out))
}

/// Plans `program` over `inputs`: all of one device and dtype, contiguous, of one shape (the
/// output's).
pub fn fused_elementwise(inputs: &[TensorDesc], program: FusedProgram) -> Result<Plan> {
    let refs: Vec<&TensorDesc> = inputs.iter().collect();
    let (device, dtype) = same_device_dtype(FUSED_ELEMENTWISE, &refs)?;
    program.validate(inputs.len())?;
    if inputs.len() > MAX_FUSED_INPUTS {
        return Err(Error::BadParam(format!(
            "{FUSED_ELEMENTWISE}: {} inputs (at most {MAX_FUSED_INPUTS})",
            inputs.len()
        )));
    }
    let shape = inputs[0].shape().to_vec();
    for d in inputs {
        if d.shape() != shape || d.layout.strides() != Layout::contiguous(&shape).strides() {
            return Err(Error::BadParam(format!(
                "{FUSED_ELEMENTWISE}: every input must be contiguous with shape {shape:?}, got {:?}",
                d.layout
            )));
        }
    }
    let mut p = PlanBuilder::new(FUSED_ELEMENTWISE, dtype, inputs.to_vec());
    p.outputs = vec![out_desc(device, dtype, &shape)];
    p.params = Params::Fused(Arc::new(program));
    p.build()
}
