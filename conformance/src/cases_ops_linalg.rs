//! Transformer-block operator cases: rotary embedding, attention, sampling (matmul / gemm:
//! `cases_ops_matmul`).

use unirt::ops::{attention as att, rope as rp, sample};
use unirt::tensor::{DType, SplitMix64, Tensor};

use crate::ops_check::*;
use crate::{Ctx, Failure};

crate::op_cases! {
    rope = "rope": [f32, f16, bf16] => [half, interleaved, strided, bad_input] via rope_case;
    attention = "attention": [f32, f16, bf16] => [prefill_causal, decode, chunk_causal, full, long, wide, bad_input] via attention_case;
    random_sample = "random_sample": [f32, f16, bf16] => [argmax, top_k_top_p, vocabulary, short_rows, masked, specials, bad_input] via sample_case;
}

fn rope_ref(vx: &[f64], shape: &[usize], pos: &[f64], theta: f64, interleaved: bool) -> Vec<f64> {
    let nd = shape.len();
    let (seq, heads, d) = (shape[nd - 3], shape[nd - 2], shape[nd - 1]);
    let half = d / 2;
    let mut out = vx.to_vec();
    for (r, row) in out.chunks_mut(d).enumerate() {
        let s = (r / heads) % seq;
        let src = row.to_vec();
        for i in 0..half {
            let ang = pos[s] * theta.powf(-2.0 * i as f64 / d as f64);
            let (a, b) = if interleaved {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            row[a] = src[a] * ang.cos() - src[b] * ang.sin();
            row[b] = src[a] * ang.sin() + src[b] * ang.cos();
        }
    }
    out
}

/// rope of the same x placed 0 … 3 elements into its buffer: bitwise the same results
/// ([`same_wherever_placed`]; shift 0 takes wgpu's quad variant, through a texture at
/// 16 384 elements and more), and the reference's.
fn placement(ctx: &Ctx, dt: DType, inter: bool) -> Result<(), Failure> {
    let shape = [16, 8, 128];
    let n: usize = shape.iter().product();
    let mut r = SplitMix64::new(640);
    let v: Vec<f32> = (0..n).map(|_| (r.next_f64() * 2.0 - 1.0) as f32).collect();
    let pos: Vec<f64> = (0..16).map(|i| (i * 257 % 4096) as f64).collect();
    let p = Tensor::from_f64(&pos, &[16], DType::I32, ctx.device).map_err(err("positions"))?;
    let w = format!("rope of {shape:?}");
    let (x, got) = same_wherever_placed(ctx, &v, &shape, dt, &w, |x| x.rope(&p, 10000.0, inter))?;
    let vx = values(&x, &w)?;
    close(
        &w,
        &got,
        &rope_ref(&vx, &shape, &pos, 10000.0, inter),
        dt,
        None,
    )
}

fn rope_case(ctx: &Ctx, _op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    let theta = 10000.0;
    let check = |x: &Tensor,
                 vx: &[f64],
                 pos: &[f64],
                 pdt: DType,
                 inter: bool,
                 w: &str|
     -> Result<(), Failure> {
        let p = Tensor::from_f64(pos, &[pos.len()], pdt, ctx.device).map_err(err("positions"))?;
        let out = x.rope(&p, theta, inter).map_err(err(w))?;
        close(
            w,
            &values(&out, w)?,
            &rope_ref(vx, x.shape(), pos, theta, inter),
            dt,
            None,
        )
    };
    match what {
        "half" | "interleaved" => {
            let inter = what == "interleaved";
            let (x, vx) = random(&[7, 3, 8], -1.0, 1.0, 600, dt, ctx.device)?;
            check(
                &x,
                &vx,
                &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
                DType::I32,
                inter,
                "positions 0..7",
            )?;
            let (x, vx) = random(&[2, 5, 4, 128], -1.0, 1.0, 601, dt, ctx.device)?;
            check(
                &x,
                &vx,
                &[100.0, 3.0, 4095.0, 7.0, 0.0],
                DType::I64,
                inter,
                "scattered positions, head dim 128",
            )?;
            placement(ctx, dt, inter)?;
            // Past the 1024 pairs a CUDA block keeps its angles for (rope.cu's ROPE_TABLE).
            let (x, vx) = random(&[3, 2, 2 * 1030], -1.0, 1.0, 602, dt, ctx.device)?;
            check(
                &x,
                &vx,
                &[5.0, 900.0, 17.0],
                DType::I32,
                inter,
                "head dim 2060",
            )
        }
        "strided" => {
            // x as a [seq, heads, dim] view of a [heads, seq, dim] tensor.
            let (base, vb) = random(&[3, 5, 16], -1.0, 1.0, 610, dt, ctx.device)?;
            let x = base.transpose(0, 1).map_err(err("transpose"))?;
            check(
                &x,
                &host_view(&vb, x.layout()),
                &[9.0, 8.0, 7.0, 6.0, 5.0],
                DType::I64,
                false,
                "transposed x",
            )
        }
        "bad_input" => {
            let z = |s: &[usize], d: DType| Tensor::zeros(s, d, ctx.device).map_err(err("zeros"));
            let x = z(&[4, 2, 8], dt)?;
            expect_kind(
                rp::rope(
                    &z(&[4, 2, 7], dt)?.desc(),
                    &z(&[4], DType::I32)?.desc(),
                    theta,
                    false,
                ),
                &["bad_tensor_shape"],
                "odd head dim",
            )?;
            expect_kind(
                rp::rope(&x.desc(), &z(&[5], DType::I32)?.desc(), theta, false),
                &["shape_mismatch"],
                "5 positions for 4 tokens",
            )?;
            expect_kind(
                rp::rope(&x.desc(), &z(&[4], DType::F32)?.desc(), theta, false),
                &["dtype_mismatch"],
                "f32 positions",
            )?;
            expect_kind(
                rp::rope(&x.desc(), &z(&[4], DType::I32)?.desc(), -1.0, false),
                &["bad_param"],
                "negative theta",
            )?;
            Ok(())
        }
        _ => Err(fail(format!("unknown case {what}"))),
    }
}

#[allow(clippy::too_many_arguments)]
fn attention_ref(
    vq: &[f64],
    vk: &[f64],
    vv: &[f64],
    b: usize,
    hq: usize,
    lq: usize,
    hkv: usize,
    lkv: usize,
    d: usize,
    causal: bool,
) -> Vec<f64> {
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = Vec::with_capacity(b * hq * lq * d);
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / (hq / hkv);
            for i in 0..lq {
                let visible = if causal {
                    (i + lkv - lq + 1).min(lkv)
                } else {
                    lkv
                };
                let q = &vq[((bi * hq + h) * lq + i) * d..][..d];
                let s: Vec<f64> = (0..visible)
                    .map(|j| {
                        let k = &vk[((bi * hkv + kh) * lkv + j) * d..][..d];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() * scale
                    })
                    .collect();
                let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for c in 0..d {
                    out.push(
                        (0..visible)
                            .map(|j| e[j] / sum * vv[((bi * hkv + kh) * lkv + j) * d + c])
                            .sum(),
                    );
                }
            }
        }
    }
    out
}

fn attention_case(ctx: &Ctx, _op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    let run = |b: usize,
               hq: usize,
               lq: usize,
               hkv: usize,
               lkv: usize,
               d: usize,
               causal: bool,
               seed: u64|
     -> Result<(), Failure> {
        let (q, vq) = random(&[b, hq, lq, d], -1.0, 1.0, seed, dt, ctx.device)?;
        let (k, vk) = random(&[b, hkv, lkv, d], -1.0, 1.0, seed + 1, dt, ctx.device)?;
        let (v, vv) = random(&[b, hkv, lkv, d], -1.0, 1.0, seed + 2, dt, ctx.device)?;
        let w = format!("attention b{b} hq{hq} lq{lq} hkv{hkv} lkv{lkv} d{d} causal {causal}");
        let out = q.attention(&k, &v, causal).map_err(err(&w))?;
        let want = attention_ref(&vq, &vk, &vv, b, hq, lq, hkv, lkv, d, causal);
        close(&w, &values(&out, &w)?, &want, dt, None)
    };
    match what {
        "prefill_causal" => run(2, 4, 7, 2, 7, 16, true, 700),
        "decode" => {
            run(1, 8, 1, 2, 257, 64, true, 710)?;
            run(1, 4, 1, 4, 1, 8, true, 713)
        }
        "chunk_causal" => run(1, 6, 3, 3, 9, 32, true, 720),
        "full" => run(2, 2, 5, 1, 11, 8, false, 730),
        // Past one tile of queries and of keys (GPU kernels take 64 of each at a time), with
        // head dimensions that are and are not multiples of the tensor-core tile (16).
        "long" => {
            run(1, 2, 130, 1, 150, 64, true, 740)?;
            run(1, 2, 70, 1, 70, 128, true, 741)?;
            run(1, 2, 65, 1, 129, 40, false, 742)
        }
        // The d = 128 tensor-core kernels over several query blocks (64 and 128 queries on the
        // GPU) and key tiles (32 and 64), causal with the queries at the end of a longer
        // cache, and a head dimension padded to 128.
        "wide" => {
            run(1, 4, 300, 2, 300, 128, true, 750)?;
            run(1, 2, 150, 1, 290, 128, true, 751)?;
            run(1, 2, 200, 1, 333, 96, false, 752)
        }
        "bad_input" => {
            let z = |s: &[usize]| Tensor::zeros(s, dt, ctx.device).map_err(err("zeros"));
            let q = z(&[1, 6, 4, 8])?;
            let k4 = z(&[1, 4, 4, 8])?;
            expect_kind(
                att::attention(&q.desc(), &k4.desc(), &k4.desc(), false, None),
                &["bad_tensor_shape"],
                "4 kv heads for 6 query heads",
            )?;
            let k3 = z(&[1, 3, 3, 8])?;
            expect_kind(
                att::attention(&q.desc(), &k3.desc(), &k3.desc(), true, None),
                &["bad_tensor_shape"],
                "causal, 4 queries over 3 keys",
            )?;
            let kd = z(&[1, 3, 4, 16])?;
            expect_kind(
                att::attention(&q.desc(), &kd.desc(), &kd.desc(), false, None),
                &["shape_mismatch"],
                "head dims 8 and 16",
            )?;
            let v5 = z(&[1, 3, 5, 8])?;
            expect_kind(
                att::attention(
                    &q.desc(),
                    &z(&[1, 3, 4, 8])?.desc(),
                    &v5.desc(),
                    false,
                    None,
                ),
                &["bad_tensor_shape"],
                "k and v of different lengths",
            )?;
            Ok(())
        }
        _ => Err(fail(format!("unknown case {what}"))),
    }
}

/// The weight of logit `x` in a row of maximum `max` by the rule `ops::sample` states for
/// special values: NaN 0, the maximum 1, one infinitely below it 0, else exp((x − max) / T).
fn sample_weight(x: f64, max: f64, t: f64) -> f64 {
    // (x − max is never positive: an infinite difference is −∞.)
    match (x.is_nan(), x == max, (x - max).is_infinite()) {
        (true, ..) => 0.0,
        (_, true, _) => 1.0,
        (_, _, true) => 0.0,
        _ => ((x - max) / t).exp(),
    }
}

/// Where `random` lands among the cumulative masses of the reference rule (`ops::sample`,
/// special values included: NaN last and weightless, a row of NaN only draws 0; temperature
/// 0 is the argmax), and how close it is to a boundary (so f32 rounding in the kernel cannot
/// be mistaken for a wrong pick).
pub(crate) fn sample_ref(l: &[f64], random: f64, t: f64, top_k: usize, top_p: f64) -> (usize, f64) {
    let mut order: Vec<usize> = (0..l.len()).collect();
    order.sort_by(|&a, &b| match (l[a].is_nan(), l[b].is_nan()) {
        (false, false) => l[b].partial_cmp(&l[a]).unwrap().then(a.cmp(&b)),
        (x, y) => x.cmp(&y).then(a.cmp(&b)),
    });
    if t == 0.0 {
        return (order[0], 1.0);
    }
    let k = if top_k == 0 {
        l.len()
    } else {
        top_k.min(l.len())
    };
    order.truncate(k);
    let mut cum = Vec::new();
    let mut total = 0.0;
    for &i in &order {
        total += sample_weight(l[i], l[order[0]], t);
        cum.push(total);
    }
    if total == 0.0 {
        // Every logit NaN.
        return (0, 1.0);
    }
    let keep = cum
        .iter()
        .position(|&c| c >= top_p * total)
        .map_or(k, |p| p + 1);
    let th = random * cum[keep - 1];
    let at = cum[..keep].iter().position(|&c| c > th).unwrap_or(keep - 1);
    let margin = cum
        .iter()
        .map(|c| (c - th).abs() / cum[keep - 1])
        .fold(f64::INFINITY, f64::min);
    (order[at], margin)
}

/// `x`'s draws (one per row) by `random_sample`; `w` names the draw in an error.
pub(crate) fn draw(
    x: &Tensor,
    random: f64,
    t: f64,
    k: usize,
    p: f64,
    w: &str,
) -> Result<Vec<i64>, Failure> {
    x.random_sample(random, t, k, p)
        .and_then(|t| t.to_vec::<i64>())
        .map_err(err(w))
}

/// `Ok` when at least `least` draws were checked (the others fell on a boundary).
fn enough_draws(checked: usize, least: usize) -> Result<(), Failure> {
    if checked < least {
        return Err(fail(format!(
            "only {checked} draws were away from a boundary"
        )));
    }
    Ok(())
}

fn sample_case(ctx: &Ctx, _op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    match what {
        "masked" => super::cases_ops_specials::sample_masked(ctx, dt, sample_ref),
        "specials" => super::cases_ops_specials::sample_specials(ctx, dt),
        "argmax" => {
            for (i, &n) in [1usize, 7, 4099].iter().enumerate() {
                let (x, vx) = random(&[3, n], -4.0, 4.0, 800 + i as u64, dt, ctx.device)?;
                let w = format!("random_sample at temperature 0 over {n}");
                let got = x
                    .random_sample(0.5, 0.0, 0, 1.0)
                    .and_then(|t| t.to_vec::<i64>())
                    .map_err(err(&w))?;
                let am = x
                    .argmax(-1, false)
                    .and_then(|t| t.to_vec::<i64>())
                    .map_err(err("argmax"))?;
                let want: Vec<i64> = vx
                    .chunks(n)
                    .map(|r| sample_ref(r, 0.0, 1.0, 1, 1.0).0 as i64)
                    .collect();
                if got != want || am != want {
                    return Err(fail(format!(
                        "{w}: sample {got:?}, argmax {am:?}, expected {want:?}"
                    )));
                }
            }
            Ok(())
        }
        "top_k_top_p" => {
            let (x, vx) = random(&[257], -3.0, 3.0, 810, dt, ctx.device)?;
            let mut r = SplitMix64::new(811);
            let mut checked = 0;
            for (t, k, p) in [
                (1.0, 0, 1.0),
                (0.7, 50, 0.9),
                (1.3, 5, 1.0),
                (1.0, 0, 0.5),
                (2.0, 257, 0.95),
            ] {
                for _ in 0..8 {
                    let random = r.next_f64();
                    let (want, margin) = sample_ref(&vx, random, t, k, p);
                    if margin < 1e-4 {
                        continue; // on a boundary: f32 and f64 may both be right
                    }
                    let w = format!("random_sample random {random:.4} T {t} top_k {k} top_p {p}");
                    let got = draw(&x, random, t, k, p, &w)?;
                    if got != [want as i64] {
                        return Err(fail(format!("{w}: picked {got:?}, expected {want}")));
                    }
                    checked += 1;
                }
            }
            enough_draws(checked, 20)
        }
        "vocabulary" => {
            // An LLM-sized vocabulary, two rows read through a transposed view, logits on a
            // grid of 1/8 so that most values are shared by several entries (ties go to the
            // lower index) — the kernels that cut the order without sorting it must agree.
            let (n, rows) = (32_000, 2);
            let mut r = SplitMix64::new(820);
            let grid: Vec<f32> = (0..n * rows)
                .map(|_| ((r.next_f64() * 12.0 - 6.0) * 8.0).round() as f32 / 8.0)
                .collect();
            let stored = Tensor::from_slice(&grid, &[n, rows], ctx.device)
                .and_then(|t| t.to_dtype(dt))
                .map_err(err("logits"))?;
            let sv = values(&stored, "logits")?;
            let x = stored.transpose(0, 1).map_err(err("transpose"))?;
            // The same rows made contiguous too (the software adapters then read them through
            // a texture): both must pick the reference's candidates.
            let dense = x.contiguous().map_err(err("contiguous"))?;
            let row = |i: usize| (0..n).map(|j| sv[j * rows + i]).collect::<Vec<f64>>();
            let mut checked = 0;
            for (t, k, p) in [
                (1.0, 0, 0.9),
                (0.8, 40, 1.0),
                (1.0, 1000, 0.6),
                (0.5, 0, 1.0),
            ] {
                for _ in 0..3 {
                    let random = r.next_f64();
                    let want: Vec<(usize, f64)> = (0..rows)
                        .map(|i| sample_ref(&row(i), random, t, k, p))
                        .collect();
                    if want.iter().any(|&(_, margin)| margin < 1e-4) {
                        continue;
                    }
                    let w = format!(
                        "random_sample over {rows} × {n} random {random:.4} T {t} top_k {k} top_p {p}"
                    );
                    let want: Vec<i64> = want.iter().map(|&(i, _)| i as i64).collect();
                    for (view, x) in [("transposed", &x), ("contiguous", &dense)] {
                        let got = draw(x, random, t, k, p, &w)?;
                        if got != want {
                            return Err(fail(format!(
                                "{w}, {view}: picked {got:?}, expected {want:?}"
                            )));
                        }
                    }
                    checked += 1;
                }
            }
            // Monotonic rows, ties in fours (more in 16-bit dtypes): ascending makes every
            // logit a new best, descending none, for the kernels that skip logits below the
            // worst candidate kept so far.
            for ascending in [true, false] {
                let ramp: Vec<f32> = (0..n)
                    .map(|j| {
                        let j = if ascending { j } else { n - 1 - j };
                        (j / 4) as f32 / 256.0
                    })
                    .collect();
                let x = Tensor::from_slice(&ramp, &[1, n], ctx.device)
                    .and_then(|t| t.to_dtype(dt))
                    .map_err(err("ramp"))?;
                let vr = values(&x, "ramp")?;
                for (t, k, p) in [(0.05, 50, 1.0), (0.5, 1000, 0.8)] {
                    let random = r.next_f64();
                    let (want, margin) = sample_ref(&vr, random, t, k, p);
                    if margin < 1e-4 {
                        continue;
                    }
                    let w = format!(
                        "random_sample over an {} ramp of {n}, random {random:.4} T {t} top_k {k} top_p {p}",
                        if ascending { "ascending" } else { "descending" }
                    );
                    let got = draw(&x, random, t, k, p, &w)?;
                    if got != [want as i64] {
                        return Err(fail(format!("{w}: picked {got:?}, expected {want}")));
                    }
                    checked += 1;
                }
            }
            enough_draws(checked, 8)
        }
        "short_rows" => {
            // Many rows shorter than a workgroup (the wgpu kernel sizes its workgroup to the
            // row): every row's pick against the reference, with every cut.
            let mut r = SplitMix64::new(830);
            let mut checked = 0;
            for (i, &n) in [2usize, 5, 8, 33, 100, 255].iter().enumerate() {
                let rows = 40;
                let (x, vx) = random(&[rows, n], -3.0, 3.0, 831 + i as u64, dt, ctx.device)?;
                for (t, k, p) in [(1.0, 0, 1.0), (0.7, 3, 0.9), (1.5, 0, 0.6)] {
                    let random = r.next_f64();
                    let want: Vec<(usize, f64)> = vx
                        .chunks(n)
                        .map(|row| sample_ref(row, random, t, k, p))
                        .collect();
                    let w = format!(
                        "random_sample over {rows} × {n} random {random:.4} T {t} top_k {k} top_p {p}"
                    );
                    let got = draw(&x, random, t, k, p, &w)?;
                    for (row, (&g, &(want, margin))) in got.iter().zip(&want).enumerate() {
                        if margin < 1e-4 {
                            continue; // on a boundary: f32 and f64 may both be right
                        }
                        if g != want as i64 {
                            return Err(fail(format!(
                                "{w}: row {row} picked {g}, expected {want}"
                            )));
                        }
                        checked += 1;
                    }
                }
            }
            enough_draws(checked, 500)
        }
        "bad_input" => {
            let x = Tensor::zeros(&[10], dt, ctx.device).map_err(err("zeros"))?;
            expect_kind(
                sample::random_sample(&x.desc(), 1.0, 1.0, 0, 1.0),
                &["bad_param"],
                "random 1.0",
            )?;
            expect_kind(
                sample::random_sample(&x.desc(), 0.5, -1.0, 0, 1.0),
                &["bad_param"],
                "temperature -1",
            )?;
            expect_kind(
                sample::random_sample(&x.desc(), 0.5, 1.0, 0, 0.0),
                &["bad_param"],
                "top_p 0",
            )?;
            let e = Tensor::zeros(&[3, 0], dt, ctx.device).map_err(err("zeros"))?;
            expect_kind(
                sample::random_sample(&e.desc(), 0.5, 1.0, 0, 1.0),
                &["bad_tensor_shape"],
                "an empty vocabulary",
            )?;
            Ok(())
        }
        _ => Err(fail(format!("unknown case {what}"))),
    }
}
