//! The CPU backend: the host processor as a full unirt device.
//!
//! Unlike upstream InfiniRT's CPU backend (no streams, events always complete, no graphs), this
//! one implements the whole HAL for real: each stream is a worker thread running an ordered
//! queue, events are stamped when the worker reaches them (so a query says NOT_READY while work
//! is pending and elapsed time measures the work), waits cross streams, memory can be
//! stream-ordered, and streams can be captured and replayed. Device memory is host memory
//! registered in an allocation table, so every copy, set and free is bounds-checked.

mod event;
mod graph;
mod kernels;
mod memory;
mod stream;

pub(crate) use kernels::register as register_kernels;

use std::sync::Arc;

use event::CpuEvent;
use graph::{Capture, CpuGraph, CpuGraphExec, Node};
use stream::{CpuStream, Op};

use crate::device::{Capabilities, DeviceInfo, DeviceKind, EventTiming, MemInfo};
use crate::discovery::Probe;
use crate::error::{Error, Result};
use crate::hal::*;
use crate::handles::HandleTable;
use crate::hostmem::HostHeap;
use crate::kernel::check_launch;
use crate::memtable::AllocTable;

/// Discovery for the CPU vendor: always one device.
pub fn probe() -> Probe {
    Probe::Available(vec![device_info()])
}

fn device_info() -> DeviceInfo {
    let (name, vendor) = memory::cpu_name();
    let total = memory::mem_info().map(|m| m.total).unwrap_or(0);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    DeviceInfo {
        index: 0,
        name,
        vendor,
        driver: format!(
            "unirt host backend ({} {})",
            std::env::consts::OS,
            std::env::consts::ARCH
        ),
        api: "host".into(),
        memory_total: total,
        max_allocation: isize::MAX as u64,
        details: vec![("threads".into(), threads.to_string())],
        capabilities: Capabilities {
            async_streams: true,
            capture: true,
            stream_ordered_memory: true,
            pinned_host_memory: true,
            unified_addressing: true,
            event_timing: EventTiming::Host,
        },
    }
}

/// The opened CPU device.
pub struct CpuBackend {
    info: DeviceInfo,
    device_mem: AllocTable,
    host_mem: HostHeap,
    streams: HandleTable<CpuStream>,
    events: HandleTable<CpuEvent>,
    graphs: HandleTable<CpuGraph>,
    execs: HandleTable<CpuGraphExec>,
    default_stream: u64,
    /// The default stream itself, so synchronous calls skip the handle lookup.
    default: Arc<CpuStream>,
}

impl CpuBackend {
    /// Opens `cpu:index`; only index 0 exists.
    pub fn open(index: usize) -> Result<Self> {
        if index != 0 {
            return Err(Error::DeviceNotFound(format!(
                "cpu:{index} (the cpu vendor has one device, cpu:0)"
            )));
        }
        let streams = HandleTable::new(StreamId::KIND);
        let (default_stream, default) = streams.insert(CpuStream::new("unirt-cpu-default".into())?);
        Ok(CpuBackend {
            info: device_info(),
            device_mem: AllocTable::new("device"),
            host_mem: HostHeap::new("cpu:0"),
            streams,
            events: HandleTable::new(EventId::KIND),
            graphs: HandleTable::new(GraphId::KIND),
            execs: HandleTable::new(GraphExecId::KIND),
            default_stream,
            default,
        })
    }

    fn stream(&self, s: StreamId) -> Result<Arc<CpuStream>> {
        self.streams.get(s.0)
    }

    fn event(&self, e: EventId) -> Result<Arc<CpuEvent>> {
        self.events.get(e.0)
    }

    fn name(&self) -> &'static str {
        "cpu:0"
    }

    /// Checks a device range (empty ranges are fine anywhere).
    fn check_device(&self, addr: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if addr == 0 {
            return Err(Error::NullPointer("device address".into()));
        }
        self.device_mem.lookup(addr, len).map(|_| ())
    }

    /// Validates a copy; returns the device ranges it touches.
    fn check_copy(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        kind: MemcpyKind,
    ) -> Result<Vec<(u64, u64)>> {
        let len = bytes as u64;
        let mut ranges = Vec::with_capacity(2);
        for (addr, on_device) in [(dst, kind.dst_on_device()), (src, kind.src_on_device())] {
            if on_device {
                self.check_device(addr, len)?;
                ranges.push((addr, len));
            } else {
                self.host_mem.check_host(addr, len)?;
            }
        }
        Ok(ranges)
    }

    /// Runs `op` on `stream`, or records it when the stream is capturing.
    fn submit(&self, stream: &CpuStream, op: Op, ranges: &[(u64, u64)]) -> Result<()> {
        {
            let mut cap = stream.capture.lock();
            if let Some(c) = cap.as_mut() {
                c.nodes.push(Node::Op(op));
                c.ranges.extend_from_slice(ranges);
                return Ok(());
            }
        }
        stream.enqueue(op)
    }

    /// The default stream, refused while it is capturing (synchronous calls use it).
    fn sync_default(&self) -> Result<()> {
        let s = &self.default;
        if s.is_capturing() {
            return Err(Error::Capturing(
                "a synchronous call while the default stream is capturing".into(),
            ));
        }
        s.synchronize()
    }
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        let _ = self.synchronize();
        for a in self.device_mem.drain() {
            memory::release(a.base, a.size, memory::DEVICE_ALIGN);
        }
    }
}

impl Backend for CpuBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_info(&self) -> Result<MemInfo> {
        memory::mem_info()
    }

    fn synchronize(&self) -> Result<()> {
        let mut first = Ok(());
        for s in self.streams.values() {
            if s.is_capturing() {
                continue;
            }
            if let Err(e) = s.synchronize() {
                first = first.and(Err(e));
            }
        }
        first
    }

    fn default_stream(&self) -> StreamId {
        StreamId(self.default_stream)
    }

    fn stream_create(&self) -> Result<StreamId> {
        let n = self.streams.len();
        let (id, _) = self
            .streams
            .insert(CpuStream::new(format!("unirt-cpu-stream-{n}"))?);
        Ok(StreamId(id))
    }

    fn stream_destroy(&self, stream: StreamId) -> Result<()> {
        if stream.0 == self.default_stream {
            return Err(Error::BadParam(
                "the default stream cannot be destroyed".into(),
            ));
        }
        // Dropping the last handle closes the channel; the worker drains what is queued and exits.
        self.streams.remove(stream.0).map(|_| ())
    }

    fn stream_synchronize(&self, stream: StreamId) -> Result<()> {
        let s = self.stream(stream)?;
        if s.is_capturing() {
            return Err(Error::Capturing(
                "stream_synchronize on a capturing stream".into(),
            ));
        }
        s.synchronize()
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<()> {
        let (s, e) = (self.stream(stream)?, self.event(event)?);
        let mut cap = s.capture.lock();
        if let Some(c) = cap.as_mut() {
            c.nodes.push(Node::Wait(e));
            return Ok(());
        }
        drop(cap);
        let generation = e.current();
        if generation == 0 || e.status() == EventStatus::Complete {
            return Ok(());
        }
        s.enqueue(Op::Wait {
            event: e,
            generation,
        })
    }

    fn event_create(&self, flags: EventFlags) -> Result<EventId> {
        let flags = EventFlags::new(flags.0)?;
        Ok(EventId(self.events.insert(CpuEvent::new(flags)).0))
    }

    fn event_record(&self, event: EventId, stream: StreamId) -> Result<()> {
        let (s, e) = (self.stream(stream)?, self.event(event)?);
        let mut cap = s.capture.lock();
        if let Some(c) = cap.as_mut() {
            c.nodes.push(Node::Record(e));
            return Ok(());
        }
        drop(cap);
        let generation = e.begin_record();
        s.enqueue(Op::Stamp {
            event: e,
            generation,
        })
    }

    fn event_query(&self, event: EventId) -> Result<EventStatus> {
        Ok(self.event(event)?.status())
    }

    fn event_synchronize(&self, event: EventId) -> Result<()> {
        let e = self.event(event)?;
        e.wait(e.current());
        Ok(())
    }

    fn event_elapsed_ms(&self, start: EventId, end: EventId) -> Result<f32> {
        let (a, b) = (self.event(start)?, self.event(end)?);
        CpuEvent::elapsed_ms(&a, &b)
    }

    fn event_destroy(&self, event: EventId) -> Result<()> {
        self.events.remove(event.0).map(|_| ())
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let p = memory::acquire(bytes as u64, memory::DEVICE_ALIGN, self.name())?;
        self.device_mem.adopt(p, bytes as u64, (), |p| {
            memory::release(p, bytes as u64, memory::DEVICE_ALIGN)
        })?;
        Ok(DevicePtr(p))
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let a = self.device_mem.retire(ptr.0, || self.synchronize())?;
        memory::release(a.base, a.size, memory::DEVICE_ALIGN);
        Ok(())
    }

    fn malloc_host(&self, bytes: usize) -> Result<HostPtr> {
        self.host_mem.alloc(bytes)
    }

    fn free_host(&self, ptr: HostPtr) -> Result<()> {
        self.host_mem.free(ptr, || self.synchronize())
    }

    fn malloc_async(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr> {
        let s = self.stream(stream)?;
        if s.is_capturing() {
            return Err(Error::unsupported(
                "stream-ordered allocation during capture",
                self.name(),
            ));
        }
        // Host memory is usable at once, which satisfies every later point of the stream.
        self.malloc(bytes)
    }

    fn free_async(&self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        let s = self.stream(stream)?;
        if s.is_capturing() {
            return Err(Error::unsupported(
                "stream-ordered free during capture",
                self.name(),
            ));
        }
        if ptr.is_null() {
            return Ok(());
        }
        let a = self.device_mem.remove(ptr.0)?;
        s.enqueue(Op::Free {
            ptr: a.base,
            size: a.size,
        })
    }

    unsafe fn memcpy(&self, dst: u64, src: u64, bytes: usize, kind: MemcpyKind) -> Result<()> {
        self.check_copy(dst, src, bytes, kind)?;
        self.sync_default()?;
        if bytes > 0 {
            // SAFETY: device ranges checked above; host ranges are the caller's promise.
            unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, bytes) };
        }
        Ok(())
    }

    unsafe fn memcpy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        kind: MemcpyKind,
        stream: StreamId,
    ) -> Result<()> {
        let s = self.stream(stream)?;
        let ranges = self.check_copy(dst, src, bytes, kind)?;
        if bytes == 0 {
            return Ok(());
        }
        self.submit(
            &s,
            Op::Copy {
                dst,
                src,
                len: bytes,
            },
            &ranges,
        )
    }

    fn memset(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        self.check_device(dst.0, bytes as u64)?;
        self.sync_default()?;
        if bytes > 0 {
            // SAFETY: the range lies in one live allocation (checked above).
            unsafe { std::ptr::write_bytes(dst.0 as usize as *mut u8, value, bytes) };
        }
        Ok(())
    }

    fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: StreamId,
    ) -> Result<()> {
        let s = self.stream(stream)?;
        self.check_device(dst.0, bytes as u64)?;
        if bytes == 0 {
            return Ok(());
        }
        self.submit(
            &s,
            Op::Set {
                dst: dst.0,
                value,
                len: bytes,
            },
            &[(dst.0, bytes as u64)],
        )
    }

    fn launch(&self, kernel: &str, args: &[KernelArg], stream: StreamId) -> Result<()> {
        let s = self.stream(stream)?;
        let checked = check_launch(kernel, args, |p, len| self.check_device(p.0, len))?;
        let run = kernels::lookup(kernel)?;
        if checked.n == 0 {
            return Ok(());
        }
        let ranges: Vec<(u64, u64)> = checked.buffers.iter().map(|(p, l)| (p.0, *l)).collect();
        self.submit(
            &s,
            Op::Kernel {
                run,
                args: args.into(),
            },
            &ranges,
        )
    }

    fn launch_host(
        &self,
        task: HostTask,
        ranges: &[(DevicePtr, u64)],
        stream: StreamId,
    ) -> Result<()> {
        let s = self.stream(stream)?;
        let mut checked = Vec::with_capacity(ranges.len());
        for &(p, len) in ranges {
            self.check_device(p.0, len)?;
            if len > 0 {
                checked.push((p.0, len));
            }
        }
        self.submit(&s, Op::Host(task), &checked)
    }

    fn begin_capture(&self, stream: StreamId, mode: CaptureMode) -> Result<()> {
        let s = self.stream(stream)?;
        let mut cap = s.capture.lock();
        if cap.is_some() {
            return Err(Error::Capturing(
                "begin_capture on a stream that is already capturing".into(),
            ));
        }
        let _ = mode;
        *cap = Some(Capture::default());
        Ok(())
    }

    fn end_capture(&self, stream: StreamId) -> Result<GraphId> {
        let s = self.stream(stream)?;
        let c = s.capture.lock().take().ok_or(Error::NotCapturing)?;
        let graph = CpuGraph {
            nodes: c.nodes.into(),
            ranges: c.ranges.into(),
        };
        Ok(GraphId(self.graphs.insert(graph).0))
    }

    fn graph_instantiate(&self, graph: GraphId) -> Result<GraphExecId> {
        let g = self.graphs.get(graph.0)?;
        for &(addr, len) in g.ranges.iter() {
            self.check_device(addr, len)?;
        }
        Ok(GraphExecId(self.execs.insert(CpuGraphExec::new(&g)).0))
    }

    fn graph_launch(&self, exec: GraphExecId, stream: StreamId) -> Result<()> {
        let (x, s) = (self.execs.get(exec.0)?, self.stream(stream)?);
        // A replay must not touch memory freed since the capture.
        for &(addr, len) in x.ranges.iter() {
            self.check_device(addr, len)?;
        }
        {
            let mut cap = s.capture.lock();
            if let Some(c) = cap.as_mut() {
                c.nodes.extend(x.nodes.iter().cloned());
                c.ranges.extend_from_slice(&x.ranges);
                return Ok(());
            }
        }
        if x.nodes.is_empty() {
            return Ok(());
        }
        s.enqueue(Op::Batch(x.materialize()))
    }

    fn graph_destroy(&self, graph: GraphId) -> Result<()> {
        self.graphs.remove(graph.0).map(|_| ())
    }

    fn graph_exec_destroy(&self, exec: GraphExecId) -> Result<()> {
        self.execs.remove(exec.0).map(|_| ())
    }
}
