//! [`Runtime`]: one per device, created lazily in a process-wide table — the device's caching
//! allocator, its pinned-host pool, per-thread streams, and graph recording that switches the
//! allocator into a graph-private pool (the recorded [`CapturedGraph`] lives in [`crate::graph`]).
//!
//! InfiniCore keeps one runtime per device per thread and, in places, assumes device 0; here
//! every device gets its runtime on first use ([`Runtime::get`]) and threads share it (the
//! allocator is thread-safe), while each thread still gets its own stream per device.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::alloc::{CachingAllocator, MemoryStats, PinnedHostPool, PrivatePool};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::fork::PerProcess;
use crate::graph::CapturedGraph;
use crate::hal::{Backend, CaptureMode, DevicePtr, EventId, GraphId, MemcpyKind, StreamId};
use crate::memory::Memory;
use crate::stream::Stream;
use crate::vendors::AnyBackend;

/// A recording in progress.
struct Recording {
    stream: StreamId,
    pool: Arc<PrivatePool>,
}

/// The runtime of one device.
pub struct Runtime {
    device: Device,
    backend: Arc<AnyBackend>,
    allocator: Arc<CachingAllocator>,
    pinned: Arc<PinnedHostPool>,
    recording: Mutex<Option<Recording>>,
    /// Streams with a capture in progress that unirt began (an exec being instantiated,
    /// [`begin_capture`](Self::begin_capture)). An event recorded on one of them would go into
    /// the capture, so ordering tensors across threads must not record there (see
    /// [`record_outside_capture`](Self::record_outside_capture)); held while beginning one.
    captures: Mutex<Vec<StreamId>>,
}

impl Runtime {
    /// The runtime of `device`, created (and the device opened) on first use.
    ///
    /// ```
    /// use unirt::{Device, Runtime};
    /// let a = Runtime::get(Device::CPU)?;
    /// let b = Runtime::get("cpu:0".parse()?)?;
    /// assert!(std::sync::Arc::ptr_eq(&a, &b));
    /// # Ok::<(), unirt::Error>(())
    /// ```
    pub fn get(device: Device) -> Result<Arc<Runtime>> {
        // Made again in a forked child, whose runtimes are new (see `crate::fork`).
        static TABLE: PerProcess<Mutex<HashMap<Device, Arc<Runtime>>>> = PerProcess::new();
        let table = TABLE.get_or_init(|| Mutex::new(HashMap::new()));
        if let Some(rt) = table.lock().get(&device) {
            return Ok(rt.clone());
        }
        // Opening may take a while; do it outside the table's lock and keep the first winner.
        let rt = Runtime::standalone(crate::open(device)?);
        Ok(table.lock().entry(device).or_insert(rt).clone())
    }

    /// A runtime that is not in the process-wide table: its own allocator, pinned pool and
    /// statistics over an opened device. Tests and benchmarks use it to start from zero.
    pub fn standalone(backend: Arc<AnyBackend>) -> Arc<Runtime> {
        let device = crate::alloc::device_of(&backend);
        Arc::new(Runtime {
            device,
            allocator: CachingAllocator::new(backend.clone()),
            pinned: PinnedHostPool::new(backend.clone()),
            backend,
            recording: Mutex::new(None),
            captures: Mutex::new(Vec::new()),
        })
    }

    /// Makes this runtime's device the calling thread's current device, and returns it.
    pub fn activate(self: &Arc<Self>) -> Arc<Self> {
        crate::thread_state::set_current_device(self.device);
        self.clone()
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn backend(&self) -> &Arc<AnyBackend> {
        &self.backend
    }

    /// The device's caching allocator.
    pub fn allocator(&self) -> &Arc<CachingAllocator> {
        &self.allocator
    }

    /// The device's pinned-host pool.
    pub fn pinned_host_pool(&self) -> &Arc<PinnedHostPool> {
        &self.pinned
    }

    /// The calling thread's stream on this device (created on first use, destroyed when the
    /// thread exits).
    pub fn stream(&self) -> Result<StreamId> {
        crate::thread_state::thread_stream(self.device, &self.backend)
    }

    /// The calling thread's stream on this device as a [`Stream`] handle (for typed copies and
    /// launches). The handle does not own the stream: it stays the thread's until the thread
    /// exits, after which the handle's calls fail with `InvalidHandle`.
    pub fn current_stream(&self) -> Result<Stream> {
        Ok(Stream::borrowed(&self.backend, self.stream()?))
    }

    /// A new stream of this device, destroyed when the handle drops.
    pub fn create_stream(&self) -> Result<Stream> {
        Stream::new(&self.backend)
    }

    /// Waits for the calling thread's stream.
    pub fn sync_stream(&self) -> Result<()> {
        self.backend.stream_synchronize(self.stream()?)
    }

    /// Waits for every stream of the device.
    pub fn sync_device(&self) -> Result<()> {
        self.backend.synchronize()
    }

    /// Device memory for work on the calling thread's stream.
    pub fn allocate_memory(&self, bytes: usize) -> Result<Memory> {
        Memory::from_allocator(&self.allocator, bytes, self.stream()?)
    }

    /// Pinned host memory from the device's pool.
    pub fn allocate_pinned_host_memory(&self, bytes: usize) -> Result<Memory> {
        Memory::from_pinned_pool(&self.pinned, self.device, bytes)
    }

    /// Copies host to device on the thread's stream; waits unless `asynchronous`. A pinned
    /// source is recorded as used by the stream, so the pool does not reuse it early.
    ///
    /// # Safety
    /// `src` must be readable for `bytes` bytes until this returns when it is pageable (not
    /// from this device's pinned memory: the copy has read it by then, see
    /// [`Pageable`](crate::checked::Pageable)) or the copy is not `asynchronous`; pinned
    /// memory until the stream is synchronised otherwise.
    pub unsafe fn memcpy_h2d(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        asynchronous: bool,
    ) -> Result<()> {
        self.allocator.check_not_freed(dst, bytes)?;
        let s = self.stream()?;
        let src = src as usize as u64;
        // SAFETY: the caller's promise above is the HAL's.
        unsafe {
            self.backend
                .memcpy_async(dst.0, src, bytes, MemcpyKind::H2D, s)?
        };
        self.pinned.record_stream(src, s);
        if !asynchronous {
            self.backend.stream_synchronize(s)?;
        }
        Ok(())
    }

    /// Copies device to host after the thread's stream's earlier work; always synchronous.
    ///
    /// # Safety
    /// `dst` must be writable for `bytes` bytes.
    pub unsafe fn memcpy_d2h(&self, dst: *mut u8, src: DevicePtr, bytes: usize) -> Result<()> {
        self.allocator.check_not_freed(src, bytes)?;
        let s = self.stream()?;
        // SAFETY: the caller's promise; the copy completes before this returns.
        unsafe {
            self.backend
                .memcpy_async(dst as usize as u64, src.0, bytes, MemcpyKind::D2H, s)?
        };
        self.backend.stream_synchronize(s)
    }

    /// Copies device to device on the thread's stream; waits unless `asynchronous`.
    pub fn memcpy_d2d(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        asynchronous: bool,
    ) -> Result<()> {
        self.allocator.check_not_freed(dst, bytes)?;
        self.allocator.check_not_freed(src, bytes)?;
        let s = self.stream()?;
        // SAFETY: both ranges are device ranges, bounds-checked by the backend.
        unsafe {
            self.backend
                .memcpy_async(dst.0, src.0, bytes, MemcpyKind::D2D, s)?
        };
        if !asynchronous {
            self.backend.stream_synchronize(s)?;
        }
        Ok(())
    }

    /// Starts recording `stream`: its async work goes into a graph, and every allocation on
    /// this device comes from a new graph-private pool until [`end_capture`](Self::end_capture).
    /// One recording per device at a time.
    pub fn begin_capture(&self, stream: StreamId, mode: CaptureMode) -> Result<()> {
        let mut rec = self.recording.lock();
        if rec.is_some() {
            return Err(Error::Capturing(format!(
                "{} is already recording a graph",
                self.device
            )));
        }
        let pool = self.allocator.begin_private()?;
        if let Err(e) = self.begin_capture_on(stream, mode) {
            self.allocator.end_private(&pool);
            return Err(e);
        }
        *rec = Some(Recording { stream, pool });
        Ok(())
    }

    /// The backend's `begin_capture`, with `stream` noted as capturing (see `captures`).
    pub(crate) fn begin_capture_on(&self, stream: StreamId, mode: CaptureMode) -> Result<()> {
        let mut captures = self.captures.lock();
        self.backend.begin_capture(stream, mode)?;
        captures.push(stream);
        Ok(())
    }

    /// The backend's `end_capture`, and `stream` no longer noted as capturing.
    pub(crate) fn end_capture_on(&self, stream: StreamId) -> Result<GraphId> {
        let graph = self.backend.end_capture(stream);
        self.captures.lock().retain(|s| *s != stream);
        graph
    }

    /// Records `event` on `stream` unless a capture unirt began is in progress there (then
    /// `false`: the record would go into the capture). No capture can begin on the stream
    /// meanwhile.
    pub(crate) fn record_outside_capture(&self, event: EventId, stream: StreamId) -> Result<bool> {
        let captures = self.captures.lock();
        if captures.contains(&stream) {
            return Ok(false);
        }
        self.backend.event_record(event, stream)?;
        Ok(true)
    }

    /// Whether a capture unirt began is in progress on `stream`.
    pub(crate) fn capturing_on(&self, stream: StreamId) -> bool {
        self.captures.lock().contains(&stream)
    }

    /// Stops recording and returns the graph, which keeps the private pool reserved.
    pub fn end_capture(&self) -> Result<CapturedGraph> {
        let rec = self.recording.lock().take().ok_or(Error::NotCapturing)?;
        self.allocator.end_private(&rec.pool);
        let id = self.end_capture_on(rec.stream)?;
        Ok(CapturedGraph::from_capture(
            self.backend.clone(),
            id,
            Some(rec.pool),
        ))
    }

    /// Whether a graph is being recorded on this device.
    pub fn is_capturing(&self) -> bool {
        self.recording.lock().is_some()
    }

    /// The stream being recorded, if any.
    pub fn capturing_stream(&self) -> Option<StreamId> {
        self.recording.lock().as_ref().map(|r| r.stream)
    }

    /// Starts recording an operator graph on this device from the calling thread: the eager
    /// Tensor API records instead of running until
    /// [`stop_graph_recording`](Self::stop_graph_recording) (see [`crate::graph::record`](mod@crate::graph::record)).
    pub fn start_graph_recording(&self) -> Result<()> {
        crate::graph::record::start_recording(self.device)
    }

    /// Stops the calling thread's operator-graph recording and returns the graph.
    pub fn stop_graph_recording(&self) -> Result<crate::graph::Graph> {
        match crate::graph::record::recording_device() {
            Some(d) if d != self.device => Err(Error::DeviceMismatch {
                op: "stop_graph_recording".into(),
                expected: d,
                got: self.device,
            }),
            _ => crate::graph::record::stop_recording(),
        }
    }

    /// Runs `graph` eagerly on the calling thread's stream, every operator through its
    /// planned kernel (TinyInfiniTensor's `RuntimeObj::run`), into the graph's own tensors.
    pub fn run(&self, graph: &crate::graph::Graph) -> Result<()> {
        crate::graph::graph::run_eager(self, graph)
    }

    /// InfiniCore's pin mode, mapped onto graph-private pools: see
    /// [`CachingAllocator::set_pin_mode`].
    pub fn set_pin_mode(&self, pinned: bool) -> Result<Option<Arc<PrivatePool>>> {
        self.allocator.set_pin_mode(pinned)
    }

    /// The device allocator's statistics.
    pub fn memory_stats(&self) -> MemoryStats {
        self.allocator.stats()
    }

    /// Waits for the device, then returns idle cached memory (device and pinned) to the
    /// backend.
    pub fn empty_cache(&self) -> Result<()> {
        self.backend.synchronize()?;
        self.allocator.empty_cache()?;
        self.pinned.empty_cache()
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Runtime({})", self.device)
    }
}
