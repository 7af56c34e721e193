//! # libinfinirt — InfiniCore's `infinirt.h` C ABI on top of unirt
//!
//! This crate builds `libinfinirt.so` and `libinfinirt.a`. A program written against
//! InfiniCore's `infinirt.h` compiles against `capi/include` (headers written for unirt with
//! the same types, values and functions), links with `-linfinirt`, and runs on whatever
//! devices unirt discovers at run time: CPU always, NVIDIA GPUs through CUDA, and any
//! Vulkan / Metal / DX12 / GL adapter as the extension type `INFINI_DEVICE_UNIRT_WGPU` (100).
//!
//! ## Semantics
//!
//! - The current device is thread-local and starts as CPU 0; calls without a device argument
//!   act on it. A NULL stream is that device's default stream.
//! - Handles are the HAL's `u64` ids in a `void *` (on NVIDIA, the native `CUstream` /
//!   `CUevent`). Each is resolved on the current device's backend, which validates it: a
//!   destroyed, never-created or foreign handle is a status code (BAD_PARAM), never undefined
//!   behaviour. A NULL event / graph / exec handle is NULL_POINTER.
//! - Device pointers are device addresses of the current device, bounds-checked by the backend.
//! - Every failure is a status ([`unirt::Error::status`]); the thread's last message is
//!   available through the extension `unirtGetLastErrorMessage`.
//! - Nothing unwinds into C: every entry point runs under `catch_unwind` and a panic becomes
//!   INTERNAL_ERROR.
//!
//! The entry points are also callable from Rust (the benchmark in `benches/` does), as the
//! `unsafe extern "C"` functions they are.

#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_snake_case)]

pub mod boundary;
pub mod current;
pub mod device_api;
pub mod graph_api;
pub mod memory_api;
pub mod stream_api;

pub use boundary::{Status, INTERNAL_ERROR, SUCCESS};
pub use current::{DEVICE_CPU, DEVICE_NVIDIA, DEVICE_TYPE_COUNT, DEVICE_UNIRT_WGPU};
pub use device_api::*;
pub use graph_api::*;
pub use memory_api::*;
pub use stream_api::*;
