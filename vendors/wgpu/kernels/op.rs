//! Operator kernels as [`PreparedKernel`]s: what every op family shares.
//!
//! A family turns a [`PlanSpec`] into an [`OpSource`] (generated WGSL, one or more passes, and
//! the plan's constants); [`prepare`] compiles each pass once per device (cached by source,
//! so plans with the same shapes of code share pipelines), makes the constants buffer and
//! returns an [`OpKernel`]. A launch ([`WgpuBackend::launch_op`]) checks the launch's byte
//! ranges against the allocation table, binds each tensor's buffer (the whole buffer when it
//! fits one storage binding, so the bind group is the same for every launch on that buffer
//! and the cache hits; else a window aligned to `min_storage_buffer_offset_alignment`), puts
//! the tensors' element offsets in the immediates, and enqueues the dispatches as stream
//! commands — which stream capture records like any other, so op launches can be captured.
//! A kernel for the host's cores may read some inputs through textures instead
//! ([`TexRead`]); its launch puts the copies into the textures before the dispatches.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Arc;

use parking_lot::Mutex;

use super::super::fault::{FaultWord, FAULT_BYTES};
use super::super::guard::guarded;
use super::super::memory::{ceil4, create_buffer, wgpu_error, DevBuf};
use super::super::stream::{enqueue, Cmd, Imm, TexCopy};
use super::super::WgpuBackend;
use crate::checked::Pins;
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::hal::{DevicePtr, StreamId};
use crate::ops::{KernelCall, PlanSpec, PreparedKernel};
use crate::vendors::AnyBackend;

/// Bytes of immediates an operator kernel takes: one element offset per tensor.
pub(crate) const OP_IMMEDIATE_BYTES: u32 = 32;
/// Tensors one operator kernel binds at most (one immediate word each).
pub(crate) const MAX_TENSORS: usize = 8;

/// Passes as generated: complete WGSL (entry point `main`) and the dispatch grid of each.
pub(crate) type PassSources = Vec<(String, [u32; 3])>;

/// What a family generates for one plan.
pub(crate) struct OpSource {
    /// For labels and errors.
    pub name: String,
    /// The passes, in order: complete WGSL (entry point `main`) and the dispatch grid.
    pub passes: PassSources,
    /// The plan's constants (binding 0 of every pass).
    pub cfg: Vec<u32>,
    /// The entry point when not `main` (user kernels).
    pub entry: Option<Arc<str>>,
    /// The quad variant of `passes` (same constants, same bindings; see
    /// [`super::wgsl::prelude_quads`]): it reads and writes every tensor four elements at a
    /// time, and a launch takes it when every tensor starts on a multiple of four elements in
    /// its binding (a tensor's offset is known only at launch). The family guarantees at
    /// plan time that each tensor's extents and strides are multiples of four, so it also
    /// ends on a quad boundary inside its binding.
    pub aligned: Option<PassSources>,
    /// A variant of `aligned` that reads some inputs through textures (see [`TexRead`]),
    /// taken by launches that `aligned` suits and whose texture inputs the copies can read.
    pub textured: Option<TexRead>,
    /// Whether workgroup memory starts zeroed, as WebGPU guarantees: kept for user kernels.
    /// unirt's own kernels write every workgroup element before they read it, and skip the
    /// zeroing: on GL, naga writes it as one array constructor per variable, which llvmpipe
    /// took 18 s to compile for the tiled GEMM (0.3 s without).
    pub zero_workgroup_memory: bool,
}

/// Inputs read through textures, one texel per four values of a row ([`texel`]:
/// `rgba32float` for f32, `rgba16float` for f16, `rgba16uint` for bf16's bits), by kernels
/// for adapters that run on the host's cores. There a storage load whose
/// address differs across the lanes is a scalar loop over the lanes with a stack round trip
/// per element (Mesa 22.3's gallivm), while a texel load gathers in registers: a 1×4096×4096
/// GEMV read its matrix 2–4× faster that way, and a 16 MiB add its operands 3× faster,
/// copies included (docs/BENCHMARKS.md). Each launch copies the inputs into their textures
/// first, in the same command list, so the kernel always reads the tensors' current values.
pub(crate) struct TexRead {
    /// The inputs read through textures, in the order of their bindings.
    pub inputs: Vec<TexInput>,
    /// The passes: as [`OpSource::aligned`]'s, with `var tex_<name>` (of the WGSL type
    /// [`texel`] gives) at the bindings after the tensors' ([`texture_binding`]).
    pub passes: PassSources,
}

/// One input of a [`TexRead`] variant: rows of its values, `row_stride` elements apart,
/// copied into a `width` × `height` texture.
pub(crate) struct TexInput {
    /// Which input (index into the plan's inputs).
    pub input: usize,
    /// Texels per row (a row's values / 4) and rows.
    pub width: u32,
    pub height: u32,
    /// Elements from one row's start to the next's in the input.
    pub row_stride: u64,
}

/// The `(texels per row, rows)` of a texture that holds a contiguous input of `quads` quads
/// (four values each) of `texel_bytes` per texel as whole rows, for adapters whose textures
/// are at most `max` texels wide and high: rows are a multiple of 256 bytes, as
/// buffer-to-texture copies require, and the widest such that divides `quads`. `None` when
/// no width fits.
pub(crate) fn flat_texture(quads: usize, texel_bytes: u64, max: u32) -> Option<(u32, u32)> {
    let align = (u64::from(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT) / texel_bytes).max(1) as usize;
    let max = max as usize;
    let mut width = quads.min(max) / align * align;
    while width >= align {
        if quads.is_multiple_of(width) && quads / width <= max {
            return Some((
                u32::try_from(width).ok()?,
                u32::try_from(quads / width).ok()?,
            ));
        }
        width -= align;
    }
    None
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
    let input = TexInput {
        input,
        width: u32::try_from(row_len / 4).ok()?,
        height: u32::try_from(rows).ok()?,
        row_stride: row_len as u64,
    };
    Some((input, decl))
}

/// The binding of the `slot`-th [`TexRead`] texture in a kernel with `tensors` tensors.
pub(crate) fn texture_binding(tensors: usize, slot: usize) -> u32 {
    (tensors + 1 + slot) as u32
}

/// Bytes of the textures a device keeps for [`TexRead`] inputs (one per size and binding
/// slot, shared by every plan of that size: each launch refills it, and one queue orders the
/// launches). A new texture that would pass this first evicts those no live plan holds; a
/// plan whose textures would still pass it runs without them.
const MAX_TEXTURE_BYTES: u64 = 256 << 20;

/// A texture of a [`TexRead`] input with its view, shared by the plans of one matrix size.
struct MatrixTexture {
    texture: wgpu::Texture,
    view: wgpu::TextureView,
    id: u64,
    bytes: u64,
}

/// The [`TexRead`] textures of a device by (texels per row, rows, format, binding slot), and
/// their bytes in all. The plans that read through a texture hold it too: one held by the
/// map alone belongs to no live plan.
#[derive(Default)]
struct MatrixTextures {
    by_size: HashMap<(u32, u32, wgpu::TextureFormat, usize), Arc<MatrixTexture>>,
    bytes: u64,
}

/// A plan's [`TexRead`] variant, compiled.
struct Textured {
    inputs: Vec<TexSlot>,
    passes: Passes,
    bgl: wgpu::BindGroupLayout,
}

/// One input of a compiled [`TexRead`] variant with its texture.
struct TexSlot {
    input: usize,
    width: u32,
    height: u32,
    bytes_per_row: u32,
    /// Bytes per texel: the copy starts on a multiple of it.
    texel_bytes: u64,
    tex: Arc<MatrixTexture>,
}

/// One compiled pass.
struct Pipe {
    pipeline: wgpu::ComputePipeline,
}

/// Compiled passes with their grids.
type Passes = Vec<(Arc<Pipe>, [u32; 3])>;

type GroupKey = (u64, Vec<(u64, u64, u64)>);

/// The operator pipelines and bind groups of one device.
#[derive(Default)]
pub(crate) struct OpCache {
    /// Bind group layouts by tensor count (binding 0 is the constants) and the formats of the
    /// textures that follow the tensors ([`TexRead`]).
    layouts: Mutex<LayoutMap>,
    /// [`TexRead`] textures.
    textures: Mutex<MatrixTextures>,
    /// Pipelines by source.
    pipes: Mutex<HashMap<String, Arc<Pipe>>>,
    /// Bind groups by (constants buffer, tensor windows).
    groups: Arc<Mutex<HashMap<GroupKey, wgpu::BindGroup>>>,
    /// Bound in place of an empty tensor (a binding cannot be empty).
    dummy: Mutex<Option<DevBuf>>,
}

/// [`OpCache`]'s bind group layouts.
type LayoutMap =
    HashMap<(usize, Vec<wgpu::TextureFormat>), (wgpu::BindGroupLayout, wgpu::PipelineLayout)>;

/// Pipelines kept before the cache is emptied.
const MAX_CACHED_PIPELINES: usize = 1024;

/// Bind groups kept before the cache is emptied (each holds its buffers alive).
const MAX_CACHED_GROUPS: usize = 4096;

impl OpCache {
    fn layout(
        &self,
        device: &wgpu::Device,
        tensors: usize,
        textures: &[wgpu::TextureFormat],
    ) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
        let mut l = self.layouts.lock();
        l.entry((tensors, textures.to_vec()))
            .or_insert_with(|| {
                let mut entries: Vec<wgpu::BindGroupLayoutEntry> = (0..=tensors)
                    .map(|b| wgpu::BindGroupLayoutEntry {
                        binding: b as u32,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Storage { read_only: b == 0 },
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    })
                    .collect();
                for (slot, format) in textures.iter().enumerate() {
                    let sample_type = match format {
                        wgpu::TextureFormat::Rgba16Uint => wgpu::TextureSampleType::Uint,
                        _ => wgpu::TextureSampleType::Float { filterable: false },
                    };
                    entries.push(wgpu::BindGroupLayoutEntry {
                        binding: texture_binding(tensors, slot),
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Texture {
                            sample_type,
                            view_dimension: wgpu::TextureViewDimension::D2,
                            multisampled: false,
                        },
                        count: None,
                    });
                }
                let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some("unirt op"),
                    entries: &entries,
                });
                let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: Some("unirt op"),
                    bind_group_layouts: &[Some(&bgl)],
                    immediate_size: OP_IMMEDIATE_BYTES,
                });
                (bgl, pl)
            })
            .clone()
    }

    fn pipe(
        &self,
        device: &wgpu::Device,
        name: &str,
        source: &str,
        entry: &str,
        layout: &wgpu::PipelineLayout,
        zero_workgroup_memory: bool,
    ) -> Result<Arc<Pipe>> {
        let key = format!("{entry}\n{zero_workgroup_memory}\n{source}");
        if let Some(p) = self.pipes.lock().get(&key) {
            return Ok(p.clone());
        }
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: Some(layout),
            module: &module,
            entry_point: Some(entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                zero_initialize_workgroup_memory: zero_workgroup_memory,
                ..Default::default()
            },
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::KernelCompile {
                kernel: name.into(),
                log: e.to_string(),
            });
        }
        let p = Arc::new(Pipe { pipeline });
        let mut pipes = self.pipes.lock();
        // Host forms write shapes into their code (`wgsl::view_index`), so a program that
        // sees ever new shapes would grow this map without end; plans hold their own pipelines,
        // so emptying it only costs later plans a compile.
        if pipes.len() >= MAX_CACHED_PIPELINES {
            pipes.clear();
        }
        pipes.insert(key, p.clone());
        Ok(p)
    }

    /// The shared texture of a `width` × `height` [`TexRead`] input in `format`, of
    /// `texel_bytes` per texel, for binding slot `slot` (the inputs of one launch need
    /// textures of their own); `None` when keeping it would pass [`MAX_TEXTURE_BYTES`] or the
    /// device refuses it (the plan runs without).
    fn texture(
        &self,
        device: &wgpu::Device,
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
        if textures.bytes + size > MAX_TEXTURE_BYTES {
            // Plans take their clones under this lock, so a texture held by the map alone
            // stays unheld while it is dropped (a launch in flight keeps its own references).
            textures.by_size.retain(|_, t| Arc::strong_count(t) > 1);
            textures.bytes = textures.by_size.values().map(|t| t.bytes).sum();
            if textures.bytes + size > MAX_TEXTURE_BYTES {
                return None;
            }
        }
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
        let t = Arc::new(MatrixTexture {
            texture,
            view,
            id: crate::handles::fresh_id(),
            bytes: size,
        });
        textures.bytes += size;
        textures
            .by_size
            .insert((width, height, format, slot), t.clone());
        Some(t)
    }

    /// Drops the cached bind groups that use buffer `id` (it is being freed).
    pub fn forget_buffer(&self, id: u64) {
        self.groups
            .lock()
            .retain(|k, _| k.0 != id && !k.1.iter().any(|(b, _, _)| *b == id));
    }
}

/// An operator kernel prepared for one plan.
pub(crate) struct OpKernel {
    name: String,
    passes: Passes,
    /// The quad passes (see [`OpSource::aligned`]).
    aligned: Option<Passes>,
    /// The quad passes that read an input through a texture (see [`TexRead`]).
    textured: Option<Textured>,
    bgl: wgpu::BindGroupLayout,
    cfg: wgpu::Buffer,
    cfg_id: u64,
    groups: Arc<Mutex<HashMap<GroupKey, wgpu::BindGroup>>>,
    /// The plan's fault word, for a kernel that can fault (see `fault.rs`).
    fault: Option<Arc<FaultWord>>,
}

impl Drop for OpKernel {
    fn drop(&mut self) {
        let id = self.cfg_id;
        self.groups.lock().retain(|k, _| k.0 != id);
    }
}

impl PreparedKernel for OpKernel {
    fn launch(
        &self,
        backend: &AnyBackend,
        call: &KernelCall<'_>,
        ranges: &[(DevicePtr, u64)],
        stream: StreamId,
    ) -> Result<()> {
        match backend {
            AnyBackend::Wgpu(b) => b.launch_op(self, call, ranges, stream),
            _ => Err(Error::Internal(format!(
                "{}: a wgpu kernel launched on another backend",
                self.name
            ))),
        }
    }
}

/// The wgpu backend of a plan's device.
fn backend_of(spec: &PlanSpec<'_>) -> Result<Arc<AnyBackend>> {
    let rt = crate::Runtime::get(spec.device)?;
    Ok(rt.backend().clone())
}

/// Compiles `src` for the plan's device and makes its constants buffer (a wgpu panic meanwhile
/// is an error, see `guard.rs`).
pub(crate) fn prepare(spec: &PlanSpec<'_>, src: OpSource) -> Result<Arc<dyn PreparedKernel>> {
    guarded("prepare an operator kernel", || {
        prepare_unguarded(spec, src, None)
    })
}

/// What a kernel that can find bad data on the device checks: values must lie in `0..limit`;
/// `wide` when they are 64-bit. Its passes declare the fault word with
/// [`super::super::fault::wgsl`] at binding `tensors + 1` and claim it with `fault_claim`.
pub(crate) struct FaultSpec {
    pub limit: u64,
    pub wide: bool,
}

/// [`prepare`] for a kernel that can fault (see `fault.rs`): the plan owns a fault word bound
/// after its tensors, and every launch has its stream check it at the next synchronisation.
pub(crate) fn prepare_checked(
    spec: &PlanSpec<'_>,
    src: OpSource,
    fault: FaultSpec,
) -> Result<Arc<dyn PreparedKernel>> {
    guarded("prepare an operator kernel", || {
        prepare_unguarded(spec, src, Some(fault))
    })
}

fn prepare_unguarded(
    spec: &PlanSpec<'_>,
    src: OpSource,
    fault: Option<FaultSpec>,
) -> Result<Arc<dyn PreparedKernel>> {
    let backend = backend_of(spec)?;
    let AnyBackend::Wgpu(b) = &*backend else {
        return Err(Error::Internal(format!(
            "{}: a wgpu kernel planned for {}",
            src.name, spec.device
        )));
    };
    let gpu = &b.gpu;
    let device = &gpu.device;
    let limits = device.limits();
    if !device.features().contains(wgpu::Features::IMMEDIATES)
        || limits.max_immediate_size < OP_IMMEDIATE_BYTES
    {
        return Err(Error::unsupported(
            format!(
                "{} on {}: the adapter lacks {OP_IMMEDIATE_BYTES} bytes of immediates \
                 (IMMEDIATES feature, max_immediate_size {})",
                src.name, spec.device, limits.max_immediate_size
            ),
            DeviceKind::Wgpu,
        ));
    }
    let tensors = spec.inputs.len() + spec.outputs.len();
    let bindings = tensors + 1 + usize::from(fault.is_some());
    if tensors > MAX_TENSORS || bindings as u32 > limits.max_storage_buffers_per_shader_stage {
        return Err(Error::unsupported(
            format!(
                "{} on {}: {bindings} storage bindings (the adapter allows {})",
                src.name, spec.device, limits.max_storage_buffers_per_shader_stage
            ),
            DeviceKind::Wgpu,
        ));
    }
    let cache = &gpu.kernels.ops;
    // The fault word is one more read-write binding after the tensors.
    let (bgl, pl) = cache.layout(device, bindings - 1, &[]);
    let entry = src.entry.as_deref().unwrap_or("main");
    let compile = |list: &[(String, [u32; 3])], pl: &wgpu::PipelineLayout| -> Result<Passes> {
        list.iter()
            .map(|(source, groups)| {
                Ok((
                    cache.pipe(
                        device,
                        &src.name,
                        source,
                        entry,
                        pl,
                        src.zero_workgroup_memory,
                    )?,
                    *groups,
                ))
            })
            .collect()
    };
    let passes = compile(&src.passes, &pl)?;
    let aligned = src
        .aligned
        .as_deref()
        .map(|a| compile(a, &pl))
        .transpose()?;
    let textured = match src.textured {
        Some(t) if fault.is_none() && aligned.is_some() => {
            textured(gpu, spec, t, bindings - 1, |list, pl| compile(list, pl))?
        }
        _ => None,
    };
    let bytes = ceil4((src.cfg.len().max(1) * 4) as u64);
    let cfg = create_buffer(
        device,
        bytes,
        wgpu::BufferUsages::STORAGE,
        true,
        &spec.device.to_string(),
    )?;
    {
        let mut view = cfg
            .slice(..)
            .get_mapped_range_mut()
            .map_err(|e| Error::Internal(format!("constants buffer not mapped: {e}")))?;
        let words: &[u8] = bytemuck::cast_slice(&src.cfg);
        view.slice(..words.len()).copy_from_slice(words);
    }
    cfg.unmap();
    let fault = fault
        .map(|f| FaultWord::new(gpu, &src.name, f.limit, f.wide))
        .transpose()?;
    Ok(Arc::new(OpKernel {
        fault,
        name: src.name,
        passes,
        aligned,
        textured,
        bgl,
        cfg,
        cfg_id: crate::handles::fresh_id(),
        groups: cache.groups.clone(),
    }))
}

/// Compiles a [`TexRead`] variant with its textures, when the device can hold the textures
/// and copy into them: each input's dtype has a texel format ([`texel`]), its texture fits
/// the adapter's 2-D texture size, and its rows are 256-byte multiples apart (wgpu's rule for
/// buffer-to-texture copies).
fn textured(
    gpu: &super::super::gpu::Gpu,
    spec: &PlanSpec<'_>,
    t: TexRead,
    tensors: usize,
    compile: impl Fn(&[(String, [u32; 3])], &wgpu::PipelineLayout) -> Result<Passes>,
) -> Result<Option<Textured>> {
    let device = &gpu.device;
    let max = device.limits().max_texture_dimension_2d;
    let cache = &gpu.kernels.ops;
    let mut inputs = Vec::with_capacity(t.inputs.len());
    let mut formats = Vec::with_capacity(t.inputs.len());
    for (slot, i) in t.inputs.iter().enumerate() {
        let Some(dt) = spec.inputs.get(i.input).map(|d| d.dtype) else {
            return Ok(None);
        };
        let Some(Texel {
            format,
            bytes: texel_bytes,
            ..
        }) = texel(dt)
        else {
            return Ok(None);
        };
        let bytes_per_row = i.row_stride * dt.size() as u64;
        let usable = (1..=max).contains(&i.width)
            && (1..=max).contains(&i.height)
            && bytes_per_row.is_multiple_of(u64::from(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT))
            && bytes_per_row >= u64::from(i.width) * texel_bytes;
        let bytes_per_row = match u32::try_from(bytes_per_row) {
            Ok(b) if usable => b,
            _ => return Ok(None),
        };
        let Some(tex) = cache.texture(device, (i.width, i.height), format, texel_bytes, slot)
        else {
            return Ok(None);
        };
        formats.push(format);
        inputs.push(TexSlot {
            input: i.input,
            width: i.width,
            height: i.height,
            bytes_per_row,
            texel_bytes,
            tex,
        });
    }
    if inputs.is_empty() {
        return Ok(None);
    }
    let (bgl, pl) = cache.layout(device, tensors, &formats);
    Ok(Some(Textured {
        inputs,
        passes: compile(&t.passes, &pl)?,
        bgl,
    }))
}

/// One bound tensor: buffer id, window offset and size.
struct Bound {
    buf: DevBuf,
    offset: u64,
    size: u64,
}

impl WgpuBackend {
    /// Enqueues one launch of an operator kernel (see the module doc); a wgpu panic meanwhile
    /// is an error (see `guard.rs`).
    pub(crate) fn launch_op(
        &self,
        k: &OpKernel,
        call: &KernelCall<'_>,
        ranges: &[(DevicePtr, u64)],
        stream: StreamId,
    ) -> Result<()> {
        guarded("launch an operator kernel", || {
            self.launch_op_unguarded(k, call, ranges, stream)
        })
    }

    fn launch_op_unguarded(
        &self,
        k: &OpKernel,
        call: &KernelCall<'_>,
        ranges: &[(DevicePtr, u64)],
        stream: StreamId,
    ) -> Result<()> {
        let s = self.stream(stream)?;
        let mut pins = Pins::new();
        let mut work = 0;
        for (p, len) in ranges {
            self.mem.device_range(p.0, *len, &mut pins)?;
            work += *len;
        }
        let gpu = &self.gpu;
        let fixed = &gpu.kernels;
        let cache = &fixed.ops;
        let mut imm = [0u32; 8];
        let mut bound = Vec::with_capacity(MAX_TENSORS);
        for (i, t) in call.inputs.iter().chain(call.outputs).enumerate() {
            let size = t.dtype.size() as u64;
            let span = t.layout.span_end().unwrap_or(0) as u64 * size;
            let start = t.ptr();
            let len = (t.base + span).saturating_sub(start);
            if t.layout.numel() == 0 || len == 0 {
                let mut slot = cache.dummy.lock();
                let dummy = match &*slot {
                    Some(d) => d.clone(),
                    None => {
                        let usage = wgpu::BufferUsages::STORAGE;
                        let b = create_buffer(&gpu.device, 16, usage, false, &gpu.name)?;
                        slot.insert(DevBuf::new(b, false)).clone()
                    }
                };
                drop(slot);
                bound.push(Bound {
                    buf: dummy,
                    offset: 0,
                    size: 16,
                });
                continue;
            }
            let (buf, off) = {
                let a = self
                    .mem
                    .device_range(start, len, &mut pins)?
                    .ok_or_else(|| Error::Internal("an empty tensor range".into()))?;
                (a.payload.clone(), start - a.base)
            };
            let (w_off, w_size) = window(fixed.max_binding, fixed.binding_align, &buf, off, len)?;
            let rel = off - w_off;
            if rel % size != 0 {
                return Err(Error::Internal(format!(
                    "{}: tensor {i} is not element-aligned in its binding",
                    k.name
                )));
            }
            let slot = imm
                .get_mut(i)
                .ok_or_else(|| Error::Internal(format!("{}: too many tensors", k.name)))?;
            *slot = u32::try_from(rel / size).map_err(|_| tensor_too_large(len, fixed))?;
            bound.push(Bound {
                buf,
                offset: w_off,
                size: w_size,
            });
        }
        let tensors = bound.len();
        if let Some(f) = &k.fault {
            bound.push(Bound {
                buf: f.buf.clone(),
                offset: 0,
                size: FAULT_BYTES,
            });
        }
        let quads = imm[..tensors].iter().all(|o| o % 4 == 0);
        // The texture variant (compiled only beside the quad variant) where the quad variant
        // applies and every copy can start at its input: the byte offset in the buffer, the
        // window's start plus the element offset, must be a multiple of the texel's bytes.
        let copies: Option<Vec<TexCopy>> = k.textured.as_ref().filter(|_| quads).and_then(|t| {
            t.inputs
                .iter()
                .map(|s| {
                    let (b, elem) = (bound.get(s.input)?, call.inputs.get(s.input)?.dtype.size());
                    let off = b.offset + u64::from(imm[s.input]) * elem as u64;
                    off.is_multiple_of(s.texel_bytes).then(|| TexCopy {
                        src: b.buf.buffer.clone(),
                        src_off: off,
                        bytes_per_row: s.bytes_per_row,
                        texture: s.tex.texture.clone(),
                        width: s.width,
                        height: s.height,
                    })
                })
                .collect()
        });
        let mut cmds = Vec::with_capacity(4);
        let (passes, group) = match (k.textured.as_ref().zip(copies), &k.aligned) {
            (Some((t, copies)), _) => {
                cmds.extend(copies.into_iter().map(Cmd::ToTexture));
                let tex: Vec<&MatrixTexture> = t.inputs.iter().map(|s| &*s.tex).collect();
                (&t.passes, self.op_group(k, &t.bgl, &bound, &tex)?)
            }
            (None, Some(aligned)) if quads => (aligned, self.op_group(k, &k.bgl, &bound, &[])?),
            _ => (&k.passes, self.op_group(k, &k.bgl, &bound, &[])?),
        };
        cmds.extend(passes.iter().map(|(p, groups)| Cmd::Dispatch {
            pipeline: p.pipeline.clone(),
            group: group.clone(),
            imm: Imm { words: imm, len: 8 },
            groups: *groups,
        }));
        cmds.extend(k.fault.clone().map(Cmd::Check));
        enqueue(gpu, &s, cmds, pins, work, false)
    }

    /// The bind group of `bound` (and the textures `tex` after them) for layout `bgl`, cached.
    fn op_group(
        &self,
        k: &OpKernel,
        bgl: &wgpu::BindGroupLayout,
        bound: &[Bound],
        tex: &[&MatrixTexture],
    ) -> Result<wgpu::BindGroup> {
        let mut windows: Vec<(u64, u64, u64)> =
            bound.iter().map(|b| (b.buf.id, b.offset, b.size)).collect();
        // Texture ids come from the same counter as buffer ids: no window matches one.
        windows.extend(tex.iter().map(|t| (t.id, u64::MAX, 0)));
        let key: GroupKey = (k.cfg_id, windows);
        if let Some(g) = k.groups.lock().get(&key) {
            return Ok(g.clone());
        }
        let device = &self.gpu.device;
        let mut entries = Vec::with_capacity(bound.len() + 1 + tex.len());
        entries.push(wgpu::BindGroupEntry {
            binding: 0,
            resource: k.cfg.as_entire_binding(),
        });
        for (i, b) in bound.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &b.buf.buffer,
                    offset: b.offset,
                    size: NonZeroU64::new(b.size),
                }),
            });
        }
        for (slot, t) in tex.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: texture_binding(bound.len(), slot),
                resource: wgpu::BindingResource::TextureView(&t.view),
            });
        }
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("unirt op"),
            layout: bgl,
            entries: &entries,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(wgpu_error("create_bind_group", e));
        }
        let mut groups = k.groups.lock();
        if groups.len() >= MAX_CACHED_GROUPS {
            groups.clear();
        }
        groups.insert(key, group.clone());
        Ok(group)
    }
}

fn tensor_too_large(len: u64, k: &super::Kernels) -> Error {
    Error::TooLarge {
        device: "wgpu (one storage binding of an operator kernel)".into(),
        requested: len,
        limit: k.max_binding,
    }
}

/// The window `(offset, size)` of `buf` to bind for `len` bytes at byte `off`: the whole
/// buffer when it fits one binding, else from `off` aligned down.
fn window(max_binding: u64, align: u64, buf: &DevBuf, off: u64, len: u64) -> Result<(u64, u64)> {
    let size = buf.buffer.size();
    if size <= max_binding {
        return Ok((0, size));
    }
    let start = off - off % align;
    let end = ceil4(off + len).min(size);
    if end - start > max_binding {
        return Err(Error::TooLarge {
            device: format!(
                "wgpu (a tensor of an operator kernel must fit one storage binding: \
                 max_storage_buffer_binding_size {max_binding} bytes)"
            ),
            requested: len,
            limit: max_binding.saturating_sub(align),
        });
    }
    Ok((start, end - start))
}
