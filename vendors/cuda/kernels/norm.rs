//! Plans the norm kernels (`norm.cu`): one block per row of the last dimension.

use std::sync::Arc;

use super::args::{blocks, row_threads, Space};
use super::prepared::{prepare as ready, Operand, Step};
use super::{unexpected, Family, FLOATS};
use crate::error::Result;
use crate::ops::{Params, PlanSpec, PreparedKernel};

pub(super) const FAMILY: Family = Family {
    name: "norm",
    text: include_str!("norm.cu"),
    ops: &["rms_norm", "layer_norm"],
    dtypes: FLOATS,
    entries: &["op_rms_norm", "op_layer_norm"],
    prepare,
    params: (4, 32),
    source_dtype: super::own_source,
};

/// Bytes of its row each thread of `op_rms_norm` holds in registers (`RAW_PACKS` 16-byte
/// packs, norm.cu): the block is sized so the row fits.
const RAW_ROW_BYTES: usize = 64;

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let (Params::Norm { eps }, [out]) = (spec.params, spec.outputs) else {
        return Err(unexpected(spec, FAMILY.name));
    };
    let (x, w) = match spec.inputs {
        [x, w] | [x, w, _] => (x, w),
        _ => return Err(unexpected(spec, FAMILY.name)),
    };
    let b = spec.inputs.get(2).unwrap_or(w);
    let shape = x.layout.shape();
    let nd = shape.len();
    let (xt, ot) = (x.layout.strides(), out.layout.strides());
    let rows = Space::new(
        spec.op,
        &shape[..nd - 1],
        &[
            ot[..nd - 1].iter().map(|&s| s as i64).collect(),
            xt[..nd - 1].iter().map(|&s| s as i64).collect(),
        ],
    )?;
    let mut step = Step::new(
        format!("op_{}", spec.op),
        [blocks(rows.count(), 1), 1, 1],
        // layer_norm walks the row, any block size.
        [
            row_threads(shape[nd - 1], RAW_ROW_BYTES / spec.dtype.size()),
            1,
            1,
        ],
    );
    // rms_norm has no bias: the weight stands in (never read).
    let bias = if spec.inputs.len() == 3 { 2 } else { 1 };
    step.ptrs = vec![
        Operand::Out(0, 0),
        Operand::In(0),
        Operand::In(1),
        Operand::In(bias),
    ];
    step.args
        .space(&rows)
        .strides(&rows, 0)
        .strides(&rows, 1)
        .int(shape[nd - 1])
        .int(xt[nd - 1])
        .int(ot[nd - 1])
        .int(w.layout.strides()[0])
        .int(b.layout.strides()[0])
        .float(*eps);
    ready(spec, &FAMILY, spec.dtype, vec![step])
}
