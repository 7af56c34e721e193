//! wgpu panics in a few places where unirt owes its caller an error. The one seen here:
//! wgpu-hal's GL backend panics ("Could not lock adapter context. This is most-likely a
//! deadlock.") when a thread waits more than 6 s for the EGL context — which another thread
//! legitimately holds while llvmpipe runs a long dispatch inside `queue.submit`. So every call
//! into the wgpu backend (each `Backend` method, each operator launch and kernel preparation)
//! runs inside [`guarded`], which turns a panic into `Error::Driver` naming the call. The
//! submitter thread catches its own panics the same way (`gpu.rs`).
//!
//! wgpu's locks are released as the panic unwinds; what the call was doing is lost, and the
//! error says so. The default panic hook still prints the panic to stderr.
//!
//! A thread whose thread-locals are being destroyed (a user's thread-local destructor, a C
//! pthread key destructor) makes its wgpu calls through a thread of its own ([`elsewhere`]):
//! a debug build of wgpu-core keeps a lock trace in a thread-local, and every call made after
//! it was destroyed panics — then again while the unwind drops the call's wgpu objects, which
//! aborts the process ("panic in a destructor during cleanup").

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::device::DeviceKind;
use crate::error::{Error, Result};

thread_local! {
    /// Set once this thread's thread-locals are being destroyed (by [`Sentinel`]'s drop). A
    /// `const` cell without a destructor: readable until the thread is gone.
    static TORN_DOWN: Cell<bool> = const { Cell::new(false) };
    /// First touched after the thread's first wgpu call — after wgpu-core's lock trace was
    /// set up — so destroyed before it (thread-locals go in reverse order of first use).
    static SENTINEL: Sentinel = const { Sentinel };
}

/// Marks the thread torn down when dropped.
struct Sentinel;

impl Drop for Sentinel {
    fn drop(&mut self) {
        TORN_DOWN.set(true);
    }
}

/// Runs `f`; a panic inside it becomes `Error::Driver { call, .. }`.
pub(crate) fn guarded<T>(call: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    // Refused once the process is exiting (`exit.rs`).
    let _pass = super::exit::enter()?;
    if TORN_DOWN.get() {
        return elsewhere(move || catching(call, f)).unwrap_or_else(|e| {
            Err(Error::Internal(format!(
                "{call} from an exiting thread needs a thread to make it on: {e}"
            )))
        });
    }
    let r = catching(call, f);
    let _ = SENTINEL.try_with(|_| ());
    r
}

/// Runs `f` on a thread of its own and waits for it (`Err`: no thread could be started).
fn elsewhere<R>(f: impl FnOnce() -> R) -> std::io::Result<R> {
    /// What crosses to the helper thread and back.
    struct Carried<T>(T);
    // SAFETY: the closure and its result are used by one thread at a time: the helper runs
    // the closure while the calling thread blocks in `join`, then the caller takes the result.
    // What they hold is wgpu objects (Send and Sync) and the wgpu backend's own state behind
    // its locks, none of it tied to the thread it is used on (the calls read no thread-local
    // of unirt's that differs between the two threads in a way they depend on).
    unsafe impl<T> Send for Carried<T> {}
    // Leaked, not dropped here, if no thread starts: dropping what `f` holds (wgpu objects)
    // on this thread is what must not happen.
    let job = Carried(std::mem::ManuallyDrop::new(f));
    // The calls keep the caller's identity (a capture it began, it may end).
    let caller = crate::thread_state::thread_identity();
    std::thread::scope(|s| {
        let helper = std::thread::Builder::new()
            .name("unirt-wgpu-exiting".into())
            .spawn_scoped(s, move || {
                let job = job;
                let f = std::mem::ManuallyDrop::into_inner(job.0);
                Carried(crate::thread_state::acting_for(caller, f))
            })?;
        // `f` runs inside `catching` or `catch_unwind` where it can panic.
        Ok(helper
            .join()
            .map_err(|_| std::io::Error::other("the helper thread panicked"))?
            .0)
    })
}

/// Runs `f`; a panic inside it becomes `Error::Driver { call, .. }`.
fn catching<T>(call: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = crate::error::panic_message(&*p)
                .unwrap_or_else(|| "a panic without a message".into());
            Err(Error::Driver {
                backend: DeviceKind::Wgpu,
                call: call.into(),
                code: None,
                message: format!("wgpu panicked; the call did not complete: {msg}"),
            })
        }
    }
}

/// Drops `x` (wgpu objects, or what holds them) inside a guard. wgpu's GL backend destroys a
/// buffer, texture or pipeline under the same 6 s context lock, so a drop can panic too; in a
/// destructor that panic would reach whoever dropped a plan, and during unwinding it aborts
/// the process ("panic in a destructor during cleanup"). Here it is caught and what was left
/// of `x` is leaked. Drop collections element by element, each through its own `release`: a
/// collection's remaining elements are dropped during the unwind of one that panicked.
pub(crate) fn release<T>(x: T) {
    // Once the process is exiting, what is left is leaked instead (`exit.rs`).
    let Ok(_pass) = super::exit::enter() else {
        std::mem::forget(x);
        return;
    };
    let drop_caught = move || {
        let _ = catch_unwind(AssertUnwindSafe(move || drop(x)));
    };
    if TORN_DOWN.get() {
        // Where no thread starts, `x` is leaked (see `elsewhere`).
        let _ = elsewhere(drop_caught);
        return;
    }
    drop_caught();
}

/// wgpu-hal's message when a thread gave up waiting for the GL context.
const GL_LOCK_TIMEOUT: &str = "Could not lock adapter context";

/// [`guarded`] for a call that may simply be made again (preparing a kernel: its pipelines
/// come from a cache, its buffers are its own): one that panicked while waiting for the GL
/// context — another thread held it through a long llvmpipe dispatch, past wgpu-hal's 6 s —
/// is made again, three times in all. A loaded 2-core CI machine saw a plan's preparation
/// fail so while another test's long dispatch ran.
pub(crate) fn guarded_retry<T>(call: &'static str, mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let mut tries = 1;
    loop {
        match guarded(call, &mut f) {
            Err(Error::Driver { message, .. })
                if tries < 3 && message.contains(GL_LOCK_TIMEOUT) =>
            {
                tries += 1;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_driver_error() {
        let r: Result<()> = guarded("malloc", || panic!("Could not lock adapter context"));
        match r {
            Err(Error::Driver { call, message, .. }) => {
                assert_eq!(call, "malloc");
                assert!(
                    message.contains("Could not lock adapter context"),
                    "{message}"
                );
            }
            other => panic!("expected a driver error, got {other:?}"),
        }
        assert_eq!(guarded("free", || Ok(7)).ok(), Some(7));
    }

    /// A drop that panics is caught, also while the thread is already unwinding (where an
    /// uncaught one aborts the process).
    #[test]
    fn release_catches_a_panicking_drop_even_while_unwinding() {
        struct Panics;
        impl Drop for Panics {
            fn drop(&mut self) {
                panic!("{GL_LOCK_TIMEOUT}. This is most-likely a deadlock.");
            }
        }
        struct Holder(Option<Panics>);
        impl Drop for Holder {
            fn drop(&mut self) {
                release(self.0.take());
            }
        }
        release(Panics);
        let r = catch_unwind(|| {
            let _held = Holder(Some(Panics));
            panic!("the caller's own panic");
        });
        assert!(r.is_err());
    }

    #[test]
    fn a_gl_lock_timeout_is_tried_again_twice() {
        let mut calls = 0;
        let r = guarded_retry("prepare", || {
            calls += 1;
            if calls < 3 {
                panic!("{GL_LOCK_TIMEOUT}. This is most-likely a deadlock.");
            }
            Ok(calls)
        });
        assert_eq!(r.ok(), Some(3));
        let mut calls = 0;
        let r: Result<()> = guarded_retry("prepare", || {
            calls += 1;
            panic!("{GL_LOCK_TIMEOUT}. This is most-likely a deadlock.")
        });
        assert!(
            matches!(r, Err(Error::Driver { .. })) && calls == 3,
            "{calls}"
        );
        // Any other panic is not retried.
        let mut calls = 0;
        let r: Result<()> = guarded_retry("prepare", || {
            calls += 1;
            panic!("something else")
        });
        assert!(r.is_err() && calls == 1);
    }
}
