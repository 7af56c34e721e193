//! One-row products (`1×k · k×n`, a decode step's GEMVs) for [`super::matmul`]: memory-bound,
//! so they read B in place in its own dtype instead of packing it, and the whole question is
//! how B's memory streams. Rows of B contiguous: each task accumulates a range of B's rows
//! over a column block, whole rows where they fit (split along k as well as n for large
//! weights, [`gemv_split_k`]). Columns contiguous (a linear layer's `[out, in]` weight seen
//! transposed): dot products four columns at a time ([`dot_cols`]). Every sum's order
//! depends on the shape alone, never on the thread count.

use super::matmul::After;
use super::util::{axpy, dot, fork_tasks, gather, par_chunks, simd, Float, Ptr};
use crate::tensor::DType;

/// `acc[t] += Σ_i x[i]·B[i, j0 + t]` over contiguous rows of B whose elements `widen` turns
/// into f32 (exactly: f32 as is, bf16 by a shift), four rows per pass so the accumulator is
/// loaded and stored a quarter as often.
///
/// # Safety
/// B must be valid for rows `0..x.len()` at stride `rsb`, columns `j0..j0 + acc.len()`.
#[inline(always)]
unsafe fn axpy_rows<T: Copy>(
    acc: &mut [f32],
    x: &[f32],
    b: Ptr<T>,
    rsb: usize,
    j0: usize,
    widen: impl Fn(T) -> f32,
) {
    let w = acc.len();
    // SAFETY: the caller's promise, row by row.
    let row = |i: usize| unsafe { std::slice::from_raw_parts(b.at(i * rsb + j0), w) };
    let mut i = 0;
    while i + 4 <= x.len() {
        let (r0, r1, r2, r3) = (row(i), row(i + 1), row(i + 2), row(i + 3));
        let (x0, x1, x2, x3) = (x[i], x[i + 1], x[i + 2], x[i + 3]);
        for ((((a, &v0), &v1), &v2), &v3) in acc.iter_mut().zip(r0).zip(r1).zip(r2).zip(r3) {
            *a += x0 * widen(v0) + x1 * widen(v1) + x2 * widen(v2) + x3 * widen(v3);
        }
        i += 4;
    }
    for (q, &xi) in x.iter().enumerate().skip(i) {
        for (a, &v) in acc.iter_mut().zip(row(q)) {
            *a += xi * widen(v);
        }
    }
}

/// `sums[c] = Σ_i x[i]·B[i, j0 + c]` for up to four contiguous columns of B (at stride `csb`
/// from one to the next) whose elements `widen` turns into f32, read in place: each column
/// keeps 16 running sums (independent chains the compiler vectorises), added up in order at
/// the end, so a column's bits do not depend on the columns it was grouped with or on the
/// SIMD width.
///
/// # Safety
/// B must be valid for `x.len()` elements of each column `j0..j0 + sums.len()`.
#[inline(always)]
unsafe fn dot_cols<T: Copy>(
    x: &[f32],
    b: Ptr<T>,
    csb: usize,
    j0: usize,
    sums: &mut [f32],
    widen: impl Fn(T) -> f32,
) {
    const L: usize = 16;
    let k = x.len();
    let c = sums.len();
    // SAFETY: the caller's promise, column by column.
    let col = |q: usize| unsafe { std::slice::from_raw_parts(b.at((j0 + q.min(c - 1)) * csb), k) };
    // Columns past `c` repeat the last one (computed and dropped) so the loop stays four wide.
    let (c0, c1, c2, c3) = (col(0), col(1), col(2), col(3));
    let (mut a0, mut a1, mut a2, mut a3) = ([0f32; L], [0f32; L], [0f32; L], [0f32; L]);
    let rows = x
        .chunks_exact(L)
        .zip(c0.chunks_exact(L))
        .zip(c1.chunks_exact(L));
    let rows = rows.zip(c2.chunks_exact(L)).zip(c3.chunks_exact(L));
    for ((((xs, v0), v1), v2), v3) in rows {
        for l in 0..L {
            a0[l] += xs[l] * widen(v0[l]);
            a1[l] += xs[l] * widen(v1[l]);
            a2[l] += xs[l] * widen(v2[l]);
            a3[l] += xs[l] * widen(v3[l]);
        }
    }
    let body = k / L * L;
    for (q, (a, cq)) in [(a0, c0), (a1, c1), (a2, c2), (a3, c3)]
        .iter()
        .enumerate()
        .take(c)
    {
        let mut t: f32 = a.iter().sum();
        for i in body..k {
            t += x[i] * widen(cq[i]);
        }
        sums[q] = t;
    }
}

/// From this many elements of B on, a GEMV with contiguous f32 or bf16 rows splits k
/// ([`gemv_split_k`]); below it the whole product is a few hundred microseconds at most and
/// column blocks alone parallelise it.
const SPLIT_K_MIN: usize = 1 << 20;

/// Widest column block of [`gemv_split_k`]: its f32 accumulator (16 KiB) stays in L1.
const SPLIT_K_COLS: usize = 4096;

/// Tasks [`gemv_split_k`] aims for: enough for 16 threads, fixed so that the split, and so
/// the sums, depend on the shape only.
const SPLIT_K_TASKS: usize = 16;

/// A large one-row product over contiguous f32 / bf16 rows of B, split along k as well as n:
/// each task accumulates a segment of B's rows over a column block as wide as
/// [`SPLIT_K_COLS`] into its own partial sums, so it streams whole rows (one contiguous
/// run of memory when n fits one block) — split along n only, a thread read runs of 8 KiB
/// 16 KiB apart, which the hardware prefetchers follow less well (the 1×4096×4096 product
/// read B 5–15 % slower, and with blocks of 512 columns half as fast). The task that
/// completes a column block's last segment adds its partials in segment order and finishes
/// the block: the order of every sum depends on (k, n) only, never on the thread count or on
/// which task ran last.
///
/// # Safety
/// As [`gemv`]'s, with `csb == 1` and `T` f32 or bf16.
unsafe fn gemv_split_k<T: Float>(
    x: &[f32],
    b: Ptr<T>,
    rsb: usize,
    n: usize,
    finish: &(dyn Fn(usize, f32) + Sync),
    after: After<'_>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let k = x.len();
    let blocks = n.div_ceil(SPLIT_K_COLS);
    let cols = n.div_ceil(blocks).next_multiple_of(16).min(n);
    let blocks = n.div_ceil(cols);
    // Segments of at least 256 rows, a multiple of 4 (`axpy_rows` takes rows four at a time).
    let segs = (SPLIT_K_TASKS / blocks).clamp(1, (k / 256).max(1));
    let seg_rows = k.div_ceil(segs).next_multiple_of(4);
    let segs = k.div_ceil(seg_rows);
    // Segment s's partial sums of column j at s·n + j; every task writes its own range.
    let mut partial = vec![0f32; segs * n];
    let parts = Ptr(partial.as_mut_ptr());
    let done: Vec<AtomicUsize> = (0..blocks).map(|_| AtomicUsize::new(0)).collect();
    fork_tasks(segs * blocks, &|t| {
        let (seg, blk) = (t / blocks, t % blocks);
        let (j0, w) = (blk * cols, cols.min(n - blk * cols));
        let rows = seg * seg_rows..((seg + 1) * seg_rows).min(k);
        // SAFETY: this task's own range of `partial`, which outlives the fork.
        let acc = unsafe { std::slice::from_raw_parts_mut(parts.at(seg * n + j0), w) };
        let xs = &x[rows.clone()];
        // SAFETY: rows `rows`, columns j0..j0+w of B (the caller's promise), whose dtype T
        // is f32 or bf16 (checked by the caller).
        unsafe {
            let at = Ptr(b.at(rows.start * rsb));
            if T::DTYPE == DType::F32 {
                let bf = Ptr(at.0 as *mut f32);
                simd!(axpy_rows(acc, xs, bf, rsb, j0, |v| v));
            } else {
                let bh = Ptr(at.0 as *mut u16);
                let widen = |v: u16| f32::from_bits(u32::from(v) << 16);
                simd!(axpy_rows(acc, xs, bh, rsb, j0, widen));
            }
        }
        // The acquire half sees every other segment's partial sums of this block; the
        // release half publishes this one's.
        if done[blk].fetch_add(1, Ordering::AcqRel) + 1 == segs {
            // SAFETY: every segment of this block is done; only this task reads them now.
            let first = unsafe { std::slice::from_raw_parts_mut(parts.at(j0), w) };
            for s in 1..segs {
                // SAFETY: segment s's range of this block, complete and no longer written.
                let more = unsafe { std::slice::from_raw_parts(parts.at(s * n + j0), w) };
                simd!(add_into(first, more));
            }
            for (t, &v) in first.iter().enumerate() {
                finish(j0 + t, v);
            }
            after(0..1, j0..j0 + w);
        }
    });
}

/// `acc[t] += v[t]`.
#[inline(always)]
fn add_into(acc: &mut [f32], v: &[f32]) {
    for (a, &b) in acc.iter_mut().zip(v) {
        *a += b;
    }
}

/// `c[j] = alpha · Σ_i x[i]·B[i, j] + beta · c[j]` for one row `x` (f32 values), reading B in
/// its own dtype.
///
/// # Safety
/// B must be valid for k×n at (rsb, csb); c for n elements at `csc`, not overlapping B.
#[allow(clippy::too_many_arguments)] // the BLAS signature
pub(super) unsafe fn gemv<T: Float>(
    x: &[f32],
    b: Ptr<T>,
    rsb: usize,
    csb: usize,
    n: usize,
    alpha: f32,
    beta: f32,
    c: Ptr<T>,
    csc: usize,
    after: After<'_>,
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
    if csb == 1 && matches!(T::DTYPE, DType::F32 | DType::BF16) && k * n >= SPLIT_K_MIN {
        // SAFETY: the caller's promise, passed on.
        unsafe { gemv_split_k(x, b, rsb, n, &finish, after) };
        return;
    }
    if csb == 1 || rsb != 1 {
        // B rows are (mostly) contiguous: accumulate row by row over column blocks, one
        // block per thread where n allows (each row then streams as one long run; a column
        // sums in the same order whatever the block width).
        let cols = n
            .div_ceil(rayon::current_num_threads().max(1))
            .next_multiple_of(64)
            .clamp(512, 2048);
        par_chunks(n.div_ceil(cols), k * cols, |blocks| {
            let (mut acc, mut row) = (vec![0f32; cols], vec![0f32; cols]);
            for blk in blocks {
                let (j0, w) = (blk * cols, cols.min(n - blk * cols));
                acc[..w].fill(0.0);
                if csb == 1 && matches!(T::DTYPE, DType::F32 | DType::BF16) {
                    // f32 and bf16 rows are read in place, four at a time, without a copy.
                    // SAFETY: rows 0..k, columns j0..j0+w of B, whose dtype T is checked.
                    unsafe {
                        if T::DTYPE == DType::F32 {
                            let bf = Ptr(b.0 as *mut f32);
                            simd!(axpy_rows(&mut acc[..w], x, bf, rsb, j0, |v| v));
                        } else {
                            let bh = Ptr(b.0 as *mut u16);
                            let widen = |v: u16| f32::from_bits(u32::from(v) << 16);
                            simd!(axpy_rows(&mut acc[..w], x, bh, rsb, j0, widen));
                        }
                    }
                    for (t, &v) in acc[..w].iter().enumerate() {
                        finish(j0 + t, v);
                    }
                    after(0..1, j0..j0 + w);
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
                after(0..1, j0..j0 + w);
            }
        });
    } else {
        // B columns are contiguous (a transposed weight, a linear layer's `[out, in]`): one
        // dot product per column; f32 and bf16 columns are read in place, four at a time.
        par_chunks(n, k, |cols| {
            if matches!(T::DTYPE, DType::F32 | DType::BF16) {
                let mut j = cols.start;
                while j < cols.end {
                    let c = (cols.end - j).min(4);
                    let mut sums = [0f32; 4];
                    // SAFETY: columns j..j+c of B (the caller's promise), of dtype T.
                    unsafe {
                        if T::DTYPE == DType::F32 {
                            let bf = Ptr(b.0 as *mut f32);
                            simd!(dot_cols(x, bf, csb, j, &mut sums[..c], |v| v));
                        } else {
                            let bh = Ptr(b.0 as *mut u16);
                            let widen = |v: u16| f32::from_bits(u32::from(v) << 16);
                            simd!(dot_cols(x, bh, csb, j, &mut sums[..c], widen));
                        }
                    }
                    for (t, &v) in sums[..c].iter().enumerate() {
                        finish(j + t, v);
                    }
                    j += c;
                }
            } else {
                let mut col = vec![0f32; k];
                for j in cols.clone() {
                    // SAFETY: column j of B.
                    unsafe { gather(b.at(j * csb), rsb, &mut col) };
                    finish(j, simd!(dot(x, &col)));
                }
            }
            after(0..1, cols);
        });
    }
}
