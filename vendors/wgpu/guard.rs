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

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::device::DeviceKind;
use crate::error::{Error, Result};

/// Runs `f`; a panic inside it becomes `Error::Driver { call, .. }`.
pub(crate) fn guarded<T>(call: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
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
