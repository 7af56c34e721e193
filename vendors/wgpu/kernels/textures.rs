//! Textures for the inputs that kernels on the software adapters read through them
//! ([`TexRead`]): their layout, the shared and per-source textures a device keeps, and the
//! budget they live in. What each texture holds is `contents.rs`'s business.

use std::collections::HashMap;
use std::sync::Arc;

use super::super::contents::TexHeld;
use super::op::{OpCache, PassSources};
use super::wgsl::Bind;

/// Inputs read through textures, one texel per four values of a row ([`texel`]:
/// `rgba32float` for f32, `rgba16float` for f16, `rgba16uint` for bf16's bits), by kernels
/// for adapters that run on the host's cores. There a storage load whose
/// address differs across the lanes is a scalar loop over the lanes with a stack round trip
/// per element (Mesa 22.3's gallivm), while a texel load gathers in registers: a 1×4096×4096
/// GEMV read its matrix 2–4× faster that way, and a 16 MiB add its operands 3× faster,
/// copies included (docs/BENCHMARKS.md). Each launch copies the inputs into their textures
/// first, in the same command list, so the kernel always reads the tensors' current values;
/// the copy of a *reusable* input (a GEMM's B, a bias row: usually weights) goes to a texture
/// of its own and is skipped while that texture holds the input's unchanged bytes
/// (`contents.rs` decides, in submission order).
#[derive(Clone)]
pub(crate) struct TexRead {
    /// The inputs read through textures, in the order of their bindings.
    pub inputs: Vec<TexInput>,
    /// The passes: as [`OpSource::aligned`](super::op::OpSource::aligned)'s, with `var tex_<name>` (of the WGSL type
    /// [`texel`] gives) at the bindings after the tensors' ([`texture_binding`]).
    pub passes: PassSources,
}

/// One input of a [`TexRead`] variant: rows of its values, `row_stride` elements apart,
/// copied into a `width` × `height` texture.
#[derive(Clone)]
pub(crate) struct TexInput {
    /// Which input (index into the plan's inputs).
    pub input: usize,
    /// Texels per row (a row's values / 4) and rows.
    pub width: u32,
    pub height: u32,
    /// Texels in the last row: `width`, or fewer where a run of quads ends inside it
    /// ([`flat_texture`]).
    pub last_width: u32,
    /// Elements from one row's start to the next's in the input.
    pub row_stride: u64,
    /// Whether the input is usually the same from launch to launch (a weight matrix): it gets
    /// a texture of its own, whose copy is skipped while the texture holds the input's
    /// unchanged bytes (see `contents.rs`).
    pub reusable: bool,
}

/// The `(texels per row, rows, texels in the last row)` of a texture that holds a contiguous
/// input of `quads` quads (four values each) of `texel_bytes` per texel as one run, for
/// adapters whose textures are at most `max` texels wide and high; `None` when it does not fit.
///
/// The width is a power of two (the smallest that holds the run in one row, up to the largest
/// power of two within `max`), so a row is a multiple of 256 bytes, as buffer-to-texture
/// copies require, and a kernel finds quad `q` at `(q & (width - 1), q >> log2(width))`. The
/// last row may be partly filled (a second copy). The width depends on the size *class*, not
/// the exact size: it is written into the kernel's code, and a width that divided the size
/// exactly (as it once was) gave every new size its own kernel — a decode loop whose KV cache
/// grows by a row per token compiled a new attention kernel per token (58 ms each on
/// lavapipe).
pub(crate) fn flat_texture(quads: usize, texel_bytes: u64, max: u32) -> Option<(u32, u32, u32)> {
    let align = (u64::from(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT) / texel_bytes).max(1) as usize;
    if quads == 0 || max == 0 {
        return None;
    }
    let widest = 1usize << (usize::BITS - 1 - (max as usize).leading_zeros());
    let width = quads.next_power_of_two().max(align).min(widest);
    if !width.is_multiple_of(align) {
        return None;
    }
    let height = quads.div_ceil(width);
    if height > max as usize {
        return None;
    }
    let last = quads - (height - 1) * width;
    Some((
        u32::try_from(width).ok()?,
        u32::try_from(height).ok()?,
        u32::try_from(last).ok()?,
    ))
}

/// How a [`TexRead`] input of one dtype is held: four values per texel.
pub(crate) struct Texel {
    pub format: wgpu::TextureFormat,
    /// Bytes per texel.
    pub bytes: u64,
    /// The WGSL type a kernel declares the texture with, and what `textureLoad` returns.
    pub texture_type: &'static str,
    pub load_type: &'static str,
    /// The expression that turns a loaded texel `t` into four f32 values.
    pub to_f32: &'static str,
}

/// The texel of a [`TexRead`] input of dtype `dt`; `None` for dtypes without one.
pub(crate) fn texel(dt: crate::tensor::DType) -> Option<Texel> {
    use crate::tensor::DType;
    let (format, bytes) = match dt {
        DType::F32 => (wgpu::TextureFormat::Rgba32Float, 16),
        DType::F16 => (wgpu::TextureFormat::Rgba16Float, 8),
        DType::BF16 => (wgpu::TextureFormat::Rgba16Uint, 8),
        _ => return None,
    };
    Some(if dt == DType::BF16 {
        // bf16 is the top half of an f32: its bits shifted up are the value.
        Texel {
            format,
            bytes,
            texture_type: "texture_2d<u32>",
            load_type: "vec4<u32>",
            to_f32: "bitcast<vec4<f32>>(t << vec4<u32>(16u))",
        }
    } else {
        Texel {
            format,
            bytes,
            texture_type: "texture_2d<f32>",
            load_type: "vec4<f32>",
            to_f32: "t",
        }
    })
}

/// The texture size (texels per row and rows) kernels may plan for: WebGPU's default
/// `max_texture_dimension_2d`, which every adapter offers; a plan checks its adapter's own.
pub(crate) const PLANNED_TEXTURE_DIM: u32 = 8192;

/// Elements from which a kernel on the host's cores reads a contiguous input through a
/// texture: below it, the copy's fixed cost outweighs the cheaper loads.
pub(crate) const TEXTURE_MIN_ELEMENTS: usize = 1 << 14;

/// A [`TexRead`] input `input` of `rows` rows of `row_len` values each, read by a row kernel
/// on the host's cores: the texture's declaration at `binding` with `tx_<name>(r, j)`, the
/// four values from element `j` (a multiple of four) of row `r`. `None` unless the tensor is
/// contiguous with rows that are whole quads and 256-byte multiples (the texture copy's row
/// pitch), or when its dtype has no texel. (Whether the input is large enough to be worth
/// the copy, [`TEXTURE_MIN_ELEMENTS`], is the kernel's call.)
pub(crate) fn texture_rows(
    t: &crate::ops::TensorDesc,
    input: usize,
    name: &str,
    binding: u32,
    (rows, row_len): (usize, usize),
) -> Option<(TexInput, String)> {
    let texel = texel(t.dtype)?;
    let usable = t.layout.is_contiguous()
        && t.layout.numel() == rows * row_len
        && row_len.is_multiple_of(4)
        && (row_len * t.dtype.size()).is_multiple_of(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT as usize);
    if !usable {
        return None;
    }
    let decl = format!(
        "@group(0) @binding({binding}) var tex_{name}: {ty};\n\
         fn tx_{name}(r: u32, j: u32) -> vec4<f32> {{ \
         let t = textureLoad(tex_{name}, vec2<u32>(j >> 2u, r), 0); return {to_f32}; }}\n",
        ty = texel.texture_type,
        to_f32 = texel.to_f32,
    );
    let width = u32::try_from(row_len / 4).ok()?;
    let input = TexInput {
        input,
        width,
        height: u32::try_from(rows).ok()?,
        last_width: width,
        row_stride: row_len as u64,
        reusable: false,
    };
    Some((input, decl))
}

/// The rows of a row kernel's first input `x` (`rows` of `len`, bound as `binds[0]`)
/// through a texture, when they are contiguous and at least [`TEXTURE_MIN_ELEMENTS`] in
/// all: a texture row per row ([`texture_rows`]), or, for rows wider than a texture may be,
/// the tensor laid over the texture's rows as one run of quads ([`flat_textures`]). Gives
/// the texture, its declarations and what replaces the quad variant's load `ld4_x(xb + j)`.
pub(crate) fn row_texture(
    x: &crate::ops::TensorDesc,
    binds: &[Bind],
    (rows, len): (usize, usize),
) -> Option<(Vec<TexInput>, String, &'static str)> {
    if rows * len < TEXTURE_MIN_ELEMENTS {
        return None;
    }
    if len / 4 <= PLANNED_TEXTURE_DIM as usize {
        let binding = texture_binding(binds.len(), 0);
        let (input, decl) = texture_rows(x, 0, binds[0].name, binding, (rows, len))?;
        return Some((vec![input], decl, "tx_x(row, j)"));
    }
    let mut direct = vec![false; binds.len() - 1];
    direct[0] = x.layout.is_contiguous();
    let t = flat_textures(binds, &direct, rows * len)?;
    Some((t.inputs, t.decls, "tex4_x(xb + j)"))
}

/// The binding of the `slot`-th [`TexRead`] texture in a kernel with `tensors` tensors.
pub(crate) fn texture_binding(tensors: usize, slot: usize) -> u32 {
    (tensors + 1 + slot) as u32
}

/// Bytes of the textures a device keeps for [`TexRead`] inputs (one per size and binding
/// slot, shared by every plan of that size: each launch refills it, and one queue orders the
/// launches; and one per source of a reusable input). A new texture that would pass this
/// first evicts those no live plan holds; a plan whose textures would still pass it runs
/// without them (a reusable input without a texture of its own uses the plan's).
pub(super) const MAX_TEXTURE_BYTES: u64 = 256 << 20;

/// A texture of a [`TexRead`] input with its view, shared by the plans of one matrix size
/// (or, for a reusable input, by the launches that read one source).
pub(super) struct MatrixTexture {
    pub(super) texture: wgpu::Texture,
    pub(super) view: wgpu::TextureView,
    pub(super) id: u64,
    pub(super) bytes: u64,
    /// What it holds (see `contents.rs`).
    pub(super) held: Arc<TexHeld>,
}

/// The [`TexRead`] textures of a device by (texels per row, rows, format, binding slot), and
/// their bytes in all. The plans that read through a texture hold it too: one held by the
/// map alone belongs to no live plan.
#[derive(Default)]
pub(super) struct MatrixTextures {
    by_size: HashMap<TextureKey, Arc<MatrixTexture>>,
    /// The textures of reusable inputs by (size key, source buffer id, byte offset): each
    /// source keeps its own, so that two weights of one size do not refill one texture in
    /// turn. Dropped with the source buffer ([`OpCache::forget_buffer`]).
    by_source: HashMap<(TextureKey, u64, u64), Arc<MatrixTexture>>,
    bytes: u64,
}

/// (texels per row, rows, format, binding slot).
pub(super) type TextureKey = (u32, u32, wgpu::TextureFormat, usize);

/// One input of a compiled [`TexRead`] variant with its texture.
pub(super) struct TexSlot {
    pub(super) input: usize,
    pub(super) width: u32,
    pub(super) height: u32,
    pub(super) last_width: u32,
    pub(super) bytes_per_row: u32,
    /// Bytes per texel: the copy starts on a multiple of it.
    pub(super) texel_bytes: u64,
    pub(super) format: wgpu::TextureFormat,
    /// The plan's texture, shared by size (reusable inputs take one of their own when the
    /// budget allows).
    pub(super) tex: Arc<MatrixTexture>,
    pub(super) slot: usize,
    pub(super) reusable: bool,
}

impl OpCache {
    /// The shared texture of a `width` × `height` [`TexRead`] input in `format`, of
    /// `texel_bytes` per texel, for binding slot `slot` (the inputs of one launch need
    /// textures of their own); `None` when keeping it would pass [`MAX_TEXTURE_BYTES`] or the
    /// device refuses it (the plan runs without).
    pub(super) fn texture(
        &self,
        gpu: &super::super::gpu::Gpu,
        (width, height): (u32, u32),
        format: wgpu::TextureFormat,
        texel_bytes: u64,
        slot: usize,
    ) -> Option<Arc<MatrixTexture>> {
        let mut textures = self.textures.lock();
        if let Some(t) = textures.by_size.get(&(width, height, format, slot)) {
            return Some(t.clone());
        }
        let size = u64::from(width) * u64::from(height) * texel_bytes;
        if !textures.make_room(size) {
            return None;
        }
        let t = new_texture(gpu, (width, height), format, size)?;
        textures.bytes += size;
        textures
            .by_size
            .insert((width, height, format, slot), t.clone());
        Some(t)
    }

    /// The texture of the reusable input `s` when read from byte `off` of buffer `src`: its
    /// own, made on first use; the plan's shared one when the budget has no room for it.
    pub(super) fn source_texture(
        &self,
        gpu: &super::super::gpu::Gpu,
        s: &TexSlot,
        src: u64,
        off: u64,
    ) -> Arc<MatrixTexture> {
        let key = ((s.width, s.height, s.format, s.slot), src, off);
        let mut textures = self.textures.lock();
        if let Some(t) = textures.by_source.get(&key) {
            return t.clone();
        }
        let size = s.tex.bytes;
        if !textures.make_room(size) {
            return s.tex.clone();
        }
        match new_texture(gpu, (s.width, s.height), s.format, size) {
            Some(t) => {
                textures.bytes += size;
                textures.by_source.insert(key, t.clone());
                t
            }
            None => s.tex.clone(),
        }
    }
}

impl MatrixTextures {
    /// Drops the textures of reusable inputs read from buffer `id` (it is being freed).
    pub(super) fn forget_source(&mut self, id: u64) {
        let before = self.by_source.len();
        self.by_source.retain(|k, _| k.1 != id);
        if self.by_source.len() != before {
            self.recount();
        }
    }

    fn recount(&mut self) {
        self.bytes = self
            .by_size
            .values()
            .chain(self.by_source.values())
            .map(|t| t.bytes)
            .sum();
    }

    /// Whether `size` more bytes fit [`MAX_TEXTURE_BYTES`], after dropping the textures that
    /// only the maps hold (plans and launches in flight keep their own references, and take
    /// their clones under the maps' lock).
    fn make_room(&mut self, size: u64) -> bool {
        if self.bytes + size <= MAX_TEXTURE_BYTES {
            return true;
        }
        self.by_size.retain(|_, t| Arc::strong_count(t) > 1);
        self.by_source.retain(|_, t| Arc::strong_count(t) > 1);
        self.recount();
        self.bytes + size <= MAX_TEXTURE_BYTES
    }
}

/// A new `width` × `height` texture in `format` for [`TexRead`] inputs; `None` when the device
/// refuses it.
fn new_texture(
    gpu: &super::super::gpu::Gpu,
    (width, height): (u32, u32),
    format: wgpu::TextureFormat,
    bytes: u64,
) -> Option<Arc<MatrixTexture>> {
    let device = &gpu.device;
    let scope = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let inner = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let texture = device.create_texture(&wgpu::TextureDescriptor {
        label: Some("unirt matrix texture"),
        size: wgpu::Extent3d {
            width,
            height,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format,
        usage: wgpu::TextureUsages::COPY_DST | wgpu::TextureUsages::TEXTURE_BINDING,
        view_formats: &[],
    });
    let invalid = pollster::block_on(inner.pop());
    let oom = pollster::block_on(scope.pop());
    if let Some(e) = invalid.or(oom) {
        tracing::debug!("no {width}×{height} matrix texture: {e}");
        return None;
    }
    let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
    Some(Arc::new(MatrixTexture {
        texture,
        view,
        id: crate::handles::fresh_id(),
        bytes,
        held: gpu.contents.new_texture(),
    }))
}

/// The inputs of a quad kernel that are read through textures on the host's cores (see
/// [`super::op::TexRead`]): each copied whole into a texture of [`flat_texture`]'s rows, quad
/// `q` at texel `(q & (width - 1), q >> log2(width))`.
pub(crate) struct FlatTextures {
    pub inputs: Vec<TexInput>,
    /// The textures' declarations and their load functions `tex4_<name>(i)`.
    pub decls: String,
    /// Input `k`'s quad at element `i`, for those read through a texture.
    pub loads: Vec<Option<String>>,
}

impl FlatTextures {
    /// `loads` with the inputs read through textures replaced.
    pub fn loads(&self, loads: &[String]) -> Vec<String> {
        loads
            .iter()
            .zip(&self.loads)
            .map(|(l, t)| t.clone().unwrap_or_else(|| l.clone()))
            .collect()
    }
}

/// The [`FlatTextures`] of a quad kernel of `n` elements over `binds` (inputs, then the
/// output) that reads the inputs marked `direct` (contiguous in the output's shape) through
/// textures, when `n` is at least [`TEXTURE_MIN_ELEMENTS`]; `None` when no input can be read
/// that way.
pub(crate) fn flat_textures(binds: &[Bind], direct: &[bool], n: usize) -> Option<FlatTextures> {
    let through: Vec<Option<TexturedRead>> = direct
        .iter()
        .map(|&d| d.then(|| TexturedRead::whole(n)))
        .collect();
    textures_for(binds, &through, n, 0)
}

/// How one input is read through a texture: its first `elements` (a multiple of four) are
/// copied into one, and `tex4_<name>(i)` is called with `index` (of the kernel's element
/// `i`), whose quad it returns.
pub(crate) struct TexturedRead {
    pub elements: usize,
    pub index: String,
    pub reusable: bool,
}

impl TexturedRead {
    /// The whole input, as long as the output (`n` elements), read at the output's element.
    pub fn whole(n: usize) -> Self {
        TexturedRead {
            elements: n,
            index: "i".to_string(),
            reusable: false,
        }
    }
}

/// The [`FlatTextures`] of a quad kernel of `n` elements (at least [`TEXTURE_MIN_ELEMENTS`])
/// over `binds` (inputs, then the output) that reads the inputs given a [`TexturedRead`]
/// through textures bound after the tensors and `after` more buffers; `None` when none can
/// be.
pub(crate) fn textures_for(
    binds: &[Bind],
    through: &[Option<TexturedRead>],
    n: usize,
    after: usize,
) -> Option<FlatTextures> {
    if n < TEXTURE_MIN_ELEMENTS {
        return None;
    }
    let inputs = &binds[..binds.len() - 1];
    let mut t = FlatTextures {
        inputs: Vec::new(),
        decls: String::new(),
        loads: vec![None; inputs.len()],
    };
    for (k, bind) in inputs.iter().enumerate() {
        let Some(Some(read)) = through.get(k) else {
            continue;
        };
        let Some(texel) = texel(bind.dtype) else {
            continue;
        };
        let Some((width, height, last_width)) =
            flat_texture(read.elements / 4, texel.bytes, PLANNED_TEXTURE_DIM)
        else {
            continue;
        };
        let (mask, shift) = (width - 1, width.trailing_zeros());
        let (name, binding) = (
            bind.name,
            texture_binding(binds.len() + after, t.inputs.len()),
        );
        t.decls += &format!(
            "@group(0) @binding({binding}) var tex_{name}: {ty};\n\
             fn tex4_{name}(i: u32) -> vec4<f32> {{ let q = i >> 2u; \
             let t = textureLoad(tex_{name}, vec2<u32>(q & {mask}u, q >> {shift}u), 0); \
             return {to_f32}; }}\n",
            ty = texel.texture_type,
            to_f32 = texel.to_f32,
        );
        t.loads[k] = Some(format!("tex4_{name}({})", read.index));
        t.inputs.push(TexInput {
            input: k,
            width,
            height,
            last_width,
            row_stride: u64::from(width) * 4,
            reusable: read.reusable,
        });
    }
    (!t.inputs.is_empty()).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::flat_texture;

    /// Every run fits its texture exactly (whole rows, then a last row of `last` texels), rows
    /// are 256-byte multiples, and sizes of one class share a width, so the kernels reading
    /// them (whose code holds the width) are one kernel.
    #[test]
    fn flat_textures_hold_every_run_in_widths_of_its_class() {
        for texel_bytes in [16u64, 8, 4] {
            let align = 256 / texel_bytes as usize;
            for quads in (1..40_000).step_by(7).chain([8192, 8193, 1 << 20, 3 << 22]) {
                let (w, h, last) = flat_texture(quads, texel_bytes, 8192).unwrap();
                let (w, h, last) = (w as usize, h as usize, last as usize);
                assert!(
                    w.is_power_of_two() && w.is_multiple_of(align),
                    "{quads}: {w}"
                );
                assert!(
                    (1..=w).contains(&last) && h <= 8192,
                    "{quads}: {w} {h} {last}"
                );
                assert_eq!((h - 1) * w + last, quads);
                assert!(h == 1 || w == 8192, "{quads}: wider rows before more rows");
            }
        }
        // A KV cache that grows by one row: the same width throughout.
        let widths: std::collections::HashSet<u32> = (600..720)
            .map(|l| flat_texture(4 * l * 32 / 4, 16, 8192).unwrap().0)
            .collect();
        assert_eq!(widths.len(), 1);
        // Past 8192 × 8192 texels, and an adapter without textures: none.
        assert_eq!(flat_texture((8192 * 8192) + 1, 16, 8192), None);
        assert_eq!(flat_texture(16, 16, 0), None);
        // The largest power of two within an odd limit.
        assert_eq!(flat_texture(1 << 20, 16, 5000).map(|t| t.0), Some(4096));
    }
}
