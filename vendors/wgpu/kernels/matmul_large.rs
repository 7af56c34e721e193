//! The GPU GEMM for large products: each 256-invocation workgroup computes a 128×128 tile of
//! C, each invocation an 8×8 block of it (two 4-row by two 4-column quads, 64 rows and 64
//! columns apart) held in sixteen `vec4` accumulators. A and B pass through workgroup memory
//! eight steps of k at a time, stored k-major as quads, so each step of k reads four `vec4`s
//! for 64 multiply-adds (the 64×64 kernel of `matmul.rs` reads eight scalars for 16); the next
//! eight steps are loaded from memory into registers while these are computed. Operands are
//! read in place through their strides, as in the 64×64 kernel, whose constants (`cfg`) and
//! store function this kernel shares.
//!
//! It is chosen when the product has enough 128×128 tiles to occupy a large GPU
//! ([`MIN_TILES`]); smaller products keep the 64×64 kernel, whose four times as many
//! workgroups spread over more of the GPU's multiprocessors.

use std::fmt::Write;

/// Rows and columns of C per workgroup.
pub(super) const TILE: usize = 128;

/// 128×128 tiles (over all batches) from which this kernel is chosen: about the number of
/// multiprocessors of a large GPU (an H100 has 132), so that none idles for want of a tile.
const MIN_TILES: usize = 128;

/// Whether an `m × n` product over `batch` batches takes this kernel (on a GPU).
pub(super) fn chosen(m: usize, n: usize, batch: usize) -> bool {
    m.div_ceil(TILE) * n.div_ceil(TILE) * batch.max(1) >= MIN_TILES
}

/// The rows (`i`) and columns (`j`) of an invocation's block, as WGSL expressions.
fn row(i: usize) -> String {
    format!("row0 + {}u + ty * 4u", (i / 4) * 64 + i % 4)
}

/// The kernel (`main`, then `store` right after it, as `with_epilogue` expects), generated
/// once: it is the same for every plan (its sizes are in `cfg`), and eager matmuls plan per call.
pub(super) fn kernel() -> &'static str {
    static KERNEL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    KERNEL.get_or_init(generate)
}

fn generate() -> String {
    let mut acc = String::new();
    let mut fma = String::new();
    let mut store = String::new();
    for i in 0..8 {
        let (a, lane) = (if i < 4 { "a0" } else { "a1" }, ["x", "y", "z", "w"][i % 4]);
        let _ = writeln!(
            acc,
            "    var c{i}0 = vec4<f32>(0.0);\n    var c{i}1 = vec4<f32>(0.0);"
        );
        let _ = writeln!(
            fma,
            "            c{i}0 = c{i}0 + {a}.{lane} * b0;\n            c{i}1 = c{i}1 + {a}.{lane} * b1;"
        );
        let _ = writeln!(
            store,
            "    store({r}, col0 + tx * 4u, cb, c{i}0, alpha, beta);\n    \
             store({r}, col0 + 64u + tx * 4u, cb, c{i}1, alpha, beta);",
            r = row(i)
        );
    }
    format!(
        "
var<workgroup> As: array<vec4<f32>, 256>;
var<workgroup> Bs: array<vec4<f32>, 256>;

// Element (r, c) of A / B in this batch, 0 outside the matrix.
fn tile_a(ab: u32, r: u32, c: u32) -> f32 {{
    if (r < cfg[0] && c < cfg[2]) {{ return ld_a(ab + r * cfg[4] + c * cfg[5]); }}
    return 0.0;
}}
fn tile_b(bb: u32, r: u32, c: u32) -> f32 {{
    if (r < cfg[2] && c < cfg[1]) {{ return ld_b(bb + r * cfg[6] + c * cfg[7]); }}
    return 0.0;
}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let m = cfg[0];
    let n = cfg[1];
    let k = cfg[2];
    let row0 = (wid.x / cfg[3]) * 128u;
    let col0 = (wid.x % cfg[3]) * 128u;
    let ab = view_off(wid.y, cfg[12]);
    let bb = view_off(wid.y, cfg[13]);
    let cb = view_off(wid.y, cfg[14]);
    let tx = lid % 16u;
    let ty = lid / 16u;
    // What this invocation loads: the quad of A's rows 4·qa.. at step ka, and of B's
    // columns 4·qb.. at step kb (consecutive invocations read consecutive elements of a
    // row-major A and B).
    let qa = lid / 8u;
    let ka = lid % 8u;
    let kb = lid / 32u;
    let qb = lid % 32u;
    let ra0 = row0 + qa * 4u;
    let cb0 = col0 + qb * 4u;
{acc}    var la = vec4<f32>(tile_a(ab, ra0, ka), tile_a(ab, ra0 + 1u, ka), tile_a(ab, ra0 + 2u, ka), tile_a(ab, ra0 + 3u, ka));
    var lb = vec4<f32>(tile_b(bb, kb, cb0), tile_b(bb, kb, cb0 + 1u), tile_b(bb, kb, cb0 + 2u), tile_b(bb, kb, cb0 + 3u));
    for (var k0 = 0u; k0 < k; k0 = k0 + 8u) {{
        As[ka * 32u + qa] = la;
        Bs[kb * 32u + qb] = lb;
        workgroupBarrier();
        // The next eight steps, from memory while these are computed.
        let k1 = k0 + 8u;
        if (k1 < k) {{
            la = vec4<f32>(tile_a(ab, ra0, k1 + ka), tile_a(ab, ra0 + 1u, k1 + ka), tile_a(ab, ra0 + 2u, k1 + ka), tile_a(ab, ra0 + 3u, k1 + ka));
            lb = vec4<f32>(tile_b(bb, k1 + kb, cb0), tile_b(bb, k1 + kb, cb0 + 1u), tile_b(bb, k1 + kb, cb0 + 2u), tile_b(bb, k1 + kb, cb0 + 3u));
        }}
        for (var kk = 0u; kk < 8u; kk = kk + 1u) {{
            let a0 = As[kk * 32u + ty];
            let a1 = As[kk * 32u + ty + 16u];
            let b0 = Bs[kk * 32u + tx];
            let b1 = Bs[kk * 32u + tx + 16u];
{fma}        }}
        workgroupBarrier();
    }}
    let alpha = cfg_f(10u);
    let beta = cfg_f(11u);
{store}}}

fn store(r: u32, c0: u32, cb: u32, v: vec4<f32>, alpha: f32, beta: f32) {{
    if (r >= cfg[0]) {{ return; }}
    for (var j = 0u; j < 4u; j = j + 1u) {{
        let c = c0 + j;
        if (c < cfg[1]) {{
            let o = cb + r * cfg[8] + c * cfg[9];
            var y = alpha * v[j];
            if (beta != 0.0) {{ y = y + beta * ld_c(o); }}
            st_c(o, y);
        }}
    }}
}}
"
    )
}

/// The epilogue's loop over the invocation's 64 elements of C (see `with_epilogue`).
pub(super) const EPILOGUE_TILE: &str = "    for (var t = 0u; t < 64u; t = t + 1u) {
        let i = t / 8u;
        let j = t % 8u;
        let r = row0 + (i / 4u) * 64u + ty * 4u + i % 4u;
        let c = col0 + (j / 4u) * 64u + tx * 4u + j % 4u;
        if (r < m && c < n) {
            let o = cb + r * cfg[8] + c * cfg[9];
            st_c(o, epi(r, c, ld_c(o)));
        }
    }
";
