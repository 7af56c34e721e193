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
}
