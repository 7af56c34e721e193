//! Aligned host allocations with typed errors: the memory of the CPU backend's devices and the
//! "pinned" host memory of backends that have no page-locking of their own (CPU, wgpu).

use std::alloc::Layout;

use crate::error::{Error, Result};

/// Host allocations that stand in for pinned memory are page-aligned.
pub const PAGE_ALIGN: u64 = 4096;

/// Allocates `size` (> 0) bytes aligned to `align`. Never panics: an impossible layout or a
/// refused allocation is `OutOfMemory`.
pub fn acquire(size: u64, align: u64, device: &str) -> Result<u64> {
    let oom = |detail: &str| Error::OutOfMemory {
        device: device.to_string(),
        requested: size,
        detail: detail.to_string(),
    };
    let size_usize = usize::try_from(size).map_err(|_| oom("larger than the address space"))?;
    let layout = Layout::from_size_align(size_usize, align as usize)
        .map_err(|_| oom("larger than the address space"))?;
    // SAFETY: layout has a non-zero size (callers map zero to NULL before calling).
    let p = unsafe { std::alloc::alloc(layout) };
    if p.is_null() {
        return Err(oom("the host allocator refused"));
    }
    Ok(p as usize as u64)
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
    }
}
