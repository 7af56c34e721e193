//! # unirt — one runtime for every accelerator on a machine
//!
//! One library, built with no cargo features, finds at run time which vendor drivers the
//! machine has and gives every device the same API: streams, events with timing, device /
//! pinned-host / stream-ordered memory, the four kinds of copy, kernels, stream capture with
//! replay, tensors with operators, and operator graphs recorded once and replayed
//! ([`graph`]).
//!
//! ```
//! use unirt::{KernelArg, Runtime};
//! let dev = unirt::best_device().unwrap_or(unirt::Device::CPU); // never an emulated GPU over the CPU
//! let rt = Runtime::get(dev)?;
//! let (a, out) = (rt.allocate_memory(4 * 1024)?, rt.allocate_memory(4 * 1024)?);
//! let s = rt.create_stream()?;
//! s.copy_from_slice(&a, &[1.0f32; 1024])?;                        // typed, safe, stream-ordered
//! s.launch("add_f32", &[(&a).into(), (&a).into(), (&out).into(), KernelArg::U32(1024)])?;
//! pollster::block_on(s.completion()?)?;                           // or s.synchronize()
//! assert_eq!(s.copy_to_vec::<f32>(&out, 1024)?, vec![2.0; 1024]);
//! # Ok::<(), unirt::Error>(())
//! ```
//!
//! ## Layers
//!
//! ```text
//!  apps (Rust API)          C ABI (capi/: libinfinirt.so)     CLI (cli/)   conformance kit (conformance/)
//!  ───────────────────────────────────────────────────────────────────────────────────────────────
//!  ops           operator plans (validate, output layout, workspace) over the KernelRegistry
//!                keyed by (op, DeviceKind, DType); eager methods on Tensor
//!  tensor        Tensor = allocator storage + Layout + DType; views that copy nothing
//!  graph/        the operator graph: Graph -> CapturePlan -> GraphExec (see [`graph`]), over
//!                stream capture's CapturedGraph / CapturedExec, which keep the private pool alive
//!  context       thread-local current device + per-thread stream, InfiniCore's free functions
//!  Runtime       one per device, lazily: caching allocator, pinned pool, capture + private pools
//!  memory        Memory (RAII, from the allocator or the pinned pool); alloc/ the allocators
//!  stream        Stream / Event (RAII), typed safe copies, Completion futures; BackendExt
//!  discovery     probe each vendor once, when first needed; open devices lazily; rank them
//!  checked       the shared checks and memory lifetimes of cpu and wgpu (allocation pins)
//!  hal           trait Backend (the contract), handle / pointer types, Probe
//!  vendors/      VENDORS (the one table) + AnyBackend; cpu/ cuda/ wgpu/ (+ noop/, the template)
//!  ───────────────────────────────────────────────────────────────────────────────────────────────
//!  shared below: device (DeviceKind, Device, DeviceInfo, DeviceClass), error (Error), kernel
//!  (KERNELS: names + signatures), and the hidden bookkeeping (memtable, handles, hostmem, progress)
//! ```
//!
//! | layer | owns | module |
//! |---|---|---|
//! | vendors | driver loading, native handles, the kernels in the vendor's language, its checks | `vendors/<name>/` |
//! | hal | the [`Backend`] contract every vendor implements, the handle and pointer types | [`hal`] |
//! | discovery | which vendors work here and why not, the device ranking, one open backend per device | [`discovery`] |
//! | stream | RAII streams and events; copies that need no `unsafe`; completion futures | [`stream`], [`completion`] |
//! | memory / alloc | [`Memory`] handles; the caching block allocator, graph-private pools, the pinned pool | [`memory`], [`alloc`] |
//! | Runtime | one allocator + pinned pool + capture state per device | [`runtime`] |
//! | context | the calling thread's device and stream (InfiniCore's `context`) | [`context`] |
//! | tensor | [`Tensor`]: storage from the allocator, layout, dtype, views | [`tensor`] |
//! | ops | operator plans, the [`KernelRegistry`](ops::KernelRegistry), eager tensor methods | [`ops`] |
//! | graph | operator graphs (record or build once, plan once: order, capture-safe segments, memory plan, fusion; replay through stream capture) and the capture handles | [`graph`] |
//!
//! **Dependencies point down.** `vendors` depend on `hal`, `device`, `error` and the hidden
//! bookkeeping modules, never on discovery, the allocator, `context` or anything above;
//! `hal` names no vendor (the enum of backends, [`AnyBackend`], lives with the vendor table);
//! `discovery` reaches the vendors only through [`vendors::VENDORS`]; `runtime` and
//! `context` share the thread state through a private module below both instead of importing
//! each other. Tensors, operators and the operator graph go above `Runtime` and reach the
//! vendors only through the HAL and each vendor's kernel registration.
//!
//! ## Where things go
//!
//! - **A new vendor**: a directory `vendors/<name>/` with the same files as the others, a row
//!   in [`vendors::VENDORS`], a variant of [`AnyBackend`] and of [`DeviceKind`].
//!   `docs/ADDING_A_VENDOR.md` walks through it, starting from [`vendors::noop`], the smallest
//!   backend that compiles; then crate `unirt-conformance` runs every case on it.
//! - **A new operator**: its name and signature in [`kernel::KERNELS`] (checked once for every
//!   vendor), and its kernel in the op family's file of each vendor — `kernels/<family>.rs` on
//!   the CPU, `kernels/<family>.cu` on CUDA, `kernels/<family>.rs` on wgpu, which generates
//!   the family's WGSL (the same family names everywhere: `elementwise`, `cast`, `rearrange`,
//!   `reduce`, `softmax`, `norm`, `matmul`, `embedding`, `rope`, `attention`, `sample`).
//! - **A rule every backend shares** (handle checks, capture state, copy ranges, allocation
//!   lifetimes): the checked layer between the public API and the vendors, not each vendor.
//!
//! ## Invariants
//!
//! - **Fork-safe, and no size aborts.** A child made by `fork` gets [`Error::Forked`] from
//!   every object of its parent at the cost of one atomic load per call, and discovery, `open`,
//!   [`Runtime`] and [`context`] start afresh there ([`fork`]); CUDA and Mesa's GL, which
//!   cannot cross a fork, say so. Sizes from callers and drivers are checked and allocated
//!   fallibly: an impossible one is `OutOfMemory` / `TooLarge`, never an abort.
//! - **Exit-safe.** A process may exit while its threads compile, submit or exit: each
//!   driver whose exit handlers free state under running threads (LLVM, Mesa, glvnd's EGL,
//!   NVRTC) is stopped first by a hook (`exit`: its calls are refused, those in progress and
//!   the device's queue waited for, within bounds).
//! - **Memory is never released under work that uses it.** Every check of a range returns a
//!   counted reference to its allocation ([`memtable::AllocRef`]), which the operation holds
//!   until it has run — a synchronous copy until it returns, a queued command until its worker
//!   or submission has finished, a replay for its duration. `free` / `free_host` / `free_async`
//!   unregister the address at once and drop the table's reference; the memory goes when the
//!   last user lets go. So a free neither waits for the device nor races a copy on another
//!   thread, a destroyed stream's queued work still runs on live memory, and device
//!   synchronize waits for that work. The CPU and wgpu backends share this layer
//!   ([`checked`]); the CUDA backend's `free` waits for the device, as `cudaFree` does.
//! - **Errors, never panics.** Bad input, a missing or broken driver, out of memory: a typed
//!   [`Error`] (the C ABI's status code via [`Error::status`]); a failed driver call keeps the
//!   driver's own code ([`Error::driver_code`]). Discovery and the C ABI also catch unwinds as
//!   a last line of defence. An unavailable vendor is a status with a reason, not an error.
//! - **Device pointers are addresses.** [`DevicePtr`] is a `u64` in the device's address space
//!   on every backend (a host address on CPU, a `CUdeviceptr` on CUDA, a virtual address mapped
//!   to (buffer, offset) on wgpu): pointer arithmetic and interior pointers work everywhere,
//!   and every copy, set, launch and free is checked against the backend's allocation table.
//! - **Unsafe stays at the bottom.** `unsafe` code lives in the vendors' lowest layers (driver
//!   wrappers whose soundness depends on validated arguments are `unsafe fn`, as in cudarc's
//!   `result` layer), each block with a `// SAFETY:` line. Above the HAL only the raw copies
//!   of host memory ([`Backend::memcpy`] and the C-style context functions) are `unsafe`;
//!   every copy that reads and writes only device memory, or Rust slices, is safe.
//! - **Streams are real queues everywhere**: events report NOT_READY while work is pending,
//!   on the CPU backend too, which is what lets one conformance suite judge every backend.
//! - **A replay never reads freed memory**: allocations made while recording come from a
//!   private pool that lives as long as the graph and its executables.
//!
//! ## Using unirt from an application
//!
//! unirt's CPU kernels and its wgpu dependency crawl in an unoptimised build (20–30× slower);
//! a debug build of an app should still optimise them:
//!
//! ```toml
//! [profile.dev.package."*"]
//! opt-level = 2
//! [profile.dev.package.unirt]
//! opt-level = 3
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

pub mod alloc;
pub mod checked;
pub mod completion;
pub mod context;
pub mod device;
pub mod discovery;
pub mod error;
pub(crate) mod exit;
pub mod fork;
pub mod graph;
pub mod hal;
#[doc(hidden)]
pub mod handles;
pub(crate) mod host_threads;
#[doc(hidden)]
pub mod hostmem;
pub mod kernel;
pub(crate) mod meminfo;
pub mod memory;
#[doc(hidden)]
pub mod memtable;
pub mod ops;
#[doc(hidden)]
pub mod progress;
pub mod runtime;
pub mod stream;
pub mod tensor;
mod thread_state;

#[path = "../vendors/mod.rs"]
pub mod vendors;

pub use alloc::{CachingAllocator, MemoryStats};
pub use completion::Completion;
pub use device::{
    Capabilities, Device, DeviceClass, DeviceInfo, DeviceKind, DeviceRank, EventTiming, MemInfo,
    UnusableDevice,
};
pub use discovery::{best_device, discover, open, vendor_report, BackendReport, Discovery};
pub use error::{Error, InfiniStatus, Result};
pub use graph::{CapturePlan, CapturedExec, CapturedGraph, Graph, GraphExec};
pub use hal::{
    Backend, CaptureMode, DevicePtr, EventFlags, EventId, EventStatus, GraphExecId, GraphId,
    HostPtr, KernelArg, MemcpyKind, StreamId,
};
pub use memory::Memory;
pub use runtime::Runtime;
pub use stream::{BackendExt, DeviceRange, Event, Stream};
pub use tensor::{DType, Tensor};
pub use vendors::AnyBackend;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

impl From<DevicePtr> for KernelArg {
    fn from(p: DevicePtr) -> Self {
        KernelArg::Ptr(p)
    }
}

impl From<&Memory> for KernelArg {
    /// The memory's device address (a buffer argument).
    fn from(m: &Memory) -> Self {
        KernelArg::Ptr(m.device_ptr())
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
