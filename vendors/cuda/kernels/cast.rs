//! Plans the cast kernels (`cast.cu`): the source dtype picks the generated source, the
//! destination dtype the entry.

use std::sync::Arc;

use super::args::{Space, BLOCK};
use super::prepared::{prepare as ready, Operand, Step};
use super::{unexpected, Family};
use crate::error::Result;
use crate::ops::{Params, PlanSpec, PreparedKernel};
use crate::tensor::DType;

pub(super) const FAMILY: Family = Family {
    name: "cast",
    text: include_str!("cast.cu"),
    ops: &["cast"],
    dtypes: &DType::ALL,
    entries: &[
        "op_cast_to_f32",
        "op_cast_to_f16",
        "op_cast_to_bf16",
        "op_cast_to_i32",
        "op_cast_to_i64",
        "op_cast_to_u8",
        "op_cast_to_bool",
    ],
    prepare,
    params: (2, 26),
    source_dtype: cast_source,
};

/// Bool is stored as bytes 0/1: u8's kernels read it.
fn cast_source(dtype: DType) -> DType {
    match dtype {
        DType::Bool => DType::U8,
        d => d,
    }
}

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let (Params::Cast { to }, [x], [out]) = (spec.params, spec.inputs, spec.outputs) else {
        return Err(unexpected(spec, FAMILY.name));
    };
    let space = Space::new(
        "cast",
        out.layout.shape(),
        &[
            super::args::strides_of(&out.layout),
            super::args::strides_of(&x.layout),
        ],
    )?;
    // Dense casts convert four elements a thread (cast.cu's CAST_VEC).
    let mut step = Step::new(
        format!("op_cast_to_{to}"),
        [space.grid(2, 4), 1, 1],
        [BLOCK, 1, 1],
    );
    step.ptrs = vec![Operand::Out(0, 0), Operand::In(0)];
    step.args
        .space(&space)
        .strides(&space, 0)
        .strides(&space, 1);
    ready(spec, &FAMILY, spec.dtype, vec![step])
}
