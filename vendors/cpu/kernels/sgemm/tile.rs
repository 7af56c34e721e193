//! The register-tile kernels of the blocked GEMM, one per instruction set, written once as
//! a macro over the vector type and its intrinsics.

/// Register-tile kernels (see [`Kernel`](super::Kernel)) for one instruction set: `MR`
/// rows × two vectors of `L` lanes (`MR` a parameter: the full tile and its shorter tails),
/// the accumulators in registers, A from a packed panel or from its rows in place (`PACKED`,
/// a parameter so that each form compiles its own addressing); before computing, the next
/// tile down (the blocked loop's next call) is prefetched into L1, since C's rows are far
/// apart and no hardware prefetcher follows them.
#[cfg(target_arch = "x86_64")]
macro_rules! tile_kernel {
    (
        $module:ident, $features:literal, $rows:literal, $lanes:literal, $vec:ident,
        $load:ident, $loadu:ident, $storeu:ident, $set1:ident, $setzero:ident, $fmadd:ident,
        $mul:ident
    ) => {
        pub(super) mod $module {
            use std::arch::x86_64::{
                _mm_prefetch, $fmadd, $load, $loadu, $mul, $set1, $setzero, $storeu, $vec,
                _MM_HINT_T0,
            };

            const L: usize = $lanes;
            /// The full tile's rows (its shorter tails are chosen where it is used).
            pub(in super::super) const MR: usize = $rows;
            /// The tile's columns: two vectors.
            pub(in super::super) const NR: usize = 2 * L;

            /// A's value for row `r`, step `p` is `a[p · lda + r]` when `PACKED` (a packed
            /// panel, `lda` its width) and `a[r · lda + p]` otherwise (rows of A read in
            /// place).
            ///
            /// # Safety
            /// The CPU has the features named; `a` holds every value named above for
            /// `r < MR`, `p < kc`; `b` holds `kc · NR` values aligned to a vector, `t` an
            /// `MR × NR` tile at row stride `ldt`.
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)] // the `Kernel` signature
            pub(in super::super) unsafe fn kernel<const MR: usize, const PACKED: bool>(
                kc: usize,
                a: *const f32,
                lda: usize,
                b: *const f32,
                t: *mut f32,
                ldt: usize,
                first: bool,
                scale: Option<f32>,
            ) {
                // SAFETY: the caller's promise for every pointer below (the prefetched
                // addresses are never dereferenced).
                unsafe {
                    let next = t.wrapping_add(MR * ldt);
                    for r in 0..MR {
                        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(r * ldt) as *const i8);
                        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(r * ldt + 16) as *const i8);
                    }
                    let mut c0: [$vec; MR] = [$setzero(); MR];
                    let mut c1: [$vec; MR] = [$setzero(); MR];
                    if !first {
                        for r in 0..MR {
                            c0[r] = $loadu(t.add(r * ldt));
                            c1[r] = $loadu(t.add(r * ldt + L));
                        }
                    }
                    for p in 0..kc {
                        let b0 = $load(b.add(p * NR));
                        let b1 = $load(b.add(p * NR + L));
                        for r in 0..MR {
                            let x = $set1(if PACKED {
                                *a.add(p * lda + r)
                            } else {
                                *a.add(r * lda + p)
                            });
                            c0[r] = $fmadd(x, b0, c0[r]);
                            c1[r] = $fmadd(x, b1, c1[r]);
                        }
                    }
                    if let Some(s) = scale {
                        let s = $set1(s);
                        for r in 0..MR {
                            c0[r] = $mul(s, c0[r]);
                            c1[r] = $mul(s, c1[r]);
                        }
                    }
                    for r in 0..MR {
                        $storeu(t.add(r * ldt), c0[r]);
                        $storeu(t.add(r * ldt + L), c1[r]);
                    }
                }
            }
        }
    };
}

// AVX-512: 12 rows × 32 columns (24 of the 32 zmm registers), and 8- and 4-row tails.
#[cfg(target_arch = "x86_64")]
tile_kernel!(
    avx512,
    "avx512f,fma",
    12,
    16,
    __m512,
    _mm512_load_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    _mm512_setzero_ps,
    _mm512_fmadd_ps,
    _mm512_mul_ps
);

// AVX2: 6 rows × 16 columns (12 of the 16 ymm registers), and 4- and 2-row tails.
#[cfg(target_arch = "x86_64")]
tile_kernel!(
    avx2,
    "avx2,fma",
    6,
    8,
    __m256,
    _mm256_load_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    _mm256_setzero_ps,
    _mm256_fmadd_ps,
    _mm256_mul_ps
);
