//! NVIDIA CUDA through libcuda and NVRTC, both loaded at run time.
//!
//! Layers, bottom up: `loader.rs` finds the libraries (absolute paths only, env overrides);
//! `driver.rs` (devices, contexts, streams, events), `driver_memory.rs` (allocation, copies,
//! memset) and `driver_launch.rs` (modules, launches, capture, graphs) hold every unsafe
//! libcuda call, `nvrtc.rs` every NVRTC call — through symbols we resolve ourselves (cudarc
//! supplies the handle types and constants; its own loaders panic on a missing library or
//! symbol). Wrappers whose soundness rests on validated handles or ranges are `unsafe fn`.
//! `kernels/` holds the CUDA C kernels — the HAL's (`builtin.cu`) and the operators', one
//! template per op family (`kernels/<family>.cu`, generated per dtype, planned by
//! `kernels/<family>.rs`, registered as [`crate::ops::KernelImpl::Prepared`]) — compiled by
//! NVRTC and cached in memory and on disk; `blas.rs` loads cuBLAS at run time for matmul when
//! it is installed; `backend.rs` is the [`Backend`] impl, over `checks.rs` (what is validated
//! before a driver call, and the copies it plans) and `sync.rs` (ordering across the device's
//! streams: joins, device-wide waits, destroyed streams' ends); this file holds the backend type,
//! `probe()`, `open()` and the CLI's ahead-of-time compile ([`compile_kernels`]).
//!
//! Choices a reader of infinirt should know:
//! - **Contexts**: each device uses its primary context (shared with the CUDA runtime and
//!   cudarc), made current on the calling thread at the start of every call.
//! - **The default stream** is a created *blocking* stream (`CU_STREAM_DEFAULT`), not CUDA's
//!   legacy NULL stream itself: the legacy stream cannot be captured, but a blocking stream
//!   synchronises with it, so work that upstream code puts on stream 0 (an infiniop kernel
//!   given the C ABI's null stream) stays ordered with unirt's default stream. Streams from
//!   `stream_create` are non-blocking. The synchronous calls (`memcpy`, `memset`) are
//!   enqueued on the default stream and then waited for, which is the HAL's "wait for the
//!   default stream, then complete" contract.
//! - **Handles** are the native `CUstream` / `CUevent` / `CUgraph` / `CUgraphExec` values,
//!   registered in live-handle tables so a destroyed or foreign handle is an error.
//! - **Memory**: `cuMemAlloc`; stream-ordered `cuMemAllocAsync` where the device has memory
//!   pools, else allocation after synchronising the stream (and free after it drains) — both
//!   honour the stream-ordered contract. Pinned host memory is `cuMemAllocHost`. Every
//!   allocation is in an [`AllocTable`], so copies, sets, launches and frees are checked.
//! - **D2D between GPUs** uses `cuMemcpyPeerAsync` with peer access enabled where possible.

mod backend;
pub(crate) mod blas;
mod checks;
mod driver;
mod driver_launch;
mod driver_memory;
mod event;
mod fault;
mod gate;
mod graph;
mod kernels;
mod loader;
mod memory;
mod nvrtc;
mod stream;
mod sync;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::device::{Capabilities, DeviceClass, DeviceInfo, DeviceKind, EventTiming};
use crate::error::{Error, Result};
use crate::hal::Probe;
use crate::hal::*;
use crate::handles::HandleTable;
use crate::memtable::AllocTable;
use crate::vendors::AnyBackend;
use driver::{version_string, Driver, NO_DEVICE, SUCCESS};
use event::CudaEvent;
use graph::{CudaGraph, CudaGraphExec};
use memory::{AllocKind, PeerInfo};
use stream::CudaStream;

pub(crate) use kernels::matmul_epilogue_workspace;
pub use kernels::CompiledKernel;

/// Every CUDA kernel compiled ahead of time for a list of architectures, as `unirt kernels
/// --compile cuda` reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AheadOfTimeBuild {
    /// NVRTC's version, e.g. `"11.8"`.
    pub nvrtc: String,
    /// Where NVRTC was loaded from.
    pub nvrtc_path: String,
    /// How many kernels there are (each compiled once per architecture).
    pub kernel_count: usize,
    /// One row per kernel and architecture.
    pub compiled: Vec<CompiledKernel>,
}

impl AheadOfTimeBuild {
    /// The rows that failed.
    pub fn failures(&self) -> impl Iterator<Item = &CompiledKernel> {
        self.compiled.iter().filter(|r| !r.ok)
    }
}

/// Compiles every CUDA kernel to CUBIN for each `sm_XY` in `archs` with NVRTC, without a GPU,
/// a libcuda or any cache — the check CI runs on the kernel sources. `Err` only when NVRTC
/// cannot be loaded or `archs` is empty; a kernel that fails to compile is a row with
/// `ok: false` and NVRTC's log.
///
/// ```
/// match unirt::vendors::cuda::compile_kernels(&[80]) {
///     Ok(build) => assert_eq!(build.compiled.len(), build.kernel_count),
///     Err(e) => println!("no NVRTC here: {e}"),
/// }
/// ```
pub fn compile_kernels(archs: &[u32]) -> Result<AheadOfTimeBuild> {
    if archs.is_empty() {
        return Err(Error::BadParam(
            "at least one architecture (sm_70, sm_80, …) is needed".into(),
        ));
    }
    let nv = nvrtc::require()?;
    Ok(AheadOfTimeBuild {
        nvrtc: nv.version_string(),
        nvrtc_path: nv.path.display().to_string(),
        kernel_count: kernels::kernel_count(),
        compiled: kernels::compile_all(nv, archs),
    })
}

/// Which BLAS the CUDA matmul uses — `cuBLAS at <path>` — or why none (then unirt's NVRTC
/// kernels run): what `unirt devices` reports.
pub fn blas_summary() -> String {
    blas::summary()
}

/// Registers the CUDA operator kernels (one per op family × dtype, compiled at plan time).
pub(crate) fn register_kernels(reg: &mut crate::ops::KernelRegistry) {
    kernels::register(reg);
}

/// Prepares a user kernel registered as CUDA C for a plan on a CUDA device.
pub(crate) fn prepare_user_kernel(
    spec: &crate::ops::PlanSpec<'_>,
    kernel: &crate::ops::KernelImpl,
) -> Result<std::sync::Arc<dyn crate::ops::PreparedKernel>> {
    kernels::prepare_user(spec, kernel)
}

/// Parses an architecture list such as `sm_70,sm_80,90` into `[70, 80, 90]`.
pub fn parse_archs(list: &str) -> Result<Vec<u32>> {
    kernels::parse_archs(list)
}

/// The NVRTC part of a probe's message.
fn nvrtc_summary() -> std::result::Result<String, String> {
    nvrtc::nvrtc().map(|n| format!("NVRTC {} at {}", n.version_string(), n.path.display()))
}

/// The loaded driver, or why CUDA is unavailable (libcuda and NVRTC both reported).
fn usable_driver() -> std::result::Result<&'static Driver, String> {
    let nv = nvrtc_summary();
    let nv_part = match &nv {
        Ok(s) | Err(s) => s.clone(),
    };
    let drv = driver::driver().map_err(|reason| format!("{reason}; {nv_part}"))?;
    let ver = version_string(drv.version);
    // "libcuda 12.2 loaded, no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE (…); /path)".
    let path = drv.path.display();
    if drv.init == NO_DEVICE {
        return Err(format!(
            "libcuda {ver} loaded, no CUDA device (cuInit: {}; {path}); {nv_part}",
            drv.describe(drv.init)
        ));
    }
    if drv.init != SUCCESS {
        return Err(format!(
            "libcuda {ver} loaded, cuInit failed: {} ({path}); {nv_part}",
            drv.describe(drv.init)
        ));
    }
    let count = drv
        .device_count()
        .map_err(|e| format!("libcuda {ver} loaded, {e} ({path}); {nv_part}"))?;
    if count == 0 {
        return Err(format!(
            "libcuda {ver} loaded, no CUDA device (cuDeviceGetCount: 0; {path}); {nv_part}"
        ));
    }
    if let Err(e) = nv {
        return Err(format!(
            "{e} (needed to compile kernels); libcuda {ver} sees {count} device(s)"
        ));
    }
    Ok(drv)
}

/// The libraries CUDA looks for at run time and where it looked (`unirt devices --verbose`).
pub fn library_searches() -> Vec<crate::discovery::LibrarySearch> {
    loader::searches()
        .into_iter()
        .map(|(library, env, s)| crate::discovery::LibrarySearch {
            kind: DeviceKind::Cuda,
            library,
            env,
            searched: s.searched,
            found: s
                .candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
        })
        .collect()
}

/// Discovery for CUDA: every GPU, or why there are none. Never panics: the libraries are
/// found by our own search and every symbol is resolved before use.
pub fn probe() -> Probe {
    let drv = match usable_driver() {
        Ok(d) => d,
        Err(reason) => return Probe::Unavailable(reason),
    };
    let count = drv.device_count().unwrap_or(0);
    let mut devices = Vec::with_capacity(count);
    for i in 0..count {
        match device_info(drv, i) {
            Ok(info) => devices.push(info),
            Err(e) => return Probe::Unavailable(format!("cuda:{i} could not be queried: {e}")),
        }
    }
    Probe::Available(devices)
}

/// Compute capability as XY (8.0 → 80).
fn compute_capability(drv: &Driver, dev: i32) -> Result<u32> {
    let major = drv.attribute(dev, driver::attr::CC_MAJOR)?;
    let minor = drv.attribute(dev, driver::attr::CC_MINOR)?;
    Ok((major.max(0) * 10 + minor.max(0)) as u32)
}

fn device_info(drv: &Driver, index: usize) -> Result<DeviceInfo> {
    use driver::attr;
    let dev = drv.device(index)?;
    let name = drv.device_name(dev)?;
    let cc = compute_capability(drv, dev)?;
    let total = drv.total_mem(dev)?;
    let pools = drv.attribute(dev, attr::MEMORY_POOLS).unwrap_or(0) != 0;
    let sms = drv.attribute(dev, attr::SM_COUNT).unwrap_or(0);
    let integrated = drv.attribute(dev, attr::INTEGRATED).unwrap_or(0) != 0;
    let pci = format!(
        "{:04x}:{:02x}:{:02x}.0",
        drv.attribute(dev, attr::PCI_DOMAIN).unwrap_or(0),
        drv.attribute(dev, attr::PCI_BUS).unwrap_or(0),
        drv.attribute(dev, attr::PCI_DEVICE).unwrap_or(0)
    );
    let nv = nvrtc::require()?;
    let target = nv.target_for(cc);
    Ok(DeviceInfo {
        index,
        name,
        vendor: "NVIDIA".into(),
        driver: format!(
            "CUDA {} driver, NVRTC {}",
            version_string(drv.version),
            nv.version_string()
        ),
        api: "cuda".into(),
        class: if integrated {
            DeviceClass::IntegratedGpu
        } else {
            DeviceClass::DiscreteGpu
        },
        memory_total: total,
        max_allocation: total,
        details: vec![
            (
                "compute_capability".into(),
                format!("{}.{}", cc / 10, cc % 10),
            ),
            ("multiprocessors".into(), sms.to_string()),
            ("pci_bus_id".into(), pci),
            ("memory_pools".into(), pools.to_string()),
            ("kernel_target".into(), target.arch()),
            ("cuda_driver".into(), version_string(drv.version)),
            ("libcuda".into(), drv.path.display().to_string()),
            ("nvrtc".into(), nv.version_string()),
            ("libnvrtc".into(), nv.path.display().to_string()),
            ("blas".into(), blas::summary()),
        ],
        capabilities: Capabilities {
            async_streams: true,
            capture: true,
            stream_ordered_memory: true,
            pinned_host_memory: true,
            unified_addressing: false,
            event_timing: EventTiming::Device,
        },
    })
}

/// Opens `cuda:index` as an [`AnyBackend`].
pub fn open(index: usize) -> Result<AnyBackend> {
    Ok(CudaBackend::open(index)?.into())
}

/// One opened CUDA device.
pub struct CudaBackend {
    drv: &'static Driver,
    info: DeviceInfo,
    name: String,
    cc: u32,
    pools: bool,
    shared: Arc<PeerInfo>,
    host_mem: AllocTable<()>,
    streams: HandleTable<CudaStream>,
    events: HandleTable<CudaEvent>,
    graphs: HandleTable<CudaGraph>,
    execs: HandleTable<CudaGraphExec>,
    default_stream: u64,
    /// One event per stream destroyed with work possibly queued, recorded at its end just
    /// before the destroy: device synchronize waits for these when it cannot use
    /// cuCtxSynchronize (a capture in progress), so a destroyed stream's work still counts.
    retired_streams: Mutex<Vec<u64>>,
    /// Held by the release of `retired_streams` in progress (one at a time).
    retire_turn: Mutex<()>,
    /// Held shared by every call from the moment it checks its ranges until its work is
    /// enqueued; `free`/`free_host` take it exclusively (an instant) after unregistering the
    /// memory, so no copy, set, launch or replay that passed its check before the free can
    /// enqueue after the driver released the memory. (Work enqueued before is what cuMemFree
    /// and the synchronize of `free_host` wait for.)
    enqueue_gate: parking_lot::RwLock<()>,
    /// Kernel name → (CUmodule, CUfunction), loaded at first launch.
    functions: Mutex<HashMap<&'static str, (u64, u64)>>,
    /// The op kernels' modules per (family, dtype), loaded when an operator is first planned,
    /// with the functions fetched from each.
    op_modules: kernels::OpModules,
    /// The cuBLAS handle and its workspace, made when a matmul is first planned with cuBLAS
    /// installed (or why not).
    blas: std::sync::OnceLock<std::result::Result<(u64, u64), String>>,
    /// Serialises calls on the cuBLAS handle (its stream is set per call).
    blas_lock: Mutex<()>,
    /// The device's fault words (see `fault.rs`).
    fault_slabs: Arc<Mutex<fault::FaultSlabs>>,
    /// Fault words noted on streams destroyed before they were synchronised: checked by the
    /// next device-wide synchronisation.
    orphan_faults: Mutex<Vec<Arc<fault::FaultWord>>>,
}

impl CudaBackend {
    /// Opens `cuda:index`: retains its primary context and creates the default stream.
    pub fn open(index: usize) -> Result<Self> {
        let drv = usable_driver().map_err(|reason| Error::Unavailable {
            backend: DeviceKind::Cuda,
            reason,
        })?;
        let count = drv.device_count()?;
        if index >= count {
            return Err(Error::DeviceNotFound(format!(
                "cuda:{index} (cuda has {count} device(s))"
            )));
        }
        let info = device_info(drv, index)?;
        let dev = drv.device(index)?;
        let cc = compute_capability(drv, dev)?;
        let pools = drv.attribute(dev, driver::attr::MEMORY_POOLS).unwrap_or(0) != 0;
        let ctx = drv.primary_ctx_retain(dev)?;
        // SAFETY: ctx was retained just above and is released only on the failure path below
        // or when the backend drops.
        let current = unsafe { drv.set_current(ctx) };
        let default_stream = match current.and_then(|_| drv.stream_create_blocking()) {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: balances the retain just above; the backend was never built.
                let _ = unsafe { drv.primary_ctx_release(dev) };
                return Err(e);
            }
        };
        let streams = HandleTable::new(StreamId::KIND);
        streams.insert_with(default_stream, CudaStream::new(default_stream));
        let shared = Arc::new(PeerInfo {
            index,
            device: dev,
            ctx,
            mem: AllocTable::new("device"),
        });
        // Under unified addressing device memory is outside the host's reach.
        shared.mem.mark_not_host(&format!("cuda:{index}"));
        for peer in memory::register(&shared) {
            enable_peer(drv, &shared, &peer);
        }
        Ok(CudaBackend {
            drv,
            info,
            name: format!("cuda:{index}"),
            cc,
            pools,
            shared,
            host_mem: AllocTable::new("pinned host"),
            streams,
            events: HandleTable::new(EventId::KIND),
            graphs: HandleTable::new(GraphId::KIND),
            execs: HandleTable::new(GraphExecId::KIND),
            default_stream,
            retired_streams: Mutex::new(Vec::new()),
            retire_turn: Mutex::new(()),
            enqueue_gate: parking_lot::RwLock::new(()),
            functions: Mutex::new(HashMap::new()),
            op_modules: Mutex::new(HashMap::new()),
            blas: std::sync::OnceLock::new(),
            blas_lock: Mutex::new(()),
            fault_slabs: Default::default(),
            orphan_faults: Mutex::new(Vec::new()),
        })
    }

    /// Makes this device's context current on the calling thread.
    fn bind(&self) -> Result<()> {
        // SAFETY: the primary context was retained when the device was opened and is released
        // only when it is dropped.
        unsafe { self.drv.set_current(self.shared.ctx) }
    }

    fn stream(&self, s: StreamId) -> Result<Arc<CudaStream>> {
        self.streams.get(s.0)
    }

    fn event(&self, e: EventId) -> Result<Arc<CudaEvent>> {
        self.events.get(e.0)
    }

    /// The loaded kernel function, compiling (or reading the cache) at first use.
    fn function(&self, name: &str) -> Result<u64> {
        let k = kernels::source(name)?;
        if let Some(&(_, f)) = self.functions.lock().get(k.name) {
            return Ok(f);
        }
        let nv = nvrtc::require()?;
        let target = nv.target_for(self.cc);
        let img = kernels::image(nv, k, target, false)?;
        let module = match self.drv.module_load(&img) {
            Ok(m) => m,
            // A stale or damaged cache entry: compile afresh once.
            Err(_) => self
                .drv
                .module_load(&kernels::image(nv, k, target, true)?)?,
        };
        // SAFETY: the module was loaded just above and is unloaded only on failure here or when
        // the device drops.
        let f = match unsafe { self.drv.module_function(module, k.name) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: the module is loaded and unloaded once: it is dropped from the cache
                // here.
                let _ = unsafe { self.drv.module_unload(module) };
                return Err(e);
            }
        };
        let mut fns = self.functions.lock();
        if let Some(&(_, f)) = fns.get(k.name) {
            // Another thread won the race; keep its module.
            // SAFETY: the module is loaded and unloaded once: it is dropped from the cache here.
            let _ = unsafe { self.drv.module_unload(module) };
            return Ok(f);
        }
        fns.insert(k.name, (module, f));
        Ok(f)
    }

    /// Loads every kernel now (before a capture, where loading modules is not allowed).
    fn preload_kernels(&self) {
        for k in kernels::SOURCES {
            if let Err(e) = self.function(k.name) {
                tracing::debug!("{}: kernel {} not preloaded: {e}", self.name, k.name);
            }
        }
    }
}

/// Lets two open devices reach each other's memory directly where the hardware allows;
/// peer copies work without it (the driver stages them), only slower.
fn enable_peer(drv: &Driver, a: &PeerInfo, b: &PeerInfo) {
    for (from, to) in [(a, b), (b, a)] {
        let ok = drv.can_access_peer(from.device, to.device).unwrap_or(false)
            // SAFETY: the primary context was retained when the device was opened and is released
            // only when it is dropped.
            && unsafe { drv.set_current(from.ctx) }.is_ok()
            // SAFETY: both primary contexts are retained by open backends.
            && unsafe { drv.enable_peer_access(to.ctx) }.is_ok();
        tracing::debug!(
            "peer access cuda:{} -> cuda:{}: {}",
            from.index,
            to.index,
            if ok { "enabled" } else { "not available" }
        );
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        let _ = self.synchronize();
        for x in self.execs.values() {
            // SAFETY: the exec came out of the exec table, which no longer lists it: destroyed
            // once.
            let _ = unsafe { self.drv.graph_exec_destroy(x.raw) };
        }
        for g in self.graphs.values() {
            // SAFETY: the graph came out of the graph table, which no longer lists it: destroyed
            // once.
            let _ = unsafe { self.drv.graph_destroy(g.raw) };
        }
        for e in self.retired_streams.lock().drain(..) {
            // SAFETY: the retired-stream event was created by this backend and is destroyed
            // once: it is drained from the list here.
            let _ = unsafe { self.drv.event_destroy(e) };
        }
        for e in self.events.values() {
            // SAFETY: the event came out of the event table, which no longer lists it: destroyed
            // once.
            let _ = unsafe { self.drv.event_destroy(e.raw) };
        }
        for a in self.shared.mem.drain() {
            let _ = match a.payload {
                // SAFETY: the allocation left the allocation table here (or was never admitted to
                // it), so it is live and freed once; the table has waited for the work that used
                // it.
                AllocKind::Plain => unsafe { self.drv.mem_free(a.base) },
                // SAFETY: the allocation left the allocation table here, so it is freed once; the
                // stream is live.
                AllocKind::Pool => unsafe { self.drv.mem_free_async(a.base, self.default_stream) },
            };
        }
        // SAFETY: the stream is live: it came from the stream table or is the backend's default
        // stream.
        let _ = unsafe { self.drv.stream_synchronize(self.default_stream) };
        for a in self.host_mem.drain() {
            // SAFETY: the pinned allocation left the pinned table here (or was never admitted),
            // so it is freed once.
            let _ = unsafe { self.drv.mem_free_host(a.base) };
        }
        for s in self.streams.values() {
            if let Some(e) = s.capture.lock().take().and_then(|c| c.entry) {
                // SAFETY: a capture's entry event, taken out of its log here: destroyed once.
                let _ = unsafe { self.drv.event_destroy(e) };
            }
            // SAFETY: the stream came out of the stream table, which no longer lists it: live,
            // and destroyed once.
            let _ = unsafe { self.drv.stream_destroy(s.raw) };
        }
        if let (Some(Ok((handle, ws))), Ok(lib)) = (self.blas.get(), blas::cublas()) {
            // SAFETY: the handle is this device's, destroyed once here after the device
            // finished its work (synchronize above); its workspace is freed after it.
            unsafe {
                lib.destroy(*handle);
                let _ = self.drv.mem_free(*ws);
            }
        }
        self.free_fault_slabs();
        for (_, (module, _)) in self.op_modules.lock().drain() {
            // SAFETY: the module is loaded and unloaded once: it is drained from the table here,
            // after the device finished its work (synchronize above).
            let _ = unsafe { self.drv.module_unload(module) };
        }
        for (_, (module, _)) in self.functions.lock().drain() {
            // SAFETY: the module is loaded and unloaded once: it is dropped from the cache here.
            let _ = unsafe { self.drv.module_unload(module) };
        }
        // SAFETY: balances the one retain made when the device was opened.
        let _ = unsafe { self.drv.primary_ctx_release(self.shared.device) };
    }
}
