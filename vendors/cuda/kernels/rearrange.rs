//! Plans the rearrange kernels (`rearrange.cu`): a strided copy, and concat as one copy per
//! input into its slice of the output.

use std::sync::Arc;

use super::args::{blocks, strides_of, Space, BLOCK};
use super::prepared::{prepare as ready, Operand, Step};
use super::{unexpected, Family};
use crate::error::Result;
use crate::ops::{Params, PlanSpec, PreparedKernel};
use crate::tensor::DType;

pub(super) const FAMILY: Family = Family {
    name: "rearrange",
    text: include_str!("rearrange.cu"),
    ops: &["rearrange", "concat"],
    dtypes: &DType::ALL,
    entries: &["op_rearrange", "op_concat"],
    prepare,
    params: (2, 26),
    source_dtype: super::by_size,
};

fn copy_step(
    entry: &str,
    shape: &[usize],
    out: Vec<i64>,
    inp: Vec<i64>,
    at: i64,
    input: usize,
) -> Result<Step> {
    let space = Space::new(entry, shape, &[out, inp])?;
    let mut step = Step::new(
        entry,
        [blocks(space.count(), BLOCK as i64), 1, 1],
        [BLOCK, 1, 1],
    );
    step.ptrs = vec![Operand::Out(0, at), Operand::In(input)];
    step.args
        .space(&space)
        .strides(&space, 0)
        .strides(&space, 1);
    Ok(step)
}

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let [out] = spec.outputs else {
        return Err(unexpected(spec, FAMILY.name));
    };
    let steps = match (spec.op, spec.params) {
        ("rearrange", _) if spec.inputs.len() == 1 => vec![copy_step(
            "op_rearrange",
            out.layout.shape(),
            strides_of(&out.layout),
            strides_of(&spec.inputs[0].layout),
            0,
            0,
        )?],
        ("concat", Params::Concat { axis }) => {
            let mut at = 0i64;
            let mut steps = Vec::new();
            let ost = strides_of(&out.layout);
            for (i, x) in spec.inputs.iter().enumerate() {
                let len = x.layout.shape().get(*axis).copied().unwrap_or(0);
                if x.layout.numel() > 0 {
                    steps.push(copy_step(
                        "op_concat",
                        x.layout.shape(),
                        ost.clone(),
                        strides_of(&x.layout),
                        at * ost.get(*axis).copied().unwrap_or(0),
                        i,
                    )?);
                }
                at += len as i64;
            }
            steps
        }
        _ => return Err(unexpected(spec, FAMILY.name)),
    };
    ready(spec, &FAMILY, spec.dtype, steps)
}
