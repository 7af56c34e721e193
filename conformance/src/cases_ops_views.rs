//! `ops::random_views`: operators on seeded random views — contiguous or transposed, starting
//! 0–7 elements into their buffers, with extents that are and are not multiples of four and
//! row counts on both sides of the wgpu host forms' threshold — against f64 references. Every
//! backend picks kernel variants by layout (the wgpu quad variants by each launch's offsets,
//! host or GPU forms by row count); this draws layouts the fixed cases do not, so a variant
//! chosen for a layout it cannot serve shows up as a wrong value.

use unirt::device::DeviceKind;
use unirt::tensor::{DType, SplitMix64, Tensor};
use unirt::Backend;

use crate::ops_check::*;
use crate::{Case, Ctx, Failure};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "ops::random_views",
            needs: &[],
            run: random_views,
        },
        Case {
            name: "ops::absurd_shapes_are_typed_errors",
            needs: &[],
            run: absurd_shapes,
        },
    ]
}

/// Views and operator outputs whose element counts overflow: each is a typed error at plan
/// time (found by the operator fuzzer, which panicked on a multiplication overflow and, on
/// wgpu, tried to build a 2^39-entry rope table), never a panic, a hang or a huge allocation.
fn absurd_shapes(ctx: &Ctx) -> Result<(), Failure> {
    let big = 1usize << 40;
    let one = Tensor::from_f64(&[1.0], &[1, 1], DType::F32, ctx.device).map_err(err("one"))?;
    expect_kind(
        one.broadcast_to(&[big, big]),
        &["bad_tensor_shape"],
        "broadcast to 2^80 elements",
    )?;
    let (col, row) = (
        one.broadcast_to(&[big, 1]).map_err(err("column"))?,
        one.broadcast_to(&[1, big]).map_err(err("row"))?,
    );
    expect_kind(col.add(&row), &["too_large"], "[2^40, 1] + [1, 2^40]")?;
    expect_kind(col.matmul(&row), &["too_large"], "[2^40, 1] @ [1, 2^40]")?;
    let flat = one.broadcast_to(&[usize::MAX / 2 + 1]);
    if let Ok(f) = flat {
        expect_kind(
            Tensor::concat(&[&f, &f, &f], 0),
            &["bad_tensor_shape", "too_large"],
            "concat past usize::MAX",
        )?;
    }
    // Reductions over a broadcast extent of 2^40 that no output holds — attention's keys, a
    // product's k — on the backends that run kernels on the host's memory: a typed error, never
    // an abort (the CPU's attention sized its scores by the key count and aborted when that
    // allocation was refused; a CPU product over one row copies A's row). On a GPU these are
    // long but legitimate computations.
    if matches!(ctx.backend.kind(), DeviceKind::Cpu | DeviceKind::Wgpu) {
        let q = Tensor::zeros(&[1, 1, 1, 4], DType::F32, ctx.device).map_err(err("q"))?;
        let kv = q.broadcast_to(&[1, 1, big, 4]).map_err(err("k, v"))?;
        let computed = |r: unirt::Result<Tensor>| r.and_then(|t| t.to_bytes().map(drop));
        let refused = ["out_of_memory", "too_large", "unsupported"];
        expect_kind(
            computed(q.attention(&kv, &kv, false)),
            &refused,
            "attention over 2^40 broadcast keys",
        )?;
        expect_kind(
            computed(row.matmul(&col)),
            &refused,
            "[1, 2^40] @ [2^40, 1]",
        )?;
    }
    // Empty tensors whose other extents are absurd: a result or a typed error, and no table,
    // grid or code sized by those extents (the wgpu rope once built a 2^39-entry table).
    let pos = Tensor::zeros(&[0], DType::I64, ctx.device).map_err(err("pos"))?;
    let e = Tensor::zeros(&[0, 2, 4], DType::F32, ctx.device).map_err(err("empty"))?;
    let wide = e
        .unsqueeze(0)
        .and_then(|u| u.broadcast_to(&[big, 0, 2, 4]))
        .map_err(err("an empty broadcast"))?;
    let x = Tensor::empty(&[0, 2, big], DType::F32, ctx.device).map_err(err("[0, 2, 2^40]"))?;
    for (what, r) in [
        ("sum of [2^40, 0, 2, 4]", wide.sum(&[-1], false).map(|_| ())),
        ("softmax of [0, 2, 2^40]", x.softmax(-1).map(|_| ())),
        (
            "rope of [0, 2, 2^40]",
            x.rope(&pos, 10000.0, false).map(|_| ()),
        ),
        ("rms_norm of [0, 2, 2^40]", {
            let g = one.reshape(&[1]).and_then(|o| o.broadcast_to(&[big]));
            g.and_then(|g| x.rms_norm(&g, 1e-5)).map(|_| ())
        }),
    ] {
        if let Err(e) = r {
            if e.kind_name() == "internal" {
                return Err(fail(format!("{what}: {e}")));
            }
        }
    }
    Ok(())
}

/// Extents drawn for every dimension: multiples of four and not, 1 and past a tile.
const EXTENTS: [usize; 10] = [1, 3, 4, 5, 8, 12, 16, 17, 36, 64];

struct Draw(SplitMix64);

impl Draw {
    fn below(&mut self, n: usize) -> usize {
        (self.0.next_u64() % n as u64) as usize
    }
    fn extent(&mut self) -> usize {
        EXTENTS[self.below(EXTENTS.len())]
    }
}

/// A random view of logical shape `[rows, cols]` on `ctx`'s device: a flat buffer of
/// `rows·cols + shift` elements, `shift` in 0..8, seen as `[rows, cols]` or as the
/// transpose of `[cols, rows]`. Returns the view and its values.
fn view(
    ctx: &Ctx,
    d: &mut Draw,
    rows: usize,
    cols: usize,
    dt: DType,
    seed: u64,
) -> Result<(Tensor, Vec<f64>, String), Failure> {
    let shift = d.below(8);
    let transposed = d.below(3) == 0;
    let (flat, vf) = random(&[rows * cols + shift], -2.0, 2.0, seed, dt, ctx.device)?;
    let base = flat.narrow(0, shift, rows * cols).map_err(err("narrow"))?;
    let v = if transposed {
        base.reshape(&[cols, rows])
            .and_then(|t| t.transpose(0, 1))
            .map_err(err("transposed view"))?
    } else {
        base.reshape(&[rows, cols]).map_err(err("view"))?
    };
    let hv = host_view(&vf, v.layout());
    let what = format!(
        "[{rows}, {cols}]{} at offset {shift}",
        if transposed { " transposed" } else { "" }
    );
    Ok((v, hv, what))
}

fn random_views(ctx: &Ctx) -> Result<(), Failure> {
    let mut d = Draw(SplitMix64::new(0x5eed_u64));
    for trial in 0..40u64 {
        let dt = [DType::F32, DType::F16, DType::BF16][(trial % 3) as usize];
        let (rows, cols) = (d.extent(), d.extent());
        let seed = 900 + 4 * trial;
        let (x, hx, what) = view(ctx, &mut d, rows, cols, dt, seed)?;
        match trial % 5 {
            0 => {
                let (y, hy, wy) = view(ctx, &mut d, rows, cols, dt, seed + 1)?;
                let w = format!("trial {trial}: add {what} + {wy} ({dt})");
                let out = x.add(&y).map_err(err(&w))?;
                let want: Vec<f64> = hx.iter().zip(&hy).map(|(a, b)| a + b).collect();
                close(&w, &values(&out, &w)?, &want, dt, None)?;
            }
            1 => {
                let w = format!("trial {trial}: silu {what} ({dt})");
                let out = x.silu().map_err(err(&w))?;
                let want: Vec<f64> = hx.iter().map(|&v| v / (1.0 + (-v).exp())).collect();
                close(&w, &values(&out, &w)?, &want, dt, None)?;
            }
            2 => {
                let n = d.extent();
                let (y, hy, wy) = view(ctx, &mut d, cols, n, dt, seed + 1)?;
                let w = format!("trial {trial}: matmul {what} @ {wy} ({dt})");
                let out = x.matmul(&y).map_err(err(&w))?;
                let (mut want, mut scale) = (Vec::new(), Vec::new());
                for i in 0..rows {
                    for j in 0..n {
                        let terms = (0..cols).map(|q| hx[i * cols + q] * hy[q * n + j]);
                        want.push(terms.clone().sum());
                        scale.push(terms.map(f64::abs).sum());
                    }
                }
                close(&w, &values(&out, &w)?, &want, dt, Some(&scale))?;
            }
            3 => {
                let (g, hg) = random(&[cols], 0.5, 1.5, seed + 2, dt, ctx.device)?;
                let w = format!("trial {trial}: rms_norm {what} ({dt})");
                let out = x.rms_norm(&g, 1e-5).map_err(err(&w))?;
                let mut want = Vec::new();
                for row in hx.chunks(cols) {
                    let ms = row.iter().map(|v| v * v).sum::<f64>() / cols as f64;
                    let inv = 1.0 / (ms + 1e-5).sqrt();
                    want.extend(row.iter().zip(&hg).map(|(v, g)| v * inv * g));
                }
                close(&w, &values(&out, &w)?, &want, dt, None)?;
            }
            _ => {
                let w = format!("trial {trial}: softmax {what} ({dt})");
                let out = x.softmax(-1).map_err(err(&w))?;
                let mut want = Vec::new();
                for row in hx.chunks(cols) {
                    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
                    want.extend(row.iter().map(|v| (v - m).exp() / s));
                }
                close(&w, &values(&out, &w)?, &want, dt, None)?;
            }
        }
    }
    Ok(())
}
