//! `CUresult` values (cuda.h's numbering), their names and texts, and the one wrapper every
//! exported function runs through: fault injection, sticky context errors, no unwinding.

use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A `CUresult` (a C enum: `int`).
pub type CUresult = i32;

pub const SUCCESS: CUresult = 0;
pub const INVALID_VALUE: CUresult = 1;
pub const OUT_OF_MEMORY: CUresult = 2;
pub const NOT_INITIALIZED: CUresult = 3;
pub const NO_DEVICE: CUresult = 100;
pub const INVALID_DEVICE: CUresult = 101;
pub const INVALID_IMAGE: CUresult = 200;
pub const INVALID_CONTEXT: CUresult = 201;
pub const INVALID_HANDLE: CUresult = 400;
pub const ILLEGAL_STATE: CUresult = 401;
pub const NOT_FOUND: CUresult = 500;
pub const NOT_READY: CUresult = 600;
pub const ILLEGAL_ADDRESS: CUresult = 700;
pub const PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
pub const MISALIGNED_ADDRESS: CUresult = 716;
pub const LAUNCH_FAILED: CUresult = 719;
pub const NOT_SUPPORTED: CUresult = 801;
pub const STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const STREAM_CAPTURE_INVALIDATED: CUresult = 901;
pub const STREAM_CAPTURE_IMPLICIT: CUresult = 906;
pub const CAPTURED_EVENT: CUresult = 907;
pub const STREAM_CAPTURE_WRONG_THREAD: CUresult = 908;
pub const UNKNOWN: CUresult = 999;

/// Every code this driver can return or be told to inject: (value, name, text).
pub const CODES: &[(CUresult, &str, &str)] = &[
    (0, "CUDA_SUCCESS", "no error"),
    (1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
    (3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"),
    (4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"),
    (
        100,
        "CUDA_ERROR_NO_DEVICE",
        "no CUDA-capable device is detected",
    ),
    (101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"),
    (
        200,
        "CUDA_ERROR_INVALID_IMAGE",
        "device kernel image is invalid",
    ),
    (201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"),
    (
        209,
        "CUDA_ERROR_NO_BINARY_FOR_GPU",
        "no kernel image is available for execution on the device",
    ),
    (
        218,
        "CUDA_ERROR_INVALID_PTX",
        "a PTX JIT compilation failed",
    ),
    (400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"),
    (
        401,
        "CUDA_ERROR_ILLEGAL_STATE",
        "the operation cannot be performed in the present state",
    ),
    (500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"),
    (600, "CUDA_ERROR_NOT_READY", "device not ready"),
    (
        700,
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "an illegal memory access was encountered",
    ),
    (
        701,
        "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        "too many resources requested for launch",
    ),
    (
        702,
        "CUDA_ERROR_LAUNCH_TIMEOUT",
        "the launch timed out and was terminated",
    ),
    (
        704,
        "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        "peer access is already enabled",
    ),
    (
        709,
        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "context is destroyed",
    ),
    (710, "CUDA_ERROR_ASSERT", "device-side assert triggered"),
    (
        714,
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "hardware stack error",
    ),
    (
        715,
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "an illegal instruction was encountered",
    ),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"),
    (
        719,
        "CUDA_ERROR_LAUNCH_FAILED",
        "unspecified launch failure",
    ),
    (800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"),
    (801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"),
    (
        900,
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        "operation not permitted when stream is capturing",
    ),
    (
        901,
        "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        "operation failed due to a previous error during capture",
    ),
    (
        902,
        "CUDA_ERROR_STREAM_CAPTURE_MERGE",
        "operation would result in a merge of separate capture sequences",
    ),
    (
        903,
        "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
        "capture was not ended in the same stream as it began",
    ),
    (
        904,
        "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
        "capturing stream has unjoined work",
    ),
    (
        905,
        "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
        "dependency created on uncaptured work in another stream",
    ),
    (
        906,
        "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
        "operation would make the legacy stream depend on a capturing blocking stream",
    ),
    (
        907,
        "CUDA_ERROR_CAPTURED_EVENT",
        "operation not permitted on an event last recorded in a capturing stream",
    ),
    (
        908,
        "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
        "attempt to terminate a thread-local capture sequence from another thread",
    ),
    (999, "CUDA_ERROR_UNKNOWN", "unknown error"),
];

/// The code called `name` (`CUDA_ERROR_OUT_OF_MEMORY`, `OUT_OF_MEMORY`) or written as a number.
pub fn parse_code(name: &str) -> Option<CUresult> {
    if let Ok(v) = name.parse::<CUresult>() {
        return Some(v);
    }
    CODES
        .iter()
        .find(|(_, n, _)| *n == name || n.strip_prefix("CUDA_ERROR_") == Some(name))
        .map(|(v, _, _)| *v)
}

/// The name of `r`, for messages.
pub fn name_of(r: CUresult) -> String {
    CODES
        .iter()
        .find(|(v, _, _)| *v == r)
        .map_or_else(|| format!("CUresult {r}"), |(_, n, _)| n.to_string())
}

/// Errors after which a real context is unusable until destroyed: every later call that uses
/// the context returns the same error ("sticky" errors: a kernel faulted on the device).
pub fn is_sticky(r: CUresult) -> bool {
    matches!(r, 700 | 702 | 710 | 714 | 715 | 716 | 717 | 718 | 719)
}

/// Runs an exported function: counts the call, applies an injected fault, and turns a panic of
/// this library into `CUDA_ERROR_UNKNOWN` (nothing unwinds into the caller).
pub fn entry(name: &'static str, body: impl FnOnce() -> CUresult) -> CUresult {
    entry_with(name, |_| body())
}

/// [`entry`] for a function that must act on an injected failure itself: `body` gets the
/// injected code (and runs only then, for `Fail`) — `cuStreamEndCapture` ends the capture
/// even when it fails, as CUDA documents.
pub fn entry_with(name: &'static str, body: impl FnOnce(Option<CUresult>) -> CUresult) -> CUresult {
    match crate::faults::on_call(name) {
        Some(crate::faults::Action::Fail(code)) => {
            crate::state::apply_injected(code);
            if name == "cuStreamEndCapture" {
                run(name, || body(Some(code)));
            }
            code
        }
        Some(crate::faults::Action::After(code)) => {
            let r = run(name, || body(None));
            crate::state::apply_injected(code);
            r
        }
        None => run(name, || body(None)),
    }
}

fn run(name: &'static str, body: impl FnOnce() -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        crate::control::misuse(format!("{name}: the fake driver panicked (a bug in it)"));
        UNKNOWN
    })
}

/// Writes a static C string pointer for `r` (name or text) through `out`.
///
/// # Safety
/// `out` must be null or valid for one pointer write.
pub unsafe fn error_string(r: CUresult, out: *mut *const c_char, text: bool) -> CUresult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    // C strings for every code, built once (NUL-terminated, 'static).
    static TABLE: std::sync::OnceLock<Vec<(CUresult, std::ffi::CString, std::ffi::CString)>> =
        std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        CODES
            .iter()
            .filter_map(|(v, n, t)| {
                Some((
                    *v,
                    std::ffi::CString::new(*n).ok()?,
                    std::ffi::CString::new(*t).ok()?,
                ))
            })
            .collect()
    });
    let found = table.iter().find(|(v, _, _)| *v == r);
    let p = match found {
        Some((_, n, t)) => (if text { t } else { n }).as_ptr(),
        None => std::ptr::null(),
    };
    // SAFETY: `out` is non-null and valid for a write (the caller's contract).
    unsafe { *out = p };
    if p.is_null() {
        INVALID_VALUE
    } else {
        SUCCESS
    }
}
