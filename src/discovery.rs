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
//! **A vendor is probed when first needed.** [`open`] probes only its device's vendor
//! ([`vendor_report`]), so a program that uses the CPU alone never starts a GPU driver;
//! [`discover`] probes the rest. Each vendor is probed once per process either way, and both
//! see the same report.
//!
//! **Adapters that cannot be opened are not devices.** A vendor whose driver lists devices that
//! may still refuse to open (wgpu: an adapter whose `request_device` fails, like NVIDIA's GL/EGL
//! adapter answering "Parent device is lost") test-opens each one while probing. One that fails
//! is listed in [`BackendReport::unusable`] with its name and the driver's reason, and is not a
//! [`Device`]: not in [`Discovery::devices`], [`Discovery::count`], [`Discovery::ranked`], so
//! not in conformance, the main job or the C ABI's counts, and the devices that open are
//! numbered densely without it (indices stable for the life of the process). The wgpu device a
//! test-open created is kept and handed to the first [`open`], so probing does not open a
//! device twice. `UNIRT_WGPU_FAIL_OPEN=gl` (or a part of an adapter's name) makes the test-open
//! of the matching wgpu adapters fail, as fault injection for tests.
//!
//! "Once per process" is meant literally: a child made by `fork` probes and opens afresh (see
//! [`crate::fork`]); the parent's devices answer [`Error::Forked`] there.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

use crate::device::{Device, DeviceInfo, DeviceKind, UnusableDevice};
use crate::error::{Error, Result};
use crate::fork::PerProcess;
use crate::hal::Probe;
use crate::vendors::{self, AnyBackend};

/// One vendor's line in the discovery report.
#[derive(Debug, Clone, Serialize)]
pub struct BackendReport {
    pub kind: DeviceKind,
    /// `"available"` or `"unavailable"`.
    pub status: &'static str,
    /// Why the vendor is unavailable, or null.
    pub reason: Option<String>,
    pub devices: Vec<DeviceInfo>,
    /// Devices the vendor found but could not open, with the driver's reason: not devices
    /// (never numbered, never counted), listed so a person sees what was left out and why.
    pub unusable: Vec<UnusableDevice>,
}

impl BackendReport {
    pub fn available(&self) -> bool {
        self.status == "available"
    }

    /// The description of one of this vendor's devices, or the error [`open`] would give.
    pub fn info(&self, device: Device) -> Result<&DeviceInfo> {
        if let Some(reason) = &self.reason {
            return Err(Error::Unavailable {
                backend: device.kind,
                reason: reason.clone(),
            });
        }
        self.devices.get(device.index).ok_or_else(|| {
            Error::DeviceNotFound(format!(
                "{device} ({} has {} device(s))",
                device.kind,
                self.devices.len()
            ))
        })
    }

    /// A vendor's report from its probe.
    fn from_probe(kind: DeviceKind, probe: Probe) -> BackendReport {
        let (status, reason, devices, unusable) = match probe {
            Probe::Available(devices) => ("available", None, devices, Vec::new()),
            Probe::Opened { devices, unusable } if devices.is_empty() => {
                let reason = none_opened(kind, &unusable);
                ("unavailable", Some(reason), devices, unusable)
            }
            Probe::Opened { devices, unusable } => ("available", None, devices, unusable),
            Probe::Unavailable(reason) => ("unavailable", Some(reason), Vec::new(), Vec::new()),
        };
        BackendReport {
            kind,
            status,
            reason,
            devices,
            unusable,
        }
    }
}

/// One library a vendor loads at run time, and where it looked for it: what `unirt devices
/// --verbose` prints when a vendor says "searched N places".
#[derive(Debug, Clone, Serialize)]
pub struct LibrarySearch {
    pub kind: DeviceKind,
    pub library: &'static str,
    /// The environment variable that names the one file to load instead.
    pub env: &'static str,
    /// Every place searched, in order.
    pub searched: Vec<String>,
    /// The files found there that may be the library, best first.
    pub found: Vec<String>,
}

/// Every run-time library search of every vendor (searched afresh: cheap file checks, nothing
/// is loaded).
pub fn library_searches() -> Vec<LibrarySearch> {
    vendors::cuda::library_searches()
}

/// Every vendor of the table, probed.
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
        self.backend(device.kind)
            .ok_or_else(|| Error::DeviceTypeNotSupported(device.kind.to_string()))?
            .info(device)
    }

    /// Every available device, best first by [`DeviceInfo::rank`]: hardware GPUs, then the
    /// host, then GPU APIs emulated on the host (lavapipe, llvmpipe).
    pub fn ranked(&self) -> Vec<Device> {
        let mut all: Vec<(Device, crate::device::DeviceRank)> = self
            .backends
            .iter()
            .flat_map(|b| {
                b.devices
                    .iter()
                    .map(move |d| (Device::new(b.kind, d.index), d.rank(b.kind)))
            })
            .collect();
        // Stable: equal ranks keep discovery order (vendor, then index).
        all.sort_by_key(|d| std::cmp::Reverse(d.1));
        all.into_iter().map(|(d, _)| d).collect()
    }

    /// The device to use when the caller has no preference: the first of [`ranked`](Self::ranked).
    /// `None` only when every vendor is unavailable (e.g. `UNIRT_BACKENDS` names none that
    /// works here).
    pub fn best_device(&self) -> Option<Device> {
        self.ranked().into_iter().next()
    }

    /// How many devices of a kind are available (0 when the vendor is unavailable).
    pub fn count(&self, kind: DeviceKind) -> usize {
        self.backend(kind).map(|b| b.devices.len()).unwrap_or(0)
    }
}

/// `UNIRT_BACKENDS` as text. A value that is not UTF-8 is read lossily rather than ignored:
/// ignoring it would enable every vendor, the opposite of what setting it asks for.
fn backends_var() -> Option<String> {
    std::env::var_os("UNIRT_BACKENDS").map(|v| v.to_string_lossy().into_owned())
}

/// The vendors `UNIRT_BACKENDS` enables (all when unset or empty).
fn enabled(kind: DeviceKind) -> bool {
    match backends_var() {
        Some(v) if !v.trim().is_empty() => v
            .split(',')
            .any(|s| s.trim().eq_ignore_ascii_case(kind.as_str())),
        _ => true,
    }
}

fn probe_one(kind: DeviceKind) -> Probe {
    if !enabled(kind) {
        let list = backends_var().unwrap_or_default();
        let unknown: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.parse::<DeviceKind>().is_err())
            .collect();
        let hint = if unknown.is_empty() {
            String::new()
        } else {
            let known: Vec<&str> = vendors::VENDORS.iter().map(|v| v.kind.as_str()).collect();
            format!(
                " (unknown names there: {}; known: {})",
                unknown.join(", "),
                known.join(", ")
            )
        };
        return Probe::Unavailable(format!("disabled by UNIRT_BACKENDS={list}{hint}"));
    }
    let probe = match vendors::vendor(kind) {
        Ok(v) => v.probe,
        Err(e) => return Probe::Unavailable(e.to_string()),
    };
    // Probes are written not to panic; this is the last line of defence against a driver
    // library that does. A driver's start-up may want more stack than the caller's thread has.
    crate::host_threads::on_roomy_stack(|| {
        catch_unwind(AssertUnwindSafe(probe)).unwrap_or_else(|p| {
            let msg = crate::error::panic_message(&*p).unwrap_or_default();
            Probe::Unavailable(format!("the {kind} probe failed: {msg}"))
        })
    })
    .unwrap_or_else(|| {
        Probe::Unavailable(format!(
            "cannot start a thread with room on its stack to probe {kind}"
        ))
    })
}

/// The reason of a vendor that found devices but could open none of them.
fn none_opened(kind: DeviceKind, unusable: &[UnusableDevice]) -> String {
    let each: Vec<String> = unusable
        .iter()
        .map(|u| format!("{} ({}): {}", u.name, u.api, u.reason))
        .collect();
    format!(
        "no {kind} device could be opened ({} found: {})",
        unusable.len(),
        each.join("; ")
    )
}

/// Probes every vendor now, without the cache.
pub fn probe_all() -> Discovery {
    let backends = vendors::VENDORS
        .iter()
        .map(|v| BackendReport::from_probe(v.kind, probe_one(v.kind)))
        .collect();
    Discovery { backends }
}

/// One vendor's report, probed once per process when first needed (thread-safe: one probe
/// per vendor however many threads ask; vendors probe in parallel). [`open`] asks only for its
/// device's vendor, so a program that uses `cpu:0` never starts a GPU driver: with lavapipe and
/// llvmpipe installed, the first CPU tensor operation took 87–104 ms, 14 threads and 113 MB
/// of resident memory when opening the CPU probed every vendor (Mesa's devices start their
/// threads and compile shaders when created), against 2.2–2.5 ms, 3 threads and 6 MB now.
pub fn vendor_report(kind: DeviceKind) -> Result<BackendReport> {
    use std::sync::OnceLock;
    // One slot per vendor of the table, in its order.
    static REPORTS: PerProcess<Vec<OnceLock<BackendReport>>> = PerProcess::new();
    let slot = vendors::VENDORS
        .iter()
        .position(|v| v.kind == kind)
        .ok_or_else(|| Error::DeviceTypeNotSupported(kind.to_string()))?;
    let reports =
        REPORTS.get_or_init(|| vendors::VENDORS.iter().map(|_| OnceLock::new()).collect());
    Ok(reports[slot]
        .get_or_init(|| BackendReport::from_probe(kind, probe_one(kind)))
        .clone())
}

/// Probes every vendor once per process (thread-safe) and returns the report.
///
/// ```
/// let d = unirt::discover();
/// assert!(d.backend(unirt::DeviceKind::Cpu).unwrap().available() || std::env::var("UNIRT_BACKENDS").is_ok());
/// ```
pub fn discover() -> &'static Discovery {
    static DISCOVERY: PerProcess<Discovery> = PerProcess::new();
    DISCOVERY.get_or_init(|| Discovery {
        backends: vendors::VENDORS
            .iter()
            .filter_map(|v| vendor_report(v.kind).ok())
            .collect(),
    })
}

/// The best device of this machine ([`Discovery::best_device`] of [`discover`]): a hardware
/// GPU when there is one, else the CPU backend — never an emulated GPU while the CPU backend
/// is enabled.
///
/// ```
/// let dev = unirt::best_device().expect("cpu:0 is always there unless UNIRT_BACKENDS hides it");
/// let info = unirt::discover().info(dev)?;
/// assert!(!info.is_software() || unirt::discover().count(unirt::DeviceKind::Cpu) == 0);
/// # Ok::<(), unirt::Error>(())
/// ```
pub fn best_device() -> Option<Device> {
    discover().best_device()
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
    vendor_report(device.kind)?.info(device)?;
    // Opening may take a while (driver start-up); do it outside the lock, then keep the first.
    let backend = open_uncached(device)?;
    Ok(table.lock().entry(device).or_insert(backend).clone())
}

/// Opens a fresh instance of a device, not shared with [`open`]: its own streams, events and
/// allocation table, released when the last `Arc` drops. For isolation — a test that must not
/// see, or disturb, what other code does on the shared instance.
pub fn open_private(device: Device) -> Result<Arc<AnyBackend>> {
    vendor_report(device.kind)?.info(device)?;
    open_uncached(device)
}

fn open_uncached(device: Device) -> Result<Arc<AnyBackend>> {
    // On a thread with room on its stack where the caller's has little (a driver's start-up);
    // the backend is put behind its `Arc` there, so the small stack never holds it.
    let opened = crate::host_threads::on_roomy_stack(|| {
        catch_unwind(AssertUnwindSafe(|| -> Result<Arc<AnyBackend>> {
            (vendors::vendor(device.kind)?.open)(device.index).map(Arc::new)
        }))
    })
    .ok_or_else(|| {
        Error::DeviceNotInitialized(format!(
            "{device}: cannot start a thread with room on its stack to open it"
        ))
    })?;
    opened.unwrap_or_else(|_| {
        Err(Error::DeviceNotInitialized(format!(
            "{device}: the driver panicked while opening"
        )))
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn best_device_is_first_of_ranked_and_never_emulated_while_the_cpu_is_there() {
        let d = super::discover();
        let ranked = d.ranked();
        assert_eq!(ranked.len(), d.devices().len());
        assert_eq!(d.best_device(), ranked.first().copied());
        let ranks: Vec<_> = ranked
            .iter()
            .map(|dev| d.info(*dev).unwrap().rank(dev.kind))
            .collect();
        assert!(
            ranks.windows(2).all(|w| w[0] >= w[1]),
            "not sorted: {ranked:?}"
        );
        if d.count(crate::DeviceKind::Cpu) > 0 {
            let best = d.best_device().unwrap();
            assert!(!d.info(best).unwrap().is_software(), "picked {best}");
        }
    }
}
