//! The thread-local context: InfiniCore's `infinicore::context` free functions in Rust.
//!
//! Every thread has a current device (a new thread starts on `cpu:0`) and, per device, its own
//! stream, created on first use and destroyed when the thread exits. The functions act on the
//! current device's [`Runtime`], in the order of InfiniCore's `context.hpp`: device selection,
//! streams, memory, copies, events, graph recording — then the allocator extras (statistics,
//! trimming, pin mode).
//!
//! ```
//! use unirt::{context, Device};
//! context::set_device(Device::CPU)?;
//! let m = context::allocate_memory(256)?;
//! let data = [7u8; 256];
//! let mut back = [0u8; 256];
//! // SAFETY: both host buffers outlive the synchronous copies.
//! unsafe {
//!     context::memcpy_h2d(m.device_ptr(), data.as_ptr(), 256, false)?;
//!     context::memcpy_d2h(back.as_mut_ptr(), m.device_ptr(), 256)?;
//! }
//! assert_eq!(back, data);
//! # Ok::<(), unirt::Error>(())
//! ```

use std::sync::Arc;

use crate::alloc::{MemoryStats, PrivatePool};
use crate::device::{Device, DeviceKind};
use crate::error::Result;
use crate::graph::Graph;
use crate::hal::{Backend, EventFlags, EventId, EventStatus, MemcpyKind, StreamId};
use crate::memory::Memory;
use crate::runtime::Runtime;
use crate::stream::Stream;
use crate::thread_state;

fn runtime() -> Result<Arc<Runtime>> {
    Runtime::get(get_device())
}

/// Makes `device` the calling thread's current device (opening it, and creating its runtime,
/// on first use). An unknown or unavailable device is an error and changes nothing.
pub fn set_device(device: Device) -> Result<()> {
    Runtime::get(device)?;
    thread_state::set_current_device(device);
    Ok(())
}

/// The calling thread's current device (`cpu:0` until [`set_device`]).
pub fn get_device() -> Device {
    thread_state::current_device()
}

/// How many devices of a kind this machine has (0 when the vendor is unavailable).
pub fn get_device_count(kind: DeviceKind) -> usize {
    crate::discover().count(kind)
}

/// The calling thread's stream on the current device.
pub fn get_stream() -> Result<StreamId> {
    runtime()?.stream()
}

/// The calling thread's stream on the current device as a [`Stream`] handle, for typed copies
/// ([`Stream::copy_from_slice`], [`Stream::copy_to_vec`]) and launches.
pub fn current_stream() -> Result<Stream> {
    runtime()?.current_stream()
}

/// Waits for the calling thread's stream on the current device.
pub fn sync_stream() -> Result<()> {
    runtime()?.sync_stream()
}

/// Waits for every stream of the current device.
pub fn sync_device() -> Result<()> {
    runtime()?.sync_device()
}

/// Device memory on the current device, for work on the thread's stream.
pub fn allocate_memory(bytes: usize) -> Result<Memory> {
    runtime()?.allocate_memory(bytes)
}

/// Plain (pageable) host memory.
pub fn allocate_host_memory(bytes: usize) -> Result<Memory> {
    Memory::host(bytes)
}

/// Pinned host memory from the current device's pool.
pub fn allocate_pinned_host_memory(bytes: usize) -> Result<Memory> {
    runtime()?.allocate_pinned_host_memory(bytes)
}

/// Host to device on the thread's stream; asynchronous unless `asynchronous` is false.
///
/// # Safety
/// `src` must be readable for `bytes` bytes until the copy has run.
pub unsafe fn memcpy_h2d(
    dst: crate::DevicePtr,
    src: *const u8,
    bytes: usize,
    asynchronous: bool,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { runtime()?.memcpy_h2d(dst, src, bytes, asynchronous) }
}

/// Device to host, after the thread's stream's earlier work; always synchronous (as upstream).
///
/// # Safety
/// `dst` must be writable for `bytes` bytes.
pub unsafe fn memcpy_d2h(dst: *mut u8, src: crate::DevicePtr, bytes: usize) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { runtime()?.memcpy_d2h(dst, src, bytes) }
}

/// Device to device on the thread's stream; asynchronous unless `asynchronous` is false.
pub fn memcpy_d2d(
    dst: crate::DevicePtr,
    src: crate::DevicePtr,
    bytes: usize,
    asynchronous: bool,
) -> Result<()> {
    runtime()?.memcpy_d2d(dst, src, bytes, asynchronous)
}

/// Host to host, synchronous (done by the host backend).
///
/// # Safety
/// `src` must be readable and `dst` writable for `bytes` bytes.
pub unsafe fn memcpy_h2h(dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
    let host = crate::open(Device::CPU)?;
    // SAFETY: forwarded from the caller.
    unsafe {
        host.memcpy(
            dst as usize as u64,
            src as usize as u64,
            bytes,
            MemcpyKind::H2H,
        )
    }
}

/// A timing event on the current device. Destroy it with [`destroy_event`].
pub fn create_event() -> Result<EventId> {
    runtime()?.backend().event_create(EventFlags::DEFAULT)
}

/// An event with infinirt's flags (`0x1` disable timing, `0x2` blocking sync).
pub fn create_event_with_flags(flags: u32) -> Result<EventId> {
    runtime()?.backend().event_create(EventFlags::new(flags)?)
}

/// Records `event` on `stream`, or on the thread's stream when `None`.
pub fn record_event(event: EventId, stream: Option<StreamId>) -> Result<()> {
    let rt = runtime()?;
    let s = match stream {
        Some(s) => s,
        None => rt.stream()?,
    };
    rt.backend().event_record(event, s)
}

/// True when the work `event` recorded has completed (or it was never recorded).
pub fn query_event(event: EventId) -> Result<bool> {
    Ok(runtime()?.backend().event_query(event)? == EventStatus::Complete)
}

/// Blocks until the work `event` recorded has completed.
pub fn synchronize_event(event: EventId) -> Result<()> {
    runtime()?.backend().event_synchronize(event)
}

/// Destroys an event of the current device.
pub fn destroy_event(event: EventId) -> Result<()> {
    runtime()?.backend().event_destroy(event)
}

/// Milliseconds between two completed timing events.
pub fn elapsed_time(start: EventId, end: EventId) -> Result<f32> {
    runtime()?.backend().event_elapsed_ms(start, end)
}

/// Makes later work on `stream` (the thread's stream when `None`) wait for `event`.
pub fn stream_wait_event(stream: Option<StreamId>, event: EventId) -> Result<()> {
    let rt = runtime()?;
    let s = match stream {
        Some(s) => s,
        None => rt.stream()?,
    };
    rt.backend().stream_wait_event(s, event)
}

/// Whether the calling thread records an operator graph on the current device.
pub fn is_graph_recording() -> bool {
    runtime().is_ok_and(|rt| crate::graph::record::is_recording(rt.device()))
}

/// Starts recording an operator graph on the current device from the calling thread
/// (InfiniCore's `context::startGraphRecording`): until [`stop_graph_recording`], operators
/// launched on this thread — the eager Tensor API, [`Plan::launch`](crate::ops::Plan::launch),
/// [`add_graph_operator`] — are recorded instead of run. [`Error::Capturing`](crate::Error::Capturing)
/// if this thread already records.
///
/// ```
/// use unirt::{context, tensor::{DType, Tensor}, Device};
/// context::set_device(Device::CPU)?;
/// let x = Tensor::full(&[4], 1.5, DType::F32, Device::CPU)?;
/// context::start_graph_recording()?;
/// let y = x.mul(&x)?.add(&x);
/// let graph = context::stop_graph_recording()?;
/// let y = y?;
/// let exec = graph.instantiate()?;
/// exec.replay()?;
/// exec.synchronize()?;
/// assert_eq!(graph.nodes().len(), 2);
/// let _ = y; // y is the graph's output buffer, written by each replay
/// # Ok::<(), unirt::Error>(())
/// ```
pub fn start_graph_recording() -> Result<()> {
    runtime()?.start_graph_recording()
}

/// Adds an operator to the graph being recorded (InfiniCore's `addGraphOperator`): `plan`
/// with its tensors, recorded as a launch on the current stream would run it.
/// [`Error::NotCapturing`](crate::Error::NotCapturing) when this thread does not record on the
/// current device.
pub fn add_graph_operator(
    plan: &crate::ops::Plan,
    inputs: &[&crate::tensor::Tensor],
    outputs: &[&crate::tensor::Tensor],
) -> Result<()> {
    let rt = runtime()?;
    if !crate::graph::record::is_recording(rt.device()) {
        return Err(crate::Error::NotCapturing);
    }
    plan.launch(inputs, outputs, None, rt.stream()?)
}

/// Stops the calling thread's recording and returns the operator graph
/// (InfiniCore's `stopGraphRecording`): plan it, instantiate it and replay it, or run it
/// eagerly with [`Runtime::run`](crate::Runtime::run).
pub fn stop_graph_recording() -> Result<Graph> {
    runtime()?.stop_graph_recording()
}

/// The current device's allocator statistics.
pub fn memory_stats() -> Result<MemoryStats> {
    Ok(runtime()?.memory_stats())
}

/// Sets the current device's peak statistics to their current values.
pub fn reset_peak_memory_stats() -> Result<()> {
    runtime()?.allocator().reset_peak();
    Ok(())
}

/// Waits for the device, then returns idle cached blocks to the backend (InfiniCore's
/// `trimDeviceMemory`).
pub fn trim_device_memory() -> Result<()> {
    runtime()?.empty_cache()
}

/// InfiniCore's pin mode on the current device; see
/// [`CachingAllocator::set_pin_mode`](crate::alloc::CachingAllocator::set_pin_mode).
pub fn set_pin_mode(pinned: bool) -> Result<Option<Arc<PrivatePool>>> {
    runtime()?.set_pin_mode(pinned)
}
