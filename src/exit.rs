//! Process exit: unirt's drivers stop before their libraries are torn down.
//!
//! `exit` (and a return from `main`) runs the `atexit` handlers, newest first, and then every
//! library's destructors — while the process's other threads go on running. The drivers unirt
//! loads are C and C++ libraries whose exit handlers and destructors free their state without
//! stopping those threads: LLVM (lavapipe's and llvmpipe's compiler), Mesa, libglvnd's EGL and
//! NVRTC each crashed a program here whose `main` returned while another thread was compiling,
//! submitting or exiting (SIGSEGV, `double free or corruption`; `docs/RELIABILITY.md`). So
//! each backend that needs it registers a *hook* here ([`register`]) that stops its driver
//! work — refuses new calls with [`Error::Unavailable`](crate::Error::Unavailable) ("the
//! process is exiting"), waits a bounded time for the calls in progress and for the device to
//! go idle — and the hooks run, once, before the drivers' own handlers:
//!
//! - **First, from the exiting thread's thread-local destructors**: glibc's `exit` destroys
//!   the calling thread's thread-locals before it runs any `atexit` handler. The thread a
//!   program's `main` runs on holds a guard from its first driver call ([`note_thread`]) whose
//!   destructor registers the hook runner with `atexit` again — at that moment the newest
//!   registration, so it runs before every handler the drivers registered, even those their
//!   C++ statics registered lazily, at their first compile. (Where the main thread ends with
//!   `pthread_exit` and the process goes on, this adds one registration and changes nothing.)
//! - **Else from `atexit` registrations** made whenever a driver was loaded or a device opened
//!   ([`arm`]): a program whose main thread never calls unirt (a test harness) is covered
//!   against the handlers registered before those moments.
//!
//! A forked child runs no hook it inherited (its devices are unusable there anyway).

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::fork::Epoch;

/// The hooks, in registration order (each function once).
static HOOKS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// The process image the hooks belong to (set by each registration: a forked child's first
/// makes it the owner).
static OWNER: Mutex<Option<Epoch>> = Mutex::new(None);

/// Whether the hooks ran (they run once, however many registrations lead to them).
static RAN: AtomicBool = AtomicBool::new(false);

/// Adds `hook` (once) and arms the runner. Call it when the driver the hook stops was loaded.
pub(crate) fn register(hook: fn()) {
    {
        let mut hooks = HOOKS.lock();
        if !hooks.iter().any(|h| std::ptr::fn_addr_eq(*h, hook)) {
            hooks.push(hook);
        }
    }
    arm();
}

/// Registers the hook runner with `atexit` (again), so that it runs before the handlers that
/// were registered until now. Each call costs one entry in libc's list (32 bytes): call it
/// when a driver library was loaded or a device opened, not per operation.
pub(crate) fn arm() {
    // A child's first arm makes it the owner (the hooks it inherited stay listed).
    *OWNER.lock() = Some(Epoch::now());
    // SAFETY: `run_hooks` is an `extern "C" fn()` that never unwinds (it catches panics).
    let _ = unsafe { libc::atexit(run_hooks) };
}

extern "C" fn run_hooks() {
    let owned = OWNER
        .try_lock()
        .and_then(|o| *o)
        .is_some_and(|e| e.is_current());
    if !owned || RAN.swap(true, Ordering::AcqRel) {
        return;
    }
    let hooks: Vec<fn()> = match HOOKS.try_lock() {
        Some(h) => h.clone(),
        None => return,
    };
    for hook in hooks {
        let _ = catch_unwind(AssertUnwindSafe(hook));
    }
}

/// The main thread's guard: its destructor runs first in `exit` and re-arms the runner.
struct MainThreadGuard;

impl Drop for MainThreadGuard {
    fn drop(&mut self) {
        if !HOOKS.lock().is_empty() {
            arm();
        }
    }
}

thread_local! {
    static NOTED: Cell<bool> = const { Cell::new(false) };
    static MAIN_GUARD: MainThreadGuard = const { MainThreadGuard };
}

/// Gives the calling thread its exit guard if it is the process's main thread (the one
/// whose id is the process id). Cheap after the first call on a thread: a thread-local flag.
pub(crate) fn note_thread() {
    let _ = NOTED.try_with(|noted| {
        if !noted.replace(true) && is_main_thread() {
            let _ = MAIN_GUARD.try_with(|_| ());
        }
    });
}

fn is_main_thread() -> bool {
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    u32::try_from(tid).is_ok_and(|t| t == std::process::id())
}

/// The wgpu backend's gate (`vendors/wgpu/exit.rs`).
pub(crate) static WGPU_GATE: Gate = Gate::new();

/// NVRTC's gate (`vendors/cuda/nvrtc.rs`).
pub(crate) static NVRTC_GATE: Gate = Gate::new();

/// Run in a forked child (only atomics): the parent's calls in progress are not the child's,
/// and its exit must not wait for them.
pub(crate) fn after_fork_in_child() {
    for gate in [&WGPU_GATE, &NVRTC_GATE] {
        gate.in_flight.store(0, Ordering::SeqCst);
    }
}

/// A driver's calls in progress, and whether new ones may start: what an exit hook closes.
pub(crate) struct Gate {
    in_flight: AtomicUsize,
    closed: AtomicBool,
}

/// A call through a [`Gate`], in progress until dropped.
pub(crate) struct GatePass<'a>(&'a Gate);

impl Drop for GatePass<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Gate {
    pub(crate) const fn new() -> Self {
        Gate {
            in_flight: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// Enters a call, or `None` once the gate is closed (the process is exiting).
    pub(crate) fn enter(&self) -> Option<GatePass<'_>> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let pass = GatePass(self);
        // SeqCst on both sides: either `close` sees this call in flight and waits for it, or
        // this call sees the gate closed.
        (!self.closed.load(Ordering::SeqCst)).then_some(pass)
    }

    /// Closes the gate and waits, at most `wait`, for the calls in progress to end.
    pub(crate) fn close(&self, wait: Duration) {
        self.closed.store(true, Ordering::SeqCst);
        let until = Instant::now() + wait;
        while self.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
