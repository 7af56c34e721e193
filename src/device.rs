//! Naming devices: [`DeviceKind`], the [`Device`] id (`cpu:0`, `wgpu:1`) and [`DeviceInfo`].

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::error::Error;

/// A vendor family. Each kind is one directory under `vendors/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The host processor; always available.
    Cpu,
    /// NVIDIA GPUs through libcuda and NVRTC, loaded at run time.
    Cuda,
    /// Any Vulkan / Metal / DX12 / GL adapter through wgpu.
    Wgpu,
}

impl DeviceKind {
    /// Every kind, in probe order.
    pub const ALL: [DeviceKind; 3] = [DeviceKind::Cpu, DeviceKind::Cuda, DeviceKind::Wgpu];

    /// The lower-case name used in device strings and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Wgpu => "wgpu",
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeviceKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceKind::Cpu),
            "cuda" | "nvidia" => Ok(DeviceKind::Cuda),
            "wgpu" => Ok(DeviceKind::Wgpu),
            other => Err(Error::BadParam(format!(
                "unknown device kind {other:?} (expected cpu, cuda or wgpu)"
            ))),
        }
    }
}

/// One device: a kind and an index among that kind's devices.
///
/// ```
/// use unirt::{Device, DeviceKind};
/// let d: Device = "wgpu:1".parse().unwrap();
/// assert_eq!(d, Device::new(DeviceKind::Wgpu, 1));
/// assert_eq!(d.to_string(), "wgpu:1");
/// assert_eq!("cpu".parse::<Device>().unwrap(), Device::CPU);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    pub kind: DeviceKind,
    pub index: usize,
}

impl Device {
    /// The host processor, `cpu:0`: every thread's device until it sets another.
    pub const CPU: Device = Device {
        kind: DeviceKind::Cpu,
        index: 0,
    };

    pub const fn new(kind: DeviceKind, index: usize) -> Self {
        Device { kind, index }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.index)
    }
}

impl FromStr for Device {
    type Err = Error;
    /// `kind` or `kind:index`; a bare kind means index 0.
    fn from_str(s: &str) -> Result<Self, Error> {
        let (kind, index) = match s.split_once(':') {
            Some((k, i)) => {
                let index = i
                    .trim()
                    .parse::<usize>()
                    .map_err(|_| Error::BadParam(format!("bad device index {i:?} in {s:?}")))?;
                (k, index)
            }
            None => (s, 0),
        };
        Ok(Device {
            kind: kind.parse()?,
            index,
        })
    }
}

impl Serialize for Device {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// How a backend times events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventTiming {
    /// Timestamps written by the device itself (CUDA events, wgpu timestamp queries).
    Device,
    /// The host clock read when the stream reaches the event (the CPU backend; wgpu
    /// adapters without timestamp queries).
    Host,
}

/// What a device can do, as flags the conformance suite and callers check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// Streams run concurrently with the host (commands are queued, not executed inline).
    pub async_streams: bool,
    /// Stream capture into replayable graphs.
    pub capture: bool,
    /// Stream-ordered allocation (malloc_async / free_async).
    pub stream_ordered_memory: bool,
    /// Host memory the device can read directly without a staging copy.
    pub pinned_host_memory: bool,
    /// Device memory is host-addressable (the CPU backend).
    pub unified_addressing: bool,
    /// How events are timed.
    pub event_timing: EventTiming,
}

/// A description of one device, as discovery reports it.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceInfo {
    /// Position among this kind's devices.
    pub index: usize,
    /// The device's name, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)".
    pub name: String,
    /// The vendor, e.g. "NVIDIA", "Mesa", or the CPU's vendor id.
    pub vendor: String,
    /// Driver name and version as the driver reports it.
    pub driver: String,
    /// The API the device is driven through ("host", "cuda", "vulkan", "gl", …).
    pub api: String,
    /// Total memory usable by the device, in bytes.
    pub memory_total: u64,
    /// Largest single allocation, in bytes.
    pub max_allocation: u64,
    /// Vendor-specific detail: compute capability, device type, limits.
    pub details: Vec<(String, String)>,
    pub capabilities: Capabilities,
}

impl DeviceInfo {
    /// The device id for this description.
    pub fn device(&self, kind: DeviceKind) -> Device {
        Device::new(kind, self.index)
    }
}

/// Free and total memory of a device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}
