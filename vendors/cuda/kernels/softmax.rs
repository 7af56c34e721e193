//! Plans the softmax kernels (`softmax.cu`): one block per lane along the axis.

use std::sync::Arc;

use super::args::{blocks, row_threads, Space, ROW_PER_THREAD};
use super::prepared::{prepare as ready, Operand, Step};
use super::{unexpected, Family, FLOATS};
use crate::error::Result;
use crate::ops::{Params, PlanSpec, PreparedKernel};

pub(super) const FAMILY: Family = Family {
    name: "softmax",
    text: include_str!("softmax.cu"),
    ops: &["softmax", "log_softmax", "causal_softmax"],
    dtypes: FLOATS,
    entries: &["op_softmax"],
    prepare,
    params: (2, 33),
    source_dtype: super::own_source,
};

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let (Params::Softmax { axis, log, causal }, [x], [out]) =
        (spec.params, spec.inputs, spec.outputs)
    else {
        return Err(unexpected(spec, FAMILY.name));
    };
    let shape = x.layout.shape();
    let nd = shape.len();
    let (xt, ot) = (x.layout.strides(), out.layout.strides());
    let (mut dims, mut so, mut si) = (vec![], vec![], vec![]);
    for d in (0..nd).filter(|d| d != axis) {
        dims.push(shape[d]);
        so.push(ot[d] as i64);
        si.push(xt[d] as i64);
    }
    let outer = Space::new(spec.op, &dims, &[so, si])?;
    let q_len = if nd >= 2 { shape[nd - 2].max(1) } else { 1 };
    let mut step = Step::new(
        "op_softmax",
        [blocks(outer.count(), 1), 1, 1],
        [row_threads(shape[*axis], ROW_PER_THREAD), 1, 1],
    );
    step.ptrs = vec![Operand::Out(0, 0), Operand::In(0)];
    step.args
        .space(&outer)
        .strides(&outer, 0)
        .strides(&outer, 1)
        .int(shape[*axis])
        .int(ot[*axis])
        .int(xt[*axis])
        .int(i64::from(causal.is_some()))
        .int(q_len)
        .int(causal.unwrap_or(0))
        .int(i64::from(*log));
    ready(spec, &FAMILY, spec.dtype, vec![step])
}
