//! Rotary embedding in WGSL: one work item per rotated pair (on the host's cores, per
//! position and frequency, looping over the heads: [`MAIN_HEADS`], or four frequencies at a
//! time as quads, read through a texture where x is contiguous: [`MAIN_HEADS_QUADS`]). The
//! angle `pos · θ^(-2i/d)` is taken modulo one turn exactly in integer arithmetic (each
//! frequency over 2π as a 64-bit fixed-point fraction, prepared on the host in f64), so large
//! positions keep full f32 accuracy, where an f32 product would lose about 1e-4 rad at
//! position 4095.
//!
//! Constants: `cfg[0]` pairs, `cfg[1]` half the head dim, `cfg[2]` heads, `cfg[3]` seq,
//! `cfg[4]` / `cfg[5]` the last-axis strides of x and out, `cfg[6]` / `cfg[7]` where the rows'
//! views start, `cfg[8]` the positions' stride, `cfg[9]` 1 when interleaved, `cfg[10]` /
//! `cfg[11]` the heads' strides in x and out, then per frequency `i` the fraction's high and
//! low words at `12 + 2i`.

use std::sync::Arc;

use super::elementwise::groups_for;
use super::op::{prepare as prepare_op, OpSource, TexRead};
use super::textures::flat_textures;
use super::wgsl::{self, Bind, LINEAR_ID, MAIN_1D};
use super::{reg_all, FLOATS};
use crate::error::{Error, Result};
use crate::ops::{Params, PlanSpec, PreparedKernel};

/// The angle of a frequency at a position, exactly reduced modulo one turn.
const ANGLE: &str = "
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu; let a1 = a >> 16u; let b0 = b & 0xffffu; let b1 = b >> 16u;
    let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0; let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((p00 & 0xffffu) | (mid << 16u), p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}
// (cos, sin) of the angle of frequency i at sequence index s.
fn angle(s: u32, i: u32) -> vec2<f32> {
    let p = ldi_pos(s * cfg[8]);
    let ap = u32(abs(p));
    // The angle in turns: frac(|p| · g) from the 64-bit fraction g (high, low words).
    let lo = mul_wide(ap, cfg[13u + 2u * i]);
    let top = ap * cfg[12u + 2u * i] + lo.y;
    var turn = f32(top) * 2.3283064365386963e-10 + f32(lo.x) * 5.421010862427522e-20;
    if (turn >= 0.5) { turn = turn - 1.0; }
    if (p < 0) { turn = -turn; }
    let ang = turn * 6.283185307179586;
    return vec2<f32>(cos(ang), sin(ang));
}
";

/// Rotates one pair through the scalar accessors.
const ROTATE: &str = "
// Rotates pair i of the row at xb (input) / ob (output) by the angle cs = (cos, sin).
fn rotate(xb: u32, ob: u32, i: u32, cs: vec2<f32>) {
    let half = cfg[1];
    var j0 = i;
    var j1 = i + half;
    if (cfg[9] != 0u) { j0 = 2u * i; j1 = 2u * i + 1u; }
    let x0 = ld_x(xb + j0 * cfg[4]);
    let x1 = ld_x(xb + j1 * cfg[4]);
    st_out(ob + j0 * cfg[5], x0 * cs.x - x1 * cs.y);
    st_out(ob + j1 * cfg[5], x0 * cs.y + x1 * cs.x);
}
";

/// One work item per rotated pair.
const MAIN_PAIRS: &str = "
MAIN {
    let t = LINEAR;
    if (t >= cfg[0]) { return; }
    let half = cfg[1];
    let row = t / half;
    let i = t % half;
    rotate(view_off(row, cfg[6]), view_off(row, cfg[7]), i, angle((row / cfg[2]) % cfg[3], i));
}
";

/// On the host's cores: one work item per (position, frequency), rotating that pair in
/// every head — the angle (integer products, a sine and a cosine: most of the op's cost on
/// a CPU) is computed once instead of once per head.
const MAIN_HEADS: &str = "
MAIN {
    let u = LINEAR;
    let half = cfg[1];
    let heads = cfg[2];
    if (u >= cfg[0] / heads) { return; }
    let rs = u / half;
    let i = u % half;
    let cs = angle(rs % cfg[3], i);
    // Heads are the rows' innermost dimension: one strided index per work item, not per head
    // (a vector integer division is a loop of scalar ones on a CPU).
    let xb = view_off(rs * heads, cfg[6]);
    let ob = view_off(rs * heads, cfg[7]);
    for (var h = 0u; h < heads; h = h + 1u) { rotate(xb + h * cfg[10], ob + h * cfg[11], i, cs); }
}
";

/// [`MAIN_HEADS`] four frequencies at a time, for rotate-half rows whose halves are
/// contiguous runs of a multiple of four elements starting on multiples of four: each work
/// item reads and writes its four pairs as two quads per head. Each value is computed by
/// the same operations as in [`MAIN_HEADS`], so the variants agree bitwise.
const MAIN_HEADS_QUADS: &str = "
MAIN {
    let u = LINEAR;
    let half = cfg[1];
    let heads = cfg[2];
    let quarter = half / 4u;
    if (u >= cfg[0] / heads / 4u) { return; }
    let rs = u / quarter;
    let i = 4u * (u % quarter);
    let s = rs % cfg[3];
    let a0 = angle(s, i);
    let a1 = angle(s, i + 1u);
    let a2 = angle(s, i + 2u);
    let a3 = angle(s, i + 3u);
    let c = vec4<f32>(a0.x, a1.x, a2.x, a3.x);
    let n = vec4<f32>(a0.y, a1.y, a2.y, a3.y);
    let xb = view_off(rs * heads, cfg[6]);
    let ob = view_off(rs * heads, cfg[7]);
    for (var h = 0u; h < heads; h = h + 1u) {
        let xh = xb + h * cfg[10];
        let oh = ob + h * cfg[11];
        let x0 = ld4_x(xh + i);
        let x1 = ld4_x(xh + i + half);
        st4_out(oh + i, x0 * c - x1 * n);
        st4_out(oh + i + half, x0 * n + x1 * c);
    }
}
";

/// Pairs of the largest head dim a plan takes.
const MAX_HALF: usize = 1 << 16;

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let Params::Rope { interleaved, theta } = *spec.params else {
        return Err(Error::Internal(format!(
            "rope: parameters {:?}",
            spec.params
        )));
    };
    let (x, pos, out) = (&spec.inputs[0], &spec.inputs[1], &spec.outputs[0]);
    let shape = x.layout.shape();
    let nd = shape.len();
    let (seq, heads, d) = (shape[nd - 3], shape[nd - 2], shape[nd - 1]);
    let half = d / 2;
    // The plan's constants carry one frequency (two words) per pair of the head dim.
    if half > MAX_HALF {
        return Err(Error::unsupported(
            format!(
                "rope on wgpu: head dim {d} (its frequency table rides in the plan's constants;                  at most {})",
                2 * MAX_HALF
            ),
            crate::device::DeviceKind::Wgpu,
        ));
    }
    let (ks, xst) = wgsl::kept(shape, x.layout.strides(), &[nd - 1]);
    let (_, ost) = wgsl::kept(shape, out.layout.strides(), &[nd - 1]);
    let rows: usize = ks.iter().product();
    let pairs = rows * half;
    let mut cfg = vec![
        pairs as u32,
        half.max(1) as u32,
        heads.max(1) as u32,
        seq.max(1) as u32,
        x.layout.strides()[nd - 1] as u32,
        out.layout.strides()[nd - 1] as u32,
        0,
        0,
        pos.layout.strides().first().copied().unwrap_or(0) as u32,
        u32::from(interleaved),
        x.layout.strides()[nd - 2] as u32,
        out.layout.strides()[nd - 2] as u32,
    ];
    for i in 0..half {
        let g = theta.powf(-2.0 * i as f64 / d as f64) / std::f64::consts::TAU;
        let frac = g.fract();
        // frac · 2^64 as two words (f64 has 53 bits; the rest is zero).
        let hi = (frac * 4294967296.0).floor();
        let lo = ((frac * 4294967296.0 - hi) * 4294967296.0).floor();
        cfg.push(hi as u32);
        cfg.push(lo as u32);
    }
    cfg[6] = wgsl::push_view(&mut cfg, &ks, &xst);
    cfg[7] = wgsl::push_view(&mut cfg, &ks, &ost);
    let binds = [
        Bind::read("x", x.dtype),
        Bind::read("pos", pos.dtype),
        Bind::write("out", out.dtype),
    ];
    let host = super::on_host_cores(spec);
    let main = if host { MAIN_HEADS } else { MAIN_PAIRS };
    let main = main.replace("MAIN", MAIN_1D).replace("LINEAR", LINEAR_ID);
    let source = format!(
        "{}{ANGLE}{ROTATE}{main}",
        wgsl::prelude(&binds, wgsl::Dialect::of(spec))
    );
    let items = if host { pairs / heads.max(1) } else { pairs };
    let mut src = OpSource::plain("rope", vec![(source, groups_for(items as u64))], cfg);
    // On the host's cores, rotate-half rows of contiguous quads take the quad variant, and a
    // wholly contiguous x is read through a texture in it (see `TexRead`): lavapipe loops
    // over the lanes for every storage access, four elements at once in a quad.
    let quads = host
        && !interleaved
        && half.is_multiple_of(4)
        && [x.layout.strides(), out.layout.strides()]
            .iter()
            .all(|st| st[nd - 1] == 1 && st[..nd - 1].iter().all(|s| s % 4 == 0));
    if let Some(prelude) = quads
        .then(|| wgsl::prelude_mixed(&binds, &[true, false, true], wgsl::Dialect::of(spec)))
        .flatten()
    {
        let main = MAIN_HEADS_QUADS
            .replace("MAIN", MAIN_1D)
            .replace("LINEAR", LINEAR_ID);
        let body = format!("{ANGLE}{main}");
        let grid = groups_for((items / 4) as u64);
        let numel = x.layout.numel();
        src.textured = x
            .layout
            .is_contiguous()
            .then(|| flat_textures(&binds, &[true, false], numel))
            .flatten()
            .map(|t| TexRead {
                passes: vec![(
                    format!("{prelude}{}{}", body.replace("ld4_x(", "tex4_x("), t.decls),
                    grid,
                )],
                inputs: t.inputs,
            });
        src.aligned = Some(vec![(format!("{prelude}{body}"), grid)]);
    }
    prepare_op(spec, src)
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    reg_all(reg, "rope", FLOATS, prepare);
}
