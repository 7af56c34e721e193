//! `rearrange` (strided copy of any layout into any layout) and `concat`. Both move elements
//! as plain words of the dtype's size, so one kernel serves every dtype.

use rayon::prelude::*;

use super::util::{coalesce, par_rows, Ptr};
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

/// Block of the blocked transpose along the source's contiguous dimension `b`.
const TILE: usize = 64;
/// Block along the destination's contiguous dimension `a`: the source lines one block reads
/// lie a whole row apart, often a power of two, so they share one L1 set; eight stay within
/// the usual 8 ways (32 × 32 blocks ran at half the speed: `unirt bench ops`
/// `rearrange_transp`).
const TILE_A: usize = 8;

/// The copy as a transpose, when it is one: the destination contiguous along its innermost
/// dimension `a` and the source along another dimension `b`, both at least 16 long.
/// Element by element along `a`, every source read would land on a new cache line; in
/// [`TILE`] × [`TILE_A`] blocks the block's source lines stay in L1 while the block is
/// written, so both sides stream. Returns whether it copied. Parallel over the other dimensions and
/// the blocks along `b`.
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
    (0..n_outer * tiles_b).into_par_iter().for_each(|t| {
        let (mut od, mut os, mut rem) = (0, 0, t / tiles_b);
        for &d in outer.iter().rev() {
            let i = rem % shape[d];
            rem /= shape[d];
            od += i * strides[d][0];
            os += i * strides[d][1];
        }
        let b0 = (t % tiles_b) * TILE;
        let b1 = (b0 + TILE).min(nb);
        for a0 in (0..na).step_by(TILE_A) {
            let a1 = (a0 + TILE_A).min(na);
            let mut bi = b0;
            if a1 - a0 == 8 && (words2 || words4) {
                // 8 × 8 tiles through registers: eight row loads, the transpose in
                // shuffles, eight row stores (instead of 64 single-element copies).
                while bi + 8 <= b1 {
                    // SAFETY: rows a0..a0+8 and columns bi..bi+8 of the block lie inside the
                    // shape (the caller's promise); W is 4 bytes and the CPU has AVX2
                    // (words4), or W is 2 bytes (words2, SSE2 on every x86-64).
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        let (src, dst) = (ps.at(os + bi + a0 * sa), pd.at(od + bi * db + a0));
                        if words4 {
                            transpose8x8(src as *const u32, sa, dst as *mut u32, db)
                        } else {
                            transpose8x8_u16(src as *const u16, sa, dst as *mut u16, db)
                        }
                    };
                    bi += 8;
                }
            }
            for bi in bi..b1 {
                for ai in a0..a1 {
                    // SAFETY: (bi, ai) and the outer index lie inside the shape, so both
                    // addresses lie in their checked views (the caller's promise).
                    unsafe { *pd.at(od + bi * db + ai) = *ps.at(os + bi + ai * sa) };
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
