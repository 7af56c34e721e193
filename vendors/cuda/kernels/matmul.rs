//! Plans the matmul kernel (`matmul.cu`): 64×64 output tiles (grid x over columns, y over
//! rows, z over the broadcast batch), any strides.

use std::sync::Arc;

use super::args::Space;
use super::prepared::{prepare as ready, with_backend, Operand, Step};
use super::{unexpected, Family, FLOATS};
use crate::error::Result;
use crate::ops::{Params, PlanSpec, PreparedKernel, TensorDesc};
use crate::vendors::cuda::blas::{self, Gemm};

pub(super) const FAMILY: Family = Family {
    name: "matmul",
    text: include_str!("matmul.cu"),
    ops: &["matmul"],
    dtypes: FLOATS,
    entries: &["op_matmul"],
    prepare,
    params: (3, 45),
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

/// The cuBLAS call computing this matmul, when the layouts fit one: row-major `C = A·B` is
/// column-major `Cᵀ = Bᵀ·Aᵀ`, so cuBLAS sees (B, A) with m and n swapped; each matrix needs a
/// unit stride in one of its two dimensions, C in its columns, and the batch at most one
/// evenly strided dimension.
#[allow(clippy::too_many_arguments)]
fn blas_gemm(
    spec: &PlanSpec<'_>,
    space: &Space,
    (m, n, k): (usize, usize, usize),
    (a_sm, a_sk): (i64, i64),
    (b_sk, b_sn): (i64, i64),
    (c_sm, c_sn): (i64, i64),
    alpha: f64,
    beta: f64,
) -> Option<Gemm> {
    let dtype = blas::data_type(spec.dtype)?;
    // An empty product (k = 0: C = β·C) is unirt's own kernel's: cuBLAS refuses the leading
    // dimensions of an empty operand (CUBLAS_STATUS_INVALID_VALUE on an H100).
    if m == 0 || n == 0 || k == 0 {
        return None;
    }
    let fits = |v: usize| i32::try_from(v.max(1)).ok();
    let (m32, n32, k32) = (fits(m)?, fits(n)?, fits(k)?);
    // A dimension of size 1 has no stride that matters.
    let unit = |stride: i64, size: usize| stride == 1 || size == 1;
    let ld = |stride: i64, need: i32| i32::try_from(stride.max(need as i64)).ok();
    if !unit(c_sn, n) {
        return None;
    }
    let ldc = ld(c_sm, n32)?;
    // cuBLAS's first operand: our B as an n×k (column-major view).
    let (trans_a, lda) = if unit(b_sn, n) {
        (blas::OP_N, ld(b_sk, n32)?)
    } else if unit(b_sk, k) {
        (blas::OP_T, ld(b_sn, k32)?)
    } else {
        return None;
    };
    // Its second: our A as k×m.
    let (trans_b, ldb) = if unit(a_sk, k) {
        (blas::OP_N, ld(a_sm, k32)?)
    } else if unit(a_sm, m) {
        (blas::OP_T, ld(a_sk, m32)?)
    } else {
        return None;
    };
    let (batch, sa, sb, sc) = match space.dims.len() {
        0 => (1, 0, 0, 0),
        1 => (
            i32::try_from(space.dims[0]).ok()?,
            space.strides[0][0],
            space.strides[1][0],
            space.strides[2][0],
        ),
        _ => return None,
    };
    Some(Gemm {
        trans_a,
        trans_b,
        m: n32,
        n: m32,
        k: k32,
        lda,
        ldb,
        ldc,
        stride_a: sb,
        stride_b: sa,
        stride_c: sc,
        batch,
        dtype,
        alpha: alpha as f32,
        beta: beta as f32,
    })
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
    if let Some(g) = blas_gemm(
        spec,
        &space,
        (m, n, k),
        (a_sm, a_sk),
        (b_sk, b_sn),
        (c_sm, c_sn),
        *alpha,
        *beta,
    ) {
        if with_backend(spec, |b| b.blas_handle().is_ok())? {
            // cuBLAS's first operand is our B, its second our A.
            let step = Step::blas(g, [Operand::In(1), Operand::In(0), Operand::Out(0, 0)]);
            return ready(spec, &FAMILY, spec.dtype, vec![step]);
        }
    }
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
