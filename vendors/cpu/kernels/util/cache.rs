//! Working with the caches: prefetching the next row, and non-temporal stores for outputs
//! too large to stay in the last-level cache.

/// Asks the CPU to bring the cache line holding `p` into its L2 cache ahead of use: a row
/// kernel that reads its row from memory once and then computes on it in L1 prefetches the
/// next row meanwhile, so memory and arithmetic overlap. No effect on results; any address
/// may be given (a prefetch never faults).
#[inline(always)]
pub fn prefetch_l2(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch hint reads nothing architecturally and never faults, whatever the
    // address; SSE (which has it) is part of baseline x86-64.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        _mm_prefetch::<_MM_HINT_T1>(p as *const i8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Whether an output of `bytes` is written with non-temporal stores ([`write_streaming`]):
/// when it is at least 3/4 of the last-level cache's share per thread (glibc's threshold
/// for non-temporal `memcpy`, at least 4 MiB), so it would not stay cached for the next
/// operator anyway, and a normal store first reads each line it writes. Smaller outputs
/// stay in cache for whoever reads them next.
pub fn streams(bytes: usize) -> bool {
    static THRESHOLD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    bytes
        >= *THRESHOLD.get_or_init(|| {
            let l3 = last_level_cache().unwrap_or(32 << 20);
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            (l3 / threads / 4 * 3).max(4 << 20)
        })
}

/// The size of the L3 cache the first CPU sits behind, from sysfs ("32768K"), as `lscpu`
/// reads it. (A virtual machine's `sysconf` may report the whole host socket's L3.)
fn last_level_cache() -> Option<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size").ok()?;
    let text = text.trim();
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit())?);
    let n: usize = digits.parse().ok()?;
    match unit {
        "K" => Some(n << 10),
        "M" => Some(n << 20),
        _ => None,
    }
}

/// Writes `out` through `compute(start, dst)`, which fills `dst` with the elements from
/// `start` on. With `stream`, the 64-byte-aligned middle is computed 64 elements at a time
/// into a buffer in L1 and written with non-temporal stores, which skip the read of each output
/// line a normal store makes first (1.3–1.5× on a memory-bound 16–64 MiB add here). The
/// values are the same either way; only where they are stored from differs.
#[inline(always)]
pub fn write_streaming(out: &mut [f32], stream: bool, compute: impl Fn(usize, &mut [f32])) {
    write_streaming_unfenced(out, stream, compute);
    if stream {
        stream_fence();
    }
}

/// [`write_streaming`] without its closing [`stream_fence`], for a kernel that writes many
/// short rows (a rotary row is 512 bytes): a fence after each would wait for every row's
/// stores to drain before the next row starts. The caller fences once after its last row.
#[inline(always)]
pub fn write_streaming_unfenced(
    out: &mut [f32],
    stream: bool,
    compute: impl Fn(usize, &mut [f32]),
) {
    #[cfg(target_arch = "x86_64")]
    if stream {
        let n = out.len();
        let head = out.as_ptr().align_offset(64).min(n);
        compute(0, &mut out[..head]);
        let mut i = head;
        let mut r = super::AlignedBlock::<64>::ZERO;
        let tier = super::simd_tier();
        // Four lines per step: a 64-element loop the compiler vectorises like any other.
        while i + 64 <= n {
            compute(i, &mut r[..]);
            // SAFETY: out[i..i + 64] is in bounds and 64-byte aligned (i ≥ head keeps the
            // alignment in steps of 16 f32s); `tier` is the CPU's.
            unsafe { stream_lines(out.as_mut_ptr().add(i), &r, tier) };
            i += 64;
        }
        compute(i, &mut out[i..]);
        return;
    }
    let _ = stream;
    compute(0, out);
}

/// Writes the four lines `r` to `dst` with non-temporal stores as wide as the SIMD tier's
/// vectors: one store per line with AVX-512, where 16-byte stores took sixteen stores and
/// sixteen loads per four lines (the full-width ones ran 3–13 % faster: add, a fused chain,
/// swiglu, rms_norm over 16 MiB, one process, switched per launch).
///
/// # Safety
/// `dst` is valid for 64 f32s and 64-byte aligned; `tier` is [`super::simd_tier`]'s.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn stream_lines(dst: *mut f32, r: &super::AlignedBlock<64>, tier: super::SimdTier) {
    use super::SimdTier;
    use std::arch::x86_64::*;
    let src = r.as_ptr();
    // SAFETY: dst is valid and aligned (the caller's promise), r is a 64-byte aligned block
    // of 64 f32s; each arm runs only on the tier whose features simd_tier() found in the CPU.
    unsafe {
        match tier {
            SimdTier::Avx512 => {
                for q in (0..64).step_by(16) {
                    _mm512_stream_ps(dst.add(q), _mm512_load_ps(src.add(q)));
                }
            }
            SimdTier::Avx2 => {
                for q in (0..64).step_by(8) {
                    _mm256_stream_ps(dst.add(q), _mm256_load_ps(src.add(q)));
                }
            }
            SimdTier::None => {
                for q in (0..64).step_by(4) {
                    _mm_stream_ps(dst.add(q), _mm_load_ps(src.add(q)));
                }
            }
        }
    }
}

/// Orders the non-temporal stores made so far before any later store, such as the one that
/// tells another thread the output is ready. A no-op off x86-64.
#[inline(always)]
pub fn stream_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a store fence, baseline x86-64; it reads and writes no memory.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streaming stores write what plain stores write, for every alignment of the output
    /// and lengths around the 64-element steps.
    #[test]
    fn write_streaming_matches_plain_writes() {
        let src: Vec<f32> = (0..700).map(|i| i as f32 * 0.37 - 11.0).collect();
        let f = |s: usize, d: &mut [f32]| {
            for (x, y) in d.iter_mut().zip(&src[s..]) {
                *x = y * 2.0 + 1.0;
            }
        };
        for skew in 0..17 {
            for len in [0, 1, 15, 63, 64, 65, 127, 128, 129, 500, 640] {
                let mut a = vec![-1f32; len + skew + 16];
                let mut b = a.clone();
                write_streaming(&mut a[skew..skew + len], true, f);
                write_streaming(&mut b[skew..skew + len], false, f);
                assert_eq!(a, b, "skew {skew}, len {len}");
            }
        }
        assert!(streams(1 << 30) && !streams(1 << 20));
    }
}
