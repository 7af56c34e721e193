//! Matrix products over one weight matrix used again and again (the decode step's shape):
//! few-row products, operands the wgpu software adapters read through textures refilled by
//! every launch, and every way of writing a weight between two products. Cases of
//! `cases_ops_matmul`.

use unirt::ops::matmul as mm;
use unirt::tensor::{DType, Tensor};
use unirt::Backend;

use crate::cases_ops_matmul::{check_mm, matmul_ref};
use crate::ops_check::*;
use crate::{Ctx, Failure};

/// Products of one to four rows over one B matrix, the decode GEMV's shape: the wgpu
/// software adapters read B through a texture there, refilled by every launch from B's rows
/// (256-byte multiples apart, starting at any 16-byte boundary of B's buffer). Checks a
/// batch over one B, B as the left columns of a wider matrix (rows further apart than they
/// are long) and B four elements into its buffer, and then the refill: one A times two Bs
/// of one shape, launched back to back on one stream without a wait, then B changed in place
/// and multiplied again. With rows of A 256-byte multiples long (k of 128), A is read through
/// a texture as well: one row, three, a batch of As, A four elements into its buffer, and
/// two As launched back to back.
pub(crate) fn few_rows(ctx: &Ctx, dt: DType) -> Result<(), Failure> {
    for (i, &(m, k, n)) in [(1, 48, 256), (3, 20, 64), (4, 8, 128)].iter().enumerate() {
        check_mm(ctx, dt, &[m, k], &[k, n], 600 + 2 * i as u64)?;
    }
    check_mm(ctx, dt, &[2, 2, 16], &[16, 128], 610)?;
    few_rows_textured_a(ctx, dt)?;
    let (k, n) = (12, 64);
    let (a, va) = random(&[2, k], -1.0, 1.0, 612, dt, ctx.device)?;
    // B: the left 64 of 128 columns; B': 12 × 64 values starting 4 elements into a buffer.
    let (wide, vw) = random(&[k, 2 * n], -1.0, 1.0, 613, dt, ctx.device)?;
    let (flat, vf) = random(&[4 + k * n], -1.0, 1.0, 614, dt, ctx.device)?;
    let b1 = wide.narrow(1, 0, n).map_err(err("narrow"))?;
    let b2 = flat
        .narrow(0, 4, k * n)
        .and_then(|v| v.reshape(&[k, n]))
        .map_err(err("offset view"))?;
    let hb1 = host_view(&vw, b1.layout());
    let c1 = a.matmul(&b1).map_err(err("A @ B (left columns)"))?;
    let c2 = a.matmul(&b2).map_err(err("A @ B' (offset)"))?;
    for (what, c, hb) in [("left columns", &c1, &hb1[..]), ("offset", &c2, &vf[4..])] {
        let (want, scale) = matmul_ref(&va, &[2, k], hb, &[k, n], &[], 2, k, n);
        close(what, &values(c, what)?, &want, dt, Some(&scale))?;
    }
    // B changed in place (every element, through a product of its own), then A @ B again.
    let (d, vd) = random(&[k, n], -1.0, 1.0, 615, dt, ctx.device)?;
    let ones = Tensor::ones(&[n, n], dt, ctx.device).map_err(err("ones"))?;
    d.gemm_into(&ones, &b2, 1.0, 0.0)
        .map_err(err("overwrite B' in place"))?;
    let (mut sums, mut sums_scale) = (Vec::new(), Vec::new());
    for row in vd.chunks(n) {
        let (s, a): (f64, f64) = (row.iter().sum(), row.iter().map(|x| x.abs()).sum());
        sums.extend(std::iter::repeat_n(s, n));
        sums_scale.extend(std::iter::repeat_n(a, n));
    }
    let b2_now = values(&b2, "B' rewritten")?;
    let c3 = a.matmul(&b2).map_err(err("A @ B' (rewritten)"))?;
    let (want, scale) = matmul_ref(&va, &[2, k], &b2_now, &[k, n], &[], 2, k, n);
    close("B rewritten", &values(&c3, "c3")?, &want, dt, Some(&scale))?;
    close(
        "B' rewritten by a product",
        &b2_now,
        &sums,
        dt,
        Some(&sums_scale),
    )
}

/// [`few_rows`] with rows of A a texture copy's pitch (k = 128): A through a texture too.
fn few_rows_textured_a(ctx: &Ctx, dt: DType) -> Result<(), Failure> {
    let k = 128;
    check_mm(ctx, dt, &[1, k], &[k, 64], 640)?;
    check_mm(ctx, dt, &[3, k], &[k, 32], 642)?;
    check_mm(ctx, dt, &[2, 3, k], &[k, 64], 644)?;
    let n = 48;
    let (flat, vf) = random(&[4 + 2 * k], -1.0, 1.0, 646, dt, ctx.device)?;
    let a1 = flat
        .narrow(0, 4, 2 * k)
        .and_then(|v| v.reshape(&[2, k]))
        .map_err(err("offset view"))?;
    let (a2, va2) = random(&[2, k], -1.0, 1.0, 647, dt, ctx.device)?;
    let (b, vb) = random(&[k, n], -1.0, 1.0, 648, dt, ctx.device)?;
    // One plan, two As, launched back to back without a wait: each launch refills A's texture.
    let p = mm::matmul(&a1.desc(), &b.desc(), 1.0).map_err(err("plan"))?;
    let s = a1.stream().map_err(err("stream"))?;
    let ws = workspace(&p, ctx)?;
    let zeros = || Tensor::zeros(&[2, n], dt, ctx.device).map_err(err("zeros"));
    let (c1, c2) = (zeros()?, zeros()?);
    p.launch(&[&a1, &b], &[&c1], ws.as_ref(), s)
        .map_err(err("A1 (offset) @ B"))?;
    p.launch(&[&a2, &b], &[&c2], ws.as_ref(), s)
        .map_err(err("A2 @ B"))?;
    for (what, c, va) in [
        ("A1 (offset) @ B", &c1, &vf[4..]),
        ("A2 @ B", &c2, &va2[..]),
    ] {
        let (want, scale) = matmul_ref(va, &[2, k], &vb, &[k, n], &[], 2, k, n);
        close(what, &values(c, what)?, &want, dt, Some(&scale))?;
    }
    Ok(())
}

/// The workspace `p` needs on the context's device (`None` when it needs none).
fn workspace(p: &unirt::ops::Plan, ctx: &Ctx) -> Result<Option<Tensor>, Failure> {
    match p.workspace_size() {
        0 => Ok(None),
        n => Tensor::empty(&[n], DType::U8, ctx.device)
            .map(Some)
            .map_err(err("workspace")),
    }
}

/// Products of 16 rows or more over one B matrix: the wgpu software adapters read B, and A
/// when it is contiguous with rows 256-byte multiples apart, through textures, refilled by
/// every launch. Checks a batch of As over one B, rows of A off that pitch in f32 (B only), A
/// four elements into its buffer, and one plan launched back to back on one stream without a
/// wait, over other operands and then over the matrix its first launch wrote.
pub(crate) fn textured(ctx: &Ctx, dt: DType) -> Result<(), Failure> {
    check_mm(ctx, dt, &[40, 128], &[128, 64], 620)?;
    check_mm(ctx, dt, &[2, 20, 128], &[128, 32], 622)?;
    check_mm(ctx, dt, &[33, 96], &[96, 48], 624)?;
    let (m, k) = (32, 128);
    let (flat, vf) = random(&[4 + m * k], -1.0, 1.0, 626, dt, ctx.device)?;
    let a = flat
        .narrow(0, 4, m * k)
        .and_then(|v| v.reshape(&[m, k]))
        .map_err(err("offset view"))?;
    let (b, vb) = random(&[k, k], -1.0, 1.0, 627, dt, ctx.device)?;
    let c = a.matmul(&b).map_err(err("A (offset) @ B"))?;
    let (want, scale) = matmul_ref(&vf[4..], &[m, k], &vb, &[k, k], &[], m, k, k);
    close(
        "A four elements in",
        &values(&c, "c")?,
        &want,
        dt,
        Some(&scale),
    )?;
    // One plan, three launches, no wait: A1 @ B1, A2 @ B2, then C1 @ B1.
    let (a2, va2) = random(&[m, k], -1.0, 1.0, 628, dt, ctx.device)?;
    let (b2, vb2) = random(&[k, k], -1.0, 1.0, 629, dt, ctx.device)?;
    let zeros = || Tensor::zeros(&[m, k], dt, ctx.device).map_err(err("zeros"));
    let (c1, c2, c3) = (zeros()?, zeros()?, zeros()?);
    let p = mm::matmul(&a.desc(), &b.desc(), 1.0).map_err(err("plan"))?;
    let s = a.stream().map_err(err("stream"))?;
    // One workspace serves every launch: they run in stream order.
    let ws = workspace(&p, ctx)?;
    let launch = |x: &Tensor, y: &Tensor, o: &Tensor, what: &str| {
        p.launch(&[x, y], &[o], ws.as_ref(), s).map_err(err(what))
    };
    launch(&a, &b, &c1, "A1 @ B1")?;
    launch(&a2, &b2, &c2, "A2 @ B2")?;
    launch(&c1, &b, &c3, "C1 @ B1")?;
    let got1 = values(&c1, "c1")?;
    let mm_ref = |va: &[f64], vb: &[f64]| matmul_ref(va, &[m, k], vb, &[k, k], &[], m, k, k);
    let (want, scale) = mm_ref(&vf[4..], &vb);
    close("A1 @ B1", &got1, &want, dt, Some(&scale))?;
    let (want, scale) = mm_ref(&va2, &vb2);
    close(
        "A2 @ B2, launched next",
        &values(&c2, "c2")?,
        &want,
        dt,
        Some(&scale),
    )?;
    let (want, scale) = mm_ref(&got1, &vb);
    close(
        "C1 @ B1 after C1 was written",
        &values(&c3, "c3")?,
        &want,
        dt,
        Some(&scale),
    )
}

/// One B (a weight) multiplied again after each way of writing it: on the wgpu software
/// adapters B is read through a texture of its own whose copy is skipped while nothing has
/// written B's bytes (vendors/wgpu/contents.rs), so every write path must make the next
/// product see the new values. Each step writes B (or, once, a neighbour of B in the same
/// allocation), checks that the write landed, then checks `A @ B` against B's values as read
/// back. Paths: a host copy of the whole matrix, a host copy of one row, a write next to B,
/// an operator writing B, a device-to-device copy, a memset, a raw kernel (f32), a captured
/// graph writing B replayed twice with new sources, an operator graph reading B replayed after
/// new values, and B's allocation freed and reused.
pub(crate) fn weight_writes(ctx: &Ctx, dt: DType) -> Result<(), Failure> {
    let (m, k, n) = (2, 16, 128);
    let device = ctx.device;
    let (a, va) = random(&[m, k], -1.0, 1.0, 640, dt, device)?;
    // B is the first k rows of a [k + 1, n] tensor: the last row is B's neighbour.
    let (whole, _) = random(&[k + 1, n], -1.0, 1.0, 641, dt, device)?;
    let b = whole.narrow(0, 0, k).map_err(err("B"))?;
    let next = whole.narrow(0, k, 1).map_err(err("neighbour"))?;
    let check = |what: &str| -> Result<(), Failure> {
        let vb = values(&b, what)?;
        let c = a.matmul(&b).map_err(err(what))?;
        let (want, scale) = matmul_ref(&va, &[m, k], &vb, &[k, n], &[], m, k, n);
        close(what, &values(&c, what)?, &want, dt, Some(&scale))
    };
    let landed = |what: &str, t: &Tensor, want: &[f64]| -> Result<(), Failure> {
        let got = values(t, what)?;
        if got.iter().zip(want).all(|(g, w)| g == w) && got.len() == want.len() {
            Ok(())
        } else {
            Err(fail(format!("{what}: the write did not land")))
        }
    };
    // Values exact in every dtype: small multiples of 1/8.
    let grid = |len: usize, seed: usize| -> Vec<f64> {
        (0..len)
            .map(|i| ((i * 7 + seed * 3) % 17) as f64 / 8.0 - 1.0)
            .collect()
    };
    let upload = |t: &Tensor, v: &[f64], what: &str| -> Result<(), Failure> {
        let staged = Tensor::from_f64(v, t.shape(), dt, device).map_err(err(what))?;
        t.copy_from(&staged).map_err(err(what))
    };
    check("B as made")?;
    check("B again, unchanged")?;

    let v = grid(k * n, 1);
    let host = match dt {
        DType::F32 => b.copy_from_slice(&v.iter().map(|&x| x as f32).collect::<Vec<_>>()),
        DType::F16 => b.copy_from_slice(
            &v.iter()
                .map(|&x| half::f16::from_f64(x))
                .collect::<Vec<_>>(),
        ),
        _ => b.copy_from_slice(
            &v.iter()
                .map(|&x| half::bf16::from_f64(x))
                .collect::<Vec<_>>(),
        ),
    };
    host.map_err(err("host copy"))?;
    landed("B from the host", &b, &v)?;
    check("after a host copy of B")?;

    let row = grid(n, 2);
    upload(&b.narrow(0, 5, 1).map_err(err("row"))?, &row, "one row")?;
    landed("row 5 of B", &b.narrow(0, 5, 1).map_err(err("row"))?, &row)?;
    check("after one row of B was written")?;

    upload(&next, &grid(n, 3), "neighbour")?;
    check("after B's neighbour was written")?;

    let doubled = b.mul_scalar(2.0).map_err(err("2B"))?;
    let want = values(&doubled, "2B")?;
    b.copy_from(&doubled).map_err(err("B = 2B"))?;
    landed("B = 2B by an operator", &b, &want)?;
    check("after an operator wrote B")?;

    let v = grid(k * n, 4);
    let src = Tensor::from_f64(&v, &[k, n], dt, device).map_err(err("source"))?;
    let rt = b.runtime().clone();
    let nbytes = k * n * dt.size();
    let b_ptr = unirt::DevicePtr(b.base_addr());
    rt.memcpy_d2d(b_ptr, unirt::DevicePtr(src.base_addr()), nbytes, true)
        .map_err(err("memcpy D2D"))?;
    landed("B by a device copy", &b, &v)?;
    check("after a device-to-device copy into B")?;

    let s = rt.stream().map_err(err("stream"))?;
    rt.backend()
        .memset_async(b_ptr, 0, nbytes, s)
        .map_err(err("memset"))?;
    landed("B by a memset", &b, &vec![0.0; k * n])?;
    check("after a memset of B")?;

    if dt == DType::F32 {
        let one = 1.5f32.to_bits();
        let args = [b_ptr.into(), one.into(), ((k * n) as u32).into()];
        rt.backend().launch("fill", &args, s).map_err(err("fill"))?;
        landed("B by a raw kernel", &b, &vec![1.5; k * n])?;
        check("after a raw kernel wrote B")?;
    }

    // A captured copy into B, replayed with a new source each time.
    let src = Tensor::zeros(&[k, n], dt, device).map_err(err("source"))?;
    rt.begin_capture(s, unirt::CaptureMode::Global)
        .map_err(err("begin capture"))?;
    let captured = b.copy_from(&src);
    let graph = rt.end_capture().map_err(err("end capture"))?;
    captured.map_err(err("captured copy"))?;
    let exec = graph.instantiate().map_err(err("instantiate"))?;
    for round in 0..2 {
        let v = grid(k * n, 5 + round);
        upload(&src, &v, "new source")?;
        exec.launch(s).map_err(err("replay"))?;
        landed("B by a replay", &b, &v)?;
        check(&format!("after replay {round} wrote B"))?;
    }

    // An operator graph reading B, replayed after each new B.
    let (mut g, out) = unirt::graph::record(device, || a.matmul(&b)).map_err(err("record"))?;
    g.mark_output("out", &out).map_err(err("mark output"))?;
    let gx = g
        .plan()
        .and_then(|p| p.instantiate())
        .map_err(err("plan"))?;
    for round in 0..3 {
        let what = format!("operator graph replay {round}");
        if round > 0 {
            upload(&b, &grid(k * n, 20 + round), "B before a replay")?;
        }
        gx.replay().map_err(err(&what))?;
        let vb = values(&b, &what)?;
        let (want, scale) = matmul_ref(&va, &[m, k], &vb, &[k, n], &[], m, k, n);
        let got = values(gx.output("out").map_err(err(&what))?, &what)?;
        close(&what, &got, &want, dt, Some(&scale))?;
    }
    drop((gx, g, out));

    // B's memory freed and handed to a new matrix of the same shape.
    let (a_ptr, shape) = (b.base_addr(), [k + 1, n]);
    drop((b, next, whole, exec, graph));
    let reused = Tensor::zeros(&shape, dt, device).map_err(err("reuse"))?;
    let b = reused.narrow(0, 0, k).map_err(err("B'"))?;
    let v = grid(k * n, 9);
    upload(&b, &v, "B'")?;
    let c = a.matmul(&b).map_err(err("A @ B'"))?;
    let (want, scale) = matmul_ref(&va, &[m, k], &v, &[k, n], &[], m, k, n);
    let what = if reused.base_addr() == a_ptr {
        "a new B in B's memory"
    } else {
        "a new B"
    };
    close(what, &values(&c, what)?, &want, dt, Some(&scale))
}
