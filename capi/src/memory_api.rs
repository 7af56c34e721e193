//! Entry points for memory. Device pointers are [`DevicePtr`] addresses of the current device;
//! every device range is bounds-checked by its backend, so an out-of-bounds copy, an unknown
//! pointer or a double free is a status, not corruption.

use std::ffi::{c_int, c_void};

use unirt::{Backend, DevicePtr, HostPtr, MemcpyKind};

use crate::boundary::{check_out, guard, to_handle, write_out, Status};
use crate::current::with_current;
use crate::stream_api::Handle;

fn addr(p: *const c_void) -> u64 {
    p as usize as u64
}

/// Device memory of the current device; 0 bytes gives NULL.
///
/// # Safety
/// A non-null `p_ptr` must be valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn infinirtMalloc(p_ptr: *mut *mut c_void, size: usize) -> Status {
    guard(|| {
        check_out(p_ptr, "p_ptr")?;
        with_current(|c| {
            let p = c.backend.malloc(size)?;
            // SAFETY: checked non-null; writable by the caller's contract.
            unsafe { write_out(p_ptr, to_handle(p.0), "p_ptr") }
        })
    })
}

/// Page-locked host memory of the current device.
///
/// # Safety
/// A non-null `p_ptr` must be valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn infinirtMallocHost(p_ptr: *mut *mut c_void, size: usize) -> Status {
    guard(|| {
        check_out(p_ptr, "p_ptr")?;
        with_current(|c| {
            let p = c.backend.malloc_host(size)?;
            // SAFETY: checked non-null; writable by the caller's contract.
            unsafe { write_out(p_ptr, to_handle(p.0), "p_ptr") }
        })
    })
}

/// Frees device memory (NULL is a no-op; an unknown, interior or freed pointer is BAD_PARAM).
#[no_mangle]
pub extern "C" fn infinirtFree(ptr: *mut c_void) -> Status {
    guard(|| with_current(|c| c.backend.free(DevicePtr(addr(ptr)))))
}

/// Frees memory from `infinirtMallocHost`.
#[no_mangle]
pub extern "C" fn infinirtFreeHost(ptr: *mut c_void) -> Status {
    guard(|| with_current(|c| c.backend.free_host(HostPtr(addr(ptr)))))
}

/// Copies `size` bytes and returns when they have arrived.
///
/// # Safety
/// Host-side ranges (the source of H2H/H2D, the destination of H2H/D2H) must be valid for
/// `size` bytes, as for `cudaMemcpy`; device-side ranges are checked.
#[no_mangle]
pub unsafe extern "C" fn infinirtMemcpy(
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
    kind: c_int,
) -> Status {
    guard(|| {
        let kind = MemcpyKind::from_raw(kind)?;
        with_current(|c| {
            // SAFETY: host ranges are the caller's promise (see the function's contract); the
            // backend checks device ranges.
            unsafe { c.backend.memcpy(addr(dst), addr(src), size, kind) }
        })
    })
}

/// Enqueues a copy on `stream`. Host memory not from `infinirtMallocHost` is pageable and
/// follows CUDA's rules on every device: a copy from it has read it when this returns, a copy
/// into it has completed (see `unirt::checked::Pageable`).
///
/// # Safety
/// As [`infinirtMemcpy`]; pinned host ranges (from `infinirtMallocHost`) must stay valid until
/// the copy has run, and every host range while a capture that holds the copy is replayed.
#[no_mangle]
pub unsafe extern "C" fn infinirtMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
    kind: c_int,
    stream: Handle,
) -> Status {
    guard(|| {
        let kind = MemcpyKind::from_raw(kind)?;
        with_current(|c| {
            // SAFETY: host ranges are the caller's promise (see the function's contract); the
            // backend checks device ranges.
            unsafe {
                c.backend
                    .memcpy_async(addr(dst), addr(src), size, kind, c.stream(stream))
            }
        })
    })
}

/// Stream-ordered allocation on `stream`.
///
/// # Safety
/// A non-null `p_ptr` must be valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn infinirtMallocAsync(
    p_ptr: *mut *mut c_void,
    size: usize,
    stream: Handle,
) -> Status {
    guard(|| {
        check_out(p_ptr, "p_ptr")?;
        with_current(|c| {
            let p = c.backend.malloc_async(size, c.stream(stream))?;
            // SAFETY: checked non-null; writable by the caller's contract.
            unsafe { write_out(p_ptr, to_handle(p.0), "p_ptr") }
        })
    })
}

/// Stream-ordered free on `stream`.
#[no_mangle]
pub extern "C" fn infinirtFreeAsync(ptr: *mut c_void, stream: Handle) -> Status {
    guard(|| with_current(|c| c.backend.free_async(DevicePtr(addr(ptr)), c.stream(stream))))
}

/// Sets `count` bytes of device memory to the low byte of `value` (as `cudaMemset`).
#[no_mangle]
pub extern "C" fn infinirtMemset(ptr: *mut c_void, value: c_int, count: usize) -> Status {
    guard(|| with_current(|c| c.backend.memset(DevicePtr(addr(ptr)), value as u8, count)))
}

/// Enqueues a memset on `stream`.
#[no_mangle]
pub extern "C" fn infinirtMemsetAsync(
    ptr: *mut c_void,
    value: c_int,
    count: usize,
    stream: Handle,
) -> Status {
    guard(|| {
        with_current(|c| {
            c.backend
                .memset_async(DevicePtr(addr(ptr)), value as u8, count, c.stream(stream))
        })
    })
}
