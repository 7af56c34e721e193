//! RAII handles over the HAL's raw ids — [`Stream`] and [`Event`] — with safe, typed copies
//! on streams ([`Stream::copy_from_slice`], [`Stream::copy_to_vec`], [`Stream::copy_device`])
//! and on any backend ([`BackendExt`]), and futures for completion
//! ([`Event::completion`], [`Stream::completion`]).
//!
//! The raw HAL copy, [`Backend::memcpy`], is `unsafe` because it takes host addresses it
//! cannot check. Nothing here is: host memory comes in as Rust slices, is borrowed only while
//! the copy runs, and is viewed as bytes through `bytemuck` (so `T` must be
//! [`bytemuck::Pod`]); device memory comes in as a [`DeviceRange`] — a [`Memory`] (whose
//! size bounds the copy) or a raw [`DevicePtr`] (bounded by the backend's allocation table).

use std::sync::Arc;

use bytemuck::Pod;

use crate::completion::{Completion, EventInner};
use crate::error::{Error, Result};
use crate::hal::*;
use crate::memory::Memory;
use crate::vendors::AnyBackend;

/// Device memory a safe copy can read or write: a [`Memory`] of the stream's device, or a raw
/// [`DevicePtr`] (e.g. from [`Backend::malloc`]).
pub trait DeviceRange {
    /// Where the range starts on the device.
    fn device_ptr(&self) -> DevicePtr;
    /// How many bytes from the start belong to the caller, when the handle knows (a
    /// [`Memory`]'s size; the allocator's block behind it may be larger). `None` leaves the
    /// bound to the backend's allocation table.
    fn byte_len(&self) -> Option<usize> {
        None
    }
    /// Called before work on `stream` uses the memory: a [`Memory`] tells its allocator, so
    /// the block is not reused before that work has run.
    fn used_on(&self, _stream: StreamId) -> Result<()> {
        Ok(())
    }
}

impl DeviceRange for DevicePtr {
    fn device_ptr(&self) -> DevicePtr {
        *self
    }
}

impl DeviceRange for Memory {
    fn device_ptr(&self) -> DevicePtr {
        Memory::device_ptr(self)
    }
    fn byte_len(&self) -> Option<usize> {
        Some(self.size())
    }
    fn used_on(&self, stream: StreamId) -> Result<()> {
        if !self.is_device() {
            return Err(Error::BadParam(format!(
                "{self:?} is not device memory; copy host memory through a slice"
            )));
        }
        self.record_stream(stream)
    }
}

impl<R: DeviceRange + ?Sized> DeviceRange for &R {
    fn device_ptr(&self) -> DevicePtr {
        (**self).device_ptr()
    }
    fn byte_len(&self) -> Option<usize> {
        (**self).byte_len()
    }
    fn used_on(&self, stream: StreamId) -> Result<()> {
        (**self).used_on(stream)
    }
}

/// Refuses `bytes` bytes on `range` when the handle knows it is shorter.
fn check_len(range: &impl DeviceRange, bytes: usize, what: &str) -> Result<()> {
    match range.byte_len() {
        Some(len) if bytes > len => Err(Error::OutOfBounds {
            addr: range.device_ptr().0,
            len: bytes as u64,
            detail: format!("{what}: the memory holds {len} bytes"),
        }),
        _ => Ok(()),
    }
}

/// A stream that is destroyed when dropped (unless it is the device's default stream or a
/// borrowed handle of a thread's stream).
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
///
/// Typed copies and launches on context memory, with no `unsafe` and no byte conversions:
///
/// ```
/// use unirt::{context, KernelArg};
/// let m = context::allocate_memory(4 * 1000)?;
/// let s = context::current_stream()?;
/// s.copy_from_slice(&m, &vec![1.5f32; 1000])?;
/// s.launch("add_f32", &[(&m).into(), (&m).into(), (&m).into(), KernelArg::U32(1000)])?;
/// let back: Vec<f32> = s.copy_to_vec(&m, 1000)?;
/// assert!(back.iter().all(|&x| x == 3.0));
/// # Ok::<(), unirt::Error>(())
/// ```
pub struct Stream {
    backend: Arc<AnyBackend>,
    id: StreamId,
    owned: bool,
}

impl Stream {
    /// A new stream on `backend`, destroyed when dropped.
    pub fn new(backend: &Arc<AnyBackend>) -> Result<Self> {
        Ok(Stream {
            id: backend.stream_create()?,
            backend: backend.clone(),
            owned: true,
        })
    }

    /// The device's default stream (not destroyed on drop).
    pub fn default_of(backend: &Arc<AnyBackend>) -> Self {
        Self::borrowed(backend, backend.default_stream())
    }

    /// A handle of a stream owned elsewhere (not destroyed on drop). Once the owner destroys
    /// it, calls through this handle fail with `InvalidHandle`.
    pub(crate) fn borrowed(backend: &Arc<AnyBackend>, id: StreamId) -> Self {
        Stream {
            id,
            backend: backend.clone(),
            owned: false,
        }
    }

    /// The HAL handle.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// The device the stream belongs to.
    pub fn backend(&self) -> &Arc<AnyBackend> {
        &self.backend
    }

    /// Waits until everything enqueued so far has run.
    pub fn synchronize(&self) -> Result<()> {
        self.backend.stream_synchronize(self.id)
    }

    /// A future that resolves once everything enqueued on the stream before this call has
    /// run (it records a private event now). See [`Completion`].
    pub fn completion(&self) -> Result<Completion> {
        let e = Event::with_flags(&self.backend, EventFlags::DISABLE_TIMING)?;
        e.record(self)?;
        Ok(e.completion())
    }

    /// Makes later work on this stream wait for `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.backend.stream_wait_event(self.id, event.id())
    }

    /// Enqueues a memset of `bytes` bytes at the start of `dst`.
    pub fn memset(&self, dst: impl DeviceRange, value: u8, bytes: usize) -> Result<()> {
        check_len(&dst, bytes, "memset")?;
        dst.used_on(self.id)?;
        self.backend
            .memset_async(dst.device_ptr(), value, bytes, self.id)
    }

    /// Enqueues a kernel (see [`crate::kernel::KERNELS`]). A [`Memory`] argument is passed as
    /// `(&memory).into()`.
    pub fn launch(&self, kernel: &str, args: &[KernelArg]) -> Result<()> {
        self.backend.launch(kernel, args, self.id)
    }

    /// Copies `src` to the start of `dst` after the work already enqueued on this stream, and
    /// returns when the data has arrived (the slice is only borrowed for the call). Refused
    /// while the stream is capturing: a capture cannot keep a borrowed slice alive.
    pub fn copy_from_slice<T: Pod>(&self, dst: impl DeviceRange, src: &[T]) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(src);
        check_len(&dst, bytes.len(), "copy_from_slice")?;
        dst.used_on(self.id)?;
        // Wait for the stream's earlier work, then copy synchronously: when this returns, the
        // copy has finished or failed, whatever happens to the stream meanwhile — so the
        // borrow of `src` can end.
        self.synchronize()?;
        self.backend.copy_to_device(dst.device_ptr(), bytes)
    }

    /// Reads `len` values of `T` from the start of `src` after the work already enqueued on
    /// this stream.
    pub fn copy_to_vec<T: Pod>(&self, src: impl DeviceRange, len: usize) -> Result<Vec<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::BadParam(format!("{len} elements overflow usize bytes")))?;
        check_len(&src, bytes, "copy_to_vec")?;
        src.used_on(self.id)?;
        let mut out: Vec<T> = vec![T::zeroed(); len];
        self.synchronize()?;
        self.backend
            .copy_to_host(bytemuck::cast_slice_mut(&mut out), src.device_ptr())?;
        Ok(out)
    }

    /// Enqueues a copy of `bytes` bytes between device memory of this stream's device. No host
    /// memory is involved, so it is asynchronous and safe; both ranges are bounds-checked.
    pub fn copy_device(
        &self,
        dst: impl DeviceRange,
        src: impl DeviceRange,
        bytes: usize,
    ) -> Result<()> {
        check_len(&dst, bytes, "copy_device destination")?;
        check_len(&src, bytes, "copy_device source")?;
        dst.used_on(self.id)?;
        src.used_on(self.id)?;
        // SAFETY: both addresses are device addresses, which the backend bounds-checks against
        // its allocation table; no host memory is read or written.
        unsafe {
            self.backend.memcpy_async(
                dst.device_ptr().0,
                src.device_ptr().0,
                bytes,
                MemcpyKind::D2D,
                self.id,
            )
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.owned {
            // The allocators' segments cached for it pass to the living streams.
            crate::alloc::retire_stream(&self.backend, self.id);
        }
        if self.owned && self.backend.stream_destroy(self.id).is_err() {
            // Dropped mid-capture (an early return, an unwinding panic): end the capture and
            // discard its graph, then destroy the stream. A capture left open would keep the
            // stream alive and, on CUDA in global mode, refuse every synchronising call of the
            // process from then on.
            if let Ok(g) = self.backend.end_capture(self.id) {
                let _ = self.backend.graph_destroy(g);
            }
            let _ = self.backend.stream_destroy(self.id);
        }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({:?}, {:#x})", self.backend.kind(), self.id.0)
    }
}

/// An event that is destroyed when dropped.
pub struct Event(Arc<EventInner>);

impl Event {
    /// A timing event.
    pub fn new(backend: &Arc<AnyBackend>) -> Result<Self> {
        Self::with_flags(backend, EventFlags::DEFAULT)
    }

    /// An event with explicit flags.
    pub fn with_flags(backend: &Arc<AnyBackend>, flags: EventFlags) -> Result<Self> {
        Ok(Event(Arc::new(EventInner {
            id: backend.event_create(flags)?,
            backend: backend.clone(),
        })))
    }

    /// The HAL handle.
    pub fn id(&self) -> EventId {
        self.0.id
    }

    /// Captures the work enqueued on `stream` so far.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.0.backend.event_record(self.0.id, stream.id)
    }

    /// Whether the recorded work has completed.
    pub fn query(&self) -> Result<EventStatus> {
        self.0.backend.event_query(self.0.id)
    }

    /// Blocks until the recorded work has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.0.backend.event_synchronize(self.0.id)
    }

    /// Milliseconds from `self` to `end`.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.0.backend.event_elapsed_ms(self.0.id, end.0.id)
    }

    /// A future that resolves when the work recorded so far has completed — the async form
    /// of [`synchronize`](Self::synchronize). See [`Completion`].
    ///
    /// ```
    /// use unirt::{Device, Event, Stream};
    /// let dev = unirt::open(Device::CPU)?;
    /// let s = Stream::new(&dev)?;
    /// let e = Event::new(&dev)?;
    /// e.record(&s)?;
    /// pollster::block_on(e.completion())?;    // any executor
    /// assert_eq!(e.query()?, unirt::EventStatus::Complete);
    /// # Ok::<(), unirt::Error>(())
    /// ```
    pub fn completion(&self) -> Completion {
        Completion::of_event(self.0.clone())
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({:?}, {:#x})", self.0.backend.kind(), self.0.id.0)
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
            backend: crate::device::DeviceKind::Cpu,
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

    /// Copies typed values to device memory at `dst` (the typed form of
    /// [`copy_to_device`](Self::copy_to_device)).
    fn write_slice<T: Pod>(&self, dst: DevicePtr, src: &[T]) -> Result<()> {
        self.copy_to_device(dst, bytemuck::cast_slice(src))
    }

    /// Reads `len` values of `T` from device memory at `src`.
    fn read_to_vec<T: Pod>(&self, src: DevicePtr, len: usize) -> Result<Vec<T>> {
        let mut out: Vec<T> = vec![T::zeroed(); len];
        self.copy_to_host(bytemuck::cast_slice_mut(&mut out), src)?;
        Ok(out)
    }
}

impl<B: Backend + ?Sized> BackendExt for B {}
