//! The wgpu backend: every Vulkan / Metal / DX12 / GL adapter wgpu finds, as a unirt device.
//!
//! - **Devices**: one per adapter with compute shaders whose wgpu device can be created, in a
//!   stable order (`adapter.rs`). Discovery test-opens each adapter (requests its device with
//!   the adapter's own limits); one that fails is listed unusable with the driver's reason, not
//!   numbered. The first open of a device takes the device discovery created.
//! - **Memory**: device pointers are virtual addresses mapped to (buffer, offset)
//!   (`memory.rs`), so interior pointers and pointer arithmetic work; copies and sets of any
//!   size at any byte offset (`copy.rs`).
//! - **Streams**: each stream gathers commands and submits them as one encoder on flush; all
//!   streams share the one queue, whose submission order is execution order (`stream.rs`,
//!   `gpu.rs`). Events are timestamp queries where the adapter has them (`event.rs`).
//! - **Calls**: `backend.rs` is the [`Backend`] impl (each call guarded, checked, then
//!   enqueued), `launch.rs` launches the HAL's fixed kernels; this file holds the backend
//!   type, `probe()`, `open()` and the kernel registration.
//! - **Submissions**: every batch is encoded from a prepared plan (`plan.rs`); a graph's plan
//!   is made and validated once at instantiate, and each replay hands it to the submitter
//!   thread, which encodes it as one encoder and one submit (`graph.rs`, `gpu.rs`).
//! - **Kernels**: WGSL in `kernels/`: the HAL's fixed kernels and the operator kernels
//!   generated per op family, pipelines and bind groups cached per device. Two choices shape
//!   their speed on adapters that run on the host's cores (lavapipe, llvmpipe), where a
//!   workgroup is a loop of SIMD batches on one core: there a barrier spills every
//!   invocation's registers, every non-uniform storage load is a per-lane scalar load and a
//!   vector integer division is a loop of scalar ones. So on those adapters GEMM, the row
//!   kernels and rope take barrier-free forms chosen at plan time, and GEMM, elementwise,
//!   fused chains, norms and softmax have a *quad* variant that loads and stores four
//!   elements at once, which a launch takes when its tensors start on a multiple of four
//!   elements (`kernels/op.rs`, `OpSource::aligned`). Some of those variants read inputs
//!   through textures, copied in before the kernel; a weight's copy is skipped while the
//!   texture still holds its unchanged bytes, which every command list's stated writes
//!   decide, in submission order (`contents.rs`).
//! - **Matrix units, opt-in** (`kernels/matmul_coop.rs`): with `UNIRT_WGPU_COOP=1`, an
//!   adapter that offers cooperative matrices (wgpu's experimental feature) runs f16 and f32
//!   products on them, tiles chosen from the configurations the adapter reports; CI checks
//!   the kernel with its matrix operations emulated (`UNIRT_WGPU_COOP=emulate`).
//! - **Shapes in the code, until they change** (`kernels/shapes.rs`): on those adapters the
//!   host forms write extents and strides into their code (a division by a constant is a
//!   multiply), so every shape is a new kernel, 15–30 ms of compiling. From a structure's
//!   fourth shape on, its kernel reads the numbers that changed between its shapes from the
//!   constants (bound a second time as a uniform buffer; divisions by magic numbers) and
//!   keeps the others in its code, so a loop whose shapes change every step compiles once.
//! - **Mesa's loop limiter**: gallivm (lavapipe, llvmpipe) ends every loop of an invocation
//!   once it has run 65535 iterations in all, and the kernel returns a partial result
//!   silently. Every kernel whose loops grow with the data states its per-invocation count
//!   at plan time and takes a wider form, or fails with `Unsupported` naming the limit
//!   (`kernels/mod.rs`: `check_loops`, `host_form`, `row_lanes`: softmax and the norms
//!   share a long row among the fewest lanes that fit); reductions split a long row among
//!   workgroups (pass 1 into a scratch buffer the plan owns, `OpSource` through
//!   `op::prepare_scratch`), and sampling cuts the order by four-way searches instead of
//!   ranking candidates against each other, so neither is limited at a vocabulary's size.
//!
//! - **Process exit** (`exit.rs`): the drivers' exit handlers (LLVM, Mesa, glvnd's EGL) free
//!   their state while other threads compile, submit or exit, so every call into wgpu passes
//!   a gate that the exit hook (`src/exit.rs`) closes before them, then the hook waits for
//!   each device's queue; threads that used a GL adapter release their EGL state as they exit.
//!
//! Memory lifetimes follow [`crate::checked`]: commands pin the allocations they use until
//! their submission has completed (wgpu itself keeps a buffer alive while a submission uses
//! it; the pins matter for pinned host memory, which read-backs write and captured uploads
//! read), so `free` and `free_host` never wait for the device. Device addresses are virtual:
//! one given as the host side of a copy is refused, never dereferenced.
//!
//! wgpu reports validation errors through error scopes (used around every creation and
//! submission here) or an uncaptured-error handler (installed, recording instead of
//! panicking), so bad input is a typed error, never a panic.

mod adapter;
mod backend;
mod contents;
mod copy;
mod event;
mod exit;
mod fault;
mod gpu;
mod graph;
mod guard;
mod instance;
mod kernels;
mod launch;
mod loaders;
mod loss;
mod memory;
mod plan;
mod stream;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use event::WEvent;
use gpu::Gpu;
use graph::{WGraph, WGraphExec};
use memory::{AddressSpace, DevBuf};
use stream::WStream;

use crate::checked::{self, CheckedMemory, Pins};
use crate::device::{DeviceInfo, DeviceKind};
use crate::error::{Error, Result};
use crate::hal::Probe;
use crate::hal::*;
use crate::handles::HandleTable;
use crate::vendors::AnyBackend;

/// Discovery for the wgpu vendor (enumerates once per process; never panics).
pub fn probe() -> Probe {
    adapter::probe()
}

/// Registers the wgpu operator kernels.
pub(crate) fn register_kernels(reg: &mut crate::ops::KernelRegistry) {
    kernels::register(reg);
}

/// Refuses a plan whose tensors a WGSL kernel cannot index: kernels compute element indices,
/// strides and counts in 32-bit integers (WGSL has no 64-bit ones in the core language), so
/// every extent product (empty dimensions counted as 1) and every stride must fit a `u32`.
/// A tensor that large exceeds every adapter's storage binding anyway.
pub(crate) fn check_plan(spec: &crate::ops::PlanSpec<'_>) -> Result<()> {
    let limit = u64::from(u32::MAX);
    for t in spec.inputs.iter().chain(spec.outputs) {
        let points = t
            .layout
            .shape()
            .iter()
            .try_fold(1u64, |a, &n| a.checked_mul(n.max(1) as u64))
            .unwrap_or(u64::MAX);
        let stride = t.layout.strides().iter().copied().max().unwrap_or(0) as u64;
        if points > limit || stride > limit {
            return Err(Error::TooLarge {
                device: format!(
                    "wgpu ({}: kernels index a tensor of shape {:?} with 32-bit integers)",
                    spec.op,
                    t.layout.shape()
                ),
                requested: points.max(stride),
                limit,
            });
        }
    }
    Ok(())
}

/// Prepares a user kernel registered as WGSL for a plan on a wgpu device.
pub(crate) fn prepare_user_kernel(
    spec: &crate::ops::PlanSpec<'_>,
    kernel: &crate::ops::KernelImpl,
) -> Result<Arc<dyn crate::ops::PreparedKernel>> {
    kernels::prepare_user(spec, kernel)
}

/// Opens `wgpu:index`.
pub fn open(index: usize) -> Result<AnyBackend> {
    Ok(WgpuBackend::open(index)?.into())
}

/// An opened wgpu device.
pub struct WgpuBackend {
    info: DeviceInfo,
    name: String,
    gpu: Gpu,
    vas: AddressSpace,
    /// Device memory (virtual addresses over buffers) and pinned host memory.
    mem: CheckedMemory<DevBuf>,
    streams: HandleTable<WStream>,
    events: HandleTable<WEvent>,
    graphs: HandleTable<WGraph>,
    execs: HandleTable<WGraphExec>,
    default_stream: u64,
    /// Fault words noted on streams destroyed before they were synchronised: checked by the
    /// next device-wide synchronisation (see `fault.rs`).
    orphan_faults: parking_lot::Mutex<Vec<Arc<fault::FaultWord>>>,
    /// What the adapter's cooperative matrices offer the GEMM.
    coop: kernels::CoopCaps,
}

impl WgpuBackend {
    /// Opens the adapter discovery listed as `wgpu:index` and creates its wgpu device.
    pub fn open(index: usize) -> Result<Self> {
        let found = adapter::adapter(index)?;
        let name = format!("wgpu:{index}");
        let gpu = Gpu::open(
            &found.adapter,
            found.take_opened(),
            format!("{name} ({})", found.info.name),
        )?;
        let coop = kernels::CoopCaps::of(&found.adapter, &gpu.device);
        let name_for_mem = name.clone();
        let streams = HandleTable::new(StreamId::KIND);
        let (default_stream, _) = streams.insert(WStream::new())?;
        Ok(WgpuBackend {
            info: found.info.clone(),
            name,
            gpu,
            vas: AddressSpace::new(),
            mem: CheckedMemory::new(DeviceKind::Wgpu, name_for_mem, false),
            streams,
            events: HandleTable::new(EventId::KIND),
            graphs: HandleTable::new(GraphId::KIND),
            execs: HandleTable::new(GraphExecId::KIND),
            default_stream,
            orphan_faults: Default::default(),
            coop,
        })
    }

    fn stream(&self, s: StreamId) -> Result<Arc<WStream>> {
        self.streams.get(s.0)
    }

    /// Whether the device was opened with `feature` (see `adapter::wanted_features`).
    pub(crate) fn has_feature(&self, feature: wgpu::Features) -> bool {
        self.gpu.device.features().contains(feature)
    }

    /// What the adapter's cooperative matrices offer (empty without the feature).
    pub(crate) fn coop_caps(&self) -> &kernels::CoopCaps {
        &self.coop
    }

    fn event(&self, e: EventId) -> Result<Arc<WEvent>> {
        self.events.get(e.0)
    }

    /// The buffer and offset behind a device range (non-empty), pinned in `pins`.
    fn resolve(&self, addr: u64, len: u64, pins: &mut Pins<DevBuf>) -> Result<(DevBuf, u64)> {
        match self.mem.device_range(addr, len, pins)? {
            Some(a) => Ok((a.payload.clone(), addr - a.base)),
            None => Err(Error::Internal("an empty range has no buffer".into())),
        }
    }

    /// The default stream, refused while it is capturing (synchronous calls use it).
    fn sync_default(&self) -> Result<Arc<WStream>> {
        let s = self.stream(self.default_stream())?;
        checked::refuse_while_capturing(
            s.is_capturing(),
            "a synchronous call while the default stream is capturing",
        )?;
        Ok(s)
    }
}
