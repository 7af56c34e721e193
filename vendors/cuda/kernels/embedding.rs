//! Plans the embedding kernels (`embedding.cu`): one thread per output element; the ids'
//! dtype (i32 / i64) picks the entry. An id outside the table claims the plan's fault word,
//! which the stream's next synchronisation reports (`vendors/cuda/fault.rs`).

use std::sync::Arc;

use super::args::{blocks, strides_of, Space, BLOCK};
use super::prepared::{prepare_checked, Operand, Step};
use super::{unexpected, Family, FLOATS};
use crate::error::Result;
use crate::ops::{PlanSpec, PreparedKernel};

pub(super) const FAMILY: Family = Family {
    name: "embedding",
    text: include_str!("embedding.cu"),
    ops: &["embedding"],
    dtypes: FLOATS,
    entries: &["op_embedding_i32", "op_embedding_i64"],
    prepare,
    params: (4, 31),
    source_dtype: super::own_source,
};

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let ([ids, table], [out]) = (spec.inputs, spec.outputs) else {
        return Err(unexpected(spec, FAMILY.name));
    };
    let ot = strides_of(&out.layout);
    let nd = ot.len();
    let space = Space::new(
        "embedding",
        ids.layout.shape(),
        &[strides_of(&ids.layout), ot[..nd - 1].to_vec()],
    )?;
    let (vocab, dim) = (table.layout.shape()[0], table.layout.shape()[1]);
    let tt = table.layout.strides();
    let total = space.count() * dim as i64;
    let mut step = Step::new(
        format!("op_embedding_{}", ids.dtype),
        [blocks(total, BLOCK as i64), 1, 1],
        [BLOCK, 1, 1],
    );
    step.ptrs = vec![
        Operand::Out(0, 0),
        Operand::In(0),
        Operand::In(1),
        Operand::Fault,
    ];
    step.args
        .space(&space)
        .strides(&space, 0)
        .strides(&space, 1)
        .int(vocab)
        .int(dim)
        .int(tt[0])
        .int(tt[1])
        .int(ot[nd - 1]);
    let wide = ids.dtype == crate::tensor::DType::I64;
    prepare_checked(spec, &FAMILY, spec.dtype, vec![step], vocab as u64, wide)
}
