//! The f32 GEMM: [`sgemm_par`] splits C into panels across rayon's threads and runs each
//! through unirt's own packed GEMM on CPUs with FMA ([`gemm`], `C = alpha·A·B`), or through
//! the `matrixmultiply` crate (no FMA, beta ≠ 0, or `UNIRT_CPU_GEMM=matrixmultiply`).
//!
//! The classic blocked form: B is packed `KC × NC` at a time into panels of `NR` columns, A
//! `MC × KC` at a time into panels of `MR` rows, and a register-tile kernel runs each A panel
//! against each B panel. A row-major A is not packed: the kernels read its rows where they
//! lie (as MLAS does), one broadcast per row and step of k from `MR` sequential streams,
//! which the hardware prefetcher follows; packing it cost as much as packing B. The kernels are written with intrinsics — AVX-512: 12 rows × 32
//! columns (24 zmm accumulators, two B loads and twelve broadcasts per step of k); AVX2:
//! 6 × 16 (12 ymm) — because the `matrixmultiply` crate's AVX-512 kernel (16 × 16, one B
//! load and sixteen broadcasts per step) is bound by its loads at about two thirds of the
//! FMA units' rate (103 against OpenBLAS's 160 GFLOP/s per core here). A block's last rows
//! run through shorter kernels of the same form (8 and 4 rows; AVX2: 4 and 2; any row count
//! for A read in place) rather than a full tile of zero padding. A strided A whose rows are
//! contiguous, and a B whose columns are (`x · Wᵀ` over a linear layer's `[out, in]`
//! weight), are packed by 4 × 4 transposes in registers, widened from bf16/f16 on the way.
//!
//! **Deterministic by construction.** Every element of C is one chain of fused
//! multiply-adds over `k` in order, starting from zero: between blocks of k the partial sum
//! is stored in C (f32) and reloaded, which rounds nothing. So the result does not depend on
//! the tier (AVX-512 and AVX2 give the same bits), the tile, the blocking or the thread
//! split; `alpha` multiplies the finished sum once. A CPU without FMA keeps
//! `matrixmultiply` (a software FMA per step would be far slower).

use std::ops::Range;

use super::util::{fork_tasks, simd_tier, Float, Ptr, SimdTier};
use crate::tensor::DType;

mod pack;
mod tile;

use pack::{aligned, pack};
#[cfg(target_arch = "x86_64")]
use tile::{avx2, avx512};

/// A tier's kernels that read A's rows in place, one per row count: `in_place!(t; 1 2 3)` is
/// `&[t::<1, false>, t::<2, false>, t::<3, false>]`.
#[cfg(target_arch = "x86_64")]
macro_rules! in_place {
    ($t:ident; $($rows:literal)*) => {
        &[$($t::<$rows, false>),*]
    };
}

/// Rows of B packed per block: a `KC × NR` panel of B (32 KiB with AVX-512) stays in L1
/// while every A panel of the block runs over it. (192–384 measured within noise of each
/// other at 2048³; 256 with MC = 384 among the best.)
const KC: usize = 256;
/// Rows of A per block: `MC × KC` packed A (384 KiB) stays in L2.
const MC: usize = 384;
/// Columns of B per block: `KC × NC` packed B (2 MiB) stays in the L3 share.
const NC: usize = 2048;

/// A strided matrix of `S` (f32 unless said otherwise): base pointer, row and column strides
/// in elements.
pub(super) struct Mat<S = f32> {
    pub p: Ptr<S>,
    pub rs: usize,
    pub cs: usize,
}

impl<S: Copy> Clone for Mat<S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S: Copy> Copy for Mat<S> {}

impl<S: Copy> Mat<S> {
    /// The submatrix starting at row `r`, column `c` (which the caller keeps inside the
    /// matrix; the pointer is only computed).
    fn at(self, r: usize, c: usize) -> Mat<S> {
        Mat {
            p: Ptr(self.p.0.wrapping_add(r * self.rs + c * self.cs)),
            ..self
        }
    }
}

/// Whether `UNIRT_CPU_GEMM=matrixmultiply` asks for the `matrixmultiply` crate's GEMM (the
/// baseline unirt's own is measured against), read once.
fn matrixmultiply_asked() -> bool {
    static ASKED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ASKED.get_or_init(|| std::env::var("UNIRT_CPU_GEMM").is_ok_and(|v| v == "matrixmultiply"))
}

/// Whether [`sgemm_par`] runs unirt's own GEMM for this `beta` (it then reads B in any float
/// dtype, widening it as it packs; `matrixmultiply` takes f32 only).
pub(super) fn own_gemm(beta: f32) -> bool {
    beta == 0.0 && available() && !matrixmultiply_asked()
}

/// `C = alpha·A·B + beta·C` (m×k · k×n) on strided f32 A and C and B of any float dtype `S`,
/// in parallel panels. B's values are widened to f32 exactly (f16 and bf16 are subsets of
/// f32), so the result is the f32 product of the widened B.
///
/// # Safety
/// The matrices must be valid for their shapes and strides; C must not overlap A or B.
#[allow(clippy::too_many_arguments)] // the BLAS signature
pub(super) unsafe fn sgemm_par<S: Float>(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Mat,
    b: Mat<S>,
    beta: f32,
    c: Mat,
    after: &(dyn Fn(Range<usize>, Range<usize>) + Sync),
) {
    if m == 0 || n == 0 {
        return;
    }
    let threads = crate::host_threads::threads();
    let work = m * n * k.max(1);
    // Panels of at least 64 rows/columns, and only when the product is worth a fork.
    // Every panel packs all of B's columns it covers, and reads all of A's rows it covers:
    // split along m, each thread packs the whole of B; along n, each reads the whole of A.
    // A row-major A is read in place by our own GEMM (not packed), so at equal sizes the
    // split along n costs less.
    let own = own_gemm(beta);
    let along_m = if own && reads_a_in_place(a, tile_rows()) {
        m > n
    } else {
        m >= n
    };
    let len = if along_m { m } else { n };
    let panels = if work < 1 << 18 {
        1
    } else {
        threads.min(len / 64).max(1)
    };
    let per = len.div_ceil(panels);
    // (unirt's own GEMM where the CPU has FMA: it computes C = alpha·A·B; beta ≠ 0 keeps
    // matrixmultiply, which reads C.)
    let run = |t: usize| {
        let (start, end) = (t * per, ((t + 1) * per).min(len));
        if start >= end {
            return;
        }
        let (rows, cols) = if along_m {
            (start..end, 0..n)
        } else {
            (0..m, start..end)
        };
        let (a, b, c) = (
            a.at(rows.start, 0),
            b.at(0, cols.start),
            c.at(rows.start, cols.start),
        );
        let (pm, pn) = (rows.len(), cols.len());
        // SAFETY: each panel writes its own rows (or columns) of C; all pointers stay in the
        // matrices the caller vouched for.
        unsafe {
            if own {
                gemm((pm, k, pn), alpha, a, b, c);
            } else {
                // matrixmultiply reads f32 only: another dtype's panel of B is widened first
                // (callers widen B themselves where this path is taken; this keeps it sound).
                let mut wide = Vec::new();
                let b = if S::DTYPE == DType::F32 {
                    Mat {
                        p: Ptr(b.p.0 as *mut f32),
                        rs: b.rs,
                        cs: b.cs,
                    }
                } else {
                    wide.resize(k * pn, 0f32);
                    for (i, row) in wide.chunks_mut(pn).enumerate() {
                        for (j, v) in row.iter_mut().enumerate() {
                            *v = (*b.p.at(i * b.rs + j * b.cs)).to_f32();
                        }
                    }
                    Mat {
                        p: Ptr(wide.as_mut_ptr()),
                        rs: pn,
                        cs: 1,
                    }
                };
                let (ai, bi, ci) = (a.rs as isize, b.rs as isize, c.rs as isize);
                let (aj, bj, cj) = (a.cs as isize, b.cs as isize, c.cs as isize);
                matrixmultiply::sgemm(
                    pm, k, pn, alpha, a.p.0, ai, aj, b.p.0, bi, bj, beta, c.p.0, ci, cj,
                );
            }
        }
        after(rows, cols);
    };
    if panels == 1 {
        run(0);
    } else {
        fork_tasks(panels, &run);
    }
}

/// Whether the GEMM reads A's rows in place rather than packing them: A is row-major, and
/// no more than two of a tile's `mr` rows start in the same set of a 32 KiB, 8-way L1
/// (64 sets of 64-byte lines). Rows a multiple of 4 KiB apart (k = 1024, 4096, …) all fall
/// in one set, where they and the packed B panel evict each other; such an A is packed.
fn reads_a_in_place(a: Mat, mr: usize) -> bool {
    let mut per_set = [0u8; 64];
    // Only the row stride's bytes modulo 4 KiB (the span of the 64 sets) matter, which also
    // keeps the products small whatever stride a dimension of one row carries.
    let rs = a.rs % 1024;
    a.cs == 1
        && (0..mr).all(|r| {
            let set = (r * rs * 4 % 4096) / 64;
            per_set[set] += 1;
            per_set[set] <= 2
        })
}

/// The full register tile's rows on this CPU ([`gemm`]'s choice of kernels).
fn tile_rows() -> usize {
    #[cfg(target_arch = "x86_64")]
    if simd_tier() == SimdTier::Avx512 {
        avx512::MR
    } else {
        avx2::MR
    }
    // Elsewhere our GEMM is not used (see `available`).
    #[cfg(not(target_arch = "x86_64"))]
    1
}

/// Whether this CPU runs unirt's GEMM (a SIMD tier with FMA).
pub(super) fn available() -> bool {
    simd_tier() >= SimdTier::Avx2
}

/// `C[rows, cols] = alpha · A[rows, :] · B[:, cols]` for the m×k · k×n product of the
/// views (C's old values are not read).
///
/// # Safety
/// [`available`] is true; A is valid for m×k, B for k×n, C for m×n at their strides; C does
/// not overlap A or B.
pub(super) unsafe fn gemm<S: Float>(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    a: Mat,
    b: Mat<S>,
    c: Mat,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for i in 0..m {
            for j in 0..n {
                // SAFETY: inside C (the caller's promise).
                unsafe { *c.p.at(i * c.rs + j * c.cs) = 0.0 };
            }
        }
        return;
    }
    // SAFETY: the caller's promise; the tier decides which kernel the CPU can run.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        match simd_tier() {
            SimdTier::Avx512 => {
                use avx512::kernel as t;
                let kernels = Kernels {
                    full: t::<{ avx512::MR }, true>,
                    tails: &[(4, t::<4, true>), (8, t::<8, true>)],
                    rows_in_place: in_place!(t; 1 2 3 4 5 6 7 8 9 10 11 12),
                };
                blocked::<{ avx512::MR }, { avx512::NR }, S>((m, k, n), alpha, a, b, c, kernels)
            }
            _ => {
                use avx2::kernel as t;
                let kernels = Kernels {
                    full: t::<{ avx2::MR }, true>,
                    tails: &[(2, t::<2, true>), (4, t::<4, true>)],
                    rows_in_place: in_place!(t; 1 2 3 4 5 6),
                };
                blocked::<{ avx2::MR }, { avx2::NR }, S>((m, k, n), alpha, a, b, c, kernels)
            }
        }
    }
    // Elsewhere `available` is false and the caller takes `matrixmultiply`.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (alpha, a, b, c);
}

/// A register-tile kernel of `R` rows: `tile[r][j] (+)= Σ_{p < kc} A(r, p) · b[p·NR + j]`
/// for `r < R`, the tile at `t` with row stride `ldt`, started from zero when `first`;
/// multiplied by `alpha` when `scale` (after the last block of k). `A(r, p)` is
/// `a[p·lda + r]` in a packed panel (`lda` its width, the full tile's rows, so a shorter
/// kernel runs the last rows of a block from the same packing) or `a[r·lda + p]` for rows
/// read in place.
type Kernel = unsafe fn(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    t: *mut f32,
    ldt: usize,
    first: bool,
    scale: Option<f32>,
);

/// The kernels of one instruction set: the full tile's, and shorter ones by rows, ascending.
/// A block's last rows (`m` not a multiple of the tile) run through the shortest kernel
/// that covers them instead of a full tile of padding: at m = 64 the 12-row tile wasted
/// 8 of every 72 rows computed.
///
/// `rows_in_place[r - 1]` computes `r` rows read straight from a row-major A (no packing:
/// the rows are already contiguous along k). There is no padding past A's last row to
/// compute on, so there is one for every row count.
#[derive(Clone, Copy)]
struct Kernels {
    full: Kernel,
    tails: &'static [(usize, Kernel)],
    rows_in_place: &'static [Kernel],
}

/// The blocked loops around the kernels.
///
/// # Safety
/// As [`gemm`], and the kernels run on this CPU.
unsafe fn blocked<const MR: usize, const NR: usize, S: Float>(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    a: Mat,
    b: Mat<S>,
    c: Mat,
    kernels: Kernels,
) {
    let nc_max = NC.min(n.next_multiple_of(NR));
    let mc_max = MC.min(m.next_multiple_of(MR));
    let kc_max = KC.min(k);
    // The thread's packing buffers, 64-byte aligned (aligned loads of packed B) and kept
    // between calls: allocating (and faulting in) a fresh quarter megabyte per call cost more
    // than a 256³ product's arithmetic.
    let mut product = Some(|bbuf: &mut Vec<f32>, abuf: &mut Vec<f32>| {
        let bp = aligned(bbuf, kc_max * nc_max);
        let ap = aligned(abuf, kc_max * mc_max);
        // SAFETY: the caller's promise.
        unsafe { blocked_with::<MR, NR, S>((m, k, n), alpha, a, b, c, kernels, bp, ap) }
    });
    let _ = PACKED.try_with(|packed| {
        if let (Ok(mut bufs), Some(product)) = (packed.try_borrow_mut(), product.take()) {
            let (bbuf, abuf) = &mut *bufs;
            product(bbuf, abuf);
        }
    });
    // The buffers are gone (a thread-local destructor computing at thread exit): fresh ones.
    if let Some(product) = product.take() {
        product(&mut Vec::new(), &mut Vec::new());
    }
}

thread_local! {
    /// Packed B and packed A of the thread's last GEMM (at most 2 MiB and 384 KiB).
    static PACKED: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new()))
    };
}

/// [`blocked`] with its buffers.
///
/// # Safety
/// As [`blocked`].
#[allow(clippy::too_many_arguments)]
unsafe fn blocked_with<const MR: usize, const NR: usize, S: Float>(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    a: Mat,
    b: Mat<S>,
    c: Mat,
    kernels: Kernels,
    bp: &mut [f32],
    ap: &mut [f32],
) {
    // An edge tile (rows or columns past C's edge, or C with non-unit column stride), of
    // the largest tile's size (AVX-512's 12 × 32).
    let mut edge = [0f32; 12 * 32];
    // A row-major A is read where it lies: its rows are already contiguous along k, which
    // is all a packed panel adds for the kernel, and packing it cost as much time as
    // packing B (each thread packs its whole share of A).
    let a_in_place = reads_a_in_place(a, MR) && kernels.rows_in_place.len() == MR;
    let mut jc = 0;
    while jc < n {
        let nc = NC.min(n - jc);
        let mut pc = 0;
        while pc < k {
            let kc = KC.min(k - pc);
            let (first, last) = (pc == 0, pc + kc == k);
            let scale = (last && alpha != 1.0).then_some(alpha);
            // SAFETY: rows pc..pc + kc, columns jc..jc + nc of B.
            unsafe { pack::<NR, S>(bp, b, pc..pc + kc, jc..jc + nc, true) };
            let mut ic = 0;
            while ic < m {
                let mc = MC.min(m - ic);
                if !a_in_place {
                    // SAFETY: rows ic..ic + mc, columns pc..pc + kc of A.
                    unsafe { pack::<MR, f32>(ap, a, ic..ic + mc, pc..pc + kc, false) };
                }
                for jr in (0..nc).step_by(NR) {
                    let nr = NR.min(nc - jr);
                    let bpan = bp[jr * kc..].as_ptr();
                    for ir in (0..mc).step_by(MR) {
                        let mr = MR.min(mc - ir);
                        let (i0, j0) = (ic + ir, jc + jr);
                        let (rows, kernel, apan, lda) = if a_in_place {
                            // Rows i0.. of A from column pc on, as they lie.
                            let rows = a.p.0.wrapping_add(i0 * a.rs + pc) as *const f32;
                            (mr, kernels.rows_in_place[mr - 1], rows, a.rs)
                        } else {
                            // The shortest kernel covering mr rows (the full one but at the
                            // end).
                            let (rows, kernel) = kernels
                                .tails
                                .iter()
                                .copied()
                                .find(|&(rows, _)| rows >= mr)
                                .unwrap_or((MR, kernels.full));
                            (rows, kernel, ap[ir * kc..].as_ptr(), MR)
                        };
                        // SAFETY: the packed panels hold kc steps of MR / NR values (rows past
                        // the edge are zeros), or A's rows i0..i0 + mr hold columns
                        // pc..pc + kc where they lie; the tile is inside C (checked by mr, nr)
                        // or the edge buffer.
                        unsafe {
                            if rows == mr && nr == NR && c.cs == 1 {
                                let t = c.p.at(i0 * c.rs + j0);
                                kernel(kc, apan, lda, bpan, t, c.rs, first, scale);
                            } else {
                                let e = edge.as_mut_ptr();
                                if !first {
                                    for r in 0..mr {
                                        for j in 0..nr {
                                            edge[r * NR + j] =
                                                *c.p.at((i0 + r) * c.rs + (j0 + j) * c.cs);
                                        }
                                    }
                                }
                                kernel(kc, apan, lda, bpan, e, NR, first, scale);
                                for r in 0..mr {
                                    for j in 0..nr {
                                        *c.p.at((i0 + r) * c.rs + (j0 + j) * c.cs) =
                                            edge[r * NR + j];
                                    }
                                }
                            }
                        }
                    }
                }
                ic += mc;
            }
            pc += kc;
        }
        jc += nc;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel against the scalar chain it claims to compute — `acc = a.mul_add(b, acc)`
    /// over k in order, then `alpha · acc` — bit for bit, on shapes that cross every block
    /// edge (k past KC, m past MC, n past NC, partial tiles) and on transposed and strided
    /// views, in every tier with FMA this CPU has.
    /// B in bf16 or f16, widened as it is packed: the same bits as the product of the
    /// widened B in f32, for row-major and transposed B across block edges.
    #[test]
    fn half_b_gives_the_bits_of_its_f32_widening() {
        use half::{bf16, f16};
        if !available() {
            return;
        }
        fn check<S: Float>(narrow: impl Fn(f32) -> S) {
            let mut rng = crate::tensor::SplitMix64::new(0x51ed_270b_2cbf_0b2d);
            let mut rnd = move || (rng.next_f64() * 2.0 - 1.0) as f32;
            for &(m, k, n) in &[(13, 300, 37), (25, 20, 2100), (2, 7, 5)] {
                for tb in [false, true] {
                    let a: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
                    let b: Vec<S> = (0..k * n).map(|_| narrow(rnd())).collect();
                    let wide: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
                    let (brs, bcs) = if tb { (1, k) } else { (n, 1) };
                    let (mut c, mut want) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
                    // SAFETY: the views cover their vectors exactly.
                    unsafe {
                        let a = Mat {
                            p: Ptr(a.as_ptr() as *mut f32),
                            rs: k,
                            cs: 1,
                        };
                        let bm = Mat {
                            p: Ptr(b.as_ptr() as *mut S),
                            rs: brs,
                            cs: bcs,
                        };
                        let bw = Mat {
                            p: Ptr(wide.as_ptr() as *mut f32),
                            rs: brs,
                            cs: bcs,
                        };
                        let cm = |v: &mut Vec<f32>| Mat {
                            p: Ptr(v.as_mut_ptr()),
                            rs: n,
                            cs: 1,
                        };
                        gemm((m, k, n), 0.5, a, bm, cm(&mut c));
                        gemm((m, k, n), 0.5, a, bw, cm(&mut want));
                    }
                    let same = c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{} {m}x{k}x{n} tb={tb}", S::DTYPE);
                }
            }
        }
        check(bf16::from_f32);
        check(f16::from_f32);
    }

    /// Row-major A is read in place unless its rows crowd one set of L1; a transposed A is
    /// always packed.
    #[test]
    fn which_a_is_read_in_place() {
        let a = |rs, cs| Mat {
            p: Ptr(std::ptr::null_mut::<f32>()),
            rs,
            cs,
        };
        for (k, six, twelve) in [
            (256, true, false),
            (1024, false, false),
            (11008, true, false),
        ] {
            assert_eq!(reads_a_in_place(a(k, 1), 6), six, "k = {k}");
            assert_eq!(reads_a_in_place(a(k, 1), 12), twelve, "k = {k}");
        }
        assert!(reads_a_in_place(a(300, 1), 12) && !reads_a_in_place(a(1, 300), 6));
        // A one-row A may carry any row stride.
        assert!(!reads_a_in_place(a(usize::MAX - 1023, 1), 6));
    }

    #[test]
    fn same_bits_as_the_fma_chain() {
        if !available() {
            return;
        }
        let mut rng = crate::tensor::SplitMix64::new(0x9e37_79b9_7f4a_7c15);
        let mut rnd = move || (rng.next_f64() * 2.0 - 1.0) as f32;
        let shapes = [
            (1, 1, 1, 1.0),
            (12, 192, 32, 1.0),
            (13, 193, 33, 0.5),
            (7, 400, 70, 1.0),
            (400, 37, 45, -2.0),
            (25, 20, 2100, 1.0),
            // Tails that run straight into C: 64 = 5·12 + 4, 20 = 12 + 8, 10 = 6 + 4.
            (64, 50, 64, 1.0),
            (20, 30, 96, 0.5),
            (10, 9, 32, 1.0),
            // Rows 4 KiB apart: a row-major A packed rather than read in place.
            (13, 1024, 20, 1.0),
        ];
        for &(m, k, n, alpha) in &shapes {
            for &(ta, tb, cstride) in &[(false, false, 1), (true, false, 1), (false, true, 3)] {
                let a: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
                let b: Vec<f32> = (0..k * n).map(|_| rnd()).collect();
                // A m×k: row-major, or stored transposed (k×m).
                let (ars, acs) = if ta { (1, m) } else { (k, 1) };
                let (brs, bcs) = if tb { (1, k) } else { (n, 1) };
                let mut c = vec![f32::NAN; m * n * cstride];
                let view = |p: *const f32, rs, cs| Mat {
                    p: Ptr(p as *mut f32),
                    rs,
                    cs,
                };
                // SAFETY: the views cover their vectors exactly.
                unsafe {
                    gemm(
                        (m, k, n),
                        alpha,
                        view(a.as_ptr(), ars, acs),
                        view(b.as_ptr(), brs, bcs),
                        view(c.as_mut_ptr(), n * cstride, cstride),
                    )
                };
                for i in 0..m {
                    for j in 0..n {
                        let mut acc = 0f32;
                        for p in 0..k {
                            acc = a[i * ars + p * acs].mul_add(b[p * brs + j * bcs], acc);
                        }
                        if alpha != 1.0 {
                            acc *= alpha;
                        }
                        let got = c[(i * n + j) * cstride];
                        assert_eq!(
                            got.to_bits(),
                            acc.to_bits(),
                            "{m}x{k}x{n} ta={ta} tb={tb} at ({i}, {j}): {got} against {acc}"
                        );
                    }
                }
            }
        }
    }
}
