//! Products of two to eight rows of A over a large B, read in place ([`gemv_rows`] for B's
//! rows contiguous, [`gemv_rows_t`] for its columns contiguous): a few decode steps batched
//! together stream B once for all their rows, with the split and the column blocks of the
//! one-row kernels in `gemv.rs`. Every sum's order depends on the shape alone.

use std::ops::Range;

use super::gemv::{dots, float_bits, split_k};
use super::matmul::After;
use super::util::{par_chunks, simd, Float, Ptr};
use crate::error::Result;

/// Most rows of A that [`gemv_rows`] takes: past them the product has enough arithmetic per
/// element of B for the packed GEMM.
pub(super) const FEW_ROWS: usize = 8;

/// Elements of B from which [`gemv_rows`] takes a product of few rows (below, the packed
/// GEMM's packing is cheap).
pub(super) const FEW_ROWS_MIN: usize = 1 << 18;

/// [`gemv_rows`]'s column blocks hold this many accumulators across the rows (128 KiB, in
/// L2): blocks as wide as B where they can be (4096 columns for eight rows), because B's
/// rows streamed whole read fastest — with 32 KiB (in L1, 1024 columns for eight rows) four
/// rows took 6.2–7.3 ms against 5.6 at 4096 × 4096.
const WIDEST_ROWS: usize = 32 * 1024;

/// `C[r, j] = alpha · Σ_i A[r, i]·B[i, j] + beta · C[r, j]` for 2 to [`FEW_ROWS`] rows of A
/// (`a`: m rows of k f32 values) over contiguous rows of B, read in place: a few
/// decode steps batched together are nearly as memory-bound as one, and packing B for the
/// GEMM doubled their time (m × 4096 × 4096 f32: about 4 ms for one row, 7–9 ms for two to
/// eight through the GEMM; 4–5 ms for two to four rows, 7–8 for eight, this way). Split as
/// `gemv_split_k` is, with column blocks of [`WIDEST_ROWS`] accumulators across the rows;
/// each stretch of B's rows is read once for all rows of A. The order of every sum depends
/// on the shape only.
///
/// # Safety
/// B must be valid for k×n at (rsb, 1) and of dtype `T`; `finish(r, j, v)`
/// must accept every r < m, j < n.
pub(super) unsafe fn gemv_rows<T: Float>(
    a: &[f32],
    m: usize,
    b: Ptr<T>,
    rsb: usize,
    n: usize,
    finish: &(dyn Fn(usize, usize, f32) + Sync),
    after: After<'_>,
) -> Result<()> {
    // SAFETY: the caller's promise, passed on.
    unsafe {
        match m {
            2 | 3 => {
                // As four rows, the last zero and dropped: two or three rows at once compiled
                // into loops slower than four (3 × 4096 × 4096 f32: 8–13 ms, 4.3–4.6 as four;
                // 2 × 4096 × 4096 bf16: 5.8–7.8 ms, 3.1–3.7 as four).
                let mut padded = a.to_vec();
                padded.resize(4 * (a.len() / m), 0.0);
                let real = |r: usize, j: usize, v: f32| {
                    if r < m {
                        finish(r, j, v)
                    }
                };
                let cut = |rows: Range<usize>, cols: Range<usize>| after(rows.start..m, cols);
                rows_split::<T, 4>(&padded, b, rsb, n, &real, &cut)
            }
            4 => rows_split::<T, 4>(a, b, rsb, n, finish, after),
            5 => rows_split::<T, 5>(a, b, rsb, n, finish, after),
            6 => rows_split::<T, 6>(a, b, rsb, n, finish, after),
            7 => rows_split::<T, 7>(a, b, rsb, n, finish, after),
            _ => rows_split::<T, 8>(a, b, rsb, n, finish, after),
        }
    }
}

/// [`gemv_rows`] for R rows.
///
/// # Safety
/// As [`gemv_rows`]'s, with `a.len() == R·k`.
unsafe fn rows_split<T: Float, const R: usize>(
    a: &[f32],
    b: Ptr<T>,
    rsb: usize,
    n: usize,
    finish: &(dyn Fn(usize, usize, f32) + Sync),
    after: After<'_>,
) -> Result<()> {
    let k = a.len() / R;
    let accumulate = |rows: Range<usize>, j0: usize, w: usize, part: Ptr<f32>| {
        // SAFETY: this task's own R rows of w partial sums, n apart (`split_k`'s promise).
        let acc: [&mut [f32]; R] =
            std::array::from_fn(|r| unsafe { std::slice::from_raw_parts_mut(part.at(r * n), w) });
        let xs: [&[f32]; R] = std::array::from_fn(|r| &a[r * k + rows.start..r * k + rows.end]);
        // SAFETY: rows `rows`, columns j0..j0+w of B (the caller's promise), of dtype T.
        unsafe {
            float_bits!(T, b.at(rows.start * rsb + j0), |p, widen| {
                simd!(axpy_rows_r::<_, R>(acc, xs, p, rsb, w, widen))
            })
        }
    };
    let widest = (WIDEST_ROWS / R).next_multiple_of(8);
    split_k(k, n, R, widest, 8, &accumulate, finish, after)
}

/// `acc[r][t] += Σ_i xs[r][i]·B[i, t]` for R rows at once over `xs[r].len()` contiguous rows
/// of B (from `b`, `w` columns) whose elements `widen` turns into f32: four rows of B per
/// pass, eight columns at a time loaded once for every r. Each element sums as
/// `axpy_rows`'s do.
///
/// # Safety
/// B must be valid for rows `0..xs[0].len()` at stride `rsb`, `w` columns from `b`.
#[inline(always)]
unsafe fn axpy_rows_r<T: Copy, const R: usize>(
    acc: [&mut [f32]; R],
    xs: [&[f32]; R],
    b: Ptr<T>,
    rsb: usize,
    w: usize,
    widen: impl Fn(T) -> f32,
) {
    const V: usize = 8;
    let k = xs[0].len();
    assert!(acc.iter().all(|a| a.len() == w));
    // Every accumulator is reached through these pointers only (so the slices' borrows do not
    // invalidate them between uses).
    let accp: [*mut f32; R] = acc.map(|a| a.as_mut_ptr());
    // SAFETY: the caller's promise, row by row.
    let row = |i: usize| unsafe { std::slice::from_raw_parts(b.at(i * rsb), w) };
    let body = w / V * V;
    let mut i = 0;
    while i + 4 <= k {
        let (r0, r1, r2, r3) = (row(i), row(i + 1), row(i + 2), row(i + 3));
        let x: [[f32; 4]; R] = std::array::from_fn(|r| {
            let x = &xs[r][i..i + 4];
            [x[0], x[1], x[2], x[3]]
        });
        let mut j = 0;
        while j < body {
            // SAFETY: j + V <= body <= w: inside each of B's rows (length w) and of each row's
            // accumulators (checked to be w long above).
            let ld = |src: &[T]| -> [f32; V] {
                let c = unsafe { &*(src.as_ptr().add(j) as *const [T; V]) };
                std::array::from_fn(|t| widen(c[t]))
            };
            let (v0, v1, v2, v3) = (ld(r0), ld(r1), ld(r2), ld(r3));
            for r in 0..R {
                // SAFETY: as above.
                let a = unsafe { &mut *(accp[r].add(j) as *mut [f32; V]) };
                let [x0, x1, x2, x3] = x[r];
                for t in 0..V {
                    a[t] += x0 * v0[t] + x1 * v1[t] + x2 * v2[t] + x3 * v3[t];
                }
            }
            j += V;
        }
        for j in body..w {
            let (v0, v1, v2, v3) = (widen(r0[j]), widen(r1[j]), widen(r2[j]), widen(r3[j]));
            for r in 0..R {
                let [x0, x1, x2, x3] = x[r];
                // SAFETY: j < w.
                unsafe { *accp[r].add(j) += x0 * v0 + x1 * v1 + x2 * v2 + x3 * v3 };
            }
        }
        i += 4;
    }
    for q in i..k {
        let v = row(q);
        for (&ap, x) in accp.iter().zip(xs) {
            let xq = x[q];
            for (t, &e) in v.iter().enumerate() {
                // SAFETY: t < w.
                unsafe { *ap.add(t) += xq * widen(e) };
            }
        }
    }
}

/// `C[r, j] = alpha · Σ_i A[r, i]·B[i, j] + beta · C[r, j]` for 2 to [`FEW_ROWS`] rows of A
/// (`a`: m rows of k f32 values) over a B whose columns are contiguous (`x · Wᵀ` with a
/// linear layer's `[out, in]` weight, columns `csb` apart), read in place: B is
/// taken [`T_BLOCK`] columns at a time, each row of A runs `dot_cols` over them (the
/// one-row kernel, so every element has its bits), and the rows after the first find the
/// block in L2. B comes from memory once.
///
/// # Safety
/// B must be valid for k×n at (1, csb) and of dtype `T`; `finish(r, j, v)` must
/// accept every r < m, j < n.
pub(super) unsafe fn gemv_rows_t<T: Float>(
    a: &[f32],
    m: usize,
    b: Ptr<T>,
    csb: usize,
    n: usize,
    finish: &(dyn Fn(usize, usize, f32) + Sync),
    after: After<'_>,
) {
    let k = a.len() / m;
    par_chunks(n.div_ceil(T_BLOCK), k * T_BLOCK * m, |blocks| {
        for blk in blocks {
            let cols = blk * T_BLOCK..((blk + 1) * T_BLOCK).min(n);
            for (r, x) in a.chunks_exact(k).enumerate() {
                // SAFETY: the columns of B in `cols` (the caller's promise), of dtype T.
                unsafe { dots(x, b, csb, cols.clone(), |j, v| finish(r, j, v)) };
            }
            after(0..m, cols);
        }
    });
}

/// Columns of B that [`gemv_rows_t`] takes at a time: at k = 4096, f32, 256 KiB, half of L2.
const T_BLOCK: usize = 16;
