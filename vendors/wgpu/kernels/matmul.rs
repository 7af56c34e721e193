//! `C = alpha·A·B + beta·C` (batched, broadcast batch dimensions, any strides) in WGSL: a
//! tiled GEMM. Each 16×16 workgroup computes a 64×64 tile of C, each invocation a 4×4 block
//! held in registers; A and B stream through workgroup memory 16 columns / rows at a time,
//! read in place through their strides. The batch index is the grid's second dimension.
//!
//! Products with enough tiles to fill a large GPU take the 128×128 kernel of
//! [`large`] instead, and f16 / f32 products on an adapter whose cooperative matrices are
//! enabled (opt-in) the kernel of [`coop`], with or without an epilogue.
//!
//! On adapters that run on the host's cores a barrier-free variant is chosen at plan time,
//! and with it, where the layouts allow, a quad variant that launches whose operands start
//! on a multiple of four elements take: both in [`host`].
//!
//! Constants: `cfg[0..3]` m, n, k; `cfg[3]` tiles along n; `cfg[4..10]` the row and column
//! strides of A, B and C; `cfg[10]` / `cfg[11]` alpha and beta (f32 bits); `cfg[12..15]` where
//! the batch views of A, B and C start; `cfg[15]` the quad variant's tiles along n.

use std::sync::Arc;

use super::elementwise::MATH;
use super::matmul_coop as coop;
use super::matmul_host::{self as host, Product};
use super::matmul_large as large;
use super::op::{prepare as prepare_op, OpSource};
use super::wgsl::{self, Bind};
use super::{reg_all, FLOATS};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::ops::fused::FusedProgram;
use crate::ops::matmul::{MATMUL_EPILOGUE, MAX_EPILOGUE_OPERANDS};
use crate::ops::{Params, PlanSpec, PreparedKernel};

const TILE: usize = 64;

const KERNEL: &str = "
var<workgroup> As: array<f32, 1024>;
var<workgroup> Bs: array<f32, 1024>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let m = cfg[0];
    let n = cfg[1];
    let k = cfg[2];
    let row0 = (wid.x / cfg[3]) * 64u;
    let col0 = (wid.x % cfg[3]) * 64u;
    let ab = view_off(wid.y, cfg[12]);
    let bb = view_off(wid.y, cfg[13]);
    let cb = view_off(wid.y, cfg[14]);
    let ars = cfg[4]; let acs = cfg[5];
    let brs = cfg[6]; let bcs = cfg[7];
    // The 4×4 block as four row vectors (no private arrays: indexing one dynamically makes
    // LLVM-based drivers keep it in memory).
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < k; k0 = k0 + 16u) {
        for (var t = 0u; t < 4u; t = t + 1u) {
            let e = lid + t * 256u;
            // A: 64 rows × 16 columns, stored column-major; B: 16 rows × 64 columns.
            let ar = e / 16u; let ac = e % 16u;
            let gr = row0 + ar; let gk = k0 + ac;
            var av = 0.0;
            if (gr < m && gk < k) { av = ld_a(ab + gr * ars + gk * acs); }
            As[ac * 64u + ar] = av;
            let br = e / 64u; let bc = e % 64u;
            let gk2 = k0 + br; let gc = col0 + bc;
            var bv = 0.0;
            if (gk2 < k && gc < n) { bv = ld_b(bb + gk2 * brs + gc * bcs); }
            Bs[br * 64u + bc] = bv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk = kk + 1u) {
            let a = vec4<f32>(As[kk * 64u + l.y], As[kk * 64u + l.y + 16u], As[kk * 64u + l.y + 32u], As[kk * 64u + l.y + 48u]);
            let b = vec4<f32>(Bs[kk * 64u + l.x], Bs[kk * 64u + l.x + 16u], Bs[kk * 64u + l.x + 32u], Bs[kk * 64u + l.x + 48u]);
            c0 = c0 + a.x * b;
            c1 = c1 + a.y * b;
            c2 = c2 + a.z * b;
            c3 = c3 + a.w * b;
        }
        workgroupBarrier();
    }
    let alpha = cfg_f(10u);
    let beta = cfg_f(11u);
    store(row0 + l.y, col0 + l.x, cb, c0, alpha, beta);
    store(row0 + l.y + 16u, col0 + l.x, cb, c1, alpha, beta);
    store(row0 + l.y + 32u, col0 + l.x, cb, c2, alpha, beta);
    store(row0 + l.y + 48u, col0 + l.x, cb, c3, alpha, beta);
}

fn store(r: u32, c0: u32, cb: u32, v: vec4<f32>, alpha: f32, beta: f32) {
    if (r >= cfg[0]) { return; }
    for (var j = 0u; j < 4u; j = j + 1u) {
        let c = c0 + j * 16u;
        if (c < cfg[1]) {
            let o = cb + r * cfg[8] + c * cfg[9];
            var y = alpha * v[j];
            if (beta != 0.0) { y = y + beta * ld_c(o); }
            st_c(o, y);
        }
    }
}
";

/// Binding names of an epilogue's extra operands.
pub(super) const EXTRAS: [&str; MAX_EPILOGUE_OPERANDS] = ["e0", "e1", "e2", "e3"];

/// The WGSL of a `matmul_epilogue` program: `epi(r, c, y)` (scalar stores) and
/// `epi4(r, c, y)` (the quad variant's stores) return what is stored at row `r`, column `c`
/// of batch `bi` for the product `alpha·A·B` there (`y`). Both go through `epi_core`, the
/// program over the rounded product and the extra operands' values, in the fused
/// elementwise kernel's form (each step rounded as stored and opaque to the compiler), so
/// the result is bitwise the unfused operators'.
pub(super) struct Epilogue {
    /// `keep`, the steps, `epi_core` and `epi`.
    pub(super) scalar: String,
    /// `epi4` and its loads.
    pub(super) quad: String,
}

/// The kernel with an epilogue: the batch index kept in `bi`, and once the invocation has
/// stored its product, `tile` — a loop over the elements it stored that reads each back (in
/// the dtype, as the unfused operator reads it) and stores the epilogue's result there.
/// One loop, not one epilogue per store: drivers inline every call, and a copy per register
/// of the tile would multiply the shader's size (and its compile time) by up to 64.
pub(super) fn with_epilogue(kernel: &str, tile: &str) -> String {
    let end = kernel.rfind("\n}\n\nfn store").unwrap_or(kernel.len());
    format!("{}\n{tile}{}", &kernel[..end], &kernel[end..]).replace(
        "let cb = view_off(wid.y, cfg[14]);",
        "let cb = view_off(wid.y, cfg[14]);\n    bi = wid.y;",
    )
}

/// Builds the epilogue's WGSL and its constants (appended to `cfg`): the opaque zero, each
/// extra operand's row stride, column stride and batch view, and the steps' scalars.
fn epilogue(
    prog: &FusedProgram,
    extras: &[crate::ops::TensorDesc],
    out: &crate::ops::TensorDesc,
    cfg: &mut Vec<u32>,
) -> Result<Epilogue> {
    let shape = out.layout.shape();
    let nd = shape.len();
    let mask = cfg.len();
    cfg.push(0);
    let mut layouts = Vec::new();
    for e in extras {
        let l = e.layout.broadcast_to(shape)?;
        let st = l.strides();
        cfg.extend([st[nd - 2] as u32, st[nd - 1] as u32, 0]);
        layouts.push(l);
    }
    let (funcs, body) = super::fused::steps_wgsl(prog, mask)?;
    // The batch views last: they have no fixed slots.
    let mut offs = Vec::new();
    for (q, l) in layouts.iter().enumerate() {
        let slot = mask + 1 + 3 * q;
        cfg[slot + 2] = wgsl::push_view(cfg, &shape[..nd - 2], &l.strides()[..nd - 2]);
        offs.push((
            slot,
            format!("view_off(bi, cfg[{}u]) + r * cfg[{slot}u]", slot + 2),
        ));
    }
    let last = prog.steps.len() - 1;
    let params: String = (1..=extras.len()).map(|k| format!(", x{k}: f32")).collect();
    let common = format!(
        "\nvar<private> bi: u32;\n{MATH}\n{keep}{funcs}\
         fn epi_core(p: f32{params}) -> f32 {{\n    let x0 = keep(p);\n{body}    return t{last};\n}}\n",
        keep = super::fused::keep(out.dtype, mask)?,
    );
    let args: String = offs
        .iter()
        .enumerate()
        .map(|(q, (slot, off))| format!(", ld_{}({off} + c * cfg[{}u])", EXTRAS[q], slot + 1))
        .collect();
    let scalar =
        format!("{common}fn epi(r: u32, c: u32, y: f32) -> f32 {{ return epi_core(y{args}); }}\n");
    // The quad variant: an extra operand whose quads are aligned with C's is read a quad at
    // a time, any other one element at a time.
    let mut quad = String::from("fn epi4(r: u32, c: u32, y: vec4<f32>) -> vec4<f32> {\n");
    for (q, ((slot, off), l)) in offs.iter().zip(&layouts).enumerate() {
        let name = EXTRAS[q];
        let st = l.strides();
        if st[nd - 1] == 1 && st[..nd - 1].iter().all(|s| s.is_multiple_of(4)) {
            quad += &format!("    let v{q} = ld4_{name}({off} + c);\n");
        } else {
            quad += &format!(
                "    let b{q} = {off} + c * cfg[{cs}u];\n    let v{q} = vec4<f32>(pick_{name}(b{q}), \
                 pick_{name}(b{q} + cfg[{cs}u]), pick_{name}(b{q} + 2u * cfg[{cs}u]), \
                 pick_{name}(b{q} + 3u * cfg[{cs}u]));\n",
                cs = slot + 1
            );
        }
    }
    let lanes: Vec<String> = ["x", "y", "z", "w"]
        .iter()
        .map(|l| {
            let xs: String = (0..extras.len()).map(|q| format!(", v{q}.{l}")).collect();
            format!("epi_core(y.{l}{xs})")
        })
        .collect();
    quad += &format!("    return vec4<f32>({});\n}}\n", lanes.join(", "));
    for (q, name) in EXTRAS.iter().enumerate().take(extras.len()) {
        quad += &format!(
            "fn pick_{name}(i: u32) -> f32 {{ let e = imm.o{k} + i; return ldq_{name}(e >> 2u)[e & 3u]; }}\n",
            k = 2 + q
        );
    }
    Ok(Epilogue {
        scalar,
        quad: format!("{common}{quad}"),
    })
}

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let (alpha, beta, prog) = match spec.params {
        Params::Matmul { alpha, beta } => (*alpha, *beta, None),
        Params::MatmulEpilogue { alpha, program } => (*alpha, 0.0, Some(program.as_ref())),
        other => {
            return Err(Error::Internal(format!(
                "{}: parameters {other:?}",
                spec.op
            )))
        }
    };
    let (a, b, c) = (&spec.inputs[0], &spec.inputs[1], &spec.outputs[0]);
    let extras = &spec.inputs[2..];
    if extras.len() > EXTRAS.len() || (prog.is_none() && !extras.is_empty()) {
        return Err(Error::Internal(format!(
            "{}: {} extra operands",
            spec.op,
            extras.len()
        )));
    }
    let cs = c.layout.shape();
    let nd = cs.len();
    let (m, n) = (cs[nd - 2], cs[nd - 1]);
    let k = a.shape()[a.shape().len() - 1];
    let batch_shape = &cs[..nd - 2];
    let batch: usize = batch_shape.iter().product();
    // Products with an epilogue take the same kernel as without: the fused result is
    // bitwise the unfused operators'.
    let coop_plan = if a.dtype == b.dtype {
        coop_plan(spec, a.dtype)
            .filter(|p| super::check_loops(spec, p.loops(k) + 128, String::new).is_ok())
    } else {
        None
    };
    let host = coop_plan.is_none() && super::on_host_cores(spec);
    let large = !host && coop_plan.is_none() && large::chosen(m, n, batch);
    let (tile_m, tile_n) = if let Some(p) = &coop_plan {
        (p.tile(), p.tile())
    } else if host {
        (4, 256)
    } else if large {
        (large::TILE, large::TILE)
    } else {
        (TILE, TILE)
    };
    // Loop iterations per invocation: along k (one step per element on the host's cores,
    // a block of 16 or 8 with its inner loops on a GPU), then the stores and the epilogue.
    let k_loops = if let Some(p) = &coop_plan {
        p.loops(k)
    } else if host {
        k as u64
    } else if large {
        (k as u64).div_ceil(8) * 9
    } else {
        (k as u64).div_ceil(16) * 21
    };
    super::check_loops(spec, k_loops + 128, || format!("a product over k = {k}"))?;
    let tiles_n = n.div_ceil(tile_n).max(1);
    let tiles = m.div_ceil(tile_m).max(1) * tiles_n;
    if tiles > 65535 || batch > 65535 {
        return Err(Error::unsupported(
            format!("matmul on wgpu with {tiles} tiles of {tile_m}×{tile_n} and {batch} batches (at most 65535 each)"),
            DeviceKind::Wgpu,
        ));
    }
    let rc = |d: &crate::ops::TensorDesc| {
        let (s, st) = (d.layout.shape(), d.layout.strides());
        let r = s.len();
        (st[r - 2] as u32, st[r - 1] as u32)
    };
    let ((ars, acs), (brs, bcs), (crs, ccs)) = (rc(a), rc(b), rc(c));
    let mut cfg = vec![
        m as u32,
        n as u32,
        k as u32,
        tiles_n as u32,
        ars,
        acs,
        brs,
        bcs,
        crs,
        ccs,
        wgsl::f(alpha),
        wgsl::f(beta),
        0,
        0,
        0,
        0,
    ];
    let epi = match prog {
        Some(p) => Some(epilogue(p, extras, c, &mut cfg)?),
        None => None,
    };
    for (slot, d) in [(12, a), (13, b), (14, c)] {
        let r = d.layout.ndim();
        let s = wgsl::broadcast_strides(
            &d.layout.shape()[..r - 2],
            &d.layout.strides()[..r - 2],
            batch_shape,
        );
        cfg[slot] = wgsl::push_view(&mut cfg, batch_shape, &s);
    }
    let mut binds = vec![Bind::read("a", a.dtype), Bind::read("b", b.dtype)];
    for (name, e) in EXTRAS.iter().zip(extras) {
        binds.push(Bind::read(name, e.dtype));
    }
    binds.push(Bind::write("c", c.dtype));
    let mut kernel = if let Some(p) = &coop_plan {
        coop::kernel(p, epi.is_some())
    } else if host {
        host::scalar_kernel(bcs, n)
    } else if large {
        large::kernel().to_string()
    } else {
        KERNEL.to_string()
    };
    // The cooperative kernel runs the epilogue in its own stores; the tiled ones take a loop
    // over the invocation's stored elements.
    if epi.is_some() && coop_plan.is_none() {
        let tile = if large {
            large::EPILOGUE_TILE.to_string()
        } else {
            // The invocation's 4×4 elements: rows 16 (GPU) or 1 (host) apart, columns 16 or 64.
            let (dr, dc, r0, c0) = if host {
                (1, 64, "row0", "col0")
            } else {
                (16, 16, "row0 + l.y", "col0 + l.x")
            };
            format!(
                "    for (var t = 0u; t < 16u; t = t + 1u) {{
        let r = {r0} + (t / 4u) * {dr}u;
        let c = {c0} + (t % 4u) * {dc}u;
        if (r < m && c < n) {{
            let o = cb + r * cfg[8] + c * cfg[9];
            st_c(o, epi(r, c, ld_c(o)));
        }}
    }}
"
            )
        };
        kernel = with_epilogue(&kernel, &tile);
    }
    if let Some(e) = &epi {
        kernel += &e.scalar;
    }
    let source = format!(
        "{}{}{kernel}",
        coop_plan.as_ref().map_or("", coop::directive),
        wgsl::prelude(&binds, wgsl::Dialect::of(spec))
    );
    let quads = if host {
        host::host_quads(
            spec,
            &mut cfg,
            Product { batch, m, n, k },
            &binds,
            epi.as_ref(),
        )
    } else {
        None
    };
    let (aligned, textured) = quads.map_or((None, None), |(a, t)| (Some(a), t));
    prepare_op(
        spec,
        OpSource::variants(
            spec.op.to_string(),
            vec![(source, [tiles as u32, batch.max(1) as u32, 1])],
            cfg,
            aligned,
            textured,
        ),
    )
}

/// The cooperative-matrix plan for a product of `dtype` operands on the plan's device, if
/// its adapter has one ([`coop::choose`]).
fn coop_plan(spec: &PlanSpec<'_>, dtype: crate::tensor::DType) -> Option<coop::CoopPlan> {
    let rt = crate::Runtime::get(spec.device).ok()?;
    match &**rt.backend() {
        crate::vendors::AnyBackend::Wgpu(b) => coop::choose(
            b.coop_caps(),
            dtype,
            b.has_feature(wgpu::Features::SHADER_F16),
        ),
        _ => None,
    }
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    reg_all(reg, "matmul", FLOATS, prepare);
    reg_all(reg, MATMUL_EPILOGUE, FLOATS, prepare);
}
