//! [`Memory`]: a shared, self-freeing handle to device, pinned-host or plain host memory.

use std::fmt;
use std::sync::Arc;

use crate::alloc::{CachingAllocator, PinnedHostPool};
use crate::device::Device;
use crate::hal::{Backend, DevicePtr, HostPtr, StreamId};
use crate::vendors::AnyBackend;

/// Where the memory came from, and so who takes it back.
enum Backing {
    Device(Arc<CachingAllocator>),
    /// Straight from the backend's `malloc`, freed with its `free` (which waits for the work
    /// that may still use it).
    Raw(Arc<AnyBackend>),
    Pinned(Arc<PinnedHostPool>),
    /// Plain (pageable) host memory from [`crate::hostmem::acquire_zeroed`], owned here.
    Host,
}

/// Plain host memory is aligned like `malloc`'s (16 bytes).
const HOST_ALIGN: u64 = 16;

struct Inner {
    device: Device,
    addr: u64,
    size: usize,
    backing: Backing,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Errors are dropped on purpose: a drop must not panic, and after a device failure
        // there is nobody to report to. The allocator never panics either.
        match &self.backing {
            Backing::Device(a) => {
                let _ = a.free(DevicePtr(self.addr));
            }
            Backing::Raw(b) => {
                let _ = b.free(DevicePtr(self.addr));
            }
            Backing::Pinned(p) => {
                let _ = p.free(HostPtr(self.addr));
            }
            Backing::Host => crate::hostmem::release(self.addr, self.size as u64, HOST_ALIGN),
        }
    }
}

/// A block of memory, freed (returned to its allocator) when the last clone drops.
///
/// Cloning is cheap (an `Arc`); the address stays valid while any clone lives.
///
/// ```
/// use unirt::{Device, Runtime};
/// let rt = Runtime::get(Device::CPU)?;
/// let m = rt.allocate_memory(1000)?;
/// assert_eq!(m.size(), 1000);
/// assert!(!m.is_pinned() && m.is_device());
/// let before = rt.allocator().stats().allocations.current;
/// drop(m.clone());
/// assert_eq!(rt.allocator().stats().allocations.current, before); // a clone still lives
/// drop(m);
/// assert_eq!(rt.allocator().stats().allocations.current, before - 1);
/// # Ok::<(), unirt::Error>(())
/// ```
#[derive(Clone)]
pub struct Memory(Arc<Inner>);

impl Memory {
    /// Device memory from a caching allocator.
    pub fn from_allocator(
        alloc: &Arc<CachingAllocator>,
        bytes: usize,
        stream: StreamId,
    ) -> crate::Result<Self> {
        let p = alloc.malloc(bytes, stream)?;
        Ok(Memory(Arc::new(Inner {
            device: alloc.device(),
            addr: p.0,
            size: bytes,
            backing: Backing::Device(alloc.clone()),
        })))
    }

    /// Device memory straight from an opened backend — no caching allocator, no `Runtime` —
    /// freed with [`Backend::free`] when the last handle drops. The RAII buffer of the HAL
    /// level: typed copies and launches on [`Stream`](crate::Stream) take it like any other.
    ///
    /// ```
    /// use unirt::{Device, Memory, Stream};
    /// let dev = unirt::open(Device::CPU)?;
    /// let m = Memory::allocate(&dev, 64)?;
    /// let s = Stream::new(&dev)?;
    /// s.copy_from_slice(&m, &[7u16; 32])?;
    /// assert_eq!(s.copy_to_vec::<u16>(&m, 32)?, vec![7; 32]);
    /// # Ok::<(), unirt::Error>(())
    /// ```
    pub fn allocate(backend: &Arc<AnyBackend>, bytes: usize) -> crate::Result<Self> {
        let p = backend.malloc(bytes)?;
        Ok(Memory(Arc::new(Inner {
            device: Device::new(backend.kind(), backend.info().index),
            addr: p.0,
            size: bytes,
            backing: Backing::Raw(backend.clone()),
        })))
    }

    /// Pinned host memory from a pinned pool of `device`.
    pub fn from_pinned_pool(
        pool: &Arc<PinnedHostPool>,
        device: Device,
        bytes: usize,
    ) -> crate::Result<Self> {
        let p = pool.malloc(bytes)?;
        Ok(Memory(Arc::new(Inner {
            device,
            addr: p.0,
            size: bytes,
            backing: Backing::Pinned(pool.clone()),
        })))
    }

    /// Plain host memory, zeroed, 16-byte aligned, on the host device (`cpu:0`); zero bytes
    /// is a null address. A size the host cannot give is [`Error::OutOfMemory`], never an
    /// abort.
    ///
    /// [`Error::OutOfMemory`]: crate::Error::OutOfMemory
    pub fn host(bytes: usize) -> crate::Result<Self> {
        let addr = if bytes == 0 {
            0
        } else {
            crate::hostmem::acquire_zeroed(
                bytes as u64,
                HOST_ALIGN,
                crate::DeviceKind::Cpu,
                "host",
            )?
        };
        Ok(Memory(Arc::new(Inner {
            device: Device::CPU,
            addr,
            size: bytes,
            backing: Backing::Host,
        })))
    }

    /// The address: a device address for device memory, a host address otherwise.
    pub fn addr(&self) -> u64 {
        self.0.addr
    }

    /// The address as a device pointer (meaningful for device memory).
    pub fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.0.addr)
    }

    /// The address as a host pointer (meaningful for host and pinned memory).
    pub fn host_ptr(&self) -> *mut u8 {
        self.0.addr as usize as *mut u8
    }

    /// The size the caller asked for.
    pub fn size(&self) -> usize {
        self.0.size
    }

    /// The device the memory belongs to (`cpu:0` for plain host memory).
    pub fn device(&self) -> Device {
        self.0.device
    }

    /// True for pinned host memory.
    pub fn is_pinned(&self) -> bool {
        matches!(self.0.backing, Backing::Pinned(_))
    }

    /// True for device memory.
    pub fn is_device(&self) -> bool {
        matches!(self.0.backing, Backing::Device(_) | Backing::Raw(_))
    }

    /// Marks the memory as used by work on `stream`, so its reuse after the last drop waits
    /// for that work. A no-op for plain host memory.
    pub fn record_stream(&self, stream: StreamId) -> crate::Result<()> {
        match &self.0.backing {
            Backing::Device(a) => a.record_stream(DevicePtr(self.0.addr), stream),
            // The backend's free waits for every stream's work on the memory.
            Backing::Raw(_) => Ok(()),
            Backing::Pinned(p) => {
                p.record_stream(self.0.addr, stream);
                Ok(())
            }
            Backing::Host => Ok(()),
        }
    }

    /// How many handles share this memory.
    pub fn handle_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.0.backing {
            Backing::Device(_) | Backing::Raw(_) => "device",
            Backing::Pinned(_) => "pinned host",
            Backing::Host => "host",
        };
        write!(
            f,
            "Memory({kind}, {}, {:#x}, {} B)",
            self.0.device, self.0.addr, self.0.size
        )
    }
}
