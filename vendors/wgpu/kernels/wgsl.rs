//! The pieces every generated operator kernel shares: the binding declarations, the
//! per-dtype load/store functions, the per-plan constants and the strided-index helper.
//!
//! A family's template names its tensors and calls `ld_<name>(i)` / `st_<name>(i, v)` (values
//! computed in f32), `ldi_<name>(i)` / `sti_<name>(i, v)` (integers, for ids, positions and
//! indices) or `ldr_<name>(i)` / `str_<name>(i, v)` (raw bits, for copies of any dtype); `i` is
//! the element index relative to the tensor's first element, and the functions add the
//! tensor's element offset inside its binding (an immediate, set per launch). So one template
//! serves every dtype: what changes per dtype is only this prelude.
//!
//! Storage per dtype: f32 and i32 natively; i64 as two 32-bit words (little-endian); f16
//! natively (`array<f16>`) where the adapter has `SHADER_F16` ([`Dialect`]), else like bf16 as
//! 16-bit halves of u32 words; u8 and bool as bytes of u32 words; all computed in f32. A
//! written binding of a packed dtype is `atomic<u32>` and a store clears then sets its own
//! bits with two atomic operations, so neighbouring elements written by other invocations are
//! never lost (WGSL has no 8- or 16-bit stores).

use super::shapes::Numbers;
use std::fmt::Write;

use crate::tensor::DType;

/// Work items per workgroup in the one-item-per-element kernels.
pub(crate) const WG: u32 = 256;

/// One tensor binding of a kernel: its name in the template, dtype, and whether it is written.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bind {
    pub name: &'static str,
    pub dtype: DType,
    pub write: bool,
}

impl Bind {
    pub fn read(name: &'static str, dtype: DType) -> Self {
        Bind {
            name,
            dtype,
            write: false,
        }
    }

    pub fn write(name: &'static str, dtype: DType) -> Self {
        Bind {
            name,
            dtype,
            write: true,
        }
    }
}

/// What the plan's adapter offers the generated WGSL beyond WebGPU's core.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Dialect {
    /// `SHADER_F16`: f16 tensors are bound as `array<f16>` and read and written natively
    /// (16-bit loads and stores) instead of as halves of `u32` words with atomic stores.
    pub native_f16: bool,
    /// `SUBGROUP`: workgroup reductions sum and compare within subgroups first
    /// (`subgroupAdd` / `subgroupMax`), then across the workgroup's subgroups.
    pub subgroups: bool,
}

impl Dialect {
    /// The dialect of the plan's device (the default one when it is not a wgpu device).
    pub fn of(spec: &crate::ops::PlanSpec<'_>) -> Dialect {
        let Ok(rt) = crate::Runtime::get(spec.device) else {
            return Dialect::default();
        };
        match &**rt.backend() {
            crate::vendors::AnyBackend::Wgpu(b) => Dialect {
                native_f16: b.has_feature(wgpu::Features::SHADER_F16),
                subgroups: b.has_feature(wgpu::Features::SUBGROUP),
            },
            _ => Dialect::default(),
        }
    }
}

/// The prelude of a kernel over `binds` (binding 0 is the plan's constants `cfg`; tensor `k`
/// is binding `k + 1` and its element offset is immediate word `k`) for an adapter of
/// dialect `d`.
pub(crate) fn prelude(binds: &[Bind], d: Dialect) -> String {
    let native = d.native_f16 && binds.iter().any(|b| b.dtype == DType::F16);
    let mut s = String::from(if native { "enable f16;\n" } else { "" });
    s += HEADER;
    for (k, b) in binds.iter().enumerate() {
        if native && b.dtype == DType::F16 {
            native_f16_accessors(&mut s, k, b);
        } else {
            accessors(&mut s, k, b);
        }
    }
    s
}

/// The accessors of an f16 binding declared `array<f16>`. Stores round as the packed form's
/// (`pack2x16float`), so results are bitwise those of adapters without `SHADER_F16`, and of
/// the quad forms and fused kernels, which round that way too. Raw bits pass through f32
/// (naga has no bitcast between `u32` and `vec2<f16>`): exact for every value, a NaN stays a
/// NaN.
fn native_f16_accessors(s: &mut String, k: usize, b: &Bind) {
    let (n, slot) = (b.name, k + 1);
    let _ = writeln!(
        s,
        "@group(0) @binding({slot}) var<storage, read_write> {n}: array<f16>;\n\
         fn ldr_{n}(i: u32) -> vec2<u32> {{ return vec2<u32>(pack2x16float(vec2<f32>(f32({n}[imm.o{k} + i]), 0.0)) & 0xffffu, 0u); }}\n\
         fn ld_{n}(i: u32) -> f32 {{ return f32({n}[imm.o{k} + i]); }}\n\
         fn ldi_{n}(i: u32) -> i32 {{ return i32(ldr_{n}(i).x); }}"
    );
    if b.write {
        let _ = writeln!(
            s,
            "fn str_{n}(i: u32, v: vec2<u32>) {{ {n}[imm.o{k} + i] = f16(unpack2x16float(v.x & 0xffffu).x); }}\n\
             fn st_{n}(i: u32, v: f32) {{ str_{n}(i, vec2<u32>(pack2x16float(vec2<f32>(v, 0.0)), 0u)); }}\n\
             fn sti_{n}(i: u32, v: i32) {{ str_{n}(i, vec2<u32>(u32(v), 0u)); }}"
        );
    }
}

/// The prelude of a kernel's quad variant (see [`super::op::OpSource::aligned`]): every binding is
/// declared as an array of four-element quads — `vec4<f32>` for f32, `vec2<u32>` (four
/// 16-bit halves) for f16 and bf16 — read as `vec4<f32>` with `ldq_<name>(q)` (`q` the quad's
/// index in the binding) or `ld4_<name>(i)` (`i` an element index relative to the tensor,
/// a multiple of four), and written with `stq_<name>` / `st4_<name>`. A quad is written
/// whole, so 16-bit stores need no atomics; values round as the scalar stores round. `None`
/// when a binding's dtype has no quad form.
pub(crate) fn prelude_quads(binds: &[Bind]) -> Option<String> {
    let mut s = String::from(HEADER);
    for (k, b) in binds.iter().enumerate() {
        quad_accessors(&mut s, k, b)?;
    }
    quad_helpers(&mut s, binds);
    Some(s)
}

/// A prelude whose bindings marked in `quads` are declared and read as quads (as in
/// [`prelude_quads`]) and the others as scalars (as in [`prelude`]): for kernels that read an
/// input four elements at a time but write single elements (a reduction's outputs). `None`
/// when a quad binding's dtype has no quad form.
pub(crate) fn prelude_mixed(binds: &[Bind], quads: &[bool], d: Dialect) -> Option<String> {
    let scalar = |k: usize| !quads.get(k).copied().unwrap_or(false);
    let native = d.native_f16
        && binds
            .iter()
            .enumerate()
            .any(|(k, b)| scalar(k) && b.dtype == DType::F16);
    let mut s = String::from(if native { "enable f16;\n" } else { "" });
    s += HEADER;
    for (k, b) in binds.iter().enumerate() {
        if !scalar(k) {
            quad_accessors(&mut s, k, b)?;
        } else if native && b.dtype == DType::F16 {
            native_f16_accessors(&mut s, k, b);
        } else {
            accessors(&mut s, k, b);
        }
    }
    let quad_binds: Vec<Bind> = (0..binds.len())
        .filter(|&k| !scalar(k))
        .map(|k| binds[k])
        .collect();
    quad_helpers(&mut s, &quad_binds);
    Some(s)
}

/// The quad declaration and accessors of binding `k` (see [`prelude_quads`]); `None` when its
/// dtype has no quad form.
fn quad_accessors(s: &mut String, k: usize, b: &Bind) -> Option<()> {
    let (n, slot) = (b.name, k + 1);
    let (ty, load, store) = match b.dtype {
        DType::F32 => ("vec4<f32>", "return {n}[q];", "{n}[q] = v;"),
        DType::F16 => (
            "vec2<u32>",
            "let w = {n}[q]; return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));",
            "{n}[q] = vec2<u32>(pack2x16float(v.xy), pack2x16float(v.zw));",
        ),
        DType::BF16 => (
            "vec2<u32>",
            "let w = {n}[q]; return vec4<f32>(bitcast<f32>(w.x << 16u), \
             bitcast<f32>(w.x & 0xffff0000u), bitcast<f32>(w.y << 16u), \
             bitcast<f32>(w.y & 0xffff0000u));",
            "let h = bf16_round4(v); {n}[q] = vec2<u32>(h.x | (h.y << 16u), h.z | (h.w << 16u));",
        ),
        _ => return None,
    };
    let (load, store) = (load.replace("{n}", n), store.replace("{n}", n));
    let _ = writeln!(
        s,
        "@group(0) @binding({slot}) var<storage, read_write> {n}: array<{ty}>;\n\
         fn ldq_{n}(q: u32) -> vec4<f32> {{ {load} }}\n\
         fn ld4_{n}(i: u32) -> vec4<f32> {{ return ldq_{n}((imm.o{k} + i) >> 2u); }}"
    );
    if b.write {
        let _ = writeln!(
            s,
            "fn stq_{n}(q: u32, v: vec4<f32>) {{ {store} }}\n\
             fn st4_{n}(i: u32, v: vec4<f32>) {{ stq_{n}((imm.o{k} + i) >> 2u, v); }}"
        );
    }
    Some(())
}

/// The helpers the quad accessors of `binds` call (a bf16 quad store's rounding).
fn quad_helpers(s: &mut String, binds: &[Bind]) {
    if binds.iter().any(|b| b.write && b.dtype == DType::BF16) {
        // Round to nearest even, NaN to the quiet NaN: the scalar bf16 store's rounding.
        *s += "fn bf16_round4(v: vec4<f32>) -> vec4<u32> {
    let u = bitcast<vec4<u32>>(v);
    return select((u + 0x7fffu + ((u >> vec4<u32>(16u)) & vec4<u32>(1u))) >> vec4<u32>(16u), vec4<u32>(0x7fc0u), is_nan4(v));
}
";
    }
}

/// Whether `t`'s rows (its last dimension) suit a quad variant: contiguous, of a multiple of
/// four elements, each starting four elements after a multiple of four from the tensor's
/// start (every other stride a multiple of four).
pub(crate) fn quad_rows(t: &crate::ops::TensorDesc) -> bool {
    let (shape, strides) = (t.layout.shape(), t.layout.strides());
    match (shape.split_last(), strides.split_last()) {
        (Some((n, _)), Some((1, rest))) => n % 4 == 0 && rest.iter().all(|s| s % 4 == 0),
        _ => false,
    }
}

/// What every kernel declares first: the immediates (one element offset per tensor), the
/// plan's constants and the strided-index helper.
const HEADER: &str =
    "struct Imm { o0: u32, o1: u32, o2: u32, o3: u32, o4: u32, o5: u32, o6: u32, o7: u32 }
var<immediate> imm: Imm;
@group(0) @binding(0) var<storage, read> cfg: array<u32>;
fn cfg_f(i: u32) -> f32 { return bitcast<f32>(cfg[i]); }
// NaN tested by its bits: Vulkan lets a driver assume that floats are never NaN, and
// lavapipe folds `v != v` to false.
fn is_nan(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }
fn is_nan4(v: vec4<f32>) -> vec4<bool> {
    return (bitcast<vec4<u32>>(v) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
}
// n / d for a divisor given by its magic numbers (see `shapes::magic`): a multiply-high
// and shifts, where a CPU divides vector lanes one at a time.
fn unirt_udiv(n: u32, m: u32, s: u32) -> u32 {
    let t = unirt_mulhi(n, m);
    return (t + ((n - t) >> (s & 31u))) >> (s >> 16u);
}
fn unirt_mulhi(a: u32, b: u32) -> u32 {
    let al = a & 0xffffu; let ah = a >> 16u; let bl = b & 0xffffu; let bh = b >> 16u;
    let lh = al * bh; let hl = ah * bl;
    let mid = ((al * bl) >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    return ah * bh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u);
}
// The element offset of row-major index `i` in a view: rank at cfg[d], then the
// shape, then the strides (in elements; 0 for broadcast dimensions).
fn view_off(i: u32, d: u32) -> u32 {
    let r = cfg[d];
    var rem = i;
    var off = 0u;
    for (var k = r; k > 0u; k = k - 1u) {
        let n = cfg[d + k];
        off = off + (rem % n) * cfg[d + r + k];
        rem = rem / n;
    }
    return off;
}
";

fn accessors(s: &mut String, k: usize, b: &Bind) {
    let (n, slot) = (b.name, k + 1);
    let off = format!("imm.o{k}");
    let packed = matches!(b.dtype, DType::F16 | DType::BF16 | DType::U8 | DType::Bool);
    let ty = match b.dtype {
        DType::F32 => "f32",
        DType::I32 | DType::I64 => "i32",
        _ if b.write => "atomic<u32>",
        _ => "u32",
    };
    let _ = writeln!(
        s,
        "@group(0) @binding({slot}) var<storage, read_write> {n}: array<{ty}>;"
    );
    if packed {
        // Bits per element and the raw read of element e's bits.
        let bits = if matches!(b.dtype, DType::F16 | DType::BF16) {
            16
        } else {
            8
        };
        let per = 32 / bits;
        let mask = if bits == 16 { "0xffffu" } else { "0xffu" };
        let word = if b.write {
            format!("atomicLoad(&{n}[e / {per}u])")
        } else {
            format!("{n}[e / {per}u]")
        };
        let _ = writeln!(
            s,
            "fn ldr_{n}(i: u32) -> vec2<u32> {{ let e = {off} + i; \
             return vec2<u32>(({word} >> ((e % {per}u) * {bits}u)) & {mask}, 0u); }}"
        );
        if b.write {
            let _ = writeln!(
                s,
                "fn str_{n}(i: u32, v: vec2<u32>) {{ let e = {off} + i; let sh = (e % {per}u) * {bits}u; \
                 atomicAnd(&{n}[e / {per}u], ~({mask} << sh)); \
                 atomicOr(&{n}[e / {per}u], (v.x & {mask}) << sh); }}"
            );
        }
        let (to_f, from_f) = match b.dtype {
            DType::F16 => (
                "unpack2x16float(h).x",
                "pack2x16float(vec2<f32>(v, 0.0)) & 0xffffu",
            ),
            DType::BF16 => (
                "bitcast<f32>(h << 16u)",
                "select((bitcast<u32>(v) + 0x7fffu + ((bitcast<u32>(v) >> 16u) & 1u)) >> 16u, 0x7fc0u, is_nan(v))",
            ),
            // Bool and u8: any non-zero byte reads as its value; stores saturate like Rust's
            // `as u8` (bool stores 0 or 1).
            DType::Bool => ("select(0.0, 1.0, h != 0u)", "select(0u, 1u, v != 0.0)"),
            _ => ("f32(h)", "u32(clamp(v, 0.0, 255.0))"),
        };
        let _ = writeln!(
            s,
            "fn ld_{n}(i: u32) -> f32 {{ let h = ldr_{n}(i).x; return {to_f}; }}\n\
             fn ldi_{n}(i: u32) -> i32 {{ return i32(ldr_{n}(i).x); }}"
        );
        if b.write {
            let _ = writeln!(
                s,
                "fn st_{n}(i: u32, v: f32) {{ str_{n}(i, vec2<u32>({from_f}, 0u)); }}\n\
                 fn sti_{n}(i: u32, v: i32) {{ str_{n}(i, vec2<u32>(u32(v), 0u)); }}"
            );
        }
        return;
    }
    match b.dtype {
        DType::I64 => {
            let _ = writeln!(
                s,
                "fn ldr_{n}(i: u32) -> vec2<u32> {{ let e = 2u * ({off} + i); \
                 return vec2<u32>(bitcast<u32>({n}[e]), bitcast<u32>({n}[e + 1u])); }}\n\
                 fn ldi_{n}(i: u32) -> i32 {{ return {n}[2u * ({off} + i)]; }}\n{}\
                 fn ld_{n}(i: u32) -> f32 {{ let w = ldr_{n}(i); let lo = bitcast<i32>(w.x); \
                 if (bitcast<i32>(w.y) == (lo >> 31u) && abs(lo) < 16777216) {{ return f32(lo); }} \
                 return i64_f32_{n}(w, 24u); }}",
                i64_to_f32(n)
            );
            if b.write {
                let _ = writeln!(
                    s,
                    "fn str_{n}(i: u32, v: vec2<u32>) {{ let e = 2u * ({off} + i); \
                     {n}[e] = bitcast<i32>(v.x); {n}[e + 1u] = bitcast<i32>(v.y); }}\n\
                     fn sti_{n}(i: u32, v: i32) {{ str_{n}(i, vec2<u32>(bitcast<u32>(v), select(0u, 0xffffffffu, v < 0))); }}\n\
                     fn st_{n}(i: u32, v: f32) {{ sti_{n}(i, i32(v)); }}"
                );
            }
        }
        DType::I32 => {
            let _ = writeln!(
                s,
                "fn ldr_{n}(i: u32) -> vec2<u32> {{ return vec2<u32>(bitcast<u32>({n}[{off} + i]), 0u); }}\n\
                 fn ldi_{n}(i: u32) -> i32 {{ return {n}[{off} + i]; }}\n\
                 fn ld_{n}(i: u32) -> f32 {{ return f32({n}[{off} + i]); }}"
            );
            if b.write {
                let _ = writeln!(
                    s,
                    "fn str_{n}(i: u32, v: vec2<u32>) {{ {n}[{off} + i] = bitcast<i32>(v.x); }}\n\
                     fn sti_{n}(i: u32, v: i32) {{ {n}[{off} + i] = v; }}\n\
                     fn st_{n}(i: u32, v: f32) {{ {n}[{off} + i] = i32(v); }}"
                );
            }
        }
        _ => {
            let _ = writeln!(
                s,
                "fn ldr_{n}(i: u32) -> vec2<u32> {{ return vec2<u32>(bitcast<u32>({n}[{off} + i]), 0u); }}\n\
                 fn ld_{n}(i: u32) -> f32 {{ return {n}[{off} + i]; }}\n\
                 fn ldi_{n}(i: u32) -> i32 {{ return i32({n}[{off} + i]); }}"
            );
            if b.write {
                let _ = writeln!(
                    s,
                    "fn str_{n}(i: u32, v: vec2<u32>) {{ {n}[{off} + i] = bitcast<f32>(v.x); }}\n\
                     fn st_{n}(i: u32, v: f32) {{ {n}[{off} + i] = v; }}\n\
                     fn sti_{n}(i: u32, v: i32) {{ {n}[{off} + i] = f32(v); }}"
                );
            }
        }
    }
}

/// The linear work-item index of a 2-D dispatch of [`WG`]-wide workgroups (rows of at most
/// the per-dimension limit), as WGSL.
pub(crate) const LINEAR_ID: &str = "gid.x + gid.y * nwg.x * 256u";

/// The entry-point signature of a one-item-per-element kernel.
pub(crate) const MAIN_1D: &str = "@compute @workgroup_size(256)\n\
    fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>)";

/// How [`view_index`] computes a view's element offsets.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ViewCode<'a> {
    /// `view_off`'s loop over the view's descriptor in `cfg` (a GPU: one kernel for every
    /// view of every rank).
    Loop,
    /// Straight-line code over the view's dimensions, their extents and strides written into
    /// it or read from `cfg` ([`Numbers`]; the host's cores, and adapters with a loop
    /// limiter, which would count `view_off`'s loops).
    Unrolled(Numbers<'a>),
}

impl<'a> ViewCode<'a> {
    /// The host forms' code (`host`), with `numbers`; else `view_off`'s loop.
    pub(crate) fn of(host: bool, numbers: Numbers<'a>) -> Self {
        match host {
            true => ViewCode::Unrolled(numbers),
            false => ViewCode::Loop,
        }
    }
}

/// The WGSL expression of element `i`'s offset in a view of `shape` / `strides` whose
/// descriptor ([`push_view`]) starts at the index held in `cfg[at]` (`view` is the plan's
/// `cfg` and `at`). Unrolled, a function `name` is added to `funcs` and called, each extent
/// and stride held as `numbers` says: written into the code (the host's cores), the compiler
/// turns each division by an extent into a multiply and a shift, where `view_off`'s run-time
/// divisions are loops of scalar divisions on a CPU (strided kernels ran 6–9× slower than
/// contiguous ones on lavapipe) — but the source then differs per shape, so such a pipeline
/// is compiled per shape; read from the descriptor, one pipeline serves every view whose
/// extents of 1, strides of 0 and 1 and powers of two lie in the same dimensions (and whose
/// numbers written in are the same).
pub(crate) fn view_index(
    funcs: &mut String,
    name: &str,
    i: &str,
    (cfg, at): (&[u32], u32),
    shape: &[usize],
    strides: &[usize],
    code: ViewCode<'_>,
) -> String {
    let ViewCode::Unrolled(numbers) = code else {
        return format!("view_off({i}, cfg[{at}u])");
    };
    // The descriptor's dimensions (see `push_view`).
    let (shape, strides) = without_ones(shape, strides);
    let (shape, strides) = (&shape[..], &strides[..]);
    if shape.contains(&0) {
        // No element to index (and no extent to divide by).
        let _ = writeln!(funcs, "fn {name}(i: u32) -> u32 {{ return 0u; }}");
        return format!("{name}({i})");
    }
    let rank = shape.len();
    // Words of the descriptor at indices written into the code (the descriptor's place
    // follows from the kernel's structure).
    let d = cfg.get(at as usize).copied().unwrap_or(0) as usize;
    let mut body = String::new();
    let dims: Vec<usize> = (0..rank).filter(|&p| shape[p] != 1).collect();
    for (k, &p) in dims.iter().enumerate().rev() {
        // Strides of 0 and 1 shape the code; the others are numbers.
        let times = match strides[p] {
            0 | 1 => String::new(),
            s => format!(" * {}", numbers.num_at(s, d + 1 + rank + p)),
        };
        if k == 0 {
            // The outermost dimension: what is left of the index is its coordinate.
            if strides[p] != 0 {
                let _ = writeln!(body, "    off = off + rem{times};");
            }
            continue;
        }
        let m = d + 1 + 2 * rank + 2 * p;
        let Some((w0, w1)) = numbers.divisor_at(shape[p], m) else {
            if strides[p] != 0 {
                let _ = writeln!(body, "    off = off + (rem % {}u){times};", shape[p]);
            }
            let _ = writeln!(body, "    rem = rem / {}u;", shape[p]);
            continue;
        };
        // The extent's divisor words (`shapes::divisor_words`): a mask and a shift for a
        // power of two (which is then part of the structure, as head dims are), else the
        // quotient through its magic numbers and the remainder from it.
        if shape[p].is_power_of_two() {
            if strides[p] != 0 {
                let _ = writeln!(body, "    off = off + (rem & {w0}){times};");
            }
            let _ = writeln!(body, "    rem = rem >> {w1};");
        } else {
            let _ = writeln!(body, "    let q{p} = unirt_udiv(rem, {w0}, {w1});");
            if strides[p] != 0 {
                let extent = numbers.word(d + 1 + p);
                let _ = writeln!(body, "    off = off + (rem - q{p} * {extent}){times};");
            }
            let _ = writeln!(body, "    rem = q{p};");
        }
    }
    let _ = writeln!(
        funcs,
        "fn {name}(i: u32) -> u32 {{\n    var rem = i;\n    var off = 0u;\n{body}    return off;\n}}"
    );
    format!("{name}({i})")
}

/// Appends a view descriptor to `cfg`, returning its index: the rank, the shape, the strides,
/// then each extent's [divisor words](super::shapes::divisor_words) (two per dimension; read
/// by [`view_index`]'s code where it reads the extent). The view's dimensions of size 1 are
/// left out ([`without_ones`]).
pub(crate) fn push_view(cfg: &mut Vec<u32>, shape: &[usize], strides: &[usize]) -> u32 {
    let (shape, strides) = without_ones(shape, strides);
    push_view_exact(cfg, &shape, &strides)
}

/// The view without its dimensions of size 1, which address nothing: `view_off` loops once
/// per dimension of the descriptor, and on an adapter with a loop limiter a view of 100 000
/// dimensions of size 1 used up the invocation's 65 535 iterations in its first call, so the
/// kernel's loops stopped early and a softmax wrote wrong values without an error. Without
/// them a view that a `u32` indexes has at most 32 dimensions.
pub(crate) fn without_ones(shape: &[usize], strides: &[usize]) -> (Vec<usize>, Vec<usize>) {
    shape
        .iter()
        .zip(strides)
        .filter(|(&n, _)| n != 1)
        .map(|(&n, &s)| (n, s))
        .unzip()
}

/// [`push_view`] keeping every dimension (a user kernel reads the tensor's own shape and
/// strides by dimension).
pub(crate) fn push_view_exact(cfg: &mut Vec<u32>, shape: &[usize], strides: &[usize]) -> u32 {
    let at = cfg.len() as u32;
    cfg.push(shape.len() as u32);
    cfg.extend(shape.iter().map(|&n| n as u32));
    cfg.extend(strides.iter().map(|&s| s as u32));
    for &n in shape {
        let (m, s) = super::shapes::divisor_words(n as u32);
        cfg.extend([m, s]);
    }
    at
}

/// The strides of a view of `shape`/`strides` broadcast (aligned right) to `to`: 0 where the
/// view has size 1 or no dimension.
pub(crate) fn broadcast_strides(shape: &[usize], strides: &[usize], to: &[usize]) -> Vec<usize> {
    let lead = to.len() - shape.len().min(to.len());
    (0..to.len())
        .map(|d| {
            if d < lead {
                0
            } else {
                let k = d - lead;
                if shape[k] == 1 {
                    0
                } else {
                    strides[k]
                }
            }
        })
        .collect()
}

/// A float as its bits, for `cfg`.
pub(crate) fn f(v: f64) -> u32 {
    (v as f32).to_bits()
}

/// The 2-D grid of `wg`-wide workgroups for `items` work items (rows of at most 65535
/// workgroups, the WebGPU minimum of the per-dimension limit).
pub(crate) fn grid_for(items: u64, wg: u32) -> [u32; 3] {
    let g = items.div_ceil(u64::from(wg)).max(1);
    let x = g.min(65535);
    let y = g.div_ceil(x).min(65535);
    [x as u32, y as u32, 1]
}

/// The shape and strides of the dimensions of a view other than `axes` (sorted; the lanes of
/// a row or reduction kernel).
pub(crate) fn kept(shape: &[usize], strides: &[usize], axes: &[usize]) -> (Vec<usize>, Vec<usize>) {
    (0..shape.len())
        .filter(|d| axes.binary_search(d).is_err())
        .map(|d| (shape[d], strides[d]))
        .unzip()
}

/// The same view with fewer dimensions: those of size 1 dropped, and each dimension merged
/// into the one before it where the two walk memory as one (the outer stride is the inner
/// stride times the inner size). Row-major order over the view visits the same elements in
/// the same order, so a kernel walking the merged view computes bitwise what it computed
/// over the original. A view of at most one element is returned as it is.
pub(crate) fn merge_view(shape: &[usize], strides: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let merged = crate::tensor::merge_dims(shape, |o, i| strides[o] == strides[i] * shape[i]);
    if merged.is_empty() {
        // One element (or none, or no dimensions): the view as it was.
        return (shape.to_vec(), strides.to_vec());
    }
    merged.into_iter().map(|(n, d)| (n, strides[d])).unzip()
}

/// WGSL `fn i64_f32_<n>(w: vec2<u32>, keep: u32) -> f32`: the i64 in words `w` (low, high) the
/// way the CPU and CUDA kernels convert it, through f64: rounded to 53 significant bits, then
/// to `keep` (24 for f32, 8 for a bf16 destination, whose f32 then stores exactly), each to
/// nearest-even. (The sum `f32(hi) · 2^32 + f32(lo)` it replaces rounded `lo`
/// first and was a unit in the last place off for large values: a `cast` from i64 differed
/// from the CPU's.) Helpers are suffixed per binding so that two i64 bindings can share a
/// kernel.
fn i64_to_f32(n: &str) -> String {
    format!(
        "fn u64len_{n}(a: vec2<u32>) -> u32 {{ if (a.y != 0u) {{ return 64u - countLeadingZeros(a.y); }} \
         return 32u - countLeadingZeros(a.x); }}\n\
         fn u64bit_{n}(a: vec2<u32>, k: u32) -> bool {{ if (k >= 32u) {{ return ((a.y >> (k - 32u)) & 1u) != 0u; }} \
         return ((a.x >> k) & 1u) != 0u; }}\n\
         fn u64below_{n}(a: vec2<u32>, k: u32) -> bool {{ if (k == 0u) {{ return false; }} \
         if (k >= 32u) {{ return a.x != 0u || (a.y & ((1u << (k - 32u)) - 1u)) != 0u; }} \
         return (a.x & ((1u << k) - 1u)) != 0u; }}\n\
         fn u64round_{n}(a: vec2<u32>, keep: u32) -> vec3<u32> {{ let p = u64len_{n}(a); \
         if (p <= keep) {{ return vec3<u32>(a, 0u); }} let d = p - keep; \
         var q: vec2<u32>; if (d >= 32u) {{ q = vec2<u32>(a.y >> (d - 32u), 0u); }} \
         else {{ q = vec2<u32>((a.x >> d) | (a.y << (32u - d)), a.y >> d); }} \
         if (u64bit_{n}(a, d - 1u) && (u64below_{n}(a, d - 1u) || (q.x & 1u) == 1u)) {{ \
         q.x = q.x + 1u; if (q.x == 0u) {{ q.y = q.y + 1u; }} }} \
         return vec3<u32>(q, d); }}\n\
         fn i64_f32_{n}(w: vec2<u32>, keep: u32) -> f32 {{ let neg = (w.y >> 31u) == 1u; var m = w; \
         if (neg) {{ m = vec2<u32>(~w.x + 1u, ~w.y + select(0u, 1u, w.x == 0u)); }} \
         let r1 = u64round_{n}(m, 53u); let r2 = u64round_{n}(r1.xy, keep); \
         let f = ldexp(f32(r2.x), i32(r1.z + r2.z)); return select(f, -f, neg); }}\n"
    )
}

#[cfg(test)]
mod merge_view_tests {
    use super::merge_view;

    #[test]
    fn contiguous_dimensions_merge_and_others_stay() {
        // A contiguous [1024, 4096]: one row.
        assert_eq!(
            merge_view(&[1024, 4096], &[4096, 1]),
            (vec![4194304], vec![1])
        );
        // A transposed view does not merge; size-1 dimensions go.
        assert_eq!(
            merge_view(&[4, 1, 8], &[1, 99, 4]),
            (vec![4, 8], vec![1, 4])
        );
        // Rows of a wider matrix: the column dimension cannot join the row one.
        assert_eq!(merge_view(&[3, 5], &[8, 1]), (vec![3, 5], vec![8, 1]));
        // A [2, 3, 4] whose last two dimensions are contiguous with each other only.
        assert_eq!(
            merge_view(&[2, 3, 4], &[100, 4, 1]),
            (vec![2, 12], vec![100, 1])
        );
        // At most one element, and no dimensions: as they were.
        assert_eq!(merge_view(&[1, 1], &[7, 3]), (vec![1, 1], vec![7, 3]));
        assert_eq!(merge_view(&[], &[]), (vec![], vec![]));
        // An empty dimension merges like any other.
        assert_eq!(merge_view(&[0, 5], &[5, 1]), (vec![0], vec![1]));
    }
}
