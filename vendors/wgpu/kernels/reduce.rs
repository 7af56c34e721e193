//! Reductions in WGSL (sum, mean, max, min, argmax over any set of axes): one workgroup per
//! output element, its 256 invocations striding over the reduced elements (read in place
//! through the reduced axes' strides), then a tree in workgroup memory; a long reduction into
//! few outputs is split into chunks, one workgroup each, whose results a second pass
//! combines ([`chunks`]); on adapters on the host's cores one invocation per output element
//! instead where its loops fit ([`host_source`]). max / min propagate NaN; argmax returns the
//! first maximum (the first NaN if any), as the CPU kernel does.
//!
//! Constants: `cfg[0]` the output elements, `cfg[1]` the reduced elements, `cfg[2]` /
//! `cfg[3]` where the kept and the reduced axes' views of the input start, `cfg[4]` the
//! chunks per output and `cfg[5]` the elements per chunk.

use std::sync::Arc;

use super::op::{prepare as prepare_op, prepare_scratch, OpSource};
use super::wgsl::{self, Bind};
use super::{reg_all, FLOATS};
use crate::error::{Error, Result};
use crate::ops::{Params, PlanSpec, PreparedKernel};

/// The argmax tree's workgroup memory (the GPU form's).
const ARGMAX_SHARED: &str = "
var<workgroup> wg_idx: array<u32, 256>;
var<workgroup> wg_val: array<f32, 256>;
";

/// Combines (value, index) pairs: NaN first, then the larger, then the earlier index.
const ARGMAX: &str = "
fn better(v: f32, i: u32, w: f32, j: u32) -> bool {
    // Whether (w, j) beats (v, i).
    let vn = v != v;
    let wn = w != w;
    if (vn && wn) { return j < i; }
    if (vn) { return false; }
    if (wn) { return true; }
    if (w > v) { return true; }
    return w == v && j < i;
}
";

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let Params::Reduce { axes, .. } = spec.params else {
        return Err(Error::Internal(format!(
            "{}: parameters {:?}",
            spec.op, spec.params
        )));
    };
    let (x, out) = (&spec.inputs[0], &spec.outputs[0]);
    let (shape, strides) = (x.layout.shape(), x.layout.strides());
    let (ks, kst) = wgsl::kept(shape, strides, axes);
    let (rs, rst): (Vec<usize>, Vec<usize>) = axes.iter().map(|&a| (shape[a], strides[a])).unzip();
    let lanes: usize = ks.iter().product();
    let red: usize = rs.iter().product();
    let n = red as u64;
    let chunks = chunks(spec, lanes as u64, n);
    let chunk = n.div_ceil(chunks);
    let mut cfg = vec![lanes as u32, red as u32, 0, 0, chunks as u32, chunk as u32];
    cfg[2] = wgsl::push_view(&mut cfg, &ks, &kst);
    cfg[3] = wgsl::push_view(&mut cfg, &rs, &rst);
    let binds = [Bind::read("x", x.dtype), Bind::write("out", out.dtype)];
    let d = wgsl::Dialect::of(spec);
    // One lane walks the reduced elements on the host's cores (a sum four at a time, the
    // offsets in straight-line code), each of 256 a 256th of them (or of their chunk)
    // otherwise, four per loop iteration. On an adapter with a loop limiter the GPU form's
    // offsets are straight-line code too (elsewhere a loop over the reduced axes,
    // `view_off`, which the limiter would count): one loop iteration per 1024 elements.
    let host_loops = if matches!(spec.op, "sum" | "mean") {
        n / 4 + 3
    } else {
        n
    };
    let literal = super::loop_limited(spec);
    let gpu_loops = if literal {
        chunk.div_ceil(1024) + 4
    } else {
        chunk.div_ceil(256) * (1 + rs.len() as u64)
    } + wgsl::WG_REDUCE_LOOPS;
    let host = super::host_form(spec, Some(host_loops), gpu_loops, || {
        format!("a reduction of {n} elements")
    })?;
    let passes = if host {
        vec![host_source(
            spec.op,
            &binds,
            d,
            &cfg,
            (&ks, &kst),
            (&rs, &rst),
            lanes,
        )?]
    } else {
        let mut funcs = String::new();
        let base = wgsl::view_index(&mut funcs, "kept_off", "row", cfg[2], &ks, &kst, literal);
        let at = wgsl::view_index(&mut funcs, "red_off", "jj", cfg[3], &rs, &rst, literal);
        let ld = format!("ld_x(base + {at})");
        // The chunks' results, in the plan's scratch buffer (bound after the tensors).
        let part = if chunks > 1 {
            format!(
                "@group(0) @binding({}) var<storage, read_write> part: array<u32>;\n",
                binds.len() + 1
            )
        } else {
            String::new()
        };
        let head = format!(
            "{}{}{ARGMAX_SHARED}{ARGMAX}{funcs}{part}\n{}",
            wgsl::prelude(&binds, d),
            wgsl::wg_reduce(d),
            wgsl::main_rows_open(d)
        );
        let parts = gpu_parts(spec.op, &ld)?;
        if chunks == 1 {
            let src = format!(
                "{head}    let row = wid.x + wid.y * nwg.x;\n    if (row >= cfg[0]) {{ return; }}\n    \
                 let n = cfg[1];\n    let base = {base};\n{}{}{}    {}\n}}\n",
                parts.init,
                walk("lid", &parts.step),
                parts.tree,
                parts.to_out
            );
            vec![(src, wgsl::rows_grid(lanes))]
        } else {
            // Pass 1: workgroup w reduces chunk w % chunks of output w / chunks into part[w];
            // pass 2: one workgroup per output combines its chunks' results (in the order of
            // the chunks: the earlier chunk's index wins a tie).
            let first = format!(
                "{head}    let w = wid.x + wid.y * nwg.x;\n    if (w >= cfg[0] * cfg[4]) {{ return; }}\n    \
                 let row = w / cfg[4];\n    let begin = (w % cfg[4]) * cfg[5];\n    \
                 let n = min(cfg[1], begin + cfg[5]);\n    let base = {base};\n{}{}{}    {}\n}}\n",
                parts.init,
                walk("begin + lid", &parts.step),
                parts.tree,
                parts.to_part
            );
            let second = format!(
                "{head}    let row = wid.x + wid.y * nwg.x;\n    if (row >= cfg[0]) {{ return; }}\n    \
                 let n = cfg[1];\n    let at = row * cfg[4] + lid;\n    let here = lid < cfg[4];\n{}{}    {}\n}}\n",
                parts.from_part,
                parts.tree,
                parts.to_out
            );
            vec![
                (first, wgsl::rows_grid((lanes as u64 * chunks) as usize)),
                (second, wgsl::rows_grid(lanes)),
            ]
        }
    };
    let src = OpSource::plain(spec.op.to_string(), passes, cfg);
    if chunks > 1 && !host {
        let words = if spec.op == "argmax" { 2 } else { 1 };
        prepare_scratch(spec, src, 4 * words * lanes as u64 * chunks)
    } else {
        prepare_op(spec, src)
    }
}

/// How many workgroups share each output's reduced elements in the GPU form: enough that
/// the outputs' workgroups fill the device (twice the host's cores on a software adapter,
/// 512 workgroups elsewhere), at most 256 and at least 16 Ki elements each. A sum of 2^24
/// elements into one output ran on one of an H100's 132 multiprocessors before.
fn chunks(spec: &PlanSpec<'_>, lanes: u64, n: u64) -> u64 {
    let fill = if super::on_host_cores(spec) {
        2 * super::host_cores() as u64
    } else {
        512
    };
    if lanes == 0 || lanes >= fill {
        return 1;
    }
    fill.div_ceil(lanes).min(n >> 14).clamp(1, 256)
}

/// The loop of the GPU form's lanes over their elements: from `start`, every 256th below `n`,
/// four per loop iteration in the order a one-at-a-time loop would take them (the same
/// result, bitwise, in a quarter of the iterations); `step` handles element `jj`.
fn walk(start: &str, step: &str) -> String {
    let at = |j: &str| format!("{{ let jj = {j}; {step} }}");
    format!(
        "    var j = {start};\n    \
         for (; j + 768u < n; j = j + 1024u) {{ {} {} {} {} }}\n    \
         for (; j < n; j = j + 256u) {}\n",
        at("j"),
        at("j + 256u"),
        at("j + 512u"),
        at("j + 768u"),
        at("j")
    )
}

/// The pieces of an operator's GPU form.
struct GpuParts {
    /// The lane's accumulator.
    init: String,
    /// What [`walk`] does with element `jj`.
    step: String,
    /// Pass 2's accumulator: the result of chunk `at`, where `here`.
    from_part: String,
    /// The workgroup's tree over its lanes' accumulators.
    tree: String,
    /// The first lane stores the result to `out`, or (pass 1) to `part` at `w`.
    to_out: String,
    to_part: String,
}

/// The GPU form of `op` (element `jj` read by `ld`): each lane accumulates its elements, a
/// tree in workgroup memory combines the lanes.
fn gpu_parts(op: &str, ld: &str) -> Result<GpuParts> {
    let (init, step, from_part, tree, to_out, to_part) = match op {
        "sum" | "mean" => (
            "    var acc = 0.0;\n".to_string(),
            format!("acc = acc + {ld};"),
            "    var acc = 0.0;\n    if (here) { acc = bitcast<f32>(part[at]); }\n".to_string(),
            "    let total = wg_sum(acc, lid);\n".to_string(),
            format!(
                "if (lid == 0u) {{ st_out(row, {}); }}",
                // The mean of nothing is NaN, written as such: some drivers' 0.0 / 0.0 is
                // not NaN (NVIDIA's Vulkan gave −0).
                if op == "mean" {
                    "select(total / f32(n), bitcast<f32>(0x7fc00000u), n == 0u)"
                } else {
                    "total"
                }
            ),
            "if (lid == 0u) { part[w] = bitcast<u32>(total); }".to_string(),
        ),
        "max" | "min" => {
            let (cmp, init) = if op == "max" {
                (">", "neg_inf()")
            } else {
                ("<", "-neg_inf()")
            };
            (
                format!("    var acc = {init};\n    var nan = false;\n"),
                format!("let v = {ld}; nan = nan || v != v; if (v {cmp} acc) {{ acc = v; }}"),
                format!(
                    "    var acc = {init};\n    if (here) {{ acc = bitcast<f32>(part[at]); }}\n    let nan = acc != acc;\n"
                ),
                format!(
                    "    wg_red[lid] = select(acc, bitcast<f32>(0x7fc00000u), nan);\n    workgroupBarrier();\n    \
                     for (var s = 128u; s > 0u; s = s >> 1u) {{\n        if (lid < s) {{ let a = wg_red[lid]; let b = wg_red[lid + s]; \
                     if (a == a && (b != b || b {cmp} a)) {{ wg_red[lid] = b; }} }}\n        workgroupBarrier();\n    }}\n"
                ),
                "if (lid == 0u) { st_out(row, wg_red[0]); }".to_string(),
                "if (lid == 0u) { part[w] = bitcast<u32>(wg_red[0]); }".to_string(),
            )
        }
        "argmax" => (
            "    var bv = neg_inf();\n    var bi = 0xffffffffu;\n".to_string(),
            format!("let v = {ld}; if (bi == 0xffffffffu || better(bv, bi, v, jj)) {{ bv = v; bi = jj; }}"),
            "    var bv = neg_inf();\n    var bi = 0xffffffffu;\n    \
             if (here) { bv = bitcast<f32>(part[2u * at]); bi = part[2u * at + 1u]; }\n"
                .to_string(),
            "    wg_val[lid] = bv;\n    wg_idx[lid] = bi;\n    workgroupBarrier();\n    \
             for (var s = 128u; s > 0u; s = s >> 1u) {\n        if (lid < s) { let j = wg_idx[lid + s]; \
             if (j != 0xffffffffu && (wg_idx[lid] == 0xffffffffu || better(wg_val[lid], wg_idx[lid], wg_val[lid + s], j))) \
             { wg_val[lid] = wg_val[lid + s]; wg_idx[lid] = j; } }\n        workgroupBarrier();\n    }\n"
                .to_string(),
            "if (lid == 0u) { sti_out(row, i32(wg_idx[0])); }".to_string(),
            "if (lid == 0u) { part[2u * w] = bitcast<u32>(wg_val[0]); part[2u * w + 1u] = wg_idx[0]; }"
                .to_string(),
        ),
        op => return Err(Error::Internal(format!("wgpu reduce: no operator {op}"))),
    };
    Ok(GpuParts {
        init,
        step,
        from_part,
        tree,
        to_out,
        to_part,
    })
}

/// The host form ([`wgsl::row_kernel`]'s): one invocation per output element walks its
/// reduced elements alone, no barrier, both views' offsets computed with their extents in
/// the code ([`wgsl::view_index`]). On lavapipe the 256-invocation workgroup ran on one core
/// all the same, behind nine barriers: argmax over one row of 512 floats took 84 µs, 30 µs
/// so (Intel Xeon). A sum keeps four partial sums (every fourth element each), added
/// pairwise at the end, so its rounding error grows like a quarter of a sequential sum's.
/// Taken only for reductions one lane may loop over (`super::host_form`).
fn host_source(
    op: &str,
    binds: &[Bind],
    d: wgsl::Dialect,
    cfg: &[u32],
    (ks, kst): (&[usize], &[usize]),
    (rs, rst): (&[usize], &[usize]),
    lanes: usize,
) -> Result<(String, [u32; 3])> {
    let mut funcs = String::new();
    let base = wgsl::view_index(&mut funcs, "kept_off", "row", cfg[2], ks, kst, true);
    let at = wgsl::view_index(&mut funcs, "red_off", "j", cfg[3], rs, rst, true);
    let ld = format!("ld_x(base + {at})");
    let body = match op {
        "sum" | "mean" => {
            let total = if op == "mean" {
                "select(total / f32(n), bitcast<f32>(0x7fc00000u), n == 0u)"
            } else {
                "total"
            };
            let step = |k: u32| ld.replace("(j)", &format!("(j + {k}u)"));
            format!(
                "    var a0 = 0.0; var a1 = 0.0; var a2 = 0.0; var a3 = 0.0;\n    var j = 0u;\n    \
                 for (; j + 4u <= n; j = j + 4u) {{ a0 = a0 + {}; a1 = a1 + {}; a2 = a2 + {}; a3 = a3 + {}; }}\n    \
                 for (; j < n; j = j + 1u) {{ a0 = a0 + {ld}; }}\n    \
                 let total = (a0 + a1) + (a2 + a3);\n    st_out(row, {total});\n",
                step(0),
                step(1),
                step(2),
                step(3)
            )
        }
        "max" | "min" => {
            let (cmp, init) = if op == "max" {
                (">", "neg_inf()")
            } else {
                ("<", "-neg_inf()")
            };
            format!(
                "    var acc = {init};\n    var nan = false;\n    \
                 for (var j = 0u; j < n; j = j + 1u) {{ let v = {ld}; nan = nan || v != v; if (v {cmp} acc) {{ acc = v; }} }}\n    \
                 st_out(row, select(acc, bitcast<f32>(0x7fc00000u), nan));\n"
            )
        }
        "argmax" => format!(
            "    var bv = neg_inf();\n    var bi = 0xffffffffu;\n    \
             for (var j = 0u; j < n; j = j + 1u) {{ let v = {ld}; \
             if (bi == 0xffffffffu || better(bv, bi, v, j)) {{ bv = v; bi = j; }} }}\n    \
             sti_out(row, i32(bi));\n"
        ),
        op => return Err(Error::Internal(format!("wgpu reduce: no operator {op}"))),
    };
    let head = "    if (row >= cfg[0]) { return; }\n    let n = cfg[1];\n";
    let prelude = format!("{}{ARGMAX}{funcs}", wgsl::prelude(binds, d));
    Ok(wgsl::row_kernel(
        &prelude,
        &format!("{head}    let base = {base};\n{body}"),
        true,
        lanes,
        d,
    ))
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    for op in ["sum", "mean", "max", "min", "argmax"] {
        reg_all(reg, op, FLOATS, prepare);
    }
}
