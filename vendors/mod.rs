//! Vendor backends, one directory each, all of the same shape:
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the backend type, its `Backend` impl, `probe()` and `open()` |
//! | `memory.rs` | raw device / pinned-host allocation and copies |
//! | `stream.rs` | streams: how commands are queued and run |
//! | `event.rs` | events: recording, query, timing |
//! | `graph.rs` | stream capture, instantiate, replay |
//! | `kernels.rs` or `kernels/` | the HAL's built-in kernels and the operator kernels, one file per operator family |
//!
//! Nothing here knows about `context`, `graph` recording above the HAL or the allocator: data
//! flows down into a vendor, errors flow up.

pub mod cpu;
pub mod cuda;
pub mod wgpu;

/// Every vendor's operator kernels into the registry: the one list of who registers what.
/// The CUDA and wgpu backends register none yet; their operators answer
/// [`Error::UnsupportedKernel`](crate::Error::UnsupportedKernel).
pub(crate) fn register_kernels(reg: &mut crate::ops::KernelRegistry) {
    cpu::register_kernels(reg);
}
