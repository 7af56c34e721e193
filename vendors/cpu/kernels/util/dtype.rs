//! Elements computed in f32: the [`Float`] trait over f32, f16 and bf16, and the block
//! conversions between them (F16C and vectorised bf16 loops where the SIMD tier allows).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::simd::{simd_tier, SimdTier};
use crate::tensor::DType;

/// A floating-point element computed in f32.
pub trait Float: Copy + Send + Sync + Default + 'static {
    const DTYPE: DType;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    /// Converts a block (vectorised where the type allows).
    fn load(src: &[Self], dst: &mut [f32]);
    fn store(src: &[f32], dst: &mut [Self]);
}

impl Float for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    fn load(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn store(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src)
    }
}

impl Float for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn load(src: &[Self], dst: &mut [f32]) {
        f16_load(src, dst)
    }
    fn store(src: &[f32], dst: &mut [Self]) {
        f16_store(src, dst)
    }
}

impl Float for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn load(src: &[Self], dst: &mut [f32]) {
        bf16_load(src, dst)
    }
    fn store(src: &[f32], dst: &mut [Self]) {
        bf16_store(src, dst)
    }
}

/// f16 → f32 for a block: eight at a time with F16C's `vcvtph2ps` where the SIMD tier is on
/// (every AVX2 tier CPU has F16C; the tier requires it). The `half` crate's slice conversion
/// detects F16C per call and converts four elements per out-of-line step, which held f16
/// elementwise operators to a third of bf16's speed. The conversion is exact either way.
fn f16_load(src: &[f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd_tier() >= SimdTier::Avx2 {
        // SAFETY: the tier is Avx2 or above only on a CPU with AVX and F16C.
        unsafe { f16c::widen(src, dst) };
        return;
    }
    src.convert_to_f32_slice(dst)
}

/// f32 → f16 for a block: `vcvtps2ph` with round-to-nearest-even where the SIMD tier is on,
/// bit for bit `f16::from_f32` (which takes the same instruction on such a CPU; its software
/// form rounds the same way and keeps a NaN's high payload bits with the quiet bit set, as
/// the instruction does).
fn f16_store(src: &[f32], dst: &mut [f16]) {
    #[cfg(target_arch = "x86_64")]
    if simd_tier() >= SimdTier::Avx2 {
        // SAFETY: as in f16_load.
        unsafe { f16c::narrow(src, dst) };
        return;
    }
    dst.convert_from_f32_slice(src)
}

#[cfg(target_arch = "x86_64")]
mod f16c {
    use half::f16;
    use std::arch::x86_64::{
        __m128i, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_storeu_ps,
        _mm_loadu_si128, _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
    };

    /// # Safety
    /// The CPU has AVX and F16C.
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: elements i..i + 8 are in both slices; unaligned loads and stores.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        for k in i..n {
            dst[k] = src[k].to_f32();
        }
    }

    /// # Safety
    /// The CPU has AVX and F16C.
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: as in widen.
            unsafe {
                let v = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            }
            i += 8;
        }
        for k in i..n {
            dst[k] = f16::from_f32(src[k]);
        }
    }
}

/// bf16 → f32 for a block: a shift per element, in a loop the compiler vectorises (the `half`
/// crate's slice conversion converts one element at a time).
#[inline(always)]
fn bf16_widen(src: &[bf16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = bf16_bits_to_f32(s.to_bits());
    }
}

/// One bf16 (as bits) → f32: the conversion of [`bf16_widen`].
#[inline(always)]
pub fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// One f32 → bf16 bits: the conversion of [`bf16_narrow`].
#[inline(always)]
pub fn f32_to_bf16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let rounded = (x.wrapping_add(0x7fff + ((x >> 16) & 1))) >> 16;
    let nan = (x >> 16) | 0x40;
    let bits = if x & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    };
    bits as u16
}

/// f32 → bf16 for a block, branch-free so it vectorises, bit for bit `bf16::from_f32`: round
/// to nearest even, and a NaN keeps its payload's high bits with the quiet bit set.
#[inline(always)]
fn bf16_narrow(src: &[f32], dst: &mut [bf16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = bf16::from_bits(f32_to_bf16_bits(*s));
    }
}

/// [`bf16_widen`] compiled for the CPU's vector instructions.
fn bf16_load(src: &[bf16], dst: &mut [f32]) {
    super::simd!(bf16_widen(src, dst))
}

/// [`bf16_narrow`] compiled for the CPU's vector instructions.
fn bf16_store(src: &[f32], dst: &mut [bf16]) {
    super::simd!(bf16_narrow(src, dst))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block conversions of f16 (F16C where the tier is on) against `half`'s software
    /// conversions (`*_const`, which never take the instruction): every f16 widened, and f32s
    /// narrowed across every exponent with halfway cases, subnormals, infinities and NaN
    /// payloads. Odd lengths cover the scalar tails.
    #[test]
    fn f16_blocks_match_software() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut wide = vec![0f32; all.len()];
        f16_load(&all, &mut wide);
        for (h, w) in all.iter().zip(&wide) {
            let want = f16::to_f32_const(*h);
            assert!(
                want.to_bits() == w.to_bits() || (want.is_nan() && w.is_nan()),
                "{:#06x}: {w} against {want}",
                h.to_bits()
            );
        }
        let mut rng = crate::tensor::SplitMix64::new(0x5eed);
        let mut src: Vec<f32> = (0..200_003)
            .map(|i| match i % 4 {
                // Any bit pattern: NaNs with payloads, infinities, subnormals.
                0 => f32::from_bits(rng.next_u64() as u32),
                // Exactly halfway between two f16s, and one ulp either side.
                1 => {
                    let h = (rng.next_u64() as u16) & 0x7bff;
                    let mid = f16::from_bits(h).to_f32_const().to_bits() + (1 << 12);
                    f32::from_bits(
                        mid.wrapping_add((rng.next_u64() % 3) as u32)
                            .wrapping_sub(1),
                    )
                }
                _ => (rng.next_u64() as i32 as f32) * 2f32.powi((rng.next_u64() % 60) as i32 - 50),
            })
            .collect();
        src.extend([
            0.0,
            -0.0,
            65504.0,
            65520.0,
            6e-8,
            3e-8,
            f32::INFINITY,
            f32::NAN,
        ]);
        let mut narrow = vec![f16::ZERO; src.len()];
        f16_store(&src, &mut narrow);
        for (x, h) in src.iter().zip(&narrow) {
            let want = f16::from_f32_const(*x);
            assert_eq!(h.to_bits(), want.to_bits(), "{x:e} ({:#010x})", x.to_bits());
        }
    }

    /// The block conversions are bit for bit `half`'s per-element ones: every 2^32 / 7919-th
    /// bit pattern (all exponents, both signs), the rounding ties around them, and the edges.
    #[test]
    fn bf16_blocks_match_half() {
        let mut bits: Vec<u32> = (0..=u32::MAX / 7919).map(|i| i * 7919).collect();
        for b in bits.clone() {
            let base = b & !0xffff;
            bits.extend([base | 0x8000, base | 0x18000, base | 0x7fff, base | 0x8001]);
        }
        bits.extend([
            0,
            0x8000_0000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0x7f80_0001,
            0xffff_ffff,
            0x7f7f_ffff,
            0x0000_0001,
            0x807f_ffff,
        ]);
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let mut got = vec![bf16::ZERO; src.len()];
        bf16_store(&src, &mut got);
        for (i, (&s, g)) in src.iter().zip(&got).enumerate() {
            assert_eq!(
                g.to_bits(),
                bf16::from_f32(s).to_bits(),
                "bits {:#x}",
                bits[i]
            );
        }
        let mut back = vec![0f32; got.len()];
        bf16_load(&got, &mut back);
        for (g, b) in got.iter().zip(&back) {
            assert_eq!(b.to_bits(), g.to_f32().to_bits());
        }
    }
}
