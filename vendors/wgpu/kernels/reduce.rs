//! Reductions in WGSL (sum, mean, max, min, argmax over any set of axes): one workgroup per
//! output element, its 256 invocations striding over the reduced elements (read in place
//! through the reduced axes' strides), then a tree in workgroup memory; a long reduction into
//! few outputs is split into chunks, one workgroup each, whose results a second pass
//! combines ([`chunks`]); on adapters on the host's cores one invocation per output element
//! instead where its loops fit ([`host_source`]), or, for a sum, mean or argmax into few
//! outputs over long rows or over rows too long for one lane's loops, a workgroup of 8 or
//! more per output ([`super::row_lanes`]). Either form takes its elements four
//! consecutive at a time, and has a quad variant that reads the four as one load where the
//! reduced axis is contiguous and the rows start on multiples of four (1.4–1.7× on lavapipe
//! and llvmpipe for a whole-tensor sum or argmax); the two variants give the same result,
//! bitwise, wherever the tensor starts. On the host's cores the quad variant of a wholly
//! contiguous input reads it through a texture (`TexRead`: 2.7–4.7× on lavapipe and
//! llvmpipe), the same elements in the same order. max / min propagate NaN; argmax returns
//! the first maximum (the first NaN if any), as the CPU kernel does.
//!
//! Constants: `cfg[0]` the output elements, `cfg[1]` the reduced elements, `cfg[2]` /
//! `cfg[3]` where the kept and the reduced axes' views of the input start, `cfg[4]` the
//! chunks per output and `cfg[5]` the elements per chunk.

use std::sync::Arc;

use super::op::{prepare as prepare_op, prepare_scratch, OpSource, PassSources, TexRead};
use super::rowwise;
use super::shapes::{self, Numbers};
use super::textures::{textures_for, TexturedRead};
use super::wgsl::{self, Bind, ViewCode};
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
    let vn = is_nan(v);
    let wn = is_nan(w);
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
    // The kept and the reduced views with their contiguous dimensions merged: a contiguous
    // [1024, 4096] summed over both axes is one row of 4 Mi elements, which the quad variant
    // (and its texture) takes; over two reduced axes it took neither and ran 3.7× slower on
    // lavapipe. The walk's order is unchanged, so are the results, bitwise.
    let (ks, kst) = {
        let (s, t) = wgsl::kept(shape, strides, axes);
        wgsl::merge_view(&s, &t)
    };
    let (rs, rst) = {
        let (s, t): (Vec<usize>, Vec<usize>) = axes.iter().map(|&a| (shape[a], strides[a])).unzip();
        wgsl::merge_view(&s, &t)
    };
    let lanes: usize = ks.iter().product();
    let red: usize = rs.iter().product();
    let n = red as u64;
    let chunks = chunks(spec, lanes as u64, n);
    // Chunks start on multiples of four elements: each lane of the GPU form takes its
    // elements four consecutive at a time ([`walk`]). A last chunk may be empty.
    let chunk = n.div_ceil(chunks).next_multiple_of(4);
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
    // A sum, mean or argmax over few long rows shares each row among a workgroup's
    // invocations (one lane walking 32 000 elements alone took 0.7 ms on lavapipe), and so
    // does one over rows too long for one lane's loops: the fewest lanes from 8 whose loops
    // fit ([`super::row_lanes`]; none fit: the GPU form). A lane takes every LANES-th four of
    // its row, then (sum) `wg_sum` or (argmax) the first lane combines the lanes' pairs. max
    // and min keep one lane, which returns the first of tied extremes (±0) without tracking
    // indices, and count an iteration per element (their one-lane rows stay as long as
    // they were measured at).
    // A sum over fewer such rows than the host has cores takes the GPU form, whose chunks
    // spread over every core (a workgroup runs on one): 1 × 300 000 took 1.7 ms so on
    // lavapipe and 2.3 ms with 8 lanes, 4 × 300 000 2.1–4.3 ms so and 1.2–1.3 with 8 lanes.
    // An argmax takes the lanes all the same (1 × 128 256: 0.9 ms so, 0.45 with 8 lanes).
    let shared = matches!(spec.op, "sum" | "mean" | "argmax");
    let too_long = super::loop_limited(spec) && n / 4 + 3 > super::LOOP_BUDGET;
    let spread = too_long && spec.op != "argmax" && lanes < super::host_cores();
    let row_lanes = if spread {
        None
    } else if shared {
        super::row_lanes(spec, lanes, n.div_ceil(4), 1).ok()
    } else {
        Some(1)
    };
    let host_loops = match row_lanes {
        Some(1) if shared => Some(n / 4 + 3),
        Some(1) => Some(n),
        Some(w) => Some(n.div_ceil(4).div_ceil(u64::from(w)) + rowwise::WG_REDUCE_LOOPS + 3),
        None => None,
    };
    // The GPU form's offsets: `view_off`'s loops, or straight-line code where a loop limiter
    // would count those loops — on the host's cores always (there a run-time division is a
    // loop of scalar divisions), elsewhere only where they would not fit, so that
    // `UNIRT_WGPU_GPU_FORMS=1` on the Mesa adapters runs the form a GPU runs.
    let generic_loops = chunk.div_ceil(256) * (1 + rs.len() as u64) + rowwise::WG_REDUCE_LOOPS;
    let literal = super::loop_limited(spec)
        && (super::on_host_cores(spec) || generic_loops > super::LOOP_BUDGET);
    let gpu_loops = if literal {
        chunk.div_ceil(1024) + 4 + rowwise::WG_REDUCE_LOOPS
    } else {
        generic_loops
    };
    let host = super::host_form(spec, host_loops, gpu_loops, || {
        format!("a reduction of {n} elements")
    })?;
    // Element by element through the reduced axes' view; or, in the quad variant (a
    // contiguous reduced axis of a multiple of four elements, every row starting on a
    // multiple of four), four at once: the same elements into the same accumulators in the
    // same order, so both variants give the same result, bitwise.
    let quad =
        rs.len() == 1 && rst[0] == 1 && n.is_multiple_of(4) && kst.iter().all(|s| s % 4 == 0);
    // On the host's cores, the quad variant of a reduction of a wholly contiguous tensor may
    // read it through a texture instead (see `TexRead`): lavapipe gathers a texel load in
    // registers, where its storage loads are a loop over the lanes.
    let scratch = usize::from(!host && chunks > 1);
    let flat = (quad && super::on_host_cores(spec) && x.layout.is_contiguous())
        .then(|| {
            let n = x.layout.numel();
            textures_for(&binds, &[Some(TexturedRead::whole(n))], n, scratch)
        })
        .flatten();
    let through_texture = |passes: &PassSources| -> Option<TexRead> {
        let t = flat.as_ref()?;
        let passes = passes
            .iter()
            // The quad loads (the calls, not the prelude's `fn ld4_x`) read the texture.
            .map(|(src, grid)| match src.contains("ld4_x(base") {
                true => (src.replace("ld4_x(base", "tex4_x(base") + &t.decls, *grid),
                false => (src.clone(), *grid),
            })
            .collect();
        Some(TexRead {
            inputs: t.inputs.clone(),
            passes,
        })
    };
    if host {
        let row_lanes = row_lanes.unwrap_or(1);
        let src = shapes::twin(spec, |numbers| {
            let form = |quads: bool| {
                host_source(
                    spec.op,
                    &binds,
                    d,
                    &cfg,
                    [(&ks, &kst), (&rs, &rst)],
                    (lanes, row_lanes),
                    quads,
                    numbers,
                )
            };
            let scalar =
                form(false)?.ok_or_else(|| Error::Internal("wgpu reduce: no host form".into()))?;
            let aligned = if quad {
                form(true)?.map(|pass| vec![pass])
            } else {
                None
            };
            let mut src = OpSource::plain(spec.op.to_string(), vec![scalar], cfg.clone());
            src.textured = aligned.as_ref().and_then(through_texture);
            src.aligned = aligned;
            Ok(src)
        })?;
        return prepare_op(spec, src);
    }
    let src = shapes::twin(spec, |numbers| {
        let code = match literal {
            true => ViewCode::Unrolled(numbers),
            false => ViewCode::Loop,
        };
        gpu_source(
            spec,
            &binds,
            cfg.clone(),
            [(&ks, &kst), (&rs, &rst)],
            (chunks, lanes, quad),
            code,
            &through_texture,
        )
    })?;
    if chunks > 1 {
        let words = if spec.op == "argmax" { 2 } else { 1 };
        prepare_scratch(spec, src, 4 * words * lanes as u64 * chunks)
    } else {
        prepare_op(spec, src)
    }
}

/// The GPU form's kernel: one workgroup per output, or per chunk of one (see [`gpu_passes`]);
/// the views' offsets computed as `code` says.
fn gpu_source(
    spec: &PlanSpec<'_>,
    binds: &[Bind],
    cfg: Vec<u32>,
    [(ks, kst), (rs, rst)]: [(&[usize], &[usize]); 2],
    (chunks, lanes, quad): (u64, usize, bool),
    code: ViewCode,
    through_texture: &dyn Fn(&PassSources) -> Option<TexRead>,
) -> Result<OpSource> {
    let d = wgsl::Dialect::of(spec);
    let mut funcs = String::new();
    // The views' descriptors start at the indices held in cfg[2] and cfg[3].
    let base = wgsl::view_index(&mut funcs, "kept_off", "row", (&cfg, 2), ks, kst, code);
    let at = wgsl::view_index(&mut funcs, "red_off", "jj", (&cfg, 3), rs, rst, code);
    // The chunks' results, in the plan's scratch buffer (bound after the tensors).
    let part = if chunks > 1 {
        format!(
            "@group(0) @binding({}) var<storage, read_write> part: array<u32>;\n",
            binds.len() + 1
        )
    } else {
        String::new()
    };
    let head = |prelude: &str| {
        format!(
            "{prelude}{}{ARGMAX_SHARED}{ARGMAX}{funcs}{part}\n{}",
            rowwise::wg_reduce(d),
            rowwise::main_rows_open(d)
        )
    };
    let parts = gpu_parts(spec.op)?;
    let passes_of =
        |prelude: &str, how: &Walk| gpu_passes(&head(prelude), &parts, how, &base, chunks, lanes);
    let aligned = quad
        .then(|| wgsl::prelude_mixed(binds, &[true, false], d))
        .flatten()
        .map(|prelude| passes_of(&prelude, &Walk::Quads));
    let scalar = Walk::Scalar(format!("ld_x(base + {at})"));
    let mut src = OpSource::plain(
        spec.op.to_string(),
        passes_of(&wgsl::prelude(binds, d), &scalar),
        cfg,
    );
    src.textured = aligned.as_ref().and_then(through_texture);
    src.aligned = aligned;
    Ok(src)
}

/// How the GPU form's lanes read their elements (see [`walk`]).
enum Walk {
    /// One element at a time: this load of element `jj`.
    Scalar(String),
    /// Four at a time, `ld4_x(base + j)`.
    Quads,
}

/// The GPU form's passes: one workgroup per output, or (`chunks` > 1) pass 1 over each
/// output's chunks into `part`, pass 2 combining them.
fn gpu_passes(
    head: &str,
    parts: &GpuParts,
    how: &Walk,
    base: &str,
    chunks: u64,
    lanes: usize,
) -> PassSources {
    if chunks == 1 {
        let src = format!(
            "{head}    let row = wid.x + wid.y * nwg.x;\n    if (row >= cfg[0]) {{ return; }}\n    \
             let n = cfg[1];\n    let base = {base};\n{}{}{}{}    {}\n}}\n",
            parts.init,
            walk("4u * lid", &parts.step, how),
            parts.lane,
            parts.tree,
            parts.to_out
        );
        return vec![(src, rowwise::rows_grid(lanes))];
    }
    // Pass 1: workgroup w reduces chunk w % chunks of output w / chunks into part[w]; pass 2:
    // one workgroup per output combines its chunks' results (in the order of the chunks: the
    // earlier chunk's index wins a tie).
    let first = format!(
        "{head}    let w = wid.x + wid.y * nwg.x;\n    if (w >= cfg[0] * cfg[4]) {{ return; }}\n    \
         let row = w / cfg[4];\n    let begin = (w % cfg[4]) * cfg[5];\n    \
         let n = min(cfg[1], begin + cfg[5]);\n    let base = {base};\n{}{}{}{}    {}\n}}\n",
        parts.init,
        walk("begin + 4u * lid", &parts.step, how),
        parts.lane,
        parts.tree,
        parts.to_part
    );
    let second = format!(
        "{head}    let row = wid.x + wid.y * nwg.x;\n    if (row >= cfg[0]) {{ return; }}\n    \
         let n = cfg[1];\n    let at = row * cfg[4] + lid;\n    let here = lid < cfg[4];\n{}{}    {}\n}}\n",
        parts.from_part, parts.tree, parts.to_out
    );
    vec![
        (first, rowwise::rows_grid((lanes as u64 * chunks) as usize)),
        (second, rowwise::rows_grid(lanes)),
    ]
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

/// The loop of the GPU form's lanes over their elements: from `start` (a multiple of four),
/// four consecutive elements, then the four 1024 further on, and so on below `n`; `step`
/// handles one element (`{V}` its value, `{J}` its index, `{C}` its place in the four).
/// Scalar walks load each element through the view and finish a partial last four; quad
/// walks load the four at once (`n` is then a multiple of four). Both take the same elements
/// in the same order into the same accumulators.
fn walk(start: &str, step: &str, how: &Walk) -> String {
    let one = |c: u32, value: &str, index: &str| {
        step.replace("{V}", value)
            .replace("{J}", index)
            .replace("{C}", &c.to_string())
    };
    match how {
        Walk::Scalar(ld) => {
            let at = |c: u32| {
                format!(
                    "{{ let jj = j + {c}u; let x{c} = {ld}; {} }}",
                    one(c, &format!("x{c}"), "jj")
                )
            };
            format!(
                "    var j = {start};\n    \
                 for (; j + 3u < n; j = j + 1024u) {{ {} {} {} {} }}\n    \
                 if (j < n) {} if (j + 1u < n) {} if (j + 2u < n) {}\n",
                at(0),
                at(1),
                at(2),
                at(3),
                at(0),
                at(1),
                at(2)
            )
        }
        Walk::Quads => format!(
            "    var j = {start};\n    \
             for (; j < n; j = j + 1024u) {{ let q = ld4_x(base + j); {} {} {} {} }}\n",
            one(0, "q.x", "j"),
            one(1, "q.y", "(j + 1u)"),
            one(2, "q.z", "(j + 2u)"),
            one(3, "q.w", "(j + 3u)")
        ),
    }
}

/// The pieces of an operator's GPU form.
struct GpuParts {
    /// The lane's accumulators.
    init: String,
    /// What [`walk`] does with one element.
    step: String,
    /// The lane's accumulators as one value, `acc`, for the tree.
    lane: String,
    /// Pass 2's accumulator: the result of chunk `at`, where `here`.
    from_part: String,
    /// The workgroup's tree over its lanes' accumulators.
    tree: String,
    /// The first lane stores the result to `out`, or (pass 1) to `part` at `w`.
    to_out: String,
    to_part: String,
}

/// The GPU form of `op`: each lane accumulates its elements (a sum in four partial sums, one
/// per place in each four, added pairwise), a tree in workgroup memory combines the lanes.
fn gpu_parts(op: &str) -> Result<GpuParts> {
    let (init, step, lane, from_part, tree, to_out, to_part) = match op {
        "sum" | "mean" => (
            "    var a0 = 0.0;\n    var a1 = 0.0;\n    var a2 = 0.0;\n    var a3 = 0.0;\n".to_string(),
            "a{C} = a{C} + {V};".to_string(),
            "    let acc = (a0 + a1) + (a2 + a3);\n".to_string(),
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
                format!("nan = nan || is_nan({{V}}); if ({{V}} {cmp} acc) {{ acc = {{V}}; }}"),
                String::new(),
                format!(
                    "    var acc = {init};\n    if (here) {{ acc = bitcast<f32>(part[at]); }}\n    let nan = is_nan(acc);\n"
                ),
                format!(
                    "    wg_red[lid] = select(acc, bitcast<f32>(0x7fc00000u), nan);\n    workgroupBarrier();\n    \
                     for (var s = 128u; s > 0u; s = s >> 1u) {{\n        if (lid < s) {{ let a = wg_red[lid]; let b = wg_red[lid + s]; \
                     if (!is_nan(a) && (is_nan(b) || b {cmp} a)) {{ wg_red[lid] = b; }} }}\n        workgroupBarrier();\n    }}\n"
                ),
                "if (lid == 0u) { st_out(row, wg_red[0]); }".to_string(),
                "if (lid == 0u) { part[w] = bitcast<u32>(wg_red[0]); }".to_string(),
            )
        }
        "argmax" => (
            "    var bv = neg_inf();\n    var bi = 0xffffffffu;\n".to_string(),
            "if (bi == 0xffffffffu || better(bv, bi, {V}, {J})) { bv = {V}; bi = {J}; }".to_string(),
            String::new(),
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
        lane,
        from_part,
        tree,
        to_out,
        to_part,
    })
}

/// The host form ([`rowwise::row_kernel`]'s): one invocation per output element walks its
/// reduced elements alone, no barrier, both views' offsets computed with their extents in
/// the code ([`wgsl::view_index`]). On lavapipe the 256-invocation workgroup ran on one core
/// all the same, behind nine barriers: argmax over one row of 512 floats took 84 µs, 30 µs
/// so (Intel Xeon). A sum keeps four partial sums (every fourth element each), added
/// pairwise at the end, so its rounding error grows like a quarter of a sequential sum's.
/// Taken only where the lanes' loops fit the loop limiter (`super::host_form`).
#[allow(clippy::too_many_arguments)]
fn host_source(
    op: &str,
    binds: &[Bind],
    d: wgsl::Dialect,
    cfg: &[u32],
    [(ks, kst), (rs, rst)]: [(&[usize], &[usize]); 2],
    (lanes, row_lanes): (usize, u32),
    quads: bool,
    numbers: Numbers,
) -> Result<Option<(String, [u32; 3])>> {
    let mut funcs = String::new();
    let code = ViewCode::Unrolled(numbers);
    let base = wgsl::view_index(&mut funcs, "kept_off", "row", (cfg, 2), ks, kst, code);
    let at = wgsl::view_index(&mut funcs, "red_off", "j", (cfg, 3), rs, rst, code);
    let ld = format!("ld_x(base + {at})");
    // Elements j … j + 3 as `x0` … `x3`: read one at a time, or (quads) as one quad.
    let four = if quads {
        "let q = ld4_x(base + j); let x0 = q.x; let x1 = q.y; let x2 = q.z; let x3 = q.w;"
            .to_string()
    } else {
        (0..4)
            .map(|k| format!("let x{k} = {};", ld.replace("(j)", &format!("(j + {k}u)"))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    // What is left after the fours (nothing in the quad variant: n is a multiple of four),
    // by the row's first lane.
    let rest = |step: &str| {
        if quads {
            String::new()
        } else {
            format!(
                "    if (lid == 0u) {{ for (j = n & 0xfffffffcu; j < n; j = j + 1u) {{ let x0 = {ld}; {step} }} }}\n"
            )
        }
    };
    // Lane `lid` of the row's LANES takes the fours at 4·lid, 4·(lid + LANES), …
    let fours = "var j = 4u * lid;\n    for (; j + 4u <= n; j = j + 4u * LANES)";
    let body = match op {
        "sum" | "mean" => {
            let total = if op == "mean" {
                "select(total / f32(n), bitcast<f32>(0x7fc00000u), n == 0u)"
            } else {
                "total"
            };
            format!(
                "    var a0 = 0.0; var a1 = 0.0; var a2 = 0.0; var a3 = 0.0;\n    {fours} \
                 {{ {four} a0 = a0 + x0; a1 = a1 + x1; a2 = a2 + x2; a3 = a3 + x3; }}\n\
                 {}    let total = wg_sum((a0 + a1) + (a2 + a3), lid);\n    \
                 if (lid == 0u) {{ st_out(row, {total}); }}\n",
                rest("a0 = a0 + x0;")
            )
        }
        "max" | "min" => {
            let (cmp, init) = if op == "max" {
                (">", "neg_inf()")
            } else {
                ("<", "-neg_inf()")
            };
            let step = |k: u32| {
                format!("nan = nan || is_nan(x{k}); if (x{k} {cmp} acc) {{ acc = x{k}; }}")
            };
            format!(
                "    var acc = {init};\n    var nan = false;\n    {fours} \
                 {{ {four} {} {} {} {} }}\n\
                 {}    st_out(row, select(acc, bitcast<f32>(0x7fc00000u), nan));\n",
                step(0),
                step(1),
                step(2),
                step(3),
                rest(&step(0))
            )
        }
        "argmax" => {
            let step = |k: u32| {
                format!(
                    "if (bi == 0xffffffffu || better(bv, bi, x{k}, j + {k}u)) {{ bv = x{k}; bi = j + {k}u; }}"
                )
            };
            // The lanes' (value, index) pairs combined by the first lane in lane order: the
            // pair order (`better`) does not depend on which lane found a pair.
            let combine = if row_lanes == 1 {
                "    sti_out(row, i32(bi));\n".to_string()
            } else {
                "    wg_av[lid] = bv;\n    wg_ai[lid] = bi;\n    workgroupBarrier();\n    \
                 if (lid == 0u) {\n        for (var k = 1u; k < LANES; k = k + 1u) {\n            \
                 let w = wg_av[k];\n            let wi = wg_ai[k];\n            \
                 if (wi != 0xffffffffu && (bi == 0xffffffffu || better(bv, bi, w, wi))) { bv = w; bi = wi; }\n        \
                 }\n        sti_out(row, i32(bi));\n    }\n"
                    .to_string()
            };
            format!(
                "    var bv = neg_inf();\n    var bi = 0xffffffffu;\n    {fours} \
                 {{ {four} {} {} {} {} }}\n{}{combine}",
                step(0),
                step(1),
                step(2),
                step(3),
                rest(&step(0))
            )
        }
        op => return Err(Error::Internal(format!("wgpu reduce: no operator {op}"))),
    };
    // (Every lane of a row reaches the workgroup reductions: a row past the last returns
    // as a whole workgroup.)
    let head = "    if (row >= cfg[0]) { return; }\n    let n = cfg[1];\n";
    let prelude = if quads {
        match wgsl::prelude_mixed(binds, &[true, false], d) {
            Some(p) => p,
            None => return Ok(None),
        }
    } else {
        wgsl::prelude(binds, d)
    };
    let pairs = if op == "argmax" && row_lanes > 1 {
        format!(
            "var<workgroup> wg_av: array<f32, {row_lanes}>;\nvar<workgroup> wg_ai: array<u32, {row_lanes}>;\n"
        )
    } else {
        String::new()
    };
    let prelude = format!("{prelude}{ARGMAX}{pairs}{funcs}");
    Ok(Some(rowwise::row_kernel(
        &prelude,
        &format!("{head}    let base = {base};\n{body}"),
        row_lanes,
        lanes,
        d,
    )))
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    for op in ["sum", "mean", "max", "min", "argmax"] {
        reg_all(reg, op, FLOATS, prepare);
    }
}
