//! Packing for the blocked GEMM: a region of A or B copied (and widened to f32) into the
//! panels the register-tile kernels read, padded with zeros past the matrix's edge, and the
//! aligned buffers it is packed into.

use std::ops::Range;

use super::super::util::Float;
use super::Mat;
use crate::tensor::DType;

/// Packs rows `rows` × columns `cols` of `src` (widened to f32) into panels of `W` — of
/// columns (`by_cols`: B, each step of k holds W consecutive columns) or of rows (A, each
/// step W rows) — padded with zeros past the edge.
///
/// # Safety
/// The region is inside `src`; the CPU runs unirt's GEMM (its tier has F16C).
pub(super) unsafe fn pack<const W: usize, S: Float>(
    dst: &mut [f32],
    src: Mat<S>,
    rows: Range<usize>,
    cols: Range<usize>,
    by_cols: bool,
) {
    // (steps of k, width to panel) in packing order, and the source's strides along each.
    let (steps, wide) = if by_cols {
        (rows.clone(), cols.clone())
    } else {
        (cols.clone(), rows.clone())
    };
    let (along_k, across) = if by_cols {
        (src.rs, src.cs)
    } else {
        (src.cs, src.rs)
    };
    let kc = steps.len();
    // The element at (step, w) of the source.
    let at = |s: usize, w: usize| -> usize { s * along_k + w * across };
    let unit = across == 1;
    // Values contiguous along k (the usual row-major A; a B with contiguous columns, `x · Wᵀ`
    // over a linear layer's `[out, in]` weight): each panel is a transpose of W such runs.
    #[cfg(target_arch = "x86_64")]
    if along_k == 1 {
        let runs = Mat {
            p: src.p,
            rs: across,
            cs: 1,
        };
        // SAFETY: the caller's region, seen as `wide` runs of `steps`; the GEMM runs on CPUs
        // with F16C.
        unsafe { pack_rows::<W, S>(dst, runs, wide.clone(), steps.clone()) };
        return;
    }
    let panels = wide.len().div_ceil(W);
    // Step p of panel q: W values, or fewer beside zeros at the edge.
    let mut put = |q: usize, p: usize| {
        let w0 = wide.start + q * W;
        let ww = W.min(wide.end - w0);
        let s = steps.start + p;
        let out = &mut dst[q * W * kc + p * W..][..W];
        if unit && ww == W {
            // SAFETY: W consecutive elements of the region.
            let run = unsafe { std::slice::from_raw_parts(src.p.at(at(s, w0)), W) };
            S::load(run, out);
        } else {
            for (x, o) in out.iter_mut().enumerate() {
                // SAFETY: inside the region (x < ww).
                *o = if x < ww {
                    unsafe { (*src.p.at(at(s, w0 + x))).to_f32() }
                } else {
                    0.0
                };
            }
        }
    };
    if unit {
        // Step-major when each step's values are contiguous (a row of B): every row is read
        // from start to end, which the hardware prefetcher follows; panel-major would jump
        // a whole row stride for every 128 bytes (1.2× on 64×4096 · 4096×11008).
        for p in 0..kc {
            for q in 0..panels {
                put(q, p);
            }
        }
    } else {
        for q in 0..panels {
            for p in 0..kc {
                put(q, p);
            }
        }
    }
}

/// [`pack`] of a matrix's rows when each row is contiguous (the usual row-major A, or the
/// transpose of a B whose columns are contiguous): panels of `W` rows, each step of k
/// holding the `W` rows' values of one column, widened to f32. That is a transpose, done
/// 4 rows × 4 columns at a time in SSE registers (four loads, widened where `S` is 16-bit,
/// eight shuffles, four stores) where element by element it took four strided scalar
/// loads and stores per four values; the rows and columns left over, and the zeros past
/// the last row, go one by one. (B = Wᵀ at 64 × 4096 × 4096 f32: 29.6 ms gathered element
/// by element, 14.8 this way, against 14.0 with B stored `[k, n]`.)
///
/// # Safety
/// The region is inside `src`, whose column stride is 1; the CPU has F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
pub(super) unsafe fn pack_rows<const W: usize, S: Float>(
    dst: &mut [f32],
    src: Mat<S>,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    use std::arch::x86_64::{
        _mm_movehl_ps, _mm_movelh_ps, _mm_storeu_ps, _mm_unpackhi_ps, _mm_unpacklo_ps,
    };
    let kc = cols.len();
    let (k4, panels) = (kc / 4 * 4, rows.len().div_ceil(W));
    for q in 0..panels {
        let r0 = rows.start + q * W;
        let ww = W.min(rows.end - r0);
        let out = &mut dst[q * W * kc..][..W * kc];
        // Row r's first value (only computed for rows past the edge, never read).
        let row = |r: usize| src.p.0.wrapping_add((r0 + r) * src.rs + cols.start) as *const S;
        let grouped = ww / 4 * 4;
        for g in (0..grouped).step_by(4) {
            let (x0, x1, x2, x3) = (row(g), row(g + 1), row(g + 2), row(g + 3));
            for p in (0..k4).step_by(4) {
                // SAFETY: columns p..p + 4 of four rows inside the region; the stores land
                // in steps p..p + 4, rows g..g + 4 of the panel (`out` holds kc · W values,
                // so the bounds check below is the slice's own); F16C is the caller's.
                unsafe {
                    let (a, b) = (load4(x0.add(p)), load4(x1.add(p)));
                    let (c, d) = (load4(x2.add(p)), load4(x3.add(p)));
                    let (lo_ab, lo_cd) = (_mm_unpacklo_ps(a, b), _mm_unpacklo_ps(c, d));
                    let (hi_ab, hi_cd) = (_mm_unpackhi_ps(a, b), _mm_unpackhi_ps(c, d));
                    let o = out[p * W + g..(p + 3) * W + g + 4].as_mut_ptr();
                    _mm_storeu_ps(o, _mm_movelh_ps(lo_ab, lo_cd));
                    _mm_storeu_ps(o.add(W), _mm_movehl_ps(lo_cd, lo_ab));
                    _mm_storeu_ps(o.add(2 * W), _mm_movelh_ps(hi_ab, hi_cd));
                    _mm_storeu_ps(o.add(3 * W), _mm_movehl_ps(hi_cd, hi_ab));
                }
            }
        }
        // What the transposes left: the last columns of the grouped rows, every column of
        // the other rows, zeros past the edge.
        for p in 0..kc {
            let from = if p < k4 { grouped } else { 0 };
            for r in from..W {
                // SAFETY: inside the region (r < ww).
                out[p * W + r] = if r < ww {
                    unsafe { (*row(r).add(p)).to_f32() }
                } else {
                    0.0
                };
            }
        }
    }
}

/// Four consecutive values at `p`, widened to f32 exactly (bf16: the 16 bits shifted into
/// the top of each lane; f16: F16C's conversion).
///
/// # Safety
/// Four values at `p` are readable; the CPU has F16C.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "f16c")]
unsafe fn load4<S: Float>(p: *const S) -> std::arch::x86_64::__m128 {
    use std::arch::x86_64::{
        __m128i, _mm_castsi128_ps, _mm_cvtph_ps, _mm_loadl_epi64, _mm_loadu_ps, _mm_set_ps,
        _mm_setzero_si128, _mm_unpacklo_epi16,
    };
    // SAFETY: the caller's promise; each branch reads exactly four values of its dtype.
    unsafe {
        match S::DTYPE {
            DType::F32 => _mm_loadu_ps(p as *const f32),
            DType::BF16 => {
                let v = _mm_loadl_epi64(p as *const __m128i);
                _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), v))
            }
            DType::F16 => _mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i)),
            _ => {
                let v = |i: usize| (*p.add(i)).to_f32();
                _mm_set_ps(v(3), v(2), v(1), v(0))
            }
        }
    }
}

/// `len` elements of `buf` starting on a 64-byte boundary, `buf` grown if needed (packing
/// writes every element it later reads, so what a grown buffer held before does not matter).
pub(super) fn aligned(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len + 16 {
        buf.resize(len + 16, 0.0);
    }
    let start = buf.as_ptr().align_offset(64).min(16);
    &mut buf[start..start + len]
}
