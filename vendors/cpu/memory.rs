//! CPU memory: host allocations with device semantics, and what the host has.

use crate::device::MemInfo;
use crate::error::{Error, Result};

/// Device allocations are aligned like CUDA's (256 bytes) so code tuned for GPUs sees the same.
pub(crate) const DEVICE_ALIGN: u64 = 256;

/// Total and available host memory (`meminfo`: `/proc/meminfo` within the process's cgroup
/// limit; free swap counts as available, as the allocations it bounds may use it).
pub(crate) fn mem_info() -> Result<MemInfo> {
    crate::meminfo::host_memory()
        .map(|m| MemInfo {
            free: m.available,
            total: m.total,
        })
        .ok_or_else(|| {
            Error::Internal("cannot read MemTotal and MemAvailable from /proc/meminfo".into())
        })
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
