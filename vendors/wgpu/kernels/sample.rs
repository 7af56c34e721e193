//! `random_sample` in WGSL with the CPU kernel's rule: temperature 0 or top-k 1 takes the
//! first maximum; otherwise the candidates sorted by logit (ties by index), cut to top-k and
//! then to the shortest prefix whose weight reaches top-p, and the first whose cumulative
//! weight exceeds `random ·` the kept weight is picked. One workgroup per row; instead of a
//! sort, each invocation finds its elements' ranks and the weight of everything ranked before
//! them by a sweep of the row (O(n²/256) per row: fine for the vocabularies of sampling
//! tests and small models, slow for 100k-entry vocabularies; on Mesa's llvmpipe, whose loop
//! limiter caps each invocation's loop iterations, rows of more than about 1800 candidates
//! are `Unsupported` unless the pick is greedy: see `super::check_loops`).
//!
//! Constants: `cfg[0]` rows, `cfg[1]` the row length, `cfg[2]` where the rows' view starts,
//! `cfg[3]` the last axis's stride, `cfg[4]` 1 for the greedy pick, `cfg[5]` top-k (clamped
//! to the row), `cfg[6..9]` temperature, top-p and random (f32 bits).

use std::sync::Arc;

use super::op::{prepare as prepare_op, OpSource};
use super::wgsl::{self, Bind};
use super::{reg_all, FLOATS};
use crate::error::{Error, Result};
use crate::ops::{Params, PlanSpec, PreparedKernel};

const BODY: &str = "
var<workgroup> wg_u: array<u32, 256>;
var<workgroup> wg_v: array<f32, 256>;
var<workgroup> cut: f32;
fn wg_min_u(v: u32, lid: u32) -> u32 {
    wg_u[lid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) { wg_u[lid] = min(wg_u[lid], wg_u[lid + s]); }
        workgroupBarrier();
    }
    let r = wg_u[0];
    workgroupBarrier();
    return r;
}
// Whether element (w, j) comes before (v, i) in the order: larger logit, then smaller index.
fn before(w: f32, j: u32, v: f32, i: u32) -> bool {
    return w > v || (w == v && j < i);
}
// Element (v, e)'s rank in that order, and the weight (exp((x - mx) / t)) of it and of every
// element ranked before it, from a sweep of the row at `xb` (stride `xs`, length `n`).
struct Ranked { rank: u32, cum: f32 }
fn ranked(xb: u32, xs: u32, n: u32, v: f32, e: u32, mx: f32, t: f32) -> Ranked {
    var r = Ranked(0u, exp((v - mx) / t));
    for (var j = 0u; j < n; j = j + 1u) {
        let w = ld_x(xb + j * xs);
        if (before(w, j, v, e)) { r.rank = r.rank + 1u; r.cum = r.cum + exp((w - mx) / t); }
    }
    return r;
}
MAIN {
    let row = wid.x + wid.y * nwg.x;
    if (row >= cfg[0]) { return; }
    let n = cfg[1];
    let xb = view_off(row, cfg[2]);
    let xs = cfg[3];
    // The first maximum.
    var bv = ld_x(xb);
    var bi = 0u;
    for (var e = lid; e < n; e = e + 256u) {
        let v = ld_x(xb + e * xs);
        if (before(v, e, bv, bi)) { bv = v; bi = e; }
    }
    wg_v[lid] = bv;
    wg_u[lid] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s && before(wg_v[lid + s], wg_u[lid + s], wg_v[lid], wg_u[lid])) {
            wg_v[lid] = wg_v[lid + s];
            wg_u[lid] = wg_u[lid + s];
        }
        workgroupBarrier();
    }
    let mx = wg_v[0];
    let first = wg_u[0];
    workgroupBarrier();
    if (cfg[4] != 0u) {
        if (lid == 0u) { sti_out(row, i32(first)); }
        return;
    }
    let k = cfg[5];
    let t = cfg_f(6u);
    let top_p = cfg_f(7u);
    let random = cfg_f(8u);
    // Pass 1: the weight of the top-k.
    var part = 0.0;
    for (var e = lid; e < n; e = e + 256u) {
        let v = ld_x(xb + e * xs);
        var rank = 0u;
        for (var j = 0u; j < n; j = j + 1u) { if (before(ld_x(xb + j * xs), j, v, e)) { rank = rank + 1u; } }
        if (rank < k) { part = part + exp((v - mx) / t); }
    }
    let total = wg_sum(part, lid);
    // Pass 2: ranks and cumulative weights; the top-p cut.
    var kp = 0xffffffffu;
    for (var e = lid; e < n; e = e + 256u) {
        let r = ranked(xb, xs, n, ld_x(xb + e * xs), e, mx, t);
        if (r.rank < k && r.cum >= top_p * total) { kp = min(kp, r.rank); }
    }
    // `cut` is written below by the lane holding rank keep - 1; zero it first all the same
    // (workgroup memory is not zeroed for unirt's kernels). wg_min_u's barriers order this.
    if (lid == 0u) { cut = 0.0; }
    var keep = min(wg_min_u(kp, lid), k - 1u) + 1u;
    // Pass 3: the kept weight, then the first rank whose cumulative weight passes the draw.
    for (var e = lid; e < n; e = e + 256u) {
        let r = ranked(xb, xs, n, ld_x(xb + e * xs), e, mx, t);
        if (r.rank == keep - 1u) { cut = random * r.cum; }
    }
    workgroupBarrier();
    let threshold = cut;
    var best = 0xffffffffu;
    var pick = 0u;
    for (var e = lid; e < n; e = e + 256u) {
        let r = ranked(xb, xs, n, ld_x(xb + e * xs), e, mx, t);
        if (r.rank < keep && r.cum > threshold && r.rank < best) { best = r.rank; pick = e; }
    }
    let win = wg_min_u(best, lid);
    if (best == win && win != 0xffffffffu) { sti_out(row, i32(pick)); }
    if (win == 0xffffffffu && keep - 1u < n) {
        for (var e = lid; e < n; e = e + 256u) {
            let x = ld_x(xb + e * xs);
            var rank = 0u;
            for (var j = 0u; j < n; j = j + 1u) { if (before(ld_x(xb + j * xs), j, x, e)) { rank = rank + 1u; } }
            if (rank == keep - 1u) { sti_out(row, i32(e)); }
        }
    }
}
";

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let Params::Sample {
        random,
        temperature,
        top_k,
        top_p,
    } = *spec.params
    else {
        return Err(Error::Internal(format!(
            "random_sample: parameters {:?}",
            spec.params
        )));
    };
    let x = &spec.inputs[0];
    let shape = x.layout.shape();
    let nd = shape.len();
    let n = shape[nd - 1];
    let (ks, kst) = wgsl::kept(shape, x.layout.strides(), &[nd - 1]);
    let rows: usize = ks.iter().product();
    let k = if top_k == 0 { n } else { top_k.min(n) };
    // Each lane sweeps its n / 256 candidates once for the greedy pick; otherwise it ranks
    // each of them by a sweep of the whole row, in up to five passes.
    let greedy = temperature == 0.0 || top_k == 1;
    let per_lane = (n as u64).div_ceil(256);
    let loops = if greedy {
        per_lane + 16
    } else {
        5 * per_lane * (n as u64 + 1) + 64
    };
    super::check_loops(spec, loops, || format!("sampling from {n} candidates"))?;
    let mut cfg = vec![
        rows as u32,
        n as u32,
        0,
        x.layout.strides()[nd - 1] as u32,
        u32::from(greedy),
        k as u32,
        wgsl::f(temperature),
        wgsl::f(top_p),
        wgsl::f(random),
    ];
    cfg[2] = wgsl::push_view(&mut cfg, &ks, &kst);
    let binds = [
        Bind::read("x", x.dtype),
        Bind::write("out", spec.outputs[0].dtype),
    ];
    let d = wgsl::Dialect::of(spec);
    let body = BODY.replace("MAIN {\n", &wgsl::main_rows_open(d));
    let source = format!("{}{}{body}", wgsl::prelude(&binds, d), wgsl::wg_reduce(d));
    prepare_op(
        spec,
        OpSource {
            name: "random_sample".into(),
            passes: vec![(source, wgsl::rows_grid(rows))],
            cfg,
            entry: None,
            zero_workgroup_memory: false,
            aligned: None,
            textured: None,
        },
    )
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    reg_all(reg, "random_sample", FLOATS, prepare);
}
