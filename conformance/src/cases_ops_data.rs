//! Data-movement operator cases: cast, rearrange, concat, embedding. Their results are exact.

use unirt::ops::embedding as emb;
use unirt::tensor::{decode, encode, DType, SplitMix64, Tensor};

use crate::ops_check::*;
use crate::{Ctx, Failure};

crate::op_cases! {
    cast = "cast": [f32, f16, bf16, i32, i64, u8, bool] => [all_targets] via cast_case;
    cast_special = "cast": [f32, f16, bf16] => [nan_inf_zero] via cast_case;
    cast_wide = "cast": [i64] => [wide_integers] via cast_case;
    rearrange = "rearrange": [f32, f16, bf16, i32, i64, u8, bool] => [layouts] via rearrange_case;
    rearrange_bad = "rearrange": [f32] => [bad_input] via rearrange_case;
    rearrange_big = "rearrange": [f32, f16, i64, u8] => [large_transposes] via rearrange_case;
    concat = "concat": [f32, f16, bf16, i32, i64, u8, bool] => [axes] via concat_case;
    concat_bad = "concat": [f32] => [bad_input] via concat_case;
    embedding = "embedding": [f32, f16, bf16] => [gather, bad_input, faults_cleared_and_replayed] via embedding_case;
}

/// Values that every dtype can hold approximately: integers for the integer types, 0/1 for
/// bool, reals with a fractional part for floats (some negative, some above 255).
fn sample_values(n: usize, dt: DType, seed: u64) -> Vec<f64> {
    let mut r = SplitMix64::new(seed);
    (0..n)
        .map(|_| match dt {
            DType::Bool => (r.next_u64() & 1) as f64,
            DType::U8 => r.below(256) as f64,
            DType::I32 | DType::I64 => r.below(600) as f64 - 300.0,
            _ => (r.next_f64() - 0.5) * 600.0,
        })
        .collect()
}

fn tensor(v: &[f64], shape: &[usize], dt: DType, ctx: &Ctx) -> Result<(Tensor, Vec<f64>), Failure> {
    let t = Tensor::from_f64(v, shape, dt, ctx.device).map_err(err("from_f64"))?;
    let stored = values(&t, "stored values")?;
    Ok((t, stored))
}

/// `v` as stored in `dt` (the rounding every cast does once).
fn as_dtype(v: f64, dt: DType) -> f64 {
    let mut b = Vec::new();
    encode(dt, v, &mut b);
    decode(dt, &b)
}

fn cast_case(ctx: &Ctx, _op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    if what == "wide_integers" {
        return cast_wide_integers(ctx, dt);
    }
    if what == "nan_inf_zero" {
        // NaN (0 as an integer, true as bool), infinities (saturated), signed zeros and
        // values past each integer type's range, to every dtype: as `encode` stores them.
        let v = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            0.0,
            65504.0,
            -300.5,
            1e9,
        ];
        let (x, vx) = tensor(&v.repeat(4), &[4, 8], dt, ctx)?;
        for to in DType::ALL {
            let what = format!("cast {dt} NaN, infinities, zeros and large values to {to}");
            let out = x.to_dtype(to).map_err(err(&what))?;
            let want: Vec<f64> = vx.iter().map(|&x| as_dtype(x, to)).collect();
            close(&what, &values(&out, &what)?, &want, to, None)?;
        }
        return Ok(());
    }
    let (base, vb) = tensor(&sample_values(257 * 3, dt, 5), &[3, 257], dt, ctx)?;
    let views = [
        base.clone(),
        base.transpose(0, 1).map_err(err("transpose"))?,
        base.narrow(1, 100, 0).map_err(err("narrow"))?,
    ];
    for v in &views {
        let src = host_view(&vb, v.layout());
        for to in DType::ALL {
            let what = format!("cast {dt} {:?} to {to}", v.shape());
            let out = v.to_dtype(to).map_err(err(&what))?;
            if out.dtype() != to {
                return Err(fail(format!("{what}: result has dtype {}", out.dtype())));
            }
            let want: Vec<f64> = src.iter().map(|&x| as_dtype(x, to)).collect();
            close(&what, &values(&out, &what)?, &want, to, None)?;
        }
    }
    Ok(())
}

/// i64 values of every bit length (ties and near-ties of f32's and bf16's rounding among
/// them) to every float dtype, bitwise as through f64 (`as_dtype` of the stored value, which
/// reads back as f64): the wgpu kernel once added its two words in f32, a unit in the last
/// place off for large values, and the host's f64 to bf16 conversion dropped low bits.
fn cast_wide_integers(ctx: &Ctx, dt: DType) -> Result<(), Failure> {
    let mut r = SplitMix64::new(21);
    let mut v: Vec<i64> = (0..4000)
        .map(|_| (r.next_u64() as i64) >> r.below(64))
        .collect();
    for k in 25..63 {
        let base = (1i64 << k) | (1i64 << (k - 24)) | (1i64 << (k - 8));
        v.extend([-1, 0, 1].map(|d| base + d));
        v.extend([-1, 0, 1].map(|d| -(base + d)));
    }
    v.extend([i64::MIN, i64::MAX, 0, -1, 1 << 53, (1 << 53) + 1]);
    let x = Tensor::from_slice(&v, &[v.len()], ctx.device).map_err(err("from_slice"))?;
    let vx = values(&x, "stored values")?;
    for to in [DType::F32, DType::F16, DType::BF16] {
        let what = format!("cast {dt} of every bit length to {to}");
        let out = x.to_dtype(to).map_err(err(&what))?;
        let got = values(&out, &what)?;
        for (i, (&g, &x)) in got.iter().zip(&vx).enumerate() {
            let want = as_dtype(x, to);
            if g.to_bits() != want.to_bits() {
                return Err(fail(format!("{what}: {} became {g}, want {want}", v[i])));
            }
        }
    }
    // An empty broadcast copied (a transpose-like layout of no elements).
    let empty = Tensor::zeros(&[0, 1], dt, ctx.device)
        .and_then(|t| t.broadcast_to(&[0, 4]))
        .and_then(|t| t.contiguous())
        .map_err(err(
            "contiguous copy of a [0, 1] tensor broadcast to [0, 4]",
        ))?;
    if empty.shape() != [0, 4] {
        return Err(fail(format!("empty copy has shape {:?}", empty.shape())));
    }
    Ok(())
}

fn rearrange_case(ctx: &Ctx, _op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    if what == "large_transposes" {
        // Transposes big enough for blocked copies, with partial blocks at both edges and
        // an outer dimension, and a strided destination.
        let (base, vb) = tensor(&sample_values(3 * 70 * 45, dt, 11), &[3, 70, 45], dt, ctx)?;
        let views = [
            base.transpose(1, 2).map_err(err("transpose"))?,
            base.permute(&[2, 0, 1]).map_err(err("permute"))?,
            base.narrow(0, 1, 1)
                .and_then(|t| t.squeeze(0))
                .and_then(|t| t.transpose(0, 1))
                .map_err(err("transpose"))?,
        ];
        contiguous_copies(&views, &vb, dt)?;
        // Dense transposes of 24 Ki elements with rows and columns multiples of four, batched
        // and not: the software adapters read an f32 source through a texture there.
        let (big, vbig) = tensor(&sample_values(2 * 96 * 128, dt, 12), &[2, 96, 128], dt, ctx)?;
        let big_views = [
            big.transpose(1, 2).map_err(err("transpose"))?,
            big.reshape(&[192, 128])
                .and_then(|t| t.transpose(0, 1))
                .map_err(err("transpose"))?,
        ];
        contiguous_copies(&big_views, &vbig, dt)?;
        let src = base
            .narrow(0, 2, 1)
            .and_then(|t| t.squeeze(0))
            .map_err(err("view"))?;
        return copy_into_transposed(ctx, &src, &vb, dt);
    }
    let (base, vb) = tensor(&sample_values(120, dt, 9), &[4, 5, 6], dt, ctx)?;
    if what == "bad_input" {
        let dst = Tensor::zeros(&[4, 6, 5], dt, ctx.device).map_err(err("zeros"))?;
        expect_kind(
            dst.copy_from(&base),
            &["shape_mismatch"],
            "copy into another shape",
        )?;
        let b = Tensor::zeros(&[1, 5, 6], dt, ctx.device)
            .and_then(|t| t.broadcast_to(&[4, 5, 6]))
            .map_err(err("broadcast"))?;
        expect_kind(
            b.copy_from(&base),
            &["aliasing"],
            "copy into a broadcast view",
        )?;
        let other = Tensor::zeros(&[4, 5, 6], DType::I32, ctx.device).map_err(err("zeros"))?;
        expect_kind(
            other.copy_from(&base),
            &["dtype_mismatch"],
            "copy into another dtype",
        )?;
        return Ok(());
    }
    let views = [
        base.permute(&[2, 0, 1]).map_err(err("permute"))?,
        base.narrow(1, 1, 3)
            .and_then(|t| t.narrow(2, 2, 4))
            .map_err(err("narrow"))?,
        base.narrow(0, 2, 1)
            .and_then(|t| t.broadcast_to(&[3, 1, 5, 6]))
            .map_err(err("broadcast"))?,
        base.transpose(0, 2)
            .and_then(|t| t.narrow(0, 5, 1))
            .and_then(|t| t.squeeze(0))
            .map_err(err("squeeze"))?,
    ];
    contiguous_copies(&views, &vb, dt)?;
    // Into a strided destination: the transpose of a [6, 5] tensor.
    let src = base
        .narrow(0, 1, 1)
        .and_then(|t| t.squeeze(0))
        .map_err(err("view"))?; // [5, 6]
    copy_into_transposed(ctx, &src, &vb, dt)?;
    // Device to device and back (to()).
    let same = base.to(ctx.device).map_err(err("to(same device)"))?;
    close("to(same device)", &values(&same, "to")?, &vb, dt, None)
}

/// `contiguous()` of each view (of a base whose values are `vb`) is contiguous and holds the
/// view's values.
fn contiguous_copies(views: &[Tensor], vb: &[f64], dt: DType) -> Result<(), Failure> {
    for v in views {
        let w = format!(
            "contiguous copy of {:?} strides {:?}",
            v.shape(),
            v.layout().strides()
        );
        let c = v.contiguous().map_err(err(&w))?;
        if !c.is_contiguous() {
            return Err(fail(format!("{w}: result is not contiguous")));
        }
        close(&w, &values(&c, &w)?, &host_view(vb, v.layout()), dt, None)?;
    }
    Ok(())
}

/// Copying the 2-D view `src` (of a base whose values are `vb`) into the transposed view of
/// a fresh tensor writes its transpose.
fn copy_into_transposed(ctx: &Ctx, src: &Tensor, vb: &[f64], dt: DType) -> Result<(), Failure> {
    let (r, c) = (src.shape()[0], src.shape()[1]);
    let dst = Tensor::zeros(&[c, r], dt, ctx.device).map_err(err("zeros"))?;
    dst.transpose(0, 1)
        .and_then(|t| t.copy_from(src))
        .map_err(err("copy into a transposed view"))?;
    let hs = host_view(vb, src.layout());
    let want: Vec<f64> = (0..r * c).map(|i| hs[(i % r) * c + i / r]).collect();
    close(
        "copy into a transposed view",
        &values(&dst, "dst")?,
        &want,
        dt,
        None,
    )
}

fn concat_case(ctx: &Ctx, _op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    if what == "bad_input" {
        let z = |s: &[usize], d: DType| Tensor::zeros(s, d, ctx.device).map_err(err("zeros"));
        let (a, b) = (z(&[2, 3], dt)?, z(&[3, 3], dt)?);
        expect_kind(
            Tensor::concat(&[&a, &b], 1),
            &["shape_mismatch"],
            "[2,3] and [3,3] along 1",
        )?;
        expect_kind(
            Tensor::concat(&[&a, &a], 2),
            &["axis_out_of_range"],
            "axis 2 of a matrix",
        )?;
        expect_kind(
            Tensor::concat(&[&a, &z(&[2, 3], DType::I32)?], 0),
            &["dtype_mismatch"],
            "mixed dtypes",
        )?;
        expect_kind(
            Tensor::concat(&[], 0),
            &["bad_param"],
            "nothing to concatenate",
        )?;
        return Ok(());
    }
    let shapes: [&[usize]; 3] = [&[2, 3, 4], &[2, 1, 4], &[2, 5, 4]];
    let mut parts = Vec::new();
    for (i, s) in shapes.iter().enumerate() {
        let n: usize = s.iter().product();
        parts.push(tensor(&sample_values(n, dt, 20 + i as u64), s, dt, ctx)?);
    }
    // Along axis 1 (the middle input strided: a transposed copy viewed back).
    let mid_t = parts[1]
        .0
        .transpose(0, 2)
        .and_then(|t| t.contiguous())
        .and_then(|t| t.transpose(0, 2))
        .map_err(err("strided view"))?;
    let ins = [&parts[0].0, &mid_t, &parts[2].0];
    let out = Tensor::concat(&ins, 1).map_err(err("concat along 1"))?;
    let mut want = Vec::new();
    for b in 0..2 {
        for (s, (_, v)) in shapes.iter().zip(&parts) {
            let rows = s[1];
            want.extend_from_slice(&v[b * rows * 4..(b + 1) * rows * 4]);
        }
    }
    close("concat along 1", &values(&out, "concat")?, &want, dt, None)?;
    // Along the last axis, negative.
    let (a, va) = &parts[0];
    let out = Tensor::concat(&[a, a], -1).map_err(err("concat along -1"))?;
    let want: Vec<f64> = (0..6)
        .flat_map(|r| {
            va[r * 4..r * 4 + 4]
                .iter()
                .chain(&va[r * 4..r * 4 + 4])
                .copied()
                .collect::<Vec<_>>()
        })
        .collect();
    close("concat along -1", &values(&out, "concat")?, &want, dt, None)
}

/// `r` is [`unirt::Error::IndexOutOfRange`] naming `index` and `limit`.
fn expect_index<T>(
    r: Result<T, unirt::Error>,
    index: i64,
    limit: usize,
    what: &str,
) -> Result<(), Failure> {
    match r {
        Err(unirt::Error::IndexOutOfRange {
            index: i, limit: l, ..
        }) if i == index && l == limit as u64 => Ok(()),
        Err(e) => Err(fail(format!(
            "{what}: expected IndexOutOfRange of {index} (limit {limit}), got {e}"
        ))),
        Ok(_) => Err(fail(format!("{what}: expected IndexOutOfRange, got Ok"))),
    }
}

/// A bad id is reported once, at the synchronisation after the launch that read it: the same
/// plan launched again with good ids runs clean. In a replayed operator graph, a bad id fed
/// through `set_input` is reported after that replay, and the next replay with good ids is
/// clean and right.
fn embedding_faults(
    ctx: &Ctx,
    table: &Tensor,
    vt: &[f64],
    vocab: usize,
    dim: usize,
) -> Result<(), Failure> {
    let ids = |v: &[f64]| Tensor::from_f64(v, &[3], DType::I64, ctx.device).map_err(err("ids"));
    let (good, bad) = (ids(&[3.0, 256.0, 7.0])?, ids(&[3.0, 300.0, 7.0])?);
    let want: Vec<f64> = [3usize, 256, 7]
        .iter()
        .flat_map(|&i| vt[i * dim..(i + 1) * dim].to_vec())
        .collect();
    let dt = table.dtype();
    let plan = emb::embedding(&good.desc(), &table.desc()).map_err(err("plan"))?;
    let rt = unirt::Runtime::get(ctx.device).map_err(err("runtime"))?;
    for round in 0..2 {
        let out = plan.run1(&[&bad, table]).map_err(err("bad ids"))?;
        if round == 1 {
            // A device-wide synchronisation (any thread's: a dropped graph exec makes one)
            // reports the fault but leaves it to the stream's own synchronisation. What it
            // reports is not checked: other threads' faults may be pending too.
            let _ = rt.sync_device();
        }
        let r = out.to_f64_vec();
        expect_index(r, 300, vocab, &format!("round {round}: a bad id"))?;
        let out = plan.run1(&[&good, table]).map_err(err("good ids"))?;
        close(
            &format!("round {round}: good ids after a bad one"),
            &values(&out, "embedding")?,
            &want,
            dt,
            None,
        )?;
    }
    rt.start_graph_recording().map_err(err("record"))?;
    let y = table.embedding(&good);
    let mut g = rt.stop_graph_recording().map_err(err("record"))?;
    let y = y.map_err(err("recorded embedding"))?;
    g.mark_input("ids", &good).map_err(err("mark_input"))?;
    g.mark_output("y", &y).map_err(err("mark_output"))?;
    let exec = g
        .plan()
        .and_then(|p| p.instantiate())
        .map_err(err("instantiate"))?;
    for round in 0..2 {
        exec.set_input("ids", &bad).map_err(err("set_input"))?;
        let r = exec.replay().and_then(|()| exec.output("y")?.to_f64_vec());
        expect_index(r, 300, vocab, &format!("replay {round}: a bad id"))?;
        exec.set_input("ids", &good).map_err(err("set_input"))?;
        exec.replay().map_err(err("replay"))?;
        let out = exec.output("y").map_err(err("output"))?;
        close(
            &format!("replay {round}: good ids after a bad one"),
            &values(out, "embedding")?,
            &want,
            dt,
            None,
        )?;
    }
    Ok(())
}

fn embedding_case(ctx: &Ctx, _op: &'static str, dt: DType, what: &str) -> Result<(), Failure> {
    let (vocab, dim) = (257, 7);
    let (table, vt) = random(&[vocab, dim], -1.0, 1.0, 40, dt, ctx.device)?;
    if what == "faults_cleared_and_replayed" {
        return embedding_faults(ctx, &table, &vt, vocab, dim);
    }
    if what == "bad_input" {
        for (bad, idt) in [
            (vocab as f64, DType::I32),
            (-1.0, DType::I64),
            (-7.0, DType::I32),
            ((1u64 << 32) as f64 + 3.0, DType::I64),
        ] {
            let ids =
                Tensor::from_f64(&[3.0, bad, 5.0], &[3], idt, ctx.device).map_err(err("ids"))?;
            // The ids live on the device: the kernel finds the bad one and the stream reports it.
            let r = table.embedding(&ids).and_then(|o| o.to_f64_vec());
            expect_index(r, bad as i64, vocab, &format!("{idt} id {bad} of {vocab}"))?;
        }
        let fids = Tensor::zeros(&[3], DType::F32, ctx.device).map_err(err("zeros"))?;
        expect_kind(
            emb::embedding(&fids.desc(), &table.desc()),
            &["dtype_mismatch"],
            "f32 ids",
        )?;
        let flat = Tensor::zeros(&[7], dt, ctx.device).map_err(err("zeros"))?;
        let ids = Tensor::zeros(&[3], DType::I64, ctx.device).map_err(err("zeros"))?;
        expect_kind(
            emb::embedding(&ids.desc(), &flat.desc()),
            &["bad_tensor_shape"],
            "a 1-D table",
        )?;
        return Ok(());
    }
    let mut r = SplitMix64::new(41);
    for (shape, idt) in [
        (&[3usize, 5][..], DType::I32),
        (&[11usize][..], DType::I64),
        (&[0usize][..], DType::I64),
    ] {
        let n: usize = shape.iter().product();
        let ids: Vec<f64> = (0..n).map(|_| r.below(vocab as u64) as f64).collect();
        let it = Tensor::from_f64(&ids, shape, idt, ctx.device).map_err(err("ids"))?;
        let what = format!("embedding {shape:?} {idt} ids");
        let out = table.embedding(&it).map_err(err(&what))?;
        let want: Vec<f64> = ids
            .iter()
            .flat_map(|&i| vt[i as usize * dim..(i as usize + 1) * dim].to_vec())
            .collect();
        close(&what, &values(&out, &what)?, &want, dt, None)?;
    }
    // A transposed table view.
    let (tb, vtb) = random(&[dim, vocab], -1.0, 1.0, 42, dt, ctx.device)?;
    let tt = tb.transpose(0, 1).map_err(err("transpose"))?;
    let ids =
        Tensor::from_f64(&[256.0, 0.0, 17.0], &[3], DType::I64, ctx.device).map_err(err("ids"))?;
    let out = tt.embedding(&ids).map_err(err("transposed table"))?;
    let want: Vec<f64> = [256usize, 0, 17]
        .iter()
        .flat_map(|&i| (0..dim).map(|d| vtb[d * vocab + i]).collect::<Vec<_>>())
        .collect();
    close(
        "transposed table",
        &values(&out, "embedding")?,
        &want,
        dt,
        None,
    )
}
