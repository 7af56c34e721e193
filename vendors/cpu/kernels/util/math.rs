//! Vectorisable f32 arithmetic the kernels share: dot products and sums with many
//! accumulators, NaN-propagating maxima, and branch-free `exp`, `erf` and sigmoid (libm's are
//! a call per element).

/// Dot product with 32 accumulators, so the compiler vectorises it into independent chains
/// (eight accumulators were one chain of adds per vector: a 4096-element row took its add
/// latency 512 times, a third of a 16 MiB rms_norm).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    let (ca, cb) = (a.chunks_exact(32), b.chunks_exact(32));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..32 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `y += alpha · x`.
#[inline(always)]
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (a, b) in y.iter_mut().zip(x) {
        *a += alpha * b;
    }
}

/// `e^x` in f32, branch-free so loops over it vectorise (libm's `expf` is a call per element).
/// Cody–Waite range reduction `x = n·ln2 + r` (|r| ≤ ln2/2), then `e^r = 1 + r + r²·P(r)`
/// with P of degree 4, fitted for this function (weighted least squares on Chebyshev nodes:
/// 3·10⁻⁹ relative in exact arithmetic, far below f32's rounding; Cephes' degree-5 P, used
/// before, is one multiply-add longer for the same result: silu 12 % faster in L1 without
/// it), and `2^n` applied exactly. Within 1 ulp of the correctly rounded value on every third
/// f32 of `[-86.6, ln(f32::MAX)]` (as Cephes' was; checked so once, 2026-11-30); above that
/// +∞ and below 0 (the exact results there are under 2.6e-38, subnormal or zero in f32), so
/// `e^-∞ = 0` (a masked softmax entry) and `e^∞ = ∞` exactly; NaN stays NaN.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let (y, k) = exp_parts(x, HI_CLAMP);
    // n reaches 128 at the top, one past the exponent field: 2^(n−1) is built, and the
    // product doubled (exact, and the same bits as y·2^n wherever that is finite; a NaN y
    // stays NaN whatever the scale).
    let half_scale = f32::from_bits(k.wrapping_add(126) << 23);
    edges(x, HI_CLAMP, y * half_scale * 2.0)
}

/// [`exp_f32`] for `x ≤ 0` (softmax's `x − max`): the same bits there (and NaN for NaN),
/// without the upper clamp and the overflow select, which a non-positive argument never
/// reaches, and with `2^n` (n ≤ 0) as one multiply: three of the function's twenty-odd
/// vector operations.
#[inline(always)]
pub fn exp_nonpositive_f32(x: f32) -> f32 {
    let (y, k) = exp_parts(x, f32::INFINITY);
    edges(
        x,
        f32::INFINITY,
        y * f32::from_bits(k.wrapping_add(127) << 23),
    )
}

/// [`exp_f32`]'s bits for every x that is not NaN; for NaN, some value, not necessarily NaN.
/// For callers whose result is NaN whenever x is, whatever the exponential gave: silu's
/// `x / (1 + e^−x)`, swiglu's, gelu's tanh form. `2^n` is added into y's exponent field
/// (two vector operations fewer: silu 4 % faster in L1), which would turn a NaN y with low
/// payload bits into a number.
#[inline(always)]
pub fn exp_nan_unused_f32(x: f32) -> f32 {
    // The largest f32 below ln(f32::MAX): up to it y < 1 where n = 128, so n + y's exponent
    // stays a finite exponent. The next f32 up (exp_f32's clamp) already rounds to +∞ there.
    const HI: f32 = 88.722_83;
    let (y, k) = exp_parts(x, HI);
    edges(x, HI, f32::from_bits(y.to_bits().wrapping_add(k << 23)))
}

/// ln(f32::MAX), rounded up: exp_f32's upper clamp.
const HI_CLAMP: f32 = 88.722_84;
/// The lowest input whose result is still a normal f32 (2^n with n ≥ −125, times y ≥ 0.7).
const LO: f32 = -86.6;

/// An exponential's result `e` for x in `[LO, hi]`: +∞ above `hi` (an infinite `hi`
/// compiles the test out), 0 below LO, and `e` for NaN.
#[inline(always)]
fn edges(x: f32, hi: f32, e: f32) -> f32 {
    if x > hi {
        f32::INFINITY
    } else if x < LO {
        0.0
    } else {
        e
    }
}

/// The shared part of the exponentials, for x clamped to `[LO, hi]`: `y = e^r` and n as an
/// integer (two's complement), with `e^x = y·2^n`.
#[inline(always)]
fn exp_parts(x: f32, hi: f32) -> (f32, u32) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer without a call.
    const ROUND: f32 = 12_582_912.0;
    // Comparisons rather than f32::clamp, whose form LLVM does not vectorise; NaN passes
    // both and stays NaN. (An infinite `hi` compiles out.)
    let xc = if x < LO { LO } else { x };
    let xc = if xc > hi { hi } else { xc };
    let t = xc.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, xc));
    let mut p = 1.381_485_7e-3_f32;
    p = p.mul_add(r, 8.368_713e-3);
    p = p.mul_add(r, 4.166_838e-2);
    p = p.mul_add(r, 1.666_652_1e-1);
    p = p.mul_add(r, 0.499_999_94);
    let y = (p * r).mul_add(r, r) + 1.0;
    // n from t's bits: t = n + 1.5·2^23 (exactly: n is an integer of at most 8 bits) holds n
    // in its low mantissa bits (two's complement for negative n), so integer arithmetic on
    // t's bits gives it — t itself, not n + 1.5·2^23 computed again (the same value; LLVM
    // cannot know that, and the add was one vector operation in twenty). A float→int cast
    // would be a saturating conversion, which x86 cannot vectorise.
    (y, t.to_bits().wrapping_sub(ROUND.to_bits()))
}

/// erf in f32, branch-free so loops over it vectorise (libm's `erff` is a call per element,
/// about 60 cycles). Two polynomials fitted for this function (Chebyshev least squares,
/// evaluated with fused multiply-adds): `erf(x) = x·P(x²)` for |x| < 2 and
/// `erf(x) = ±(1 − Q(|x| − 3))` for 2 ≤ |x| < 4 (from 3.92 on, erf is 1 in f32), Q fitting
/// erfc on [2, 4] within 4·10⁻⁸ — below half an ulp of erf there, so no `e^(−x²)` factor is
/// needed (gelu's AVX-512 loop took 1.7× the time with one: an exp is twenty vector
/// operations); both are computed and one is selected. Within 5·10⁻⁷ (relative) of the exact
/// value; NaN stays NaN, ±∞ gives ±1. (erfc's far tail is thus only absolute to 4·10⁻⁸; its
/// one caller, gelu, forms `1 + erf` in f32, whose cancellation bounds it so anyway.)
#[inline(always)]
#[allow(clippy::approx_constant)] // P[0] is the fit's own, not 2/√π (which doubles the error)
pub fn erf_f32(x: f32) -> f32 {
    const P: [f32; 10] = [
        1.128_379_1,
        -3.761_261_7e-1,
        1.128_359_7e-1,
        -2.685_947_9e-2,
        5.212_269_3e-3,
        -8.429_45e-4,
        1.130_692_5e-4,
        -1.190_833_5e-5,
        8.590_942_6e-7,
        -3.080_165_5e-8,
    ];
    const Q: [f32; 11] = [
        2.209_125_7e-5,
        -1.391_494_7e-4,
        4.177_030_6e-4,
        -7.911_859_4e-4,
        1.045_075_6e-3,
        -1.004_758_2e-3,
        7.350_004e-4,
        -4.179_139e-4,
        1.411_229_8e-4,
        1.413_869_1e-5,
        -2.211_745_6e-5,
    ];
    let a = x.abs();
    let u = x * x;
    let mut p = P[9];
    for &c in P[..9].iter().rev() {
        p = p.mul_add(u, c);
    }
    let near = x * p;
    // Comparisons rather than f32::min, whose form LLVM does not vectorise; NaN passes.
    let t = if a > 4.0 { 4.0 } else { a };
    let v = t - 3.0;
    let mut q = Q[10];
    for &c in Q[..10].iter().rev() {
        q = q.mul_add(v, c);
    }
    let far = (1.0 - q).copysign(x);
    if a < 2.0 {
        near
    } else {
        far
    }
}

/// `1 / (1 + e^-x)`, vectorisable.
#[inline(always)]
pub fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

/// Sum with eight accumulators (vectorisable).
#[inline(always)]
pub fn sum_f32(v: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let c = v.chunks_exact(8);
    let rest: f32 = c.remainder().iter().sum();
    for x in c {
        for l in 0..8 {
            acc[l] += x[l];
        }
    }
    acc.iter().sum::<f32>() + rest
}

/// Maximum with sixteen lanes (vectorisable); NaN if any element is NaN. The NaN test is
/// kept per lane too: one flag for the whole run made every step reduce its lanes to a bool
/// (a third of a 16 MiB softmax went to this pass). Of equal elements (+0 and −0) any may
/// be returned.
#[inline(always)]
pub fn max_f32(v: &[f32]) -> f32 {
    extreme_f32::<true>(v)
}

/// Minimum, as [`max_f32`].
#[inline(always)]
pub fn min_f32(v: &[f32]) -> f32 {
    extreme_f32::<false>(v)
}

/// [`max_f32`] (`MAX`) or [`min_f32`].
#[inline(always)]
fn extreme_f32<const MAX: bool>(v: &[f32]) -> f32 {
    let beats = |x: f32, y: f32| if MAX { x > y } else { x < y };
    let start = if MAX {
        f32::NEG_INFINITY
    } else {
        f32::INFINITY
    };
    let mut acc = [start; 16];
    let mut nan = [0u32; 16];
    let c = v.chunks_exact(16);
    let rest = c.remainder();
    for x in c {
        for l in 0..16 {
            nan[l] |= u32::from(x[l].is_nan());
            acc[l] = if beats(x[l], acc[l]) { x[l] } else { acc[l] };
        }
    }
    let mut any_nan = nan.iter().any(|&n| n != 0);
    let mut m = start;
    for &x in acc.iter().chain(rest) {
        any_nan |= x.is_nan();
        m = if beats(x, m) { x } else { m };
    }
    if any_nan {
        f32::NAN
    } else {
        m
    }
}

/// The index of the first element of `v` equal to `m` (+0 and −0 alike), or of the first NaN
/// when `m` is NaN; `v.len()` when there is none. Blocks of 64 are tested without branches
/// (vectorisable), then the block that holds it element by element.
#[inline(always)]
pub fn first_index_f32(v: &[f32], m: f32) -> usize {
    let mut start = 0;
    for block in v.chunks(64) {
        let hit = if m.is_nan() {
            block.iter().fold(false, |a, &x| a | x.is_nan())
        } else {
            block.iter().fold(false, |a, &x| a | (x == m))
        };
        if hit {
            let at = block
                .iter()
                .position(|&x| if m.is_nan() { x.is_nan() } else { x == m });
            return start + at.unwrap_or(block.len());
        }
        start += block.len();
    }
    v.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf_f32 against f64 erf on a fine grid of [−6, 6], and at the special values.
    #[test]
    fn erf_within_tolerance() {
        let mut worst = 0f64;
        for i in -600_000..=600_000 {
            let x = i as f32 * 1e-5;
            let want = libm::erf(x as f64);
            let err = (erf_f32(x) as f64 - want).abs() / want.abs().max(1e-30);
            worst = worst.max(if x == 0.0 {
                erf_f32(x).abs() as f64
            } else {
                err
            });
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert!(erf_f32(f32::NAN).is_nan());
        assert_eq!(erf_f32(-0.0).to_bits(), (-0.0f32).to_bits());
    }

    /// exp_nonpositive_f32 is exp_f32 bit for bit on the non-positive f32s (one bit pattern
    /// in 101 with the sign set, −0 to −∞ and the negative NaNs: every exponent, 21 million
    /// values) and on the edges.
    #[test]
    fn exp_nonpositive_matches_exp() {
        for bits in (0x8000_0000u32..=0xffff_ffff).step_by(101) {
            let x = f32::from_bits(bits);
            assert_eq!(
                exp_nonpositive_f32(x).to_bits(),
                exp_f32(x).to_bits(),
                "x = {x:e} ({bits:#x})"
            );
        }
        for x in [-0.0, 0.0, -86.6, -86.600_01, f32::NEG_INFINITY, f32::NAN] {
            assert_eq!(exp_nonpositive_f32(x).to_bits(), exp_f32(x).to_bits());
        }
    }

    /// exp_nan_unused_f32 is exp_f32 bit for bit on every f32 that is not NaN (one bit
    /// pattern in 97, both signs) and on the edges. (Its callers' NaNs: `elementwise.rs`.)
    #[test]
    fn exp_nan_unused_matches_exp() {
        let edges = [88.722_83, 88.722_84, 88.8, -86.6, -86.600_01, 0.0, -0.0];
        let specials = [f32::INFINITY, f32::NEG_INFINITY];
        for bits in (0..=u32::MAX).step_by(97) {
            let x = f32::from_bits(bits);
            if !x.is_nan() {
                assert_eq!(
                    exp_nan_unused_f32(x).to_bits(),
                    exp_f32(x).to_bits(),
                    "x = {x:e}"
                );
            }
        }
        for x in edges.into_iter().chain(specials) {
            assert_eq!(
                exp_nan_unused_f32(x).to_bits(),
                exp_f32(x).to_bits(),
                "x = {x:e}"
            );
        }
    }

    #[test]
    fn exp_within_one_ulp() {
        let mut worst = 0f64;
        let mut x = -86.6f32;
        while x < 88.72 {
            let (got, want) = (exp_f32(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
            let ulps = (exp_f32(x).to_bits() as i64 - (want as f32).to_bits() as i64).abs();
            assert!(
                ulps <= 1,
                "exp_f32({x:e}) is {ulps} ulp from the rounded value"
            );
            x += 0.0013;
        }
        assert!(worst < 1.2e-7, "worst relative error {worst}");
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-1000.0), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(88.8), f32::INFINITY);
        assert!(exp_f32(88.72).is_finite());
        assert!(max_f32(&[1.0, f32::NAN, 3.0]).is_nan());
        assert_eq!(
            max_f32(&[1.0, 9.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 2.0, -1.0]),
            9.0
        );
        // A NaN or the maximum anywhere, in the 16-lane body or the tail.
        for len in [1, 15, 16, 17, 40, 100] {
            for at in 0..len {
                let mut v: Vec<f32> = (0..len).map(|i| (i as f32 * 0.7).sin()).collect();
                v[at] = 5.0;
                assert_eq!(max_f32(&v), 5.0, "{len} {at}");
                assert_eq!(first_index_f32(&v, 5.0), at, "{len} {at}");
                v[at] = -5.0;
                assert_eq!(min_f32(&v), -5.0, "{len} {at}");
                v[at] = f32::NAN;
                assert!(max_f32(&v).is_nan(), "{len} {at}");
                assert!(min_f32(&v).is_nan(), "{len} {at}");
                assert_eq!(first_index_f32(&v, f32::NAN), at, "{len} {at}");
            }
        }
    }
}
