//! The lowest layer, continued: libcuda's memory calls — allocation, copies, memset.
//!
//! Every function here is a thin typed wrapper over one libcuda call; what makes each call
//! sound (live handles, in-bounds ranges) is checked by the backend above before it gets here,
//! and each `SAFETY` comment says which check it relies on.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::driver::{CuResult, Driver, INVALID_VALUE, OUT_OF_MEMORY};
use crate::error::{Error, Result};

impl Driver {
    fn alloc_result(&self, r: CuResult, call: &str, bytes: usize, device: &str) -> Result<()> {
        // An allocation call has only its size to be wrong about: an invalid value is a size
        // the driver cannot satisfy, reported like any other out-of-memory.
        if r == OUT_OF_MEMORY || r == INVALID_VALUE {
            return Err(Error::OutOfMemory {
                backend: crate::device::DeviceKind::Cuda,
                device: device.into(),
                requested: bytes as u64,
                detail: self.describe(r),
            });
        }
        self.check(r, call)
    }

    /// Device memory in the current context.
    pub fn mem_alloc(&self, bytes: usize, device: &str) -> Result<u64> {
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: writes one device pointer through a valid out-pointer.
        let r = self.relaxed(|| Ok(unsafe { (self.api.cuMemAlloc_v2)(&mut p, bytes) }))?;
        self.alloc_result(r, "cuMemAlloc", bytes, device)?;
        Ok(p)
    }

    /// # Safety
    /// `p` is the start of a live `cuMemAlloc` allocation, already removed from the allocation
    /// table (freed once), and no queued work still uses it.
    pub unsafe fn mem_free(&self, p: u64) -> Result<()> {
        // SAFETY: p is the start of a live cuMemAlloc allocation, removed from the allocation
        // table before this call (freed once).
        self.relaxed(|| self.check(unsafe { (self.api.cuMemFree_v2)(p) }, "cuMemFree"))
    }

    /// Stream-ordered device memory from the device's default memory pool.
    ///
    /// # Safety
    /// `stream` is a live stream of the current context.
    pub unsafe fn mem_alloc_async(&self, bytes: usize, stream: u64, device: &str) -> Result<u64> {
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: stream is live (validated); writes one pointer through a valid out-pointer.
        let r = unsafe { (self.api.cuMemAllocAsync)(&mut p, bytes, stream as sys::CUstream) };
        self.alloc_result(r, "cuMemAllocAsync", bytes, device)?;
        Ok(p)
    }

    /// # Safety
    /// `p` is the start of a live `cuMemAllocAsync` allocation, already removed from the
    /// allocation table; `stream` is live.
    pub unsafe fn mem_free_async(&self, p: u64, stream: u64) -> Result<()> {
        // SAFETY: p is the start of a live cuMemAllocAsync allocation removed from the table
        // before this call; stream is live.
        self.check(
            unsafe { (self.api.cuMemFreeAsync)(p, stream as sys::CUstream) },
            "cuMemFreeAsync",
        )
    }

    /// Page-locked host memory (cuMemAllocHost: cached, not write-combined; portable across
    /// contexts on every 64-bit platform, where addressing is unified).
    pub fn mem_alloc_host(&self, bytes: usize, device: &str) -> Result<u64> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one host pointer through a valid out-pointer.
        let r = self.relaxed(|| Ok(unsafe { (self.api.cuMemAllocHost_v2)(&mut p, bytes) }))?;
        self.alloc_result(r, "cuMemAllocHost", bytes, device)?;
        Ok(p as u64)
    }

    /// # Safety
    /// `p` is the start of a live `cuMemAllocHost` allocation, already removed from the pinned
    /// table (freed once), and no queued copy still uses it.
    pub unsafe fn mem_free_host(&self, p: u64) -> Result<()> {
        // SAFETY: p is the start of a live cuMemAllocHost allocation removed from the pinned
        // table before this call.
        self.relaxed(|| {
            self.check(
                unsafe { (self.api.cuMemFreeHost)(p as *mut c_void) },
                "cuMemFreeHost",
            )
        })
    }

    /// Enqueues a host-to-device copy.
    ///
    /// # Safety
    /// `[src, src + bytes)` must be readable host memory until the copy has run; the device
    /// range must lie in a live allocation of the current context.
    pub unsafe fn copy_h2d(&self, dst: u64, src: u64, bytes: usize, stream: u64) -> Result<()> {
        // SAFETY: the caller's contract above.
        let r = unsafe {
            (self.api.cuMemcpyHtoDAsync_v2)(
                dst,
                src as *const c_void,
                bytes,
                stream as sys::CUstream,
            )
        };
        self.check(r, "cuMemcpyHtoDAsync")
    }

    /// Enqueues a device-to-host copy.
    ///
    /// # Safety
    /// `[dst, dst + bytes)` must be writable host memory until the copy has run.
    pub unsafe fn copy_d2h(&self, dst: u64, src: u64, bytes: usize, stream: u64) -> Result<()> {
        // SAFETY: the caller's contract above.
        let r = unsafe {
            (self.api.cuMemcpyDtoHAsync_v2)(dst as *mut c_void, src, bytes, stream as sys::CUstream)
        };
        self.check(r, "cuMemcpyDtoHAsync")
    }

    /// Enqueues a copy within the current context's device memory.
    ///
    /// # Safety
    /// Both ranges lie in live allocations of the current context (bounds-checked against the
    /// allocation table) and stay allocated until the copy has run; `stream` is live.
    pub unsafe fn copy_d2d(&self, dst: u64, src: u64, bytes: usize, stream: u64) -> Result<()> {
        // SAFETY: both ranges were bounds-checked against the allocation table; stream is live.
        let r =
            unsafe { (self.api.cuMemcpyDtoDAsync_v2)(dst, src, bytes, stream as sys::CUstream) };
        self.check(r, "cuMemcpyDtoDAsync")
    }

    /// Enqueues a copy between the memories of two contexts (two GPUs).
    ///
    /// # Safety
    /// Each range lies in a live allocation of its context (bounds-checked against that
    /// device's allocation table) and stays allocated until the copy has run; both contexts are
    /// retained; `stream` is live.
    pub unsafe fn copy_peer(
        &self,
        dst: u64,
        dst_ctx: u64,
        src: u64,
        src_ctx: u64,
        bytes: usize,
        stream: u64,
    ) -> Result<()> {
        // SAFETY: both ranges were bounds-checked against their devices' allocation tables and
        // both contexts are retained by open backends; stream is live.
        let r = unsafe {
            (self.api.cuMemcpyPeerAsync)(
                dst,
                dst_ctx as sys::CUcontext,
                src,
                src_ctx as sys::CUcontext,
                bytes,
                stream as sys::CUstream,
            )
        };
        self.check(r, "cuMemcpyPeerAsync")
    }

    /// Enqueues a host-to-host copy (unified addressing lets the driver order it on a stream).
    ///
    /// # Safety
    /// Both host ranges must be valid for `bytes` bytes until the copy has run.
    pub unsafe fn copy_h2h(&self, dst: u64, src: u64, bytes: usize, stream: u64) -> Result<()> {
        // SAFETY: the caller's contract above.
        let r = unsafe { (self.api.cuMemcpyAsync)(dst, src, bytes, stream as sys::CUstream) };
        self.check(r, "cuMemcpyAsync")
    }

    /// # Safety
    /// The range lies in a live allocation of the current context (bounds-checked) and stays
    /// allocated until the memset has run; `stream` is live.
    pub unsafe fn memset_d8(&self, dst: u64, value: u8, bytes: usize, stream: u64) -> Result<()> {
        // SAFETY: the range was bounds-checked against the allocation table; stream is live.
        let r = unsafe { (self.api.cuMemsetD8Async)(dst, value, bytes, stream as sys::CUstream) };
        self.check(r, "cuMemsetD8Async")
    }
}

/// Copies `bytes` bytes between host addresses.
///
/// # Safety
/// Both ranges must be valid for `bytes` bytes (they may overlap).
pub unsafe fn host_copy(dst: u64, src: u64, bytes: usize) {
    // SAFETY: the caller's contract above.
    unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, bytes) };
}
