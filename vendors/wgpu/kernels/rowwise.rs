//! Row kernels: one row of a tensor per workgroup (on GPUs) or per invocation (on the
//! host's cores), and the workgroup-wide sums and maxima they reduce with — the shape shared
//! by the norms, softmax, attention, sampling and the reductions.

use super::wgsl::{grid_for, Dialect};

/// The entry-point signature of a one-workgroup-per-row kernel (`row` is the workgroup's
/// linear index, `lid` the invocation's index in it, `WG` invocations).
pub(crate) const MAIN_ROWS: &str = concat!("@compute @workgroup_size(256)\n", rows_fn!());

/// [`MAIN_ROWS`] after its workgroup size: one text for every size.
macro_rules! rows_fn {
    () => {
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, \
         @builtin(local_invocation_index) lid: u32)"
    };
}
use rows_fn;

/// Invocations per workgroup of a row kernel's host form (one SIMD batch on lavapipe).
pub(crate) const HOST_ROWS_WG: u32 = 8;

/// Invocations that share a row in a row kernel's GPU form ([`row_kernel`]).
pub(crate) const GPU_ROW_LANES: u32 = 256;

/// A complete row kernel around `body`, which sees `row` (the row index; the body checks it
/// against its row count), `lid` and `LANES` (it strides its row from `lid` by `LANES`), and
/// reduces across the lanes with `wg_sum` / `wg_max` (from uniform control flow), and its
/// grid for `rows` rows; `lanes` invocations share each row.
///
/// On a GPU, one workgroup of [`GPU_ROW_LANES`] per row, reduced in workgroup memory. On
/// adapters that run on the host's cores, `lanes` is 1 where one lane may loop over the row
/// (`super::row_lanes`: llvmpipe's loop limiter): one invocation per row and no barrier at
/// all; there a barrier spills every invocation's registers, and a row walked by one lane is
/// a sequential stream the CPU's caches prefetch. That holds for a single row too: a
/// workgroup runs on one core whatever its size, so spreading a row over it buys no
/// parallelism, only barriers (on lavapipe, Intel Xeon: rms_norm of 1 × 256 77 → 29 µs,
/// 2-head decode attention over 4096 keys 10.3 → 6.8 ms; an earlier rule kept the workgroup
/// form below 8 rows). Longer rows there take the fewest lanes (from 8, one SIMD batch on
/// lavapipe) whose loops fit: a workgroup of `lanes` per row, whose reductions cost a few
/// barriers of one batch.
pub(crate) fn row_kernel(
    prelude: &str,
    body: &str,
    lanes: u32,
    rows: usize,
    d: Dialect,
) -> (String, [u32; 3]) {
    if lanes == 1 {
        let src = format!(
            "{prelude}{HOST_REDUCE}\nconst LANES: u32 = 1u;\n\
             @compute @workgroup_size({HOST_ROWS_WG})\n\
             fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{\n\
             let row = gid.x + gid.y * nwg.x * {HOST_ROWS_WG}u;\n    let lid = 0u;\n{body}}}\n"
        );
        return (src, grid_for(rows as u64, HOST_ROWS_WG));
    }
    let src = format!(
        "{prelude}{}\nconst LANES: u32 = {lanes}u;\n{}    \
         let row = wid.x + wid.y * nwg.x;\n{body}}}\n",
        wg_reduce_sized(d, lanes),
        main_rows_open_sized(d, lanes)
    );
    (src, rows_grid(rows))
}

/// The grid of one workgroup per row for `rows` rows.
pub(crate) fn rows_grid(rows: usize) -> [u32; 3] {
    grid_for(rows as u64, 1)
}

/// [`WG_REDUCE`]'s functions for a row kernel's host form, where each row is one lane.
const HOST_REDUCE: &str = "
fn neg_inf() -> f32 { var bits = 0xff800000u; return bitcast<f32>(bits); }
fn wg_sum(v: f32, lid: u32) -> f32 { return v; }
fn wg_max(v: f32, lid: u32) -> f32 { return v; }
";

/// The opening of a [`MAIN_ROWS`] kernel's entry point — its signature and `{` — for dialect
/// `d`: with subgroups, the entry also takes the subgroup builtins and hands them to
/// [`wg_reduce`]'s functions.
pub(crate) fn main_rows_open(d: Dialect) -> String {
    main_rows_open_sized(d, 256)
}

/// [`main_rows_open`] for workgroups of `wg` invocations (the body then strides its row and
/// reduces by `wg`).
pub(crate) fn main_rows_open_sized(d: Dialect, wg: u32) -> String {
    let main = format!("@compute @workgroup_size({wg})\n{}", rows_fn!());
    if !d.subgroups {
        return format!("{main} {{\n");
    }
    let sig = main.trim_end_matches(')');
    format!(
        "{sig}, @builtin(subgroup_invocation_id) sg_lane_in: u32, \
         @builtin(subgroup_id) sg_id_in: u32, @builtin(num_subgroups) sg_count_in: u32) {{\n    \
         sg_lane = sg_lane_in;\n    sg_id = sg_id_in;\n    sg_count = sg_count_in;\n"
    )
}

/// The workgroup reductions for dialect `d` ([`WG_REDUCE`] or, with subgroups,
/// [`WG_REDUCE_SUBGROUPS`]); the kernel's entry opens with [`main_rows_open`].
pub(crate) fn wg_reduce(d: Dialect) -> &'static str {
    if d.subgroups {
        WG_REDUCE_SUBGROUPS
    } else {
        WG_REDUCE
    }
}

/// [`wg_reduce`] for workgroups of `lanes` invocations (a power of two, at most 256).
pub(crate) fn wg_reduce_sized(d: Dialect, lanes: u32) -> std::borrow::Cow<'static, str> {
    match lanes {
        GPU_ROW_LANES => wg_reduce(d).into(),
        _ if d.subgroups => WG_REDUCE_SUBGROUPS.into(),
        _ => WG_REDUCE
            .replace("s = 128u", &format!("s = {}u", lanes / 2))
            .into(),
    }
}

/// [`WG_REDUCE`] with subgroup operations: each subgroup reduces its lanes in registers, its
/// first lane leaves the result in workgroup memory, and every lane combines the subgroups'
/// results in the same order (so all lanes get the same value, bitwise, on every run): two
/// barriers instead of nine.
pub(crate) const WG_REDUCE_SUBGROUPS: &str = "
var<workgroup> wg_red: array<f32, 256>;
var<private> sg_lane: u32;
var<private> sg_id: u32;
var<private> sg_count: u32;
fn neg_inf() -> f32 { var bits = 0xff800000u; return bitcast<f32>(bits); }
fn wg_sum(v: f32, lid: u32) -> f32 {
    let s = subgroupAdd(v);
    if (sg_lane == 0u) { wg_red[sg_id] = s; }
    workgroupBarrier();
    var r = wg_red[0];
    for (var k = 1u; k < sg_count; k = k + 1u) { r = r + wg_red[k]; }
    workgroupBarrier();
    return r;
}
fn wg_max(v: f32, lid: u32) -> f32 {
    let s = subgroupMax(v);
    if (sg_lane == 0u) { wg_red[sg_id] = s; }
    workgroupBarrier();
    var r = wg_red[0];
    for (var k = 1u; k < sg_count; k = k + 1u) { r = max(r, wg_red[k]); }
    workgroupBarrier();
    return r;
}
";

/// Loop iterations a row kernel's GPU form spends on its workgroup reductions, at most
/// (three reductions of eight halvings each, with room; see `super::row_lanes`).
pub(crate) const WG_REDUCE_LOOPS: u64 = 64;

/// Workgroup-wide sum and max over [`MAIN_ROWS`] kernels' 256 invocations (call from uniform
/// control flow: they contain barriers), and -inf.
pub(crate) const WG_REDUCE: &str = "
var<workgroup> wg_red: array<f32, 256>;
fn neg_inf() -> f32 { var bits = 0xff800000u; return bitcast<f32>(bits); }
fn wg_sum(v: f32, lid: u32) -> f32 {
    wg_red[lid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) { wg_red[lid] = wg_red[lid] + wg_red[lid + s]; }
        workgroupBarrier();
    }
    let r = wg_red[0];
    workgroupBarrier();
    return r;
}
fn wg_max(v: f32, lid: u32) -> f32 {
    wg_red[lid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) { wg_red[lid] = max(wg_red[lid], wg_red[lid + s]); }
        workgroupBarrier();
    }
    let r = wg_red[0];
    workgroupBarrier();
    return r;
}
";
