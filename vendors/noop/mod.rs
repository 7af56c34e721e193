//! The smallest backend that compiles: the template of `docs/ADDING_A_VENDOR.md`.
//!
//! [`NoopBackend`] implements every [`Backend`] method the way a vendor that cannot do the
//! operation must: [`Error::Unsupported`] for an operation it lacks, [`Error::InvalidHandle`]
//! for a handle it never handed out, no-ops where the HAL's contract makes them no-ops (null
//! frees, zero-byte copies, waits on a default stream that never has work). Copy it to
//! `vendors/<name>/`, then replace one group of methods at a time with real work; the
//! conformance suite says which behaviours are still missing.
//!
//! It is deliberately **not** in [`VENDORS`](super::VENDORS): it has no devices, and a row
//! for it would add a vendor to every discovery report. It borrows [`DeviceKind::Cpu`] as its
//! kind only so that it compiles unregistered; a real vendor adds its own variant.

use crate::device::{Capabilities, DeviceClass, DeviceInfo, DeviceKind, EventTiming, MemInfo};
use crate::error::{Error, Result};
use crate::hal::*;

/// The kind the template reports. A new vendor adds a [`DeviceKind`] variant and uses it here.
const KIND: DeviceKind = DeviceKind::Cpu;

/// The handle of the one stream the template has: its default stream, which never has work.
const DEFAULT_STREAM: StreamId = StreamId(1);

/// A device that can do nothing, correctly.
#[derive(Debug)]
pub struct NoopBackend {
    info: DeviceInfo,
}

impl NoopBackend {
    /// "Opens" device `index`. A real vendor opens its driver here and fails with
    /// [`Error::DeviceNotInitialized`] or [`Error::Driver`] when it cannot.
    pub fn open(index: usize) -> Result<Self> {
        Ok(NoopBackend {
            info: DeviceInfo {
                index,
                name: "noop".into(),
                vendor: "unirt".into(),
                driver: "none".into(),
                api: "none".into(),
                class: DeviceClass::Unknown,
                memory_total: 0,
                max_allocation: 0,
                details: Vec::new(),
                capabilities: Capabilities {
                    async_streams: false,
                    capture: false,
                    stream_ordered_memory: false,
                    pinned_host_memory: false,
                    unified_addressing: false,
                    event_timing: EventTiming::Host,
                },
            },
        })
    }

    fn unsupported<T>(&self, what: &str) -> Result<T> {
        Err(Error::unsupported(what, KIND))
    }

    /// Only the default stream exists.
    fn check_stream(&self, stream: StreamId) -> Result<()> {
        if stream == DEFAULT_STREAM {
            Ok(())
        } else {
            Err(stream.invalid())
        }
    }
}

/// A real vendor's `probe()`: cheap, never panics, says why when there are no devices.
pub fn probe() -> Probe {
    Probe::Unavailable("the noop template has no devices".into())
}

impl Backend for NoopBackend {
    fn kind(&self) -> DeviceKind {
        KIND
    }

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_info(&self) -> Result<MemInfo> {
        Ok(MemInfo { free: 0, total: 0 })
    }

    fn synchronize(&self) -> Result<()> {
        Ok(()) // nothing is ever queued
    }

    fn default_stream(&self) -> StreamId {
        DEFAULT_STREAM
    }

    fn stream_create(&self) -> Result<StreamId> {
        self.unsupported("stream_create")
    }

    fn stream_destroy(&self, stream: StreamId) -> Result<()> {
        self.check_stream(stream)?;
        Err(Error::BadParam(
            "the default stream cannot be destroyed".into(),
        ))
    }

    fn stream_synchronize(&self, stream: StreamId) -> Result<()> {
        self.check_stream(stream)
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<()> {
        self.check_stream(stream)?;
        Err(event.invalid()) // no event was ever created
    }

    fn event_create(&self, _flags: EventFlags) -> Result<EventId> {
        self.unsupported("event_create")
    }

    fn event_record(&self, event: EventId, stream: StreamId) -> Result<()> {
        self.check_stream(stream)?;
        Err(event.invalid())
    }

    fn event_query(&self, event: EventId) -> Result<EventStatus> {
        Err(event.invalid())
    }

    fn event_synchronize(&self, event: EventId) -> Result<()> {
        Err(event.invalid())
    }

    fn event_elapsed_ms(&self, start: EventId, _end: EventId) -> Result<f32> {
        Err(start.invalid())
    }

    fn event_destroy(&self, event: EventId) -> Result<()> {
        Err(event.invalid())
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        self.unsupported("malloc")
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        Err(Error::invalid("device pointer", ptr.0))
    }

    fn malloc_host(&self, bytes: usize) -> Result<HostPtr> {
        if bytes == 0 {
            return Ok(HostPtr::NULL);
        }
        self.unsupported("malloc_host")
    }

    fn free_host(&self, ptr: HostPtr) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        Err(Error::invalid("host pointer", ptr.0))
    }

    fn malloc_async(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr> {
        self.check_stream(stream)?;
        self.malloc(bytes)
    }

    fn free_async(&self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        self.check_stream(stream)?;
        self.free(ptr)
    }

    unsafe fn memcpy(&self, dst: u64, src: u64, bytes: usize, kind: MemcpyKind) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // No device allocation exists, so any device-side range is out of bounds; a host-to-host
        // copy is the one this template could do, and it leaves it to the CPU backend.
        let (addr, on_device) = if kind.dst_on_device() {
            (dst, true)
        } else {
            (src, kind.src_on_device())
        };
        if on_device {
            return Err(Error::OutOfBounds {
                addr,
                len: bytes as u64,
                detail: "the noop backend has no allocations".into(),
            });
        }
        self.unsupported("host-to-host memcpy")
    }

    unsafe fn memcpy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        kind: MemcpyKind,
        stream: StreamId,
    ) -> Result<()> {
        self.check_stream(stream)?;
        // SAFETY: the caller's promise for memcpy_async covers memcpy's.
        unsafe { self.memcpy(dst, src, bytes, kind) }
    }

    fn memset(&self, dst: DevicePtr, _value: u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        Err(Error::OutOfBounds {
            addr: dst.0,
            len: bytes as u64,
            detail: "the noop backend has no allocations".into(),
        })
    }

    fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: StreamId,
    ) -> Result<()> {
        self.check_stream(stream)?;
        self.memset(dst, value, bytes)
    }

    fn launch(&self, kernel: &str, _args: &[KernelArg], stream: StreamId) -> Result<()> {
        self.check_stream(stream)?;
        self.unsupported(&format!("kernel {kernel:?}"))
    }

    fn begin_capture(&self, stream: StreamId, _mode: CaptureMode) -> Result<()> {
        self.check_stream(stream)?;
        self.unsupported("stream capture")
    }

    fn end_capture(&self, stream: StreamId) -> Result<GraphId> {
        self.check_stream(stream)?;
        Err(Error::NotCapturing)
    }

    fn graph_instantiate(&self, graph: GraphId) -> Result<GraphExecId> {
        Err(graph.invalid())
    }

    fn graph_launch(&self, exec: GraphExecId, stream: StreamId) -> Result<()> {
        self.check_stream(stream)?;
        Err(exec.invalid())
    }

    fn graph_destroy(&self, graph: GraphId) -> Result<()> {
        Err(graph.invalid())
    }

    fn graph_exec_destroy(&self, exec: GraphExecId) -> Result<()> {
        Err(exec.invalid())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_of<T>(r: Result<T>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(e) => e.kind_name(),
        }
    }

    #[test]
    fn every_method_answers_with_the_documented_error() {
        let b = NoopBackend::open(0).unwrap();
        let s = b.default_stream();
        let bad_s = StreamId(99);
        let e = EventId(5);
        assert!(matches!(probe(), Probe::Unavailable(_)));
        assert_eq!(kind_of(b.synchronize()), "ok");
        assert_eq!(kind_of(b.stream_create()), "unsupported");
        assert_eq!(kind_of(b.stream_destroy(s)), "bad_param");
        assert_eq!(kind_of(b.stream_destroy(bad_s)), "invalid_handle");
        assert_eq!(kind_of(b.stream_synchronize(s)), "ok");
        assert_eq!(kind_of(b.stream_synchronize(bad_s)), "invalid_handle");
        assert_eq!(kind_of(b.stream_wait_event(s, e)), "invalid_handle");
        assert_eq!(kind_of(b.event_create(EventFlags::DEFAULT)), "unsupported");
        assert_eq!(kind_of(b.event_record(e, s)), "invalid_handle");
        assert_eq!(kind_of(b.event_query(e)), "invalid_handle");
        assert_eq!(kind_of(b.event_synchronize(e)), "invalid_handle");
        assert_eq!(kind_of(b.event_elapsed_ms(e, e)), "invalid_handle");
        assert_eq!(kind_of(b.event_destroy(e)), "invalid_handle");
        assert_eq!(b.malloc(0).unwrap(), DevicePtr::NULL);
        assert_eq!(kind_of(b.malloc(16)), "unsupported");
        assert_eq!(kind_of(b.free(DevicePtr::NULL)), "ok");
        assert_eq!(kind_of(b.free(DevicePtr(0x1000))), "invalid_handle");
        assert_eq!(kind_of(b.malloc_host(16)), "unsupported");
        assert_eq!(kind_of(b.free_host(HostPtr(0x1000))), "invalid_handle");
        assert_eq!(kind_of(b.malloc_async(16, bad_s)), "invalid_handle");
        assert_eq!(
            kind_of(b.free_async(DevicePtr(0x1000), s)),
            "invalid_handle"
        );
        // SAFETY: no host memory is touched: every call fails before reading or writing.
        unsafe {
            assert_eq!(kind_of(b.memcpy(8, 16, 0, MemcpyKind::D2D)), "ok");
            assert_eq!(
                kind_of(b.memcpy(8, 16, 4, MemcpyKind::D2D)),
                "out_of_bounds"
            );
            assert_eq!(kind_of(b.memcpy(8, 16, 4, MemcpyKind::H2H)), "unsupported");
            let r = b.memcpy_async(8, 16, 4, MemcpyKind::D2H, bad_s);
            assert_eq!(kind_of(r), "invalid_handle");
        }
        assert_eq!(kind_of(b.memset(DevicePtr(8), 0, 4)), "out_of_bounds");
        assert_eq!(kind_of(b.memset_async(DevicePtr(8), 0, 0, s)), "ok");
        assert_eq!(kind_of(b.launch("fill", &[], s)), "unsupported");
        assert_eq!(
            kind_of(b.begin_capture(s, CaptureMode::Global)),
            "unsupported"
        );
        assert_eq!(kind_of(b.end_capture(s)), "not_capturing");
        assert_eq!(kind_of(b.graph_instantiate(GraphId(3))), "invalid_handle");
        assert_eq!(kind_of(b.graph_launch(GraphExecId(3), s)), "invalid_handle");
        assert_eq!(kind_of(b.graph_destroy(GraphId(3))), "invalid_handle");
        assert_eq!(
            kind_of(b.graph_exec_destroy(GraphExecId(3))),
            "invalid_handle"
        );
        match b.malloc(1) {
            Err(Error::Unsupported { backend, .. }) => assert_eq!(backend, KIND),
            other => panic!("{other:?}"),
        }
    }
}
