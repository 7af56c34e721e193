//! `rearrange` (strided copy of any layout into any layout) and `concat`. Both move elements
//! as plain words of the dtype's size, so one kernel serves every dtype.

use super::util::{coalesce, fork_tasks, par_rows, Ptr};
#[cfg(target_arch = "x86_64")]
use super::util::{simd_tier, SimdTier};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelImpl, KernelRegistry, Params, TensorRef};
use crate::tensor::{DType, Layout};

/// Copies `src` (viewed with `src_layout`) into `dst` (viewed with `dst_layout`), same shape.
fn copy_words<W: Copy + Send + Sync + 'static>(
    dst: &TensorRef,
    dst_layout: &Layout,
    src: &TensorRef,
) {
    let (shape, strides) = coalesce(
        dst_layout.shape(),
        [dst_layout.strides(), src.layout.strides()],
    );
    let size = std::mem::size_of::<W>();
    let pd = Ptr::<W>((dst.base as usize + dst_layout.offset() * size) as *mut W);
    let ps = Ptr::<W>::of(src);
    // SAFETY: as for the row copies below.
    if unsafe { copy_transposed(&shape, &strides, pd, ps) } {
        return;
    }
    par_rows(&shape, &strides, |off, len, st| {
        // SAFETY: the rows lie in the checked views; the plan refuses overlapping source and
        // destination, so the non-overlapping copy is sound.
        unsafe {
            if st == [1, 1] {
                std::ptr::copy_nonoverlapping(ps.at(off[1]), pd.at(off[0]), len);
            } else {
                for i in 0..len {
                    *pd.at(off[0] + i * st[0]) = *ps.at(off[1] + i * st[1]);
                }
            }
        }
    });
}

/// Rows of the destination (positions along the source's contiguous dimension `b`) one
/// parallel task writes.
const TILE: usize = 64;
/// The least block width along the destination's contiguous dimension `a` (blocks are one
/// cache line of elements each way, at least this many): the 8 × 8 register tiles.
const TILE_A: usize = 8;

/// The copy as a transpose, when it is one: the destination contiguous along its innermost
/// dimension `a` and the source along another dimension `b`, both at least 16 long.
/// Element by element along `a`, every source read would land on a new cache line; in
/// blocks of one cache line of elements each way (16 × 16 four-byte words), every line a
/// block reads or writes is whole by the block's end, so both sides stream (`unirt bench
/// ops` `rearrange_transp`, f32: 22.8 → 26.5 GB/s at 16 MiB, 6.5 → 7.4 at 64 MiB, against
/// 8-wide blocks). Returns whether it copied. Parallel over the other dimensions and strips
/// of [`TILE`] along `b`.
///
/// # Safety
/// As for the row copies of [`copy_words`]: `shape`/`strides` (coalesced) describe checked,
/// non-overlapping views of `pd` (index 0) and `ps` (index 1).
unsafe fn copy_transposed<W: Copy + Send + Sync + 'static>(
    shape: &[usize],
    strides: &[[usize; 2]],
    pd: Ptr<W>,
    ps: Ptr<W>,
) -> bool {
    let nd = shape.len();
    if nd < 2 || strides[nd - 1][0] != 1 || strides[nd - 1][1] == 1 {
        return false;
    }
    let a = nd - 1;
    let Some(b) = (0..a).find(|&d| strides[d][1] == 1) else {
        return false;
    };
    let (na, nb) = (shape[a], shape[b]);
    if na < 16 || nb < 16 {
        return false;
    }
    let (db, sa) = (strides[b][0], strides[a][1]);
    let outer: Vec<usize> = (0..nd).filter(|&d| d != a && d != b).collect();
    let n_outer: usize = outer.iter().map(|&d| shape[d]).product();
    let tiles_b = nb.div_ceil(TILE);
    #[cfg(target_arch = "x86_64")]
    let words4 = std::mem::size_of::<W>() == 4 && simd_tier() >= SimdTier::Avx2;
    #[cfg(not(target_arch = "x86_64"))]
    let words4 = false;
    let words2 = cfg!(target_arch = "x86_64") && std::mem::size_of::<W>() == 2;
    fork_tasks(n_outer * tiles_b, &|t| {
        let (mut od, mut os, mut rem) = (0, 0, t / tiles_b);
        for &d in outer.iter().rev() {
            let i = rem % shape[d];
            rem /= shape[d];
            od += i * strides[d][0];
            os += i * strides[d][1];
        }
        let b0 = (t % tiles_b) * TILE;
        let b1 = (b0 + TILE).min(nb);
        // Blocks of one cache line's worth of elements both ways: every source line a
        // block reads and every destination line it writes is whole by the block's end.
        // (Blocks 8 wide along `a` left each destination line half written until the next
        // block: with 64 destination rows a power-of-two apart open at once, a 64 MiB
        // transpose fell out of L2 and ran at 6 GB/s.)
        let line = (64 / std::mem::size_of::<W>()).max(TILE_A);
        for a0 in (0..na).step_by(line) {
            let a1 = (a0 + line).min(na);
            // The part of the block's width the 8 × 8 tiles cover.
            let a8 = if words2 || words4 {
                a0 + (a1 - a0) / 8 * 8
            } else {
                a0
            };
            let mut bi = b0;
            while a8 > a0 && bi + 8 <= b1 {
                let b_end = (bi + line).min(b1);
                let b_end = bi + (b_end - bi) / 8 * 8;
                for bt in (bi..b_end).step_by(8) {
                    for at in (a0..a8).step_by(8) {
                        // SAFETY: rows at..at+8 and columns bt..bt+8 lie inside the shape
                        // (the caller's promise); W is 4 bytes and the CPU has AVX2
                        // (words4), or W is 2 bytes (words2, SSE2 on every x86-64).
                        #[cfg(target_arch = "x86_64")]
                        unsafe {
                            let (src, dst) = (ps.at(os + bt + at * sa), pd.at(od + bt * db + at));
                            if words4 {
                                transpose8x8(src as *const u32, sa, dst as *mut u32, db)
                            } else {
                                transpose8x8_u16(src as *const u16, sa, dst as *mut u16, db)
                            }
                        };
                    }
                }
                bi = b_end;
            }
            // What the tiles left: whole rows bi.. of the strip, columns a8.. of the rest.
            for (rows, cols) in [(bi..b1, a0..a1), (b0..bi, a8..a1)] {
                for b in rows {
                    for a in cols.clone() {
                        // SAFETY: (b, a) and the outer index lie inside the shape, so both
                        // addresses lie in their checked views (the caller's promise).
                        unsafe { *pd.at(od + b * db + a) = *ps.at(os + b + a * sa) };
                    }
                }
            }
        }
    });
    true
}

/// Copies the 8 × 8 tile of 4-byte words whose rows start at `src` (row stride `sa`) into
/// its transpose at `dst` (row stride `db`): row `l` of the source becomes column `l` of the
/// destination. Shuffles move the words' bits unchanged.
///
/// # Safety
/// Both tiles must be valid (8 rows of 8 words each); the CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose8x8(src: *const u32, sa: usize, dst: *mut u32, db: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's promise: eight rows of eight words at both ends.
    unsafe {
        let r: [__m256; 8] =
            std::array::from_fn(|l| _mm256_loadu_ps(src.add(l * sa) as *const f32));
        // Pairs of rows interleaved, then pairs of pairs, then the 128-bit halves.
        let t: [__m256; 8] = std::array::from_fn(|q| {
            let (x, y) = (r[2 * (q / 2)], r[2 * (q / 2) + 1]);
            if q % 2 == 0 {
                _mm256_unpacklo_ps(x, y)
            } else {
                _mm256_unpackhi_ps(x, y)
            }
        });
        let u: [__m256; 8] = std::array::from_fn(|q| {
            let (g, h) = (4 * (q / 4), q % 4);
            let (x, y) = (t[g + h / 2], t[g + 2 + h / 2]);
            if h % 2 == 0 {
                _mm256_shuffle_ps::<0x44>(x, y)
            } else {
                _mm256_shuffle_ps::<0xEE>(x, y)
            }
        });
        for k in 0..8 {
            let (lo, hi) = (u[k % 4], u[4 + k % 4]);
            let o = if k < 4 {
                _mm256_permute2f128_ps::<0x20>(lo, hi)
            } else {
                _mm256_permute2f128_ps::<0x31>(lo, hi)
            };
            _mm256_storeu_ps(dst.add(k * db) as *mut f32, o);
        }
    }
}

/// [`transpose8x8`] for 2-byte words (f16, bf16), in SSE2 registers: interleaving 16-, 32-
/// and then 64-bit lanes turns the eight source rows into the eight destination rows.
///
/// # Safety
/// Both tiles must be valid (8 rows of 8 words each).
#[cfg(target_arch = "x86_64")]
unsafe fn transpose8x8_u16(src: *const u16, sa: usize, dst: *mut u16, db: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's promise: eight rows of eight words at both ends; SSE2 is part of
    // baseline x86-64.
    unsafe {
        let r: [__m128i; 8] =
            std::array::from_fn(|l| _mm_loadu_si128(src.add(l * sa) as *const __m128i));
        let a: [__m128i; 8] = std::array::from_fn(|q| {
            let (x, y) = (r[2 * (q / 2)], r[2 * (q / 2) + 1]);
            if q % 2 == 0 {
                _mm_unpacklo_epi16(x, y)
            } else {
                _mm_unpackhi_epi16(x, y)
            }
        });
        // b[q]: rows 0–3 (q < 4) or 4–7, columns 2q' and 2q' + 1 (q' = q % 4).
        let b: [__m128i; 8] = std::array::from_fn(|q| {
            let (g, h) = (4 * (q / 4), q % 4);
            let (x, y) = (a[g + h / 2], a[g + 2 + h / 2]);
            if h % 2 == 0 {
                _mm_unpacklo_epi32(x, y)
            } else {
                _mm_unpackhi_epi32(x, y)
            }
        });
        for k in 0..8 {
            let (lo, hi) = (b[k / 2], b[4 + k / 2]);
            let o = if k % 2 == 0 {
                _mm_unpacklo_epi64(lo, hi)
            } else {
                _mm_unpackhi_epi64(lo, hi)
            };
            _mm_storeu_si128(dst.add(k * db) as *mut __m128i, o);
        }
    }
}

fn copy_any(dst: &TensorRef, dst_layout: &Layout, src: &TensorRef) {
    match src.dtype.size() {
        1 => copy_words::<u8>(dst, dst_layout, src),
        2 => copy_words::<u16>(dst, dst_layout, src),
        4 => copy_words::<u32>(dst, dst_layout, src),
        _ => copy_words::<u64>(dst, dst_layout, src),
    }
}

fn rearrange(call: &KernelCall<'_>) -> Result<()> {
    let out = &call.outputs[0];
    copy_any(out, &out.layout, &call.inputs[0]);
    Ok(())
}

fn concat(call: &KernelCall<'_>) -> Result<()> {
    let Params::Concat { axis } = *call.params else {
        return Err(Error::Internal(format!(
            "concat: parameters {:?}",
            call.params
        )));
    };
    let out = &call.outputs[0];
    let mut start = 0;
    for src in call.inputs {
        let len = src.layout.shape()[axis];
        let view = out.layout.narrow(axis as isize, start, len)?;
        copy_any(out, &view, src);
        start += len;
    }
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    for d in DType::ALL {
        reg.builtin("rearrange", DeviceKind::Cpu, d, KernelImpl::Host(rearrange));
        reg.builtin("concat", DeviceKind::Cpu, d, KernelImpl::Host(concat));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The blocked transpose against the element-by-element definition, for 2- and 4-byte
    /// words, at sizes around the 8 × 8 tiles, the line-wide blocks and the task strips, with
    /// an outer dimension and a destination row stride wider than the rows.
    #[test]
    fn blocked_transpose_matches_the_definition() {
        fn check<W: Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static>(
            from: impl Fn(usize) -> W,
        ) {
            for (na, nb) in [(16, 16), (17, 23), (31, 33), (40, 72), (64, 129), (8, 100)] {
                let outer = 2;
                let pad = 3; // destination rows na + pad apart
                let src: Vec<W> = (0..outer * na * nb).map(&from).collect();
                let zero = from(usize::MAX);
                let mut dst = vec![zero; outer * nb * (na + pad)];
                // Destination [outer, nb, na] with row stride na + pad; the source is
                // [outer, na, nb] contiguous, read transposed.
                let shape = [outer, nb, na];
                let strides = [[nb * (na + pad), na * nb], [na + pad, 1], [1, nb]];
                let (pd, ps) = (Ptr(dst.as_mut_ptr()), Ptr(src.as_ptr() as *mut W));
                // SAFETY: both views lie inside the vectors, which do not overlap.
                let done = unsafe { copy_transposed(&shape, &strides, pd, ps) };
                assert_eq!(done, na >= 16 && nb >= 16, "{na}x{nb}");
                if !done {
                    continue;
                }
                for o in 0..outer {
                    for b in 0..nb {
                        for a in 0..na {
                            let got = dst[o * nb * (na + pad) + b * (na + pad) + a];
                            assert_eq!(
                                got,
                                src[o * na * nb + a * nb + b],
                                "{na}x{nb} at {o},{b},{a}"
                            );
                        }
                        for a in na..na + pad {
                            assert_eq!(dst[o * nb * (na + pad) + b * (na + pad) + a], zero);
                        }
                    }
                }
            }
        }
        check::<u32>(|i| i as u32 ^ 0x5a5a_0000);
        check::<u16>(|i| (i as u16).wrapping_mul(7));
        check::<u64>(|i| i as u64);
    }
}
