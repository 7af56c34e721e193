//! CPU memory: host allocations with device semantics, and `/proc/meminfo`.

use std::alloc::Layout;

use crate::device::MemInfo;
use crate::error::{Error, Result};

/// Device allocations are aligned like CUDA's (256 bytes) so code tuned for GPUs sees the same.
pub(crate) const DEVICE_ALIGN: u64 = 256;
/// Pinned-host allocations are page-aligned.
pub(crate) const HOST_ALIGN: u64 = 4096;

/// Allocates `size` (> 0) bytes aligned to `align`. Never panics: an impossible layout or a
/// refused allocation is `OutOfMemory`.
pub(crate) fn acquire(size: u64, align: u64, device: &str) -> Result<u64> {
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
pub(crate) fn release(ptr: u64, size: u64, align: u64) {
    if ptr == 0 || size == 0 {
        return;
    }
    if let Ok(layout) = Layout::from_size_align(size as usize, align as usize) {
        // SAFETY: ptr came from acquire(size, align) and was removed from the allocation table,
        // so it is freed exactly once.
        unsafe { std::alloc::dealloc(ptr as usize as *mut u8, layout) }
    }
}

/// Total and available memory from `/proc/meminfo`.
pub(crate) fn mem_info() -> Result<MemInfo> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| Error::Internal(format!("cannot read /proc/meminfo: {e}")))?;
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    match (
        field("MemTotal:"),
        field("MemAvailable:").or_else(|| field("MemFree:")),
    ) {
        (Some(total), Some(free)) => Ok(MemInfo { free, total }),
        _ => Err(Error::Internal(
            "/proc/meminfo lacks MemTotal or MemAvailable".into(),
        )),
    }
}

/// The processor's model name and vendor from `/proc/cpuinfo`.
pub(crate) fn cpu_name() -> (String, String) {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let name = field("model name")
        .or_else(|| field("Model"))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let vendor = field("vendor_id")
        .or_else(|| field("CPU implementer"))
        .unwrap_or_else(|| "unknown".into());
    (name, vendor)
}
