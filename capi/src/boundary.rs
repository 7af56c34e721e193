//! The boundary between C and Rust: statuses, the panic guard, output parameters, handles and
//! the thread's last error message.
//!
//! Every entry point runs its body through [`guard`], which turns an [`Error`] into its
//! `infiniStatus_t` and a panic into `INFINI_STATUS_INTERNAL_ERROR`, so nothing unwinds into C.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use unirt::{Error, Result};

/// `infiniStatus_t`: a C enum, passed as `int`.
pub type Status = c_int;

/// `INFINI_STATUS_SUCCESS`.
pub const SUCCESS: Status = 0;
/// `INFINI_STATUS_INTERNAL_ERROR`: what a caught panic becomes.
pub const INTERNAL_ERROR: Status = 1;

// Handles are the HAL's u64 ids stored in `void *`; that needs 64-bit pointers.
#[cfg(not(target_pointer_width = "64"))]
compile_error!("the infinirt C ABI stores 64-bit HAL handles in `void *`: 64-bit targets only");

thread_local! {
    /// The message of the last failed call on this thread (`unirtGetLastErrorMessage`).
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Runs an entry point's body: `Ok` is SUCCESS, an error its status, a panic INTERNAL_ERROR.
#[inline]
pub fn guard<F: FnOnce() -> Result<()>>(body: F) -> Status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(e)) => failed(&e),
        Err(payload) => panicked(payload),
    }
}

#[cold]
#[inline(never)]
fn failed(e: &Error) -> Status {
    remember(e.to_string());
    e.status() as Status
}

#[cold]
#[inline(never)]
fn panicked(payload: Box<dyn Any + Send>) -> Status {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".into());
    // A payload whose destructor panics must not unwind into C either.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
    remember(format!("internal error: unirt panicked: {msg}"));
    INTERNAL_ERROR
}

fn remember(msg: String) {
    // try_with: during thread teardown the slot may be gone; the status still reaches C.
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut s) = slot.try_borrow_mut() {
            *s = msg;
        }
    });
}

/// Copies this thread's last error message into `buf` (NUL-terminated, truncated to `size`).
///
/// # Safety
/// A non-null `buf` must be writable for `size` bytes.
pub unsafe fn last_error_into(buf: *mut c_char, size: usize) -> Result<()> {
    if buf.is_null() {
        return Err(Error::NullPointer("buf".into()));
    }
    let msg = LAST_ERROR
        .try_with(|s| s.borrow().clone())
        .unwrap_or_default();
    // SAFETY: the caller promises `buf` is writable for `size` bytes (the documented contract).
    unsafe { write_c_string(buf, size, &msg) };
    Ok(())
}

/// Writes `text` into a C buffer of `size` bytes, truncating and always NUL-terminating
/// (nothing is written when `size` is 0).
///
/// # Safety
/// `buf` must be non-null and writable for `size` bytes.
pub unsafe fn write_c_string(buf: *mut c_char, size: usize, text: &str) {
    if size == 0 {
        return;
    }
    let n = text.len().min(size - 1);
    // SAFETY: n + 1 <= size bytes are written, which the caller promises are writable; the
    // source is a live &str of at least n bytes and cannot overlap a C buffer we were handed.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        buf.add(n).write(0);
    }
}

/// Refuses a null output pointer; call before doing any work the output would describe.
#[inline]
pub fn check_out<T>(ptr: *mut T, name: &'static str) -> Result<()> {
    if ptr.is_null() {
        return Err(null(name));
    }
    Ok(())
}

#[cold]
fn null(name: &'static str) -> Error {
    Error::NullPointer(format!("{name} is NULL"))
}

/// Writes a value through a C output pointer (refusing null).
///
/// # Safety
/// A non-null `ptr` must be valid and aligned for writing a `T` — the contract of every
/// output parameter of `infinirt.h`.
#[inline]
pub unsafe fn write_out<T>(ptr: *mut T, value: T, name: &'static str) -> Result<()> {
    check_out(ptr, name)?;
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { ptr.write(value) };
    Ok(())
}

/// A HAL handle (u64 id) from a C `void *` handle.
#[inline]
pub fn from_handle(h: *mut c_void) -> u64 {
    h as usize as u64
}

/// A C `void *` handle from a HAL handle.
#[inline]
pub fn to_handle(id: u64) -> *mut c_void {
    id as usize as *mut c_void
}

/// A required (non-stream) handle: null is NULL_POINTER, anything else goes to the backend,
/// which validates it.
#[inline]
pub fn required(h: *mut c_void, name: &'static str) -> Result<u64> {
    if h.is_null() {
        return Err(null(name));
    }
    Ok(from_handle(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        let mut buf = [0 as c_char; 256];
        // SAFETY: buf is writable for its length.
        let r = unsafe { last_error_into(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(r.map(|_| 0), Ok(0));
        // SAFETY: last_error_into NUL-terminates inside the buffer.
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_internal_error() {
        let status = guard(|| panic!("boom {}", 42));
        assert_eq!(status, INTERNAL_ERROR);
        assert!(last().contains("boom 42"), "{}", last());
    }

    #[test]
    fn errors_become_their_status() {
        assert_eq!(guard(|| Ok(())), SUCCESS);
        assert_eq!(
            guard(|| Err(Error::NullPointer("x".into()))),
            unirt::InfiniStatus::NullPointer as Status
        );
        assert_eq!(
            guard(|| Err(Error::InvalidHandle {
                kind: "stream",
                handle: 16
            })),
            unirt::InfiniStatus::BadParam as Status
        );
        assert!(last().contains("stream"));
    }

    #[test]
    fn c_strings_truncate_and_terminate() {
        let mut buf = [1 as c_char; 4];
        // SAFETY: buf is writable for its length.
        unsafe { write_c_string(buf.as_mut_ptr(), buf.len(), "hello") };
        assert_eq!(buf, [b'h' as c_char, b'e' as c_char, b'l' as c_char, 0]);
        // SAFETY: size 0 writes nothing.
        unsafe { write_c_string(buf.as_mut_ptr(), 0, "zz") };
        assert_eq!(buf[0], b'h' as c_char);
    }
}
