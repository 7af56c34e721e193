//! Aligned host allocations with typed errors: the memory of the CPU backend's devices and the
//! "pinned" host memory of backends that have no page-locking of their own (CPU, wgpu).

use std::alloc::Layout;

use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::hal::HostPtr;
use crate::memtable::AllocTable;

/// Host allocations that stand in for pinned memory are page-aligned.
pub const PAGE_ALIGN: u64 = 4096;

/// Allocates `size` (> 0) bytes aligned to `align`. Never panics: an impossible layout or a
/// refused allocation is `OutOfMemory`.
pub fn acquire(size: u64, align: u64, backend: DeviceKind, device: &str) -> Result<u64> {
    acquire_with(size, align, backend, device, false)
}

/// As [`acquire`], zero-filled (fresh pages from the system cost nothing to zero).
pub fn acquire_zeroed(size: u64, align: u64, backend: DeviceKind, device: &str) -> Result<u64> {
    acquire_with(size, align, backend, device, true)
}

fn acquire_with(
    size: u64,
    align: u64,
    backend: DeviceKind,
    device: &str,
    zeroed: bool,
) -> Result<u64> {
    let oom = |detail: &str| Error::OutOfMemory {
        backend,
        device: device.to_string(),
        requested: size,
        detail: detail.to_string(),
    };
    // More than the host can back is refused here, whether or not the kernel overcommits
    // (where it does, the allocation would "succeed" and fail later, on first touch, by
    // killing the process): see `meminfo`.
    crate::meminfo::check_backable(size).map_err(|why| oom(&why))?;
    let size_usize = usize::try_from(size).map_err(|_| oom("larger than the address space"))?;
    let layout = Layout::from_size_align(size_usize, align as usize)
        .map_err(|_| oom("larger than the address space"))?;
    // SAFETY: layout has a non-zero size (callers map zero to NULL before calling).
    let p = unsafe {
        if zeroed {
            std::alloc::alloc_zeroed(layout)
        } else {
            std::alloc::alloc(layout)
        }
    };
    if p.is_null() {
        return Err(oom("the host allocator refused"));
    }
    advise_huge_pages(p as usize, size_usize);
    // Until its pages are touched, no reading of the host's memory shows this allocation.
    crate::meminfo::note_granted(size);
    Ok(p as usize as u64)
}

/// Bytes of a transparent huge page (x86-64 and aarch64 with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// Asks Linux to back the whole 2 MiB pages inside a large allocation with transparent huge
/// pages (where the system leaves that to `madvise`, its default): streaming kernels over
/// tensors of many MiB then take one page fault per 2 MiB instead of 512 and far fewer TLB
/// misses. Advice only: a refusal, or a system without THP, changes nothing.
fn advise_huge_pages(addr: usize, size: usize) {
    #[cfg(target_os = "linux")]
    {
        if size < 2 * HUGE_PAGE {
            return;
        }
        let start = addr.next_multiple_of(HUGE_PAGE);
        let end = (addr + size) / HUGE_PAGE * HUGE_PAGE;
        if end > start {
            // SAFETY: [start, end) lies inside the allocation just made; MADV_HUGEPAGE only
            // changes how the kernel backs those pages, never their contents or validity.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (addr, size, HUGE_PAGE);
}

/// Frees memory from [`acquire`] with the same size and alignment.
pub fn release(ptr: u64, size: u64, align: u64) {
    if ptr == 0 || size == 0 {
        return;
    }
    if let Ok(layout) = Layout::from_size_align(size as usize, align as usize) {
        // SAFETY: ptr came from acquire(size, align) and was removed from the allocation table,
        // so it is freed exactly once.
        unsafe { std::alloc::dealloc(ptr as usize as *mut u8, layout) }
        crate::meminfo::note_released(size);
    }
}

/// Host memory from [`acquire`] that releases itself when dropped: the payload of the
/// allocation tables of host-backed memory (CPU device memory, the pinned memory of CPU and
/// wgpu). The table holds one `AllocRef` to it and every operation using it another, so the
/// memory goes back to the host allocator only when nothing can touch it any more.
#[derive(Debug)]
pub struct HostBlock {
    addr: u64,
    size: u64,
    align: u64,
}

impl HostBlock {
    /// `size` (> 0) bytes aligned to `align`; `backend` and `device` name the owner in
    /// out-of-memory errors.
    pub fn new(size: u64, align: u64, backend: DeviceKind, device: &str) -> Result<Self> {
        let addr = acquire(size, align, backend, device)?;
        Ok(HostBlock { addr, size, align })
    }

    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Registers a new block of `size` bytes in `table` and returns its address.
    pub fn register(
        table: &AllocTable<HostBlock>,
        size: u64,
        align: u64,
        backend: DeviceKind,
        device: &str,
    ) -> Result<u64> {
        let block = HostBlock::new(size, align, backend, device)?;
        let addr = block.addr;
        table.insert(addr, size, block)?;
        Ok(addr)
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        release(self.addr, self.size, self.align);
    }
}

/// The machine's physical memory in bytes, where the OS says: no single page-locked
/// allocation can be larger, so a backend refuses one before asking its driver (CUDA's
/// `cuMemAllocHost` of 2^62 bytes only fails after the driver has tried). Read once.
pub fn physical_memory() -> Option<u64> {
    static BYTES: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *BYTES.get_or_init(read_physical_memory)
}

fn read_physical_memory() -> Option<u64> {
    #[cfg(unix)]
    {
        // SAFETY: sysconf reads two system constants; it has no preconditions.
        let (pages, page) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if pages > 0 && page > 0 {
            return (pages as u64).checked_mul(page as u64);
        }
    }
    None
}

/// Page-aligned host memory that a backend with no page-locking of its own (CPU, wgpu) hands
/// out as its "pinned" memory, registered so that frees and copies through it are checked and
/// copies (queued or replayed) keep it alive while they run.
#[derive(Debug)]
pub struct HostHeap {
    table: AllocTable<HostBlock>,
    backend: DeviceKind,
    device: String,
}

impl HostHeap {
    /// `device` names the owner in out-of-memory errors.
    pub fn new(backend: DeviceKind, device: impl Into<String>) -> Self {
        HostHeap {
            table: AllocTable::new("pinned host"),
            backend,
            device: device.into(),
        }
    }

    /// `bytes` of page-aligned memory; zero bytes is null.
    pub fn alloc(&self, bytes: usize) -> Result<HostPtr> {
        if bytes == 0 {
            return Ok(HostPtr::NULL);
        }
        HostBlock::register(
            &self.table,
            bytes as u64,
            PAGE_ALIGN,
            self.backend,
            &self.device,
        )
        .map(HostPtr)
    }

    /// Frees memory from [`alloc`](Self::alloc): the address is dead at once; the memory is
    /// released when no queued, running or replaying copy uses it any more (never under one).
    /// Null is a no-op.
    pub fn free(&self, ptr: HostPtr) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        self.table.remove(ptr.0).map(drop)
    }

    /// The allocations of this heap.
    pub fn table(&self) -> &AllocTable<HostBlock> {
        &self.table
    }
}

/// A host vector of `n` copies of `fill`, or [`Error::OutOfMemory`] where the host cannot hold
/// it. Vectors sized by a tensor (a read-back, staged values) come from here: a refused
/// allocation in `vec!` or `collect` aborts the process, and a tensor's size is the caller's
/// to choose (a device with more memory than the host's, or a shape of 2⁴⁰ elements).
pub(crate) fn host_vec<T: Clone>(n: usize, fill: T, why: &str) -> Result<Vec<T>> {
    let bytes = (n as u64).saturating_mul(std::mem::size_of::<T>() as u64);
    let oom = |detail: String| Error::OutOfMemory {
        backend: DeviceKind::Cpu,
        device: "host".into(),
        requested: bytes,
        detail: format!("no host buffer for {why} ({detail})"),
    };
    // `resize` touches every page: a vector the host cannot back would kill the process there.
    crate::meminfo::check_backable(bytes).map_err(oom)?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| oom(e.to_string()))?;
    v.resize(n, fill);
    Ok(v)
}
