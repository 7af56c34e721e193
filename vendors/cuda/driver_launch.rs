//! The lowest layer, continued: libcuda's module, launch, capture and graph calls.
//!
//! Every function here is a thin typed wrapper over one libcuda call; what makes each call
//! sound (live handles, a matching argument list) is checked by the backend above before it
//! gets here, and each `SAFETY` comment says which check it relies on.

use std::ffi::{c_char, c_void, CString};

use cudarc::driver::sys;

use super::driver::Driver;
use crate::error::{Error, Result};

/// A kernel argument value, stored so that `cuLaunchKernel` can read it through a pointer.
#[derive(Debug, Clone, Copy)]
pub enum ArgValue {
    U64(u64),
    U32(u32),
    F32(f32),
}

impl Driver {
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
        let r = self.relaxed(|| {
            Ok(unsafe { (self.api.cuModuleLoadData)(&mut m, data.as_ptr() as *const c_void) })
        })?;
        self.check(r, "cuModuleLoadData")?;
        Ok(m as u64)
    }

    /// # Safety
    /// `module` is a loaded module of the current context that has not been unloaded.
    pub unsafe fn module_function(&self, module: u64, name: &str) -> Result<u64> {
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

    /// # Safety
    /// `module` is loaded and unloaded only once, after its last launch has completed.
    pub unsafe fn module_unload(&self, module: u64) -> Result<()> {
        // SAFETY: module is live and unloaded once (at backend teardown).
        self.relaxed(|| {
            self.check(
                unsafe { (self.api.cuModuleUnload)(module as sys::CUmodule) },
                "cuModuleUnload",
            )
        })
    }

    /// Enqueues `f` on `stream` with a 1-D grid.
    ///
    /// # Safety
    /// `f` is a function of a loaded module; `args` match its C signature (checked against the
    /// kernel table); every pointer argument is a bounds-checked device range that stays
    /// allocated until the kernel has run; `stream` is live.
    pub unsafe fn launch(
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

    /// Enqueues an op kernel: `ptrs` are its pointer parameters, then one by-value struct
    /// whose fields are the 64-bit words `args` (no struct when `args` is empty).
    ///
    /// # Safety
    /// `f` is a function of a loaded module whose C signature is exactly those pointers and a
    /// struct of `args.len()` 64-bit fields; every pointer is a bounds-checked device address
    /// that stays allocated until the kernel has run; `stream` is live.
    pub unsafe fn launch_op(
        &self,
        f: u64,
        grid: [u32; 3],
        block: [u32; 3],
        ptrs: &[u64],
        args: &[i64],
        stream: u64,
    ) -> Result<()> {
        // On the stack: a launch allocates nothing on the host either.
        const MAX_PTRS: usize = 8;
        if ptrs.len() > MAX_PTRS {
            return Err(Error::BadParam(format!(
                "an op kernel with {} pointer parameters (at most {MAX_PTRS})",
                ptrs.len()
            )));
        }
        let mut values = [0u64; MAX_PTRS];
        values[..ptrs.len()].copy_from_slice(ptrs);
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_PTRS + 1];
        for (slot, v) in params.iter_mut().zip(values.iter_mut()).take(ptrs.len()) {
            *slot = v as *mut u64 as *mut c_void;
        }
        if !args.is_empty() {
            // The driver copies the struct's bytes (the kernel's parameter size) from here.
            params[ptrs.len()] = args.as_ptr() as *mut c_void;
        }
        // SAFETY: the caller's contract: a live function, parameters matching its signature
        // (each read through its pointer during the call, which `values` and `args` outlive),
        // checked device ranges, a live stream.
        let r = unsafe {
            (self.api.cuLaunchKernel)(
                f as sys::CUfunction,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                0,
                stream as sys::CUstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.check(r, "cuLaunchKernel")
    }

    // ---- capture and graphs -------------------------------------------------------------

    /// Starts capturing `stream`; `mode` is a `CUstreamCaptureMode` value.
    ///
    /// # Safety
    /// `stream` is a live created stream (not the legacy NULL stream) that is not capturing.
    pub unsafe fn begin_capture(&self, stream: u64, mode: i32) -> Result<()> {
        // SAFETY: stream is live and not the legacy NULL stream (created streams only).
        self.check(
            unsafe { (self.api.cuStreamBeginCapture_v2)(stream as sys::CUstream, mode) },
            "cuStreamBeginCapture",
        )
    }

    /// # Safety
    /// `stream` is a live stream that this backend put into capture.
    pub unsafe fn end_capture(&self, stream: u64) -> Result<u64> {
        let mut g: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: stream is live and capturing (tracked by the backend); writes one handle.
        self.check(
            unsafe { (self.api.cuStreamEndCapture)(stream as sys::CUstream, &mut g) },
            "cuStreamEndCapture",
        )?;
        Ok(g as u64)
    }

    /// # Safety
    /// `graph` is a live graph (validated through the handle table).
    pub unsafe fn graph_instantiate(&self, graph: u64) -> Result<u64> {
        let mut x: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: graph is live (handle table); writes one handle; flags 0.
        self.check(
            unsafe { (self.api.cuGraphInstantiateWithFlags)(&mut x, graph as sys::CUgraph, 0) },
            "cuGraphInstantiateWithFlags",
        )?;
        Ok(x as u64)
    }

    /// # Safety
    /// `exec` and `stream` are live (validated through the handle tables), and every range the
    /// graph touches is still allocated.
    pub unsafe fn graph_launch(&self, exec: u64, stream: u64) -> Result<()> {
        // SAFETY: both handles are live (handle tables).
        self.check(
            unsafe { (self.api.cuGraphLaunch)(exec as sys::CUgraphExec, stream as sys::CUstream) },
            "cuGraphLaunch",
        )
    }

    /// # Safety
    /// `graph` is live and already removed from its handle table (destroyed once).
    pub unsafe fn graph_destroy(&self, graph: u64) -> Result<()> {
        // SAFETY: graph is live and removed from its table first (destroyed once).
        self.check(
            unsafe { (self.api.cuGraphDestroy)(graph as sys::CUgraph) },
            "cuGraphDestroy",
        )
    }

    /// # Safety
    /// `exec` is live and already removed from its handle table (destroyed once).
    pub unsafe fn graph_exec_destroy(&self, exec: u64) -> Result<()> {
        // SAFETY: exec is live and removed from its table first (destroyed once).
        self.check(
            unsafe { (self.api.cuGraphExecDestroy)(exec as sys::CUgraphExec) },
            "cuGraphExecDestroy",
        )
    }
}
