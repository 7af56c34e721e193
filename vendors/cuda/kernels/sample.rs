//! Plans the random_sample kernel (`sample.cu`): one block per row of logits.

use std::sync::Arc;

use super::args::{blocks, Space};
use super::prepared::{prepare as ready, Operand, Step};
use super::{unexpected, Family, FLOATS};
use crate::error::Result;
use crate::ops::{Params, PlanSpec, PreparedKernel};

pub(super) const FAMILY: Family = Family {
    name: "sample",
    text: include_str!("sample.cu"),
    ops: &["random_sample"],
    dtypes: FLOATS,
    entries: &["op_random_sample"],
    prepare,
    params: (2, 24),
    source_dtype: super::own_source,
};

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let (
        Params::Sample {
            random,
            temperature,
            top_k,
            top_p,
        },
        [x],
        [_out],
    ) = (spec.params, spec.inputs, spec.outputs)
    else {
        return Err(unexpected(spec, FAMILY.name));
    };
    let shape = x.layout.shape();
    let nd = shape.len();
    let xt = x.layout.strides();
    // The output is contiguous: row r is element r.
    let rows = Space::new(
        "random_sample",
        &shape[..nd - 1],
        &[xt[..nd - 1].iter().map(|&s| s as i64).collect()],
    )?;
    let mut step = Step::new(
        "op_random_sample",
        [blocks(rows.count(), 1), 1, 1],
        [256, 1, 1],
    );
    step.ptrs = vec![Operand::Out(0, 0), Operand::In(0)];
    step.args
        .space(&rows)
        .strides(&rows, 0)
        .int(shape[nd - 1])
        .int(xt[nd - 1])
        .float(*random)
        .float(*temperature)
        .float(*top_p)
        .int(*top_k);
    ready(spec, &FAMILY, spec.dtype, vec![step])
}
