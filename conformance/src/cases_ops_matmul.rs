//! Matrix product cases: matmul and gemm (alpha, beta, strided and offset operands), against
//! an f64 reference.

use unirt::ops::matmul as mm;
use unirt::tensor::{DType, Tensor};

use crate::cases_ops_matmul_weights::{few_rows, textured, weight_writes};
use crate::ops_check::*;
use crate::{Ctx, Failure};

crate::op_cases! {
    matmul = "matmul": [f32, f16, bf16] => [shapes, batched_broadcast, transposed, alpha_beta, quads, few_rows, large_gemv, textured, weight_writes, large_tiles, tensor_core_tiles, bad_input] via matmul_case;
}

/// `A @ B` on host for row-major `[batch.., m, k]` and `[batch.., k, n]` (batch broadcast
/// into `out_batch`), with `Σ|a·b|` per output for the tolerance.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_ref(
    va: &[f64],
    sa: &[usize],
    vb: &[f64],
    sb: &[usize],
    out_batch: &[usize],
    m: usize,
    k: usize,
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let nb: usize = out_batch.iter().product();
    let (mut out, mut scale) = (Vec::new(), Vec::new());
    for bi in 0..nb {
        let idx = unravel(bi, out_batch);
        let ab = bcast_index(&idx, &sa[..sa.len() - 2]);
        let bb = bcast_index(&idx, &sb[..sb.len() - 2]);
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut a) = (0.0, 0.0);
                for q in 0..k {
                    let t = va[ab * m * k + i * k + q] * vb[bb * k * n + q * n + j];
                    s += t;
                    a += t.abs();
                }
                out.push(s);
                scale.push(a);
            }
        }
    }
    (out, scale)
}

pub(crate) fn check_mm(
    ctx: &Ctx,
    dt: DType,
    sa: &[usize],
    sb: &[usize],
    seed: u64,
) -> Result<(), Failure> {
    let (a, va) = random(sa, -1.0, 1.0, seed, dt, ctx.device)?;
    let (b, vb) = random(sb, -1.0, 1.0, seed + 1, dt, ctx.device)?;
    let w = format!("matmul {sa:?} @ {sb:?}");
    let out = a.matmul(&b).map_err(err(&w))?;
    let (m, k, n) = (sa[sa.len() - 2], sa[sa.len() - 1], sb[sb.len() - 1]);
    let batch = &out.shape()[..out.ndim() - 2];
    let (want, scale) = matmul_ref(&va, sa, &vb, sb, batch, m, k, n);
    close(&w, &values(&out, &w)?, &want, dt, Some(&scale))
}

/// `a @ b` for two matrix views against their values in row-major order.
fn check_views(
    what: &str,
    (a, ha): (&Tensor, &[f64]),
    (b, hb): (&Tensor, &[f64]),
    dt: DType,
) -> Result<(), Failure> {
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    let out = a.matmul(b).map_err(err(what))?;
    let (want, scale) = matmul_ref(ha, &[m, k], hb, &[k, n], &[], m, k, n);
    close(what, &values(&out, what)?, &want, dt, Some(&scale))
}

/// The layouts a GEMM reads in 16-byte copies (CUDA's `op_matmul_mma`: 128×128 tiles, 32 deep,
/// on tensor cores, chosen for f16 / bf16 when every stride but the unit ones is a multiple of
/// 8), at its tile edges: k = 264 (a multiple of 8, not of 32), partial row and column tiles,
/// B stored `[k, n]` and `[n, k]`, a batch over one B, k = 20 in rows of 24 (the last copy of a
/// row reads 8 of its 16 bytes), and alpha / beta into a C that holds values. Every backend
/// computes the same products.
fn tensor_core_tiles(ctx: &Ctx, dt: DType) -> Result<(), Failure> {
    let dev = ctx.device;
    check_mm(ctx, dt, &[130, 264], &[264, 136], 640)?;
    check_mm(ctx, dt, &[2, 129, 40], &[40, 256], 642)?;
    // B = Wᵀ for a weight W stored [200, 72].
    let (a, va) = random(&[131, 72], -1.0, 1.0, 644, dt, dev)?;
    let (w, vw) = random(&[200, 72], -1.0, 1.0, 645, dt, dev)?;
    let b = w.transpose(0, 1).map_err(err("transpose"))?;
    let hb = host_view(&vw, b.layout());
    check_views("matmul [131, 72] @ [200, 72]^T", (&a, &va), (&b, &hb), dt)?;
    // A = the first 20 columns of rows of 24.
    let (ab, vab) = random(&[140, 24], -1.0, 1.0, 646, dt, dev)?;
    let a = ab.narrow(1, 0, 20).map_err(err("narrow"))?;
    let (b, vb) = random(&[20, 144], -1.0, 1.0, 647, dt, dev)?;
    let ha = host_view(&vab, a.layout());
    check_views(
        "matmul [140, 24][:, :20] @ [20, 144]",
        (&a, &ha),
        (&b, &vb),
        dt,
    )?;
    // C = 0.5·A·B − 1.5·C.
    let (a, va) = random(&[136, 32], -1.0, 1.0, 648, dt, dev)?;
    let (b, vb) = random(&[32, 136], -1.0, 1.0, 649, dt, dev)?;
    let (c, vc) = random(&[136, 136], -1.0, 1.0, 650, dt, dev)?;
    a.gemm_into(&b, &c, 0.5, -1.5)
        .map_err(err("gemm [136, 32] @ [32, 136] alpha 0.5 beta -1.5"))?;
    let (ab, scale) = matmul_ref(&va, &[136, 32], &vb, &[32, 136], &[], 136, 32, 136);
    let want: Vec<f64> = ab.iter().zip(&vc).map(|(x, c)| 0.5 * x - 1.5 * c).collect();
    close(
        "gemm [136, 32] @ [32, 136] alpha 0.5 beta -1.5",
        &values(&c, "gemm")?,
        &want,
        dt,
        Some(&scale),
    )
}

/// B with contiguous columns (a `[n, k]` weight used transposed, attention's `q · kᵀ`) and
/// k, n multiples of four: the dot-product quad path of adapters on the host's cores. Rows
/// 1, 3 and 6 (a partial tile of 4), 12 columns (a partial column tile), a batch of two, and
/// alpha / beta into a C that holds values.
fn transposed_quads(ctx: &Ctx, dt: DType) -> Result<(), Failure> {
    let dev = ctx.device;
    let (wb, vwb) = random(&[2, 12, 16], -1.0, 1.0, 545, dt, dev)?;
    let w = wb.transpose(1, 2).map_err(err("transpose"))?; // [2, 16, 12]
    let hw = host_view(&vwb, w.layout());
    for (i, m) in [1usize, 3, 6].into_iter().enumerate() {
        let (a, va) = random(&[2, m, 16], -1.0, 1.0, 546 + i as u64, dt, dev)?;
        let what = format!("[2, {m}, 16] @ [2, 12, 16]^T");
        let out = a.matmul(&w).map_err(err(&what))?;
        let (want, scale) = matmul_ref(&va, &[2, m, 16], &hw, &[2, 16, 12], &[2], m, 16, 12);
        close(&what, &values(&out, &what)?, &want, dt, Some(&scale))?;
    }
    let (w2b, vw2b) = random(&[12, 16], -1.0, 1.0, 549, dt, dev)?;
    let w2 = w2b.transpose(0, 1).map_err(err("transpose"))?; // [16, 12]
    let hw2 = host_view(&vw2b, w2.layout());
    let (a, va) = random(&[3, 16], -1.0, 1.0, 550, dt, dev)?;
    let (c, vc) = random(&[3, 12], -1.0, 1.0, 551, dt, dev)?;
    a.gemm_into(&w2, &c, 0.5, 2.0)
        .map_err(err("gemm alpha 0.5 beta 2, transposed weight"))?;
    let (ab, scale) = matmul_ref(&va, &[3, 16], &hw2, &[16, 12], &[], 3, 16, 12);
    let want: Vec<f64> = ab.iter().zip(&vc).map(|(x, c)| 0.5 * x + 2.0 * c).collect();
    close(
        "gemm alpha/beta, transposed weight",
        &values(&c, "gemm")?,
        &want,
        dt,
        Some(&scale),
    )
}

fn matmul_case(ctx: &Ctx, _op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    match what {
        "shapes" => {
            let dims: &[(usize, usize, usize)] = &[
                (1, 1, 1),
                (7, 5, 3),
                (1, 257, 33),
                (1, 64, 4099),
                (33, 257, 7),
                (64, 64, 64),
                (3, 0, 4),
                (0, 5, 2),
                (130, 70, 90),
            ];
            for (i, &(m, k, n)) in dims.iter().enumerate() {
                check_mm(ctx, dt, &[m, k], &[k, n], 500 + 2 * i as u64)?;
            }
            Ok(())
        }
        "batched_broadcast" => {
            check_mm(ctx, dt, &[2, 1, 7, 9], &[3, 9, 5], 530)?;
            check_mm(ctx, dt, &[4, 1, 16], &[16, 8], 532)
        }
        "transposed" => {
            // A^T and B^T as views: no copies, strides only.
            let (ab, vab) = random(&[9, 7], -1.0, 1.0, 540, dt, ctx.device)?; // A = ab^T: [7, 9]
            let (bb, vbb) = random(&[5, 9], -1.0, 1.0, 541, dt, ctx.device)?; // B = bb^T: [9, 5]
            let a = ab.transpose(0, 1).map_err(err("transpose"))?;
            let b = bb.transpose(0, 1).map_err(err("transpose"))?;
            let (ha, hb) = (host_view(&vab, a.layout()), host_view(&vbb, b.layout()));
            let out = a.matmul(&b).map_err(err("A^T B^T"))?;
            let (want, scale) = matmul_ref(&ha, &[7, 9], &hb, &[9, 5], &[], 7, 9, 5);
            close(
                "transposed operands",
                &values(&out, "mm")?,
                &want,
                dt,
                Some(&scale),
            )?;
            // One row against a transposed weight: the decode GEMV path.
            let x = a.narrow(0, 3, 1).map_err(err("narrow"))?;
            let out = x.matmul(&b).map_err(err("x W^T"))?;
            close(
                "one row, transposed weight",
                &values(&out, "gemv")?,
                &want[15..20],
                dt,
                Some(&scale[15..20]),
            )?;
            // A `[n, k]` weight used transposed at a prefill's shape, large enough to cross
            // the host GEMM's blocks of k (256) and of n (2048) with partial tiles both
            // ways: the packed path that transposes B's contiguous columns as it packs.
            let (wb, vwb) = random(&[2100, 300], -1.0, 1.0, 542, dt, ctx.device)?;
            let w = wb.transpose(0, 1).map_err(err("transpose"))?; // [300, 2100]
            let hw = host_view(&vwb, w.layout());
            let (x, vx) = random(&[40, 300], -1.0, 1.0, 543, dt, ctx.device)?;
            let out = x.matmul(&w).map_err(err("[40, 300] @ [2100, 300]^T"))?;
            let (want, scale) = matmul_ref(&vx, &[40, 300], &hw, &[300, 2100], &[], 40, 300, 2100);
            close(
                "[40, 300] @ [2100, 300]^T",
                &values(&out, "prefill x W^T")?,
                &want,
                dt,
                Some(&scale),
            )?;
            transposed_quads(ctx, dt)
        }
        "alpha_beta" => {
            let (a, va) = random(&[6, 10], -1.0, 1.0, 550, dt, ctx.device)?;
            let (b, vb) = random(&[10, 4], -1.0, 1.0, 551, dt, ctx.device)?;
            for (m, rows) in [(6usize, 0usize), (1, 2)] {
                let a = a.narrow(0, rows, m).map_err(err("narrow"))?;
                let (cbase, vc) = random(&[4, m], -1.0, 1.0, 552, dt, ctx.device)?;
                let c = cbase.transpose(0, 1).map_err(err("transpose"))?; // a strided output
                a.gemm_into(&b, &c, 0.5, 2.0)
                    .map_err(err("gemm alpha 0.5 beta 2"))?;
                let (ab, scale) =
                    matmul_ref(&va[rows * 10..], &[m, 10], &vb, &[10, 4], &[], m, 10, 4);
                let hc = host_view(&vc, c.layout());
                let want: Vec<f64> = ab.iter().zip(&hc).map(|(x, c)| 0.5 * x + 2.0 * c).collect();
                let got = values(&c, "gemm")?;
                close(
                    &format!("gemm alpha/beta, m = {m}"),
                    &got,
                    &want,
                    dt,
                    Some(&scale),
                )?;
            }
            Ok(())
        }
        "quads" => {
            // Extents and strides in multiples of four — what vectorised kernels read four at
            // a time — at tile edges, with operands starting on and off a 16-byte boundary.
            for (i, &(m, k, n)) in [(17, 12, 260), (1, 8, 4), (33, 64, 300), (16, 4, 512)]
                .iter()
                .enumerate()
            {
                check_mm(ctx, dt, &[m, k], &[k, n], 560 + 2 * i as u64)?;
            }
            check_mm(ctx, dt, &[3, 5, 8], &[8, 12], 570)?;
            let (m, k, n) = (9, 16, 20);
            for (shift, seed) in [(1usize, 572u64), (4, 576), (2, 580)] {
                let (fa, va) = random(&[m * k + shift], -1.0, 1.0, seed, dt, ctx.device)?;
                let (fb, vb) = random(&[k * n + shift], -1.0, 1.0, seed + 1, dt, ctx.device)?;
                let (fc, vc) = random(&[m * n + shift], -1.0, 1.0, seed + 2, dt, ctx.device)?;
                let view = |t: &Tensor, len: usize, shape: &[usize]| {
                    t.narrow(0, shift, len)
                        .and_then(|v| v.reshape(shape))
                        .map_err(err("offset view"))
                };
                let a = view(&fa, m * k, &[m, k])?;
                let b = view(&fb, k * n, &[k, n])?;
                let c = view(&fc, m * n, &[m, n])?;
                a.gemm_into(&b, &c, 0.5, -1.5)
                    .map_err(err("gemm on offset views"))?;
                let (ab, scale) =
                    matmul_ref(&va[shift..], &[m, k], &vb[shift..], &[k, n], &[], m, k, n);
                let want: Vec<f64> = ab
                    .iter()
                    .zip(&vc[shift..])
                    .map(|(x, c)| 0.5 * x - 1.5 * c)
                    .collect();
                close(
                    &format!(
                        "gemm alpha 0.5 beta -1.5, operands {shift} elements into their buffers"
                    ),
                    &values(&c, "gemm")?,
                    &want,
                    dt,
                    Some(&scale),
                )?;
            }
            Ok(())
        }
        "few_rows" => few_rows(ctx, dt),
        "large_gemv" => large_gemv(ctx, dt),
        "textured" => textured(ctx, dt),
        "weight_writes" => weight_writes(ctx, dt),
        "large_tiles" => {
            // Enough 128×128 tiles for a GPU's large-tile GEMM (wgpu), edge tiles partial both
            // ways: one product, then a batch of two over one B.
            check_mm(ctx, dt, &[1030, 19], &[19, 2051], 590)?;
            check_mm(ctx, dt, &[2, 1030, 11], &[11, 1030], 592)
        }
        "tensor_core_tiles" => tensor_core_tiles(ctx, dt),
        "bad_input" => {
            let z = |s: &[usize], d: DType| Tensor::zeros(s, d, ctx.device).map_err(err("zeros"));
            let (a, b) = (z(&[3, 4], dt)?, z(&[5, 2], dt)?);
            expect_kind(
                mm::matmul(&a.desc(), &b.desc(), 1.0),
                &["shape_mismatch"],
                "[3,4] @ [5,2]",
            )?;
            let (a3, b3) = (z(&[2, 3, 4], dt)?, z(&[3, 4, 2], dt)?);
            expect_kind(
                mm::matmul(&a3.desc(), &b3.desc(), 1.0),
                &["not_broadcastable"],
                "batch 2 with batch 3",
            )?;
            let v = z(&[4], dt)?;
            expect_kind(
                mm::matmul(&v.desc(), &b.desc(), 1.0),
                &["bad_tensor_shape"],
                "a vector",
            )?;
            let other = another_dtype(dt);
            expect_kind(
                mm::matmul(&a.desc(), &z(&[4, 2], other)?.desc(), 1.0),
                &["dtype_mismatch"],
                "mixed dtypes",
            )?;
            // The output may not overlap an input.
            let sq = z(&[4, 4], dt)?;
            expect_kind(
                sq.gemm_into(&sq, &sq, 1.0, 0.0),
                &["aliasing"],
                "C = A·C in place",
            )?;
            Ok(())
        }
        _ => Err(fail(format!("unknown case {what}"))),
    }
}

/// One-row products over weights of a million elements and more — the decode GEMV, which
/// the CPU splits along k as well as n there, each column's segments summed in a fixed
/// order: k off a multiple of four and of the segment, n over one column block of 4096 and
/// off a multiple of 16, a batch of rows over one B, B stored `[n, k]` (read four columns
/// at a time: n off a multiple of four, k off a multiple of 16), and alpha / beta into a C
/// that holds values; then two to eight rows over one large B, stored `[k, n]` or `[n, k]`
/// (a few decode steps batched), which the CPU also reads in place.
fn large_gemv(ctx: &Ctx, dt: DType) -> Result<(), Failure> {
    check_mm(ctx, dt, &[1, 1030], &[1030, 1030], 700)?;
    check_mm(ctx, dt, &[1, 602], &[602, 4100], 702)?;
    check_mm(ctx, dt, &[2, 1, 300], &[300, 3500], 704)?;
    // Two to eight rows over one large B (the CPU reads B in place for all rows at once):
    // three rows (computed as four), eight, a batch of two rows, k = 257 (one segment, a row
    // past the fours), seven rows over two column blocks.
    check_mm(ctx, dt, &[3, 520], &[520, 1030], 712)?;
    check_mm(ctx, dt, &[8, 300], &[300, 900], 714)?;
    check_mm(ctx, dt, &[2, 2, 1030], &[1030, 300], 716)?;
    check_mm(ctx, dt, &[5, 257], &[257, 1100], 718)?;
    check_mm(ctx, dt, &[7, 60], &[60, 5000], 720)?;
    // W of [1030, 1037]: B = Wᵀ ([1037, 1030], columns contiguous), and W itself as a B.
    let (w, vw) = random(&[1030, 1037], -1.0, 1.0, 706, dt, ctx.device)?;
    let wt = w.transpose(0, 1).map_err(err("transpose"))?;
    let hwt = host_view(&vw, wt.layout());
    let (x, vx) = random(&[1, 1037], -1.0, 1.0, 707, dt, ctx.device)?;
    check_views("[1, 1037] @ [1030, 1037]^T", (&x, &vx), (&wt, &hwt), dt)?;
    // Few rows over it (each column read once for all rows): three (computed as four), six
    // (as eight, a column at a time), and an odd number of columns (n = 1031).
    for (m, seed) in [(3usize, 730u64), (6, 731)] {
        let (x, vx) = random(&[m, 1037], -1.0, 1.0, seed, dt, ctx.device)?;
        check_views(
            &format!("[{m}, 1037] @ [1030, 1037]^T"),
            (&x, &vx),
            (&wt, &hwt),
            dt,
        )?;
    }
    let (w2, vw2) = random(&[1031, 300], -1.0, 1.0, 732, dt, ctx.device)?;
    let w2t = w2.transpose(0, 1).map_err(err("transpose"))?;
    let hw2t = host_view(&vw2, w2t.layout());
    let (x2, vx2) = random(&[4, 300], -1.0, 1.0, 733, dt, ctx.device)?;
    check_views("[4, 300] @ [1031, 300]^T", (&x2, &vx2), (&w2t, &hw2t), dt)?;
    let cases = [
        ("B^T", &wt, &hwt[..], 708, 1),
        ("B", &w, &vw[..], 710, 1),
        ("B", &w, &vw[..], 722, 4),
        ("B^T", &wt, &hwt[..], 724, 4),
    ];
    for (what, b, hb, seed, m) in cases {
        let (k, n) = (b.shape()[0], b.shape()[1]);
        let (a, va) = random(&[m, k], -1.0, 1.0, seed, dt, ctx.device)?;
        let (c, vc) = random(&[m, n], -1.0, 1.0, seed + 1, dt, ctx.device)?;
        let what = format!("gemm alpha 0.5 beta 2, [{m}, {k}] @ {what} [{k}, {n}]");
        a.gemm_into(b, &c, 0.5, 2.0).map_err(err(&what))?;
        let (ab, scale) = matmul_ref(&va, &[m, k], hb, &[k, n], &[], m, k, n);
        let want: Vec<f64> = ab.iter().zip(&vc).map(|(x, c)| 0.5 * x + 2.0 * c).collect();
        close(&what, &values(&c, "gemm")?, &want, dt, Some(&scale))?;
    }
    Ok(())
}
