//! Plans the elementwise kernels (`elementwise.cu`): one grid-stride launch over the output's
//! (coalesced) shape, every input's strides broadcast to it.

use std::sync::Arc;

use super::args::{broadcast, Space, BLOCK};
use super::prepared::{prepare as ready, Operand, Step};
use super::{unexpected, Family, FLOATS};
use crate::error::Result;
use crate::ops::{Params, PlanSpec, PreparedKernel};

pub(super) const FAMILY: Family = Family {
    name: "elementwise",
    text: include_str!("elementwise.cu"),
    ops: OPS,
    dtypes: FLOATS,
    entries: ENTRIES,
    prepare,
    params: (4, 43),
    source_dtype: super::own_source,
};

const OPS: &[&str] = &[
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "pow",
    "add_scalar",
    "sub_scalar",
    "mul_scalar",
    "div_scalar",
    "maximum_scalar",
    "minimum_scalar",
    "pow_scalar",
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
    "gelu",
    "gelu_tanh",
    "silu",
    "swiglu",
    "where",
    "masked_fill",
];

const ENTRIES: &[&str] = &[
    "op_add",
    "op_sub",
    "op_mul",
    "op_div",
    "op_maximum",
    "op_minimum",
    "op_pow",
    "op_add_scalar",
    "op_sub_scalar",
    "op_mul_scalar",
    "op_div_scalar",
    "op_maximum_scalar",
    "op_minimum_scalar",
    "op_pow_scalar",
    "op_neg",
    "op_abs",
    "op_exp",
    "op_log",
    "op_sqrt",
    "op_rsqrt",
    "op_sin",
    "op_cos",
    "op_tanh",
    "op_sigmoid",
    "op_relu",
    "op_gelu",
    "op_gelu_tanh",
    "op_silu",
    "op_swiglu",
    "op_where",
    "op_masked_fill",
];

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    if !OPS.contains(&spec.op) || spec.outputs.len() != 1 || spec.inputs.len() > 3 {
        return Err(unexpected(spec, FAMILY.name));
    }
    let out = &spec.outputs[0];
    let shape = out.layout.shape();
    let mut strides = vec![out.layout.strides().iter().map(|&s| s as i64).collect()];
    for i in 0..3 {
        strides.push(match spec.inputs.get(i) {
            Some(d) => broadcast(shape, &d.layout),
            None => vec![0; shape.len()],
        });
    }
    let space = Space::new(spec.op, shape, &strides)?;
    let scalar = match spec.params {
        Params::Scalar(s) => *s,
        _ => 0.0,
    };
    // The kernels move 16 bytes per access over dense operands (not where / masked_fill, whose
    // operands differ in size); the grid is sized for that.
    let vector = match spec.op {
        "where" | "masked_fill" => 1,
        _ => (16 / spec.dtype.size()) as i64,
    };
    let mut step = Step::new(
        format!("op_{}", spec.op),
        [space.grid(1 + spec.inputs.len(), vector), 1, 1],
        [BLOCK, 1, 1],
    );
    step.ptrs.push(Operand::Out(0, 0));
    // Unused input slots repeat the first input (never read).
    for i in 0..3 {
        step.ptrs
            .push(Operand::In(i.min(spec.inputs.len().saturating_sub(1))));
    }
    step.args.space(&space);
    for i in 0..4 {
        step.args.strides(&space, i);
    }
    step.args.float(scalar);
    ready(spec, &FAMILY, spec.dtype, vec![step])
}
