//! `random_sample` in WGSL with the CPU kernel's rule: temperature 0 or top-k 1 takes the
//! first maximum; otherwise the candidates sorted by logit (ties by index), cut to top-k and
//! then to the shortest prefix whose weight reaches top-p, and the first whose cumulative
//! weight exceeds `random ·` the kept weight is picked. One workgroup per row, no sort and no
//! workspace: every cut is the first place in the order where a prefix's count or weight
//! passes a target, and a prefix's count and weight grow with its last element, so each cut
//! is found by a four-way search over the order — over a 32-bit key that orders the logits,
//! then over the index among equal logits — each step one sweep of the row testing three
//! pivots and one workgroup sum. Three cuts at most (top-k, top-p, the draw): O((17 + log4 n)
//! · n / 256) per lane at worst (the first version ranked every candidate against the whole
//! row, O(n² / 256), and Mesa's loop limiter capped it at ~1800 candidates; a binary search
//! took ~140 sweeps; the limiter now allows about 175 000 candidates with every cut, 260 000
//! with two: see `super::check_loops`). The searches are narrowed where the rule allows: each
//! starts at the maximum's key, the later cuts end at the earlier cut's key, a search stops
//! once its range is one key, the index search only spans the indices that hold its key (one
//! sweep finds them; one index when logits are distinct), and a count's search computes no
//! exp. A 32 000-entry row with top-k 50 and top-p 0.9 went from 37 to 16–20 ms on lavapipe
//! (docs/BENCHMARKS.md, "Eighteenth session").
//!
//! Constants: `cfg[0]` rows, `cfg[1]` the row length, `cfg[2]` where the rows' view starts,
//! `cfg[3]` the last axis's stride, `cfg[4]` 1 for the greedy pick, `cfg[5]` top-k (clamped
//! to the row), `cfg[6..9]` temperature, top-p and random (f32 bits), `cfg[9]` the index
//! search's steps.

use std::sync::Arc;

use super::op::{prepare as prepare_op, OpSource, TexRead};
use super::rowwise;
use super::textures::flat_textures;
use super::wgsl::{self, Bind};
use super::{reg_all, FLOATS};
use crate::error::{Error, Result};
use crate::ops::{Params, PlanSpec, PreparedKernel};

const BODY: &str = "
var<workgroup> wg_u: array<u32, 256>;
var<workgroup> wg_k: array<u32, 256>;
var<workgroup> wg_v: array<f32, 256>;
// Whether element (w, j) comes before (v, i) in the order: larger logit, then smaller index;
// NaN last (tested by its bits, see `is_nan`).
fn before(w: f32, j: u32, v: f32, i: u32) -> bool {
    if (is_nan(w) || is_nan(v)) { return !is_nan(w) || (is_nan(v) && j < i); }
    return w > v || (w == v && j < i);
}
// The weight of logit v in row p (see `ops::sample`): NaN 0; the maximum 1 (+inf and -inf
// included, compared by bits too); one infinitely below it 0, at every temperature.
fn weight(v: f32, p: Row) -> f32 {
    if (is_nan(v)) { return 0.0; }
    if (v == p.mx || bitcast<u32>(v) == bitcast<u32>(p.mx)) { return 1.0; }
    let d = v - p.mx;
    if (bitcast<u32>(d) == 0xff800000u) { return 0.0; }
    return exp(d / p.t);
}
// A logit's place in the order as one u32, ties left to the index: a larger logit gives a
// smaller key; -0 and +0 the same key, NaN the last.
fn order_key(v: f32) -> u32 {
    if (is_nan(v)) { return 0xffffffffu; }
    let b = bitcast<u32>(select(v, 0.0, v == 0.0));
    return ~select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}
// One row: where it starts, its stride and length, its maximum and the temperature.
struct Row { xb: u32, xs: u32, n: u32, mx: f32, t: f32 }
// A prefix of the order for each of three keys (x, y, z): the count and the weight (exp((x -
// max) / T); NaN weighs nothing) of the row's elements at or before key (ku[i], ki[i]),
// summed over the workgroup: every lane gets the same. Each grows with its key whatever the
// rounding (each lane adds its elements in index order, the lanes are combined in a fixed
// order, and the terms are not negative), which the searches below rely on.
struct Prefix { count: vec3<f32>, weight: vec3<f32> }
// Without `weigh` the weights are left at zero (a count's search needs no exp).
fn prefix(p: Row, ku: vec3<u32>, ki: vec3<u32>, weigh: bool, lid: u32) -> Prefix {
    var c = vec3<f32>(0.0);
    var w = vec3<f32>(0.0);
    for (var e = lid; e < p.n; e = e + SAMPLE_WG) {
        let v = ld_x(p.xb + e * p.xs);
        let u = vec3<u32>(order_key(v));
        let inc = select(vec3<f32>(0.0), vec3<f32>(1.0), (u < ku) | ((u == ku) & (vec3<u32>(e) <= ki)));
        c = c + inc;
        if (weigh) { w = w + inc * weight(v, p); }
    }
    return wg_sum_prefix(Prefix(c, w), lid);
}
// The count and weight of the prefix that ends at one key.
fn prefix_at(p: Row, k: vec2<u32>, lid: u32) -> vec2<f32> {
    let s = prefix(p, vec3<u32>(k.x), vec3<u32>(k.y), true, lid);
    return vec2<f32>(s.count.x, s.weight.x);
}
// The first and last index of the row's elements with order key `key` (first > last when
// there is none), the same in every lane.
fn key_span(p: Row, key: u32, lid: u32) -> vec2<u32> {
    var first = 0xffffffffu;
    var last = 0u;
    for (var e = lid; e < p.n; e = e + SAMPLE_WG) {
        if (order_key(ld_x(p.xb + e * p.xs)) == key) {
            first = min(first, e);
            last = max(last, e);
        }
    }
    return wg_span(first, last, lid);
}
// Whether each of three prefixes passes `mode`'s test: 0 count >= goal, 1 weight >= goal,
// 2 weight > goal.
fn passes(mode: u32, s: Prefix, goal: f32) -> vec3<bool> {
    if (mode == 0u) { return s.count >= vec3<f32>(goal); }
    if (mode == 1u) { return s.weight >= vec3<f32>(goal); }
    return s.weight > vec3<f32>(goal);
}
// One step of a four-way search of [lo, hi] (hi passes): three pivots split it, one sweep
// tests them, and the part that holds the first passing key is kept.
fn narrow(lo: u32, hi: u32, m: vec3<u32>, ok: vec3<bool>) -> vec2<u32> {
    if (lo >= hi) { return vec2<u32>(lo, hi); }
    if (ok.x) { return vec2<u32>(lo, m.x); }
    if (ok.y) { return vec2<u32>(m.x + 1u, m.y); }
    if (ok.z) { return vec2<u32>(m.y + 1u, m.z); }
    return vec2<u32>(m.z + 1u, hi);
}
fn pivots(lo: u32, hi: u32) -> vec3<u32> {
    let d = hi - lo;
    return vec3<u32>(lo + (d >> 2u), lo + (d >> 1u), lo + (d >> 1u) + (d >> 2u));
}
// The first key in the order whose prefix passes, searched in [lo, hi] — which must hold
// it, or else `hi` is taken as passing (the callers make either give the same pick): a
// four-way search over the order key, then over the index among the elements with that key.
// A search stops once its range is one key (every lane holds the same range: the sums are
// the same bits in every lane), so a narrow [lo, hi] costs fewer sweeps. The index search
// runs over the indices that hold the key (one more sweep finds them; worth it past two
// steps), one past the last taken as passing: none passing there means none in the row
// (an index before the first adds nothing to the prefix, one after the last nothing
// either), and the whole row's last index is the answer, as a search of [0, n - 1] gives.
fn search(p: Row, mode: u32, goal: f32, lo: u32, hi: u32, lid: u32) -> vec2<u32> {
    let weigh = mode != 0u;
    var r = vec2<u32>(lo, hi);
    for (var s = 0u; s < 18u; s = s + 1u) {
        if (r.x >= r.y) { break; }
        let m = pivots(r.x, r.y);
        r = narrow(r.x, r.y, m, passes(mode, prefix(p, m, vec3<u32>(0xffffffffu), weigh, lid), goal));
    }
    let key = r.x;
    var span = vec2<u32>(0u, p.n - 2u);
    if (cfg[9] > 2u) { span = key_span(p, key, lid); }
    // An empty span: nothing holds the key, and no index passes.
    r = select(vec2<u32>(span.x, span.y + 1u), vec2<u32>(p.n - 1u), span.x > span.y);
    for (var s = 0u; s <= cfg[9]; s = s + 1u) {
        if (r.x >= r.y) { break; }
        let m = pivots(r.x, r.y);
        r = narrow(r.x, r.y, m, passes(mode, prefix(p, vec3<u32>(key), m, weigh, lid), goal));
    }
    return vec2<u32>(key, select(r.x, p.n - 1u, r.x > span.y));
}
// The earlier of two keys in the order.
fn first_key(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return select(b, a, a.x < b.x || (a.x == b.x && a.y <= b.y));
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
    for (var e = lid; e < n; e = e + SAMPLE_WG) {
        let v = ld_x(xb + e * xs);
        if (before(v, e, bv, bi)) { bv = v; bi = e; }
    }
    wg_v[lid] = bv;
    wg_u[lid] = bi;
    workgroupBarrier();
    for (var s = SAMPLE_WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s && before(wg_v[lid + s], wg_u[lid + s], wg_v[lid], wg_u[lid])) {
            wg_v[lid] = wg_v[lid + s];
            wg_u[lid] = wg_u[lid + s];
        }
        workgroupBarrier();
    }
    let mx = wg_v[0];
    let first = wg_u[0];
    workgroupBarrier();
    // Greedy, or a row of NaN only (which weighs nothing: its first index, 0).
    if (cfg[4] != 0u || is_nan(mx)) {
        if (lid == 0u) { sti_out(row, i32(first)); }
        return;
    }
    let p = Row(xb, xs, n, mx, cfg_f(6u));
    let k = cfg[5];
    let top_p = cfg_f(7u);
    let random = cfg_f(8u);
    // Every search starts at the maximum's key: before it the prefix is empty, and no test
    // passes there (top-k is at least 2, top-p's goal is positive, the draw's test strict).
    let lo = select(0u, order_key(mx), mx == mx);
    // The last of the top k, and their weight.
    var last_k = vec2<u32>(0xffffffffu, 0xffffffffu);
    if (k < n) { last_k = search(p, 0u, f32(k), lo, 0xffffffffu, lid); }
    let total = prefix_at(p, last_k, lid).y;
    // The last of the shortest prefix whose weight reaches top-p of theirs, and its weight:
    // at or before the last of the top k, whose key passes.
    var last = last_k;
    if (top_p < 1.0) { last = first_key(search(p, 1u, top_p * total, lo, last_k.x, lid), last_k); }
    let kept = prefix_at(p, last, lid).y;
    // The first whose cumulative weight passes the draw (the prefix's last if none does): a
    // key past the last's stands for any later one, as `first_key` keeps `last` over both.
    let hi = select(last.x + 1u, last.x, last.x == 0xffffffffu);
    let pick = first_key(search(p, 2u, random * kept, lo, hi, lid), last);
    if (lid == 0u) { sti_out(row, i32(min(pick.y, n - 1u))); }
}
";

/// [`BODY`]'s workgroup sum of three (count, weight) pairs, with subgroup operations where
/// the adapter has them (as [`rowwise::wg_reduce`]'s sums: every lane combines the subgroups'
/// results in the same order).
fn wg_sum_prefix(d: wgsl::Dialect) -> &'static str {
    if d.subgroups {
        "
var<workgroup> wg_c: array<vec3<f32>, 256>;
var<workgroup> wg_w: array<vec3<f32>, 256>;
fn wg_span(first: u32, last: u32, lid: u32) -> vec2<u32> {
    let f = subgroupMin(first);
    let l = subgroupMax(last);
    if (sg_lane == 0u) { wg_u[sg_id] = f; wg_k[sg_id] = l; }
    workgroupBarrier();
    var r = vec2<u32>(wg_u[0], wg_k[0]);
    for (var k = 1u; k < sg_count; k = k + 1u) { r = vec2<u32>(min(r.x, wg_u[k]), max(r.y, wg_k[k])); }
    workgroupBarrier();
    return r;
}
fn wg_sum_prefix(v: Prefix, lid: u32) -> Prefix {
    let c = subgroupAdd(v.count);
    let w = subgroupAdd(v.weight);
    if (sg_lane == 0u) { wg_c[sg_id] = c; wg_w[sg_id] = w; }
    workgroupBarrier();
    var r = Prefix(wg_c[0], wg_w[0]);
    for (var k = 1u; k < sg_count; k = k + 1u) { r.count = r.count + wg_c[k]; r.weight = r.weight + wg_w[k]; }
    workgroupBarrier();
    return r;
}
"
    } else {
        "
var<workgroup> wg_c: array<vec3<f32>, 256>;
var<workgroup> wg_w: array<vec3<f32>, 256>;
fn wg_span(first: u32, last: u32, lid: u32) -> vec2<u32> {
    wg_u[lid] = first;
    wg_k[lid] = last;
    workgroupBarrier();
    for (var s = SAMPLE_WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) { wg_u[lid] = min(wg_u[lid], wg_u[lid + s]); wg_k[lid] = max(wg_k[lid], wg_k[lid + s]); }
        workgroupBarrier();
    }
    let r = vec2<u32>(wg_u[0], wg_k[0]);
    workgroupBarrier();
    return r;
}
fn wg_sum_prefix(v: Prefix, lid: u32) -> Prefix {
    wg_c[lid] = v.count;
    wg_w[lid] = v.weight;
    workgroupBarrier();
    for (var s = SAMPLE_WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) { wg_c[lid] = wg_c[lid] + wg_c[lid + s]; wg_w[lid] = wg_w[lid] + wg_w[lid + s]; }
        workgroupBarrier();
    }
    let r = Prefix(wg_c[0], wg_w[0]);
    workgroupBarrier();
    return r;
}
"
    }
}

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
    // Each lane sweeps its n / wg candidates once for the greedy pick; otherwise once per
    // step of up to three four-way searches (18 key steps, one sweep for the key's indices,
    // and one index step more than the row needs, at most) and twice more, each sweep
    // followed by a workgroup sum.
    let greedy = temperature == 0.0 || top_k == 1;
    // Four-way steps that narrow n indices to one: a step leaves at most (d + 1) / 4 of a
    // range of d + 1 beyond its first (see `narrow`); the order key's 2^32 take 17.
    let mut index_steps = 0u32;
    let mut d = (n as u64).saturating_sub(1);
    while d > 0 {
        d = (d + 1) / 4;
        index_steps += 1;
    }
    let searches = 1 + u64::from(k < n) + u64::from(top_p < 1.0);
    let sweeps = if greedy {
        1
    } else {
        3 + searches * (20 + u64::from(index_steps))
    };
    let d = wgsl::Dialect::of(spec);
    let loops = |wg: u32| {
        let sum_loops = if d.subgroups {
            32
        } else {
            1 + u64::from(wg.ilog2())
        };
        sweeps * ((n as u64).div_ceil(u64::from(wg)) + sum_loops + 1) + 16
    };
    let limited = super::loop_limited(spec);
    let fits = |wg: u32| loops(wg) <= super::LOOP_BUDGET || !limited;
    let wg = sample_workgroup(n, super::on_host_cores(spec), fits);
    super::check_loops(spec, loops(wg), || format!("sampling from {n} candidates"))?;
    if !greedy && n > 1 << 24 {
        // The bisections count candidates in f32, exact to 2^24.
        return Err(Error::Unsupported {
            what: format!("random_sample on {}: {n} candidates in a row (at most 2^24 unless the pick is greedy)", spec.device),
            backend: crate::device::DeviceKind::Wgpu,
        });
    }
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
        index_steps,
    ];
    cfg[2] = wgsl::push_view(&mut cfg, &ks, &kst);
    let binds = [
        Bind::read("x", x.dtype),
        Bind::write("out", spec.outputs[0].dtype),
    ];
    let body = BODY.replace("MAIN {\n", &rowwise::main_rows_open_sized(d, wg));
    let head = format!(
        "{}{}const SAMPLE_WG: u32 = {wg}u;\n{}",
        wgsl::prelude(&binds, d),
        rowwise::wg_reduce(d),
        wg_sum_prefix(d)
    );
    let pass = |body: &str| vec![(format!("{head}{body}"), rowwise::rows_grid(rows))];
    let mut src = OpSource::plain("random_sample", pass(&body), cfg);
    // On the host's cores a wholly contiguous input of whole quads is read through a texture
    // (see `TexRead`): every sweep loads the row again, and lavapipe gathers texel loads in
    // registers where it loops over the lanes for storage loads. The texture holds the same
    // values, so both variants pick the same candidate. A launch takes it where every tensor
    // starts on a multiple of four elements (the texture's copy starts at x's first).
    let numel = x.layout.numel();
    if super::on_host_cores(spec) && x.layout.is_contiguous() && numel.is_multiple_of(4) {
        if let Some(t) = flat_textures(&binds, &[true], numel) {
            let read = body.replace("ld_x(", "tex1_x(") + &t.decls + TEX1;
            src.textured = Some(TexRead {
                inputs: t.inputs,
                passes: pass(&read),
            });
        }
    }
    prepare_op(spec, src)
}

/// Invocations per workgroup (one workgroup per row) for rows of `n` candidates.
///
/// On a GPU, 256, or the least power of two that holds the row (at least 8). Every search
/// step ends in workgroup sums whose barriers cost per invocation, not per candidate: a row of
/// 4 under 256 lanes paid 64 barriers' worth of idle lanes per sum, and on lavapipe 19 008
/// such rows took 153 s; each lane still holds at most one candidate, so the sums add the
/// same values in the same tree.
///
/// On the host's cores (`host`), the fewest that the adapter's loop limiter allows (`fits`;
/// at least 8, one SIMD batch on lavapipe, and at most the GPU's choice): a workgroup runs on
/// one core whatever its size, so fewer invocations only mean fewer barriers — each of which
/// switches between the workgroup's SIMD batches there — for the same sweeps. On lavapipe
/// (AMD EPYC, picks unchanged in every row) 64 rows × 1000 candidates with top-k and top-p
/// took 20 ms with 16 invocations against 544 with 256, 512 × 100 53 against 1053, and one
/// row of 32 000 (64 fit) 11 against 18. The sums' order changes with the size, so a draw on
/// a boundary may pick the neighbouring candidate that the GPU form picks.
fn sample_workgroup(n: usize, host: bool, fits: impl Fn(u32) -> bool) -> u32 {
    let gpu = n.clamp(8, 256).next_power_of_two() as u32;
    if !host {
        return gpu;
    }
    (3..=8)
        .map(|s| 1u32 << s)
        .filter(|&w| w <= gpu)
        .find(|&w| fits(w))
        .unwrap_or(gpu)
}

/// Element `i` of `x` from its texture (whose texel `i / 4` holds elements `i & !3` … + 3).
const TEX1: &str = "fn tex1_x(i: u32) -> f32 {
    let q = tex4_x(i);
    let c = i & 3u;
    return select(select(q.x, q.y, c == 1u), select(q.z, q.w, c == 3u), c >= 2u);
}
";

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    reg_all(reg, "random_sample", FLOATS, prepare);
}
