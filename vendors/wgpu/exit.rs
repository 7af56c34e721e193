//! Process exit while threads use a GL adapter: the EGL library's teardown must not race them.
//!
//! wgpu's GL backend reaches llvmpipe (or a GPU's GL driver) through libEGL, which on Linux is
//! usually libglvnd's dispatcher. glvnd keeps a small state for every thread that made an EGL
//! call, freed by a thread-exit destructor — and, at process exit, its library destructor
//! (run by `exit` after every `atexit` handler) frees the states of *all* threads, then the
//! vendor libraries, without stopping the threads. Two legal programs crashed so, measured
//! with a scratch program here (a pool of threads adding vectors on `wgpu:1`, llvmpipe's GL):
//!
//! - **A thread exiting as the process exits** (a test harness whose last test threads end
//!   as `main` returns, a thread pool joined just before): glvnd's destructor and the thread's
//!   own exit destructor both free the thread's state, and glibc aborts with `double free or
//!   corruption` or `free(): invalid pointer` — the CI failure of the library's unit tests
//!   (its last tests are the wgpu ones). Forced with a 3 ms delay in the exiting thread: 5
//!   aborts in 20 runs.
//! - **A thread still using the device as `main` returns**: its next EGL call reads the freed
//!   state or display; 6 of 30 runs ended in SIGSEGV or a malloc abort. (Vulkan on lavapipe:
//!   0 of 30, so only GL is handled here.)
//!
//! unirt cannot change glvnd, so it keeps both off the teardown's path:
//!
//! - every thread that calls into the wgpu backend while a GL adapter is in use holds a
//!   thread-local [`ThreadRelease`]; when the thread exits, it calls `eglReleaseThread`
//!   (which frees the thread's EGL state at once and clears glvnd's thread-exit destructor)
//!   while holding [`GATE`];
//! - an `atexit` handler, registered after the GL adapters were enumerated (so it runs before
//!   Mesa's own `atexit` handlers and before every library destructor), first takes the
//!   context lock of each open GL device — wgpu-hal makes every EGL call of a device under
//!   it — waiting for an EGL call in progress to finish, then takes [`GATE`]; both are kept
//!   until the process ends. A thread that exits later stops in its release (before its EGL
//!   state can be freed twice) and a thread that calls the driver later waits for the
//!   context; `exit` then ends them all.
//!
//! An exit waits for an EGL call in progress (at most wgpu-hal's 6 s context timeout, then it
//! goes on unprotected). Checked by `tests/exit_race.rs`, which runs both programs 24 times
//! each as child processes: 1–8 of 48 failed before, 0 of 48 in every run since.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;

/// Whether a GL adapter was enumerated in this process (threads register only then).
static GL_IN_USE: AtomicBool = AtomicBool::new(false);

/// Held by an exiting thread while it releases its EGL state; taken for good at exit.
static GATE: Mutex<()> = Mutex::new(());

/// The open GL devices (id, the process that opened it, the device), whose context locks
/// the exit handler holds.
static DEVICES: Mutex<Vec<(u64, u32, wgpu::Device)>> = Mutex::new(Vec::new());

/// Whether this process's exit handler ran (a forked child may have registered twice).
static QUIESCED: AtomicBool = AtomicBool::new(false);

/// The process that registered the handler (a forked child leaves everything alone).
static REGISTERED_BY: AtomicU32 = AtomicU32::new(0);

/// How long the exit handler waits for a thread's EGL call, or release, in progress.
const EXIT_WAIT: Duration = Duration::from_secs(2);

type ReleaseThreadFn = unsafe extern "C" fn() -> u32;

/// `eglReleaseThread` of the libEGL that wgpu loaded (none where it loaded none).
fn release_thread_fn() -> Option<ReleaseThreadFn> {
    static F: OnceLock<Option<ReleaseThreadFn>> = OnceLock::new();
    *F.get_or_init(|| {
        // wgpu-hal opens "libEGL.so.1" (then "libEGL.so"); RTLD_NOLOAD finds the one already
        // in the process and never loads a new one.
        for name in ["libEGL.so.1", "libEGL.so"] {
            // SAFETY: RTLD_NOLOAD only returns a library already loaded (and initialised) by
            // wgpu; nothing new is loaded, so no initialiser runs here.
            let lib = unsafe {
                libloading::os::unix::Library::open(
                    Some(name),
                    libloading::os::unix::RTLD_NOW | libc::RTLD_NOLOAD,
                )
            };
            let Ok(lib) = lib else { continue };
            // SAFETY: `eglReleaseThread` is declared by EGL 1.2+ as
            // `EGLBoolean eglReleaseThread(void)` (EGLBoolean is an unsigned int).
            let f = unsafe { lib.get::<ReleaseThreadFn>(b"eglReleaseThread\0") }
                .ok()
                .map(|s| *s);
            // The library stays loaded for the life of the process (wgpu holds it too), so
            // the function pointer stays valid.
            std::mem::forget(lib);
            if f.is_some() {
                return f;
            }
        }
        None
    })
}

/// A thread's release of its EGL state, run by its thread-local destructor.
struct ThreadRelease;

impl Drop for ThreadRelease {
    fn drop(&mut self) {
        let _gate = GATE.lock();
        if let Some(release) = release_thread_fn() {
            // SAFETY: eglReleaseThread takes no arguments and is valid on any thread, with or
            // without a current context (it unbinds one); the thread makes no EGL call after
            // this through unirt (its thread-locals are being destroyed).
            unsafe { release() };
        }
    }
}

thread_local! {
    static RELEASE: ThreadRelease = const { ThreadRelease };
    static NOTED: Cell<bool> = const { Cell::new(false) };
}

/// Registers the calling thread's release (once per thread) when a GL adapter is in use.
/// Cheap: an atomic load and a thread-local flag. Call it before the thread's first EGL call
/// through wgpu, so that its release is among the last of its destructors.
pub(crate) fn note_thread() {
    if !GL_IN_USE.load(Ordering::Acquire) {
        return;
    }
    let _ = NOTED.try_with(|noted| {
        if !noted.replace(true) {
            // Touching it registers its destructor (where the thread is not already exiting).
            let _ = RELEASE.try_with(|_| ());
        }
    });
}

/// Called before GL adapters are enumerated: from now on threads register their release.
pub(crate) fn gl_enumerating() {
    GL_IN_USE.store(true, Ordering::Release);
    note_thread();
}

/// Called after GL adapters were enumerated (Mesa registered its own `atexit` handlers
/// then): registers the exit handler, once per process (a forked child that enumerates anew
/// registers its own; the handler it inherited does nothing there).
pub(crate) fn gl_enumerated() {
    let pid = std::process::id();
    if REGISTERED_BY.swap(pid, Ordering::AcqRel) != pid {
        // SAFETY: `at_exit` is an `extern "C" fn()` that never unwinds (it catches panics).
        let _ = unsafe { libc::atexit(at_exit) };
    }
}

/// An open GL device, known to the exit handler until this is dropped (with the device).
pub(crate) struct TrackedDevice(u64);

/// Tracks `device` (of a GL adapter) for the exit handler.
pub(crate) fn track(device: &wgpu::Device) -> TrackedDevice {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    DEVICES
        .lock()
        .push((id, std::process::id(), device.clone()));
    TrackedDevice(id)
}

impl Drop for TrackedDevice {
    fn drop(&mut self) {
        let removed = {
            let mut devices = DEVICES.lock();
            devices
                .iter()
                .position(|(id, _, _)| *id == self.0)
                .map(|i| devices.swap_remove(i))
        };
        // The device clone is dropped outside the lock (a wgpu drop may take the context).
        super::guard::release(removed);
    }
}

extern "C" fn at_exit() {
    if REGISTERED_BY.load(Ordering::Acquire) != std::process::id()
        || QUIESCED.swap(true, Ordering::AcqRel)
    {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(quiesce));
}

/// Holds every open GL device's context lock, then the release gate, until the process ends.
fn quiesce() {
    if let Some(devices) = DEVICES.try_lock_for(EXIT_WAIT) {
        let pid = std::process::id();
        // A device a parent process opened is unusable here (and its lock may be stuck).
        for (_, _, device) in devices.iter().filter(|(_, opener, _)| *opener == pid) {
            // SAFETY: only the wgpu-hal device of a device made by wgpu's GL backend is read
            // (None for any other backend); nothing is destroyed through it.
            let Some(hal) = (unsafe { device.as_hal::<wgpu::hal::api::Gles>() }) else {
                continue;
            };
            // Kept (with the lock it gives) until the process ends.
            let hal = Box::leak(Box::new(hal));
            // SAFETY: the context is locked but never used: no GL or EGL call is made with
            // it, so it need not be current on this thread. wgpu-hal waits at most 6 s for
            // the lock and panics after (caught: the exit goes on unprotected).
            let held = catch_unwind(AssertUnwindSafe(|| unsafe {
                hal.context().get_without_egl_lock()
            }));
            if let Ok(lock) = held {
                std::mem::forget(lock);
            }
        }
        std::mem::forget(devices);
    }
    if let Some(gate) = GATE.try_lock_for(EXIT_WAIT) {
        std::mem::forget(gate);
    }
}
