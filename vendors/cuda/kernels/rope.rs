//! Plans the rope kernels (`rope.cu`): a block per position, its angles formed once; the
//! positions' dtype (i32 / i64) picks the entry.

use std::sync::Arc;

use super::args::{blocks, Space, BLOCK};
use super::prepared::{prepare as ready, Operand, Step};
use super::{unexpected, Family, FLOATS};
use crate::error::Result;
use crate::ops::{Params, PlanSpec, PreparedKernel};

pub(super) const FAMILY: Family = Family {
    name: "rope",
    text: include_str!("rope.cu"),
    ops: &["rope"],
    dtypes: FLOATS,
    entries: &["op_rope_i32", "op_rope_i64"],
    prepare,
    params: (3, 34),
    source_dtype: super::own_source,
};

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let (Params::Rope { interleaved, theta }, [x, pos], [out]) =
        (spec.params, spec.inputs, spec.outputs)
    else {
        return Err(unexpected(spec, FAMILY.name));
    };
    let shape = x.layout.shape();
    let nd = shape.len();
    let (xt, ot) = (x.layout.strides(), out.layout.strides());
    let rows = Space::new(
        "rope",
        &shape[..nd - 1],
        &[
            ot[..nd - 1].iter().map(|&s| s as i64).collect(),
            xt[..nd - 1].iter().map(|&s| s as i64).collect(),
        ],
    )?;
    let half = shape[nd - 1] / 2;
    // A block per (.., position) group of rows (every head of one position; grid-stride past
    // the grid's limit).
    let groups = rows.count() / (shape[nd - 2].max(1) as i64);
    let mut step = Step::new(
        format!("op_rope_{}", pos.dtype),
        [blocks(groups, 1), 1, 1],
        [BLOCK, 1, 1],
    );
    step.ptrs = vec![Operand::Out(0, 0), Operand::In(0), Operand::In(1)];
    step.args
        .space(&rows)
        .strides(&rows, 0)
        .strides(&rows, 1)
        .int(shape[nd - 3])
        .int(shape[nd - 2])
        .int(half)
        .int(xt[nd - 1])
        .int(ot[nd - 1])
        .int(pos.layout.strides()[0])
        .int(i64::from(*interleaved))
        .float(*theta);
    ready(spec, &FAMILY, spec.dtype, vec![step])
}
