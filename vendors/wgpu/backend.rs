//! The [`Backend`] implementation of [`WgpuBackend`]: every call runs inside
//! `guard::guarded` (a wgpu panic is a typed error), checks its handles and ranges against the
//! backend's tables, then enqueues prepared commands on the stream (`stream.rs`); the HAL's
//! fixed kernels are launched from `launch.rs`.

use std::sync::Arc;

use super::event::WEvent;
use super::graph::{Capture, WGraph, WGraphExec};
use super::memory::DevBuf;
use super::stream::{enqueue, flush_locked, Cmd, WStream};
use super::{copy, fault, graph, guard, memory, stream, WgpuBackend};
use crate::checked::{self, Pins};
use crate::device::{DeviceClass, DeviceInfo, DeviceKind, MemInfo};
use crate::error::{Error, Result};
use crate::hal::*;

impl Drop for WgpuBackend {
    fn drop(&mut self) {
        let _ = self.synchronize();
    }
}

/// Every call that can reach wgpu runs inside `guard::guarded`: a wgpu panic (its GL
/// backend's 6 s context-lock timeout, say) is an `Error::Driver`, never a panic in the
/// caller's thread. The calls themselves are the `raw_*` methods below.
impl Backend for WgpuBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Wgpu
    }

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_info(&self) -> Result<MemInfo> {
        guard::guarded("mem_info", || self.raw_mem_info())
    }

    fn synchronize(&self) -> Result<()> {
        guard::guarded("synchronize", || self.raw_synchronize())
    }

    fn default_stream(&self) -> StreamId {
        StreamId(self.default_stream)
    }

    fn stream_create(&self) -> Result<StreamId> {
        guard::guarded("stream_create", || self.raw_stream_create())
    }

    fn stream_destroy(&self, stream: StreamId) -> Result<()> {
        guard::guarded("stream_destroy", || self.raw_stream_destroy(stream))
    }

    fn stream_synchronize(&self, stream: StreamId) -> Result<()> {
        guard::guarded("stream_synchronize", || self.raw_stream_synchronize(stream))
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<()> {
        guard::guarded("stream_wait_event", || {
            self.raw_stream_wait_event(stream, event)
        })
    }

    fn event_create(&self, flags: EventFlags) -> Result<EventId> {
        guard::guarded("event_create", || self.raw_event_create(flags))
    }

    fn event_record(&self, event: EventId, stream: StreamId) -> Result<()> {
        guard::guarded("event_record", || self.raw_event_record(event, stream))
    }

    fn event_query(&self, event: EventId) -> Result<EventStatus> {
        guard::guarded("event_query", || self.raw_event_query(event))
    }

    fn event_synchronize(&self, event: EventId) -> Result<()> {
        guard::guarded("event_synchronize", || self.raw_event_synchronize(event))
    }

    fn event_elapsed_ms(&self, start: EventId, end: EventId) -> Result<f32> {
        guard::guarded("event_elapsed_ms", || self.raw_event_elapsed_ms(start, end))
    }

    fn event_destroy(&self, event: EventId) -> Result<()> {
        guard::guarded("event_destroy", || self.raw_event_destroy(event))
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr> {
        guard::guarded("malloc", || self.raw_malloc(bytes))
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        guard::guarded("free", || self.raw_free(ptr))
    }

    fn malloc_host(&self, bytes: usize) -> Result<HostPtr> {
        guard::guarded("malloc_host", || self.raw_malloc_host(bytes))
    }

    fn free_host(&self, ptr: HostPtr) -> Result<()> {
        guard::guarded("free_host", || self.raw_free_host(ptr))
    }

    fn malloc_async(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr> {
        guard::guarded("malloc_async", || self.raw_malloc_async(bytes, stream))
    }

    fn free_async(&self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        guard::guarded("free_async", || self.raw_free_async(ptr, stream))
    }

    unsafe fn memcpy(&self, dst: u64, src: u64, bytes: usize, kind: MemcpyKind) -> Result<()> {
        // SAFETY: the caller's contract for `memcpy`, forwarded unchanged.
        guard::guarded("memcpy", || unsafe {
            self.raw_memcpy(dst, src, bytes, kind)
        })
    }

    unsafe fn memcpy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        kind: MemcpyKind,
        stream: StreamId,
    ) -> Result<()> {
        // SAFETY: the caller's contract for `memcpy_async`, forwarded unchanged.
        guard::guarded("memcpy_async", || unsafe {
            self.raw_memcpy_async(dst, src, bytes, kind, stream)
        })
    }

    fn memset(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        guard::guarded("memset", || self.raw_memset(dst, value, bytes))
    }

    fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: StreamId,
    ) -> Result<()> {
        guard::guarded("memset_async", || {
            self.raw_memset_async(dst, value, bytes, stream)
        })
    }

    fn launch(&self, kernel: &str, args: &[KernelArg], stream: StreamId) -> Result<()> {
        guard::guarded("launch", || self.raw_launch(kernel, args, stream))
    }

    fn begin_capture(&self, stream: StreamId, mode: CaptureMode) -> Result<()> {
        guard::guarded("begin_capture", || self.raw_begin_capture(stream, mode))
    }

    fn end_capture(&self, stream: StreamId) -> Result<GraphId> {
        guard::guarded("end_capture", || self.raw_end_capture(stream))
    }

    fn graph_instantiate(&self, graph: GraphId) -> Result<GraphExecId> {
        guard::guarded("graph_instantiate", || self.raw_graph_instantiate(graph))
    }

    fn graph_launch(&self, exec: GraphExecId, stream: StreamId) -> Result<()> {
        guard::guarded("graph_launch", || self.raw_graph_launch(exec, stream))
    }

    fn graph_destroy(&self, graph: GraphId) -> Result<()> {
        guard::guarded("graph_destroy", || self.raw_graph_destroy(graph))
    }

    fn graph_exec_destroy(&self, exec: GraphExecId) -> Result<()> {
        guard::guarded("graph_exec_destroy", || self.raw_graph_exec_destroy(exec))
    }
}

/// The backend's calls, each run by the `Backend` impl above inside `guard::guarded`.
impl WgpuBackend {
    fn raw_mem_info(&self) -> Result<MemInfo> {
        let used = self.mem.device.usage().1;
        // Host memory (see `adapter::describe`), within the process's cgroup.
        match crate::meminfo::host_memory() {
            Some(m) => Ok(MemInfo {
                free: m.available.min(m.total.saturating_sub(used)),
                total: m.total,
            }),
            None => Ok(MemInfo {
                free: self.info.memory_total.saturating_sub(used),
                total: self.info.memory_total,
            }),
        }
    }

    fn raw_synchronize(&self) -> Result<()> {
        let mut first = Ok(());
        for s in self.streams.values() {
            if let Err(e) = s.flush(&self.gpu) {
                first = first.and(Err(e));
            }
        }
        // A device-wide wait also says whether the device is still there, as
        // cudaDeviceSynchronize reports a sticky error.
        first = first
            .and(self.gpu.wait(&self.gpu.last()))
            .and_then(|()| self.gpu.check_lost());
        // Then every stream's kernel faults — reported, and left for the stream's own
        // synchronisation (another thread's, perhaps) — and, taken, those of the streams
        // destroyed since the last device-wide synchronisation (see `fault.rs`).
        for s in self.streams.values() {
            first = first.and(s.peek_faults(&self.gpu));
        }
        let orphans = std::mem::take(&mut *self.orphan_faults.lock());
        first.and(fault::check(&self.gpu, &orphans, true))
    }

    fn raw_stream_create(&self) -> Result<StreamId> {
        Ok(StreamId(self.streams.insert(WStream::new())?.0))
    }

    fn raw_stream_destroy(&self, stream: StreamId) -> Result<()> {
        checked::check_destroyable(self.default_stream(), stream)?;
        let s = self.streams.remove(stream.0)?;
        // Work already enqueued still runs; the device's next synchronisation checks it.
        let faults = std::mem::take(&mut s.lock().checks);
        fault::note(&mut self.orphan_faults.lock(), faults);
        s.flush(&self.gpu).map(|_| ())
    }

    fn raw_stream_synchronize(&self, stream: StreamId) -> Result<()> {
        let s = self.stream(stream)?;
        checked::refuse_while_capturing(
            s.is_capturing(),
            "stream_synchronize on a capturing stream",
        )?;
        s.synchronize(&self.gpu)
    }

    fn raw_stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<()> {
        let (s, e) = (self.stream(stream)?, self.event(event)?);
        // Records submit at once and every stream submits to the one queue in order, so the
        // waiting stream's later work already runs after the event's work; only a capture
        // keeps the wait, to replay it in place.
        let mut st = s.lock();
        match st.capture.as_mut() {
            Some(c) => c.cmds.push(Cmd::Wait),
            None => e
                .captured
                .refuse("stream_wait_event from a stream that is not capturing")?,
        }
        Ok(())
    }

    fn raw_event_create(&self, flags: EventFlags) -> Result<EventId> {
        let flags = EventFlags::new(flags.0)?;
        let e = WEvent::new(&self.gpu, flags)?;
        Ok(EventId(self.events.insert(e)?.0))
    }

    fn raw_event_record(&self, event: EventId, stream: StreamId) -> Result<()> {
        let (s, e) = (self.stream(stream)?, self.event(event)?);
        enqueue(
            &self.gpu,
            &s,
            vec![Cmd::Record(e)],
            &[],
            Pins::new(),
            0,
            true,
        )
    }

    fn raw_event_query(&self, event: EventId) -> Result<EventStatus> {
        let e = self.event(event)?;
        e.captured.refuse("event_query")?;
        e.status(&self.gpu)
    }

    fn raw_event_synchronize(&self, event: EventId) -> Result<()> {
        let e = self.event(event)?;
        e.captured.refuse("event_synchronize")?;
        e.wait(&self.gpu)
    }

    fn raw_event_elapsed_ms(&self, start: EventId, end: EventId) -> Result<f32> {
        let (a, b) = (self.event(start)?, self.event(end)?);
        a.captured.refuse("event_elapsed_ms")?;
        b.captured.refuse("event_elapsed_ms")?;
        WEvent::elapsed_ms(&self.gpu, &a, &b)
    }

    fn raw_event_destroy(&self, event: EventId) -> Result<()> {
        self.events.remove(event.0).map(|_| ())
    }

    fn raw_malloc(&self, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        self.gpu.alive()?;
        let size = bytes as u64;
        let limit = self.info.max_allocation;
        if size > limit {
            return Err(Error::TooLarge {
                device: self.name.clone(),
                requested: size,
                limit,
            });
        }
        let free = self.mem_info().map(|m| m.free).unwrap_or(u64::MAX);
        if size > free {
            return Err(Error::OutOfMemory {
                backend: DeviceKind::Wgpu,
                device: self.name.clone(),
                requested: size,
                detail: format!("{free} bytes free"),
            });
        }
        let buffer = self.gpu.buffer(
            memory::ceil4(size),
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
        )?;
        let base = self.vas.reserve(size)?;
        let mut buf = DevBuf::new(buffer, false);
        if self.info.class == DeviceClass::Software {
            buf = buf.in_host_memory(size);
        }
        self.mem.device.insert(base, size, buf)?;
        Ok(DevicePtr(base))
    }

    fn raw_free(&self, ptr: DevicePtr) -> Result<()> {
        // Dead for new work at once. Gathered and submitted commands hold the buffer (and wgpu
        // keeps it while a submission uses it), so nothing waits for the device here.
        if let Some(a) = self.mem.unregister(ptr.0)? {
            self.gpu.kernels.forget_buffer(a.payload.id);
        }
        Ok(())
    }

    fn raw_malloc_host(&self, bytes: usize) -> Result<HostPtr> {
        self.mem.pinned.alloc(bytes)
    }

    fn raw_free_host(&self, ptr: HostPtr) -> Result<()> {
        // Released once no submission that reads or writes it is in flight.
        self.mem.pinned.free(ptr)
    }

    fn raw_malloc_async(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr> {
        let capturing = self.stream(stream)?.is_capturing();
        checked::unsupported_while_capturing(
            capturing,
            "stream-ordered allocation",
            DeviceKind::Wgpu,
        )?;
        // A new buffer is usable by any later submission.
        self.malloc(bytes)
    }

    fn raw_free_async(&self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        let capturing = self.stream(stream)?.is_capturing();
        checked::unsupported_while_capturing(capturing, "stream-ordered free", DeviceKind::Wgpu)?;
        // One queue runs every stream in submission order, and the commands gathered on any
        // stream hold the buffer until they have run: freeing now is freeing in stream order.
        self.free(ptr)
    }

    unsafe fn raw_memcpy(&self, dst: u64, src: u64, bytes: usize, kind: MemcpyKind) -> Result<()> {
        self.mem.copy(dst, src, bytes, kind)?;
        let s = self.sync_default()?;
        // SAFETY: forwarded caller contract; the copy completes before this returns.
        unsafe { self.memcpy_async(dst, src, bytes, kind, self.default_stream())? };
        s.synchronize(&self.gpu)
    }

    unsafe fn raw_memcpy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        kind: MemcpyKind,
        stream: StreamId,
    ) -> Result<()> {
        let s = self.stream(stream)?;
        let n = bytes as u64;
        let (mut pins, pageable) = self.mem.copy_sides(dst, src, bytes, kind)?;
        if bytes == 0 {
            return Ok(());
        }
        if kind == MemcpyKind::H2H {
            if s.is_capturing() {
                return Err(Error::unsupported(
                    "a host-to-host copy inside a capture",
                    DeviceKind::Wgpu,
                ));
            }
            // Ordered after the stream's work by waiting for it (its kernels' faults stay for
            // the stream's next synchronisation).
            s.wait_for_work(&self.gpu)?;
            // SAFETY: neither side is a device address (checked); pinned host ranges are
            // bounds-checked and held until `pins` drops, after the copy; other host
            // ranges are the caller's promise. ptr::copy allows overlap.
            unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, bytes) };
            drop(pins);
            return Ok(());
        }
        let (dst_buf, src_buf) = match kind {
            MemcpyKind::H2D => (Some(self.resolve(dst, n, &mut pins)?), None),
            MemcpyKind::D2H => (None, Some(self.resolve(src, n, &mut pins)?)),
            _ => (
                Some(self.resolve(dst, n, &mut pins)?),
                Some(self.resolve(src, n, &mut pins)?),
            ),
        };
        // The destination's bytes, when it is on the device.
        let writes: Vec<(u64, u64, u64)> = dst_buf
            .iter()
            .map(|(buf, off)| (buf.id, *off, off + n))
            .collect();
        let mut captured = false;
        stream::enqueue_built(&self.gpu, &s, &writes, pins, |capturing, cmds| {
            captured = capturing;
            match (dst_buf, src_buf) {
                (Some((buf, off)), None) => {
                    // SAFETY: the caller promised the host source is readable (now, and at
                    // each replay of a capture).
                    unsafe { copy::upload(&self.gpu, cmds, &buf, off, src, n, capturing)? };
                    Ok((n, false))
                }
                (None, Some((buf, off))) => {
                    copy::download(&self.gpu, cmds, dst, &buf, off, n, capturing)?;
                    Ok((n, true))
                }
                (Some((dbuf, doff)), Some((sbuf, soff))) => {
                    copy::device_copy(&self.gpu, cmds, &dbuf, doff, &sbuf, soff, n)?;
                    Ok((n, false))
                }
                (None, None) => Err(Error::Internal("a copy with no device side".into())),
            }
        })?;
        // CUDA's rule for pageable memory (see `checked::Pageable`): a copy into it has
        // completed when the call returns, so the caller may free the buffer at once. (An
        // upload reads its pageable source into staging before it is queued.)
        if pageable.dst && !captured {
            s.wait_for_work(&self.gpu)?;
        }
        Ok(())
    }

    fn raw_memset(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        self.mem
            .device_range(dst.0, bytes as u64, &mut Pins::new())?;
        let s = self.sync_default()?;
        self.memset_async(dst, value, bytes, self.default_stream())?;
        s.synchronize(&self.gpu)
    }

    fn raw_memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: StreamId,
    ) -> Result<()> {
        let s = self.stream(stream)?;
        let n = bytes as u64;
        let mut pins = Pins::new();
        let Some(a) = self.mem.device_range(dst.0, n, &mut pins)? else {
            return Ok(());
        };
        let (buf, off) = (a.payload.clone(), dst.0 - a.base);
        let mut cmds = Vec::new();
        copy::device_set(&self.gpu, &mut cmds, &buf, off, value, n)?;
        let writes = [(buf.id, off, off + n)];
        enqueue(&self.gpu, &s, cmds, &writes, pins, n, false)
    }

    fn raw_begin_capture(&self, stream: StreamId, mode: CaptureMode) -> Result<()> {
        let s = self.stream(stream)?;
        let begun = checked::begin_capture(&mut s.lock().capture, Capture::new(mode));
        begun
    }

    fn raw_end_capture(&self, stream: StreamId) -> Result<GraphId> {
        let s = self.stream(stream)?;
        let c = checked::end_capture(&mut s.lock().capture)?;
        stream::release_captured_records(&c.cmds);
        let mut uses = c.uses;
        uses.coalesce();
        let graph = WGraph {
            cmds: c.cmds.into(),
            uses: Arc::new(uses),
        };
        Ok(GraphId(self.graphs.insert(graph)?.0))
    }

    fn raw_graph_instantiate(&self, graph: GraphId) -> Result<GraphExecId> {
        let g = self.graphs.get(graph.0)?;
        // Refused when memory the graph uses was freed since the capture.
        self.mem.repin(&g.uses)?;
        let exec = WGraphExec::new(&self.gpu, &g)?;
        Ok(GraphExecId(self.execs.insert(exec)?.0))
    }

    fn raw_graph_launch(&self, exec: GraphExecId, stream: StreamId) -> Result<()> {
        let (x, s) = (self.execs.get(exec.0)?, self.stream(stream)?);
        // A replay never touches memory freed since the capture; the submission holds what
        // it uses until it has completed.
        let pins = self.mem.repin(&x.uses)?;
        let mut st = s.lock();
        if let Some(c) = st.capture.as_mut() {
            let cmds = graph::restage_read_backs(&self.gpu, &x.cmds)?;
            stream::note_captured_records(&cmds);
            c.cmds.extend(cmds);
            c.uses.extend(&x.uses);
            return Ok(());
        }
        if x.plan.is_empty() {
            return Ok(());
        }
        flush_locked(&self.gpu, &mut st)?;
        st.last = x.launch(&self.gpu, pins)?;
        fault::note(&mut st.checks, x.checks.iter().cloned());
        Ok(())
    }

    fn raw_graph_destroy(&self, graph: GraphId) -> Result<()> {
        self.graphs.remove(graph.0).map(|_| ())
    }

    fn raw_graph_exec_destroy(&self, exec: GraphExecId) -> Result<()> {
        self.execs.remove(exec.0).map(|_| ())
    }
}
