//! The wgpu backend at process exit (see [`crate::exit`] for when the hook runs).
//!
//! Three crashes, each seen with a scratch program on this machine's Mesa adapters whose
//! `main` returned while other threads used a device:
//!
//! - **Compiling** (lavapipe and llvmpipe): LLVM compiles a kernel when its pipeline is made
//!   or first dispatched — on the calling thread, the submitter or lavapipe's own queue
//!   thread — and `exit` destroys LLVM's and Mesa's statics meanwhile: SIGSEGV in LLVM's
//!   code generator, "LLVM ERROR", "stack smashing detected" (15 of 24 runs on lavapipe, 11
//!   of 16 on llvmpipe, threads making a new kernel each step).
//! - **Calling GL** (llvmpipe): libglvnd's library destructor frees every thread's EGL state
//!   and unloads the vendor libraries; a thread still copying read freed memory (6 of 30).
//! - **Exiting** (GL): glvnd frees a thread's EGL state both in that destructor and when the
//!   thread exits, so a thread exiting as the process exits had it freed twice: `double free`,
//!   `free(): invalid pointer` (the CI abort of the unit-test binary after all its tests
//!   passed; 5 of 20 runs with a delay in the threads' exit).
//!
//! So every call into wgpu holds a [`Pass`] (each `Backend` method through `guard::guarded`,
//! each drop through `guard::release`, each submission, each device request). The exit hook
//! closes the gate — a later call fails with `Error::Unavailable` ("the process is exiting"),
//! a later drop leaks, a later submission fails its waiters — waits for the calls in progress
//! (at most [`EXIT_WAIT`]), then waits for each open device's queue to finish (lavapipe's
//! queue thread compiles there), at most [`EXIT_WAIT`] each. For the exiting threads, every
//! thread that called wgpu while a GL adapter is in use calls `eglReleaseThread` when it
//! exits (glvnd frees its state at once and forgets it) under [`RELEASE`], which the hook
//! takes for good: a thread exiting later stops before its state could be freed twice.
//!
//! Checked by `tests/exit_race.rs` (child processes that exit while threads compile, copy
//! and exit on each wgpu adapter).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;

use crate::device::DeviceKind;
use crate::error::{Error, Result};
// Calls into wgpu in progress; closed by the exit hook.
use crate::exit::{GatePass, WGPU_GATE as GATE};
use crate::fork::Epoch;

/// Whether a GL adapter was enumerated in this process (threads release EGL state only then).
static GL_IN_USE: AtomicBool = AtomicBool::new(false);

/// Held by an exiting thread while it releases its EGL state; taken for good at exit.
static RELEASE: Mutex<()> = Mutex::new(());

/// The open devices (id, the process image that opened it, the device), waited idle at exit.
static DEVICES: Mutex<Vec<(u64, Epoch, wgpu::Device)>> = Mutex::new(Vec::new());

/// How long the exit waits for the calls in progress, and for each device's queue.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// A call into wgpu in progress (see the module docs).
pub(crate) type Pass = GatePass<'static>;

/// Enters a call into wgpu, or refuses it once the process is exiting.
pub(crate) fn enter() -> Result<Pass> {
    note_thread();
    GATE.enter().ok_or_else(|| Error::Unavailable {
        backend: DeviceKind::Wgpu,
        reason: "the process is exiting".into(),
    })
}

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
        let _release = RELEASE.lock();
        if let Some(release) = release_thread_fn() {
            // SAFETY: eglReleaseThread takes no arguments and is valid on any thread, with or
            // without a current context (it unbinds one); the thread makes no EGL call after
            // this through unirt (its thread-locals are being destroyed).
            unsafe { release() };
        }
    }
}

thread_local! {
    static THREAD_RELEASE: ThreadRelease = const { ThreadRelease };
    static NOTED_GL: Cell<bool> = const { Cell::new(false) };
}

/// Registers the calling thread's exit guards (once per thread): the main thread's (see
/// [`crate::exit`]) and, while a GL adapter is in use, its EGL release. Cheap: an atomic
/// load and thread-local flags. Called before the thread's first call into wgpu, so that its
/// release is among the last of its destructors.
pub(crate) fn note_thread() {
    crate::exit::note_thread();
    if !GL_IN_USE.load(Ordering::Acquire) {
        return;
    }
    let _ = NOTED_GL.try_with(|noted| {
        if !noted.replace(true) {
            // Touching it registers its destructor (where the thread is not already exiting).
            let _ = THREAD_RELEASE.try_with(|_| ());
        }
    });
}

/// Called before GL adapters are enumerated: from now on threads release their EGL state.
pub(crate) fn gl_enumerating() {
    GL_IN_USE.store(true, Ordering::Release);
    note_thread();
}

/// Called after adapters were enumerated or a device requested (the drivers registered their
/// own exit handlers then): the hook is registered, and armed to run before those.
pub(crate) fn driver_loaded() {
    crate::exit::register(quiesce);
}

/// An open device, waited idle by the exit hook until this is dropped (with the device).
pub(crate) struct TrackedDevice(u64);

/// Tracks `device` for the exit hook.
pub(crate) fn track(device: &wgpu::Device) -> TrackedDevice {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    DEVICES.lock().push((id, Epoch::now(), device.clone()));
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
        // The device clone is dropped outside the lock (a wgpu drop may take the GL context).
        super::guard::release(removed);
    }
}

/// Waits for each device's queue to finish (lavapipe compiles kernels on its queue thread when
/// they first run), at most [`EXIT_WAIT`] each, on a thread of its own: the exiting thread's
/// thread-locals are already destroyed, and wgpu-core's debug builds keep a lock trace in one
/// (every call panicked there). The thread never ends (a thread exiting now would race
/// libglvnd's teardown, above); `exit` ends it. The devices are never dropped (a drop would
/// call into wgpu).
fn wait_idle(devices: Vec<wgpu::Device>) {
    if devices.is_empty() {
        return;
    }
    let n = devices.len() as u32;
    let (done, finished) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("unirt-exit".into())
        .spawn(move || {
            for device in &devices {
                // An error or a timeout ends the wait.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    device.poll(wgpu::PollType::Wait {
                        submission_index: None,
                        timeout: Some(EXIT_WAIT),
                    })
                }));
            }
            let _ = done.send(());
            std::mem::forget(devices);
            loop {
                std::thread::park();
            }
        });
    if spawned.is_ok() {
        let _ = finished.recv_timeout(EXIT_WAIT * n + Duration::from_secs(1));
    }
}

/// The exit hook: closes the gate, waits for the calls in progress and each device's queue,
/// then holds the EGL release gate for good.
fn quiesce() {
    GATE.close(EXIT_WAIT);
    // Clones, taken out of the lock (a device dropped during the exit removes its entry). A
    // device a parent process opened is unusable here.
    let devices: Vec<wgpu::Device> = match DEVICES.try_lock_for(EXIT_WAIT) {
        Some(list) => list
            .iter()
            .filter(|(_, opened, _)| opened.is_current())
            .map(|(_, _, d)| d.clone())
            .collect(),
        None => Vec::new(),
    };
    wait_idle(devices);
    if let Some(release) = RELEASE.try_lock_for(EXIT_WAIT) {
        std::mem::forget(release);
    }
}
