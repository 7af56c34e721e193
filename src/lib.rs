//! # unirt — one runtime for every accelerator on a machine
//!
//! One binary, built with no cargo features, finds at run time which vendor drivers the
//! machine has and gives every device the same API: streams, events with timing, device /
//! pinned-host / stream-ordered memory, the four kinds of copy, kernels, and stream capture
//! with replay.
//!
//! ```
//! use unirt::{Backend, BackendExt, Device};
//! let dev = unirt::open(Device::CPU)?;           // or "cuda:0".parse()?, "wgpu:1".parse()?
//! let n = 1024u32;
//! let (a, out) = (dev.malloc(4 * n as usize)?, dev.malloc(4 * n as usize)?);
//! let s = dev.default_stream();
//! dev.launch("fill", &[a.into(), 0x3f80_0000u32.into(), n.into()], s)?;      // 1.0f32
//! dev.launch("add_f32", &[a.into(), a.into(), out.into(), n.into()], s)?;
//! dev.stream_synchronize(s)?;
//! let bytes = dev.read_vec(out, 4)?;
//! assert_eq!(f32::from_le_bytes(bytes.try_into().unwrap()), 2.0);
//! # Ok::<(), unirt::Error>(())
//! ```
//!
//! ## Architecture
//!
//! ```text
//!  apps (Rust API)     C ABI (capi/, libinfinirt.so)      CLI `unirt` (devices | conformance | bench)
//!  ops        operator plans (validate, output layout, workspace) over the
//!             KernelRegistry keyed by (op, DeviceKind, DType)            (src/ops/)
//!  tensor     Tensor = allocator storage + Layout + DType; views        (src/tensor/)
//!  context    thread-local current device, per-thread streams        (src/context.rs)
//!  Runtime    one per device, lazily: allocator, pinned pool, capture (src/runtime.rs)
//!  alloc      CachingAllocator + graph-private pools + pinned host pool (src/alloc/)
//!  discovery  probe every vendor once; open devices lazily            (src/discovery.rs)
//!  hal        trait Backend + enum AnyBackend (enum_dispatch)          (src/hal/)
//!  vendors/   cpu/   cuda/   wgpu/   — one directory each, same shape
//! ```
//!
//! Data flows down, errors flow up as [`Error`]. Nothing above [`hal`] names a vendor type;
//! nothing in `vendors/` knows about the layers above the HAL except the operator kernels
//! (`vendors/<v>/kernels/`), which see the kernel interface of [`ops`] (`KernelCall`,
//! `TensorRef`) and register themselves in one function per vendor. CPU operator kernels run
//! on the stream's worker through [`Backend::launch_host`].
//!
//! ## Design choices, and why
//!
//! - **Vendors are discovered, not compiled in.** Every vendor is always built; its probe
//!   loads the driver at run time and answers *available* with devices or *unavailable* with a
//!   reason a person can act on. A missing or broken driver is a status, never a panic — the
//!   probes guard every entry into libraries (cudarc panics when a library is missing; wgpu
//!   panics on validation errors) and discovery catches unwinds as a last line of defence.
//! - **Static dispatch over a closed set.** `AnyBackend` is an enum dispatched by
//!   `enum_dispatch`: no vtables, and adding a vendor is one variant plus one directory. The
//!   trait is small and documented method by method; the conformance suite is its executable
//!   specification.
//! - **Device pointers are addresses.** [`DevicePtr`] is a `u64` in the device's address space on
//!   every backend (a host address on CPU, a `CUdeviceptr` on CUDA, a virtual address mapped to
//!   (buffer, offset) on wgpu), so pointer arithmetic and interior pointers work everywhere and
//!   the C ABI can pass them as `void *`.
//! - **Everything is checked.** Each backend keeps an allocation table
//!   ([`memtable::AllocTable`]) and live-handle tables ([`handles::HandleTable`]): an
//!   out-of-bounds copy, a double free, a destroyed stream are typed errors, and a graph replay
//!   re-checks its buffers instead of writing freed memory.
//! - **Streams are real queues everywhere.** The CPU backend runs each stream on a worker
//!   thread, so events report NOT_READY while work is pending and time the work — the same
//!   observable behaviour as CUDA, which is what makes one conformance suite possible.
//! - **One allocator for every vendor.** [`CachingAllocator`] sits above the HAL's raw
//!   alloc/free (PyTorch's block-allocator design: 512 B rounding, small and large pools, split
//!   and coalesce, stream-aware reuse). Allocations made while a graph records come from a
//!   private pool that lives as long as the graph, so a replay never reads a freed address.
//! - **The library carries only the runtime.** The conformance cases, their harness and reports
//!   live in crate `unirt-conformance` (`conformance/`), the `unirt` command in crate
//!   `unirt-cli` (`cli/`): an app that embeds `unirt` compiles neither, nor their dependencies.
//! - **Kernels are described once** ([`kernel::KERNELS`]) and written per vendor in its own
//!   language (Rust, CUDA C compiled by NVRTC, WGSL), so argument checking is shared.
//!
//! ## Adding a vendor
//!
//! Add `vendors/<name>/` with the same files as `vendors/cpu/`, implement [`Backend`], add a
//! variant to [`AnyBackend`] and a [`DeviceKind`], and hook its `probe`/`open` into
//! [`discovery`]. The conformance suite (crate `unirt-conformance`) then runs every case on it.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod alloc;
pub mod context;
pub mod device;
pub mod discovery;
pub mod error;
pub mod hal;
pub mod handles;
pub mod hostmem;
pub mod kernel;
pub mod memory;
pub mod memtable;
pub mod ops;
pub mod progress;
pub mod runtime;
pub mod stream;
pub mod tensor;

#[path = "../vendors/mod.rs"]
pub mod vendors;

pub use alloc::{CachingAllocator, MemoryStats};
pub use device::{Capabilities, Device, DeviceInfo, DeviceKind, EventTiming, MemInfo};
pub use discovery::{discover, open, BackendReport, Discovery};
pub use error::{Error, Result, Status};
pub use hal::{
    AnyBackend, Backend, CaptureMode, DevicePtr, EventFlags, EventId, EventStatus, GraphExecId,
    GraphId, HostPtr, KernelArg, MemcpyKind, StreamId,
};
pub use memory::Memory;
pub use runtime::{Graph, GraphExec, Runtime};
pub use stream::{BackendExt, Event, Stream};
pub use tensor::{DType, Tensor};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

impl From<DevicePtr> for KernelArg {
    fn from(p: DevicePtr) -> Self {
        KernelArg::Ptr(p)
    }
}

impl From<u32> for KernelArg {
    fn from(v: u32) -> Self {
        KernelArg::U32(v)
    }
}

impl From<f32> for KernelArg {
    fn from(v: f32) -> Self {
        KernelArg::F32(v)
    }
}
