//! The SIMD tier: kernels built for baseline x86-64 run their loops compiled for AVX2 or
//! AVX-512, chosen once per process from what the CPU has.

/// The widest vector instruction set the CPU kernels use: detected once, capped by
/// `UNIRT_CPU_SIMD` (`avx512`, `avx2` or `none`) to reproduce a smaller CPU's code path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum SimdTier {
    /// Baseline code, as built.
    None = 1,
    /// AVX2, FMA and F16C: 8 f32 lanes.
    Avx2 = 2,
    /// AVX-512 F/BW/DQ/VL with FMA: 16 f32 lanes.
    Avx512 = 3,
}

/// 0 until the first kernel asks; then the tier as a `SimdTier` discriminant.
static SIMD_TIER: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

fn detect_simd_tier() -> SimdTier {
    #[allow(unused_mut)]
    let mut tier = SimdTier::None;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            tier = SimdTier::Avx2;
            if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
                tier = SimdTier::Avx512;
            }
        }
    }
    let cap = match std::env::var("UNIRT_CPU_SIMD").as_deref() {
        Ok("none") => SimdTier::None,
        Ok("avx2") => SimdTier::Avx2,
        _ => SimdTier::Avx512,
    };
    tier.min(cap)
}

/// The tier [`with_simd`] compiles for on this CPU.
#[inline(always)]
pub fn simd_tier() -> SimdTier {
    use std::sync::atomic::Ordering;
    match SIMD_TIER.load(Ordering::Relaxed) {
        3 => SimdTier::Avx512,
        2 => SimdTier::Avx2,
        1 => SimdTier::None,
        _ => {
            let t = detect_simd_tier();
            SIMD_TIER.store(t as u8, Ordering::Relaxed);
            t
        }
    }
}

/// Runs `f` compiled for the widest vector instructions the CPU has ([`simd_tier`]): AVX-512
/// (16-wide f32) or AVX2 with FMA (8-wide), while the build targets baseline x86-64;
/// elsewhere `f` runs as built. The check is one relaxed atomic load. Only code inlined into
/// the wrapper is compiled for its features, and LLVM does not inline a large closure on its
/// own (the kernels then ran 4-wide SSE, issue 13): call it through [`simd!`], which marks the
/// closure `#[inline(always)]`, with a body that calls `#[inline(always)]` code. The tiers
/// compute the same bits: Rust never reassociates or contracts float arithmetic (plain
/// `a * b + c` stays two roundings, so a wider vector only runs more lanes of the same
/// operations, and reductions keep the accumulators the source writes), and explicit
/// `mul_add` (as in [`exp_f32`](super::math::exp_f32)) is one rounding everywhere (a libm call on a CPU without
/// FMA), so results do not depend on the CPU.
#[inline(always)]
pub fn with_simd<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        match simd_tier() {
            SimdTier::Avx512 => {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
                unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
                    f()
                }
                // SAFETY: simd_tier() is Avx512 only when the CPU has these features.
                return unsafe { avx512(f) };
            }
            SimdTier::Avx2 => {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
                    f()
                }
                // SAFETY: simd_tier() is Avx2 or above only when the CPU has AVX2 and FMA.
                return unsafe { avx2(f) };
            }
            SimdTier::None => {}
        }
    }
    f()
}

/// `simd!(expr)`: evaluates `expr` through [`with_simd`] in an `#[inline(always)]` closure, so
/// the expression really is compiled for the CPU's vector instructions.
macro_rules! simd {
    ($e:expr) => {
        crate::vendors::cpu::kernels::util::with_simd(
            #[inline(always)]
            || $e,
        )
    };
}
pub(crate) use simd;
