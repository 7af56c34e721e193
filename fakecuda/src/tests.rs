//! The fake driver's own semantics, through its exported functions: capture-mode rules,
//! sticky errors and recovery, fault counting, images and kernels, copies.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::{Mutex, MutexGuard};

use crate::api_ctx::*;
use crate::api_mem::*;
use crate::api_stream::*;
use crate::result::*;

/// The driver is process-wide: one test at a time.
static LOCK: Mutex<()> = Mutex::new(());

struct Setup {
    _g: MutexGuard<'static, ()>,
    ctx: *mut c_void,
}

impl Drop for Setup {
    fn drop(&mut self) {
        crate::faults::set(Vec::new());
        assert_eq!(cuDevicePrimaryCtxRelease_v2(0), SUCCESS);
    }
}

fn setup() -> Setup {
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    crate::faults::set(Vec::new());
    assert_eq!(cuInit(0), SUCCESS);
    let mut ctx = null_mut();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuDevicePrimaryCtxRetain(&mut ctx, 0) }, SUCCESS);
    assert_eq!(cuCtxSetCurrent(ctx), SUCCESS);
    Setup { _g: g, ctx }
}

fn stream() -> *mut c_void {
    let mut s = null_mut();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuStreamCreate(&mut s, 1) }, SUCCESS);
    s
}

fn alloc(bytes: usize) -> (CUresult, u64) {
    let mut p = 0u64;
    // SAFETY: a valid out-pointer.
    let r = unsafe { cuMemAlloc_v2(&mut p, bytes) };
    (r, p)
}

fn end(s: *mut c_void) -> (CUresult, *mut c_void) {
    let mut g = null_mut();
    // SAFETY: a valid out-pointer.
    let r = unsafe { cuStreamEndCapture(s, &mut g) };
    (r, g)
}

fn set_mode(mode: i32) -> i32 {
    let mut m = mode;
    // SAFETY: a valid in/out pointer.
    assert_eq!(
        unsafe { cuThreadExchangeStreamCaptureMode(&mut m) },
        SUCCESS
    );
    m
}

#[test]
fn unsafe_call_invalidates_a_global_capture_unless_the_thread_is_relaxed() {
    let _s = setup();
    let s = stream();
    let (_, p0) = alloc(64);
    assert_eq!(cuStreamBeginCapture_v2(s, 0), SUCCESS);
    assert_eq!(alloc(256).0, STREAM_CAPTURE_UNSUPPORTED);
    // Work on the invalidated capture is refused; ending it gives no graph.
    assert_eq!(cuMemsetD8Async(p0, 0, 64, s), STREAM_CAPTURE_INVALIDATED);
    let (r, g) = end(s);
    assert_eq!((r, g), (STREAM_CAPTURE_INVALIDATED, null_mut()));

    assert_eq!(cuStreamBeginCapture_v2(s, 0), SUCCESS);
    let old = set_mode(2);
    let (r, p) = alloc(256);
    assert_eq!(r, SUCCESS);
    set_mode(old);
    let (r, g) = end(s);
    assert_eq!(r, SUCCESS);
    assert!(!g.is_null());
    assert_eq!(cuGraphDestroy(g), SUCCESS);
    assert_eq!(cuMemFree_v2(p), SUCCESS);
    assert_eq!(cuMemFree_v2(p0), SUCCESS);
    assert_eq!(cuStreamDestroy_v2(s), SUCCESS);
}

#[test]
fn capture_modes_across_threads() {
    let su = setup();
    let ctx = su.ctx as usize;
    let s = stream();
    let other = move |mode: Option<i32>| {
        std::thread::spawn(move || {
            assert_eq!(cuCtxSetCurrent(ctx as *mut c_void), SUCCESS);
            if let Some(m) = mode {
                set_mode(m);
            }
            let (r, p) = alloc(64);
            if r == SUCCESS {
                assert_eq!(cuMemFree_v2(p), SUCCESS);
            }
            r
        })
        .join()
        .unwrap()
    };
    // A ThreadLocal capture ignores other threads.
    assert_eq!(cuStreamBeginCapture_v2(s, 1), SUCCESS);
    assert_eq!(other(None), SUCCESS);
    let (r, g) = end(s);
    assert_eq!(r, SUCCESS);
    assert_eq!(cuGraphDestroy(g), SUCCESS);
    // A Global capture is invalidated by another Global-mode thread's unsafe call…
    assert_eq!(cuStreamBeginCapture_v2(s, 0), SUCCESS);
    assert_eq!(other(None), STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(end(s).0, STREAM_CAPTURE_INVALIDATED);
    // … but not by a ThreadLocal-mode thread's.
    assert_eq!(cuStreamBeginCapture_v2(s, 0), SUCCESS);
    assert_eq!(other(Some(1)), SUCCESS);
    let (r, g) = end(s);
    assert_eq!(r, SUCCESS);
    assert_eq!(cuGraphDestroy(g), SUCCESS);
    // Only the capturing thread ends a Global capture; anyone ends a Relaxed one.
    let sh = s as usize;
    let end_elsewhere = move || {
        std::thread::spawn(move || {
            assert_eq!(cuCtxSetCurrent(ctx as *mut c_void), SUCCESS);
            let (r, g) = end(sh as *mut c_void);
            if !g.is_null() {
                assert_eq!(cuGraphDestroy(g), SUCCESS);
            }
            r
        })
        .join()
        .unwrap()
    };
    assert_eq!(cuStreamBeginCapture_v2(s, 0), SUCCESS);
    assert_eq!(end_elsewhere(), STREAM_CAPTURE_WRONG_THREAD);
    let (r, g) = end(s);
    assert_eq!(r, SUCCESS);
    assert_eq!(cuGraphDestroy(g), SUCCESS);
    assert_eq!(cuStreamBeginCapture_v2(s, 2), SUCCESS);
    assert_eq!(end_elsewhere(), SUCCESS);
    assert_eq!(cuStreamDestroy_v2(s), SUCCESS);
}

#[test]
fn pageable_copies_are_unsafe_during_capture_pinned_ones_are_not() {
    let _s = setup();
    let (s, t) = (stream(), stream());
    let (_, p) = alloc(64);
    let mut pinned = null_mut();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuMemAllocHost_v2(&mut pinned, 64) }, SUCCESS);
    let mut pageable = [0u8; 64];
    assert_eq!(cuStreamBeginCapture_v2(s, 1), SUCCESS);
    assert_eq!(cuMemcpyDtoHAsync_v2(pinned, p, 64, t), SUCCESS);
    let old = set_mode(2);
    assert_eq!(cuStreamSynchronize(t), SUCCESS);
    set_mode(old);
    let r = cuMemcpyDtoHAsync_v2(pageable.as_mut_ptr() as *mut c_void, p, 64, t);
    assert_eq!(r, STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(end(s).0, STREAM_CAPTURE_INVALIDATED);
    // Synchronising a capturing stream is refused in every mode.
    assert_eq!(cuStreamBeginCapture_v2(s, 2), SUCCESS);
    assert_eq!(cuStreamSynchronize(s), STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(end(s).0, STREAM_CAPTURE_INVALIDATED);
    assert_eq!(cuMemFreeHost(pinned), SUCCESS);
    assert_eq!(cuMemFree_v2(p), SUCCESS);
    assert_eq!(cuStreamDestroy_v2(s), SUCCESS);
    assert_eq!(cuStreamDestroy_v2(t), SUCCESS);
}

/// Waiting for or querying a stream or event outside the capture is a potentially unsafe call
/// (an H100 refused it during a Global capture): prohibited unless the thread is Relaxed.
#[test]
fn synchronising_other_work_during_capture_is_unsafe_unless_relaxed() {
    let _s = setup();
    let (s, t) = (stream(), stream());
    let mut e = null_mut();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuEventCreate(&mut e, 0) }, SUCCESS);
    assert_eq!(cuEventRecord(e, t), SUCCESS);
    type Call = fn(*mut c_void, *mut c_void) -> CUresult;
    let calls: [Call; 4] = [
        |t, _| cuStreamSynchronize(t),
        |t, _| cuStreamQuery(t),
        |_, e| cuEventSynchronize(e),
        |_, e| cuEventQuery(e),
    ];
    for call in calls {
        assert_eq!(cuStreamBeginCapture_v2(s, 0), SUCCESS);
        assert_eq!(call(t, e), STREAM_CAPTURE_UNSUPPORTED);
        assert_eq!(end(s).0, STREAM_CAPTURE_INVALIDATED);
        assert_eq!(cuStreamBeginCapture_v2(s, 0), SUCCESS);
        let old = set_mode(2);
        assert_eq!(call(t, e), SUCCESS);
        set_mode(old);
        let (r, g) = end(s);
        assert_eq!(r, SUCCESS);
        assert_eq!(cuGraphDestroy(g), SUCCESS);
    }
    assert_eq!(cuEventDestroy_v2(e), SUCCESS);
    assert_eq!(cuStreamDestroy_v2(s), SUCCESS);
    assert_eq!(cuStreamDestroy_v2(t), SUCCESS);
}

#[test]
fn sticky_error_poisons_the_context_until_it_is_destroyed() {
    let su = setup();
    let s = stream();
    let (_, p) = alloc(64);
    let rules = crate::faults::parse("cuMemsetD8Async:1:CUDA_ERROR_ILLEGAL_ADDRESS:after").unwrap();
    crate::faults::set(rules);
    assert_eq!(
        cuMemsetD8Async(p, 1, 64, s),
        SUCCESS,
        "the faulting call succeeds"
    );
    assert_eq!(cuStreamSynchronize(s), ILLEGAL_ADDRESS);
    assert_eq!(alloc(64).0, ILLEGAL_ADDRESS);
    assert_eq!(crate::faults::fired(), 1);
    // Releasing the last reference destroys the context; a new one is healthy.
    assert_eq!(cuDevicePrimaryCtxRelease_v2(0), SUCCESS);
    assert_eq!(
        crate::control::unirt_fakecuda_live(0),
        0,
        "memory reclaimed"
    );
    let mut ctx = null_mut();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuDevicePrimaryCtxRetain(&mut ctx, 0) }, SUCCESS);
    assert_ne!(ctx, su.ctx, "a fresh context");
    assert_eq!(cuCtxSetCurrent(ctx), SUCCESS);
    let (r, p) = alloc(64);
    assert_eq!(r, SUCCESS);
    assert_eq!(cuMemFree_v2(p), SUCCESS);
}

#[test]
fn the_nth_call_fails_and_calls_are_counted() {
    let _s = setup();
    crate::faults::set(crate::faults::parse("cuMemAlloc_v2:2:OUT_OF_MEMORY").unwrap());
    let (r1, p1) = alloc(64);
    let (r2, _) = alloc(64);
    let (r3, p3) = alloc(64);
    assert_eq!((r1, r2, r3), (SUCCESS, OUT_OF_MEMORY, SUCCESS));
    assert_eq!(crate::faults::calls("cuMemAlloc_v2"), 3);
    assert_eq!(crate::faults::fired(), 1);
    assert_eq!(cuMemFree_v2(p1), SUCCESS);
    assert_eq!(cuMemFree_v2(p3), SUCCESS);
    // A range past the allocation is refused when the copy is enqueued.
    let (_, p) = alloc(64);
    assert_eq!(cuMemsetD8Async(p + 32, 0, 64, null_mut()), INVALID_VALUE);
    assert_eq!(cuMemFree_v2(p), SUCCESS);
    assert_eq!(cuMemFree_v2(p), INVALID_VALUE, "double free");
}

#[test]
fn ptx_images_and_the_add_twin() {
    let _s = setup();
    let ptx =
        b".version 7.8\n.target sm_80\n.address_size 64\n.visible .entry add_f32(\n)\n{ ret; }\n\0";
    let mut m = null_mut();
    // SAFETY: NUL-terminated text and a valid out-pointer.
    assert_eq!(
        unsafe { cuModuleLoadData(&mut m, ptx.as_ptr() as *const c_void) },
        SUCCESS
    );
    let junk = b"not an image\0";
    let mut m2 = null_mut();
    // SAFETY: as above.
    let r = unsafe { cuModuleLoadData(&mut m2, junk.as_ptr() as *const c_void) };
    assert_eq!(r, INVALID_IMAGE);
    let mut f = null_mut();
    // SAFETY: NUL-terminated names and a valid out-pointer.
    unsafe {
        assert_eq!(cuModuleGetFunction(&mut f, m, c"fill".as_ptr()), NOT_FOUND);
        assert_eq!(cuModuleGetFunction(&mut f, m, c"add_f32".as_ptr()), SUCCESS);
    }
    let n = 1000u32;
    let (a, b) = (
        (0..n).map(|i| i as f32).collect::<Vec<_>>(),
        vec![0.5f32; n as usize],
    );
    let bytes = 4 * n as usize;
    let (_, da) = alloc(bytes);
    let (_, db) = alloc(bytes);
    let s = stream();
    assert_eq!(
        cuMemcpyHtoDAsync_v2(da, a.as_ptr() as *const c_void, bytes, s),
        SUCCESS
    );
    assert_eq!(
        cuMemcpyHtoDAsync_v2(db, b.as_ptr() as *const c_void, bytes, s),
        SUCCESS
    );
    let (mut pa, mut pb, mut po, mut pn) = (da, db, db, n);
    let mut params = [
        &mut pa as *mut u64 as *mut c_void,
        &mut pb as *mut u64 as *mut c_void,
        &mut po as *mut u64 as *mut c_void,
        &mut pn as *mut u32 as *mut c_void,
    ];
    // SAFETY: one pointer per kernel parameter, each to a value of its size.
    let r = unsafe { cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, s, params.as_mut_ptr(), null_mut()) };
    assert_eq!(r, SUCCESS);
    let mut out = vec![0f32; n as usize];
    assert_eq!(
        cuMemcpyDtoHAsync_v2(out.as_mut_ptr() as *mut c_void, db, bytes, s),
        SUCCESS
    );
    assert!(out.iter().enumerate().all(|(i, &v)| v == i as f32 + 0.5));
    // A launch past the allocation faults on the device: sticky, reported by the next call.
    // SAFETY: params[3] points to `pn`, a live u32.
    unsafe { *(params[3] as *mut u32) = n + 1 };
    // SAFETY: as above.
    let r = unsafe { cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, s, params.as_mut_ptr(), null_mut()) };
    assert_eq!(r, SUCCESS);
    assert_eq!(cuStreamSynchronize(s), ILLEGAL_ADDRESS);
}

#[test]
fn events_time_recorded_work() {
    let _s = setup();
    let s = stream();
    let (mut a, mut b, mut untimed) = (null_mut(), null_mut(), null_mut());
    let mut ms = -1f32;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(cuEventCreate(&mut a, 0), SUCCESS);
        assert_eq!(cuEventCreate(&mut b, 0), SUCCESS);
        assert_eq!(cuEventCreate(&mut untimed, 2), SUCCESS);
        assert_eq!(
            cuEventElapsedTime(&mut ms, a, b),
            INVALID_HANDLE,
            "never recorded"
        );
    }
    assert_eq!(
        cuEventQuery(a),
        SUCCESS,
        "an event never recorded is complete"
    );
    assert_eq!(cuEventRecord(a, s), SUCCESS);
    assert_eq!(cuEventRecord(b, s), SUCCESS);
    assert_eq!(cuEventRecord(untimed, s), SUCCESS);
    assert_eq!(cuEventSynchronize(b), SUCCESS);
    // SAFETY: a valid out-pointer.
    unsafe {
        assert_eq!(cuEventElapsedTime(&mut ms, a, b), SUCCESS);
        assert!(ms >= 0.0);
        assert_eq!(cuEventElapsedTime(&mut ms, a, untimed), INVALID_HANDLE);
    }
    for e in [a, b, untimed] {
        assert_eq!(cuEventDestroy_v2(e), SUCCESS);
    }
    assert_eq!(cuEventQuery(a), INVALID_HANDLE, "destroyed");
    assert_eq!(cuStreamDestroy_v2(s), SUCCESS);
}
