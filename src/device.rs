//! Naming devices: [`DeviceKind`], the [`Device`] id (`cpu:0`, `wgpu:1`) and [`DeviceInfo`].

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// A device or vendor name that does not parse (`"tpu:0"`, `"cpu:x"`). It converts into
/// [`Error::BadParam`](crate::Error::BadParam) with `?`; this module stays below `error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseDeviceError(pub String);

impl fmt::Display for ParseDeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseDeviceError {}

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
    type Err = ParseDeviceError;
    fn from_str(s: &str) -> Result<Self, ParseDeviceError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceKind::Cpu),
            "cuda" | "nvidia" => Ok(DeviceKind::Cuda),
            "wgpu" => Ok(DeviceKind::Wgpu),
            other => Err(ParseDeviceError(format!(
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
    type Err = ParseDeviceError;
    /// `kind` or `kind:index`; a bare kind means index 0.
    fn from_str(s: &str) -> Result<Self, ParseDeviceError> {
        let (kind, index) = match s.split_once(':') {
            Some((k, i)) => {
                let index = i
                    .trim()
                    .parse::<usize>()
                    .map_err(|_| ParseDeviceError(format!("bad device index {i:?} in {s:?}")))?;
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

/// What kind of processor runs a device's work — the hardware / software flag device picking
/// needs. A GPU API implemented in software on the host cores (Mesa's lavapipe and llvmpipe,
/// SwiftShader, WARP) is [`Software`](DeviceClass::Software): it works, but it is the slowest
/// way to use the CPU (GL on llvmpipe runs unirt's kernels about 12× slower than the CPU
/// backend), so [`DeviceInfo::rank`] puts it last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceClass {
    /// A GPU with its own memory.
    DiscreteGpu,
    /// A GPU sharing memory with the host.
    IntegratedGpu,
    /// A GPU seen through a hypervisor.
    VirtualGpu,
    /// The host processor running native code (the CPU backend).
    Host,
    /// A GPU API emulated in software on the host processor.
    Software,
    /// The driver did not say.
    Unknown,
}

impl DeviceClass {
    /// Larger is preferred: hardware accelerators, then the host, then emulation.
    fn preference(self) -> u32 {
        match self {
            DeviceClass::DiscreteGpu => 5,
            DeviceClass::IntegratedGpu => 4,
            DeviceClass::VirtualGpu => 3,
            DeviceClass::Host => 2,
            DeviceClass::Unknown => 1,
            DeviceClass::Software => 0,
        }
    }
}

/// A device a vendor found but could not open, as discovery reports it: listed with the
/// driver's reason, never numbered, so it is not a [`Device`] anywhere (conformance, the main
/// job, the C ABI) and the indices of the devices that open stay dense.
#[derive(Debug, Clone, Serialize)]
pub struct UnusableDevice {
    /// The device's name as the driver reports it, e.g. "NVIDIA GeForce RTX 4090".
    pub name: String,
    /// The vendor, e.g. "NVIDIA", "Mesa".
    pub vendor: String,
    /// Driver name and version as the driver reports it.
    pub driver: String,
    /// The API the device would be driven through ("vulkan", "gl", …).
    pub api: String,
    /// Why it cannot be opened, in the driver's words (e.g. "request_device: Parent device is
    /// lost").
    pub reason: String,
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
    /// What runs the device's work: a hardware GPU, the host, or a software emulation.
    pub class: DeviceClass,
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

    /// True when a GPU API is emulated on the host processor (lavapipe, llvmpipe): correct,
    /// but slower than the CPU backend on the same cores.
    pub fn is_software(&self) -> bool {
        self.class == DeviceClass::Software
    }

    /// True for a hardware GPU (discrete, integrated or virtual).
    pub fn is_gpu(&self) -> bool {
        matches!(
            self.class,
            DeviceClass::DiscreteGpu | DeviceClass::IntegratedGpu | DeviceClass::VirtualGpu
        )
    }

    /// A sort key for picking a device of vendor `kind`: larger is preferred. The order is
    /// the device class (discrete GPU, integrated, virtual, the host, unknown, software
    /// emulation last), then a native compute API over a graphics API (CUDA, then Vulkan /
    /// Metal / DX12, then GL), then more memory, then the lower index. `max_by_key` over it
    /// never picks an emulated GPU while the CPU backend is there.
    ///
    /// ```
    /// let d = unirt::discover();
    /// let best = d.devices().into_iter().max_by_key(|dev| d.info(*dev).unwrap().rank(dev.kind));
    /// assert_eq!(best, unirt::best_device());
    /// ```
    pub fn rank(&self, kind: DeviceKind) -> DeviceRank {
        let api = match (kind, self.api.as_str()) {
            (DeviceKind::Cuda, _) => 3,
            (_, "vulkan" | "metal" | "dx12") => 2,
            (_, "gl") => 0,
            _ => 1,
        };
        DeviceRank((
            self.class.preference(),
            api,
            self.memory_total,
            std::cmp::Reverse(self.index),
        ))
    }
}

/// The preference order of devices, from [`DeviceInfo::rank`]; compare with `<` / `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceRank((u32, u32, u64, std::cmp::Reverse<usize>));

/// Free and total memory of a device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(index: usize, api: &str, class: DeviceClass, memory_total: u64) -> DeviceInfo {
        DeviceInfo {
            index,
            name: format!("{api} {class:?}"),
            vendor: String::new(),
            driver: String::new(),
            api: api.into(),
            class,
            memory_total,
            max_allocation: memory_total,
            details: Vec::new(),
            capabilities: Capabilities {
                async_streams: true,
                capture: true,
                stream_ordered_memory: true,
                pinned_host_memory: false,
                unified_addressing: false,
                event_timing: EventTiming::Host,
            },
        }
    }

    #[test]
    fn ranking_puts_hardware_first_the_host_next_and_emulation_last() {
        use DeviceClass::*;
        use DeviceKind::*;
        // This machine's shape: cpu:0, lavapipe (Vulkan), llvmpipe (GL) — plus GPUs elsewhere.
        let devices = [
            (Wgpu, info(1, "gl", Software, 64 << 30)),
            (Cpu, info(0, "host", Host, 8 << 30)),
            (Wgpu, info(0, "vulkan", Software, 64 << 30)),
            (Wgpu, info(2, "vulkan", IntegratedGpu, 8 << 30)),
            (Cuda, info(0, "cuda", DiscreteGpu, 80 << 30)),
            (Wgpu, info(3, "vulkan", DiscreteGpu, 80 << 30)),
            (Cuda, info(1, "cuda", DiscreteGpu, 24 << 30)),
        ];
        let mut order: Vec<String> = devices
            .iter()
            .map(|(k, d)| d.device(*k).to_string())
            .collect();
        order.sort_by_key(|name| {
            let (k, d) = devices
                .iter()
                .find(|(k, d)| d.device(*k).to_string() == *name)
                .unwrap();
            std::cmp::Reverse(d.rank(*k))
        });
        assert_eq!(
            order,
            ["cuda:0", "cuda:1", "wgpu:3", "wgpu:2", "cpu:0", "wgpu:0", "wgpu:1"]
        );
        // Without the GPUs, a natural max_by_key picks the CPU backend, not llvmpipe or lavapipe.
        let best = devices[..3].iter().max_by_key(|(k, d)| d.rank(*k)).unwrap();
        assert_eq!(best.1.device(best.0), Device::CPU);
        assert!(devices[0].1.is_software() && !devices[1].1.is_software());
        assert!(devices[4].1.is_gpu() && !devices[1].1.is_gpu());
    }
}
