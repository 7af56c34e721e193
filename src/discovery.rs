//! Run-time discovery: which vendors this machine has, and opening their devices.
//!
//! Each vendor has a cheap, infallible `probe()` that answers [`Probe::Available`] with its
//! devices or [`Probe::Unavailable`] with a reason a person can act on ("libcuda not found
//! (searched …)"). "Unavailable" is a status, not an error: [`discover`] always succeeds.
//! Opening a device ([`open`]) is fallible and lazy; each device is opened once per process.
//!
//! `UNIRT_BACKENDS=cpu,wgpu` restricts which vendors are probed; the others report
//! "disabled by UNIRT_BACKENDS".
//!
//! "Once per process" is meant literally: a child made by `fork` probes and opens afresh (see
//! [`crate::fork`]); the parent's devices answer [`Error::Forked`] there.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

use crate::device::{Device, DeviceInfo, DeviceKind};
use crate::error::{Error, Result};
use crate::fork::PerProcess;
use crate::hal::AnyBackend;
use crate::vendors;

/// What a vendor's probe found.
#[derive(Debug, Clone)]
pub enum Probe {
    Available(Vec<DeviceInfo>),
    Unavailable(String),
}

/// One vendor's line in the discovery report.
#[derive(Debug, Clone, Serialize)]
pub struct BackendReport {
    pub kind: DeviceKind,
    /// `"available"` or `"unavailable"`.
    pub status: &'static str,
    /// Why the vendor is unavailable, or null.
    pub reason: Option<String>,
    pub devices: Vec<DeviceInfo>,
}

impl BackendReport {
    pub fn available(&self) -> bool {
        self.status == "available"
    }
}

/// Every vendor, probed.
#[derive(Debug, Clone, Serialize)]
pub struct Discovery {
    pub backends: Vec<BackendReport>,
}

impl Discovery {
    /// Every available device, vendor by vendor.
    pub fn devices(&self) -> Vec<Device> {
        self.backends
            .iter()
            .flat_map(|b| b.devices.iter().map(move |d| Device::new(b.kind, d.index)))
            .collect()
    }

    pub fn backend(&self, kind: DeviceKind) -> Option<&BackendReport> {
        self.backends.iter().find(|b| b.kind == kind)
    }

    /// The description of one device, or the error [`open`] would give.
    pub fn info(&self, device: Device) -> Result<&DeviceInfo> {
        let b = self
            .backend(device.kind)
            .ok_or_else(|| Error::DeviceTypeNotSupported(device.kind.to_string()))?;
        if let Some(reason) = &b.reason {
            return Err(Error::Unavailable {
                backend: device.kind,
                reason: reason.clone(),
            });
        }
        b.devices.get(device.index).ok_or_else(|| {
            Error::DeviceNotFound(format!(
                "{device} ({} has {} device(s))",
                device.kind,
                b.devices.len()
            ))
        })
    }

    /// How many devices of a kind are available (0 when the vendor is unavailable).
    pub fn count(&self, kind: DeviceKind) -> usize {
        self.backend(kind).map(|b| b.devices.len()).unwrap_or(0)
    }
}

/// The vendors `UNIRT_BACKENDS` enables (all when unset or empty).
fn enabled(kind: DeviceKind) -> bool {
    match std::env::var("UNIRT_BACKENDS") {
        Ok(v) if !v.trim().is_empty() => v
            .split(',')
            .any(|s| s.trim().eq_ignore_ascii_case(kind.as_str())),
        _ => true,
    }
}

fn probe_one(kind: DeviceKind) -> Probe {
    if !enabled(kind) {
        let list = std::env::var("UNIRT_BACKENDS").unwrap_or_default();
        let unknown: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.parse::<DeviceKind>().is_err())
            .collect();
        let hint = if unknown.is_empty() {
            String::new()
        } else {
            format!(
                " (unknown names there: {}; known: cpu, cuda, wgpu)",
                unknown.join(", ")
            )
        };
        return Probe::Unavailable(format!("disabled by UNIRT_BACKENDS={list}{hint}"));
    }
    let probe = match kind {
        DeviceKind::Cpu => vendors::cpu::probe,
        DeviceKind::Cuda => vendors::cuda::probe,
        DeviceKind::Wgpu => vendors::wgpu::probe,
    };
    // Probes are written not to panic; this is the last line of defence against a driver
    // library that does.
    catch_unwind(AssertUnwindSafe(probe)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Probe::Unavailable(format!("the {kind} probe failed: {msg}"))
    })
}

/// Probes every vendor now, without the cache.
pub fn probe_all() -> Discovery {
    let backends = DeviceKind::ALL
        .iter()
        .map(|&kind| match probe_one(kind) {
            Probe::Available(devices) => BackendReport {
                kind,
                status: "available",
                reason: None,
                devices,
            },
            Probe::Unavailable(reason) => BackendReport {
                kind,
                status: "unavailable",
                reason: Some(reason),
                devices: Vec::new(),
            },
        })
        .collect();
    Discovery { backends }
}

/// Probes every vendor once per process (thread-safe) and returns the report.
///
/// ```
/// let d = unirt::discover();
/// assert!(d.backend(unirt::DeviceKind::Cpu).unwrap().available() || std::env::var("UNIRT_BACKENDS").is_ok());
/// ```
pub fn discover() -> &'static Discovery {
    static DISCOVERY: PerProcess<Discovery> = PerProcess::new();
    DISCOVERY.get_or_init(probe_all)
}

/// Opens a device (once per process; later calls return the same backend).
///
/// ```
/// use unirt::{Backend, Device};
/// let cpu = unirt::open(Device::CPU).unwrap();
/// let p = cpu.malloc(1024).unwrap();
/// cpu.memset(p, 7, 1024).unwrap();
/// cpu.free(p).unwrap();
/// ```
pub fn open(device: Device) -> Result<Arc<AnyBackend>> {
    static OPEN: PerProcess<Mutex<HashMap<Device, Arc<AnyBackend>>>> = PerProcess::new();
    let table = OPEN.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(b) = table.lock().get(&device) {
        return Ok(b.clone());
    }
    discover().info(device)?;
    // Opening may take a while (driver start-up); do it outside the lock, then keep the first.
    let backend = Arc::new(open_uncached(device)?);
    Ok(table.lock().entry(device).or_insert(backend).clone())
}

/// Opens a fresh instance of a device, not shared with [`open`]: its own streams, events and
/// allocation table, released when the last `Arc` drops. For isolation — a test that must not
/// see, or disturb, what other code does on the shared instance.
pub fn open_private(device: Device) -> Result<Arc<AnyBackend>> {
    discover().info(device)?;
    Ok(Arc::new(open_uncached(device)?))
}

fn open_uncached(device: Device) -> Result<AnyBackend> {
    let opened = catch_unwind(AssertUnwindSafe(|| -> Result<AnyBackend> {
        Ok(match device.kind {
            DeviceKind::Cpu => vendors::cpu::CpuBackend::open(device.index)?.into(),
            DeviceKind::Cuda => vendors::cuda::open(device.index)?,
            DeviceKind::Wgpu => vendors::wgpu::open(device.index)?,
        })
    }));
    opened.unwrap_or_else(|_| {
        Err(Error::DeviceNotInitialized(format!(
            "{device}: the driver panicked while opening"
        )))
    })
}
