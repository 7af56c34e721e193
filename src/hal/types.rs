//! Plain values the HAL passes around.

use std::fmt;

use crate::error::{Error, Result};

/// An address in a device's address space: a host address on CPU, a `CUdeviceptr` on CUDA, a
/// virtual address that the backend maps to (buffer, offset) on wgpu.
///
/// Arithmetic is plain address arithmetic, so interior pointers work on every backend:
///
/// ```
/// use unirt::DevicePtr;
/// let p = DevicePtr(0x1000);
/// assert_eq!(p.offset(16), DevicePtr(0x1010));
/// assert!(DevicePtr::NULL.is_null());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    pub const NULL: DevicePtr = DevicePtr(0);

    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address `bytes` further on (wrapping arithmetic is the caller's bug, and the
    /// allocation table will refuse the result).
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0.wrapping_add(bytes))
    }

    pub fn addr(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x})", self.0)
    }
}

/// An address of host memory from [`Backend::malloc_host`](crate::hal::Backend::malloc_host).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct HostPtr(pub u64);

impl HostPtr {
    pub const NULL: HostPtr = HostPtr(0);

    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    pub fn as_mut_ptr(self) -> *mut u8 {
        self.0 as usize as *mut u8
    }
}

impl fmt::Debug for HostPtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostPtr({:#x})", self.0)
    }
}

macro_rules! handle {
    ($(#[$m:meta])* $name:ident, $what:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u64);

        impl $name {
            /// The name used in [`Error::InvalidHandle`].
            pub const KIND: &'static str = $what;

            pub fn invalid(self) -> Error {
                Error::InvalidHandle { kind: $what, handle: self.0 }
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
            }
        }
    };
}

handle!(
    /// A stream of one device.
    StreamId,
    "stream"
);
handle!(
    /// An event of one device.
    EventId,
    "event"
);
handle!(
    /// A captured graph of one device.
    GraphId,
    "graph"
);
handle!(
    /// An instantiated, launchable graph of one device.
    GraphExecId,
    "graph exec"
);

/// Event creation flags, with infinirt's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EventFlags(pub u32);

impl EventFlags {
    pub const DEFAULT: EventFlags = EventFlags(0x0);
    /// The event records completion only; elapsed time is refused.
    pub const DISABLE_TIMING: EventFlags = EventFlags(0x1);
    /// Synchronising on the event blocks the thread instead of spinning.
    pub const BLOCKING_SYNC: EventFlags = EventFlags(0x2);
    const ALL: u32 = 0x3;

    /// Checks that only known bits are set.
    pub fn new(bits: u32) -> Result<Self> {
        if bits & !Self::ALL != 0 {
            return Err(Error::BadParam(format!("unknown event flags {bits:#x}")));
        }
        Ok(EventFlags(bits))
    }

    pub fn timing(self) -> bool {
        self.0 & Self::DISABLE_TIMING.0 == 0
    }

    pub fn blocking(self) -> bool {
        self.0 & Self::BLOCKING_SYNC.0 != 0
    }
}

/// What an event query says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum EventStatus {
    Complete = 0,
    NotReady = 1,
}

/// The direction of a copy, with infinirt's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum MemcpyKind {
    H2H = 0,
    H2D = 1,
    D2H = 2,
    D2D = 3,
}

impl MemcpyKind {
    pub const ALL: [MemcpyKind; 4] = [
        MemcpyKind::H2H,
        MemcpyKind::H2D,
        MemcpyKind::D2H,
        MemcpyKind::D2D,
    ];

    pub fn from_raw(raw: i32) -> Result<Self> {
        Ok(match raw {
            0 => MemcpyKind::H2H,
            1 => MemcpyKind::H2D,
            2 => MemcpyKind::D2H,
            3 => MemcpyKind::D2D,
            _ => return Err(Error::BadParam(format!("unknown memcpy kind {raw}"))),
        })
    }

    /// Whether the source / destination lies on the device.
    pub fn src_on_device(self) -> bool {
        matches!(self, MemcpyKind::D2H | MemcpyKind::D2D)
    }

    pub fn dst_on_device(self) -> bool {
        matches!(self, MemcpyKind::H2D | MemcpyKind::D2D)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MemcpyKind::H2H => "h2h",
            MemcpyKind::H2D => "h2d",
            MemcpyKind::D2H => "d2h",
            MemcpyKind::D2D => "d2d",
        }
    }
}

/// Capture modes, with infinirt's (and `CUstreamCaptureMode`'s) values.
///
/// What a capture in progress allows is the same in every mode and on every backend (the
/// conformance cases `capture::modes::*` check each call class in each mode, from the
/// capturing thread and from another thread at once):
///
/// | call while a stream captures | what happens |
/// |---|---|
/// | async work on the capturing stream (copies, sets, launches, event records and waits, graph launches) | recorded, not run; it runs at each replay |
/// | anything on another stream; synchronous copies and sets (default stream not capturing) | runs as usual |
/// | raw `malloc`/`free`, `malloc_host`/`free_host`, the caching allocator (growth included) | runs; never recorded; a replay over memory freed since the capture is refused |
/// | device `synchronize` | waits for every stream but the capturing ones |
/// | `stream_synchronize` of the capturing stream; `event_query`/`event_synchronize`/`event_elapsed_ms`, or a wait from a non-capturing stream, on an event recorded inside the capture | refused with [`Error::Capturing`]; the capture goes on |
/// | stream-ordered `malloc_async`/`free_async` on the capturing stream | [`Error::Unsupported`] (no backend records allocation nodes) |
/// | `end_capture` from another thread than the one that began a Global or ThreadLocal capture | refused with [`Error::Capturing`], as CUDA does; the capture goes on (a Relaxed capture may be ended anywhere) |
///
/// Nothing in that table invalidates the capture. On CUDA the mode is passed to
/// `cuStreamBeginCapture`, where it decides which "potentially unsafe" calls of *other* code
/// in the process (CUDA calls made outside unirt) invalidate the capture; unirt's own
/// allocations, frees, module loads, device waits and pageable copies run in Relaxed mode
/// (`cuThreadExchangeStreamCaptureMode`), so they never do, whatever the mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum CaptureMode {
    Global = 0,
    ThreadLocal = 1,
    Relaxed = 2,
}

impl CaptureMode {
    pub fn from_raw(raw: i32) -> Result<Self> {
        Ok(match raw {
            0 => CaptureMode::Global,
            1 => CaptureMode::ThreadLocal,
            2 => CaptureMode::Relaxed,
            _ => return Err(Error::BadParam(format!("unknown capture mode {raw}"))),
        })
    }
}

/// One kernel argument: a device pointer or a scalar of any element type.
///
/// The built-in `fill` / `add_f32` kernels take only `Ptr`, `U32` and `F32`; the other scalars
/// serve registered operator kernels (see `unirt::ops`), which receive them as they are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    Ptr(DevicePtr),
    U32(u32),
    F32(f32),
    I32(i32),
    I64(i64),
    U64(u64),
    F64(f64),
    F16(half::f16),
    BF16(half::bf16),
    U8(u8),
    Bool(bool),
}

/// A function that a host-executed stream (the CPU backend's worker) runs in stream order:
/// how CPU operator kernels are enqueued. It may run more than once (graph replay). An error
/// it returns is reported by the stream's next synchronisation, as a failed kernel is.
pub type HostTask = std::sync::Arc<dyn Fn() -> Result<()> + Send + Sync>;
