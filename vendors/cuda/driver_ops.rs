//! The lowest layer, continued: memory, copies, modules, launches and graphs.
//!
//! Every function here is a thin typed wrapper over one libcuda call; what makes each call
//! sound (live handles, in-bounds ranges) is checked by the backend above before it gets here,
//! and each `SAFETY` comment says which check it relies on.

use std::ffi::{c_char, c_void, CString};

use cudarc::driver::sys;

use super::driver::{CuResult, Driver, INVALID_VALUE, OUT_OF_MEMORY};
use crate::error::{Error, Result};

/// A kernel argument value, stored so that `cuLaunchKernel` can read it through a pointer.
#[derive(Debug, Clone, Copy)]
pub enum ArgValue {
    U64(u64),
    U32(u32),
    F32(f32),
}

impl Driver {
    fn alloc_result(&self, r: CuResult, call: &str, bytes: usize, device: &str) -> Result<()> {
        // An allocation call has only its size to be wrong about: an invalid value is a size
        // the driver cannot satisfy, reported like any other out-of-memory.
        if r == OUT_OF_MEMORY || r == INVALID_VALUE {
            return Err(Error::OutOfMemory {
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
        let r = unsafe { (self.api.cuMemAlloc_v2)(&mut p, bytes) };
        self.alloc_result(r, "cuMemAlloc", bytes, device)?;
        Ok(p)
    }

    pub fn mem_free(&self, p: u64) -> Result<()> {
        // SAFETY: p is the start of a live cuMemAlloc allocation, removed from the allocation
        // table before this call (freed once).
        self.check(unsafe { (self.api.cuMemFree_v2)(p) }, "cuMemFree")
    }

    /// Stream-ordered device memory from the device's default memory pool.
    pub fn mem_alloc_async(&self, bytes: usize, stream: u64, device: &str) -> Result<u64> {
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: stream is live (validated); writes one pointer through a valid out-pointer.
        let r = unsafe { (self.api.cuMemAllocAsync)(&mut p, bytes, stream as sys::CUstream) };
        self.alloc_result(r, "cuMemAllocAsync", bytes, device)?;
        Ok(p)
    }

    pub fn mem_free_async(&self, p: u64, stream: u64) -> Result<()> {
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
        let r = unsafe { (self.api.cuMemAllocHost_v2)(&mut p, bytes) };
        self.alloc_result(r, "cuMemAllocHost", bytes, device)?;
        Ok(p as u64)
    }

    pub fn mem_free_host(&self, p: u64) -> Result<()> {
        // SAFETY: p is the start of a live cuMemAllocHost allocation removed from the pinned
        // table before this call.
        self.check(
            unsafe { (self.api.cuMemFreeHost)(p as *mut c_void) },
            "cuMemFreeHost",
        )
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
    pub fn copy_d2d(&self, dst: u64, src: u64, bytes: usize, stream: u64) -> Result<()> {
        // SAFETY: both ranges were bounds-checked against the allocation table; stream is live.
        let r =
            unsafe { (self.api.cuMemcpyDtoDAsync_v2)(dst, src, bytes, stream as sys::CUstream) };
        self.check(r, "cuMemcpyDtoDAsync")
    }

    /// Enqueues a copy between the memories of two contexts (two GPUs).
    pub fn copy_peer(
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

    pub fn memset_d8(&self, dst: u64, value: u8, bytes: usize, stream: u64) -> Result<()> {
        // SAFETY: the range was bounds-checked against the allocation table; stream is live.
        let r = unsafe { (self.api.cuMemsetD8Async)(dst, value, bytes, stream as sys::CUstream) };
        self.check(r, "cuMemsetD8Async")
    }

    // ---- modules and launches -----------------------------------------------------------

    /// Loads a CUBIN or NUL-terminated PTX image into the current context.
    pub fn module_load(&self, image: &[u8]) -> Result<u64> {
        let mut m: sys::CUmodule = std::ptr::null_mut();
        // cuModuleLoadData reads a PTX image up to its NUL, so text must end with one; a
        // CUBIN is an ELF image whose header tells the driver its size.
        let owned;
        let data = if image.starts_with(b"\x7fELF") || image.last() == Some(&0) {
            image
        } else {
            owned = [image, b"\0"].concat();
            &owned[..]
        };
        // SAFETY: data is a complete image that outlives the call (the driver copies it).
        let r = unsafe { (self.api.cuModuleLoadData)(&mut m, data.as_ptr() as *const c_void) };
        self.check(r, "cuModuleLoadData")?;
        Ok(m as u64)
    }

    pub fn module_function(&self, module: u64, name: &str) -> Result<u64> {
        let cname = CString::new(name).map_err(|_| Error::BadParam(format!("{name:?}")))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: module is loaded and live; cname is NUL-terminated.
        let r = unsafe {
            (self.api.cuModuleGetFunction)(
                &mut f,
                module as sys::CUmodule,
                cname.as_ptr() as *const c_char,
            )
        };
        self.check(r, "cuModuleGetFunction")?;
        Ok(f as u64)
    }

    pub fn module_unload(&self, module: u64) -> Result<()> {
        // SAFETY: module is live and unloaded once (at backend teardown).
        self.check(
            unsafe { (self.api.cuModuleUnload)(module as sys::CUmodule) },
            "cuModuleUnload",
        )
    }

    /// Enqueues `f` on `stream` with a 1-D grid.
    pub fn launch(
        &self,
        f: u64,
        grid: u32,
        block: u32,
        args: &[ArgValue],
        stream: u64,
    ) -> Result<()> {
        // cuLaunchKernel reads each argument through a pointer to its value; the values live
        // in `store` for the duration of the call (the driver copies them at launch).
        let mut store: Vec<ArgValue> = args.to_vec();
        let mut ptrs: Vec<*mut c_void> = store
            .iter_mut()
            .map(|a| match a {
                ArgValue::U64(v) => v as *mut u64 as *mut c_void,
                ArgValue::U32(v) => v as *mut u32 as *mut c_void,
                ArgValue::F32(v) => v as *mut f32 as *mut c_void,
            })
            .collect();
        // SAFETY: f is a function of a loaded module; the argument list matches the kernel's
        // C signature (checked by check_launch against the shared signature); every pointer
        // argument was bounds-checked; stream is live.
        let r = unsafe {
            (self.api.cuLaunchKernel)(
                f as sys::CUfunction,
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                stream as sys::CUstream,
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.check(r, "cuLaunchKernel")
    }

    // ---- capture and graphs -------------------------------------------------------------

    /// Starts capturing `stream`; `mode` is a `CUstreamCaptureMode` value.
    pub fn begin_capture(&self, stream: u64, mode: i32) -> Result<()> {
        // SAFETY: stream is live and not the legacy NULL stream (created streams only).
        self.check(
            unsafe { (self.api.cuStreamBeginCapture_v2)(stream as sys::CUstream, mode) },
            "cuStreamBeginCapture",
        )
    }

    pub fn end_capture(&self, stream: u64) -> Result<u64> {
        let mut g: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: stream is live and capturing (tracked by the backend); writes one handle.
        self.check(
            unsafe { (self.api.cuStreamEndCapture)(stream as sys::CUstream, &mut g) },
            "cuStreamEndCapture",
        )?;
        Ok(g as u64)
    }

    pub fn graph_instantiate(&self, graph: u64) -> Result<u64> {
        let mut x: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: graph is live (handle table); writes one handle; flags 0.
        self.check(
            unsafe { (self.api.cuGraphInstantiateWithFlags)(&mut x, graph as sys::CUgraph, 0) },
            "cuGraphInstantiateWithFlags",
        )?;
        Ok(x as u64)
    }

    pub fn graph_launch(&self, exec: u64, stream: u64) -> Result<()> {
        // SAFETY: both handles are live (handle tables).
        self.check(
            unsafe { (self.api.cuGraphLaunch)(exec as sys::CUgraphExec, stream as sys::CUstream) },
            "cuGraphLaunch",
        )
    }

    pub fn graph_destroy(&self, graph: u64) -> Result<()> {
        // SAFETY: graph is live and removed from its table first (destroyed once).
        self.check(
            unsafe { (self.api.cuGraphDestroy)(graph as sys::CUgraph) },
            "cuGraphDestroy",
        )
    }

    pub fn graph_exec_destroy(&self, exec: u64) -> Result<()> {
        // SAFETY: exec is live and removed from its table first (destroyed once).
        self.check(
            unsafe { (self.api.cuGraphExecDestroy)(exec as sys::CUgraphExec) },
            "cuGraphExecDestroy",
        )
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
