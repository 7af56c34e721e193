//! Vendor backends, one directory each, and the one table that lists them.
//!
//! Every vendor directory has the same shape:
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the backend type, its `probe()` and `open()` |
//! | `memory.rs` | raw device / pinned-host allocation and copies |
//! | `stream.rs` | streams: how commands are queued and run |
//! | `event.rs` | events: recording, query, timing |
//! | `graph.rs` | stream capture, instantiate, replay |
//! | `kernels.rs` + `kernels/` | the kernels of [`crate::kernel::KERNELS`] in the vendor's language, one file per op family under the same name in every vendor (`kernels/elementwise.{rs,cu,wgsl}`) |
//!
//! [`VENDORS`] is the only list of vendors: discovery probes and opens through it, and the C
//! ABI reads its device types from it. [`AnyBackend`] is the closed set of opened backends the
//! HAL's `enum_dispatch` dispatches over (the trait and the enum must sit in one crate).
//! Adding a vendor is a directory, a row here, a variant of [`AnyBackend`] and of
//! [`DeviceKind`] — `docs/ADDING_A_VENDOR.md` walks through it with [`noop`], the smallest
//! backend that compiles.
//!
//! Nothing here knows about `context`, the allocator, tensors, ops or graphs: data flows down
//! into a vendor, errors flow up.

use enum_dispatch::enum_dispatch;

// `enum_dispatch` expands the trait's signatures here: the types they name must be in scope.
use crate::device::{DeviceInfo, DeviceKind, MemInfo};
use crate::error::{Error, Result};
use crate::hal::*;

pub mod cpu;
pub mod cuda;
mod device_fault;
pub mod noop;
pub mod wgpu;

/// One opened device of any vendor.
// One value per opened device, kept behind an `Arc`: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[enum_dispatch(Backend)]
pub enum AnyBackend {
    Cpu(cpu::CpuBackend),
    Cuda(cuda::CudaBackend),
    Wgpu(wgpu::WgpuBackend),
}

/// One row of the vendor table.
#[derive(Debug)]
pub struct Vendor {
    /// The vendor's kind (`cpu:0`, `cuda:1`, … name devices by it).
    pub kind: DeviceKind,
    /// Cheap and infallible: the devices, or why there are none. Must not panic (discovery
    /// still catches a panicking driver as a last resort).
    pub probe: fn() -> Probe,
    /// Opens device `index` of this vendor (discovery has already checked that it exists).
    pub open: fn(usize) -> Result<AnyBackend>,
    /// The `infiniDevice_t` value the C ABI (`capi/`) uses for this vendor.
    pub c_device_type: i32,
}

/// Every vendor, in probe order.
pub const VENDORS: &[Vendor] = &[
    Vendor {
        kind: DeviceKind::Cpu,
        probe: cpu::probe,
        open: |index| Ok(cpu::CpuBackend::open(index)?.into()),
        c_device_type: 0, // INFINI_DEVICE_CPU
    },
    Vendor {
        kind: DeviceKind::Cuda,
        probe: cuda::probe,
        open: cuda::open,
        c_device_type: 1, // INFINI_DEVICE_NVIDIA
    },
    Vendor {
        kind: DeviceKind::Wgpu,
        probe: wgpu::probe,
        open: wgpu::open,
        c_device_type: 100, // unirt's extension value, outside upstream's 0..=10
    },
];

/// The table row of `kind`.
pub fn vendor(kind: DeviceKind) -> Result<&'static Vendor> {
    VENDORS
        .iter()
        .find(|v| v.kind == kind)
        .ok_or_else(|| Error::DeviceTypeNotSupported(format!("{kind} has no vendor table row")))
}

/// What a vendor refuses about a plan's tensors before any of its kernels is generated (wgpu
/// indexes tensors with 32-bit integers); `Ok` for the others.
pub(crate) fn check_plan(spec: &crate::ops::PlanSpec<'_>) -> crate::error::Result<()> {
    match spec.device.kind {
        DeviceKind::Wgpu => wgpu::check_plan(spec),
        _ => Ok(()),
    }
}

/// Prepares a user kernel registered as device source (WGSL, CUDA C) for a plan, through its
/// vendor.
pub(crate) fn prepare_user_kernel(
    spec: &crate::ops::PlanSpec<'_>,
    kernel: &crate::ops::KernelImpl,
) -> crate::error::Result<std::sync::Arc<dyn crate::ops::PreparedKernel>> {
    match (spec.device.kind, kernel) {
        (DeviceKind::Wgpu, crate::ops::KernelImpl::Wgsl { .. }) => {
            wgpu::prepare_user_kernel(spec, kernel)
        }
        (DeviceKind::Cuda, crate::ops::KernelImpl::CudaC { .. }) => {
            cuda::prepare_user_kernel(spec, kernel)
        }
        _ => Err(crate::error::Error::unsupported(
            format!(
                "launching registered {} kernels on {}",
                kernel.source_kind(),
                spec.device
            ),
            spec.device.kind,
        )),
    }
}

/// Every vendor's operator kernels into the registry: the one list of who registers what.
pub(crate) fn register_kernels(reg: &mut crate::ops::KernelRegistry) {
    cpu::register_kernels(reg);
    cuda::register_kernels(reg);
    wgpu::register_kernels(reg);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lists_every_kind_once_with_distinct_c_types() {
        for kind in DeviceKind::ALL {
            assert_eq!(
                VENDORS.iter().filter(|v| v.kind == kind).count(),
                1,
                "{kind}"
            );
        }
        assert_eq!(VENDORS.len(), DeviceKind::ALL.len());
        let mut types: Vec<i32> = VENDORS.iter().map(|v| v.c_device_type).collect();
        types.sort_unstable();
        types.dedup();
        assert_eq!(types.len(), VENDORS.len());
    }
}
