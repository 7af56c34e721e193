//! The GEMM's forms for adapters that emulate a GPU on the host's cores (lavapipe,
//! llvmpipe): the barrier-free scalar kernel ([`KERNEL_HOST`]), and where the layouts allow,
//! the quad variants — row-major B ([`host_quads`], with B, A and an epilogue's extra
//! operands read through textures where they can be) and B with contiguous columns
//! ([`host_nt`]). `super::matmul` plans the product and picks among them; the constants
//! (`cfg`) are its.

use super::matmul::{with_epilogue, Epilogue, EXTRAS};
use super::op::{PassSources, TexInput, TexRead};
use super::wgsl::{self, Bind};
use crate::ops::PlanSpec;

/// The same GEMM for adapters that emulate a GPU on the host's cores (lavapipe, llvmpipe):
/// there a workgroup barrier spills every invocation's registers, so this variant has none.
/// Each 64-invocation workgroup computes 4 rows × 256 columns of C straight from A and B
/// (the CPU's caches do what workgroup memory does on a GPU): per step of k, the 4 A values
/// are the same for the whole workgroup and the B values are consecutive across
/// invocations, so the driver's SIMD lanes load both as vectors.
const KERNEL_HOST: &str = "
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let m = cfg[0];
    let n = cfg[1];
    let k = cfg[2];
    let row0 = (wid.x / cfg[3]) * 4u;
    let col0 = (wid.x % cfg[3]) * 256u + lid;
    let ab = view_off(wid.y, cfg[12]);
    let bb = view_off(wid.y, cfg[13]);
    let cb = view_off(wid.y, cfg[14]);
    let ars = cfg[4]; let acs = cfg[5];
    let brs = cfg[6]; let bcs = cfg[7];
    // Rows and columns past the edge read row / column 0 and are not stored.
    let r0 = select(0u, row0, row0 < m);
    let r1 = select(0u, row0 + 1u, row0 + 1u < m);
    let r2 = select(0u, row0 + 2u, row0 + 2u < m);
    let r3 = select(0u, row0 + 3u, row0 + 3u < m);
    let q0 = select(0u, col0, col0 < n);
    let q1 = select(0u, col0 + 64u, col0 + 64u < n);
    let q2 = select(0u, col0 + 128u, col0 + 128u < n);
    let q3 = select(0u, col0 + 192u, col0 + 192u < n);
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    for (var kk = 0u; kk < k; kk = kk + 1u) {
        let ak = ab + kk * acs;
        let a = vec4<f32>(ld_a(ak + r0 * ars), ld_a(ak + r1 * ars), ld_a(ak + r2 * ars), ld_a(ak + r3 * ars));
        let bk = bb + kk * brs;
        let b = vec4<f32>(ld_b(bk + q0 * bcs), ld_b(bk + q1 * bcs), ld_b(bk + q2 * bcs), ld_b(bk + q3 * bcs));
        c0 = c0 + a.x * b;
        c1 = c1 + a.y * b;
        c2 = c2 + a.z * b;
        c3 = c3 + a.w * b;
    }
    let alpha = cfg_f(10u);
    let beta = cfg_f(11u);
    store(row0, col0, cb, c0, alpha, beta);
    store(row0 + 1u, col0, cb, c1, alpha, beta);
    store(row0 + 2u, col0, cb, c2, alpha, beta);
    store(row0 + 3u, col0, cb, c3, alpha, beta);
}

fn store(r: u32, c0: u32, cb: u32, v: vec4<f32>, alpha: f32, beta: f32) {
    if (r >= cfg[0]) { return; }
    for (var j = 0u; j < 4u; j = j + 1u) {
        let c = c0 + j * 64u;
        if (c < cfg[1]) {
            let o = cb + r * cfg[8] + c * cfg[9];
            var y = alpha * v[j];
            if (beta != 0.0) { y = y + beta * ld_c(o); }
            st_c(o, y);
        }
    }
}
";

/// [`KERNEL_HOST`] for B's column stride `bcs` and C's `n` columns: with unit column strides
/// and whole 256-column tiles written as such, so the driver sees loads consecutive across
/// invocations (vector loads, not gathers).
pub(super) fn scalar_kernel(bcs: u32, n: usize) -> String {
    let mut kernel = KERNEL_HOST.to_string();
    if bcs == 1 {
        kernel = kernel.replace(" * bcs)", ")");
    }
    if n.is_multiple_of(256) {
        for (q, off) in [
            ("q0", ""),
            ("q1", " + 64u"),
            ("q2", " + 128u"),
            ("q3", " + 192u"),
        ] {
            kernel = kernel.replace(
                &format!("let {q} = select(0u, col0{off}, col0{off} < n);"),
                &format!("let {q} = col0{off};"),
            );
        }
    }
    kernel
}

/// The host GEMM's quad variant, for operands whose rows are contiguous and whose row
/// strides, k and n are multiples of four (see [`super::op::OpSource::aligned`]): each invocation
/// computes `tile.rows` rows × `tile.quads` quads of columns of C, reading A four values of k
/// at a time and B and C four columns at a time, so the driver issues one wide load where the
/// scalar variant issues four (on lavapipe a load costs far more than a multiply-add: this is
/// what the GEMM's speed is made of, ≈ 6× the scalar variant at 512³). `tile.lanes`
/// invocations side by side ([`host_quad_width`]) cover `4·quads·lanes` columns; `cfg[15]` is
/// the number of such column tiles.
///
/// With `tex.b`, B is read through the texture `tex_b` (see [`super::op::TexRead`]), which
/// holds B's single matrix: one texel per quad, `(quad, row of k)`, turned into four f32
/// values by `texel_f32` (see [`super::op::texel`]). With `tex.a` too, A is read through
/// `tex_a`, which holds A's rows (batch after batch): `(quad of k, batch · m + row)`.
fn host_quad_kernel(tile: QuadTile, c_slot: usize, tex: &Textures) -> String {
    let QuadTile {
        rows,
        lanes: w,
        quads: v,
    } = tile;
    let mut s = format!(
        "
@compute @workgroup_size({w})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let m = cfg[0];
    let n4 = cfg[1] / 4u;
    let k4 = cfg[2] / 4u;
    let row0 = (wid.x / cfg[15]) * {rows}u;
    let cq = (wid.x % cfg[15]) * {cols4}u + lid;
    let ab = view_off(wid.y, cfg[12]);
    let bb = view_off(wid.y, cfg[13]);
    let cb = view_off(wid.y, cfg[14]);
    let ars = cfg[4];
    let brs = cfg[6];
    // Rows and column quads past the edge read the last row / quad 0 and are not stored.
    let last = max(m, 1u) - 1u;
",
        cols4 = v * w as usize
    );
    for r in 0..rows {
        s += &if tex.a {
            format!("    let ta{r} = wid.y * m + min(row0 + {r}u, last);\n")
        } else {
            format!("    let pa{r} = (imm.o0 + ab + min(row0 + {r}u, last) * ars) >> 2u;\n")
        };
    }
    for q in 0..v {
        let off = q * w as usize;
        s += &if tex.b {
            format!("    let q{q} = cq + {off}u;\n    let tq{q} = select(0u, q{q}, q{q} < n4);\n")
        } else {
            format!("    let q{q} = cq + {off}u;\n    let pb{q} = ((imm.o1 + bb) >> 2u) + select(0u, q{q}, q{q} < n4);\n")
        };
    }
    for r in 0..rows {
        for q in 0..v {
            s += &format!("    var c{r}_{q} = vec4<f32>(0.0);\n");
        }
    }
    s += "    let bstep = brs >> 2u;\n    var ob = 0u;\n    for (var kq = 0u; kq < k4; kq = kq + 1u) {\n";
    for r in 0..rows {
        s += &if tex.a {
            format!("        let a{r} = texel_f32(textureLoad(tex_a, vec2<u32>(kq, ta{r}), 0));\n")
        } else {
            format!("        let a{r} = ldq_a(pa{r} + kq);\n")
        };
    }
    for (kx, comp) in ["x", "y", "z", "w"].iter().enumerate() {
        for q in 0..v {
            s += &if tex.b {
                format!("        let b{kx}_{q} = texel_f32(textureLoad(tex_b, vec2<u32>(tq{q}, kq * 4u + {kx}u), 0));\n")
            } else {
                format!("        let b{kx}_{q} = ldq_b(pb{q} + ob + {kx}u * bstep);\n")
            };
        }
        for r in 0..rows {
            for q in 0..v {
                s += &format!("        c{r}_{q} = c{r}_{q} + a{r}.{comp} * b{kx}_{q};\n");
            }
        }
    }
    s += "        ob = ob + 4u * bstep;\n    }\n    let alpha = cfg_f(10u);\n    let beta = cfg_f(11u);\n";
    for r in 0..rows {
        s += &format!(
            "    if (row0 + {r}u < m) {{\n        let pc = imm.o{c_slot} + cb + (row0 + {r}u) * cfg[8];\n"
        );
        for q in 0..v {
            s += &format!(
                "        if (q{q} < n4) {{ store4(pc + q{q} * 4u, c{r}_{q}, alpha, beta); }}\n"
            );
        }
        s += "    }\n";
    }
    s += "}

fn store4(e: u32, v: vec4<f32>, alpha: f32, beta: f32) {
    var y = alpha * v;
    if (beta != 0.0) { y = y + beta * ldq_c(e >> 2u); }
    stq_c(e >> 2u, y);
}
";
    s
}

/// Invocations per workgroup of the host GEMM's quad variant: 16, or 8 (one SIMD batch on
/// lavapipe) when workgroups of 16 would be fewer than twice the host's cores. A workgroup
/// runs on one core, so a product of few column tiles — a decode step's 1 × 256 × 256 GEMV
/// is one workgroup of 16 — leaves cores idle. On lavapipe (Intel Xeon, 2 cores, four
/// alternated runs) the tiny model's GEMVs (n of 256–1024) ran 1.05–1.4× faster by the
/// median and 1.1–1.7× by the fastest run, and a batched 4 × 64 × 32 product 2.4×; products
/// of many tiles keep 16 (the last session found 8 flat on them).
fn host_quad_width(tiles_16: usize) -> u32 {
    if tiles_16 < 2 * super::host_cores() {
        8
    } else {
        16
    }
}

/// The C tile one invocation of the host GEMM's quad variant computes, and how many
/// invocations a workgroup holds.
#[derive(Clone, Copy, Debug)]
struct QuadTile {
    /// Rows of C per invocation (1, 2, 4, 8 or 16).
    rows: usize,
    /// Invocations per workgroup, side by side along C's columns ([`host_quad_width`]).
    lanes: u32,
    /// Quads of columns per invocation, `lanes` quads apart ([`quads_per_lane`]).
    quads: usize,
}

/// Quads of C's columns per invocation of the host GEMM's quad variant, for `rows` rows per
/// invocation, rows of C of `n4` quads and `lanes` invocations per workgroup.
///
/// - Products of fewer than 16 rows (a decode step's GEMVs) take one: on lavapipe (AMD EPYC,
///   2 cores, plans of both kinds alternated in one process) a 1 × 4096 × 4096 f32 GEMV ran
///   in 7.9–8.8 ms against 18.7–19.9 with four, 4 × 4096 × 4096 in 14.5–15.5 against
///   21.5–24.9, 1 × 2048 × 11008 in 11.5–14.4 against 20–38; bf16 1.3–2×; at 1–4 MiB
///   matrices the two ran alike. There every load feeds one row's multiply-adds, and narrower
///   column strips per workgroup read B's texture faster.
/// - Of 16 rows, four (the GEMM's 16 × 16 tile, which reuses every B load 16 times: 64 ×
///   256 × 1024 and 256³ ran 5–40 % slower with one), unless fewer already cover the row: a
///   quad past the row's end is still loaded (from quad 0) and multiplied, only not stored.
fn quads_per_lane(rows: usize, n4: usize, lanes: u32) -> usize {
    if rows < 16 {
        1
    } else {
        n4.div_ceil(lanes as usize).clamp(1, 4)
    }
}

/// Which operands the host GEMM's quad variant reads through textures (A and the epilogue's
/// extra operands only beside B): B's texture is bound first, then A's, then the extras'.
#[derive(Clone, Debug, Default)]
struct Textures {
    b: bool,
    a: bool,
    /// The epilogue's extra operands read through textures: (index among the extras, whether
    /// the texture holds one row per row of C; else one row broadcast over them).
    extras: Vec<(usize, bool)>,
}

/// The quad variant's complete source for `rows` rows per invocation (reading B, and A,
/// through textures as `tex` says: B's at the first texture binding, A's at the second).
fn host_quad_source(
    tile: QuadTile,
    binds: &[Bind],
    epi: Option<&Epilogue>,
    tex: &Textures,
) -> Option<String> {
    let c_slot = binds.len() - 1;
    let mut kernel = host_quad_kernel(tile, c_slot, tex);
    if tex.b {
        let slot = super::op::texture_binding(binds.len(), 0);
        let t = super::op::texel(binds[1].dtype)?;
        let (ty, texel_ty, to_f32) = (t.texture_type, t.load_type, t.to_f32);
        kernel = format!(
            "@group(0) @binding({slot}) var tex_b: {ty};\n\
             fn texel_f32(t: {texel_ty}) -> vec4<f32> {{ return {to_f32}; }}\n{kernel}"
        );
        // One conversion serves all: A, B and the extras read so share a dtype.
        let mut slot = 1;
        if tex.a {
            let binding = super::op::texture_binding(binds.len(), slot);
            kernel = format!("@group(0) @binding({binding}) var tex_a: {ty};\n{kernel}");
            slot += 1;
        }
        for (q, _) in &tex.extras {
            let binding = super::op::texture_binding(binds.len(), slot);
            kernel = format!("@group(0) @binding({binding}) var tex_e{q}: {ty};\n{kernel}");
            slot += 1;
        }
    }
    let mut extra = String::new();
    if let Some(e) = epi {
        let stores = format!(
            "    for (var t = 0u; t < {n}u; t = t + 1u) {{
        let r = row0 + t / {v}u;
        let q = cq + (t % {v}u) * {w}u;
        if (r < m && q < n4) {{
            let e = (imm.o{c_slot} + cb + r * cfg[8] + q * 4u) >> 2u;
            stq_c(e, epi4(r, q * 4u, ldq_c(e)));
        }}
    }}
",
            n = tile.rows * tile.quads,
            v = tile.quads,
            w = tile.lanes,
        );
        kernel = with_epilogue(&kernel, &stores);
        extra = e.quad.clone();
        // Each extra read through a texture: its quad load at (r, c) becomes a texel load.
        for (q, per_row) in &tex.extras {
            let name = EXTRAS[*q];
            let line = format!("    let v{q} = ld4_{name}(");
            let start = extra.find(&line)?;
            let end = start + extra[start..].find('\n')? + 1;
            let row = if *per_row { "r" } else { "0u" };
            extra.replace_range(
                start..end,
                &format!(
                    "    let v{q} = texel_f32(textureLoad(tex_e{q}, vec2<u32>(c >> 2u, {row}), 0));\n"
                ),
            );
        }
    }
    Some(format!("{}{kernel}{extra}", wgsl::prelude_quads(binds)?))
}

/// Whether `d` can be read a quad at a time along axis `unit` (unit stride there, every other
/// stride a multiple of four; `None`: no such axis).
fn quad_strides(d: &crate::ops::TensorDesc, unit: Option<usize>) -> bool {
    let st = d.layout.strides();
    unit.is_some_and(|u| {
        st.iter()
            .enumerate()
            .all(|(i, s)| if i == u { *s == 1 } else { s.is_multiple_of(4) })
    })
}

/// A product's sizes: `batch` products of `m` × `k` by `k` × `n`.
#[derive(Clone, Copy)]
pub(super) struct Product {
    pub(super) batch: usize,
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
}

/// The host GEMM's quad variant for this plan, when its layouts allow one (f32, f16 or
/// bf16): A, B and C with unit column strides, and row strides, batch strides, k and n all
/// multiples of four (so every row of A, B and C starts and ends on a quad boundary once the
/// tensor's own start is on one, which the launch checks). An epilogue's extra operands may
/// have any layout. Sets `cfg[15]`.
///
/// With it, for products whose B is one matrix (no batch of its own), the variant that reads
/// B through a texture ([`super::op::TexRead`]): loads, not multiply-adds, are what the
/// product costs there (512³ f32 ran 1.7× faster, 1×4096×4096 2×). A is read through a
/// texture too when it is contiguous with a batch of its own for each of C's and rows that
/// are 256-byte multiples (a texture copy's pitch) — of any number of rows: a decode GEMV
/// reloads its one row of A beside every four texels of B, and there the storage loads of A
/// were about a third of the kernel's time (the tiny model's replayed decode step on
/// lavapipe: 2.26–2.80 → 2.03–2.08 ms, fastest of 300, four alternated runs).
pub(super) fn host_quads(
    spec: &PlanSpec<'_>,
    cfg: &mut [u32],
    Product { batch, m, n, k }: Product,
    binds: &[Bind],
    epi: Option<&Epilogue>,
) -> Option<(PassSources, Option<TexRead>)> {
    let fits = k.is_multiple_of(4)
        && n.is_multiple_of(4)
        && spec.inputs[..2]
            .iter()
            .chain(spec.outputs)
            .all(|d| quad_strides(d, d.layout.ndim().checked_sub(1)));
    if !fits {
        return host_nt(spec, cfg, Product { batch, m, n, k }, binds, epi);
    }
    let rows = if m >= 16 {
        16
    } else {
        m.max(1).next_power_of_two()
    };
    let row_tiles = m.div_ceil(rows).max(1);
    let w = host_quad_width(row_tiles * n.div_ceil(256).max(1) * batch.max(1));
    let tile = QuadTile {
        rows,
        lanes: w,
        quads: quads_per_lane(rows, n / 4, w),
    };
    let cols = 4 * tile.quads * w as usize;
    let tiles_n = n.div_ceil(cols).max(1);
    let tiles = row_tiles * tiles_n;
    if tiles > 65535 {
        return None;
    }
    cfg[15] = tiles_n as u32;
    let grid = [tiles as u32, batch.max(1) as u32, 1];
    let b = &spec.inputs[1];
    let b_matrices: usize = b.layout.shape()[..b.layout.ndim() - 2].iter().product();
    let textured = if b_matrices == 1 {
        let brs = b.layout.strides()[b.layout.ndim() - 2];
        let a = &spec.inputs[0];
        let a_matrices: usize = a.layout.shape()[..a.layout.ndim() - 2].iter().product();
        let a_rows = a_matrices * m;
        let tex_a = a.layout.is_contiguous()
            && a_matrices == batch.max(1)
            && a.dtype == b.dtype
            && (k * a.dtype.size()).is_multiple_of(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT as usize)
            && a_rows <= super::op::PLANNED_TEXTURE_DIM as usize;
        let tex = Textures {
            b: true,
            a: tex_a,
            extras: if batch.max(1) == 1 {
                textured_extras(spec, m, n)
            } else {
                Vec::new()
            },
        };
        match (
            u32::try_from(n / 4),
            u32::try_from(k),
            u32::try_from(a_rows),
        ) {
            (Ok(width), Ok(height), Ok(a_height)) => {
                host_quad_source(tile, binds, epi, &tex).map(|source| {
                    let mut inputs = vec![TexInput {
                        input: 1,
                        width,
                        height,
                        last_width: width,
                        row_stride: brs as u64,
                        // B is most often a weight: the same matrix launch after launch.
                        reusable: true,
                    }];
                    if tex_a {
                        inputs.push(TexInput {
                            input: 0,
                            width: height / 4,
                            height: a_height,
                            last_width: height / 4,
                            row_stride: k as u64,
                            reusable: false,
                        });
                    }
                    for &(q, per_row) in &tex.extras {
                        inputs.push(TexInput {
                            input: 2 + q,
                            width,
                            height: if per_row { m as u32 } else { 1 },
                            last_width: width,
                            row_stride: n as u64,
                            // A bias row is a weight; a residual is an activation.
                            reusable: !per_row,
                        });
                    }
                    TexRead {
                        inputs,
                        passes: vec![(source, grid)],
                    }
                })
            }
            _ => None,
        }
    } else {
        None
    };
    Some((
        vec![(
            host_quad_source(tile, binds, epi, &Textures::default())?,
            grid,
        )],
        textured,
    ))
}

/// The host GEMM's quad variant for a B whose columns are contiguous — `x · wᵀ` with `w`
/// stored `[n, k]` (a framework's linear weight), or attention's `q · kᵀ` — where the
/// row-major variant does not apply and the scalar one read B an element at a time (a
/// 1 × 4096 × 4096 GEMV 2.8× slower than with B row-major on lavapipe, 64 × 1024 × 1024
/// 6.7×). Each invocation computes up to 4 rows × 4 columns of C as dot products along k,
/// reading A's rows and B's columns a quad of k at a time into vec4 partial sums (summed
/// across at the end), and stores a quad of C per row. For A, C with unit column strides,
/// B with a unit row stride, every other stride, k and n multiples of four; an epilogue is
/// applied to each stored quad as the row-major variant does (read back, then `epi4`), so
/// fused and unfused stay bitwise equal. `cfg[15]` is the number of column tiles.
fn host_nt(
    spec: &PlanSpec<'_>,
    cfg: &mut [u32],
    Product { batch, m, n, k }: Product,
    binds: &[Bind],
    epi: Option<&Epilogue>,
) -> Option<(PassSources, Option<TexRead>)> {
    let (a, b, c) = (&spec.inputs[0], &spec.inputs[1], &spec.outputs[0]);
    let last = |d: &crate::ops::TensorDesc| d.layout.ndim().checked_sub(1);
    let fits = k.is_multiple_of(4)
        && n.is_multiple_of(4)
        && quad_strides(a, last(a))
        && quad_strides(b, b.layout.ndim().checked_sub(2))
        && quad_strides(c, last(c));
    if !fits {
        return None;
    }
    let rows = m.clamp(1, 4).next_power_of_two();
    let row_tiles = m.div_ceil(rows).max(1);
    let w = host_quad_width(row_tiles * n.div_ceil(64).max(1) * batch.max(1));
    let tiles_n = n.div_ceil(4 * w as usize).max(1);
    let tiles = row_tiles * tiles_n;
    if tiles > 65535 {
        return None;
    }
    cfg[15] = tiles_n as u32;
    let c_slot = binds.len() - 1;
    let set_bi = if epi.is_some() {
        "\n    bi = wid.y;"
    } else {
        ""
    };
    let mut k_src = format!(
        "
@compute @workgroup_size({w})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let m = cfg[0];
    let n = cfg[1];
    let k4 = cfg[2] / 4u;
    let row0 = (wid.x / cfg[15]) * {rows}u;
    let c0 = ((wid.x % cfg[15]) * {w}u + lid) * 4u;
    let ab = view_off(wid.y, cfg[12]);
    let bb = view_off(wid.y, cfg[13]);
    let cb = view_off(wid.y, cfg[14]);{set_bi}
    // Rows past the edge read the last row, columns past it column 0; neither is stored.
    let last = max(m, 1u) - 1u;\n"
    );
    for r in 0..rows {
        k_src +=
            &format!("    let pa{r} = (imm.o0 + ab + min(row0 + {r}u, last) * cfg[4]) >> 2u;\n");
    }
    for j in 0..4 {
        k_src += &format!(
            "    let pb{j} = (imm.o1 + bb + select(0u, c0 + {j}u, c0 + {j}u < n) * cfg[7]) >> 2u;\n"
        );
    }
    for r in 0..rows {
        for j in 0..4 {
            k_src += &format!("    var s{r}_{j} = vec4<f32>(0.0);\n");
        }
    }
    k_src += "    for (var kq = 0u; kq < k4; kq = kq + 1u) {\n";
    for r in 0..rows {
        k_src += &format!("        let a{r} = ldq_a(pa{r} + kq);\n");
    }
    for j in 0..4 {
        k_src += &format!("        let b{j} = ldq_b(pb{j} + kq);\n");
    }
    for r in 0..rows {
        for j in 0..4 {
            k_src += &format!("        s{r}_{j} = s{r}_{j} + a{r} * b{j};\n");
        }
    }
    k_src += "    }\n    let alpha = cfg_f(10u);\n    let beta = cfg_f(11u);\n    if (c0 >= n) { return; }\n";
    for r in 0..rows {
        let dot = |j: usize| format!("dot(s{r}_{j}, vec4<f32>(1.0))");
        // With an epilogue, each stored quad is read back and transformed, as unfused.
        let epi_line = if epi.is_some() {
            format!("        stq_c(q, epi4(row0 + {r}u, c0, ldq_c(q)));\n")
        } else {
            String::new()
        };
        k_src += &format!(
            "    if (row0 + {r}u < m) {{\n        \
             let q = (imm.o{c_slot} + cb + (row0 + {r}u) * cfg[8] + c0) >> 2u;\n        \
             var y = alpha * vec4<f32>({}, {}, {}, {});\n        \
             if (beta != 0.0) {{ y = y + beta * ldq_c(q); }}\n        \
             stq_c(q, y);\n{epi_line}    }}\n",
            dot(0),
            dot(1),
            dot(2),
            dot(3)
        );
    }
    k_src += "}\n";
    let extra = epi.map_or("", |e| e.quad.as_str());
    let source = format!("{}{k_src}{extra}", wgsl::prelude_quads(binds)?);
    Some((vec![(source, [tiles as u32, batch.max(1) as u32, 1])], None))
}

/// The extra operands of a `matmul_epilogue` of one `m` × `n` product (no batch) that its
/// textured variant reads through textures: those of B's dtype whose rows are 256-byte
/// multiples and either contiguous `[m, n]` (a residual) or one row broadcast over C's (a
/// bias), as `(index among the extras, one row per row of C)`.
fn textured_extras(spec: &PlanSpec<'_>, m: usize, n: usize) -> Vec<(usize, bool)> {
    let (b, out) = (&spec.inputs[1], &spec.outputs[0]);
    let shape = out.layout.shape();
    let nd = shape.len();
    let pitch = n * b.dtype.size();
    if nd < 2
        || m > super::op::PLANNED_TEXTURE_DIM as usize
        || !pitch.is_multiple_of(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT as usize)
    {
        return Vec::new();
    }
    let extras = spec.inputs.get(2..).unwrap_or_default();
    extras
        .iter()
        .enumerate()
        .filter(|(_, e)| e.dtype == b.dtype)
        .filter_map(|(q, e)| {
            let l = e.layout.broadcast_to(shape).ok()?;
            let st = l.strides();
            if st[nd - 1] != 1 {
                None
            } else if st[..nd - 1].iter().all(|&s| s == 0) {
                Some((q, false))
            } else if e.layout.is_contiguous() && e.layout.numel() == m * n {
                Some((q, true))
            } else {
                None
            }
        })
        .collect()
}
