//! Exported entry points: initialisation, errors, devices, contexts, modules.
//!
//! Every function has cuda.h's prototype (handles are pointers, `CUdevice` is `int`,
//! `CUresult` an `int`-sized enum) and runs through [`entry`].

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Arc;

use crate::capture::{unsafe_call, MODE_RELAXED};
use crate::control::misuse;
use crate::kernels::{parse_image, Function, Module, Twin};
use crate::result::*;
use crate::state::{self, code, put, with, with_ctx, Ctx, Handle, CURRENT, MODE};

/// The version this driver claims (CUDA 12.2).
const VERSION: c_int = 12020;

fn device_index(d: &state::Driver, dev: c_int) -> Result<usize, CUresult> {
    usize::try_from(dev)
        .ok()
        .filter(|&i| i < d.devices.len())
        .ok_or(INVALID_DEVICE)
}

/// `cuInit`: builds the driver from the environment; `CUDA_ERROR_NO_DEVICE` with 0 devices.
#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    entry("cuInit", || {
        if flags != 0 {
            return INVALID_VALUE;
        }
        state::init()
    })
}

/// `cuDriverGetVersion`: the version this driver claims (12.2).
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    // SAFETY: `v` is null or valid for a write (the caller's contract).
    entry("cuDriverGetVersion", || code(unsafe { put(v, VERSION) }))
}

/// `cuGetErrorName`: the `CUDA_ERROR_*` name of a code.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(r: CUresult, out: *mut *const c_char) -> CUresult {
    // SAFETY: `out` is null or valid for a write (the caller's contract).
    entry("cuGetErrorName", || unsafe { error_string(r, out, false) })
}

/// `cuGetErrorString`: the text of a code.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(r: CUresult, out: *mut *const c_char) -> CUresult {
    // SAFETY: `out` is null or valid for a write (the caller's contract).
    entry("cuGetErrorString", || unsafe { error_string(r, out, true) })
}

/// `cuDeviceGetCount`: the configured number of devices.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    entry("cuDeviceGetCount", || {
        code(with(|d| {
            // SAFETY: `n` is null or valid for a write (the caller's contract).
            unsafe { put(n, d.devices.len() as c_int) }
        }))
    })
}

/// `cuDeviceGet`: the device of an ordinal (the ordinal itself).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut c_int, ordinal: c_int) -> CUresult {
    entry("cuDeviceGet", || {
        code(with(|d| {
            let i = device_index(d, ordinal)?;
            // SAFETY: `dev` is null or valid for a write (the caller's contract).
            unsafe { put(dev, i as c_int) }
        }))
    })
}

/// `cuDeviceGetName`: the device's name, NUL-terminated and truncated to the buffer.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> CUresult {
    entry("cuDeviceGetName", || {
        code(with(|d| {
            let i = device_index(d, dev)?;
            if name.is_null() || len <= 0 {
                return Err(INVALID_VALUE);
            }
            let s = d.devices[i].name.as_bytes();
            let n = s.len().min(len as usize - 1);
            // SAFETY: `name` is valid for `len` bytes (the caller's contract); n + 1 <= len.
            unsafe {
                std::ptr::copy_nonoverlapping(s.as_ptr(), name as *mut u8, n);
                *name.add(n) = 0;
            }
            Ok(())
        }))
    })
}

/// `cuDeviceGetAttribute`: the attributes unirt reads; any other is `CUDA_ERROR_INVALID_VALUE`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, dev: c_int) -> CUresult {
    entry("cuDeviceGetAttribute", || {
        code(with(|d| {
            let i = device_index(d, dev)?;
            let cfg = &d.devices[i];
            let value = match attr {
                75 => (cfg.cc / 10) as c_int, // COMPUTE_CAPABILITY_MAJOR
                76 => (cfg.cc % 10) as c_int, // COMPUTE_CAPABILITY_MINOR
                16 => 4,                      // MULTIPROCESSOR_COUNT
                115 => cfg.pools as c_int,    // MEMORY_POOLS_SUPPORTED
                33 => 0x10 + i as c_int,      // PCI_BUS_ID
                34 | 50 => 0,                 // PCI_DEVICE_ID, PCI_DOMAIN_ID
                1 => 1024,                    // MAX_THREADS_PER_BLOCK
                41 => 1,                      // UNIFIED_ADDRESSING
                _ => return Err(INVALID_VALUE),
            };
            // SAFETY: `v` is null or valid for a write (the caller's contract).
            unsafe { put(v, value) }
        }))
    })
}

/// `cuDeviceTotalMem_v2`: the configured memory per device.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CUresult {
    entry("cuDeviceTotalMem_v2", || {
        code(with(|d| {
            let i = device_index(d, dev)?;
            // SAFETY: `bytes` is null or valid for a write (the caller's contract).
            unsafe { put(bytes, d.devices[i].memory as usize) }
        }))
    })
}

/// `cuDeviceCanAccessPeer`: peer access between two different devices is always possible.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(v: *mut c_int, dev: c_int, peer: c_int) -> CUresult {
    entry("cuDeviceCanAccessPeer", || {
        code(with(|d| {
            let (a, b) = (device_index(d, dev)?, device_index(d, peer)?);
            // SAFETY: `v` is null or valid for a write (the caller's contract).
            unsafe { put(v, (a != b) as c_int) }
        }))
    })
}

/// `cuDevicePrimaryCtxRetain`: the device's primary context, created at the first reference.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, dev: c_int) -> CUresult {
    entry("cuDevicePrimaryCtxRetain", || {
        code(with(|d| {
            let i = device_index(d, dev)?;
            if ctx.is_null() {
                return Err(INVALID_VALUE);
            }
            let h = match &mut d.primary[i] {
                Some((c, refs)) => {
                    *refs += 1;
                    c.handle
                }
                None => {
                    let h = d.new_handle();
                    let c = Arc::new(Ctx {
                        handle: h,
                        device: i,
                        sticky: 0.into(),
                    });
                    d.handles.insert(h, Handle::Ctx(c.clone()));
                    d.primary[i] = Some((c, 1));
                    h
                }
            };
            // SAFETY: non-null and valid for a write (the caller's contract).
            unsafe { put(ctx, h as usize as *mut c_void) }
        }))
    })
}

/// `cuDevicePrimaryCtxRelease_v2`: drops a reference; the last one drains and destroys the context.
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CUresult {
    entry("cuDevicePrimaryCtxRelease_v2", || {
        let dying = with(|d| {
            let i = device_index(d, dev)?;
            let (c, refs) = d.primary[i].as_mut().ok_or(INVALID_CONTEXT)?;
            *refs -= 1;
            if *refs > 0 {
                return Ok(None);
            }
            let c = c.clone();
            d.primary[i] = None;
            let streams = d.streams_of(c.handle);
            Ok(Some((c, streams)))
        });
        match dying {
            Err(e) => e,
            Ok(None) => SUCCESS,
            Ok(Some((c, streams))) => {
                // The last reference: queued work drains (outside the lock: workers take it),
                // then the context and everything in it go.
                for s in streams {
                    s.sync();
                }
                code(with(|d| {
                    d.destroy_ctx(&c);
                    d.handles.remove(&c.handle);
                    Ok(())
                }))
            }
        }
    })
}

/// `cuCtxSetCurrent`: the calling thread's current context (null: none).
#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CUresult {
    entry("cuCtxSetCurrent", || {
        let h = ctx as usize as u64;
        code(with(|d| {
            if h != 0 && d.ctx(h).is_none() {
                misuse(format!(
                    "cuCtxSetCurrent: unknown or destroyed context {h:#x}"
                ));
                return Err(INVALID_CONTEXT);
            }
            CURRENT.with(|c| c.set(h));
            Ok(())
        }))
    })
}

/// `cuCtxGetCurrent`: the calling thread's current context.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> CUresult {
    entry("cuCtxGetCurrent", || {
        let h = CURRENT.with(|c| c.get());
        // SAFETY: `ctx` is null or valid for a write (the caller's contract).
        code(unsafe { put(ctx, h as usize as *mut c_void) })
    })
}

/// `cuCtxSynchronize`: waits for every stream of the current context (a potentially unsafe call).
#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    entry("cuCtxSynchronize", || {
        let r = with_ctx(|d, ctx| {
            unsafe_call(d, "cuCtxSynchronize")?;
            Ok((d.streams_of(ctx.handle), ctx.clone()))
        });
        match r {
            Err(e) => e,
            Ok((streams, ctx)) => {
                for s in streams {
                    s.sync();
                }
                ctx.sticky().unwrap_or(SUCCESS)
            }
        }
    })
}

/// `cuCtxEnablePeerAccess`: records peer access from the current context to another device's.
#[no_mangle]
pub extern "C" fn cuCtxEnablePeerAccess(peer: *mut c_void, flags: c_uint) -> CUresult {
    entry("cuCtxEnablePeerAccess", || {
        code(with_ctx(|d, ctx| {
            let p = peer as usize as u64;
            let pc = d.ctx(p).ok_or(INVALID_VALUE)?;
            if flags != 0 || pc.device == ctx.device {
                return Err(INVALID_VALUE);
            }
            if d.peers.contains(&(ctx.handle, p)) {
                return Err(PEER_ACCESS_ALREADY_ENABLED);
            }
            d.peers.push((ctx.handle, p));
            Ok(())
        }))
    })
}

/// `cuMemGetInfo_v2`: free and total memory of the current context's device.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry("cuMemGetInfo_v2", || {
        code(with_ctx(|d, ctx| {
            let t = d.devices[ctx.device].memory;
            let f = t.saturating_sub(d.used[ctx.device]);
            // SAFETY: both are null or valid for a write (the caller's contract).
            unsafe {
                put(free, f as usize)?;
                put(total, t as usize)
            }
        }))
    })
}

/// `cuThreadExchangeStreamCaptureMode`: swaps the calling thread's capture interaction mode.
#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CUresult {
    entry("cuThreadExchangeStreamCaptureMode", || {
        if mode.is_null() {
            return INVALID_VALUE;
        }
        // SAFETY: non-null and valid for a read and a write (the caller's contract).
        let new = unsafe { *mode };
        if !(0..=MODE_RELAXED).contains(&new) {
            return INVALID_VALUE;
        }
        let old = MODE.with(|m| m.replace(new));
        // SAFETY: as above.
        unsafe { *mode = old };
        SUCCESS
    })
}

// ---- modules -------------------------------------------------------------------------------

/// `cuModuleLoadData`: checks a CUBIN or PTX image and lists its kernels (a potentially unsafe call).
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(
    module: *mut *mut c_void,
    image: *const c_void,
) -> CUresult {
    entry("cuModuleLoadData", || {
        code(with_ctx(|d, ctx| {
            if module.is_null() {
                return Err(INVALID_VALUE);
            }
            unsafe_call(d, "cuModuleLoadData")?;
            // SAFETY: `image` is a complete image (the caller's contract).
            let kernels = unsafe { parse_image(image) }?;
            let h = d.new_handle();
            d.handles.insert(
                h,
                Handle::Module(Arc::new(Module {
                    handle: h,
                    ctx: ctx.handle,
                    kernels,
                })),
            );
            // SAFETY: non-null and valid for a write (the caller's contract).
            unsafe { put(module, h as usize as *mut c_void) }
        }))
    })
}

/// `cuModuleGetFunction`: a kernel of a loaded module that has a CPU twin.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut *mut c_void,
    module: *mut c_void,
    name: *const c_char,
) -> CUresult {
    entry("cuModuleGetFunction", || {
        code(with_ctx(|d, _| {
            if f.is_null() || name.is_null() {
                return Err(INVALID_VALUE);
            }
            let m = match d.handles.get(&(module as usize as u64)) {
                Some(Handle::Module(m)) => m.clone(),
                _ => {
                    misuse(format!("cuModuleGetFunction: unknown module {module:p}"));
                    return Err(INVALID_HANDLE);
                }
            };
            // SAFETY: NUL-terminated (the caller's contract).
            let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
            if !m.kernels.iter().any(|k| *k == name) {
                return Err(NOT_FOUND);
            }
            let Some(twin) = Twin::by_name(&name) else {
                // Once per kernel name: fuzzers plan the same operators thousands of times.
                static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
                if let Ok(mut said) = SAID.lock() {
                    if !said.iter().any(|s| *s == name) {
                        eprintln!(
                            "unirt-fakecuda: kernel {name} has no CPU twin; it needs a real GPU"
                        );
                        said.push(name.to_string());
                    }
                }
                return Err(NOT_SUPPORTED);
            };
            let h = d.new_handle();
            d.handles.insert(
                h,
                Handle::Function(Arc::new(Function {
                    handle: h,
                    ctx: m.ctx,
                    module: m.handle,
                    twin,
                })),
            );
            // SAFETY: non-null and valid for a write (the caller's contract).
            unsafe { put(f, h as usize as *mut c_void) }
        }))
    })
}

/// `cuModuleUnload`: unloads a module and its functions (a potentially unsafe call).
#[no_mangle]
pub extern "C" fn cuModuleUnload(module: *mut c_void) -> CUresult {
    entry("cuModuleUnload", || {
        code(with_ctx(|d, _| {
            let h = module as usize as u64;
            if !matches!(d.handles.get(&h), Some(Handle::Module(_))) {
                misuse(format!("cuModuleUnload: unknown module {h:#x}"));
                return Err(INVALID_HANDLE);
            }
            unsafe_call(d, "cuModuleUnload")?;
            d.handles.remove(&h);
            d.handles
                .retain(|_, v| !matches!(v, Handle::Function(f) if f.module == h));
            Ok(())
        }))
    })
}
