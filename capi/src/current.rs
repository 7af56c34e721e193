//! Device types and the calling thread's current device.
//!
//! Upstream infinirt keeps a thread-local current device (CPU 0 until `infinirtSetDevice`);
//! this crate keeps its own, separate from anything in the `unirt` crate, and caches the opened
//! backend and its default stream beside it so an entry point reaches its backend with one
//! thread-local lookup and no lock.

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

use unirt::{AnyBackend, Backend, Device, DeviceKind, Error, Result, StreamId};

use crate::boundary::from_handle;

/// `INFINI_DEVICE_CPU`.
pub const DEVICE_CPU: c_int = 0;
/// `INFINI_DEVICE_NVIDIA`: unirt's CUDA devices.
pub const DEVICE_NVIDIA: c_int = 1;
/// `INFINI_DEVICE_TYPE_COUNT`: the number of upstream device types.
pub const DEVICE_TYPE_COUNT: c_int = 11;
/// `INFINI_DEVICE_UNIRT_WGPU`: unirt's extension type for its wgpu devices.
pub const DEVICE_UNIRT_WGPU: c_int = 100;

/// Upstream's device types, by value.
const UPSTREAM_NAMES: [&str; DEVICE_TYPE_COUNT as usize] = [
    "cpu",
    "nvidia",
    "cambricon",
    "ascend",
    "metax",
    "moore",
    "iluvatar",
    "kunlun",
    "hygon",
    "qy",
    "ali",
];

/// What an `infiniDevice_t` value names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceType {
    /// A vendor unirt drives.
    Unirt(DeviceKind),
    /// An upstream vendor unirt has no backend for: it has 0 devices.
    Absent(&'static str),
}

/// Decodes an `infiniDevice_t`; an unknown value is DEVICE_TYPE_NOT_SUPPORTED (as upstream).
pub fn device_type(t: c_int) -> Result<DeviceType> {
    match t {
        DEVICE_CPU => Ok(DeviceType::Unirt(DeviceKind::Cpu)),
        DEVICE_NVIDIA => Ok(DeviceType::Unirt(DeviceKind::Cuda)),
        DEVICE_UNIRT_WGPU => Ok(DeviceType::Unirt(DeviceKind::Wgpu)),
        2..=10 => Ok(DeviceType::Absent(UPSTREAM_NAMES[t as usize])),
        _ => Err(Error::DeviceTypeNotSupported(format!(
            "unknown infiniDevice_t value {t}"
        ))),
    }
}

/// The `infiniDevice_t` of a unirt vendor.
pub fn type_value(kind: DeviceKind) -> c_int {
    match kind {
        DeviceKind::Cpu => DEVICE_CPU,
        DeviceKind::Cuda => DEVICE_NVIDIA,
        DeviceKind::Wgpu => DEVICE_UNIRT_WGPU,
    }
}

/// The number of devices of a type (0 for vendors unirt lacks or finds unavailable).
pub fn count(t: c_int) -> Result<usize> {
    Ok(match device_type(t)? {
        DeviceType::Unirt(kind) => unirt::discover().count(kind),
        DeviceType::Absent(_) => 0,
    })
}

/// The unirt device for `(type, id)`: DEVICE_TYPE_NOT_SUPPORTED for a vendor without devices,
/// DEVICE_NOT_FOUND for an id the vendor does not have.
pub fn device(t: c_int, id: c_int) -> Result<Device> {
    let kind = match device_type(t)? {
        DeviceType::Unirt(kind) => kind,
        DeviceType::Absent(name) => {
            return Err(Error::DeviceTypeNotSupported(format!(
                "{name}: unirt has no backend for this vendor"
            )))
        }
    };
    // A vendor without devices is DEVICE_TYPE_NOT_SUPPORTED whatever the id, with discovery's
    // reason (unavailable driver, or a probe that found nothing), as upstream reports a type it
    // cannot drive; past that, a missing id is DEVICE_NOT_FOUND.
    let discovery = unirt::discover();
    if discovery.count(kind) == 0 {
        return Err(match discovery.info(Device::new(kind, 0)) {
            Err(Error::DeviceNotFound(m)) => Error::DeviceTypeNotSupported(m),
            Err(e) => e,
            Ok(_) => Error::Internal(format!("{kind} reports no devices yet has {kind}:0")),
        });
    }
    let index = usize::try_from(id)
        .map_err(|_| Error::DeviceNotFound(format!("{kind}:{id} (a negative device id)")))?;
    let device = Device::new(kind, index);
    discovery.info(device)?;
    Ok(device)
}

/// The calling thread's device, opened.
pub struct Current {
    pub device: Device,
    pub backend: Arc<AnyBackend>,
    pub default_stream: StreamId,
}

impl Current {
    fn open(device: Device) -> Result<Self> {
        let backend = unirt::open(device)?;
        let default_stream = backend.default_stream();
        Ok(Current {
            device,
            backend,
            default_stream,
        })
    }

    /// A C stream handle: null is the device's default stream.
    #[inline]
    pub fn stream(&self, s: *mut c_void) -> StreamId {
        if s.is_null() {
            self.default_stream
        } else {
            StreamId(from_handle(s))
        }
    }
}

thread_local! {
    /// The opened backend and default stream of the thread's device: the fast path.
    static CURRENT: RefCell<Option<Current>> = const { RefCell::new(None) };
    /// The thread's device alone. A `Copy` value with no destructor stays readable while the
    /// thread exits (in thread-exit destructors and, on the main thread, in atexit handlers),
    /// after `CURRENT` has been torn down.
    static CURRENT_DEVICE: Cell<Device> = const { Cell::new(Device::CPU) };
}

/// The thread's device, also during thread exit (CPU 0 until set).
fn remembered_device() -> Device {
    CURRENT_DEVICE.try_with(Cell::get).unwrap_or(Device::CPU)
}

/// Runs `f` on the calling thread's current device (opening CPU 0 on first use).
///
/// Calls made while the thread exits — from a thread-exit destructor, or from an atexit
/// handler after the main thread's locals are gone — still run on the thread's device: the
/// cached backend is gone then, so it is looked up again in unirt's process-wide table.
#[inline]
pub fn with_current<R>(f: impl FnOnce(&Current) -> Result<R>) -> Result<R> {
    let mut f = Some(f);
    let mut run = |cur: &Current| match f.take() {
        Some(f) => f(cur),
        None => Err(Error::Internal("an entry point ran twice".into())),
    };
    let fast = CURRENT.try_with(|cell| {
        if cell.borrow().is_none() {
            let cur = Current::open(remembered_device())?;
            *cell.borrow_mut() = Some(cur);
        }
        match cell.borrow().as_ref() {
            Some(cur) => run(cur),
            None => Err(Error::Internal("no current device".into())),
        }
    });
    match fast {
        Ok(r) => r,
        Err(_) => run(&Current::open(remembered_device())?),
    }
}

/// Makes `device` the calling thread's current device, opening it if needed.
pub fn set_current(device: Device) -> Result<()> {
    if remembered_device() == device && CURRENT.try_with(|c| c.borrow().is_some()) == Ok(true) {
        return Ok(());
    }
    let cur = Current::open(device)?;
    let _ = CURRENT_DEVICE.try_with(|d| d.set(device));
    // While the thread exits the cache is gone; the remembered device is enough then.
    let _ = CURRENT.try_with(|cell| *cell.borrow_mut() = Some(cur));
    Ok(())
}

/// The calling thread's current device, without opening it (CPU 0 until set).
pub fn current_device() -> Result<Device> {
    Ok(remembered_device())
}
