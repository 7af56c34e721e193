//! matmul / gemm. f32 goes to the `matrixmultiply` crate's packed, vectorised `sgemm`, which
//! takes any row and column strides (so transposed views cost nothing); the output is split
//! into panels across rayon's threads (along m when it is large, along n otherwise), each
//! panel a single-threaded `sgemm`. One-row products (decode: `1×k · k×n`) are memory-bound
//! and take a direct GEMV instead of paying for packing. f16/bf16 convert one batch of A, B
//! (and C when beta ≠ 0) into f32 in the plan's workspace, multiply in f32, and round back.

use rayon::prelude::*;

use super::util::{axpy, coalesce, dot, floats, gather, par_chunks, par_rows, simd, Float, Ptr};
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelRegistry, Params};
use crate::tensor::{DType, Layout};

/// A strided f32 matrix: base pointer, row and column strides in elements.
#[derive(Clone, Copy)]
struct Mat {
    p: Ptr<f32>,
    rs: usize,
    cs: usize,
}

/// `C = alpha·A·B + beta·C` (m×k · k×n) on f32 strided matrices, in parallel panels.
///
/// # Safety
/// The matrices must be valid for their shapes and strides; C must not overlap A or B.
#[allow(clippy::too_many_arguments)] // the BLAS signature
unsafe fn sgemm_par(m: usize, k: usize, n: usize, alpha: f32, a: Mat, b: Mat, beta: f32, c: Mat) {
    if m == 0 || n == 0 {
        return;
    }
    let threads = rayon::current_num_threads().max(1);
    let work = m * n * k.max(1);
    // Panels of at least 64 rows/columns, and only when the product is worth a fork.
    let along_m = m >= n;
    let len = if along_m { m } else { n };
    let panels = if work < 1 << 18 {
        1
    } else {
        threads.min(len / 64).max(1)
    };
    let per = len.div_ceil(panels);
    let run = |t: usize| {
        let (start, end) = (t * per, ((t + 1) * per).min(len));
        if start >= end {
            return;
        }
        // SAFETY: each panel writes its own rows (or columns) of C; all pointers stay in the
        // matrices the caller vouched for.
        unsafe {
            if along_m {
                matrixmultiply::sgemm(
                    end - start,
                    k,
                    n,
                    alpha,
                    a.p.at(start * a.rs),
                    a.rs as isize,
                    a.cs as isize,
                    b.p.0,
                    b.rs as isize,
                    b.cs as isize,
                    beta,
                    c.p.at(start * c.rs),
                    c.rs as isize,
                    c.cs as isize,
                );
            } else {
                matrixmultiply::sgemm(
                    m,
                    k,
                    end - start,
                    alpha,
                    a.p.0,
                    a.rs as isize,
                    a.cs as isize,
                    b.p.at(start * b.cs),
                    b.rs as isize,
                    b.cs as isize,
                    beta,
                    c.p.at(start * c.cs),
                    c.rs as isize,
                    c.cs as isize,
                );
            }
        }
    };
    if panels == 1 {
        run(0);
    } else {
        (0..panels).into_par_iter().for_each(run);
    }
}

/// `acc[t] += Σ_i x[i]·B[i, j0 + t]` over contiguous f32 rows of B, four rows per pass so
/// the accumulator is loaded and stored a quarter as often.
///
/// # Safety
/// B must be valid for rows `0..x.len()` at stride `rsb`, columns `j0..j0 + acc.len()`.
#[inline(always)]
unsafe fn axpy_rows(acc: &mut [f32], x: &[f32], b: Ptr<f32>, rsb: usize, j0: usize) {
    let w = acc.len();
    // SAFETY: the caller's promise, row by row.
    let row = |i: usize| unsafe { std::slice::from_raw_parts(b.at(i * rsb + j0), w) };
    let mut i = 0;
    while i + 4 <= x.len() {
        let (r0, r1, r2, r3) = (row(i), row(i + 1), row(i + 2), row(i + 3));
        let (x0, x1, x2, x3) = (x[i], x[i + 1], x[i + 2], x[i + 3]);
        for ((((a, v0), v1), v2), v3) in acc.iter_mut().zip(r0).zip(r1).zip(r2).zip(r3) {
            *a += x0 * v0 + x1 * v1 + x2 * v2 + x3 * v3;
        }
        i += 4;
    }
    for (q, &xi) in x.iter().enumerate().skip(i) {
        axpy(acc, xi, row(q));
    }
}

/// `c[j] = alpha · Σ_i x[i]·B[i, j] + beta · c[j]` for one row `x` (f32 values), reading B in
/// its own dtype.
///
/// # Safety
/// B must be valid for k×n at (rsb, csb); c for n elements at `csc`, not overlapping B.
#[allow(clippy::too_many_arguments)] // the BLAS signature
unsafe fn gemv<T: Float>(
    x: &[f32],
    b: Ptr<T>,
    rsb: usize,
    csb: usize,
    n: usize,
    alpha: f32,
    beta: f32,
    c: Ptr<T>,
    csc: usize,
) {
    let k = x.len();
    let finish = |j: usize, v: f32| {
        // SAFETY: j < n, inside c (the caller's promise); each j is written by one task.
        unsafe {
            let o = c.at(j * csc);
            let old = if beta == 0.0 {
                0.0
            } else {
                beta * (*o).to_f32()
            };
            *o = T::from_f32(alpha * v + old);
        }
    };
    if csb == 1 || rsb != 1 {
        // B rows are (mostly) contiguous: accumulate row by row over column blocks.
        const COLS: usize = 512;
        par_chunks(n.div_ceil(COLS), k * COLS, |blocks| {
            let (mut acc, mut row) = (vec![0f32; COLS], vec![0f32; COLS]);
            for blk in blocks {
                let (j0, w) = (blk * COLS, COLS.min(n - blk * COLS));
                acc[..w].fill(0.0);
                if csb == 1 && T::DTYPE == DType::F32 {
                    // f32 rows are read in place, four at a time, without a copy.
                    let bf = Ptr(b.0 as *mut f32);
                    // SAFETY: rows 0..k, columns j0..j0+w of B (T is f32).
                    simd!(unsafe { axpy_rows(&mut acc[..w], x, bf, rsb, j0) });
                    for (t, &v) in acc[..w].iter().enumerate() {
                        finish(j0 + t, v);
                    }
                    continue;
                }
                for (i, &xi) in x.iter().enumerate() {
                    // SAFETY: row i, columns j0..j0+w of B.
                    unsafe { gather(b.at(i * rsb + j0 * csb), csb, &mut row[..w]) };
                    simd!(axpy(&mut acc[..w], xi, &row[..w]));
                }
                for (t, &v) in acc[..w].iter().enumerate() {
                    finish(j0 + t, v);
                }
            }
        });
    } else {
        // B columns are contiguous (a transposed weight): one dot product per column.
        par_chunks(n, k, |cols| {
            let mut col = vec![0f32; k];
            for j in cols {
                // SAFETY: column j of B.
                unsafe { gather(b.at(j * csb), rsb, &mut col) };
                finish(j, simd!(dot(x, &col)));
            }
        });
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
    let (alpha, beta) = (alpha as f32, beta as f32);
    let (a, b, c) = (&call.inputs[0], &call.inputs[1], &call.outputs[0]);
    let nd = c.layout.ndim();
    let (m, n) = (c.layout.shape()[nd - 2], c.layout.shape()[nd - 1]);
    let k = a.layout.shape()[a.layout.ndim() - 1];
    let st = |l: &Layout| {
        let s = l.strides();
        let (r, q) = (s[s.len() - 2], s[s.len() - 1]);
        (r, q)
    };
    let ((ars, acs), (brs, bcs), (crs, ccs)) = (st(&a.layout), st(&b.layout), st(&c.layout));
    let (pa, pb, pc) = (Ptr::<T>::of(a), Ptr::<T>::of(b), Ptr::<T>::of(c));
    for [oc, oa, ob] in batches(&c.layout, &a.layout, &b.layout)? {
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
                continue;
            }
            if m == 1 {
                let mut x = vec![0f32; k];
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
                );
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
                );
                continue;
            }
            let (ws, size) = call.workspace.ok_or_else(|| {
                Error::Internal("matmul: f16/bf16 needs the plan's workspace".into())
            })?;
            if size < 4 * (m * k + k * n + m * n) {
                return Err(Error::InsufficientWorkspace {
                    needed: (4 * (m * k + k * n + m * n)) as u64,
                    given: size as u64,
                });
            }
            let wa = Ptr(ws as usize as *mut f32);
            let (wb, wc) = (Ptr(wa.at(m * k)), Ptr(wa.at(m * k + k * n)));
            to_f32(Ptr(pa.at(oa)), m, k, ars, acs, wa);
            to_f32(Ptr(pb.at(ob)), k, n, brs, bcs, wb);
            if beta != 0.0 {
                to_f32(Ptr(pc.at(oc)), m, n, crs, ccs, wc);
            }
            sgemm_par(
                m,
                k,
                n,
                alpha,
                Mat {
                    p: wa,
                    rs: k,
                    cs: 1,
                },
                Mat {
                    p: wb,
                    rs: n,
                    cs: 1,
                },
                beta,
                Mat {
                    p: wc,
                    rs: n,
                    cs: 1,
                },
            );
            from_f32(wc, m, n, Ptr(pc.at(oc)), crs, ccs);
        }
    }
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, "matmul", matmul);
}
