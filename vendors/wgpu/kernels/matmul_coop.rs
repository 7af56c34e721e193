//! The GEMM on the adapter's matrix units: WGSL cooperative matrices (wgpu's
//! `EXPERIMENTAL_COOPERATIVE_MATRIX`: Vulkan's `VK_KHR_cooperative_matrix`, Metal's
//! simdgroup matrices), chosen per plan where the adapter offers a configuration for the
//! operands' dtype and the tiled kernel of [`super::matmul`] otherwise.
//!
//! Design, and why:
//! - **Only square configurations of size S = 16 or 8** (M = N = K = S), the ones naga's
//!   `coop_mat16x16` / `coop_mat8x8` types express; f16 operands with f32 accumulation
//!   (preferring 16, tensor cores' shape) or f32 operands with f32 accumulation; bf16 has no
//!   cooperative type and keeps the tiled kernel. The configuration is read from
//!   `Adapter::cooperative_matrix_properties()`, never assumed.
//! - **Operands through workgroup memory.** Each workgroup computes a 4S × 4S tile of C. A
//!   and B stream through workgroup arrays S columns / rows at a time, read in place through
//!   their strides and zero-padded past the edges exactly as the tiled kernel does, so any
//!   layout, batch broadcast and edge works and `coopLoadT` never reads past an array.
//! - **Four subgroups, any subgroup size.** The workgroup has 4 × the adapter's largest
//!   subgroup size invocations, so it holds at least four full subgroups; subgroup q < 4 owns
//!   a 2 × 2 block of S × S accumulators. Where subgroups are smaller than the largest size,
//!   the extra ones compute subgroup 3's block again and store it into a scratch area:
//!   cooperative operations must run in uniform control flow, so no subgroup skips them.
//! - **The product leaves through workgroup memory**: the accumulators are stored (f32) into
//!   a 4S × 4S array, then every invocation applies `alpha`, `beta` and the output dtype's
//!   rounding through the same stores as the other kernels, with bounds checks.
//! - **An emulated form for CI** (`UNIRT_WGPU_COOP=emulate`): the same kernel text with the
//!   four cooperative primitives replaced by WGSL that follows their definitions (row-major
//!   loads and stores with a stride, `C + A·B`), each subgroup a virtual one of 16
//!   invocations, each holding S²/16 elements of an accumulator. It runs on the software
//!   adapters, which have no matrix units, and checks everything but the primitives
//!   themselves: tiling, strides, edges, the subgroup assignment (eight virtual subgroups, so
//!   the extra-subgroup path runs too) and the stores.

use crate::tensor::DType;

/// The largest workgroup this kernel takes (4 × a subgroup of 64).
const MAX_WORKGROUP: u32 = 256;
/// Invocations per virtual subgroup in the emulated form.
const EMULATED_SUBGROUP: u32 = 16;
/// The emulated form's workgroup: eight virtual subgroups.
const EMULATED_WORKGROUP: u32 = 128;

/// What the adapter's cooperative matrices offer (read once when the device opens).
#[derive(Clone, Debug, Default)]
pub(crate) struct CoopCaps {
    /// Subgroup-scope configurations; empty without `EXPERIMENTAL_COOPERATIVE_MATRIX`.
    configs: Vec<wgpu::CooperativeMatrixProperties>,
    /// The adapter's largest subgroup size.
    subgroup_max: u32,
    /// Workgroup limits: invocations, x size, bytes of workgroup memory.
    max_invocations: u32,
    max_x: u32,
    max_shared: u32,
}

impl CoopCaps {
    /// The capabilities of an opened device (empty unless the device has the feature and
    /// subgroups: the kernel numbers its subgroups with `subgroup_id`).
    pub(crate) fn of(adapter: &wgpu::Adapter, device: &wgpu::Device) -> CoopCaps {
        let f = device.features();
        let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SUBGROUP;
        if !f.contains(needed) {
            return CoopCaps::default();
        }
        let l = device.limits();
        CoopCaps {
            configs: adapter.cooperative_matrix_properties(),
            subgroup_max: adapter.get_info().subgroup_max_size,
            max_invocations: l.max_compute_invocations_per_workgroup,
            max_x: l.max_compute_workgroup_size_x,
            max_shared: l.max_compute_workgroup_storage_size,
        }
    }
}

/// How a plan's product runs on cooperative matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CoopPlan {
    /// The matrices' size S (16 or 8).
    pub size: u32,
    /// Operands held as f16 (else f32) in workgroup memory and in the A / B matrices.
    pub f16: bool,
    /// Invocations per workgroup.
    pub workgroup: u32,
    /// The emulated form (no cooperative matrices; see the module docs).
    pub emulated: bool,
}

impl CoopPlan {
    /// The side of the workgroup's tile of C.
    pub fn tile(&self) -> usize {
        4 * self.size as usize
    }

    /// Bytes of workgroup memory: A and B tiles, the product and the scratch area.
    fn shared_bytes(&self) -> u32 {
        let s = self.size;
        let elem = if self.f16 && !self.emulated { 2 } else { 4 };
        2 * (4 * s * s) * elem + (16 * s * s + 4 * s * s) * 4
    }

    /// Loop iterations per invocation over `k` (for the software adapters' loop limiter):
    /// per step of S, the two fills, the emulated products and the stores' share.
    pub fn loops(&self, k: usize) -> u64 {
        let s = self.size as u64;
        let w = self.workgroup as u64;
        let fill = 2 * (4 * s * s).div_ceil(w);
        let products = if self.emulated {
            4 * (s * s / EMULATED_SUBGROUP as u64) * (s + 1)
        } else {
            0
        };
        (k as u64).div_ceil(s) * (fill + products + 1) + (16 * s * s).div_ceil(w) + 8
    }
}

/// `UNIRT_WGPU_COOP`: `1` asks for the feature (adapter.rs), `emulate` takes the emulated
/// form on every adapter.
fn emulating() -> bool {
    static EMULATE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *EMULATE.get_or_init(|| std::env::var("UNIRT_WGPU_COOP").is_ok_and(|v| v == "emulate"))
}

/// The cooperative plan for a product of `dtype` operands on `caps`' adapter (`native_f16`:
/// the adapter reads f16 natively), or None for the tiled kernel.
pub(super) fn choose(caps: &CoopCaps, dtype: DType, native_f16: bool) -> Option<CoopPlan> {
    if emulating() {
        return emulated_plan(dtype);
    }
    use wgpu::CooperativeScalarType as T;
    let ab = match dtype {
        DType::F16 if native_f16 => T::F16,
        DType::F32 => T::F32,
        _ => return None,
    };
    let workgroup = 4 * caps.subgroup_max;
    if caps.subgroup_max == 0
        || workgroup > MAX_WORKGROUP
        || workgroup > caps.max_invocations
        || workgroup > caps.max_x
    {
        return None;
    }
    [16, 8]
        .into_iter()
        .filter(|&s| {
            caps.configs.iter().any(|c| {
                (c.m_size, c.n_size, c.k_size) == (s, s, s)
                    && c.ab_type == ab
                    && c.cr_type == T::F32
            })
        })
        .map(|size| CoopPlan {
            size,
            f16: ab == T::F16,
            workgroup,
            emulated: false,
        })
        .find(|p| p.shared_bytes() <= caps.max_shared)
}

/// The emulated form's plan for `dtype`: f16 as 16 × 16 matrices, f32 as 8 × 8 ones (the
/// shapes NVIDIA's and Apple's adapters offer).
fn emulated_plan(dtype: DType) -> Option<CoopPlan> {
    let (size, f16) = match dtype {
        DType::F16 => (16, true),
        DType::F32 => (8, false),
        _ => return None,
    };
    Some(CoopPlan {
        size,
        f16,
        workgroup: EMULATED_WORKGROUP,
        emulated: true,
    })
}

/// The kernel's WGSL after the prelude (and, for the real form, the directive that enables
/// cooperative matrices, which must open the source: [`directive`]). Constants as the tiled
/// kernel's (`super::matmul`): `cfg[3]` is the tiles along n of this plan's tile.
///
/// With `epilogue`, each element is stored, read back and stored again through `epi` (the
/// matmul epilogue's program, `super::matmul::Epilogue::scalar`), exactly as the tiled
/// kernels' epilogue loop does, so the fused product is bitwise the unfused operators'.
pub(super) fn kernel(p: &CoopPlan, epilogue: bool) -> String {
    let s = p.size;
    let (bm, bk) = (4 * s, s);
    let w = p.workgroup;
    let t = if p.f16 && !p.emulated { "f16" } else { "f32" };
    let cs_len = 16 * s * s + 4 * s * s;
    let fill = (bm * bk).div_ceil(w);
    let out = (bm * bm).div_ceil(w);
    let (entry_extra, subgroup, zero, helpers) = if p.emulated {
        let e = s * s / EMULATED_SUBGROUP;
        (
            String::new(),
            format!(
                "let sg = lid / {EMULATED_SUBGROUP}u;\n    let lane = lid % {EMULATED_SUBGROUP}u;"
            ),
            format!("array<f32, {e}>()"),
            emulated_helpers(s, e),
        )
    } else {
        (
            ", @builtin(subgroup_id) sg_id: u32".to_string(),
            "let sg = sg_id;".to_string(),
            format!("coop_mat{s}x{s}<f32, C>()"),
            String::new(),
        )
    };
    // The cooperative primitives, or their emulation: a real load takes a pointer into the
    // tile, an emulated one keeps (offset, stride).
    let load = |role: &str, tile: &str, off: &str, stride: u32| {
        if p.emulated {
            format!("vec2<u32>({off}, {stride}u)")
        } else {
            format!("coopLoadT<coop_mat{s}x{s}<{t}, {role}>>(&{tile}[{off}], {stride}u)")
        }
    };
    let mma = |a: &str, b: &str, c: &str| {
        if p.emulated {
            format!("emu_mma({a}, {b}, {c}, lane)")
        } else {
            format!("coopMultiplyAdd({a}, {b}, {c})")
        }
    };
    let store = |c: &str, off: &str| {
        if p.emulated {
            format!("emu_store({c}, {off}, cst, lane);")
        } else {
            format!("coopStoreT({c}, &Cs[{off}], cst);")
        }
    };
    // The offsets are named first: naga 30's WGSL front end does not emit an index
    // expression written inside `coopStoreT`'s pointer, and its SPIR-V writer then panics.
    let stores = [
        format!("let o01 = base + {s}u;"),
        format!("let o10 = base + {s}u * cst;"),
        format!("let o11 = o10 + {s}u;"),
        store("c00", "base"),
        store("c01", "o01"),
        store("c10", "o10"),
        store("c11", "o11"),
    ]
    .join("\n    ");
    format!(
        "
var<workgroup> As: array<{t}, {a_len}>;
var<workgroup> Bs: array<{t}, {a_len}>;
var<workgroup> Cs: array<f32, {cs_len}>;
{helpers}
@compute @workgroup_size({w})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32{entry_extra}) {{
    {subgroup}
    let m = cfg[0];
    let n = cfg[1];
    let k = cfg[2];
    let row0 = (wid.x / cfg[3]) * {bm}u;
    let col0 = (wid.x % cfg[3]) * {bm}u;
    let ab = view_off(wid.y, cfg[12]);
    let bb = view_off(wid.y, cfg[13]);
    let cb = view_off(wid.y, cfg[14]);{bi}
    let ars = cfg[4]; let acs = cfg[5];
    let brs = cfg[6]; let bcs = cfg[7];
    // Subgroup q < 4 owns the 2×2 block of accumulators at rows tr, columns tc of the tile;
    // the others redo subgroup 3's (uniform control flow) and store it into the scratch area.
    let q = min(sg, 3u);
    let tr = (q / 2u) * {two_s}u;
    let tc = (q % 2u) * {two_s}u;
    var c00 = {zero};
    var c01 = {zero};
    var c10 = {zero};
    var c11 = {zero};
    for (var k0 = 0u; k0 < k; k0 = k0 + {bk}u) {{
        // A: {bm} rows × {bk} columns, B: {bk} rows × {bm} columns, both row-major, zero past
        // the edges.
        for (var i = 0u; i < {fill}u; i = i + 1u) {{
            let e = lid + i * {w}u;
            if (e < {a_len}u) {{
                let ar = e / {bk}u; let ac = e % {bk}u;
                let gr = row0 + ar; let gk = k0 + ac;
                var av = 0.0;
                if (gr < m && gk < k) {{ av = ld_a(ab + gr * ars + gk * acs); }}
                As[e] = {t}(av);
                let br = e / {bm}u; let bc = e % {bm}u;
                let gk2 = k0 + br; let gc = col0 + bc;
                var bv = 0.0;
                if (gk2 < k && gc < n) {{ bv = ld_b(bb + gk2 * brs + gc * bcs); }}
                Bs[e] = {t}(bv);
            }}
        }}
        workgroupBarrier();
        let a0 = {a0};
        let a1 = {a1};
        let b0 = {b0};
        let b1 = {b1};
        c00 = {m00};
        c01 = {m01};
        c10 = {m10};
        c11 = {m11};
        workgroupBarrier();
    }}
    let idle = sg > 3u;
    let base = select(tr * {bm}u + tc, {cs_tile}u, idle);
    let cst = select({bm}u, {two_s}u, idle);
    {stores}
    workgroupBarrier();
    let alpha = cfg_f(10u);
    let beta = cfg_f(11u);
    for (var i = 0u; i < {out}u; i = i + 1u) {{
        let e = lid + i * {w}u;
        let r = row0 + e / {bm}u;
        let c = col0 + e % {bm}u;
        if (e < {cs_tile}u && r < m && c < n) {{
            let o = cb + r * cfg[8] + c * cfg[9];
            var y = alpha * Cs[e];
            if (beta != 0.0) {{ y = y + beta * ld_c(o); }}
            st_c(o, y);{epi}
        }}
    }}
}}
",
        epi = if epilogue {
            "\n            st_c(o, epi(r, c, ld_c(o)));"
        } else {
            ""
        },
        bi = if epilogue { "\n    bi = wid.y;" } else { "" },
        a0 = load("A", "As", &format!("tr * {bk}u"), bk),
        a1 = load("A", "As", &format!("(tr + {s}u) * {bk}u"), bk),
        b0 = load("B", "Bs", "tc", bm),
        b1 = load("B", "Bs", &format!("tc + {s}u"), bm),
        m00 = mma("a0", "b0", "c00"),
        m01 = mma("a0", "b1", "c01"),
        m10 = mma("a1", "b0", "c10"),
        m11 = mma("a1", "b1", "c11"),
        a_len = bm * bk,
        two_s = 2 * s,
        cs_tile = bm * bm,
    )
}

/// The directive the real form's source opens with.
pub(super) fn directive(p: &CoopPlan) -> &'static str {
    if p.emulated {
        ""
    } else {
        "enable wgpu_cooperative_matrix;\n"
    }
}

/// The emulated primitives for S × S matrices, `e` elements per invocation of a virtual
/// subgroup: an A or B matrix is its (offset, stride) in `As` / `Bs` (row-major, as
/// `coopLoadT` reads it; the tiles do not change between the loads and the products), an
/// accumulator the elements `lane + j·16` (row-major) of C.
fn emulated_helpers(s: u32, e: u32) -> String {
    format!(
        "
fn emu_mma(a: vec2<u32>, b: vec2<u32>, c: array<f32, {e}>, lane: u32) -> array<f32, {e}> {{
    var r = c;
    for (var j = 0u; j < {e}u; j = j + 1u) {{
        let x = lane + j * {EMULATED_SUBGROUP}u;
        let row = x / {s}u;
        let col = x % {s}u;
        var acc = r[j];
        for (var kk = 0u; kk < {s}u; kk = kk + 1u) {{
            acc = acc + As[a.x + row * a.y + kk] * Bs[b.x + kk * b.y + col];
        }}
        r[j] = acc;
    }}
    return r;
}}
fn emu_store(c: array<f32, {e}>, off: u32, stride: u32, lane: u32) {{
    for (var j = 0u; j < {e}u; j = j + 1u) {{
        let x = lane + j * {EMULATED_SUBGROUP}u;
        Cs[off + (x / {s}u) * stride + x % {s}u] = c[j];
    }}
}}
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses and validates `src`, and writes it as SPIR-V (what wgpu hands a Vulkan driver).
    fn validate(src: &str, caps: naga::valid::Capabilities) -> Result<(), String> {
        let module = naga::front::wgsl::parse_str(src).map_err(|e| e.emit_to_string(src))?;
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .map_err(|e| format!("{e:?}"))?;
        let mut options = naga::back::spv::Options {
            lang_version: (1, 3),
            ..Default::default()
        };
        if caps.contains(naga::valid::Capabilities::COOPERATIVE_MATRIX) {
            let mut spv_caps = naga::FastHashSet::default();
            use naga::back::spv::Capability as K;
            for c in [
                K::Shader,
                K::Float16,
                K::StorageBuffer16BitAccess,
                K::GroupNonUniform,
                K::CooperativeMatrixKHR,
                K::VulkanMemoryModel,
            ] {
                spv_caps.insert(c);
            }
            options.capabilities = Some(spv_caps);
        }
        // wgpu's Vulkan backend restricts indices into arrays of known length (checked shader
        // modules, as unirt creates); unchecked too, as for trusted modules.
        use naga::proc::BoundsCheckPolicy as B;
        for (index, buffer) in [
            (B::Restrict, B::Unchecked),
            (B::Restrict, B::Restrict),
            (B::Unchecked, B::Unchecked),
        ] {
            options.bounds_check_policies = naga::proc::BoundsCheckPolicies {
                index,
                buffer,
                image_load: B::Unchecked,
                binding_array: B::Unchecked,
            };
            naga::back::spv::write_vec(&module, &info, &options, None)
                .map_err(|e| format!("SPIR-V ({index:?}, {buffer:?}): {e:?}"))?;
        }
        Ok(())
    }

    /// A stand-in for the prelude: the names the kernel calls.
    const PRELUDE: &str = "
@group(0) @binding(0) var<storage, read> cfg: array<u32>;
fn cfg_f(i: u32) -> f32 { return bitcast<f32>(cfg[i]); }
fn view_off(i: u32, d: u32) -> u32 { return i * cfg[d]; }
@group(0) @binding(1) var<storage, read_write> c: array<f32>;
fn ld_a(i: u32) -> f32 { return c[i]; }
fn ld_b(i: u32) -> f32 { return c[i]; }
fn ld_c(i: u32) -> f32 { return c[i]; }
fn st_c(i: u32, v: f32) { c[i] = v; }
";

    /// Every form of the kernel parses and validates with naga, the real ones with the
    /// capabilities the feature gives (uniform control flow around the cooperative
    /// operations included), the emulated ones with none.
    #[test]
    fn every_form_validates() {
        use naga::valid::Capabilities as C;
        for (size, f16) in [(16, true), (8, true), (8, false), (16, false)] {
            for workgroup in [128, 256] {
                let p = CoopPlan {
                    size,
                    f16,
                    workgroup,
                    emulated: false,
                };
                let src = format!(
                    "{}{}{PRELUDE}{}",
                    directive(&p),
                    if f16 { "enable f16;\n" } else { "" },
                    kernel(&p, false)
                );
                let caps = C::COOPERATIVE_MATRIX | C::SHADER_FLOAT16 | C::SUBGROUP;
                validate(&src, caps).unwrap_or_else(|e| panic!("{p:?}:\n{e}\n{src}"));
            }
        }
        for p in [DType::F16, DType::F32]
            .into_iter()
            .filter_map(emulated_plan)
        {
            let src = format!("{PRELUDE}{}", kernel(&p, false));
            validate(&src, naga::valid::Capabilities::empty())
                .unwrap_or_else(|e| panic!("{p:?}:\n{e}\n{src}"));
        }
    }

    /// The choice follows the adapter's configurations: f16 prefers 16, f32 takes what it
    /// has, bf16 and configurations with an f16 accumulator never take the kernel.
    #[test]
    fn choice_follows_the_configurations() {
        if emulating() {
            return;
        }
        use wgpu::CooperativeScalarType as T;
        let config = |s, ab, cr| wgpu::CooperativeMatrixProperties {
            m_size: s,
            n_size: s,
            k_size: s,
            ab_type: ab,
            cr_type: cr,
            saturating_accumulation: false,
        };
        let caps = |configs| CoopCaps {
            configs,
            subgroup_max: 32,
            max_invocations: 1024,
            max_x: 1024,
            max_shared: 49152,
        };
        let nvidia = caps(vec![
            config(16, T::F16, T::F16),
            config(16, T::F16, T::F32),
            config(8, T::F16, T::F32),
        ]);
        let p = choose(&nvidia, DType::F16, true).expect("f16 16×16");
        assert_eq!((p.size, p.f16, p.workgroup), (16, true, 128));
        assert_eq!(
            choose(&nvidia, DType::F16, false),
            None,
            "f16 without SHADER_F16"
        );
        assert_eq!(
            choose(&nvidia, DType::F32, true),
            None,
            "no f32 configuration"
        );
        assert_eq!(choose(&nvidia, DType::BF16, true), None);
        let half_acc = caps(vec![config(16, T::F16, T::F16)]);
        assert_eq!(choose(&half_acc, DType::F16, true), None, "f16 accumulator");
        let apple = caps(vec![config(8, T::F32, T::F32), config(8, T::F16, T::F32)]);
        assert_eq!(choose(&apple, DType::F32, true).map(|p| p.size), Some(8));
        assert_eq!(choose(&apple, DType::F16, true).map(|p| p.size), Some(8));
        let mut wide = caps(vec![config(16, T::F16, T::F32)]);
        wide.subgroup_max = 128;
        assert_eq!(
            choose(&wide, DType::F16, true),
            None,
            "a 512-invocation workgroup"
        );
        let mut small = nvidia.clone();
        small.max_shared = 16384;
        assert_eq!(
            choose(&small, DType::F16, true).map(|p| p.size),
            Some(8),
            "16×16 needs more workgroup memory than the adapter has"
        );
        assert_eq!(choose(&CoopCaps::default(), DType::F16, true), None);
    }
}
