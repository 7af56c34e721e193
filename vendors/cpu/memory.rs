//! CPU memory: host allocations with device semantics, and `/proc/meminfo`.

use crate::device::MemInfo;
use crate::error::{Error, Result};

/// Device allocations are aligned like CUDA's (256 bytes) so code tuned for GPUs sees the same.
pub(crate) const DEVICE_ALIGN: u64 = 256;

/// Total and available memory from `/proc/meminfo`.
pub(crate) fn mem_info() -> Result<MemInfo> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| Error::Internal(format!("cannot read /proc/meminfo: {e}")))?;
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib.saturating_mul(1024))
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
