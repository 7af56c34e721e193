//! Exported entry points: memory, copies, sets.
//!
//! Copies and sets validate their device ranges when called (a range outside every live
//! allocation is `CUDA_ERROR_INVALID_VALUE`, as CUDA answers) and resolve them again when
//! they run (memory freed in between is a device fault: `CUDA_ERROR_ILLEGAL_ADDRESS`, sticky).

use std::ffi::c_void;
use std::sync::Arc;

use crate::capture::{finish, submit, target, unsafe_call, Pending, Target};
use crate::exec::{Loc, Op};
use crate::result::*;
use crate::state::{self, put, with, with_ctx, Ctx, Driver};

/// Waits for every stream of `ctx` (every context when `None`), outside the driver lock.
fn drain(ctx: Option<u64>) {
    let streams = {
        let g = state::lock();
        match g.as_ref() {
            Some(d) => d
                .handles
                .values()
                .filter_map(|h| match h {
                    state::Handle::Stream(s) if ctx.is_none_or(|c| s.ctx.handle == c) => {
                        Some(s.clone())
                    }
                    _ => None,
                })
                .collect(),
            None => Vec::new(),
        }
    };
    for s in streams {
        s.sync();
    }
}

/// `cuMemAlloc_v2`: device memory in the current context (a potentially unsafe call).
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(p: *mut u64, bytes: usize) -> CUresult {
    entry("cuMemAlloc_v2", || {
        code_of(with_ctx(|d, ctx| {
            if p.is_null() {
                return Err(INVALID_VALUE);
            }
            unsafe_call(d, "cuMemAlloc")?;
            let a = d.alloc(ctx, bytes as u64)?;
            // SAFETY: non-null and valid for a write (the caller's contract).
            unsafe { put(p, a) }
        }))
    })
}

/// `cuMemFree_v2`: waits for the context's streams, then frees (a potentially unsafe call).
#[no_mangle]
pub extern "C" fn cuMemFree_v2(p: u64) -> CUresult {
    entry("cuMemFree_v2", || {
        let r = with_ctx(|d, ctx| {
            if !d.mem.contains_key(&p) {
                return Err(INVALID_VALUE);
            }
            unsafe_call(d, "cuMemFree")?;
            Ok(ctx.handle)
        });
        let ctx = match r {
            Ok(c) => c,
            Err(e) => return e,
        };
        // As cudaFree: work queued before the free finishes first.
        drain(Some(ctx));
        code_of(with(|d| d.free(p)))
    })
}

/// `cuMemAllocHost_v2`: pinned host memory owned by the current context (a potentially unsafe call).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(p: *mut *mut c_void, bytes: usize) -> CUresult {
    entry("cuMemAllocHost_v2", || {
        code_of(with_ctx(|d, ctx| {
            if p.is_null() || bytes == 0 {
                return Err(INVALID_VALUE);
            }
            unsafe_call(d, "cuMemAllocHost")?;
            let layout =
                std::alloc::Layout::from_size_align(bytes, 4096).map_err(|_| OUT_OF_MEMORY)?;
            // SAFETY: the layout has a non-zero size.
            let host = unsafe { std::alloc::alloc_zeroed(layout) };
            if host.is_null() {
                return Err(OUT_OF_MEMORY);
            }
            d.pinned
                .insert(host as u64, (bytes as u64, layout, ctx.handle));
            // SAFETY: non-null and valid for a write (the caller's contract).
            unsafe { put(p, host as *mut c_void) }
        }))
    })
}

/// `cuMemFreeHost`: waits for every stream, then frees pinned memory (a potentially unsafe call).
#[no_mangle]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    entry("cuMemFreeHost", || {
        let r = with_ctx(|d, _| {
            if !d.pinned.contains_key(&(p as u64)) {
                return Err(INVALID_VALUE);
            }
            unsafe_call(d, "cuMemFreeHost")
        });
        if let Err(e) = r {
            return e;
        }
        // Queued copies may still read or write it.
        drain(None);
        code_of(with(|d| {
            let (_, layout, _) = d.pinned.remove(&(p as u64)).ok_or(INVALID_VALUE)?;
            // SAFETY: allocated by cuMemAllocHost_v2 with this layout, removed once.
            unsafe { std::alloc::dealloc(p as *mut u8, layout) };
            Ok(())
        }))
    })
}

/// `cuMemAllocAsync`: stream-ordered device memory (allocated at once; not while capturing).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    p: *mut u64,
    bytes: usize,
    stream: *mut c_void,
) -> CUresult {
    entry("cuMemAllocAsync", || {
        code_of(with_ctx(|d, ctx| {
            if p.is_null() {
                return Err(INVALID_VALUE);
            }
            let t = target(d, stream as u64, "cuMemAllocAsync")?;
            if !d.devices[ctx.device].pools || capturing(d, &t) {
                return Err(NOT_SUPPORTED);
            }
            let a = d.alloc(ctx, bytes as u64)?;
            // SAFETY: non-null and valid for a write (the caller's contract).
            unsafe { put(p, a) }
        }))
    })
}

/// `cuMemFreeAsync`: frees device memory when the stream reaches this point.
#[no_mangle]
pub extern "C" fn cuMemFreeAsync(p: u64, stream: *mut c_void) -> CUresult {
    entry("cuMemFreeAsync", || {
        run(with_ctx(|d, ctx| {
            let t = target(d, stream as u64, "cuMemFreeAsync")?;
            if !d.mem.contains_key(&p) {
                return Err(INVALID_VALUE);
            }
            if capturing(d, &t) {
                return Err(NOT_SUPPORTED);
            }
            Ok((
                submit(d, &t, vec![Op::Release { base: p }], false)?,
                ctx.clone(),
            ))
        }))
    })
}

fn capturing(d: &Driver, t: &Target) -> bool {
    matches!(t, Target::Stream(s) if d.captures.contains_key(&s.handle))
}

fn code_of(r: Result<(), CUresult>) -> CUresult {
    state::code(r)
}

/// Finishes a submission outside the lock.
fn run(r: Result<(Pending, Arc<Ctx>), CUresult>) -> CUresult {
    match r {
        Ok((p, ctx)) => finish(p, &ctx),
        Err(e) => e,
    }
}

/// One side of a copy as the caller named it.
#[derive(Clone, Copy)]
enum Side {
    Dev(u64),
    Host(u64),
}

/// Validates and enqueues a copy (see the module docs and `exec` for pageable memory).
fn copy(call: &'static str, dst: Side, src: Side, bytes: usize, stream: *mut c_void) -> CUresult {
    let n = bytes as u64;
    run(with_ctx(|d, ctx| {
        let t = target(d, stream as u64, call)?;
        for side in [dst, src] {
            match side {
                Side::Dev(a) if n > 0 && d.resolve(a, n).is_none() => return Err(INVALID_VALUE),
                Side::Host(0) if n > 0 => return Err(INVALID_VALUE),
                _ => {}
            }
        }
        if n == 0 {
            return Ok((Pending::Nothing, ctx.clone()));
        }
        let pageable = |s: Side| matches!(s, Side::Host(p) if !d.is_pinned(p, n));
        let (pageable_src, pageable_dst) = (pageable(src), pageable(dst));
        let cap = capturing(d, &t);
        if (pageable_src || pageable_dst) && !cap {
            unsafe_call(d, call)?;
        }
        let src = match src {
            Side::Dev(a) => Loc::Dev(a),
            Side::Host(p) if pageable_src && !cap => {
                // SAFETY: the caller's contract: `p` is readable for `bytes` bytes now.
                let data = unsafe { std::slice::from_raw_parts(p as usize as *const u8, bytes) };
                Loc::Staged(Arc::new(data.to_vec()))
            }
            Side::Host(p) => Loc::Host(p),
        };
        let dst = match dst {
            Side::Dev(a) => Loc::Dev(a),
            Side::Host(p) => Loc::Host(p),
        };
        let op = Op::Copy { dst, src, bytes: n };
        Ok((submit(d, &t, vec![op], pageable_dst && !cap)?, ctx.clone()))
    }))
}

/// `cuMemcpyHtoDAsync_v2`: a host-to-device copy (pageable sources are staged first).
#[no_mangle]
pub extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    bytes: usize,
    stream: *mut c_void,
) -> CUresult {
    entry("cuMemcpyHtoDAsync_v2", || {
        copy(
            "cuMemcpyHtoDAsync",
            Side::Dev(dst),
            Side::Host(src as u64),
            bytes,
            stream,
        )
    })
}

/// `cuMemcpyDtoHAsync_v2`: a device-to-host copy (to pageable memory it completes before returning).
#[no_mangle]
pub extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    bytes: usize,
    stream: *mut c_void,
) -> CUresult {
    entry("cuMemcpyDtoHAsync_v2", || {
        copy(
            "cuMemcpyDtoHAsync",
            Side::Host(dst as u64),
            Side::Dev(src),
            bytes,
            stream,
        )
    })
}

/// `cuMemcpyDtoDAsync_v2`: a device-to-device copy.
#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: u64,
    src: u64,
    bytes: usize,
    stream: *mut c_void,
) -> CUresult {
    entry("cuMemcpyDtoDAsync_v2", || {
        copy(
            "cuMemcpyDtoDAsync",
            Side::Dev(dst),
            Side::Dev(src),
            bytes,
            stream,
        )
    })
}

/// `cuMemcpyAsync`: a copy between unified addresses (each side device or host by its range).
#[no_mangle]
pub extern "C" fn cuMemcpyAsync(dst: u64, src: u64, bytes: usize, stream: *mut c_void) -> CUresult {
    entry("cuMemcpyAsync", || {
        // Unified addressing: each side is device memory when it lies in the device range.
        let side = |a: u64| {
            let dev = with(|d| Ok(d.is_device(a))).unwrap_or(false);
            if dev {
                Side::Dev(a)
            } else {
                Side::Host(a)
            }
        };
        copy("cuMemcpyAsync", side(dst), side(src), bytes, stream)
    })
}

/// `cuMemcpyPeerAsync`: a copy between the memories of two contexts.
#[no_mangle]
pub extern "C" fn cuMemcpyPeerAsync(
    dst: u64,
    dst_ctx: *mut c_void,
    src: u64,
    src_ctx: *mut c_void,
    bytes: usize,
    stream: *mut c_void,
) -> CUresult {
    entry("cuMemcpyPeerAsync", || {
        let ok = with(|d| Ok(d.ctx(dst_ctx as u64).is_some() && d.ctx(src_ctx as u64).is_some()));
        match ok {
            Ok(true) => copy(
                "cuMemcpyPeerAsync",
                Side::Dev(dst),
                Side::Dev(src),
                bytes,
                stream,
            ),
            Ok(false) => INVALID_CONTEXT,
            Err(e) => e,
        }
    })
}

/// `cuMemsetD8Async`: sets device bytes.
#[no_mangle]
pub extern "C" fn cuMemsetD8Async(
    dst: u64,
    value: u8,
    bytes: usize,
    stream: *mut c_void,
) -> CUresult {
    entry("cuMemsetD8Async", || {
        let n = bytes as u64;
        run(with_ctx(|d, ctx| {
            let t = target(d, stream as u64, "cuMemsetD8Async")?;
            if n > 0 && d.resolve(dst, n).is_none() {
                return Err(INVALID_VALUE);
            }
            if n == 0 {
                return Ok((Pending::Nothing, ctx.clone()));
            }
            let op = Op::Set {
                dst,
                value,
                bytes: n,
            };
            Ok((submit(d, &t, vec![op], false)?, ctx.clone()))
        }))
    })
}
