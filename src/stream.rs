//! RAII handles over the HAL's raw ids: [`Stream`] and [`Event`], and safe copies
//! ([`BackendExt`]).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::hal::*;

/// A stream that is destroyed when dropped (unless it is the device's default stream).
///
/// ```
/// use unirt::{Device, Stream, Event};
/// let dev = unirt::open(Device::CPU).unwrap();
/// let s = Stream::new(&dev).unwrap();
/// let (a, b) = (Event::new(&dev).unwrap(), Event::new(&dev).unwrap());
/// a.record(&s).unwrap();
/// b.record(&s).unwrap();
/// b.synchronize().unwrap();
/// assert!(a.elapsed_ms(&b).unwrap() >= 0.0);
/// ```
pub struct Stream {
    backend: Arc<AnyBackend>,
    id: StreamId,
    owned: bool,
}

impl Stream {
    pub fn new(backend: &Arc<AnyBackend>) -> Result<Self> {
        Ok(Stream {
            id: backend.stream_create()?,
            backend: backend.clone(),
            owned: true,
        })
    }

    /// The device's default stream (not destroyed on drop).
    pub fn default_of(backend: &Arc<AnyBackend>) -> Self {
        Stream {
            id: backend.default_stream(),
            backend: backend.clone(),
            owned: false,
        }
    }

    pub fn id(&self) -> StreamId {
        self.id
    }

    pub fn backend(&self) -> &Arc<AnyBackend> {
        &self.backend
    }

    pub fn synchronize(&self) -> Result<()> {
        self.backend.stream_synchronize(self.id)
    }

    /// Makes later work on this stream wait for `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.backend.stream_wait_event(self.id, event.id)
    }

    pub fn memset(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        self.backend.memset_async(dst, value, bytes, self.id)
    }

    pub fn launch(&self, kernel: &str, args: &[KernelArg]) -> Result<()> {
        self.backend.launch(kernel, args, self.id)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.owned {
            let _ = self.backend.stream_destroy(self.id);
        }
    }
}

/// An event that is destroyed when dropped.
pub struct Event {
    backend: Arc<AnyBackend>,
    id: EventId,
}

impl Event {
    /// A timing event.
    pub fn new(backend: &Arc<AnyBackend>) -> Result<Self> {
        Self::with_flags(backend, EventFlags::DEFAULT)
    }

    pub fn with_flags(backend: &Arc<AnyBackend>, flags: EventFlags) -> Result<Self> {
        Ok(Event {
            id: backend.event_create(flags)?,
            backend: backend.clone(),
        })
    }

    pub fn id(&self) -> EventId {
        self.id
    }

    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.backend.event_record(self.id, stream.id)
    }

    pub fn query(&self) -> Result<EventStatus> {
        self.backend.event_query(self.id)
    }

    pub fn synchronize(&self) -> Result<()> {
        self.backend.event_synchronize(self.id)
    }

    /// Milliseconds from `self` to `end`.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.backend.event_elapsed_ms(self.id, end.id)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.backend.event_destroy(self.id);
    }
}

/// Safe, synchronous copies between host slices and device memory, for every backend.
pub trait BackendExt: Backend {
    /// Copies `src` to device memory at `dst`.
    fn copy_to_device(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        if dst.is_null() && !src.is_empty() {
            return Err(Error::NullPointer("destination".into()));
        }
        // SAFETY: the host range is a live slice for the whole (synchronous) call.
        unsafe {
            self.memcpy(
                dst.0,
                src.as_ptr() as usize as u64,
                src.len(),
                MemcpyKind::H2D,
            )
        }
    }

    /// Copies device memory at `src` into `dst`.
    fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        // SAFETY: the host range is a live, exclusively borrowed slice for the whole call.
        unsafe {
            self.memcpy(
                dst.as_mut_ptr() as usize as u64,
                src.0,
                dst.len(),
                MemcpyKind::D2H,
            )
        }
    }

    /// Copies `bytes` bytes between device addresses.
    fn copy_device(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: both ranges are device ranges, which the backend bounds-checks.
        unsafe { self.memcpy(dst.0, src.0, bytes, MemcpyKind::D2D) }
    }

    /// Reads `bytes` bytes of device memory into a new vector. A size the host cannot hold is
    /// [`Error::OutOfMemory`], never an abort; the vector's pages are only touched by the copy,
    /// so a huge read of a small allocation fails on its bounds without committing memory.
    fn read_vec(&self, src: DevicePtr, bytes: usize) -> Result<Vec<u8>> {
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(bytes).map_err(|e| Error::OutOfMemory {
            device: "host".into(),
            requested: bytes as u64,
            detail: format!("no host buffer for the read ({e})"),
        })?;
        // SAFETY: the vector's spare capacity is `bytes` writable bytes, owned here for the
        // whole synchronous copy; the length is set only once the copy has written all of them.
        unsafe {
            self.memcpy(
                v.as_mut_ptr() as usize as u64,
                src.0,
                bytes,
                MemcpyKind::D2H,
            )?;
            v.set_len(bytes);
        }
        Ok(v)
    }
}

impl<B: Backend + ?Sized> BackendExt for B {}
