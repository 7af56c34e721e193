//! Plans the matmul kernels (`matmul.cu`): cuBLAS when it is loaded and takes the layouts;
//! else, for f16 / bf16 on sm_80+ with strides that allow 16-byte copies, `op_matmul_mma`
//! (128×128 tiles on tensor cores, a three-stage cp.async pipeline); else `op_matmul`, 64×64
//! output tiles over any strides. Grids: x over columns, y over rows, z over the broadcast
//! batch. The family registers `matmul_epilogue` too; its plans are in `matmul_epilogue.rs`.

use std::sync::Arc;

use super::args::Space;
use super::prepared::{prepare as prepare_family, with_backend, Operand, Step};
use super::{unexpected, Family, FLOATS};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::ops::matmul::MATMUL_EPILOGUE;
use crate::ops::{Params, PlanSpec, PreparedKernel, TensorDesc};
use crate::tensor::{DType, Layout};
use crate::vendors::cuda::blas::{self, Gemm};

pub(super) const FAMILY: Family = Family {
    name: "matmul",
    text: include_str!("matmul.cu"),
    ops: &["matmul", MATMUL_EPILOGUE],
    dtypes: FLOATS,
    entries: &["op_matmul", "op_matmul_mma"],
    prepare,
    params: (3, 45),
    source_dtype: super::own_source,
};

pub(super) const TILE: usize = 64;

/// Words of `struct Mm` (the tiles' parameters; `FAMILY.params`).
pub(super) const MM_WORDS: usize = 45;

/// `t`'s batch strides aligned to `batch` (0 where it broadcasts).
fn batch_strides(batch: &[usize], t: &Layout) -> Vec<i64> {
    let (s, st) = (t.shape(), t.strides());
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

/// A row and a column stride.
pub(super) type RowCol = (i64, i64);

/// One GEMM's geometry: `C [.., m, n] = A [.., m, k] · B [.., k, n]`, each matrix's row and
/// column strides, and the batch space over A, B, C (then any further operands' batch
/// strides the caller adds, an epilogue's).
pub(super) struct Geometry {
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) a: RowCol,
    pub(super) b: RowCol,
    pub(super) c: RowCol,
    pub(super) space: Space,
}

impl Geometry {
    pub(super) fn new(
        op: &str,
        a: &Layout,
        b: &Layout,
        c: &Layout,
        more: &[Vec<i64>],
    ) -> Result<Self> {
        let cs = c.shape();
        let nd = cs.len();
        let batch = &cs[..nd - 2];
        let mut strides = vec![
            batch_strides(batch, a),
            batch_strides(batch, b),
            batch_strides(batch, c),
        ];
        strides.extend(more.iter().cloned());
        let two = |t: &Layout| {
            let st = t.strides();
            (st[st.len() - 2] as i64, st[st.len() - 1] as i64)
        };
        Ok(Geometry {
            m: cs[nd - 2],
            n: cs[nd - 1],
            k: a.shape()[a.ndim() - 1],
            a: two(a),
            b: two(b),
            c: two(c),
            space: Space::new(op, batch, &strides)?,
        })
    }

    /// The 64×64 tile kernel `entry` over this GEMM: grid, the pointers A, B, C and `struct Mm`.
    pub(super) fn tiles(&self, entry: &str, alpha: f64, beta: f64) -> Result<Step> {
        self.tiles_of(entry, TILE, 256, alpha, beta)
    }

    /// [`Geometry::tiles`] for a kernel of `tile`×`tile` output tiles and `threads` a block.
    fn tiles_of(
        &self,
        entry: &str,
        tile: usize,
        threads: u32,
        alpha: f64,
        beta: f64,
    ) -> Result<Step> {
        let (m, n) = (self.m, self.n);
        if m.div_ceil(tile) > 65535 {
            return Err(Error::unsupported(
                format!(
                    "matmul with {m} rows (the CUDA kernel takes up to {} rows)",
                    65535 * tile
                ),
                DeviceKind::Cuda,
            ));
        }
        let grid = [
            n.div_ceil(tile).clamp(1, i32::MAX as usize) as u32,
            m.div_ceil(tile).clamp(1, 65535) as u32,
            self.space.count().clamp(1, 65535) as u32,
        ];
        let mut step = Step::new(entry, grid, [threads, 1, 1]);
        step.ptrs = vec![Operand::In(0), Operand::In(1), Operand::Out(0, 0)];
        let s = &self.space;
        step.args.space(s).strides(s, 0).strides(s, 1).strides(s, 2);
        let (a, b, c) = (self.a, self.b, self.c);
        for v in [
            m as i64,
            n as i64,
            self.k as i64,
            a.0,
            a.1,
            b.0,
            b.1,
            c.0,
            c.1,
        ] {
            step.args.int(v);
        }
        step.args.float(alpha).float(beta);
        Ok(step)
    }
}

/// The cuBLAS call computing this matmul, when the layouts fit one: row-major `C = A·B` is
/// column-major `Cᵀ = Bᵀ·Aᵀ`, so cuBLAS sees (B, A) with m and n swapped; each matrix needs a
/// unit stride in one of its two dimensions, C in its columns, and the batch at most one
/// evenly strided dimension.
fn blas_gemm(dtype: DType, g: &Geometry, alpha: f64, beta: f64) -> Option<Gemm> {
    let dtype = blas::data_type(dtype)?;
    let (m, n, k, space) = (g.m, g.n, g.k, &g.space);
    let ((a_sm, a_sk), (b_sk, b_sn), (c_sm, c_sn)) = (g.a, g.b, g.c);
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

/// The cuBLAS GEMM for `g`, when cuBLAS takes its layouts and this device has a handle.
pub(super) fn cublas_for(
    spec: &PlanSpec<'_>,
    g: &Geometry,
    alpha: f64,
    beta: f64,
) -> Result<Option<Gemm>> {
    match blas_gemm(spec.dtype, g, alpha, beta) {
        Some(gemm) if with_backend(spec, |b| b.blas_handle().is_ok())? => Ok(Some(gemm)),
        _ => Ok(None),
    }
}

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    match (spec.params, spec.inputs, spec.outputs) {
        (Params::Matmul { alpha, beta }, [a, b], [c]) => matmul(spec, (a, b, c), *alpha, *beta),
        (Params::MatmulEpilogue { alpha, program }, [a, b, extras @ ..], [c])
            if spec.op == MATMUL_EPILOGUE =>
        {
            super::matmul_epilogue::plan(spec, (a, b, c), extras, *alpha, program)
        }
        _ => Err(unexpected(spec, FAMILY.name)),
    }
}

/// `matmul`: cuBLAS where it takes the layouts, else `op_matmul`.
fn matmul(
    spec: &PlanSpec<'_>,
    (a, b, c): (&TensorDesc, &TensorDesc, &TensorDesc),
    alpha: f64,
    beta: f64,
) -> Result<Arc<dyn PreparedKernel>> {
    let g = Geometry::new(spec.op, &a.layout, &b.layout, &c.layout, &[])?;
    if let Some(gemm) = cublas_for(spec, &g, alpha, beta)? {
        // cuBLAS's first operand is our B, its second our A.
        let step = Step::blas(gemm, [Operand::In(1), Operand::In(0), Operand::Out(0, 0)]);
        return prepare_family(spec, &FAMILY, spec.dtype, vec![step]);
    }
    let step = match tensor_core_tiles(spec, &g, (a, b))? {
        true => g.tiles_of("op_matmul_mma", MMA_TILE, MMA_THREADS, alpha, beta)?,
        false => g.tiles("op_matmul", alpha, beta)?,
    };
    prepare_family(spec, &FAMILY, spec.dtype, vec![step])
}

/// The tile edge and block size of `op_matmul_mma` (`MMA_BM`, `MMA_THREADS` in matmul.cu).
const MMA_TILE: usize = 128;
const MMA_THREADS: u32 = 128;

/// Whether `op_matmul_mma` (128×128 tiles on tensor cores through a cp.async pipeline) takes
/// this matmul: f16 / bf16 on sm_80 or later, unless `UNIRT_CUDA_MMA=0`; A with unit column
/// stride, B with a unit stride in either dimension, and every other stride of A and B (batch
/// strides too) and both offsets multiples of 8 elements, so that each tile row arrives in
/// 16-byte copies. (The kernel checks the same on the device and computes element by element
/// what it cannot read; the planner never sends it such a layout.)
fn tensor_core_tiles(
    spec: &PlanSpec<'_>,
    g: &Geometry,
    (a, b): (&TensorDesc, &TensorDesc),
) -> Result<bool> {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| std::env::var_os("UNIRT_CUDA_MMA").is_some_and(|v| v == "0"));
    // An empty product (k = 0) takes `op_matmul`, which writes β·C without touching A or B;
    // the pipeline's first copies would be addressed from an empty operand's pointer.
    if off || g.k == 0 || !matches!(spec.dtype, DType::F16 | DType::BF16) {
        return Ok(false);
    }
    let eighth = |v: i64| v % 8 == 0;
    let b_rows = g.b.1 == 1 && eighth(g.b.0);
    let b_cols = g.b.0 == 1 && eighth(g.b.1);
    let layouts = g.a.1 == 1
        && eighth(g.a.0)
        && (b_rows || b_cols)
        && a.layout.offset() % 8 == 0
        && b.layout.offset() % 8 == 0
        && g.space.strides[..2].iter().flatten().all(|&s| eighth(s));
    Ok(layouts && with_backend(spec, |bk| bk.cc)? >= 80)
}
