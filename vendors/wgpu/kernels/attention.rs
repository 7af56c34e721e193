//! Scaled dot-product attention in WGSL, one fused kernel: one workgroup per query row
//! (batch, head, position) walks the visible keys in blocks of 256 with an online softmax —
//! each invocation scores one key of the block, the block's max and sum are reduced in
//! workgroup memory, and every invocation rescales and accumulates its own output dimensions —
//! so no score matrix is ever stored. A decode step (query length 1) is one workgroup per
//! head; grouped-query heads share their kv head; causal rows see keys `j ≤ i + lkv - lq`.
//! On adapters on the host's cores (head dims a multiple of 4, up to [`HOST_MAX_DIM`]), one
//! invocation per query row and no barrier ([`host_body`]), however few the rows.
//!
//! Constants: `cfg[0]` rows, `cfg[1..5]` hq, lq, hkv, lkv, `cfg[5]` d, `cfg[6]` causal,
//! `cfg[7]` scale (f32 bits), `cfg[8..24]` the strides of q, k, v and out (4 each).

use std::sync::Arc;

use super::op::{prepare as prepare_op, OpSource, TexRead};
use super::rowwise;
use super::textures::{textures_for, TexturedRead};
use super::wgsl::{self, Bind};
use super::{reg_all, FLOATS};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::ops::{Params, PlanSpec, PreparedKernel};

/// Head dims one invocation accumulates (d ≤ 4 · 256).
const DIMS_PER_ITEM: usize = 4;

/// What both forms start with: the query row's batch, head and position, its kv head, the
/// keys it sees, and where its q, k and v start ([`rowwise::row_kernel`] gives `row`).
const HEAD: &str = "
    if (row >= cfg[0]) { return; }
    let hq = cfg[1]; let lq = cfg[2]; let hkv = cfg[3]; let lkv = cfg[4]; let d = cfg[5];
    let b = row / (hq * lq);
    let h = (row / lq) % hq;
    let i = row % lq;
    let kh = h / (hq / hkv);
    var visible = lkv;
    if (cfg[6] != 0u) { visible = min(i + lkv - lq + 1u, lkv); }
    let scale = cfg_f(7u);
    let qb = b * cfg[8] + h * cfg[9] + i * cfg[10];
    let kb = b * cfg[12] + kh * cfg[13];
    let vb = b * cfg[16] + kh * cfg[17];
";

/// The workgroup memory of the GPU form.
const GPU_SHARED: &str = "
var<workgroup> qsh: array<f32, 1024>;
var<workgroup> psh: array<f32, 256>;
";

/// The GPU form after [`HEAD`]: a workgroup per query row (see the module docs).
const GPU_BODY: &str = "
    for (var j = lid; j < d; j = j + 256u) { qsh[j] = ld_q(qb + j * cfg[11]); }
    workgroupBarrier();
    var m = neg_inf();
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var k0 = 0u; k0 < visible; k0 = k0 + 256u) {
        let key = k0 + lid;
        var s = neg_inf();
        if (key < visible) {
            var dot = 0.0;
            let kr = kb + key * cfg[14];
            for (var j = 0u; j < d; j = j + 1u) { dot = dot + qsh[j] * ld_k(kr + j * cfg[15]); }
            s = dot * scale;
        }
        let mnew = max(m, wg_max(s, lid));
        var p = 0.0;
        if (key < visible) { p = exp(s - mnew); }
        psh[lid] = p;
        let bsum = wg_sum(p, lid);
        let corr = exp(m - mnew);
        l = l * corr + bsum;
        let cnt = min(256u, visible - k0);
        for (var t = 0u; t < 4u; t = t + 1u) {
            let j = lid + t * 256u;
            if (j < d) {
                var a = acc[t] * corr;
                for (var kk = 0u; kk < cnt; kk = kk + 1u) {
                    a = a + psh[kk] * ld_v(vb + (k0 + kk) * cfg[18] + j * cfg[19]);
                }
                acc[t] = a;
            }
        }
        m = mnew;
        workgroupBarrier();
    }
    let ob = b * cfg[20] + h * cfg[21] + i * cfg[22];
    var inv = 0.0;
    if (l > 0.0) { inv = 1.0 / l; }
    for (var t = 0u; t < 4u; t = t + 1u) {
        let j = lid + t * 256u;
        if (j < d) { st_out(ob + j * cfg[23], acc[t] * inv); }
    }
";

/// The host form after [`HEAD`], for adapters on the host's cores (see
/// [`super::on_host_cores`]) and head dims `d` of 4k up to [`HOST_MAX_DIM`]: one invocation
/// per query row and no barrier, generated for the plan's `d` — the query row and the output
/// accumulator are `d / 4` named vec4s, as private arrays indexed at run time are lowered to
/// compare-and-select chains by some drivers (llvmpipe's GL path). The softmax is online and
/// rescales the accumulator only when a key raises the running max.
///
/// With `kv_quads`, k's and v's rows (contiguous, starting on multiples of four) are read a
/// quad at a time through `ld4_k` / `ld4_v`: the same values into the same arithmetic, so
/// the variants agree bitwise.
fn host_body(d: usize, kv_quads: bool) -> String {
    // One line per quad t of the head dim.
    let each = |line: &dyn Fn(usize) -> String| (0..d / 4).map(line).collect::<String>();
    let quad = |t: usize, ld: &str, base: &str, stride: &str| {
        if kv_quads && ld != "ld_q" {
            return format!("{}({base} + {}u)", ld.replace("ld_", "ld4_"), 4 * t);
        }
        let e = |c: usize| format!("{ld}({base} + {}u * {stride})", 4 * t + c);
        format!("vec4<f32>({}, {}, {}, {})", e(0), e(1), e(2), e(3))
    };
    let init = each(&|t| {
        let q = quad(t, "ld_q", "qb", "cfg[11]");
        format!("    let q{t} = {q};\n    var a{t} = vec4<f32>(0.0);\n")
    });
    let dot = each(&|t| {
        format!(
            "        dv = dv + q{t} * {};\n",
            quad(t, "ld_k", "kr", "cfg[15]")
        )
    });
    let rescale = each(&|t| format!("            a{t} = a{t} * corr;\n"));
    let accumulate = each(&|t| {
        format!(
            "        a{t} = a{t} + p * {};\n",
            quad(t, "ld_v", "vr", "cfg[19]")
        )
    });
    let store = each(&|t| {
        ["x", "y", "z", "w"]
            .iter()
            .enumerate()
            .map(|(c, comp)| {
                format!(
                    "    st_out(ob + {}u * cfg[23], a{t}.{comp} * inv);\n",
                    4 * t + c
                )
            })
            .collect()
    });
    format!(
        "{init}    var m = neg_inf();
    var l = 0.0;
    for (var key = 0u; key < visible; key = key + 1u) {{
        let kr = kb + key * cfg[14];
        var dv = vec4<f32>(0.0);
{dot}        let sc = (dv.x + dv.y + dv.z + dv.w) * scale;
        if (sc > m) {{
            let corr = exp(m - sc);
            l = l * corr;
{rescale}            m = sc;
        }}
        let p = exp(sc - m);
        l = l + p;
        let vr = vb + key * cfg[18];
{accumulate}    }}
    let ob = b * cfg[20] + h * cfg[21] + i * cfg[22];
    var inv = 0.0;
    if (l > 0.0) {{ inv = 1.0 / l; }}
{store}"
    )
}

/// The largest head dim of the host form (its code grows with `d`).
const HOST_MAX_DIM: usize = 256;

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let Params::Attention { scale, causal } = *spec.params else {
        return Err(Error::Internal(format!(
            "attention: parameters {:?}",
            spec.params
        )));
    };
    let (q, k, v, o) = (
        &spec.inputs[0],
        &spec.inputs[1],
        &spec.inputs[2],
        &spec.outputs[0],
    );
    let sq = q.layout.shape();
    let (b, hq, lq, d) = (sq[0], sq[1], sq[2], sq[3]);
    let (hkv, lkv) = (k.layout.shape()[1], k.layout.shape()[2]);
    if d > DIMS_PER_ITEM * 256 {
        return Err(Error::unsupported(
            format!(
                "attention on wgpu with head dim {d} (at most {})",
                DIMS_PER_ITEM * 256
            ),
            DeviceKind::Wgpu,
        ));
    }
    let rows = b * hq * lq;
    let mut cfg = vec![
        rows as u32,
        hq as u32,
        lq.max(1) as u32,
        hkv.max(1) as u32,
        lkv as u32,
        d as u32,
        u32::from(causal),
        wgsl::f(scale),
    ];
    for t in [q, k, v, o] {
        cfg.extend(t.layout.strides().iter().map(|&s| s as u32));
    }
    let binds = [
        Bind::read("q", q.dtype),
        Bind::read("k", k.dtype),
        Bind::read("v", v.dtype),
        Bind::write("out", o.dtype),
    ];
    // The host form loops once per key; the GPU form, per block of 256 keys, over the head
    // dim, its reductions and the block's values for each of its 4 output dims.
    let host_dims = d % 4 == 0 && (4..=HOST_MAX_DIM).contains(&d);
    let blocks = (lkv as u64).div_ceil(256);
    let host = super::host_form(
        spec,
        host_dims.then_some(lkv as u64),
        d as u64 + blocks * (d as u64 + 4 * 256 + rowwise::WG_REDUCE_LOOPS),
        || format!("attention over {lkv} keys of dim {d}"),
    )?;
    let dialect = wgsl::Dialect::of(spec);
    let (source, grid) = if host {
        let body = format!("{HEAD}{}", host_body(d, false));
        let prelude = wgsl::prelude(&binds, dialect);
        let (source, grid) = rowwise::row_kernel(&prelude, &body, 1, rows, dialect);
        let mut src = OpSource::plain("attention", vec![(source, grid)], cfg);
        // k and v four elements at a time where their rows are contiguous quads, and through
        // textures where they are wholly contiguous (see `TexRead`): a decode step reads the
        // whole cache, each element a per-lane storage load on lavapipe otherwise.
        let quads = [k, v].iter().all(|t| {
            let st = t.layout.strides();
            st[3] == 1 && st[..3].iter().all(|s| s % 4 == 0)
        });
        if let Some(prelude) = quads
            .then(|| wgsl::prelude_mixed(&binds, &[false, true, true, false], dialect))
            .flatten()
        {
            let body = format!("{HEAD}{}", host_body(d, true));
            let (aligned, grid) = rowwise::row_kernel(&prelude, &body, 1, rows, dialect);
            let through: Vec<Option<TexturedRead>> = [None, Some(k), Some(v)]
                .iter()
                .map(|t| {
                    t.filter(|t| t.layout.is_contiguous())
                        .map(|t| TexturedRead::whole(t.layout.numel()))
                })
                .collect();
            let elements = k.layout.numel().min(v.layout.numel());
            src.textured = textures_for(&binds, &through, elements, 0).map(|t| {
                // The loads (not the prelude's `fn ld4_k`) read the textures.
                let read = aligned
                    .replace("ld4_k(kr", "tex4_k(kr")
                    .replace("ld4_v(vr", "tex4_v(vr");
                TexRead {
                    passes: vec![(format!("{read}{}", t.decls), grid)],
                    inputs: t.inputs,
                }
            });
            src.aligned = Some(vec![(aligned, grid)]);
        }
        return prepare_op(spec, src);
    } else {
        let prelude = format!("{}{GPU_SHARED}", wgsl::prelude(&binds, dialect));
        let body = format!("{HEAD}{GPU_BODY}");
        rowwise::row_kernel(&prelude, &body, rowwise::GPU_ROW_LANES, rows, dialect)
    };
    prepare_op(
        spec,
        OpSource::plain("attention", vec![(source, grid)], cfg),
    )
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    reg_all(reg, "attention", FLOATS, prepare);
}
