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
//! A kernel for the host's cores may read one matrix through a texture instead
//! ([`TexRead`]); its launch puts the copy into the texture before the dispatches.

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
    /// A variant of `aligned` that reads one f32 input through a texture (see [`TexRead`]),
    /// taken by launches that `aligned` suits and whose texture input the copy can read.
    pub textured: Option<TexRead>,
    /// Whether workgroup memory starts zeroed, as WebGPU guarantees: kept for user kernels.
    /// unirt's own kernels write every workgroup element before they read it, and skip the
    /// zeroing: on GL, naga writes it as one array constructor per variable, which llvmpipe
    /// took 18 s to compile for the tiled GEMM (0.3 s without).
    pub zero_workgroup_memory: bool,
}

/// A matrix input read through a texture, one texel per four values of a row ([`texel`]:
/// `rgba32float` for f32, `rgba16float` for f16, `rgba16uint` for bf16's bits), by kernels
/// for adapters that run on the host's cores. There a storage load whose
/// address differs across the lanes is a scalar loop over the lanes with a stack round trip
/// per element (Mesa 22.3's gallivm), while a texel load gathers in registers: a 1×4096×4096
/// GEMV read its matrix 2–4× faster that way, copy included (docs/BENCHMARKS.md). Each
/// launch copies the matrix into the texture first, in the same command list, so the kernel
/// always reads the tensor's current values.
pub(crate) struct TexRead {
    /// Which input (index into the plan's inputs).
    pub input: usize,
    /// Texels per row (a row's values / 4) and rows.
    pub width: u32,
    pub height: u32,
    /// Elements from one row's start to the next's in the input.
    pub row_stride: u64,
    /// The passes: as [`OpSource::aligned`]'s, with `var tex_<name>` (of the WGSL type
    /// [`texel`] gives) at the binding after the tensors' ([`texture_binding`]).
    pub passes: PassSources,
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

/// The binding of a [`TexRead`] texture in a kernel with `tensors` tensors.
pub(crate) fn texture_binding(tensors: usize) -> u32 {
    tensors as u32 + 1
}

/// Bytes of the textures a device keeps for [`TexRead`] inputs (one per matrix size, shared
/// by every plan of that size: each launch refills it, and one queue orders the launches);
/// a plan whose texture would pass this runs without one.
const MAX_TEXTURE_BYTES: u64 = 256 << 20;

/// A texture of a [`TexRead`] input with its view, shared by the plans of one matrix size.
#[derive(Clone)]
struct MatrixTexture {
    texture: wgpu::Texture,
    view: wgpu::TextureView,
    id: u64,
}

/// The [`TexRead`] textures of a device by (texels per row, rows, format), and their bytes in
/// all.
#[derive(Default)]
struct MatrixTextures {
    by_size: HashMap<(u32, u32, wgpu::TextureFormat), MatrixTexture>,
    bytes: u64,
}

/// A plan's [`TexRead`] variant, compiled.
struct Textured {
    input: usize,
    width: u32,
    height: u32,
    bytes_per_row: u32,
    /// Bytes per texel: the copy starts on a multiple of it.
    texel_bytes: u64,
    passes: Passes,
    bgl: wgpu::BindGroupLayout,
    tex: MatrixTexture,
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
    /// Bind group layouts by tensor count (binding 0 is the constants) and the format of the
    /// texture that follows the tensors, if one does ([`TexRead`]).
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
    HashMap<(usize, Option<wgpu::TextureFormat>), (wgpu::BindGroupLayout, wgpu::PipelineLayout)>;

/// Pipelines kept before the cache is emptied.
const MAX_CACHED_PIPELINES: usize = 1024;

/// Bind groups kept before the cache is emptied (each holds its buffers alive).
const MAX_CACHED_GROUPS: usize = 4096;

impl OpCache {
    fn layout(
        &self,
        device: &wgpu::Device,
        tensors: usize,
        texture: Option<wgpu::TextureFormat>,
    ) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
        let mut l = self.layouts.lock();
        l.entry((tensors, texture))
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
                if let Some(format) = texture {
                    let sample_type = match format {
                        wgpu::TextureFormat::Rgba16Uint => wgpu::TextureSampleType::Uint,
                        _ => wgpu::TextureSampleType::Float { filterable: false },
                    };
                    entries.push(wgpu::BindGroupLayoutEntry {
                        binding: texture_binding(tensors),
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
    /// `texel_bytes` per texel; `None` when keeping it would pass [`MAX_TEXTURE_BYTES`] or the
    /// device refuses it (the plan runs without).
    fn texture(
        &self,
        device: &wgpu::Device,
        (width, height): (u32, u32),
        format: wgpu::TextureFormat,
        texel_bytes: u64,
    ) -> Option<MatrixTexture> {
        let mut textures = self.textures.lock();
        if let Some(t) = textures.by_size.get(&(width, height, format)) {
            return Some(t.clone());
        }
        let size = u64::from(width) * u64::from(height) * texel_bytes;
        if textures.bytes + size > MAX_TEXTURE_BYTES {
            return None;
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
        let t = MatrixTexture {
            texture,
            view,
            id: crate::handles::fresh_id(),
        };
        textures.bytes += size;
        textures.by_size.insert((width, height, format), t.clone());
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
    let (bgl, pl) = cache.layout(device, bindings - 1, None);
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

/// Compiles a [`TexRead`] variant with its texture, when the device can hold the texture and
/// copy into it: the input's dtype has a texel format ([`texel`]), the matrix fits the
/// adapter's 2-D texture size, and its rows are 256-byte multiples apart (wgpu's rule for
/// buffer-to-texture copies).
fn textured(
    gpu: &super::super::gpu::Gpu,
    spec: &PlanSpec<'_>,
    t: TexRead,
    tensors: usize,
    compile: impl Fn(&[(String, [u32; 3])], &wgpu::PipelineLayout) -> Result<Passes>,
) -> Result<Option<Textured>> {
    let device = &gpu.device;
    let Some(dt) = spec.inputs.get(t.input).map(|d| d.dtype) else {
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
    let max = device.limits().max_texture_dimension_2d;
    let bytes_per_row = t.row_stride * dt.size() as u64;
    let usable = (1..=max).contains(&t.width)
        && (1..=max).contains(&t.height)
        && bytes_per_row.is_multiple_of(u64::from(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT))
        && bytes_per_row >= u64::from(t.width) * texel_bytes;
    let bytes_per_row = match u32::try_from(bytes_per_row) {
        Ok(b) if usable => b,
        _ => return Ok(None),
    };
    let cache = &gpu.kernels.ops;
    let Some(tex) = cache.texture(device, (t.width, t.height), format, texel_bytes) else {
        return Ok(None);
    };
    let (bgl, pl) = cache.layout(device, tensors, Some(format));
    Ok(Some(Textured {
        input: t.input,
        width: t.width,
        height: t.height,
        bytes_per_row,
        texel_bytes,
        passes: compile(&t.passes, &pl)?,
        bgl,
        tex,
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
        // applies and the copy can start at the matrix: its byte offset in the buffer, the
        // window's start plus the element offset, must be a multiple of the texel's bytes.
        let textured = k.textured.as_ref().filter(|_| quads).and_then(|t| {
            let (b, elem) = (bound.get(t.input)?, call.inputs.get(t.input)?.dtype.size());
            let off = b.offset + u64::from(imm[t.input]) * elem as u64;
            off.is_multiple_of(t.texel_bytes)
                .then(|| (t, b.buf.buffer.clone(), off))
        });
        let mut cmds = Vec::with_capacity(4);
        let (passes, group) = match (textured, &k.aligned) {
            (Some((t, src, src_off)), _) => {
                cmds.push(Cmd::ToTexture(TexCopy {
                    src,
                    src_off,
                    bytes_per_row: t.bytes_per_row,
                    texture: t.tex.texture.clone(),
                    width: t.width,
                    height: t.height,
                }));
                (&t.passes, self.op_group(k, &t.bgl, &bound, Some(&t.tex))?)
            }
            (None, Some(aligned)) if quads => (aligned, self.op_group(k, &k.bgl, &bound, None)?),
            _ => (&k.passes, self.op_group(k, &k.bgl, &bound, None)?),
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

    /// The bind group of `bound` (and `tex` after them) for layout `bgl`, cached.
    fn op_group(
        &self,
        k: &OpKernel,
        bgl: &wgpu::BindGroupLayout,
        bound: &[Bound],
        tex: Option<&MatrixTexture>,
    ) -> Result<wgpu::BindGroup> {
        let mut windows: Vec<(u64, u64, u64)> =
            bound.iter().map(|b| (b.buf.id, b.offset, b.size)).collect();
        // Texture ids come from the same counter as buffer ids: no window matches one.
        windows.extend(tex.map(|t| (t.id, u64::MAX, 0)));
        let key: GroupKey = (k.cfg_id, windows);
        if let Some(g) = k.groups.lock().get(&key) {
            return Ok(g.clone());
        }
        let device = &self.gpu.device;
        let mut entries = Vec::with_capacity(bound.len() + 1);
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
        if let Some(t) = tex {
            entries.push(wgpu::BindGroupEntry {
                binding: texture_binding(bound.len()),
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
