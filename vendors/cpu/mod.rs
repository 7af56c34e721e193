//! The CPU backend: the host processor as a full unirt device.
//!
//! Unlike upstream InfiniRT's CPU backend (no streams, events always complete, no graphs), this
//! one implements the whole HAL for real: each stream is a worker thread running an ordered
//! queue, events are stamped when the worker reaches them (so a query says NOT_READY while work
//! is pending and elapsed time measures the work), waits cross streams, memory can be
//! stream-ordered, and streams can be captured and replayed. Device memory is host memory
//! registered in an allocation table, so every copy, set and free is bounds-checked.
//!
//! Memory lifetimes follow [`crate::checked`]: every operation pins the allocations it
//! touches until it has run, so `free` / `free_host` never wait for the device and never
//! release memory that queued, running or replaying work still uses; the worker that drops the
//! last pin releases it.

mod event;
mod graph;
mod kernels;
mod memory;
mod stream;

pub(crate) use kernels::matmul_workspace;
pub(crate) use kernels::register as register_kernels;
pub(crate) use kernels::{can_help_forks, help_open_forks};

use std::sync::Arc;

use event::CpuEvent;
use graph::{Capture, CpuGraph, CpuGraphExec, Node};
use parking_lot::Mutex;
use stream::{CpuStream, Op};

use crate::checked::{self, CheckedMemory, Pageable, Pins};
use crate::device::{Capabilities, DeviceClass, DeviceInfo, DeviceKind, EventTiming, MemInfo};
use crate::error::{Error, Result};
use crate::hal::Probe;
use crate::hal::*;
use crate::handles::HandleTable;
use crate::hostmem::HostBlock;
use crate::kernel::check_launch;

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
        class: DeviceClass::Host,
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
    /// Device memory (host memory with device semantics) and pinned host memory.
    mem: CheckedMemory<HostBlock>,
    streams: HandleTable<CpuStream>,
    /// Destroyed streams whose workers still run queued work: device synchronize waits for
    /// them too. Pruned once idle.
    retired: Mutex<Vec<Arc<CpuStream>>>,
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
        let (default_stream, default) =
            streams.insert(CpuStream::new("unirt-cpu-default".into())?)?;
        Ok(CpuBackend {
            info: device_info(),
            mem: CheckedMemory::new(DeviceKind::Cpu, "cpu:0", true),
            streams,
            retired: Mutex::new(Vec::new()),
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

    /// Runs `op` on `stream`, holding `pins` until it has run — or records it, with weak
    /// references to what it uses, when the stream is capturing.
    fn submit(&self, stream: &CpuStream, op: Op, pins: Pins<HostBlock>) -> Result<()> {
        {
            let mut cap = stream.capture.lock();
            if let Some(c) = cap.as_mut() {
                c.nodes.push(Node::Op(op));
                c.uses.record(&pins);
                return Ok(());
            }
        }
        stream.enqueue(op, pins)
    }

    /// The default stream, refused while it is capturing (synchronous calls use it).
    fn sync_default(&self) -> Result<()> {
        let s = &self.default;
        checked::refuse_while_capturing(
            s.is_capturing(),
            "a synchronous call while the default stream is capturing",
        )?;
        s.synchronize()
    }
}

/// A copy with a pageable host side, by CUDA's rules (see [`Pageable`]): it runs on the
/// calling thread once the stream's earlier work has run — at once on an idle stream — so it
/// has read its source and written its destination when this returns; a small copy from
/// pageable memory to a busy stream is staged instead, and the stream goes on.
///
/// # Safety
/// As `memcpy_async`: the pageable ranges are valid for the call.
unsafe fn pageable_copy(
    s: &CpuStream,
    dst: u64,
    src: u64,
    bytes: usize,
    pageable: Pageable,
    pins: Pins<HostBlock>,
) -> Result<()> {
    if !s.is_idle() {
        if !pageable.dst && bytes <= stream::STAGE_COPY_MAX {
            // SAFETY: the caller's promise: `src` is readable for `bytes` bytes now.
            let data = unsafe { std::slice::from_raw_parts(src as usize as *const u8, bytes) };
            if bytes <= stream::STAGE_INLINE {
                let mut inline = [0u8; stream::STAGE_INLINE];
                inline[..bytes].copy_from_slice(data);
                let op = Op::CopyInline {
                    dst,
                    len: bytes as u8,
                    data: inline,
                };
                return s.enqueue(op, pins);
            }
            if bytes <= stream::STAGE_SMALL {
                return s.enqueue(
                    Op::CopySmall {
                        dst,
                        data: data.into(),
                    },
                    pins,
                );
            }
            if let Some(data) = s.stage(data) {
                return s.enqueue(Op::CopyStaged { dst, data }, pins);
            }
        }
        s.drain()?;
    }
    // SAFETY: ranges unirt handed out are checked and pinned (alive until `pins` drops, after
    // the copy); pageable ranges are the caller's promise for the call. ptr::copy allows
    // overlap.
    unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, bytes) };
    drop(pins);
    Ok(())
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        // The allocations go with the tables (and with the last command that holds them).
        let _ = self.synchronize();
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
        // Every stream's queued work, capturing streams' (work queued before the capture
        // began) and destroyed streams' included. A live stream's failure is reported and
        // left for its own synchronisation (which may be another thread's); a destroyed
        // stream's has no other owner and is taken.
        let retired: Vec<Arc<CpuStream>> = self.retired.lock().clone();
        let mut first = Ok(());
        for s in self.streams.values() {
            first = first.and(s.wait_and_peek());
        }
        for s in retired {
            first = first.and(s.synchronize());
        }
        self.retired.lock().retain(|s| !s.is_idle());
        first
    }

    fn default_stream(&self) -> StreamId {
        StreamId(self.default_stream)
    }

    fn stream_create(&self) -> Result<StreamId> {
        let n = self.streams.len();
        let (id, _) = self
            .streams
            .insert(CpuStream::new(format!("unirt-cpu-stream-{n}"))?)?;
        Ok(StreamId(id))
    }

    fn stream_destroy(&self, stream: StreamId) -> Result<()> {
        checked::check_destroyable(self.default_stream(), stream)?;
        let s = self.streams.remove(stream.0)?;
        // The worker drains what is queued (its commands pin their memory) and exits when the
        // last handle drops; until it is idle the stream stays where device synchronize sees it.
        let mut retired = self.retired.lock();
        retired.retain(|r| !r.is_idle());
        if !s.is_idle() {
            retired.push(s);
        }
        Ok(())
    }

    fn stream_synchronize(&self, stream: StreamId) -> Result<()> {
        let s = self.stream(stream)?;
        checked::refuse_while_capturing(
            s.is_capturing(),
            "stream_synchronize on a capturing stream",
        )?;
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
        e.captured
            .refuse("stream_wait_event from a stream that is not capturing")?;
        let generation = e.current();
        if generation == 0 || e.status() == EventStatus::Complete {
            return Ok(());
        }
        s.enqueue(
            Op::Wait {
                event: e,
                generation,
            },
            Pins::new(),
        )
    }

    fn event_create(&self, flags: EventFlags) -> Result<EventId> {
        let flags = EventFlags::new(flags.0)?;
        Ok(EventId(self.events.insert(CpuEvent::new(flags))?.0))
    }

    fn event_record(&self, event: EventId, stream: StreamId) -> Result<()> {
        let (s, e) = (self.stream(stream)?, self.event(event)?);
        let mut cap = s.capture.lock();
        if let Some(c) = cap.as_mut() {
            e.captured.enter();
            c.nodes.push(Node::Record(e));
            return Ok(());
        }
        drop(cap);
        e.record(|generation| {
            s.enqueue(
                Op::Stamp {
                    event: e.clone(),
                    generation,
                },
                Pins::new(),
            )
        })
    }

    fn event_query(&self, event: EventId) -> Result<EventStatus> {
        let e = self.event(event)?;
        e.captured.refuse("event_query")?;
        Ok(e.status())
    }

    fn event_synchronize(&self, event: EventId) -> Result<()> {
        let e = self.event(event)?;
        e.captured.refuse("event_synchronize")?;
        let generation = e.current();
        if e.status() == EventStatus::NotReady {
            stream::refuse_wait_in_command("event_synchronize")?;
        }
        e.wait(generation);
        Ok(())
    }

    fn event_elapsed_ms(&self, start: EventId, end: EventId) -> Result<f32> {
        let (a, b) = (self.event(start)?, self.event(end)?);
        a.captured.refuse("event_elapsed_ms")?;
        b.captured.refuse("event_elapsed_ms")?;
        CpuEvent::elapsed_ms(&a, &b)
    }

    fn event_destroy(&self, event: EventId) -> Result<()> {
        self.events.remove(event.0).map(|_| ())
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        HostBlock::register(
            &self.mem.device,
            bytes as u64,
            memory::DEVICE_ALIGN,
            DeviceKind::Cpu,
            self.name(),
        )
        .map(DevicePtr)
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        // Dead for new work at once; released when no queued or running work holds it.
        self.mem.unregister(ptr.0).map(drop)
    }

    fn malloc_host(&self, bytes: usize) -> Result<HostPtr> {
        self.mem.pinned.alloc(bytes)
    }

    fn free_host(&self, ptr: HostPtr) -> Result<()> {
        self.mem.pinned.free(ptr)
    }

    fn malloc_async(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr> {
        let s = self.stream(stream)?;
        checked::unsupported_while_capturing(
            s.is_capturing(),
            "stream-ordered allocation",
            DeviceKind::Cpu,
        )?;
        // Host memory is usable at once, which satisfies every later point of the stream.
        self.malloc(bytes)
    }

    fn free_async(&self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        let s = self.stream(stream)?;
        checked::unsupported_while_capturing(
            s.is_capturing(),
            "stream-ordered free",
            DeviceKind::Cpu,
        )?;
        let Some(a) = self.mem.unregister(ptr.0)? else {
            return Ok(());
        };
        // The stream lets go of the allocation when it reaches this point; work on other
        // streams that still uses it holds its own reference.
        let mut keep = Pins::new();
        keep.hold_device(a);
        s.enqueue(Op::Release, keep)
    }

    unsafe fn memcpy(&self, dst: u64, src: u64, bytes: usize, kind: MemcpyKind) -> Result<()> {
        let pins = self.mem.copy(dst, src, bytes, kind)?;
        self.sync_default()?;
        if bytes > 0 {
            // SAFETY: ranges unirt handed out are checked and pinned (alive until `pins`
            // drops, after the copy); other host ranges are the caller's promise.
            unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, bytes) };
        }
        drop(pins);
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
        let (pins, pageable) = self.mem.copy_sides(dst, src, bytes, kind)?;
        if bytes == 0 {
            return Ok(());
        }
        let op = Op::Copy {
            dst,
            src,
            len: bytes,
        };
        // A capture reads and writes host memory at each replay, pageable or not.
        if pageable == Pageable::default() || s.is_capturing() {
            return self.submit(&s, op, pins);
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { pageable_copy(&s, dst, src, bytes, pageable, pins) }
    }

    fn memset(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        let mut pins = Pins::new();
        self.mem.device_range(dst.0, bytes as u64, &mut pins)?;
        self.sync_default()?;
        if bytes > 0 {
            // SAFETY: the range lies in one allocation, pinned until `pins` drops.
            unsafe { std::ptr::write_bytes(dst.0 as usize as *mut u8, value, bytes) };
        }
        drop(pins);
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
        let mut pins = Pins::new();
        self.mem.device_range(dst.0, bytes as u64, &mut pins)?;
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
            pins,
        )
    }

    fn launch(&self, kernel: &str, args: &[KernelArg], stream: StreamId) -> Result<()> {
        let s = self.stream(stream)?;
        let mut pins = Pins::new();
        let checked = check_launch(kernel, args, |p, len| {
            self.mem.device_range(p.0, len, &mut pins).map(drop)
        })?;
        let run = kernels::lookup(kernel)?;
        if checked.n == 0 {
            return Ok(());
        }
        self.submit(
            &s,
            Op::Kernel {
                run,
                args: args.into(),
            },
            pins,
        )
    }

    fn launch_host(
        &self,
        task: HostTask,
        ranges: &[(DevicePtr, u64)],
        stream: StreamId,
    ) -> Result<()> {
        let s = self.stream(stream)?;
        // The task's buffers are pinned until it has run: a racing free cannot release them.
        let mut pins = Pins::new();
        for &(p, len) in ranges {
            self.mem.device_range(p.0, len, &mut pins)?;
        }
        self.submit(&s, Op::Host(task), pins)
    }

    fn begin_capture(&self, stream: StreamId, mode: CaptureMode) -> Result<()> {
        let s = self.stream(stream)?;
        let begun = checked::begin_capture(&mut s.capture.lock(), Capture::new(mode));
        begun
    }

    fn end_capture(&self, stream: StreamId) -> Result<GraphId> {
        let s = self.stream(stream)?;
        let c = checked::end_capture(&mut s.capture.lock())?;
        for n in &c.nodes {
            if let Node::Record(e) = n {
                e.captured.leave();
            }
        }
        let graph = CpuGraph {
            nodes: c.nodes.into(),
            uses: Arc::new(c.uses),
        };
        Ok(GraphId(self.graphs.insert(graph)?.0))
    }

    fn graph_instantiate(&self, graph: GraphId) -> Result<GraphExecId> {
        let g = self.graphs.get(graph.0)?;
        // Refused when memory the graph uses was freed since the capture.
        self.mem.repin(&g.uses)?;
        Ok(GraphExecId(self.execs.insert(CpuGraphExec::new(&g))?.0))
    }

    fn graph_launch(&self, exec: GraphExecId, stream: StreamId) -> Result<()> {
        let (x, s) = (self.execs.get(exec.0)?, self.stream(stream)?);
        // A replay never touches memory freed since the capture, and what it uses stays
        // alive until it has run.
        let pins = self.mem.repin(&x.uses)?;
        {
            let mut cap = s.capture.lock();
            if let Some(c) = cap.as_mut() {
                for n in x.nodes.iter() {
                    if let Node::Record(e) = n {
                        e.captured.enter();
                    }
                }
                c.nodes.extend(x.nodes.iter().cloned());
                c.uses.extend(&x.uses);
                return Ok(());
            }
        }
        if x.nodes.is_empty() {
            return Ok(());
        }
        x.launch(|batch| s.enqueue(Op::Batch(batch), pins))
    }

    fn graph_destroy(&self, graph: GraphId) -> Result<()> {
        self.graphs.remove(graph.0).map(|_| ())
    }

    fn graph_exec_destroy(&self, exec: GraphExecId) -> Result<()> {
        self.execs.remove(exec.0).map(|_| ())
    }
}
