//! The [`Backend`] implementation of [`CudaBackend`]: validation against the handle and
//! allocation tables (`checks.rs`), ordering across streams where a call needs it
//! (`sync.rs`), then one driver call each. Capture and graph calls live with the graph
//! objects (`graph.rs`).

use super::driver_launch::ArgValue;
use super::driver_memory::host_copy;
use super::event::{cu_flags, CudaEvent};
use super::memory::AllocKind;
use super::stream::CudaStream;
use super::CudaBackend;
use crate::checked;
use crate::device::{DeviceInfo, DeviceKind, MemInfo};
use crate::error::{Error, Result};
use crate::hal::*;
use crate::kernel::check_launch;

/// Threads per block for the element-wise kernels.
const BLOCK: u32 = 256;
/// Grid cap; the kernels' grid-stride loops cover the rest.
const MAX_GRID: u32 = 1 << 20;

impl Backend for CudaBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_info(&self) -> Result<MemInfo> {
        self.bind()?;
        let (free, total) = self.drv.mem_get_info()?;
        Ok(MemInfo { free, total })
    }

    fn synchronize(&self) -> Result<()> {
        self.wait_all(true)
    }

    fn default_stream(&self) -> StreamId {
        StreamId(self.default_stream)
    }

    fn stream_create(&self) -> Result<StreamId> {
        self.bind()?;
        let raw = self.drv.stream_create()?;
        self.streams.insert_with(raw, CudaStream::new(raw));
        Ok(StreamId(raw))
    }

    fn stream_destroy(&self, stream: StreamId) -> Result<()> {
        checked::check_destroyable(StreamId(self.default_stream), stream)?;
        if self.stream(stream)?.is_capturing() {
            return Err(Error::Capturing(
                "stream_destroy on a capturing stream (end the capture first)".into(),
            ));
        }
        self.bind()?;
        let s = self.streams.remove(stream.0)?;
        // No device-wide synchronize on another thread is waiting on it once we hold this.
        let _gate = s.gate.exclusive(StreamId::KIND, s.raw)?;
        // Its queued work must still count for device synchronize: mark its end with an event
        // (or, if no event can be had, wait for it now).
        // Live and not capturing (checked above, and begin_capture needs the gate we hold).
        let end = self.end_marker(&s);
        match end {
            Ok(e) => {
                // Release the ends already reached, so the list stays as long as the work
                // still queued on destroyed streams, not as long as the program ran.
                let _ = self.release_retired_streams(false);
                self.retired_streams.lock().push(e);
            }
            // SAFETY: the stream is live (it came out of the stream table).
            Err(_) => unsafe { self.drv.stream_synchronize(s.raw) }
                .inspect_err(|_| self.streams.restore(stream.0, s.clone()))?,
        }
        // cuStreamDestroy returns at once; work already enqueued still completes. A failed
        // destroy leaves the stream alive: keep its handle so a retry or teardown releases it.
        // SAFETY: the stream came out of the stream table, which no longer lists it: live, and
        // destroyed once (on failure it goes back to the table, still live).
        match unsafe { self.drv.stream_destroy(s.raw) } {
            Ok(()) => {
                s.gate.mark_destroyed();
                let faults = s.take_faults();
                super::fault::note(&mut self.orphan_faults.lock(), faults.iter().cloned());
                Ok(())
            }
            Err(e) => {
                self.streams.restore(stream.0, s.clone());
                Err(e)
            }
        }
    }

    fn stream_synchronize(&self, stream: StreamId) -> Result<()> {
        let s = self.stream(stream)?;
        let _s_use = s.gate.enter(StreamId::KIND, s.raw)?;
        if s.is_capturing() {
            return Err(Error::Capturing(
                "stream_synchronize on a capturing stream".into(),
            ));
        }
        self.bind()?;
        // SAFETY: the stream is live: it came from the stream table or is the backend's default
        // stream.
        unsafe { self.drv.stream_synchronize(s.raw) }?;
        // Then its kernels' device faults (see `fault.rs`).
        self.check_faults(s.raw, &s.take_faults(), true)
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<()> {
        let (s, e) = (self.stream(stream)?, self.event(event)?);
        let _s_use = s.gate.enter(StreamId::KIND, s.raw)?;
        let _e_use = e.gate.enter(EventId::KIND, e.raw)?;
        if !s.is_capturing() {
            e.captured
                .refuse("stream_wait_event from a stream that is not capturing")?;
        }
        self.bind()?;
        // SAFETY: both handles came from their live-handle tables.
        unsafe { self.drv.stream_wait_event(s.raw, e.raw, s.is_capturing()) }?;
        // The graph's wait node names the event: instantiate and replay check it is alive.
        s.note_wait(&e);
        Ok(())
    }

    fn event_create(&self, flags: EventFlags) -> Result<EventId> {
        let flags = EventFlags::new(flags.0)?;
        self.bind()?;
        let raw = self.drv.event_create(cu_flags(flags))?;
        self.events.insert_with(raw, CudaEvent::new(raw, flags));
        Ok(EventId(raw))
    }

    fn event_record(&self, event: EventId, stream: StreamId) -> Result<()> {
        let (s, e) = (self.stream(stream)?, self.event(event)?);
        let _s_use = s.gate.enter(StreamId::KIND, s.raw)?;
        let _e_use = e.gate.enter(EventId::KIND, e.raw)?;
        self.bind()?;
        let capturing = s.is_capturing();
        // SAFETY: the event and the stream came from their live-handle tables.
        unsafe { self.drv.event_record(e.raw, s.raw, capturing) }?;
        // A record inside a capture happens at each replay (graph_launch marks it then).
        if !s.note_event(&e) {
            e.mark_recorded();
        }
        Ok(())
    }

    fn event_query(&self, event: EventId) -> Result<EventStatus> {
        let e = self.event(event)?;
        let _e_use = e.gate.enter(EventId::KIND, e.raw)?;
        e.captured.refuse("event_query")?;
        self.bind()?;
        // SAFETY: the event came from the live event table.
        Ok(if unsafe { self.drv.event_query(e.raw) }? {
            EventStatus::Complete
        } else {
            EventStatus::NotReady
        })
    }

    fn event_synchronize(&self, event: EventId) -> Result<()> {
        let e = self.event(event)?;
        let _e_use = e.gate.enter(EventId::KIND, e.raw)?;
        e.captured.refuse("event_synchronize")?;
        self.bind()?;
        // SAFETY: the event came from the live event table.
        unsafe { self.drv.event_synchronize(e.raw) }
    }

    fn event_elapsed_ms(&self, start: EventId, end: EventId) -> Result<f32> {
        let (a, b) = (self.event(start)?, self.event(end)?);
        let (_a_use, _b_use) = (
            a.gate.enter(EventId::KIND, a.raw)?,
            b.gate.enter(EventId::KIND, b.raw)?,
        );
        for e in [&a, &b] {
            e.captured.refuse("event_elapsed_ms")?;
            if !e.flags.timing() {
                return Err(Error::BadParam(format!(
                    "event {:#x} was created with DISABLE_TIMING",
                    e.raw
                )));
            }
            if !e.was_recorded() {
                return Err(Error::BadParam(format!(
                    "event {:#x} was never recorded",
                    e.raw
                )));
            }
        }
        self.bind()?;
        // A pending event is CUDA_ERROR_NOT_READY, which driver.rs maps to Error::NotReady.
        // SAFETY: both events came from the live event table.
        unsafe { self.drv.event_elapsed(a.raw, b.raw) }
    }

    fn event_destroy(&self, event: EventId) -> Result<()> {
        self.bind()?;
        let e = self.events.remove(event.0)?;
        // Waits for the calls using the event on other threads.
        let _excl = e.gate.exclusive(EventId::KIND, e.raw)?;
        // SAFETY: the event came out of the event table, which no longer lists it, and no call
        // is using it (gate held exclusively): destroyed once (on failure it goes back to the
        // table, still live).
        unsafe { self.drv.event_destroy(e.raw) }
            .map(|()| e.gate.mark_destroyed())
            .inspect_err(|_| self.events.restore(event.0, e.clone()))
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        self.check_size(bytes)?;
        self.bind()?;
        let p = self.drv.mem_alloc(bytes, &self.name)?;
        self.shared
            .mem
            // SAFETY: the allocation left the allocation table here (or was never admitted to
            // it), so it is live and freed once; the table has waited for the work that used it.
            .adopt(p, bytes as u64, AllocKind::Plain, |p| unsafe {
                self.drv.mem_free(p)
            })?;
        Ok(DevicePtr(p))
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        // Unregistered first (no new call passes its range check), then every call that passed
        // it has enqueued (the gate).
        let a = self.shared.mem.remove(ptr.0)?;
        drop(self.enqueue_gate.write());
        let released = match a.payload {
            // cuMemFree waits for the context's outstanding work itself (cudaFree's implicit
            // synchronisation): no device-wide wait of unirt's own comes first (it was one at
            // 17-30x cudaFree's cost on an H100), only for the ends of streams destroyed with
            // work queued (the list is empty in the common case).
            // SAFETY: the allocation left the allocation table here, so it is live and freed
            // once.
            AllocKind::Plain => self
                .release_retired_streams(true)
                .and_then(|()| unsafe { self.drv.mem_free(a.base) }),
            // Pool memory is released stream-ordered on the default stream, after every other
            // stream's queued work (as free_async does).
            AllocKind::Pool => self.sync_stream().and_then(|s| {
                self.join_other_streams(&s)?;
                // SAFETY: as above, and the stream is live (the backend's sync stream).
                unsafe { self.drv.mem_free_async(a.base, s.raw) }
            }),
        };
        // Memory the driver did not release stays live and tracked (a retry or the teardown
        // frees it), instead of being forgotten.
        if let Err(e) = released {
            let _ = self.shared.mem.insert(a.base, a.size, a.payload);
            return Err(e);
        }
        match a.payload {
            AllocKind::Plain => Ok(()),
            // SAFETY: the default stream lives as long as the backend.
            AllocKind::Pool => unsafe { self.drv.stream_synchronize(self.default_stream) },
        }
    }

    fn malloc_host(&self, bytes: usize) -> Result<HostPtr> {
        if bytes == 0 {
            return Ok(HostPtr::NULL);
        }
        if let Some(limit) = crate::hostmem::physical_memory().filter(|&l| bytes as u64 > l) {
            return Err(Error::TooLarge {
                device: format!("{} (page-locked host memory)", self.name),
                requested: bytes as u64,
                limit,
            });
        }
        self.bind()?;
        let p = self.drv.mem_alloc_host(bytes, &self.name)?;
        self.host_mem
            // SAFETY: the pinned allocation left the pinned table here (or was never admitted),
            // so it is freed once.
            .adopt(p, bytes as u64, (), |p| unsafe {
                self.drv.mem_free_host(p)
            })?;
        Ok(HostPtr(p))
    }

    fn free_host(&self, ptr: HostPtr) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        // Unregistered first (no new copy passes its check), then every copy that passed it
        // has enqueued (the gate), then all of that work has run (synchronize).
        let a = self.host_mem.retire(ptr.0, || Ok(()))?;
        drop(self.enqueue_gate.write());
        // A wait, not a synchronisation: kernels' device faults stay for the streams' next
        // synchronisation (a fault is no reason to keep the memory).
        if let Err(e) = self.wait_all(false) {
            let _ = self.host_mem.insert(a.base, a.size, ());
            return Err(e);
        }
        // SAFETY: the pinned allocation left the pinned table here (or was never admitted), so it
        // is freed once; on failure it goes back to the table.
        unsafe { self.drv.mem_free_host(a.base) }.inspect_err(|_| {
            let _ = self.host_mem.insert(a.base, a.size, ());
        })
    }

    fn malloc_async(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr> {
        let s = self.stream(stream)?;
        let _s_use = s.gate.enter(StreamId::KIND, s.raw)?;
        self.refuse_capturing(&s, "stream-ordered allocation")?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        self.check_size(bytes)?;
        self.bind()?;
        let (p, kind) = if self.pools {
            (
                // SAFETY: the stream came from the live stream table.
                unsafe { self.drv.mem_alloc_async(bytes, s.raw, &self.name) }?,
                AllocKind::Pool,
            )
        } else {
            // No memory pools: memory allocated now is usable by every later point of the
            // stream; waiting first keeps the stream's earlier frees ahead of this allocation.
            // SAFETY: the stream is live: it came from the stream table or is the backend's
            // default stream.
            unsafe { self.drv.stream_synchronize(s.raw) }?;
            (self.drv.mem_alloc(bytes, &self.name)?, AllocKind::Plain)
        };
        self.shared
            .mem
            .adopt(p, bytes as u64, kind, |p| match kind {
                // SAFETY: the allocation left the allocation table here, so it is freed once; the
                // stream is live.
                AllocKind::Pool => unsafe { self.drv.mem_free_async(p, s.raw) },
                // SAFETY: the allocation left the allocation table here (or was never admitted to
                // it), so it is live and freed once; the table has waited for the work that used
                // it.
                AllocKind::Plain => unsafe { self.drv.mem_free(p) },
            })?;
        Ok(DevicePtr(p))
    }

    fn free_async(&self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        let s = self.stream(stream)?;
        let _s_use = s.gate.enter(StreamId::KIND, s.raw)?;
        self.refuse_capturing(&s, "stream-ordered free")?;
        if ptr.is_null() {
            return Ok(());
        }
        self.bind()?;
        // Dead for new work at once; released when the stream gets here.
        let a = self.shared.mem.remove(ptr.0)?;
        // Calls that passed their range check before the remove finish enqueueing first.
        drop(self.enqueue_gate.write());
        let released = match a.payload {
            // The release waits for the work already queued on every other stream too (CUDA
            // orders it after this stream's work only): a free racing another stream's use
            // never becomes a use-after-free.
            AllocKind::Pool => self.join_other_streams(&s).and_then(|()| {
                // SAFETY: the allocation left the allocation table here, so it is freed once;
                // the stream is live.
                unsafe { self.drv.mem_free_async(a.base, s.raw) }
            }),
            AllocKind::Plain => {
                // Without a pool, "when the stream gets here" is after the stream drains.
                // SAFETY: the stream is live (from the stream table or the default stream); the
                // allocation left the table here, so it is freed once.
                unsafe { self.drv.stream_synchronize(s.raw) }
                    .and_then(|_| unsafe { self.drv.mem_free(a.base) })
            }
        };
        // Not released by the driver: still live and tracked (a retry or the teardown frees it).
        released.inspect_err(|_| {
            let _ = self.shared.mem.insert(a.base, a.size, a.payload);
        })
    }

    unsafe fn memcpy(&self, dst: u64, src: u64, bytes: usize, kind: MemcpyKind) -> Result<()> {
        let gate = self.enqueue_gate.read();
        let plan = self.check_copy(dst, src, bytes, kind)?;
        let s = self.sync_stream()?;
        self.bind()?;
        if bytes == 0 {
            // SAFETY: the stream is live: it came from the stream table or is the backend's
            // default stream.
            return unsafe { self.drv.stream_synchronize(s.raw) };
        }
        if kind == MemcpyKind::H2H {
            // SAFETY: the stream is live: it came from the stream table or is the backend's
            // default stream.
            unsafe { self.drv.stream_synchronize(s.raw) }?;
            // SAFETY: host ranges are the caller's contract (pinned ones were bounds-checked).
            unsafe { host_copy(dst, src, bytes) };
            return Ok(());
        }
        // SAFETY: the caller's contract for host ranges; device ranges checked in `plan`.
        unsafe { self.enqueue_copy(dst, src, bytes, kind, &plan, s.raw)? };
        drop(gate);
        // SAFETY: the stream is live: it came from the stream table or is the backend's default
        // stream.
        unsafe { self.drv.stream_synchronize(s.raw) }
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
        let _s_use = s.gate.enter(StreamId::KIND, s.raw)?;
        let _gate = self.enqueue_gate.read();
        let plan = self.check_copy(dst, src, bytes, kind)?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        self.note_copy(&s, dst, src, bytes as u64, &plan);
        // SAFETY: the caller's contract for host ranges; device ranges checked in `plan`.
        unsafe { self.enqueue_copy(dst, src, bytes, kind, &plan, s.raw) }
    }

    fn memset(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        let gate = self.enqueue_gate.read();
        self.check_device(dst.0, bytes as u64)?;
        let s = self.sync_stream()?;
        self.bind()?;
        if bytes > 0 {
            // SAFETY: the range was bounds-checked against the allocation table above and the
            // stream is live.
            unsafe { self.drv.memset_d8(dst.0, value, bytes, s.raw) }?;
        }
        drop(gate);
        // SAFETY: the stream is live: it came from the stream table or is the backend's default
        // stream.
        unsafe { self.drv.stream_synchronize(s.raw) }
    }

    fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: StreamId,
    ) -> Result<()> {
        let s = self.stream(stream)?;
        let _s_use = s.gate.enter(StreamId::KIND, s.raw)?;
        let _gate = self.enqueue_gate.read();
        self.check_device(dst.0, bytes as u64)?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        s.note_ranges(&self.shared, &[(dst.0, bytes as u64)]);
        // SAFETY: the range was bounds-checked against the allocation table above and the stream
        // is live.
        unsafe { self.drv.memset_d8(dst.0, value, bytes, s.raw) }
    }

    fn launch(&self, kernel: &str, args: &[KernelArg], stream: StreamId) -> Result<()> {
        let s = self.stream(stream)?;
        let _s_use = s.gate.enter(StreamId::KIND, s.raw)?;
        let _gate = self.enqueue_gate.read();
        let checked = check_launch(kernel, args, |p, len| self.check_device(p.0, len))?;
        self.bind()?;
        let f = self.function(kernel)?;
        if checked.n == 0 {
            return Ok(());
        }
        let values = args
            .iter()
            .map(|a| match *a {
                KernelArg::Ptr(p) => Ok(ArgValue::U64(p.0)),
                KernelArg::U32(v) => Ok(ArgValue::U32(v)),
                KernelArg::F32(v) => Ok(ArgValue::F32(v)),
                // check_launch admits only the built-in kernels' Ptr/U32/F32 parameters.
                other => Err(Error::BadParam(format!(
                    "kernel {kernel}: argument {other:?} has no CUDA encoding"
                ))),
            })
            .collect::<Result<Vec<ArgValue>>>()?;
        let grid = checked.n.div_ceil(BLOCK).clamp(1, MAX_GRID);
        let ranges: Vec<(u64, u64)> = checked.buffers.iter().map(|(p, l)| (p.0, *l)).collect();
        s.note_ranges(&self.shared, &ranges);
        // SAFETY: check_launch validated the arguments against the kernel's signature and every
        // pointer against the allocation table; the function's module stays loaded; the stream is
        // live.
        unsafe { self.drv.launch(f, grid, BLOCK, &values, s.raw) }
    }

    fn begin_capture(&self, stream: StreamId, mode: CaptureMode) -> Result<()> {
        self.start_capture(stream, mode)
    }

    fn end_capture(&self, stream: StreamId) -> Result<GraphId> {
        self.finish_capture(stream)
    }

    fn graph_instantiate(&self, graph: GraphId) -> Result<GraphExecId> {
        self.instantiate_graph(graph)
    }

    fn graph_launch(&self, exec: GraphExecId, stream: StreamId) -> Result<()> {
        self.launch_graph(exec, stream)
    }

    fn graph_destroy(&self, graph: GraphId) -> Result<()> {
        self.destroy_graph(graph)
    }

    fn graph_exec_destroy(&self, exec: GraphExecId) -> Result<()> {
        self.destroy_graph_exec(exec)
    }
}
