//! Plans the matmul kernel (`matmul.cu`): 64×64 output tiles (grid x over columns, y over
//! rows, z over the broadcast batch), any strides.

use std::sync::Arc;

use super::args::Space;
use super::prepared::{prepare as ready, Operand, Step};
use super::{unexpected, Family, FLOATS};
use crate::error::Result;
use crate::ops::{Params, PlanSpec, PreparedKernel, TensorDesc};

pub(super) const FAMILY: Family = Family {
    name: "matmul",
    text: include_str!("matmul.cu"),
    ops: &["matmul"],
    dtypes: FLOATS,
    entries: &["op_matmul"],
    prepare,
    source_dtype: super::own_source,
};

const TILE: usize = 64;

/// `t`'s batch strides aligned to `batch` (0 where it broadcasts).
fn batch_strides(batch: &[usize], t: &TensorDesc) -> Vec<i64> {
    let (s, st) = (t.layout.shape(), t.layout.strides());
    let own = s.len() - 2;
    let skip = batch.len() - own.min(batch.len());
    (0..batch.len())
        .map(|d| {
            if d < skip || s[d - skip] == 1 {
                0
            } else {
                st[d - skip] as i64
            }
        })
        .collect()
}

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let (Params::Matmul { alpha, beta }, [a, b], [c]) = (spec.params, spec.inputs, spec.outputs)
    else {
        return Err(unexpected(spec, FAMILY.name));
    };
    let cs = c.layout.shape();
    let nd = cs.len();
    let (m, n) = (cs[nd - 2], cs[nd - 1]);
    let k = a.layout.shape()[a.layout.shape().len() - 1];
    let batch = &cs[..nd - 2];
    let space = Space::new(
        "matmul",
        batch,
        &[
            batch_strides(batch, a),
            batch_strides(batch, b),
            batch_strides(batch, c),
        ],
    )?;
    let two = |t: &TensorDesc| {
        let st = t.layout.strides();
        (st[st.len() - 2] as i64, st[st.len() - 1] as i64)
    };
    let ((a_sm, a_sk), (b_sk, b_sn), (c_sm, c_sn)) = (two(a), two(b), two(c));
    let grid = [
        n.div_ceil(TILE).clamp(1, i32::MAX as usize) as u32,
        m.div_ceil(TILE).clamp(1, 65535) as u32,
        space.count().clamp(1, 65535) as u32,
    ];
    let mut step = Step::new("op_matmul", grid, [256, 1, 1]);
    step.ptrs = vec![Operand::In(0), Operand::In(1), Operand::Out(0, 0)];
    step.args
        .space(&space)
        .strides(&space, 0)
        .strides(&space, 1)
        .strides(&space, 2);
    for v in [
        m as i64, n as i64, k as i64, a_sm, a_sk, b_sk, b_sn, c_sm, c_sn,
    ] {
        step.args.int(v);
    }
    step.args.float(*alpha).float(*beta);
    if m.div_ceil(TILE) > 65535 {
        return Err(crate::Error::unsupported(
            format!(
                "matmul with {m} rows (the CUDA kernel takes up to {} rows)",
                65535 * TILE
            ),
            crate::DeviceKind::Cuda,
        ));
    }
    ready(spec, &FAMILY, spec.dtype, vec![step])
}
