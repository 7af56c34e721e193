//! Rows of special values through softmax, log_softmax, rms_norm, layer_norm and
//! random_sample (whose own rule for them is in `ops::sample`): masked
//! entries (−∞, as an attention mask leaves them), rows that are all −∞, NaN, +∞, zeros and
//! values near the dtype's largest. The result is the IEEE value of the textbook formula, as
//! PyTorch gives it: `exp(x − max) / Σ exp(x − max)` with `max` ignoring NaN, so a row
//! holding a NaN or +∞, or only −∞, is NaN throughout, and a masked entry is exactly 0 (−∞
//! for log_softmax). These are the inputs where a kernel's shortcuts show: an online softmax
//! that rescales by `exp(old max − new max)` turns a masked prefix into NaN; an `exp` that
//! clamps its argument turns NaN into a number; a compiler that assumes no NaN (lavapipe
//! folds `v != v` to false) drops them. Each row length runs at three sizes, so a backend's
//! one-invocation, split-row and multi-workgroup forms all see them.

use unirt::tensor::{DType, SplitMix64, Tensor};

use crate::cases_ops_large::NormRef;
use crate::cases_ops_linalg::{draw, sample_ref};
use crate::ops_check::*;
use crate::{Ctx, Failure};

/// Row lengths: one short row, one a few hundred long, one past 4096 (where the software
/// adapters split a row among invocations).
const LENGTHS: [usize; 3] = [8, 300, 5000];

/// Half the dtype's largest finite value: two of them a row apart differ by the largest,
/// which every step of a softmax must survive without overflowing.
fn half_max(dt: DType) -> f64 {
    match dt {
        DType::F16 => 65504.0 / 2.0,
        DType::BF16 => 3.389_531_389_251_535_5e38 / 2.0,
        _ => f32::MAX as f64 / 2.0,
    }
}

/// Ordinary values exact in every float dtype: quarters in [−4, 4].
fn ordinary(r: &mut SplitMix64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| ((r.next_f64() * 8.0 - 4.0) * 4.0).round() / 4.0)
        .collect()
}

/// The softmax rows of length `n`, each named.
fn softmax_rows(n: usize, dt: DType, seed: u64) -> Vec<(&'static str, Vec<f64>)> {
    let mut r = SplitMix64::new(seed);
    let inf = f64::INFINITY;
    let mut row = |edit: &dyn Fn(&mut Vec<f64>)| {
        let mut v = ordinary(&mut r, n);
        edit(&mut v);
        v
    };
    vec![
        ("masked first half", row(&|v| v[..n / 2].fill(-inf))),
        ("masked last third", row(&|v| v[n - n / 3..].fill(-inf))),
        (
            "one visible entry",
            row(&|v| {
                v.fill(-inf);
                v[n / 2] = 1.0;
            }),
        ),
        ("all masked", row(&|v| v.fill(-inf))),
        ("a NaN", row(&|v| v[n / 3] = f64::NAN)),
        ("a +inf", row(&|v| v[1] = inf)),
        (
            "near the largest",
            row(&|v| {
                let h = half_max(dt);
                v[0] = h;
                v[1] = -h;
                v[n - 1] = h;
            }),
        ),
        ("ordinary", row(&|_| {})),
    ]
}

/// softmax or log_softmax of rows of special values against `reference` (the rows' f64
/// formula), at every length of [`LENGTHS`].
pub(crate) fn softmax_specials(
    ctx: &Ctx,
    log: bool,
    dt: DType,
    reference: fn(&[f64], &[usize], usize, bool) -> Vec<f64>,
) -> Result<(), Failure> {
    for (i, n) in LENGTHS.into_iter().enumerate() {
        let rows = softmax_rows(n, dt, 900 + i as u64);
        let flat: Vec<f64> = rows.iter().flat_map(|(_, v)| v.iter().copied()).collect();
        let shape = [rows.len(), n];
        let x = Tensor::from_f64(&flat, &shape, dt, ctx.device).map_err(err("from_f64"))?;
        let what = format!("rows of {n}");
        let out = unirt::ops::softmax::softmax(&x.desc(), -1, log)
            .and_then(|p| p.run1(&[&x]))
            .map_err(err(&what))?;
        let got = values(&out, &what)?;
        let want = reference(&flat, &shape, 1, log);
        let names: Vec<&str> = rows.iter().map(|(name, _)| *name).collect();
        close_rows(&names, n, &got, &want, dt)?;
    }
    Ok(())
}

/// Compares `got` with `want` row by row (rows of `n`), naming the row that differs.
fn close_rows(
    names: &[&str],
    n: usize,
    got: &[f64],
    want: &[f64],
    dt: DType,
) -> Result<(), Failure> {
    for (j, name) in names.iter().enumerate() {
        let span = j * n..(j + 1) * n;
        let what = format!("row \"{name}\" of {n}");
        close(&what, &got[span.clone()], &want[span], dt, None)?;
    }
    Ok(())
}

/// rms_norm or layer_norm of rows holding a NaN, a +∞, only zeros, and ordinary values,
/// against `reference`, at every length of [`LENGTHS`].
pub(crate) fn norm_specials(
    ctx: &Ctx,
    layer: bool,
    dt: DType,
    reference: NormRef,
) -> Result<(), Failure> {
    let eps = 1e-5;
    for (i, n) in LENGTHS.into_iter().enumerate() {
        let mut r = SplitMix64::new(950 + i as u64);
        let mut rows = vec![ordinary(&mut r, n); 4];
        rows[0][n / 3] = f64::NAN;
        rows[1][n - 1] = f64::INFINITY;
        rows[2].fill(0.0);
        rows[3] = ordinary(&mut r, n);
        let names = ["a NaN", "a +inf", "zeros", "ordinary"];
        let flat: Vec<f64> = rows.concat();
        let x = Tensor::from_f64(&flat, &[4, n], dt, ctx.device).map_err(err("from_f64"))?;
        let (w, vw) = random(&[n], 0.5, 1.5, 960 + i as u64, dt, ctx.device)?;
        let (b, vb) = random(&[n], -0.5, 0.5, 970 + i as u64, dt, ctx.device)?;
        let what = format!("rows of {n}");
        let out = if layer {
            x.layer_norm(&w, &b, eps)
        } else {
            x.rms_norm(&w, eps)
        }
        .map_err(err(&what))?;
        let got = values(&out, &what)?;
        let want = reference(&flat, &vw, layer.then_some(&vb[..]), eps);
        close_rows(&names, n, &got, &want, dt)?;
    }
    Ok(())
}

/// The reference draw of `random_sample` over one row: (index, distance of the draw from the
/// nearest boundary between candidates, relative to the mass drawn from).
pub(crate) type SampleRef = fn(&[f64], f64, f64, usize, f64) -> (usize, f64);

/// random_sample over logits masked with −∞ (constrained decoding, a banned-token list):
/// a masked token is never drawn, whatever the random value (0 and just under 1 included),
/// temperature, top-k and top-p, and an unambiguous draw is the reference's. Rows of 64,
/// 5000 and 32 000: most entries masked, the first half masked, one entry left.
pub(crate) fn sample_masked(ctx: &Ctx, dt: DType, reference: SampleRef) -> Result<(), Failure> {
    let inf = f64::INFINITY;
    for (i, n) in [64usize, 5000, 32_000].into_iter().enumerate() {
        let mut r = SplitMix64::new(980 + i as u64);
        let grid = |r: &mut SplitMix64| ((r.next_f64() * 12.0 - 6.0) * 4.0).round() / 4.0;
        let rows: Vec<Vec<f64>> = vec![
            // Five tokens left, spread over the row.
            (0..n)
                .map(|j| if j % (n / 5) == 3 { grid(&mut r) } else { -inf })
                .collect(),
            (0..n)
                .map(|j| if j < n / 2 { -inf } else { grid(&mut r) })
                .collect(),
            (0..n)
                .map(|j| if j == n - 2 { 1.5 } else { -inf })
                .collect(),
        ];
        let flat = rows.concat();
        let x =
            Tensor::from_f64(&flat, &[rows.len(), n], dt, ctx.device).map_err(err("from_f64"))?;
        let exact = values(&x, "logits")?;
        for (t, k, p) in [
            (1.0, 0, 1.0),
            (0.7, 50, 0.9),
            (1.0, 0, 0.5),
            (1.3, 3, 1.0),
            (0.0, 0, 1.0),
        ] {
            for random in [0.0, 0.3, 0.999_999] {
                let w = format!("rows of {n}, random {random} T {t} top_k {k} top_p {p}");
                let got = draw(&x, random, t, k, p, &w)?;
                for (row, &g) in got.iter().enumerate() {
                    let lane = &exact[row * n..(row + 1) * n];
                    let picked = usize::try_from(g).ok().filter(|&g| g < n);
                    let Some(at) = picked.filter(|&at| lane[at].is_finite()) else {
                        return Err(fail(format!("{w}: row {row} drew {g}, a masked token")));
                    };
                    // Temperature 0 is the argmax: the reference's draw with top_k 1.
                    let (want, margin) = if t == 0.0 {
                        reference(lane, random, 1.0, 1, 1.0)
                    } else {
                        reference(lane, random, t, k, p)
                    };
                    if margin >= 1e-4 && at != want {
                        return Err(fail(format!("{w}: row {row} drew {at}, expected {want}")));
                    }
                }
            }
        }
    }
    Ok(())
}

/// random_sample over rows with NaN, +∞ and −∞ logits, at temperatures 0, 1 and ∞: the draw
/// `ops::sample`'s rule gives for special values, on every backend (+∞ logits take all the
/// mass, NaN none, a −∞ mask holds at temperature ∞, a row of NaN only draws 0). Each top-k
/// runs walked and bisected (CUDA walks the order up to 48 ranks), each row length below and
/// past one workgroup.
pub(crate) fn sample_specials(ctx: &Ctx, dt: DType) -> Result<(), Failure> {
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    for n in [20usize, 64, 300, 5000] {
        let base: Vec<f64> = (0..n)
            .map(|i| ((i * 7919) % 61) as f64 / 8.0 - 3.75)
            .collect();
        let with = |at: &[(usize, f64)]| {
            let mut r = base.clone();
            for &(i, v) in at {
                r[i] = v;
            }
            r
        };
        let rows: Vec<(&str, Vec<f64>)> = vec![
            ("one +inf", with(&[(5, inf)])),
            ("two +inf", with(&[(n - 2, inf), (7, inf)])),
            ("NaN first and inside", with(&[(0, nan), (9, nan)])),
            (
                "a -inf mask",
                with(&[(3, -inf), (n / 2, -inf), (n - 1, -inf)]),
            ),
            ("NaN only", vec![nan; n]),
            ("-inf only", vec![-inf; n]),
            ("-inf and NaN", {
                let mut r = vec![-inf; n];
                r[2] = nan;
                r[4] = nan;
                r
            }),
        ];
        let flat: Vec<f64> = rows.iter().flat_map(|(_, r)| r.iter().copied()).collect();
        let x =
            Tensor::from_f64(&flat, &[rows.len(), n], dt, ctx.device).map_err(err("from_f64"))?;
        let exact = values(&x, "logits")?;
        for t in [0.0, 1.0, inf] {
            for (k, p) in [(0, 1.0), (0, 0.9), (1, 1.0), (10, 0.9), (50, 1.0), (n, 1.0)] {
                for random in [0.0, 0.37, 0.999_999] {
                    let w = format!("rows of {n}, random {random} T {t} top_k {k} top_p {p}");
                    for (row, g) in draw(&x, random, t, k, p, &w)?.into_iter().enumerate() {
                        let (want, margin) =
                            sample_ref(&exact[row * n..(row + 1) * n], random, t, k, p);
                        if margin >= 1e-4 && g != want as i64 {
                            return Err(fail(format!(
                                "{w}: row \"{}\" drew {g}, expected {want}",
                                rows[row].0
                            )));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
