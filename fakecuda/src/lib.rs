//! # unirt-fakecuda: a CPU-backed, fault-injecting libcuda for CI
//!
//! A shared library (`libunirt_fakecuda.so`) that exports, with C linkage and cuda.h's
//! prototypes, every CUDA driver entry point unirt's CUDA backend loads, implemented over host
//! memory and threads. unirt loads it through `UNIRT_CUDA_LIBRARY=/abs/path/libunirt_fakecuda.so`
//! exactly as it loads a real libcuda, so the backend's whole state machine — and every failure
//! path — runs on a machine without a GPU. See docs/RELIABILITY.md for how CI uses it.
//!
//! What it models (and how it differs from real CUDA) is documented module by module:
//! - [`state`]: devices, primary contexts, sticky context errors, handles, the device address
//!   space (freed spans reused as a real allocator does; graph nodes on freed memory are
//!   misuse), pinned host memory.
//! - [`exec`]: streams as ordered worker threads, events with timing, the legacy stream.
//! - [`capture`]: stream capture into graphs, capture modes, the invalidation rules for
//!   "potentially unsafe" calls, instantiate and launch.
//! - [`kernels`]: module images (PTX or CUBIN from the real NVRTC) and CPU twins of unirt's
//!   built-in kernels, found by function name.
//! - [`faults`]: `UNIRT_FAKECUDA_FAULTS` / [`unirt_fakecuda_set_faults`]: the Nth call of a
//!   function returns a chosen `CUresult`.
//! - [`api_ctx`], [`api_mem`], [`api_stream`]: the exported `cu*` functions.
//!
//! Calls that a real driver might crash on (an unknown or destroyed handle, instantiating a
//! graph that does not exist) are answered with an error *and* recorded as misuse, which tests
//! read through [`control`]'s `unirt_fakecuda_misuses`; a correct caller never triggers one.
//!
//! Configuration (read at the first call): `UNIRT_FAKECUDA_DEVICES` (default 1; 0 makes
//! `cuInit` answer `CUDA_ERROR_NO_DEVICE` like libcuda on a machine without a GPU),
//! `UNIRT_FAKECUDA_CC` (compute capability ×10, default 80), `UNIRT_FAKECUDA_MEMORY` (bytes per
//! device, default 8 GiB, backed lazily), `UNIRT_FAKECUDA_POOLS` (0 turns off stream-ordered
//! allocation), `UNIRT_FAKECUDA_FAULTS` (see [`faults`]).

#![allow(non_snake_case, clippy::missing_safety_doc)]

pub mod api_ctx;
pub mod api_mem;
pub mod api_stream;
pub mod capture;
pub mod control;
pub mod cublas;
pub mod exec;
pub mod faults;
pub mod kernels;
pub mod result;
pub mod state;
#[cfg(test)]
mod tests;

pub use control::*;
