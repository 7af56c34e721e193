//! Operator kernels as [`PreparedKernel`]s: what every op family shares.
//!
//! A family turns a [`PlanSpec`] into an [`OpSource`] (generated WGSL, one or more passes, and the
//! plan's constants); [`prepare`] compiles each pass once per device (cached by source, so plans
//! with the same shapes of code share pipelines; the device's caches are [`OpCache`], in
//! `op_cache.rs`), makes the constants buffer and returns an [`OpKernel`]. A launch
//! ([`launch_op`](super::super::WgpuBackend::launch_op), in `op_launch.rs`) checks the launch's
//! byte ranges against the allocation table, binds each tensor's buffer (the whole buffer when it
//! fits one storage binding, so the bind group is the same for every launch on that buffer and the
//! cache hits; else a window aligned to `min_storage_buffer_offset_alignment`), puts the tensors'
//! element offsets in the immediates, and enqueues the dispatches as stream commands — which
//! stream capture records like any other, so op launches can be captured. A kernel for the host's
//! cores may read some inputs through textures instead ([`TexRead`], `textures.rs`); its launch
//! puts the copies into the textures before the dispatches, and states the bytes it writes (its
//! outputs') for `contents.rs`.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use parking_lot::Mutex;

use super::super::fault::FaultWord;
use super::super::guard::{guarded_retry, release};
use super::super::memory::{ceil4, create_buffer, DevBuf};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::hal::{DevicePtr, StreamId};
use crate::ops::{KernelCall, PlanSpec, PreparedKernel};
use crate::vendors::AnyBackend;

pub(crate) use super::op_cache::OpCache;
pub(super) use super::op_cache::{GroupKey, Passes, MAX_CACHED_GROUPS};
use super::shapes::ShapeHistory;
use super::textures::TexSlot;
pub(crate) use super::textures::{
    texel, texture_binding, texture_rows, TexInput, TexRead, Texel, PLANNED_TEXTURE_DIM,
};

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
    /// A variant that reads some inputs through textures (see [`TexRead`]), usually of
    /// `aligned`: taken by launches where every tensor starts on a multiple of four elements
    /// (as `aligned` is) and whose texture inputs the copies can read.
    pub textured: Option<TexRead>,
    /// Whether workgroup memory starts zeroed, as WebGPU guarantees: kept for user kernels.
    /// unirt's own kernels write every workgroup element before they read it, and skip the
    /// zeroing: on GL, naga writes it as one array constructor per variable, which llvmpipe
    /// took 18 s to compile for the tiled GEMM (0.3 s without).
    pub zero_workgroup_memory: bool,
}

impl OpSource {
    /// A kernel of `passes` over constants `cfg` with no variant: entry `main`, no quad or
    /// texture passes, workgroup memory not zeroed.
    pub fn plain(name: impl Into<String>, passes: PassSources, cfg: Vec<u32>) -> OpSource {
        OpSource {
            name: name.into(),
            passes,
            cfg,
            entry: None,
            aligned: None,
            textured: None,
            zero_workgroup_memory: false,
        }
    }

    /// [`OpSource::plain`] with a quad variant and a texture variant, where the family has
    /// them.
    pub fn variants(
        name: impl Into<String>,
        passes: PassSources,
        cfg: Vec<u32>,
        aligned: Option<PassSources>,
        textured: Option<TexRead>,
    ) -> OpSource {
        OpSource {
            aligned,
            textured,
            ..OpSource::plain(name, passes, cfg)
        }
    }
}

/// A plan's [`TexRead`] variant, compiled.
pub(super) struct Textured {
    pub(super) inputs: Vec<TexSlot>,
    pub(super) passes: Passes,
    pub(super) bgl: wgpu::BindGroupLayout,
}

/// An operator kernel prepared for one plan.
pub(crate) struct OpKernel {
    pub(super) name: String,
    pub(super) passes: Passes,
    /// The quad passes (see [`OpSource::aligned`]).
    pub(super) aligned: Option<Passes>,
    /// The quad passes that read an input through a texture (see [`TexRead`]).
    pub(super) textured: Option<Textured>,
    /// Released by [`OpKernel`]'s drop (see there), hence `ManuallyDrop`.
    pub(super) bgl: ManuallyDrop<wgpu::BindGroupLayout>,
    /// The constants (shared with the kernels whose constants are equal).
    pub(super) cfg: ManuallyDrop<Arc<wgpu::Buffer>>,
    /// This kernel's key in the bind group cache (its own, though `cfg` may be shared: a
    /// bind group is made for one layout).
    pub(super) cfg_id: u64,
    pub(super) groups: Arc<Mutex<HashMap<GroupKey, wgpu::BindGroup>>>,
    /// The plan's fault word, for a kernel that can fault (see `fault.rs`).
    pub(super) fault: Option<Arc<FaultWord>>,
    /// The plan's scratch buffer and its size (see [`prepare_scratch`]).
    pub(super) scratch: Option<(DevBuf, u64)>,
    /// A user kernel: its source may write any tensor it binds, inputs included.
    pub(super) writes_inputs: bool,
}

/// A plan is dropped wherever its owner drops it, outside the guarded backend calls: each
/// wgpu object the kernel holds is released through [`release`], so that wgpu's GL backend
/// timing out on its context lock (another thread's long dispatch) leaks the object instead
/// of panicking in the caller's thread, or aborting the process if that thread was already
/// unwinding.
impl Drop for OpKernel {
    fn drop(&mut self) {
        let id = self.cfg_id;
        // Out of the cache first, released after the lock is let go.
        let gone: Vec<wgpu::BindGroup> = self
            .groups
            .lock()
            .extract_if(|k, _| k.0 == id)
            .map(|(_, g)| g)
            .collect();
        for g in gone {
            release(g);
        }
        for p in std::mem::take(&mut self.passes) {
            release(p);
        }
        for p in self.aligned.take().into_iter().flatten() {
            release(p);
        }
        if let Some(Textured {
            inputs,
            passes,
            bgl,
        }) = self.textured.take()
        {
            for t in inputs {
                release(t);
            }
            for p in passes {
                release(p);
            }
            release(bgl);
        }
        release(self.scratch.take());
        release(self.fault.take());
        // SAFETY: `bgl` and `cfg` are taken once, here, and never used again: the kernel is
        // being dropped.
        let (bgl, cfg) = unsafe {
            (
                ManuallyDrop::take(&mut self.bgl),
                ManuallyDrop::take(&mut self.cfg),
            )
        };
        release(bgl);
        release(cfg);
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

/// `f` of the shape history of the plan's device (`None` where it is not a wgpu device).
pub(super) fn with_shape_history<T>(
    spec: &PlanSpec<'_>,
    f: impl FnOnce(&ShapeHistory) -> T,
) -> Option<T> {
    let backend = backend_of(spec).ok()?;
    match &*backend {
        AnyBackend::Wgpu(b) => Some(f(&b.gpu.kernels.ops.shapes)),
        _ => None,
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
    guarded_retry("prepare an operator kernel", || {
        prepare_unguarded(spec, &src, None, 0)
    })
}

/// [`prepare`] for a kernel whose passes hand each other `scratch_bytes` of results through a
/// buffer the plan owns, bound after its tensors (binding `tensors + 1`, declared by the
/// passes). Launches of one plan on several streams share it safely: a wgpu device has one
/// queue, which runs them one after another, and wgpu orders every dispatch that writes a
/// buffer after the dispatches before it that read or wrote it.
pub(crate) fn prepare_scratch(
    spec: &PlanSpec<'_>,
    src: OpSource,
    scratch_bytes: u64,
) -> Result<Arc<dyn PreparedKernel>> {
    guarded_retry("prepare an operator kernel", || {
        prepare_unguarded(spec, &src, None, scratch_bytes.max(4))
    })
}

/// What a kernel that can find bad data on the device checks: values must lie in `0..limit`;
/// `wide` when they are 64-bit. Its passes declare the fault word with
/// [`super::super::fault::wgsl`] at binding `tensors + 1` and claim it with `fault_claim`.
#[derive(Clone, Copy)]
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
    guarded_retry("prepare an operator kernel", || {
        prepare_unguarded(spec, &src, Some(fault), 0)
    })
}

fn prepare_unguarded(
    spec: &PlanSpec<'_>,
    src: &OpSource,
    fault: Option<FaultSpec>,
    scratch_bytes: u64,
) -> Result<Arc<dyn PreparedKernel>> {
    let writes_inputs = src.entry.is_some();
    if fault.is_some() && scratch_bytes > 0 {
        return Err(Error::Internal(format!(
            "{}: a kernel with both a fault word and a scratch buffer",
            src.name
        )));
    }
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
    let bindings = tensors + 1 + usize::from(fault.is_some() || scratch_bytes > 0);
    if tensors > MAX_TENSORS || bindings as u32 > limits.max_storage_buffers_per_shader_stage {
        return Err(Error::unsupported(
            format!(
                "{} on {}: {bindings} storage bindings (the adapter allows {})",
                src.name, spec.device, limits.max_storage_buffers_per_shader_stage
            ),
            DeviceKind::Wgpu,
        ));
    }
    // A dispatch of more workgroups than the adapter allows fails when its command buffer is
    // encoded, and takes the work batched with it down too (launches queued before it on the
    // stream were lost, and later reads of their results saw zeros): refused here instead.
    let max_groups = limits.max_compute_workgroups_per_dimension;
    let variants = [
        Some(&src.passes),
        src.aligned.as_ref(),
        src.textured.as_ref().map(|t| &t.passes),
    ];
    for (_, groups) in variants.into_iter().flatten().flatten() {
        if groups.iter().any(|&g| g > max_groups) {
            return Err(Error::BadParam(format!(
                "{} on {}: a dispatch of {groups:?} workgroups (the adapter allows {max_groups} \
                 per dimension)",
                src.name, spec.device
            )));
        }
    }
    let cache = &gpu.kernels.ops;
    // The fault word or the scratch buffer is one more read-write binding after the tensors.
    let (bgl, pl) = cache.layout(device, bindings - 1, &[]);
    let plain_layout = layout_key(bindings - 1, &[]);
    let entry = src.entry.as_deref().unwrap_or("main");
    let compile =
        |list: &[(String, [u32; 3])], pl: (&wgpu::PipelineLayout, &str)| -> Result<Passes> {
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
    let passes = compile(&src.passes, (&pl, &plain_layout))?;
    let aligned = src
        .aligned
        .as_deref()
        .map(|a| compile(a, (&pl, &plain_layout)))
        .transpose()?;
    let textured = match &src.textured {
        // After the tensors and a scratch buffer, if any (a fault word's kernels have no
        // texture variant).
        Some(t) if fault.is_none() => textured(gpu, spec, t.clone(), bindings - 1, |list, pl| {
            compile(list, pl)
        })?,
        _ => None,
    };
    let cfg = cache.constants(device, &src.cfg, &spec.device.to_string())?;
    let fault = fault
        .map(|f| FaultWord::new(gpu, &src.name, f.limit, f.wide))
        .transpose()?;
    let scratch = (scratch_bytes > 0)
        .then(|| {
            let size = ceil4(scratch_bytes);
            let b = create_buffer(device, size, wgpu::BufferUsages::STORAGE, false, &gpu.name)?;
            Ok::<_, Error>((DevBuf::new(b, false), size))
        })
        .transpose()?;
    Ok(Arc::new(OpKernel {
        fault,
        scratch,
        writes_inputs,
        name: src.name.clone(),
        passes,
        aligned,
        textured,
        bgl: ManuallyDrop::new(bgl),
        cfg: ManuallyDrop::new(cfg),
        cfg_id: crate::handles::fresh_id(),
        groups: cache.groups.clone(),
    }))
}

/// What tells apart the pipeline layouts [`OpCache::layout`] makes: its arguments.
fn layout_key(buffers: usize, textures: &[wgpu::TextureFormat]) -> String {
    format!("{buffers} {textures:?}")
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
    compile: impl Fn(&[(String, [u32; 3])], (&wgpu::PipelineLayout, &str)) -> Result<Passes>,
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
            && (1..=i.width).contains(&i.last_width)
            && bytes_per_row.is_multiple_of(u64::from(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT))
            && bytes_per_row >= u64::from(i.width) * texel_bytes;
        let bytes_per_row = match u32::try_from(bytes_per_row) {
            Ok(b) if usable => b,
            _ => return Ok(None),
        };
        let Some(tex) = cache.texture(gpu, (i.width, i.height), format, texel_bytes, slot) else {
            return Ok(None);
        };
        formats.push(format);
        inputs.push(TexSlot {
            input: i.input,
            width: i.width,
            height: i.height,
            last_width: i.last_width,
            bytes_per_row,
            texel_bytes,
            format,
            tex,
            slot,
            reusable: i.reusable,
        });
    }
    if inputs.is_empty() {
        return Ok(None);
    }
    let (bgl, pl) = cache.layout(device, tensors, &formats);
    Ok(Some(Textured {
        inputs,
        passes: compile(&t.passes, (&pl, &layout_key(tensors, &formats)))?,
        bgl,
    }))
}
