//! Vendor backends, one directory each, all of the same shape:
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the backend type, its `Backend` impl, `probe()` and `open()` |
//! | `memory.rs` | raw device / pinned-host allocation and copies |
//! | `stream.rs` | streams: how commands are queued and run |
//! | `event.rs` | events: recording, query, timing |
//! | `graph.rs` | stream capture, instantiate, replay |
//! | `kernels.rs` (+ `kernels/`) | the kernels of [`crate::kernel::KERNELS`] in the vendor's language |
//!
//! Nothing here knows about `context`, `graph` recording above the HAL or the allocator: data
//! flows down into a vendor, errors flow up.

pub mod cpu;
pub mod cuda;
pub mod wgpu;
