//! matmul / gemm. f32 goes to unirt's own packed GEMM ([`super::sgemm`]: AVX-512 or AVX2
//! register tiles, the same bits on every CPU with FMA) — or, on a CPU without FMA, when
//! beta ≠ 0, or with `UNIRT_CPU_GEMM=matrixmultiply` (a baseline for benchmarks), to the
//! `matrixmultiply` crate's `sgemm`. Both take any row and column strides (so transposed
//! views cost nothing); the output is split into panels across rayon's threads (along m when
//! it is large, along n otherwise), each panel a single-threaded GEMM. One-row products
//! (decode: `1×k · k×n`) are memory-bound and take a direct GEMV ([`super::gemv`]) instead
//! of paying for packing, as do two to eight rows over a large B. f16/bf16
//! convert one batch of A into f32 in the plan's workspace and multiply in f32 into an f32
//! C there, rounded back at the end; unirt's GEMM reads B in its own dtype, widening it as
//! it packs (where `matrixmultiply` runs, B and C are converted too).
//! [`workspace`] is the size the plan asks for.
//!
//! `matmul_epilogue` is the same GEMM with its epilogue applied to each region of C (a
//! panel, a GEMV column block) by the task that computed it, right after it did, while the
//! region is still in cache: the product is stored in the dtype, then read back and run
//! through the program exactly as the unfused operators would (bitwise their result).

use std::ops::Range;

use super::fused::eval_block;
use super::gemv::gemv;
use super::gemv_rows::{gemv_rows, gemv_rows_t, FEW_ROWS, FEW_ROWS_MIN};
use super::sgemm::{own_gemm, sgemm_par, Mat};
use super::util::{
    bcast, coalesce, floats, gather, offsets, par_chunks, par_rows, scatter, simd, AlignedBlock,
    Float, Ptr, Scratch, BLOCK,
};
use crate::error::{Error, Result};
use crate::ops::fused::{FusedProgram, MAX_FUSED_INPUTS};
use crate::ops::{KernelCall, KernelRegistry, Params};
use crate::tensor::{DType, Layout};

/// Bytes of workspace one batch of an `m×k · k×n` product in `dtype` over a B laid out as
/// `b` needs on this CPU: none in f32, for one row, or for a few rows over a large B with
/// contiguous rows or columns ([`reads_b_in_place`]: these read every dtype in place);
/// f32 copies of A and C where unirt's GEMM runs (it widens B as it packs); of A, B and C
/// where `matrixmultiply` does.
pub(crate) fn workspace(
    dtype: DType,
    m: usize,
    k: usize,
    n: usize,
    beta: f64,
    b: &Layout,
) -> usize {
    let (brs, bcs) = last_two_strides(b);
    if dtype == DType::F32 || m <= 1 || k == 0 || n == 0 || reads_b_in_place(m, k, n, brs, bcs) {
        0
    } else if own_gemm(beta as f32) {
        4 * (m * k + m * n)
    } else {
        4 * (m * k + k * n + m * n)
    }
}

/// Whether a product of `m` (2 or more) rows reads B in place, once for all rows
/// ([`gemv_rows`], [`gemv_rows_t`]) rather than through the packed GEMM: a few rows over a
/// large B whose rows or columns are contiguous.
fn reads_b_in_place(m: usize, k: usize, n: usize, brs: usize, bcs: usize) -> bool {
    m <= FEW_ROWS && (bcs == 1 || brs == 1) && k * n >= FEW_ROWS_MIN
}

/// A matrix layout's row and column strides (its last two dimensions').
fn last_two_strides(l: &Layout) -> (usize, usize) {
    let s = l.strides();
    (s[s.len() - 2], s[s.len() - 1])
}

/// Called once a region of one batch's C (rows, columns) holds its final product.
pub(super) type After<'a> = &'a (dyn Fn(Range<usize>, Range<usize>) + Sync);

/// Nothing to do after a region (the plain matmul).
fn no_epilogue(_: Range<usize>, _: Range<usize>) {}

/// A `matmul_epilogue` program bound to one launch.
struct Epilogue<'a, T> {
    prog: &'a FusedProgram,
    /// Each extra operand's first element and its row and column strides, broadcast to the
    /// output's shape.
    extras: Vec<(Ptr<T>, usize, usize)>,
    /// Per batch (in the order of [`batches`]), each extra operand's offset.
    batch_offs: Vec<Vec<usize>>,
}

impl<T: Float> Epilogue<'_, T> {
    /// Runs the program over `rows × cols` of batch `bi`'s C (at `c`, strides `crs`, `ccs`),
    /// reading the product from C and writing the result there.
    ///
    /// # Safety
    /// The region lies in C; every extra operand is valid for its broadcast layout and does
    /// not overlap C (the launch refused overlapping outputs).
    unsafe fn apply(
        &self,
        bi: usize,
        c: Ptr<T>,
        (crs, ccs): (usize, usize),
        rows: Range<usize>,
        cols: Range<usize>,
    ) {
        let ne = self.extras.len();
        let mut loaded = vec![AlignedBlock::<BLOCK>::ZERO; 1 + ne];
        let mut steps = vec![AlignedBlock::<BLOCK>::ZERO; self.prog.steps.len()];
        let last = self.prog.steps.len() - 1;
        for r in rows {
            let mut j = cols.start;
            while j < cols.end {
                let n = BLOCK.min(cols.end - j);
                let (first, rest) = loaded.split_at_mut(1);
                // SAFETY: row r, columns j..j+n of C and of each broadcast operand.
                unsafe {
                    gather(c.at(r * crs + j * ccs), ccs, &mut first[0][..n]);
                    for (q, &(p, rs, cs)) in self.extras.iter().enumerate() {
                        let at = p.at(self.batch_offs[bi][q] + r * rs + j * cs);
                        gather(at, cs, &mut rest[q][..n]);
                    }
                }
                let mut srcs: [&[f32]; MAX_FUSED_INPUTS] = [&[]; MAX_FUSED_INPUTS];
                for (d, l) in srcs.iter_mut().zip(&loaded) {
                    *d = &l[..n];
                }
                simd!(eval_block::<T>(self.prog, &srcs[..1 + ne], &mut steps, n));
                // SAFETY: as above; C is disjoint from every operand read.
                unsafe { scatter(&steps[last][..n], c.at(r * crs + j * ccs), ccs) };
                j += n;
            }
        }
    }
}

/// The batch walk: offsets of each batch's A, B and C.
fn batches(out: &Layout, a: &Layout, b: &Layout) -> Result<Vec<[usize; 3]>> {
    let nd = out.ndim();
    let batch = &out.shape()[..nd - 2];
    let with = |l: &Layout, rows: usize, cols: usize| {
        let mut s = batch.to_vec();
        s.extend([rows, cols]);
        l.broadcast_to(&s)
    };
    let (m, n) = (out.shape()[nd - 2], out.shape()[nd - 1]);
    let k = a.shape()[a.ndim() - 1];
    let (a, b) = (with(a, m, k)?, with(b, k, n)?);
    let (shape, strides) = coalesce(
        batch,
        [
            &out.strides()[..nd - 2],
            &a.strides()[..nd - 2],
            &b.strides()[..nd - 2],
        ],
    );
    let mut all = Vec::new();
    let count: usize = shape.iter().product();
    for i in 0..count {
        let mut offs = [0usize; 3];
        let mut rem = i;
        for d in (0..shape.len()).rev() {
            let j = rem % shape[d];
            rem /= shape[d];
            for q in 0..3 {
                offs[q] += j * strides[d][q];
            }
        }
        all.push([offs[0], offs[1], offs[2]]);
    }
    Ok(all)
}

/// Converts an `rows×cols` strided matrix of T into a dense row-major f32 buffer (or back).
///
/// # Safety
/// `src` valid for the shape at (rs, cs); `dst` for rows·cols f32s.
unsafe fn to_f32<T: Float>(
    src: Ptr<T>,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
    dst: Ptr<f32>,
) {
    let (shape, strides) = coalesce(&[rows, cols], [&[cols, 1][..], &[rs, cs][..]]);
    par_rows(&shape, &strides, |off, len, st| {
        // SAFETY: inside both matrices.
        unsafe {
            let d = std::slice::from_raw_parts_mut(dst.at(off[0]), len);
            if st[0] == 1 {
                gather(src.at(off[1]), st[1], d);
            } else {
                for i in 0..len {
                    *dst.at(off[0] + i * st[0]) = (*src.at(off[1] + i * st[1])).to_f32();
                }
            }
        }
    });
}

unsafe fn from_f32<T: Float>(
    src: Ptr<f32>,
    rows: usize,
    cols: usize,
    dst: Ptr<T>,
    rs: usize,
    cs: usize,
) {
    let (shape, strides) = coalesce(&[rows, cols], [&[rs, cs][..], &[cols, 1][..]]);
    par_rows(&shape, &strides, |off, len, st| {
        for i in 0..len {
            // SAFETY: inside both matrices.
            unsafe { *dst.at(off[0] + i * st[0]) = T::from_f32(*src.at(off[1] + i * st[1])) };
        }
    });
}

fn matmul<T: Float>(call: &KernelCall<'_>) -> Result<()> {
    let Params::Matmul { alpha, beta } = *call.params else {
        return Err(Error::Internal(format!(
            "matmul: parameters {:?}",
            call.params
        )));
    };
    gemm::<T>(call, alpha as f32, beta as f32, None)
}

fn matmul_epilogue<T: Float>(call: &KernelCall<'_>) -> Result<()> {
    let Params::MatmulEpilogue { alpha, program } = call.params else {
        return Err(Error::Internal(format!(
            "{}: parameters {:?}",
            call.op, call.params
        )));
    };
    let c = &call.outputs[0];
    let shape = c.layout.shape();
    let nd = shape.len();
    let extras = &call.inputs[2..];
    if program.steps.is_empty() || 1 + extras.len() > MAX_FUSED_INPUTS {
        return Err(Error::Internal(format!("{}: unchecked program", call.op)));
    }
    let mut epi = Epilogue {
        prog: program,
        extras: Vec::new(),
        batch_offs: Vec::new(),
    };
    let mut per_extra = Vec::new();
    for e in extras {
        let l = bcast(e, shape)?;
        let st = l.strides();
        epi.extras.push((Ptr::of(e), st[nd - 2], st[nd - 1]));
        per_extra.push(offsets(&shape[..nd - 2], &st[..nd - 2]));
    }
    let batches: usize = shape[..nd - 2].iter().product();
    epi.batch_offs = (0..batches)
        .map(|bi| per_extra.iter().map(|o| o[bi]).collect())
        .collect();
    gemm::<T>(call, *alpha as f32, 0.0, Some(&epi))
}

/// The GEMM of `matmul` and `matmul_epilogue`: `C = alpha·A·B + beta·C`, then the epilogue.
fn gemm<T: Float>(
    call: &KernelCall<'_>,
    alpha: f32,
    beta: f32,
    epi: Option<&Epilogue<'_, T>>,
) -> Result<()> {
    let (a, b, c) = (&call.inputs[0], &call.inputs[1], &call.outputs[0]);
    let nd = c.layout.ndim();
    let (m, n) = (c.layout.shape()[nd - 2], c.layout.shape()[nd - 1]);
    let k = a.layout.shape()[a.layout.ndim() - 1];
    let st = last_two_strides;
    let ((ars, acs), (brs, bcs), (crs, ccs)) = (st(&a.layout), st(&b.layout), st(&c.layout));
    let (pa, pb, pc) = (Ptr::<T>::of(a), Ptr::<T>::of(b), Ptr::<T>::of(c));
    for (bi, [oc, oa, ob]) in batches(&c.layout, &a.layout, &b.layout)?
        .into_iter()
        .enumerate()
    {
        // SAFETY: `oc` is where this batch's C starts, inside the output's checked view.
        let pcb = Ptr(unsafe { pc.at(oc) });
        let epilogue = |rows: Range<usize>, cols: Range<usize>| {
            if let Some(e) = epi {
                // SAFETY: the region lies in this batch's C; the plan and the launch
                // checked every operand's range and refused outputs overlapping inputs.
                unsafe { e.apply(bi, pcb, (crs, ccs), rows, cols) }
            }
        };
        let after: After<'_> = if epi.is_some() {
            &epilogue
        } else {
            &no_epilogue
        };
        // SAFETY: every matrix below lies in its checked view (batch offsets come from the
        // broadcast layouts); the plan refused outputs overlapping the inputs.
        unsafe {
            if k == 0 {
                for i in 0..m {
                    for j in 0..n {
                        let o = pc.at(oc + i * crs + j * ccs);
                        let old = if beta == 0.0 {
                            0.0
                        } else {
                            beta * (*o).to_f32()
                        };
                        *o = T::from_f32(old);
                    }
                }
                after(0..m, 0..n);
                continue;
            }
            if m == 1 {
                // k is no output's dimension: A and B may be broadcast views of any length.
                let mut x = Scratch::zeroed(k)?;
                gather(pa.at(oa), acs, &mut x);
                gemv(
                    &x,
                    Ptr(pb.at(ob)),
                    brs,
                    bcs,
                    n,
                    alpha,
                    beta,
                    Ptr(pc.at(oc)),
                    ccs,
                    after,
                )?;
                continue;
            }
            // Few rows over a large B with contiguous rows or columns: B read in place, once
            // for all rows.
            if reads_b_in_place(m, k, n, brs, bcs) {
                let mut rows = Scratch::zeroed(m.saturating_mul(k))?;
                for (r, row) in rows.chunks_mut(k).enumerate() {
                    gather(pa.at(oa + r * ars), acs, row);
                }
                // (In the enclosing unsafe block.) r < m, j < n: inside C; each element is
                // written by one task.
                let finish = |r: usize, j: usize, v: f32| {
                    let o = pc.at(oc + r * crs + j * ccs);
                    let old = if beta == 0.0 {
                        0.0
                    } else {
                        beta * (*o).to_f32()
                    };
                    *o = T::from_f32(alpha * v + old);
                };
                if bcs == 1 {
                    gemv_rows(&rows, m, Ptr(pb.at(ob)), brs, n, &finish, after)?;
                } else {
                    gemv_rows_t(&rows, m, Ptr(pb.at(ob)), bcs, n, &finish, after);
                }
                continue;
            }
            if T::DTYPE == DType::F32 {
                let f = |p: Ptr<T>, off: usize| Ptr(p.at(off) as *mut f32);
                sgemm_par(
                    m,
                    k,
                    n,
                    alpha,
                    Mat {
                        p: f(pa, oa),
                        rs: ars,
                        cs: acs,
                    },
                    Mat {
                        p: f(pb, ob),
                        rs: brs,
                        cs: bcs,
                    },
                    beta,
                    Mat {
                        p: f(pc, oc),
                        rs: crs,
                        cs: ccs,
                    },
                    after,
                );
                continue;
            }
            if m == 0 || n == 0 {
                continue;
            }
            let needed = workspace(T::DTYPE, m, k, n, f64::from(beta), &b.layout);
            let (ws, size) = call.workspace.ok_or_else(|| {
                Error::Internal("matmul: f16/bf16 needs the plan's workspace".into())
            })?;
            if size < needed {
                return Err(Error::InsufficientWorkspace {
                    needed: needed as u64,
                    given: size as u64,
                });
            }
            let wa = Ptr(ws as usize as *mut f32);
            let a32 = Mat {
                p: wa,
                rs: k,
                cs: 1,
            };
            to_f32(Ptr(pa.at(oa)), m, k, ars, acs, wa);
            if own_gemm(beta) {
                // B straight from the tensor: the GEMM widens it as it packs.
                let wc = Ptr(wa.at(m * k));
                let c32 = Mat {
                    p: wc,
                    rs: n,
                    cs: 1,
                };
                let b = Mat {
                    p: Ptr(pb.at(ob)),
                    rs: brs,
                    cs: bcs,
                };
                sgemm_par(m, k, n, alpha, a32, b, 0.0, c32, &no_epilogue);
                from_f32(wc, m, n, Ptr(pc.at(oc)), crs, ccs);
            } else {
                let (wb, wc) = (Ptr(wa.at(m * k)), Ptr(wa.at(m * k + k * n)));
                to_f32(Ptr(pb.at(ob)), k, n, brs, bcs, wb);
                if beta != 0.0 {
                    to_f32(Ptr(pc.at(oc)), m, n, crs, ccs, wc);
                }
                let b32 = Mat {
                    p: wb,
                    rs: n,
                    cs: 1,
                };
                let c32 = Mat {
                    p: wc,
                    rs: n,
                    cs: 1,
                };
                sgemm_par(m, k, n, alpha, a32, b32, beta, c32, &no_epilogue);
                from_f32(wc, m, n, Ptr(pc.at(oc)), crs, ccs);
            }
            if epi.is_some() {
                // The product is in C only now: the epilogue follows in row blocks.
                par_chunks(m, n, |rows| after(rows, 0..n));
            }
        }
    }
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, "matmul", matmul);
    floats!(reg, crate::ops::matmul::MATMUL_EPILOGUE, matmul_epilogue);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Device, DeviceKind};
    use crate::ops::matmul::{gemm as gemm_plan, matmul as matmul_plan};
    use crate::ops::TensorDesc;

    /// A 16-bit GEMM asks for f32 copies of A and C only (B is widened as it is packed), a
    /// GEMV, a few rows over a large B read in place and an f32 GEMM for nothing, and the
    /// plans on the CPU ask for what the kernel checks.
    #[test]
    fn half_gemm_workspace_holds_no_copy_of_b() {
        let (m, k, n) = (64, 4096, 11008);
        let small = 4 * (m * k + m * n);
        let b = Layout::contiguous(&[k, n]);
        if own_gemm(0.0) {
            assert_eq!(workspace(DType::BF16, m, k, n, 0.0, &b), small);
        }
        assert_eq!(workspace(DType::BF16, m, k, n, 1.0, &b), small + 4 * k * n);
        assert_eq!(workspace(DType::F16, 1, k, n, 0.0, &b), 0);
        assert_eq!(workspace(DType::F32, m, k, n, 1.0, &b), 0);
        // Four rows over B as stored or transposed: read in place, with beta too.
        let bt = Layout::contiguous(&[n, k]).transpose(0, 1).unwrap();
        for b in [&b, &bt] {
            assert_eq!(workspace(DType::BF16, 4, k, n, 0.5, b), 0);
        }
        // ... but not over a B with neither rows nor columns contiguous (every other column).
        let strided = Layout::new(vec![k, n], vec![2 * n, 2], 0).unwrap();
        assert_ne!(workspace(DType::BF16, 4, k, n, 0.0, &strided), 0);
        let cpu = Device::new(DeviceKind::Cpu, 0);
        let d = |shape: &[usize]| TensorDesc::new(cpu, DType::BF16, Layout::contiguous(shape));
        let plan = matmul_plan(&d(&[m, k]), &d(&[k, n]), 1.0).unwrap();
        assert_eq!(
            plan.workspace_size(),
            workspace(DType::BF16, m, k, n, 0.0, &b)
        );
        let plan = gemm_plan(&d(&[m, k]), &d(&[k, n]), &d(&[m, n]), 1.0, 0.5).unwrap();
        assert_eq!(
            plan.workspace_size(),
            workspace(DType::BF16, m, k, n, 0.5, &b)
        );
    }
}
