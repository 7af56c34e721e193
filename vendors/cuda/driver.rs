//! The lowest layer of the CUDA backend: libcuda's entry points, loaded by us, called here.
//!
//! Every `unsafe` of the CUDA driver API lives in this file. The symbols are resolved once from
//! the library [`loader`] found (so a missing symbol is an error, not cudarc's
//! panic) and typed with cudarc's `driver::sys` handle types. Results are declared as plain
//! `i32`: a driver newer than the bindings may return codes no Rust enum lists, and receiving
//! an unknown value into a `#[repr(u32)] enum` would be undefined behaviour.
//!
//! Handles cross this layer as `u64` (the numeric value of the native pointer), which is what
//! the HAL's `StreamId` / `EventId` / `GraphId` / `GraphExecId` hold.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::driver::sys;
use libloading::Library;

use super::loader;
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::fork::Epoch;

/// The most devices one driver is believed: a larger count is a driver fault, reported as
/// such, never a reason to allocate per device (a driver answering INT_MAX once made discovery
/// ask for 326 GB). Far above any machine (NVIDIA's largest systems have tens per node).
pub const MAX_DEVICES: usize = 1024;

/// A raw `CUresult`.
pub type CuResult = i32;

pub const SUCCESS: CuResult = sys::CUresult::CUDA_SUCCESS as i32;
pub const OUT_OF_MEMORY: CuResult = sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY as i32;
pub const INVALID_VALUE: CuResult = sys::CUresult::CUDA_ERROR_INVALID_VALUE as i32;
pub const NO_DEVICE: CuResult = sys::CUresult::CUDA_ERROR_NO_DEVICE as i32;
pub const NOT_READY: CuResult = sys::CUresult::CUDA_ERROR_NOT_READY as i32;
pub const PEER_ALREADY_ENABLED: CuResult =
    sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED as i32;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: c_int = 2;
const CAPTURE_ERRORS: std::ops::RangeInclusive<CuResult> =
    (sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED as i32)
        ..=(sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD as i32);

macro_rules! cuda_api {
    ($($name:ident($($ty:ty),*);)*) => {
        /// libcuda's entry points that unirt uses, resolved once.
        #[allow(non_snake_case)]
        pub struct Api {
            $( pub(super) $name: unsafe extern "C" fn($($ty),*) -> CuResult, )*
        }

        impl Api {
            fn load(lib: &Library) -> std::result::Result<Api, String> {
                Ok(Api {
                    $( $name: {
                        // SAFETY: the declared type is cuda.h's prototype for this symbol (the
                        // same as cudarc's `driver::sys` binding, with CUresult as i32); the
                        // pointer is only used while the `Library` lives (both are 'static).
                        let sym = unsafe {
                            lib.get::<unsafe extern "C" fn($($ty),*) -> CuResult>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                        };
                        *sym.map_err(|e| format!("it lacks {} ({e})", stringify!($name)))?
                    }, )*
                })
            }
        }
    };
}

cuda_api! {
    cuInit(c_uint);
    cuDriverGetVersion(*mut c_int);
    cuGetErrorName(CuResult, *mut *const c_char);
    cuGetErrorString(CuResult, *mut *const c_char);
    cuDeviceGetCount(*mut c_int);
    cuDeviceGet(*mut sys::CUdevice, c_int);
    cuDeviceGetName(*mut c_char, c_int, sys::CUdevice);
    cuDeviceGetAttribute(*mut c_int, c_int, sys::CUdevice);
    cuDeviceTotalMem_v2(*mut usize, sys::CUdevice);
    cuDeviceCanAccessPeer(*mut c_int, sys::CUdevice, sys::CUdevice);
    cuDevicePrimaryCtxRetain(*mut sys::CUcontext, sys::CUdevice);
    cuDevicePrimaryCtxRelease_v2(sys::CUdevice);
    cuCtxSetCurrent(sys::CUcontext);
    cuCtxSynchronize();
    cuCtxEnablePeerAccess(sys::CUcontext, c_uint);
    cuMemGetInfo_v2(*mut usize, *mut usize);
    cuStreamCreate(*mut sys::CUstream, c_uint);
    cuStreamDestroy_v2(sys::CUstream);
    cuStreamSynchronize(sys::CUstream);
    cuStreamWaitEvent(sys::CUstream, sys::CUevent, c_uint);
    cuEventCreate(*mut sys::CUevent, c_uint);
    cuEventRecord(sys::CUevent, sys::CUstream);
    cuEventRecordWithFlags(sys::CUevent, sys::CUstream, c_uint);
    cuEventQuery(sys::CUevent);
    cuEventSynchronize(sys::CUevent);
    cuEventElapsedTime(*mut f32, sys::CUevent, sys::CUevent);
    cuEventDestroy_v2(sys::CUevent);
    cuMemAlloc_v2(*mut sys::CUdeviceptr, usize);
    cuMemFree_v2(sys::CUdeviceptr);
    cuMemAllocHost_v2(*mut *mut c_void, usize);
    cuMemFreeHost(*mut c_void);
    cuMemAllocAsync(*mut sys::CUdeviceptr, usize, sys::CUstream);
    cuMemFreeAsync(sys::CUdeviceptr, sys::CUstream);
    cuMemcpyAsync(sys::CUdeviceptr, sys::CUdeviceptr, usize, sys::CUstream);
    cuMemcpyHtoDAsync_v2(sys::CUdeviceptr, *const c_void, usize, sys::CUstream);
    cuMemcpyDtoHAsync_v2(*mut c_void, sys::CUdeviceptr, usize, sys::CUstream);
    cuMemcpyDtoDAsync_v2(sys::CUdeviceptr, sys::CUdeviceptr, usize, sys::CUstream);
    cuMemcpyPeerAsync(sys::CUdeviceptr, sys::CUcontext, sys::CUdeviceptr, sys::CUcontext, usize, sys::CUstream);
    cuMemsetD8Async(sys::CUdeviceptr, u8, usize, sys::CUstream);
    cuModuleLoadData(*mut sys::CUmodule, *const c_void);
    cuModuleGetFunction(*mut sys::CUfunction, sys::CUmodule, *const c_char);
    cuModuleUnload(sys::CUmodule);
    cuLaunchKernel(sys::CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, sys::CUstream, *mut *mut c_void, *mut *mut c_void);
    cuStreamBeginCapture_v2(sys::CUstream, c_int);
    cuStreamEndCapture(sys::CUstream, *mut sys::CUgraph);
    cuGraphInstantiateWithFlags(*mut sys::CUgraphExec, sys::CUgraph, u64);
    cuGraphLaunch(sys::CUgraphExec, sys::CUstream);
    cuGraphDestroy(sys::CUgraph);
    cuGraphExecDestroy(sys::CUgraphExec);
    cuThreadExchangeStreamCaptureMode(*mut c_int);
}

/// The loaded driver: the library, its entry points and its version.
pub struct Driver {
    pub(super) api: Api,
    /// Where libcuda was loaded from.
    pub path: PathBuf,
    /// `cuDriverGetVersion`, e.g. 12020.
    pub version: i32,
    /// What `cuInit(0)` answered.
    pub init: CuResult,
    /// The process image that called `cuInit`: CUDA cannot be used across a fork after it.
    born: Epoch,
    _lib: Library,
}

/// `12020` → `"12.2"`.
pub fn version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The process's libcuda, loaded and initialised once; `Err` is the reason it is unusable.
/// In a child forked after the parent initialised CUDA, that is the reason.
pub fn driver() -> std::result::Result<&'static Driver, String> {
    static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();
    let drv = DRIVER.get_or_init(load).as_ref().map_err(Clone::clone)?;
    if !drv.born.is_current() {
        return Err(format!(
            "libcuda {} was initialised (cuInit) before this process was forked, and CUDA \
             cannot be used in a forked child; start worker processes with spawn/exec instead \
             (Python: multiprocessing.set_start_method(\"spawn\")) ({})",
            version_string(drv.version),
            drv.path.display()
        ));
    }
    Ok(drv)
}

fn load() -> std::result::Result<Driver, String> {
    let search = loader::find_libcuda();
    let (lib, path) = loader::open_first("libcuda", &search)?;
    let api = Api::load(&lib).map_err(|e| {
        format!(
            "libcuda at {} is too old or not NVIDIA's: {e} (unirt needs a CUDA 11.4+ driver)",
            path.display()
        )
    })?;
    let mut version: c_int = 0;
    // SAFETY: cuDriverGetVersion writes one int through a valid pointer; it needs no cuInit.
    let r = unsafe { (api.cuDriverGetVersion)(&mut version) };
    if r != SUCCESS {
        version = 0;
    }
    let born = Epoch::now();
    // SAFETY: cuInit(0) has no preconditions and is safe to call from any thread, repeatedly.
    let init = unsafe { (api.cuInit)(0) };
    Ok(Driver {
        api,
        path,
        version,
        init,
        born,
        _lib: lib,
    })
}

fn cstr(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the driver returns pointers to static NUL-terminated strings.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Device attributes unirt reads.
pub mod attr {
    use cudarc::driver::sys::CUdevice_attribute as A;
    pub const CC_MAJOR: i32 = A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as i32;
    pub const CC_MINOR: i32 = A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as i32;
    pub const SM_COUNT: i32 = A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as i32;
    pub const INTEGRATED: i32 = A::CU_DEVICE_ATTRIBUTE_INTEGRATED as i32;
    pub const MEMORY_POOLS: i32 = A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED as i32;
    pub const PCI_BUS: i32 = A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID as i32;
    pub const PCI_DEVICE: i32 = A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID as i32;
    pub const PCI_DOMAIN: i32 = A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID as i32;
}

/// `CU_STREAM_NON_BLOCKING`: no implicit synchronisation with the legacy NULL stream.
const STREAM_NON_BLOCKING: c_uint = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;

impl Driver {
    /// "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)".
    pub fn describe(&self, r: CuResult) -> String {
        let (mut name, mut text) = (std::ptr::null(), std::ptr::null());
        // SAFETY: both calls only write a static string pointer through valid out-pointers and
        // return an error (leaving the pointer null) for codes they do not know.
        unsafe {
            (self.api.cuGetErrorName)(r, &mut name);
            (self.api.cuGetErrorString)(r, &mut text);
        }
        match (cstr(name), cstr(text)) {
            (Some(n), Some(t)) => format!("{n} ({t})"),
            (Some(n), None) => n,
            _ => format!("CUresult {r}"),
        }
    }

    /// The error for a failed call: capture misuse is [`Error::Capturing`], a pending event
    /// [`Error::NotReady`], anything else [`Error::Driver`].
    pub fn error(&self, r: CuResult, call: &str) -> Error {
        let message = self.describe(r);
        if CAPTURE_ERRORS.contains(&r) {
            Error::Capturing(format!("{call}: {message}"))
        } else if r == NOT_READY {
            Error::NotReady(format!("{call}: {message}"))
        } else {
            Error::Driver {
                backend: DeviceKind::Cuda,
                call: call.into(),
                code: Some(r),
                message,
            }
        }
    }

    pub(super) fn check(&self, r: CuResult, call: &str) -> Result<()> {
        if r == SUCCESS {
            Ok(())
        } else {
            Err(self.error(r, call))
        }
    }

    // ---- devices and contexts -----------------------------------------------------------

    pub fn device_count(&self) -> Result<usize> {
        let mut n: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check(
            unsafe { (self.api.cuDeviceGetCount)(&mut n) },
            "cuDeviceGetCount",
        )?;
        let n = usize::try_from(n).unwrap_or(0);
        if n > MAX_DEVICES {
            return Err(Error::Driver {
                backend: DeviceKind::Cuda,
                call: "cuDeviceGetCount".into(),
                code: None,
                message: format!(
                    "reported {n} devices, more than the {MAX_DEVICES} unirt believes of one \
                     driver (a driver fault)"
                ),
            });
        }
        Ok(n)
    }

    pub fn device(&self, index: usize) -> Result<sys::CUdevice> {
        let ordinal =
            c_int::try_from(index).map_err(|_| Error::DeviceNotFound(format!("cuda:{index}")))?;
        let mut d: sys::CUdevice = 0;
        // SAFETY: writes one CUdevice through a valid pointer; a bad ordinal is an error code.
        self.check(
            unsafe { (self.api.cuDeviceGet)(&mut d, ordinal) },
            "cuDeviceGet",
        )?;
        Ok(d)
    }

    pub fn device_name(&self, d: sys::CUdevice) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL-terminated, into the buffer.
        self.check(
            unsafe { (self.api.cuDeviceGetName)(buf.as_mut_ptr(), buf.len() as c_int, d) },
            "cuDeviceGetName",
        )?;
        buf[buf.len() - 1] = 0;
        Ok(cstr(buf.as_ptr()).unwrap_or_default())
    }

    pub fn attribute(&self, d: sys::CUdevice, a: i32) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: writes one int; an attribute this driver does not know is an error code.
        self.check(
            unsafe { (self.api.cuDeviceGetAttribute)(&mut v, a, d) },
            "cuDeviceGetAttribute",
        )?;
        Ok(v)
    }

    pub fn total_mem(&self, d: sys::CUdevice) -> Result<u64> {
        let mut v: usize = 0;
        // SAFETY: writes one size_t through a valid pointer.
        self.check(
            unsafe { (self.api.cuDeviceTotalMem_v2)(&mut v, d) },
            "cuDeviceTotalMem",
        )?;
        Ok(v as u64)
    }

    pub fn can_access_peer(&self, d: sys::CUdevice, peer: sys::CUdevice) -> Result<bool> {
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check(
            unsafe { (self.api.cuDeviceCanAccessPeer)(&mut v, d, peer) },
            "cuDeviceCanAccessPeer",
        )?;
        Ok(v != 0)
    }

    /// Retains the device's primary context (the one the CUDA runtime and cudarc share).
    pub fn primary_ctx_retain(&self, d: sys::CUdevice) -> Result<u64> {
        let mut c: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle through a valid pointer.
        self.check(
            unsafe { (self.api.cuDevicePrimaryCtxRetain)(&mut c, d) },
            "cuDevicePrimaryCtxRetain",
        )?;
        Ok(c as u64)
    }

    /// # Safety
    /// Balanced with one earlier successful `primary_ctx_retain` of `d` by the caller.
    pub unsafe fn primary_ctx_release(&self, d: sys::CUdevice) -> Result<()> {
        // SAFETY: balanced with one successful retain by the caller.
        self.check(
            unsafe { (self.api.cuDevicePrimaryCtxRelease_v2)(d) },
            "cuDevicePrimaryCtxRelease",
        )
    }

    /// Makes `ctx` current on the calling thread (cheap: a thread-local store in the driver).
    ///
    /// In a forked child this is [`Error::Forked`]: every CUDA call of a backend binds its
    /// context first, so none reaches a driver the fork left unusable.
    ///
    /// # Safety
    /// `ctx` is a primary context this process retained and has not released.
    pub unsafe fn set_current(&self, ctx: u64) -> Result<()> {
        self.born.check("the CUDA context")?;
        // SAFETY: ctx is a primary context this process retained and has not released.
        self.check(
            unsafe { (self.api.cuCtxSetCurrent)(ctx as sys::CUcontext) },
            "cuCtxSetCurrent",
        )
    }

    /// Runs `f` with the calling thread's stream-capture interaction mode set to Relaxed, then
    /// restores the mode the thread had (also if `f` panics).
    ///
    /// unirt's own bookkeeping calls — allocating and freeing device and pinned memory, loading
    /// modules, waiting for the device, a stream or an event, querying an event, copies to or
    /// from pageable host memory — are what CUDA calls "potentially unsafe" during a capture:
    /// in the default (Global) mode such a call from *any* thread invalidates every Global
    /// capture in the process, so one thread allocating would break another thread's graph.
    /// None of these calls is ever part of a capture (unirt never lets a capture depend on an
    /// allocation made inside it being repeated at replay; freed ranges are refused at replay
    /// by the allocation table), so they run Relaxed — the rule PyTorch's caching allocator
    /// follows for `cudaMalloc` during capture. Work enqueued on a capturing stream is captured
    /// as before.
    pub(super) fn relaxed<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        struct Restore<'a>(&'a Driver, c_int);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                let mut mode = self.1;
                // SAFETY: writes and reads one CUstreamCaptureMode through a valid pointer;
                // the value is the mode this thread had before `relaxed` changed it.
                let _ = unsafe { (self.0.api.cuThreadExchangeStreamCaptureMode)(&mut mode) };
            }
        }
        let mut mode: c_int = CAPTURE_MODE_RELAXED;
        // SAFETY: writes and reads one CUstreamCaptureMode through a valid pointer; only the
        // calling thread's mode changes.
        let r = unsafe { (self.api.cuThreadExchangeStreamCaptureMode)(&mut mode) };
        self.check(r, "cuThreadExchangeStreamCaptureMode")?;
        let _restore = Restore(self, mode);
        f()
    }

    /// Waits for all work in the current context.
    pub fn ctx_synchronize(&self) -> Result<()> {
        // SAFETY: no arguments; acts on the current context.
        self.relaxed(|| self.check(unsafe { (self.api.cuCtxSynchronize)() }, "cuCtxSynchronize"))
    }

    /// Lets the current context access `peer`'s memory directly (already enabled is fine).
    ///
    /// # Safety
    /// `peer` is a live, retained context of another device.
    pub unsafe fn enable_peer_access(&self, peer: u64) -> Result<()> {
        // SAFETY: peer is a live retained context; flags must be 0.
        let r = unsafe { (self.api.cuCtxEnablePeerAccess)(peer as sys::CUcontext, 0) };
        if r == PEER_ALREADY_ENABLED {
            return Ok(());
        }
        self.check(r, "cuCtxEnablePeerAccess")
    }

    /// (free, total) of the current context's device.
    pub fn mem_get_info(&self) -> Result<(u64, u64)> {
        let (mut f, mut t) = (0usize, 0usize);
        // SAFETY: writes two size_t through valid pointers.
        self.check(
            unsafe { (self.api.cuMemGetInfo_v2)(&mut f, &mut t) },
            "cuMemGetInfo",
        )?;
        Ok((f as u64, t as u64))
    }

    // ---- streams, events ----------------------------------------------------------------

    /// A non-blocking stream in the current context.
    pub fn stream_create(&self) -> Result<u64> {
        self.stream_create_with_flags(STREAM_NON_BLOCKING)
    }

    /// A blocking stream (`CU_STREAM_DEFAULT`): it synchronises with the legacy NULL stream.
    pub fn stream_create_blocking(&self) -> Result<u64> {
        self.stream_create_with_flags(0)
    }

    fn stream_create_with_flags(&self, flags: c_uint) -> Result<u64> {
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: writes one stream handle through a valid pointer.
        self.check(
            unsafe { (self.api.cuStreamCreate)(&mut s, flags) },
            "cuStreamCreate",
        )?;
        Ok(s as u64)
    }

    /// # Safety
    /// `s` is a live stream from `stream_create*`, already removed from the backend's handle
    /// table (so it is destroyed once).
    pub unsafe fn stream_destroy(&self, s: u64) -> Result<()> {
        // SAFETY: s is a live stream created by stream_create; the caller drops it from its
        // handle table first, so it is destroyed once.
        self.check(
            unsafe { (self.api.cuStreamDestroy_v2)(s as sys::CUstream) },
            "cuStreamDestroy",
        )
    }

    /// # Safety
    /// `s` is a live stream of the current context (validated through the handle table).
    pub unsafe fn stream_synchronize(&self, s: u64) -> Result<()> {
        // Relaxed: during another stream's Global capture (or this thread's ThreadLocal one)
        // CUDA refuses or invalidates a synchronisation of a stream that is not capturing (seen
        // on an H100); the capturing stream itself is refused by unirt before this call.
        // SAFETY: s is a live stream (validated through the handle table).
        self.relaxed(|| {
            self.check(
                unsafe { (self.api.cuStreamSynchronize)(s as sys::CUstream) },
                "cuStreamSynchronize",
            )
        })
    }

    /// Makes `s` wait for `e`'s latest record. Inside a capture the wait becomes an
    /// event-wait node (`CU_EVENT_WAIT_EXTERNAL`): each replay waits for the event's record
    /// at that time, matching how captured records are external nodes too.
    ///
    /// # Safety
    /// `s` and `e` are live handles of the current context (validated through the handle
    /// tables).
    pub unsafe fn stream_wait_event(&self, s: u64, e: u64, capturing: bool) -> Result<()> {
        let flags = if capturing {
            sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as c_uint
        } else {
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT as c_uint
        };
        // SAFETY: both handles are live (validated by the caller).
        self.check(
            unsafe { (self.api.cuStreamWaitEvent)(s as sys::CUstream, e as sys::CUevent, flags) },
            "cuStreamWaitEvent",
        )
    }

    /// An event with raw `CU_EVENT_*` flags (0 = timing enabled, unlike cudarc's default).
    pub fn event_create(&self, flags: u32) -> Result<u64> {
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: writes one event handle through a valid pointer.
        self.check(
            unsafe { (self.api.cuEventCreate)(&mut e, flags) },
            "cuEventCreate",
        )?;
        Ok(e as u64)
    }

    /// Records `e` on `s`. Inside a capture the record becomes an event-record node of the
    /// graph (`CU_EVENT_RECORD_EXTERNAL`), so each replay records the event, as unirt's
    /// capture semantics say; a plain record would only mark a point inside the capture and
    /// leave the event unusable outside it.
    ///
    /// # Safety
    /// `e` and `s` are live handles of the current context (validated through the handle
    /// tables).
    pub unsafe fn event_record(&self, e: u64, s: u64, capturing: bool) -> Result<()> {
        let r = if capturing {
            let flags = sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as c_uint;
            // SAFETY: both handles are live (validated by the caller).
            unsafe {
                (self.api.cuEventRecordWithFlags)(e as sys::CUevent, s as sys::CUstream, flags)
            }
        } else {
            // SAFETY: both handles are live (validated by the caller).
            unsafe { (self.api.cuEventRecord)(e as sys::CUevent, s as sys::CUstream) }
        };
        self.check(r, "cuEventRecord")
    }

    /// `true` when complete.
    ///
    /// # Safety
    /// `e` is a live event (validated through the handle table).
    pub unsafe fn event_query(&self, e: u64) -> Result<bool> {
        // Relaxed, as stream_synchronize; events recorded inside a capture are refused by
        // unirt before this call.
        // SAFETY: e is a live event.
        let r = self.relaxed(|| Ok(unsafe { (self.api.cuEventQuery)(e as sys::CUevent) }))?;
        match r {
            SUCCESS => Ok(true),
            NOT_READY => Ok(false),
            _ => Err(self.error(r, "cuEventQuery")),
        }
    }

    /// # Safety
    /// `e` is a live event (validated through the handle table).
    pub unsafe fn event_synchronize(&self, e: u64) -> Result<()> {
        // Relaxed, as stream_synchronize.
        // SAFETY: e is a live event.
        self.relaxed(|| {
            self.check(
                unsafe { (self.api.cuEventSynchronize)(e as sys::CUevent) },
                "cuEventSynchronize",
            )
        })
    }

    /// # Safety
    /// `a` and `b` are live events (validated through the handle table).
    pub unsafe fn event_elapsed(&self, a: u64, b: u64) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: both events are live; writes one float.
        self.check(
            unsafe { (self.api.cuEventElapsedTime)(&mut ms, a as sys::CUevent, b as sys::CUevent) },
            "cuEventElapsedTime",
        )?;
        Ok(ms)
    }

    /// # Safety
    /// `e` is a live event, already removed from the handle table (destroyed once).
    pub unsafe fn event_destroy(&self, e: u64) -> Result<()> {
        // SAFETY: e is live and removed from the handle table before this call (destroyed once).
        self.check(
            unsafe { (self.api.cuEventDestroy_v2)(e as sys::CUevent) },
            "cuEventDestroy",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_keeps_the_cuda_result_code() {
        let Ok(drv) = driver() else {
            eprintln!("libcuda cannot be loaded here: only the code-less paths are checked");
            assert_eq!(Error::NotCapturing.driver_code(), None);
            return;
        };
        let e = drv.error(INVALID_VALUE, "cuMemAlloc");
        assert_eq!(e.driver_code(), Some(INVALID_VALUE));
        match &e {
            Error::Driver {
                backend,
                call,
                code,
                message,
            } => {
                assert_eq!(*backend, DeviceKind::Cuda);
                assert_eq!(call, "cuMemAlloc");
                assert_eq!(*code, Some(1));
                assert!(message.contains("CUDA_ERROR_INVALID_VALUE"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Codes with a meaning of their own keep their own variants.
        assert_eq!(
            drv.error(NOT_READY, "cuEventQuery").kind_name(),
            "not_ready"
        );
        let capture = sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED as i32;
        assert_eq!(
            drv.error(capture, "cuLaunchKernel").kind_name(),
            "capturing"
        );
        // A code no header lists still travels.
        assert_eq!(drv.error(987_654, "cuFoo").driver_code(), Some(987_654));
    }
}
