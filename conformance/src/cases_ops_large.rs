//! Operator cases over tensors of tens of thousands of elements: the size from which wgpu's
//! software adapters read contiguous operands through textures, which every launch refills
//! from the operands' buffers before its dispatch. The elementwise cases check broadcast
//! mixes (one operand through a texture, one from its buffer); the row cases (norms,
//! softmax) rows whose pitch is no texture's (the buffer kernels). All check views starting
//! a texel into their buffers and views that are not on a quad boundary (the buffer
//! kernels), and the refill: launches of one plan back to back on one stream without a
//! wait, over other operands and over a tensor the previous launch wrote, in place too.

use unirt::ops::{elementwise as ew, norm, softmax as sm, Plan, UnaryOp};
use unirt::tensor::{DType, Tensor};

use crate::ops_check::*;
use crate::{Ctx, Failure};

/// Elements of the large cases' operands (64 Ki: past the texture threshold, 16 Ki).
const N: usize = 64 * 1024;

/// Lengths whose quads fill no whole number of texture rows (textures are a power of two
/// texels wide): 5 001 quads (one partly filled row) and 24 581 (three rows of 8 192 and 5
/// texels), so that the copy of a last, partial row is checked.
const ODD_LENGTHS: [usize; 2] = [20_004, 98_324];

/// `f` applied to `a` and `b` element by element.
fn zip(a: &[f64], b: &[f64], f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

/// The large case of binary operator `op` (reference `f`, operand ranges `ra` and `rb`);
/// `plan` plans it for two operands.
pub(crate) fn large_binary(
    ctx: &Ctx,
    op: &str,
    dt: DType,
    (f, ra, rb): crate::cases_ops_elementwise::BinaryRef,
    plan: impl Fn(&Tensor, &Tensor) -> unirt::Result<Plan>,
) -> Result<(), Failure> {
    let dev = ctx.device;
    // A bias row over 6 rows of 4096 (one operand read through a texture), both ways round.
    let (rows, vrows) = random(&[6, 4096], ra.0, ra.1, 700, dt, dev)?;
    let (row, vrow) = random(&[4096], rb.0, rb.1, 701, dt, dev)?;
    let out = plan(&rows, &row)
        .and_then(|p| p.run1(&[&rows, &row]))
        .map_err(err("[6, 4096] with [4096]"))?;
    let want: Vec<f64> = (0..6 * 4096).map(|i| f(vrows[i], vrow[i % 4096])).collect();
    close("[6, 4096] with [4096]", &values(&out, op)?, &want, dt, None)?;
    let (rows_b, vrows_b) = random(&[6, 4096], rb.0, rb.1, 702, dt, dev)?;
    let (row_a, vrow_a) = random(&[4096], ra.0, ra.1, 703, dt, dev)?;
    let out = plan(&row_a, &rows_b)
        .and_then(|p| p.run1(&[&row_a, &rows_b]))
        .map_err(err("[4096] with [6, 4096]"))?;
    let want: Vec<f64> = (0..6 * 4096)
        .map(|i| f(vrow_a[i % 4096], vrows_b[i]))
        .collect();
    close("[4096] with [6, 4096]", &values(&out, op)?, &want, dt, None)?;
    // A bias row whose texture row is partly filled, under 3 rows of it.
    let (rows, vrows) = random(&[3, 6004], ra.0, ra.1, 704, dt, dev)?;
    let (row, vrow) = random(&[6004], rb.0, rb.1, 705, dt, dev)?;
    let out = plan(&rows, &row)
        .and_then(|p| p.run1(&[&rows, &row]))
        .map_err(err("[3, 6004] with [6004]"))?;
    let want: Vec<f64> = (0..3 * 6004).map(|i| f(vrows[i], vrow[i % 6004])).collect();
    close("[3, 6004] with [6004]", &values(&out, op)?, &want, dt, None)?;
    // Lengths that end inside a texture row, from the buffers' start and a texel in.
    for (len, shift) in ODD_LENGTHS.iter().flat_map(|&l| [(l, 0usize), (l, 4)]) {
        let seed = 760 + len as u64 + shift as u64;
        let (abase, va) = random(&[len + shift], ra.0, ra.1, seed, dt, dev)?;
        let (b, vb) = random(&[len], rb.0, rb.1, seed + 1, dt, dev)?;
        let a = abase.narrow(0, shift, len).map_err(err("narrow"))?;
        let what = format!("{op} over {len} elements, {shift} in");
        let out = plan(&a, &b)
            .and_then(|p| p.run1(&[&a, &b]))
            .map_err(err(&what))?;
        close(
            &what,
            &values(&out, &what)?,
            &zip(&va[shift..], &vb, f),
            dt,
            None,
        )?;
    }
    // Views 4 elements (a texel) and 1 element into their buffers.
    for shift in [4usize, 1] {
        let (abase, va) = random(&[N + shift], ra.0, ra.1, 710 + shift as u64, dt, dev)?;
        let (bbase, vb) = random(&[N + 8], rb.0, rb.1, 720 + shift as u64, dt, dev)?;
        let a = abase.narrow(0, shift, N).map_err(err("narrow"))?;
        let b = bbase.narrow(0, 8, N).map_err(err("narrow"))?;
        let what = format!("{op} on views {shift} and 8 elements in");
        let out = plan(&a, &b)
            .and_then(|p| p.run1(&[&a, &b]))
            .map_err(err(&what))?;
        let want = zip(&va[shift..], &vb[8..], f);
        close(&what, &values(&out, &what)?, &want, dt, None)?;
    }
    // One plan, four launches, no wait: a op b, c op a, a = a op b in place, a op c.
    let (a, va) = random(&[N], ra.0, ra.1, 730, dt, dev)?;
    let (b, vb) = random(&[N], rb.0, rb.1, 731, dt, dev)?;
    // c is either operand: drawn from where both ranges meet.
    let (c, vc) = random(&[N], ra.0.max(rb.0), ra.1.min(rb.1), 732, dt, dev)?;
    let zeros = || Tensor::zeros(&[N], dt, dev).map_err(err("zeros"));
    let (o1, o2, o3) = (zeros()?, zeros()?, zeros()?);
    let p = plan(&a, &b).map_err(err("plan"))?;
    let s = a.stream().map_err(err("stream"))?;
    let launch =
        |i: [&Tensor; 2], o: &Tensor, what: &str| p.launch(&i, &[o], None, s).map_err(err(what));
    launch([&a, &b], &o1, "a op b")?;
    launch([&c, &a], &o2, "c op a")?;
    launch([&a, &b], &a, "a = a op b")?;
    launch([&a, &c], &o3, "a' op c")?;
    close("a op b", &values(&o1, "o1")?, &zip(&va, &vb, f), dt, None)?;
    close(
        "c op a, launched next",
        &values(&o2, "o2")?,
        &zip(&vc, &va, f),
        dt,
        None,
    )?;
    let va2 = values(&a, "a'")?;
    close("a = a op b in place", &va2, &zip(&va, &vb, f), dt, None)?;
    close(
        "a' op c after the in-place launch",
        &values(&o3, "o3")?,
        &zip(&va2, &vc, f),
        dt,
        None,
    )
}

/// The large case of unary operator `u` with inputs drawn from `r`.
pub(crate) fn large_unary(ctx: &Ctx, u: UnaryOp, dt: DType, r: (f64, f64)) -> Result<(), Failure> {
    let dev = ctx.device;
    let map = |v: &[f64]| -> Vec<f64> { v.iter().map(|&x| u.eval(x)).collect() };
    let lengths = [N].into_iter().chain(ODD_LENGTHS);
    for (len, shift) in lengths.flat_map(|l| [(l, 0usize), (l, 4), (l, 1)]) {
        let (base, v) = random(&[len + shift], r.0, r.1, 740 + shift as u64, dt, dev)?;
        let a = base.narrow(0, shift, len).map_err(err("narrow"))?;
        let what = format!("{} over {len} elements, a view {shift} in", u.name());
        let out = ew::unary(u, &a.desc())
            .and_then(|p| p.run1(&[&a]))
            .map_err(err(&what))?;
        close(&what, &values(&out, &what)?, &map(&v[shift..]), dt, None)?;
    }
    // One plan, three launches, no wait: o = u(a), a = u(o) over its own input's output,
    // o2 = u(a).
    let (a, va) = random(&[N], r.0, r.1, 750, dt, dev)?;
    let zeros = || Tensor::zeros(&[N], dt, dev).map_err(err("zeros"));
    let (o1, o2) = (zeros()?, zeros()?);
    let p = ew::unary(u, &a.desc()).map_err(err("plan"))?;
    let s = a.stream().map_err(err("stream"))?;
    p.launch(&[&a], &[&o1], None, s).map_err(err("o = u(a)"))?;
    p.launch(&[&o1], &[&a], None, s).map_err(err("a = u(o)"))?;
    p.launch(&[&a], &[&o2], None, s).map_err(err("o2 = u(a)"))?;
    let v1 = values(&o1, "o1")?;
    close("o = u(a)", &v1, &map(&va), dt, None)?;
    let v2 = values(&a, "a")?;
    close("a = u(o), launched next", &v2, &map(&v1), dt, None)?;
    close(
        "o2 = u(a) after a was written",
        &values(&o2, "o2")?,
        &map(&v2),
        dt,
        None,
    )
}

/// A `[rows, len]` view `shift` elements into a buffer of seeded values in `[lo, hi)`, and
/// its values.
fn rows_at(
    ctx: &Ctx,
    (rows, len, shift): (usize, usize, usize),
    (lo, hi): (f64, f64),
    seed: u64,
    dt: DType,
) -> Result<(Tensor, Vec<f64>), Failure> {
    let (flat, v) = random(&[rows * len + shift], lo, hi, seed, dt, ctx.device)?;
    let x = flat
        .narrow(0, shift, rows * len)
        .and_then(|t| t.reshape(&[rows, len]))
        .map_err(err("a view of rows"))?;
    Ok((x, v[shift..].to_vec()))
}

/// The row shapes `(rows, len, shift)` of the row cases: rows of 256 and 1024 (pitches a
/// texture takes, 256-byte multiples), of 96 (not one in f32), rows four elements (a texel)
/// and one element into their buffers; long rows too few for one invocation per row to fill
/// a CPU's SIMD lanes (on the host's cores a row kernel then spreads each over a few lanes:
/// see `row_lanes` in the wgpu kernels), 3 × 4096 read four at a time from their buffer (too
/// small for a texture) and 5 × 8192 through a texture; and rows too long for one invocation
/// to walk under llvmpipe's loop limiter (a row kernel spreads them over a workgroup: see
/// `ops::loop_limits`), one of them a single row, the other two wider than a texture may be.
const ROWS: [(usize, usize, usize); 8] = [
    (128, 256, 0),
    (256, 96, 0),
    (32, 1024, 4),
    (64, 256, 1),
    (3, 4096, 0),
    (5, 8192, 0),
    (2, 40_000, 0),
    (1, 70_000, 1),
];

/// A norm's reference: rows, weight, bias (layer_norm), eps.
pub(crate) type NormRef = fn(&[f64], &[f64], Option<&[f64]>, f64) -> Vec<f64>;

/// The large case of rms_norm (`layer` false) or layer_norm, against `reference` (rows,
/// weight, bias, eps).
pub(crate) fn large_norm(
    ctx: &Ctx,
    layer: bool,
    dt: DType,
    reference: NormRef,
) -> Result<(), Failure> {
    let (dev, eps) = (ctx.device, 1e-5);
    let plan = |x: &Tensor, w: &Tensor, b: &Tensor| {
        if layer {
            norm::layer_norm(&x.desc(), &w.desc(), &b.desc(), eps)
        } else {
            norm::rms_norm(&x.desc(), &w.desc(), eps)
        }
    };
    let params = |d: usize, seed: u64| -> Result<_, Failure> {
        let (w, vw) = random(&[d], 0.5, 1.5, seed, dt, dev)?;
        let (b, vb) = random(&[d], -0.5, 0.5, seed + 1, dt, dev)?;
        Ok((w, vw, b, vb))
    };
    // In f32 also an rms_norm output of 20 MiB, too large to stay cached, which the CPU
    // writes with non-temporal stores from each row's first 64-byte boundary on: rows of
    // 4196 elements, a pitch 16 bytes past a multiple of 64, so the rows start at every
    // offset within a line.
    let mut shapes = ROWS.to_vec();
    if dt == DType::F32 && !layer {
        shapes.push((1250, 4196, 1));
    }
    for (i, shape) in shapes.into_iter().enumerate() {
        let (x, vx) = rows_at(ctx, shape, (-2.0, 2.0), 760 + 3 * i as u64, dt)?;
        let (w, vw, b, vb) = params(shape.1, 761 + 3 * i as u64)?;
        let what = format!("rows {shape:?} (rows, length, elements in)");
        let ins: Vec<&Tensor> = [&x, &w, &b][..2 + usize::from(layer)].to_vec();
        let out = plan(&x, &w, &b)
            .and_then(|p| p.run1(&ins))
            .map_err(err(&what))?;
        let want = reference(&vx, &vw, layer.then_some(&vb[..]), eps);
        close(&what, &values(&out, &what)?, &want, dt, None)?;
    }
    let (w, vw, b, vb) = params(256, 782)?;
    let t = Tensor::zeros(&[128, 256], dt, dev).map_err(err("zeros"))?;
    let p = plan(&t, &w, &b).map_err(err("plan"))?;
    let s = t.stream().map_err(err("stream"))?;
    refill_rows(
        ctx,
        ([128, 256], (-2.0, 2.0), 780),
        dt,
        |x, o, what| {
            let ins: Vec<&Tensor> = [x, &w, &b][..2 + usize::from(layer)].to_vec();
            p.launch(&ins, &[o], None, s).map_err(err(what))
        },
        |v| reference(v, &vw, layer.then_some(&vb[..]), eps),
    )
}

/// One plan launched four times on one stream without a wait, over `[rows, len]` tensors of
/// seeded values in `range` — over `x1`, over `x2`, over `x1` in place, then over the first
/// launch's output — and each result checked against `want` of its input's values.
fn refill_rows(
    ctx: &Ctx,
    (shape, range, seed): ([usize; 2], (f64, f64), u64),
    dt: DType,
    launch: impl Fn(&Tensor, &Tensor, &str) -> Result<(), Failure>,
    want: impl Fn(&[f64]) -> Vec<f64>,
) -> Result<(), Failure> {
    let dev = ctx.device;
    let (x1, v1) = random(&shape, range.0, range.1, seed, dt, dev)?;
    let (x2, v2) = random(&shape, range.0, range.1, seed + 1, dt, dev)?;
    let zeros = || Tensor::zeros(&shape, dt, dev).map_err(err("zeros"));
    let (o1, o2, o3) = (zeros()?, zeros()?, zeros()?);
    launch(&x1, &o1, "x1")?;
    launch(&x2, &o2, "x2")?;
    launch(&x1, &x1, "x1 in place")?;
    launch(&o1, &o3, "the first output")?;
    let got1 = values(&o1, "o1")?;
    close("x1", &got1, &want(&v1), dt, None)?;
    let got2 = values(&o2, "o2")?;
    close("x2, launched next", &got2, &want(&v2), dt, None)?;
    close("x1 in place", &values(&x1, "x1")?, &want(&v1), dt, None)?;
    let got3 = values(&o3, "o3")?;
    close("the first output, again", &got3, &want(&got1), dt, None)
}

/// The large case of softmax (`log` false) or log_softmax along the last axis, against
/// `reference` (values, shape, axis, log).
pub(crate) fn large_softmax(
    ctx: &Ctx,
    log: bool,
    dt: DType,
    reference: fn(&[f64], &[usize], usize, bool) -> Vec<f64>,
) -> Result<(), Failure> {
    let dev = ctx.device;
    for (i, shape) in ROWS.into_iter().enumerate() {
        let (x, vx) = rows_at(ctx, shape, (-4.0, 4.0), 790 + i as u64, dt)?;
        let what = format!("rows {shape:?} (rows, length, elements in)");
        let out = sm::softmax(&x.desc(), -1, log)
            .and_then(|p| p.run1(&[&x]))
            .map_err(err(&what))?;
        let want = reference(&vx, &[shape.0, shape.1], 1, log);
        close(&what, &values(&out, &what)?, &want, dt, None)?;
    }
    let shape = [64, 1024];
    let t = Tensor::zeros(&shape, dt, dev).map_err(err("zeros"))?;
    let p = sm::softmax(&t.desc(), -1, log).map_err(err("plan"))?;
    let s = t.stream().map_err(err("stream"))?;
    refill_rows(
        ctx,
        (shape, (-4.0, 4.0), 800),
        dt,
        |x, o, what| p.launch(&[x], &[o], None, s).map_err(err(what)),
        |v| reference(v, &shape, 1, log),
    )
}
