//! One-row and few-row products (`m×k · k×n`, m ≤ 8: a decode step's GEMVs, or a few
//! batched) for [`super::matmul`]: memory-bound, so they read B in place in its own dtype
//! (f32, or bf16 and f16 widened exactly in the loops' registers) instead of packing it,
//! and the whole question is how B's memory streams. Rows of B contiguous: each task
//! accumulates a range of B's rows over a column block, whole rows where they fit (split
//! along k as well as n for large weights, [`gemv_split_k`]). Columns contiguous (a linear
//! layer's `[out, in]` weight seen transposed): dot products four columns at a time
//! ([`dot_cols`]). Two to eight rows of A over a large B read it in place the same way,
//! once for all rows (`gemv_rows.rs`). Every sum's order depends on the
//! shape alone, never on the thread count.

use std::ops::Range;

use super::matmul::After;
use crate::error::Result;

use super::util::{
    axpy, fork_tasks, gather, par_chunks, simd, try_par_chunks, Float, Ptr, Scratch,
};

/// Runs `$body` with `$p` bound to `$b` (a `*mut T`) as a pointer to f32 or to u16 (bf16,
/// f16) by the dtype of `$t`, and `$widen` to the matching exact widening into f32 (for
/// f16, the faster of two unless the thread flushes subnormal inputs).
macro_rules! float_bits {
    ($t:ty, $b:expr, |$p:ident, $widen:ident| $body:expr) => {
        match <$t as $crate::vendors::cpu::kernels::util::Float>::DTYPE {
            $crate::tensor::DType::F32 => {
                let $p = $crate::vendors::cpu::kernels::util::Ptr($b as *mut f32);
                let $widen = |v: f32| v;
                $body
            }
            $crate::tensor::DType::BF16 => {
                let $p = $crate::vendors::cpu::kernels::util::Ptr($b as *mut u16);
                let $widen = |v: u16| f32::from_bits(u32::from(v) << 16);
                $body
            }
            _ if !$crate::vendors::cpu::kernels::gemv::denormals_are_zero() => {
                let $p = $crate::vendors::cpu::kernels::util::Ptr($b as *mut u16);
                let $widen = $crate::vendors::cpu::kernels::gemv::f16_bits_to_f32_scaled;
                $body
            }
            _ => {
                let $p = $crate::vendors::cpu::kernels::util::Ptr($b as *mut u16);
                let $widen = $crate::vendors::cpu::kernels::gemv::f16_bits_to_f32;
                $body
            }
        }
    };
}
pub(super) use float_bits;

/// An f16's bits widened to f32, exactly, in operations the compiler vectorises with the
/// loop around it (F16C's conversion is an intrinsic the autovectoriser does not reach):
/// the exponent and fraction are moved into f32's fields and scaled by 2¹¹², which is exact
/// for normal and subnormal values alike, and an all-ones exponent (infinity, NaN) is set
/// to f32's. A subnormal f16 passes through a subnormal f32 on the way, so this is only
/// used while the thread does not treat subnormal inputs as zero ([`denormals_are_zero`]).
/// Read in place this way, f16 B streams nearly as bf16 does (1 × 4096 × 4096: 1.2–1.3 ms;
/// it was gathered and widened one element at a time, about 3.8 ms).
#[inline(always)]
pub(super) fn f16_bits_to_f32_scaled(h: u16) -> f32 {
    let h = u32::from(h);
    let (sign, em) = ((h & 0x8000) << 16, h & 0x7fff);
    let scaled = (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits();
    let magnitude = if em >= 0x7c00 {
        (em << 13) | 0x7f80_0000
    } else {
        scaled
    };
    f32::from_bits(magnitude | sign)
}

/// [`f16_bits_to_f32_scaled`]'s widening with normal arithmetic only, for a thread that
/// flushes subnormal inputs (a host program built with fast-math options may set that):
/// the exponent is rebiased by 112 (by 112 more for infinity and NaN), and a subnormal by
/// 113, as `2⁻¹⁴ + fraction·2⁻²⁴`, with `2⁻¹⁴` then subtracted. Masks rather than selects,
/// which kept the few-row loops from vectorising (4 × 4096 × 4096: 10–14 ms); about 10–25 %
/// slower than the scaled form.
#[inline(always)]
pub(super) fn f16_bits_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let em = h & 0x7fff;
    let subnormal = u32::from(em < 0x0400);
    let special = u32::from(em >= 0x7c00);
    let bits = (em << 13) + (112 << 23) + (subnormal << 23) + special * (112 << 23);
    let v = f32::from_bits(bits) - f32::from_bits(subnormal * (113 << 23));
    f32::from_bits(v.to_bits() | ((h & 0x8000) << 16))
}

/// Whether this thread's SSE control word treats subnormal inputs as zero (DAZ, bit 6 of
/// MXCSR). Elsewhere than x86-64, assumed so (the widening then takes normal arithmetic).
#[inline(always)]
pub(super) fn denormals_are_zero() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: reading MXCSR has no effect; SSE is part of x86-64's baseline. (Deprecated
        // for its misuse as a setter of rounding modes; reading the flags is its purpose.)
        #[allow(deprecated)]
        let csr = unsafe { std::arch::x86_64::_mm_getcsr() };
        csr & 0x40 != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    true
}

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

/// `put(j, Σ_i x[i]·B[i, j])` for every column j in `cols` of a B whose
/// columns are contiguous (`csb` apart), [`dot_cols`] four columns at a time.
///
/// # Safety
/// B must be valid for `x.len()` elements of each column in `cols`.
pub(super) unsafe fn dots<T: Float>(
    x: &[f32],
    b: Ptr<T>,
    csb: usize,
    cols: Range<usize>,
    mut put: impl FnMut(usize, f32),
) {
    // (The dtype's dispatch and the SIMD tier's entry once for all columns.)
    // SAFETY: columns `cols` of B (the caller's promise), of dtype T.
    unsafe {
        float_bits!(T, b.at(0), |p, widen| {
            simd!({
                let mut j = cols.start;
                while j < cols.end {
                    let c = (cols.end - j).min(4);
                    let mut sums = [0f32; 4];
                    dot_cols(x, p, csb, j, &mut sums[..c], widen);
                    for (q, &v) in sums[..c].iter().enumerate() {
                        put(j + q, v);
                    }
                    j += c;
                }
            })
        })
    }
}

/// From this many elements of B on, a GEMV with contiguous rows of B splits k
/// ([`gemv_split_k`]); below it the whole product is a few hundred microseconds at most and
/// column blocks alone parallelise it.
const SPLIT_K_MIN: usize = 1 << 20;

/// Widest column block of [`gemv_split_k`]: its f32 accumulator (16 KiB) stays in L1.
const SPLIT_K_COLS: usize = 4096;

/// Tasks [`gemv_split_k`] aims for: enough for 16 threads, fixed so that the split, and so
/// the sums, depend on the shape only.
const SPLIT_K_TASKS: usize = 16;

/// A large one-row product over contiguous rows of B, split along k as well as n:
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
/// As [`gemv`]'s, with `csb == 1`.
unsafe fn gemv_split_k<T: Float>(
    x: &[f32],
    b: Ptr<T>,
    rsb: usize,
    n: usize,
    finish: &(dyn Fn(usize, f32) + Sync),
    after: After<'_>,
) -> Result<()> {
    let k = x.len();
    let accumulate = |rows: Range<usize>, j0: usize, w: usize, part: Ptr<f32>| {
        // SAFETY: this task's own w partial sums (`split_k`'s promise).
        let acc = unsafe { std::slice::from_raw_parts_mut(part.0, w) };
        // SAFETY: rows `rows`, columns j0..j0+w of B (the caller's promise), whose dtype T
        // is one of `float_bits!`'s.
        unsafe {
            float_bits!(T, b.at(rows.start * rsb), |p, widen| {
                simd!(axpy_rows(acc, &x[rows], p, rsb, j0, widen))
            })
        }
    };
    split_k(
        k,
        n,
        1,
        SPLIT_K_COLS,
        16,
        &accumulate,
        &|_, j, v| finish(j, v),
        after,
    )
}

/// The split and merge of [`gemv_split_k`] and [`gemv_rows`](super::gemv_rows::gemv_rows)
/// for `rows` rows of A: column blocks at most `widest` wide (a multiple of `align`) times
/// segments of B's rows (at least 256, a multiple of 4, about [`SPLIT_K_TASKS`] tasks in
/// all). Each task calls `accumulate(b_rows, j0, w, part)` to add B's rows `b_rows`, columns
/// `j0..j0 + w` into its own zeroed partial sums, row r's at `part + r·n` (w of them); the
/// task completing a block's last segment adds the block's partials in segment order and
/// calls `finish(r, j, v)` for each element, then `after`. The order of every sum depends on
/// the shape only.
#[allow(clippy::too_many_arguments)]
pub(super) fn split_k(
    k: usize,
    n: usize,
    rows: usize,
    widest: usize,
    align: usize,
    accumulate: &(dyn Fn(Range<usize>, usize, usize, Ptr<f32>) + Sync),
    finish: &(dyn Fn(usize, usize, f32) + Sync),
    after: After<'_>,
) -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let blocks = n.div_ceil(widest);
    let cols = n.div_ceil(blocks).next_multiple_of(align).min(n);
    let blocks = n.div_ceil(cols);
    let segs = (SPLIT_K_TASKS / blocks).clamp(1, (k / 256).max(1));
    let seg_rows = k.div_ceil(segs).next_multiple_of(4);
    let segs = k.div_ceil(seg_rows);
    // Segment s's partial sums of row r, column j at (s·rows + r)·n + j.
    let mut partial = Scratch::zeroed(segs * rows * n)?;
    let parts = Ptr(partial.as_mut_ptr());
    let done: Vec<AtomicUsize> = (0..blocks).map(|_| AtomicUsize::new(0)).collect();
    fork_tasks(segs * blocks, &|t| {
        let (seg, blk) = (t / blocks, t % blocks);
        let (j0, w) = (blk * cols, cols.min(n - blk * cols));
        let b_rows = seg * seg_rows..((seg + 1) * seg_rows).min(k);
        // SAFETY: inside `partial`, which outlives the fork; the task's ranges are its own.
        accumulate(b_rows, j0, w, Ptr(unsafe { parts.at(seg * rows * n + j0) }));
        // The acquire half sees every other segment's partial sums of this block; the
        // release half publishes this one's.
        if done[blk].fetch_add(1, Ordering::AcqRel) + 1 == segs {
            for r in 0..rows {
                // SAFETY: every segment of this block is done; only this task reads them.
                let first = unsafe { std::slice::from_raw_parts_mut(parts.at(r * n + j0), w) };
                for s in 1..segs {
                    // SAFETY: segment s's range of row r in this block, complete.
                    let more =
                        unsafe { std::slice::from_raw_parts(parts.at((s * rows + r) * n + j0), w) };
                    simd!(add_into(first, more));
                }
                for (t, &v) in first.iter().enumerate() {
                    finish(r, j0 + t, v);
                }
            }
            after(0..rows, j0..j0 + w);
        }
    });
    Ok(())
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
) -> Result<()> {
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
    if csb == 1 && k * n >= SPLIT_K_MIN {
        // SAFETY: the caller's promise, passed on.
        return unsafe { gemv_split_k(x, b, rsb, n, &finish, after) };
    }
    if csb == 1 || rsb != 1 {
        // B rows are (mostly) contiguous: accumulate row by row over column blocks, one
        // block per thread where n allows (each row then streams as one long run; a column
        // sums in the same order whatever the block width).
        let cols = n
            .div_ceil(crate::host_threads::threads())
            .next_multiple_of(64)
            .clamp(512, 2048);
        try_par_chunks(n.div_ceil(cols), k * cols, |blocks| {
            let (mut acc, mut row) = (Scratch::zeroed(cols)?, Scratch::zeroed(cols)?);
            for blk in blocks {
                let (j0, w) = (blk * cols, cols.min(n - blk * cols));
                acc[..w].fill(0.0);
                if csb == 1 {
                    // Contiguous rows are read in place, four at a time, without a copy.
                    // SAFETY: rows 0..k, columns j0..j0+w of B (the caller's promise).
                    unsafe {
                        float_bits!(T, b.at(0), |p, widen| {
                            simd!(axpy_rows(&mut acc[..w], x, p, rsb, j0, widen))
                        })
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
            Ok(())
        })
    } else {
        // B columns are contiguous (a transposed weight, a linear layer's `[out, in]`): one
        // dot product per column, read in place, four columns at a time.
        par_chunks(n, k, |cols| {
            // SAFETY: the columns of B in `cols` (the caller's promise; rsb is 1 here).
            unsafe { dots(x, b, csb, cols.clone(), &finish) };
            after(0..1, cols);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both f16 widenings against `half`'s conversion, for all 65 536 bit patterns (a NaN
    /// as a NaN of the same sign); the one for flushing threads under such a mode as well.
    #[test]
    fn f16_widenings_are_exact() {
        let check = |widen: fn(u16) -> f32, mode: &str| {
            for h in 0..=u16::MAX {
                let (want, got) = (half::f16::from_bits(h).to_f32(), widen(h));
                if want.is_nan() {
                    let same_sign = got.is_sign_negative() == want.is_sign_negative();
                    assert!(got.is_nan() && same_sign, "{h:#06x} {mode}: {got}");
                } else {
                    assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x} {mode}: {got}");
                }
            }
        };
        assert!(!denormals_are_zero());
        check(f16_bits_to_f32_scaled, "scaled");
        check(f16_bits_to_f32, "normal arithmetic");
        #[cfg(target_arch = "x86_64")]
        {
            #[allow(deprecated)]
            use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
            // SAFETY: this test thread's own control word: DAZ and FTZ on, then restored.
            #[allow(deprecated)]
            let old = unsafe { _mm_getcsr() };
            #[allow(deprecated)]
            unsafe {
                _mm_setcsr(old | 0x8040)
            };
            let flushing = denormals_are_zero();
            // Read through black_box so that the conversions run under the mode rather than
            // being folded at compile time.
            let widened = (0..=u16::MAX)
                .map(|h| std::hint::black_box(f16_bits_to_f32 as fn(u16) -> f32)(h))
                .collect::<Vec<f32>>();
            #[allow(deprecated)]
            unsafe {
                _mm_setcsr(old)
            };
            assert!(flushing);
            for (h, got) in (0..=u16::MAX).zip(widened) {
                let want = half::f16::from_bits(h).to_f32();
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{h:#06x} under DAZ: {got}"
                );
            }
        }
    }
}
