//! The one error type of unirt.
//!
//! The first variants map one-to-one onto `infiniStatus_t` (see [`Error::status`]); the rest
//! carry what a Rust caller needs to act on a failure (which backend, which handle, how many
//! bytes). The C ABI turns every variant into a status code; nothing panics across it.

use crate::device::{Device, DeviceKind, ParseDeviceError};
use crate::tensor::DType;

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every way a unirt call can fail.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A bug or an unexpected driver answer (`INFINI_STATUS_INTERNAL_ERROR`).
    #[error("internal error: {0}")]
    Internal(String),
    /// The operation exists in the API but nobody implements it yet (`NOT_IMPLEMENTED`).
    #[error("not implemented: {0}")]
    NotImplemented(String),
    /// An argument is out of its domain (`BAD_PARAM`).
    #[error("bad parameter: {0}")]
    BadParam(String),
    /// A required pointer (output or input) is null (`NULL_POINTER`).
    #[error("null pointer: {0}")]
    NullPointer(String),
    /// The device type is unknown or its vendor has no devices (`DEVICE_TYPE_NOT_SUPPORTED`).
    #[error("device type not supported: {0}")]
    DeviceTypeNotSupported(String),
    /// The vendor exists but has no device at that index (`DEVICE_NOT_FOUND`).
    #[error("device not found: {0}")]
    DeviceNotFound(String),
    /// The device exists but could not be brought up (`DEVICE_NOT_INITIALIZED`).
    #[error("device not initialized: {0}")]
    DeviceNotInitialized(String),
    /// The device's architecture cannot run this (`DEVICE_ARCHITECTURE_NOT_SUPPORTED`).
    #[error("device architecture not supported: {0}")]
    ArchitectureNotSupported(String),
    /// `BAD_TENSOR_DTYPE`.
    #[error("bad tensor dtype: {0}")]
    BadTensorDtype(String),
    /// `BAD_TENSOR_SHAPE`.
    #[error("bad tensor shape: {0}")]
    BadTensorShape(String),
    /// `BAD_TENSOR_STRIDES`.
    #[error("bad tensor strides: {0}")]
    BadTensorStrides(String),
    /// `INSUFFICIENT_WORKSPACE`.
    #[error("insufficient workspace: need {needed} bytes, got {given}")]
    InsufficientWorkspace { needed: u64, given: u64 },

    /// A vendor could not be used on this machine; `reason` says what a person can do about it.
    #[error("{backend} unavailable: {reason}")]
    Unavailable { backend: DeviceKind, reason: String },
    /// The device (or host) is out of memory for this request.
    #[error("out of memory: {requested} bytes requested on {device}: {detail}")]
    OutOfMemory {
        /// The vendor whose allocation failed.
        backend: DeviceKind,
        /// Which memory of it, for people: `"cuda:0"`, `"wgpu:1 pinned host"`.
        device: String,
        requested: u64,
        detail: String,
    },
    /// A request is larger than the backend can ever satisfy in one piece (a buffer limit).
    #[error("too large: {requested} bytes requested, the limit on {device} is {limit}")]
    TooLarge {
        device: String,
        requested: u64,
        limit: u64,
    },
    /// An address range is not inside one live allocation.
    #[error("out of bounds: [{addr:#x}, +{len}) {detail}")]
    OutOfBounds { addr: u64, len: u64, detail: String },
    /// A stream, event, graph, pointer or other handle is not live on this device.
    #[error("invalid {kind} handle {handle:#x}")]
    InvalidHandle { kind: &'static str, handle: u64 },
    /// `end_capture` on a stream that is not capturing.
    #[error("stream is not capturing")]
    NotCapturing,
    /// The operation is not allowed while the stream (or device) is capturing.
    #[error("not permitted while capturing: {0}")]
    Capturing(String),
    /// Recorded work has not completed yet (elapsed time of a pending event).
    #[error("not ready: {0}")]
    NotReady(String),
    /// A wait that would wait for itself: a CPU kernel synchronising the stream that runs it,
    /// or a graph's host step replaying its own exec. Refused instead of hanging forever.
    #[error("would wait for itself: {0}")]
    WaitsForItself(String),
    /// The backend cannot do this at all; `what` names the operation.
    #[error("{what} is not supported on {backend}")]
    Unsupported { what: String, backend: DeviceKind },
    /// A driver call failed.
    #[error("{backend} driver call {call} failed: {message}")]
    Driver {
        backend: DeviceKind,
        /// The entry point that failed, e.g. `"cuMemAlloc"`.
        call: String,
        /// The driver's own status code (a `CUresult`, an `nvrtcResult`), when it has one;
        /// `None` for drivers that report errors as values (wgpu).
        code: Option<i32>,
        /// The driver's name and description of the code.
        message: String,
    },
    /// A kernel failed to compile; `log` is the compiler's output.
    #[error("kernel {kernel} failed to compile: {log}")]
    KernelCompile { kernel: String, log: String },
    /// The object was made before this process was forked and cannot be used in the child
    /// (see [`crate::fork`]); the child opens its devices again.
    #[error("forked: {0}")]
    Forked(String),

    /// No kernel is registered for (op, device kind, dtype) in the
    /// [`KernelRegistry`](crate::ops::KernelRegistry). Never a silent fallback to another device.
    #[error("{op} has no {dtype} kernel registered for {device}")]
    UnsupportedKernel {
        op: String,
        device: DeviceKind,
        dtype: DType,
    },
    /// A tensor's shape is not the one the operator needs.
    #[error("{op}: expected shape {expected:?}, got {got:?}")]
    ShapeMismatch {
        op: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// Two shapes cannot be broadcast together (NumPy rules).
    #[error("{op}: shapes {lhs:?} and {rhs:?} cannot be broadcast together")]
    NotBroadcastable {
        op: String,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
    },
    /// An axis is outside `-ndim..ndim`.
    #[error("{op}: axis {axis} is out of range for {ndim} dimensions")]
    AxisOutOfRange {
        op: String,
        axis: isize,
        ndim: usize,
    },
    /// A tensor's dtype is not the one the operator needs.
    #[error("{op}: expected dtype {expected}, got {got}")]
    DTypeMismatch {
        op: String,
        expected: DType,
        got: DType,
    },
    /// A tensor lives on another device than the operator's.
    #[error("{op}: expected a tensor on {expected}, got one on {got}")]
    DeviceMismatch {
        op: String,
        expected: Device,
        got: Device,
    },
    /// A reshape that the strides do not allow without a copy (call `contiguous()` first).
    #[error("cannot view shape {shape:?} (strides {strides:?}) as {target:?} without a copy")]
    NotAView {
        shape: Vec<usize>,
        strides: Vec<usize>,
        target: Vec<usize>,
    },
    /// An output overlaps an input (or another output) where the operator does not allow it.
    #[error("{op}: {detail}")]
    Aliasing { op: String, detail: String },
    /// An index value (an embedding id, a gather index) is outside `0..limit`.
    #[error("{op}: index {index} is out of range 0..{limit}")]
    IndexOutOfRange { op: String, index: i64, limit: u64 },
}

/// `infiniStatus_t` values (the C ABI's status codes), as InfiniCore's `infinicore.h` defines them.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InfiniStatus {
    Success = 0,
    InternalError = 1,
    NotImplemented = 2,
    BadParam = 3,
    NullPointer = 4,
    DeviceTypeNotSupported = 5,
    DeviceNotFound = 6,
    DeviceNotInitialized = 7,
    DeviceArchitectureNotSupported = 8,
    BadTensorDtype = 10,
    BadTensorShape = 11,
    BadTensorStrides = 12,
    InsufficientWorkspace = 13,
}

impl Error {
    /// The `infiniStatus_t` a C caller sees for this error.
    pub fn status(&self) -> InfiniStatus {
        use Error::*;
        match self {
            Internal(_) | Driver { .. } | KernelCompile { .. } => InfiniStatus::InternalError,
            NotImplemented(_) | Unsupported { .. } => InfiniStatus::NotImplemented,
            BadParam(_)
            | OutOfBounds { .. }
            | InvalidHandle { .. }
            | NotCapturing
            | Capturing(_)
            | NotReady(_)
            | WaitsForItself(_)
            | TooLarge { .. } => InfiniStatus::BadParam,
            NullPointer(_) => InfiniStatus::NullPointer,
            DeviceTypeNotSupported(_) | Unavailable { .. } => InfiniStatus::DeviceTypeNotSupported,
            DeviceNotFound(_) => InfiniStatus::DeviceNotFound,
            // The child's copy of the device is not initialised; it must open it again.
            DeviceNotInitialized(_) | Forked(_) => InfiniStatus::DeviceNotInitialized,
            ArchitectureNotSupported(_) => InfiniStatus::DeviceArchitectureNotSupported,
            BadTensorDtype(_) => InfiniStatus::BadTensorDtype,
            BadTensorShape(_) => InfiniStatus::BadTensorShape,
            BadTensorStrides(_) => InfiniStatus::BadTensorStrides,
            InsufficientWorkspace { .. } => InfiniStatus::InsufficientWorkspace,
            UnsupportedKernel { .. } => InfiniStatus::NotImplemented,
            ShapeMismatch { .. } | NotBroadcastable { .. } | AxisOutOfRange { .. } => {
                InfiniStatus::BadTensorShape
            }
            DTypeMismatch { .. } => InfiniStatus::BadTensorDtype,
            NotAView { .. } => InfiniStatus::BadTensorStrides,
            DeviceMismatch { .. } | Aliasing { .. } | IndexOutOfRange { .. } => {
                InfiniStatus::BadParam
            }
            // Upstream has no OOM status; CUDA's cudaErrorMemoryAllocation surfaces as
            // INTERNAL_ERROR through infinirt, so C callers see the same code here.
            OutOfMemory { .. } => InfiniStatus::InternalError,
        }
    }

    /// A short stable name of the variant, used by the conformance suite and the JSON reports.
    pub fn kind_name(&self) -> &'static str {
        use Error::*;
        match self {
            Internal(_) => "internal",
            NotImplemented(_) => "not_implemented",
            BadParam(_) => "bad_param",
            NullPointer(_) => "null_pointer",
            DeviceTypeNotSupported(_) => "device_type_not_supported",
            DeviceNotFound(_) => "device_not_found",
            DeviceNotInitialized(_) => "device_not_initialized",
            ArchitectureNotSupported(_) => "architecture_not_supported",
            BadTensorDtype(_) => "bad_tensor_dtype",
            BadTensorShape(_) => "bad_tensor_shape",
            BadTensorStrides(_) => "bad_tensor_strides",
            InsufficientWorkspace { .. } => "insufficient_workspace",
            Unavailable { .. } => "unavailable",
            OutOfMemory { .. } => "out_of_memory",
            TooLarge { .. } => "too_large",
            OutOfBounds { .. } => "out_of_bounds",
            InvalidHandle { .. } => "invalid_handle",
            NotCapturing => "not_capturing",
            Capturing(_) => "capturing",
            NotReady(_) => "not_ready",
            WaitsForItself(_) => "waits_for_itself",
            Unsupported { .. } => "unsupported",
            Driver { .. } => "driver",
            KernelCompile { .. } => "kernel_compile",
            Forked(_) => "forked",
            UnsupportedKernel { .. } => "unsupported_kernel",
            ShapeMismatch { .. } => "shape_mismatch",
            NotBroadcastable { .. } => "not_broadcastable",
            AxisOutOfRange { .. } => "axis_out_of_range",
            DTypeMismatch { .. } => "dtype_mismatch",
            DeviceMismatch { .. } => "device_mismatch",
            NotAView { .. } => "not_a_view",
            Aliasing { .. } => "aliasing",
            IndexOutOfRange { .. } => "index_out_of_range",
        }
    }

    pub(crate) fn unsupported(what: impl Into<String>, backend: DeviceKind) -> Self {
        Error::Unsupported {
            what: what.into(),
            backend,
        }
    }

    /// The driver's status code for a failed driver call (`CUresult`, `nvrtcResult`), if
    /// the error is one and the driver has codes.
    pub fn driver_code(&self) -> Option<i32> {
        match self {
            Error::Driver { code, .. } => *code,
            _ => None,
        }
    }

    pub(crate) fn invalid(kind: &'static str, handle: u64) -> Self {
        Error::InvalidHandle { kind, handle }
    }
}

impl From<ParseDeviceError> for Error {
    /// A bad device or vendor name is a bad parameter.
    fn from(e: ParseDeviceError) -> Self {
        Error::BadParam(e.0)
    }
}

/// The message of a caught panic (its `&str` or `String` payload), if it has one: for the
/// places that turn a driver's or a kernel's panic into an error.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
}
