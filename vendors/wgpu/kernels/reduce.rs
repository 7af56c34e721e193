//! Reductions in WGSL (sum, mean, max, min, argmax over any set of axes): one workgroup per
//! output element, its 256 invocations striding over the reduced elements (read in place
//! through the reduced axes' strides), then a tree in workgroup memory; on adapters on the
//! host's cores one invocation per output element instead ([`host_source`]). max / min
//! propagate NaN; argmax returns the first maximum (the first NaN if any), as the CPU kernel does.
//!
//! Constants: `cfg[0]` the output elements, `cfg[1]` the reduced elements, `cfg[2]` /
//! `cfg[3]` where the kept and the reduced axes' views of the input start.

use std::sync::Arc;

use super::op::{prepare as prepare_op, OpSource};
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
    let mut cfg = vec![lanes as u32, red as u32, 0, 0];
    cfg[2] = wgsl::push_view(&mut cfg, &ks, &kst);
    cfg[3] = wgsl::push_view(&mut cfg, &rs, &rst);
    let binds = [Bind::read("x", x.dtype), Bind::write("out", out.dtype)];
    let d = wgsl::Dialect::of(spec);
    // One lane walks the reduced elements on the host's cores (a sum four at a time, the
    // offsets in straight-line code), each of 256 a 256th of them otherwise (four per loop
    // iteration). On an adapter with a loop limiter the GPU form's offsets are straight-line
    // code too (elsewhere a loop over the reduced axes, `view_off`, which the limiter would
    // count): one loop iteration per 1024 elements lets it reach past a 128 MiB binding.
    let n = red as u64;
    let host_loops = if matches!(spec.op, "sum" | "mean") {
        n / 4 + 3
    } else {
        n
    };
    let literal = super::loop_limited(spec);
    let gpu_loops = if literal {
        n.div_ceil(1024) + 4
    } else {
        n.div_ceil(256) * (1 + rs.len() as u64)
    } + wgsl::WG_REDUCE_LOOPS;
    let host = super::host_form(spec, Some(host_loops), gpu_loops, || {
        format!("a reduction of {n} elements")
    })?;
    let (source, grid) = if host {
        host_source(spec.op, &binds, d, &cfg, (&ks, &kst), (&rs, &rst), lanes)?
    } else {
        let mut funcs = String::new();
        let base = wgsl::view_index(&mut funcs, "kept_off", "row", cfg[2], &ks, &kst, literal);
        let at = wgsl::view_index(&mut funcs, "red_off", "jj", cfg[3], &rs, &rst, literal);
        let body = gpu_body(spec.op, &format!("ld_x(base + {at})"))?;
        let source = format!(
            "{}{}{ARGMAX_SHARED}{ARGMAX}{funcs}\n{}    let row = wid.x + wid.y * nwg.x;\n    \
             if (row >= cfg[0]) {{ return; }}\n    let n = cfg[1];\n    let base = {base};\n{body}}}\n",
            wgsl::prelude(&binds, d),
            wgsl::wg_reduce(d),
            wgsl::main_rows_open(d)
        );
        (source, wgsl::rows_grid(lanes))
    };
    prepare_op(
        spec,
        OpSource {
            name: spec.op.to_string(),
            passes: vec![(source, grid)],
            cfg,
            entry: None,
            zero_workgroup_memory: false,
            aligned: None,
            textured: None,
        },
    )
}

/// The GPU form's body after `row`, `n` and `base`: each of 256 lanes takes every 256th
/// reduced element from its own (element `jj` read by `ld`), four per loop iteration in the
/// order a one-at-a-time loop would take them (the same result, bitwise, in a quarter of the
/// iterations), then a tree in workgroup memory.
fn gpu_body(op: &str, ld: &str) -> Result<String> {
    let (init, step, combine) = match op {
        "sum" | "mean" => (
            "    var acc = 0.0;\n".to_string(),
            format!("acc = acc + {ld};"),
            format!(
                "    let total = wg_sum(acc, lid);\n    if (lid == 0u) {{ st_out(row, {}); }}\n",
                // The mean of nothing is NaN, written as such: some drivers' 0.0 / 0.0 is
                // not NaN (NVIDIA's Vulkan gave −0).
                if op == "mean" {
                    "select(total / f32(n), bitcast<f32>(0x7fc00000u), n == 0u)"
                } else {
                    "total"
                }
            ),
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
                    "    wg_red[lid] = select(acc, bitcast<f32>(0x7fc00000u), nan);\n    workgroupBarrier();\n    \
                     for (var s = 128u; s > 0u; s = s >> 1u) {{\n        if (lid < s) {{ let a = wg_red[lid]; let b = wg_red[lid + s]; \
                     if (a == a && (b != b || b {cmp} a)) {{ wg_red[lid] = b; }} }}\n        workgroupBarrier();\n    }}\n    \
                     if (lid == 0u) {{ st_out(row, wg_red[0]); }}\n"
                ),
            )
        }
        "argmax" => (
            "    var bv = neg_inf();\n    var bi = 0xffffffffu;\n".to_string(),
            format!("let v = {ld}; if (bi == 0xffffffffu || better(bv, bi, v, jj)) {{ bv = v; bi = jj; }}"),
            "    wg_val[lid] = bv;\n    wg_idx[lid] = bi;\n    workgroupBarrier();\n    \
             for (var s = 128u; s > 0u; s = s >> 1u) {\n        if (lid < s) { let j = wg_idx[lid + s]; \
             if (j != 0xffffffffu && (wg_idx[lid] == 0xffffffffu || better(wg_val[lid], wg_idx[lid], wg_val[lid + s], j))) \
             { wg_val[lid] = wg_val[lid + s]; wg_idx[lid] = j; } }\n        workgroupBarrier();\n    }\n    \
             if (lid == 0u) { sti_out(row, i32(wg_idx[0])); }\n"
                .to_string(),
        ),
        op => return Err(Error::Internal(format!("wgpu reduce: no operator {op}"))),
    };
    let at = |j: &str| format!("{{ let jj = {j}; {step} }}");
    Ok(format!(
        "{init}    var j = lid;\n    \
         for (; j + 768u < n; j = j + 1024u) {{ {} {} {} {} }}\n    \
         for (; j < n; j = j + 256u) {} \n{combine}",
        at("j"),
        at("j + 256u"),
        at("j + 512u"),
        at("j + 768u"),
        at("j")
    ))
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
