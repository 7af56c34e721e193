//! The hardware abstraction layer: one small trait every vendor implements.
//!
//! [`Backend`] is implemented once per vendor directory under `vendors/`;
//! [`AnyBackend`](crate::vendors::AnyBackend), in the vendor table, is the closed set of them,
//! dispatched statically by `enum_dispatch` (no vtable, and a match the optimiser can see
//! through). One `AnyBackend` value is one opened device. This module names no vendor: the
//! vendors depend on it, never the other way round.
//!
//! Handles ([`StreamId`], [`EventId`], [`GraphId`], [`GraphExecId`]) are plain `u64`s. On CUDA
//! they are the native `CUstream` / `CUevent` / `CUgraph` / `CUgraphExec` values, so the C ABI
//! can hand them to code that casts them to CUDA types; elsewhere they are keys of the backend's
//! live-handle table. Either way a backend validates every handle it is given: a destroyed or
//! foreign handle is [`Error::InvalidHandle`](crate::Error::InvalidHandle), never undefined behaviour.
//!
//! Device addresses ([`DevicePtr`]) are `u64`s in the device's address space; interior pointers
//! are valid and every copy, set and free is checked against the backend's
//! [`AllocTable`](crate::memtable::AllocTable).

mod types;

pub use types::*;

use enum_dispatch::enum_dispatch;

use crate::device::{DeviceInfo, DeviceKind, MemInfo, UnusableDevice};
use crate::error::Result;

/// What a vendor's probe found: its devices, or why it has none ("libcuda not found
/// (searched …)"). Unavailability is a status, not an error.
#[derive(Debug, Clone)]
pub enum Probe {
    /// The vendor works here; one description per device, index order.
    Available(Vec<DeviceInfo>),
    /// The vendor found devices and opened (or test-opened) each: those that opened, in index
    /// order, and those that did not, with the driver's reason. With no device that opened,
    /// discovery reports the vendor unavailable (and still lists the unusable ones).
    Opened {
        /// The devices that opened; their indices are dense, 0..n.
        devices: Vec<DeviceInfo>,
        /// The devices that failed to open: listed, never numbered.
        unusable: Vec<UnusableDevice>,
    },
    /// The vendor cannot be used here, and why, in words a person can act on.
    Unavailable(String),
}

/// The contract every vendor implements. All methods take `&self` and are thread-safe.
///
/// Ordering: work enqueued on one stream runs in enqueue order; work on different streams is
/// unordered unless joined by [`stream_wait_event`](Backend::stream_wait_event). The
/// synchronous calls (`memcpy`, `memset`) first wait for the device's default stream, then
/// complete before they return, as `cudaMemcpy` does with the legacy default stream.
#[enum_dispatch]
pub trait Backend: Send + Sync {
    /// The vendor of this device.
    fn kind(&self) -> DeviceKind;
    /// What discovery reported for this device.
    fn info(&self) -> &DeviceInfo;
    /// Free and total device memory now.
    fn mem_info(&self) -> Result<MemInfo>;
    /// Waits for all work on every stream of the device — destroyed streams whose queued work
    /// is still running, and work queued on a stream before it began capturing, included.
    fn synchronize(&self) -> Result<()>;

    /// The stream used where a caller names none (the C ABI's null stream). It cannot be
    /// destroyed.
    fn default_stream(&self) -> StreamId;
    /// A new stream, ordered independently of the others.
    fn stream_create(&self) -> Result<StreamId>;
    /// Destroys a stream. Work already enqueued still completes (and device
    /// [`synchronize`](Backend::synchronize) waits for it); the handle is dead at once.
    fn stream_destroy(&self, stream: StreamId) -> Result<()>;
    /// Waits until every command enqueued on `stream` before this call has completed.
    fn stream_synchronize(&self, stream: StreamId) -> Result<()>;
    /// Makes all future work on `stream` wait until the work `event` last recorded has
    /// completed. An event never recorded is complete: the wait is a no-op.
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<()>;

    /// A new event. [`EventFlags::DISABLE_TIMING`] events cannot be used for elapsed time.
    fn event_create(&self, flags: EventFlags) -> Result<EventId>;
    /// Captures the work enqueued on `stream` so far; the event completes when it has run.
    fn event_record(&self, event: EventId, stream: StreamId) -> Result<()>;
    /// [`EventStatus::NotReady`] while the recorded work is pending; `Complete` after, or when
    /// the event was never recorded.
    fn event_query(&self, event: EventId) -> Result<EventStatus>;
    /// Blocks until the recorded work has completed.
    fn event_synchronize(&self, event: EventId) -> Result<()>;
    /// Milliseconds between two completed timing events. [`Error::NotReady`] while either is
    /// pending; [`Error::BadParam`] for an event created with `DISABLE_TIMING` or never recorded.
    ///
    /// [`Error::NotReady`]: crate::Error::NotReady
    /// [`Error::BadParam`]: crate::Error::BadParam
    fn event_elapsed_ms(&self, start: EventId, end: EventId) -> Result<f32>;
    /// Destroys an event; a pending record still completes.
    fn event_destroy(&self, event: EventId) -> Result<()>;

    /// Device memory. Zero bytes gives [`DevicePtr::NULL`]. Failure is `OutOfMemory` or
    /// `TooLarge`, never a panic.
    fn malloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// Frees device memory from [`malloc`](Backend::malloc). Null is a no-op; an interior,
    /// unknown or freed pointer is an error.
    ///
    /// The memory is never released while work that may use it is queued or running, on any
    /// stream — live, capturing, or destroyed with work still queued — nor while a synchronous
    /// copy or set on another thread uses it. The pointer is dead for new work when this
    /// returns; the release itself may be deferred until the last such use has finished (CPU,
    /// wgpu: no device-wide wait, see [`crate::checked`]) or done by `cuMemFree`, which waits
    /// for the context's outstanding work itself (CUDA: unirt adds no device-wide wait of its
    /// own, only for streams destroyed with work queued and for calls on other threads that
    /// passed their range check before the free). A graph captured over the memory is refused
    /// at its next launch.
    fn free(&self, ptr: DevicePtr) -> Result<()>;
    /// Page-locked host memory the device can copy from asynchronously.
    fn malloc_host(&self, bytes: usize) -> Result<HostPtr>;
    /// Frees memory from [`malloc_host`](Backend::malloc_host), with the guarantees of
    /// [`free`](Backend::free): queued, running and replaying copies to or from it finish on
    /// live memory, and a graph that copies to or from it is refused at its next launch.
    fn free_host(&self, ptr: HostPtr) -> Result<()>;
    /// Stream-ordered allocation: the memory is usable by work enqueued on `stream` after this
    /// call (and by other streams once synchronised with it).
    fn malloc_async(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr>;
    /// Stream-ordered free: the memory is released when `stream` reaches this point. The pointer
    /// is dead for new work at once. Work on *other* streams that still uses the memory keeps it
    /// alive until it has run (CUDA leaves that ordering to the caller; the CPU and wgpu
    /// backends never let it become a use-after-free).
    fn free_async(&self, ptr: DevicePtr, stream: StreamId) -> Result<()>;

    /// Copies `bytes` bytes and returns when they have arrived. Device-side ranges are
    /// bounds-checked; zero bytes is a no-op. A host-side address that is one of this device's
    /// own device allocations is bounds-checked and used where device memory is host memory
    /// (CPU) and refused with `BadParam` where it is not (wgpu's virtual addresses).
    ///
    /// # Safety
    /// Host-side addresses (the source of H2H/H2D, the destination of H2H/D2H) must be valid
    /// for `bytes` bytes of reading / writing; the backend can only check those that lie in its
    /// own pinned-host (or device) allocations.
    unsafe fn memcpy(&self, dst: u64, src: u64, bytes: usize, kind: MemcpyKind) -> Result<()>;
    /// Enqueues a copy on `stream`. Host memory this backend did not allocate is *pageable*
    /// and follows CUDA's rules (see [`Pageable`](crate::checked::Pageable)): outside a
    /// capture, a copy from it has read it when this returns and a copy into it has completed
    /// (waiting for the stream's earlier work), so the caller may reuse or free it at once.
    ///
    /// # Safety
    /// As [`memcpy`](Backend::memcpy); pinned host ranges ([`malloc_host`](Backend::malloc_host))
    /// must stay valid until the copy has run (synchronise the stream or an event recorded
    /// after it), and every host range for as long as a capture holding the copy is replayed.
    unsafe fn memcpy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        kind: MemcpyKind,
        stream: StreamId,
    ) -> Result<()>;
    /// Sets `bytes` bytes of device memory to `value` and returns when done.
    fn memset(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()>;
    /// Enqueues a memset on `stream`.
    fn memset_async(&self, dst: DevicePtr, value: u8, bytes: usize, stream: StreamId)
        -> Result<()>;

    /// Enqueues the named kernel (see [`crate::kernel::KERNELS`]) on `stream`. Arguments are
    /// checked against the kernel's signature and every buffer argument against the allocation
    /// table before anything is enqueued.
    fn launch(&self, kernel: &str, args: &[KernelArg], stream: StreamId) -> Result<()>;

    /// Enqueues a host function on `stream`, on backends whose streams execute on the host
    /// (the CPU backend, where operator kernels are Rust functions). `ranges` are the device
    /// ranges `(address, bytes)` the function touches: each is checked against the allocation
    /// table before anything is enqueued, and recorded when the stream is capturing. Other
    /// backends answer [`Error::Unsupported`](crate::Error::Unsupported).
    fn launch_host(
        &self,
        task: HostTask,
        ranges: &[(DevicePtr, u64)],
        stream: StreamId,
    ) -> Result<()> {
        let _ = (task, ranges, stream);
        Err(crate::Error::unsupported(
            "host functions on device streams",
            self.kind(),
        ))
    }

    /// Starts recording: async work on `stream` is recorded into a graph instead of running.
    fn begin_capture(&self, stream: StreamId, mode: CaptureMode) -> Result<()>;
    /// Stops recording and returns the graph. [`Error::NotCapturing`] if not capturing.
    ///
    /// [`Error::NotCapturing`]: crate::Error::NotCapturing
    fn end_capture(&self, stream: StreamId) -> Result<GraphId>;
    /// Validates a graph and prepares it for cheap replay.
    fn graph_instantiate(&self, graph: GraphId) -> Result<GraphExecId>;
    /// Enqueues one replay of `exec` on `stream`.
    fn graph_launch(&self, exec: GraphExecId, stream: StreamId) -> Result<()>;
    /// Destroys a graph; executables made from it stay valid.
    fn graph_destroy(&self, graph: GraphId) -> Result<()>;
    /// Destroys an executable graph; a pending launch still completes.
    fn graph_exec_destroy(&self, exec: GraphExecId) -> Result<()>;
}
