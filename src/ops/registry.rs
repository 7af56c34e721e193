//! [`KernelRegistry`]: which kernel runs operator `op` on a device kind for a dtype.
//!
//! Keyed by (op, [`DeviceKind`], [`DType`]). Every vendor registers its built-in kernels in
//! one place (`vendors/<vendor>/kernels/mod.rs`, `register`); users add their own with
//! [`register_kernel`]. A missing entry is [`Error::UnsupportedKernel`] when an operator is
//! planned — never a panic and never a silent fallback to another device.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use super::{Params, TensorDesc};
use crate::device::{Device, DeviceKind};
use crate::error::{Error, Result};
use crate::hal::{DevicePtr, KernelArg, StreamId};
use crate::tensor::{DType, Layout};
use crate::vendors::AnyBackend;

/// A tensor as a kernel receives it: the address of its storage, its dtype and its layout
/// (element `[i, j, …]` is at `base + (offset + Σ i·stride) · dtype.size()`).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    pub base: u64,
    pub dtype: DType,
    pub layout: Layout,
}

impl TensorRef {
    /// The address of element `[0, 0, …]`.
    pub fn ptr(&self) -> u64 {
        self.base + (self.layout.offset() * self.dtype.size()) as u64
    }
}

/// Everything a kernel is launched with.
#[derive(Debug)]
pub struct KernelCall<'a> {
    /// The registry name of the operator.
    pub op: &'a str,
    /// The dtype the kernel was registered for.
    pub dtype: DType,
    /// The plan's parameters (built-in operators).
    pub params: &'a Params,
    pub inputs: &'a [TensorRef],
    pub outputs: &'a [TensorRef],
    /// The plan's scalar arguments (user kernels).
    pub scalars: &'a [KernelArg],
    /// The launch shape: 1-, 2- or 3-D (unused dimensions are 1).
    pub grid: [u32; 3],
    /// `(address, bytes)` of the workspace the plan asked for, if any.
    pub workspace: Option<(u64, usize)>,
}

/// A CPU kernel that handles the whole launch (and parallelises itself).
///
/// It runs as a command of a CPU stream: it may queue work and record events through unirt,
/// but a wait for CPU work not yet done (a synchronisation, an event, a tensor read back) is
/// refused with [`Error::WaitsForItself`] — the work may be its own stream's, queued behind
/// it, and the wait would never end (CUDA forbids a host function's CUDA calls alike). The
/// same holds for [`HostItemKernel`]s, on whichever thread an item runs.
pub type HostKernel = fn(&KernelCall<'_>) -> Result<()>;
/// A CPU kernel run once per point of the launch grid, in parallel across the cores — the
/// shape of a GPU kernel, for user kernels written once per item.
pub type HostItemKernel = fn(&KernelCall<'_>, [u32; 3]);

/// What a device kernel is prepared from when an operator is planned: everything the plan
/// fixed (the tensors' layouts, not their addresses).
#[derive(Debug)]
pub struct PlanSpec<'a> {
    pub op: &'a str,
    pub device: Device,
    pub dtype: DType,
    pub params: &'a Params,
    pub inputs: &'a [TensorDesc],
    pub outputs: &'a [TensorDesc],
    pub scalars: &'a [KernelArg],
    pub grid: [u32; 3],
    pub workspace: usize,
}

/// A device kernel made ready for one plan — compiled, with its pipeline, binding layout and
/// launch shape fixed — and launched as often as the plan is (infiniop's descriptor: the
/// expensive part is paid at plan time, never per launch).
pub trait PreparedKernel: Send + Sync {
    /// Enqueues one launch on `stream` of `backend` (the plan's device). `call` carries the
    /// tensors' addresses; `ranges` are the `(address, bytes)` the launch touches, which the
    /// implementation checks against the backend's allocation table before anything is
    /// enqueued and records when the stream is capturing (as `launch_host` does), so a launch
    /// can be captured into a graph like any other stream work.
    fn launch(
        &self,
        backend: &AnyBackend,
        call: &KernelCall<'_>,
        ranges: &[(DevicePtr, u64)],
        stream: StreamId,
    ) -> Result<()>;
}

/// Prepares a device kernel for a plan (what a GPU vendor registers per operator).
pub type PrepareKernel = fn(&PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>>;

/// One registered kernel.
#[derive(Clone)]
pub enum KernelImpl {
    /// A Rust function run on a CPU stream's worker.
    Host(HostKernel),
    /// A Rust function run for every grid point.
    HostPerItem(HostItemKernel),
    /// WGSL source for the wgpu backend: `entry` with the given workgroup size (which its
    /// `@workgroup_size` must declare: checked at plan time, as is a grid of more workgroups
    /// than the adapter dispatches), launched over the plan's grid. It is compiled after a
    /// prelude that gives it its tensors (`ld_t0(i)`, `st_t1(i, v)`, `shape_t0(d)`,
    /// `stride_t0(d)`, inputs then outputs), `grid()` and its scalars (`arg0()`, …); see the
    /// wgpu vendor's `kernels/user.rs`. Source deep enough to crash a compiler is refused at
    /// plan time ([`Error::BadParam`]): an expression nested more than 8000 operators deep,
    /// or a chain of more than 10 000 dependent operations (`kernels/user_limits.rs`; carry
    /// long chains through a `var`). On Mesa's llvmpipe
    /// (lavapipe, and llvmpipe through GL) one invocation may run at most 65535 loop
    /// iterations in all, over all its loops: past that its loops end early and it computes
    /// on part of its data, so give each invocation less work than that there.
    Wgsl {
        source: Arc<str>,
        entry: Arc<str>,
        workgroup: [u32; 3],
    },
    /// CUDA C source for the CUDA backend: `entry`, declared
    /// `extern "C" __global__ void entry(UNIRT_PARAMS)`, launched in blocks of `block` threads
    /// over the plan's grid (rounded up: the kernel checks its bounds). It is compiled by NVRTC
    /// at plan time (cached in memory and on disk) after `common.cuh` and a prelude with the
    /// WGSL prelude's names: tensors `t0`, `t1`, … (inputs then outputs, typed pointers to
    /// their first element), `ld_t0(i)` / `st_t1(i, v)`, `ndim_`/`shape_`/`stride_t0(d)`,
    /// `grid()` and typed scalars `arg0()`, …; see the CUDA vendor's `kernels/user.rs`. The
    /// compiled kernel's parameter size is checked against what unirt passes, and the tensors'
    /// ranges against the allocation table; what the kernel then does with its pointers is
    /// its own (unlike WGSL, CUDA C has no bounds-checked buffers): a kernel that writes past
    /// its tensors faults the context as any CUDA kernel would.
    CudaC {
        source: Arc<str>,
        entry: Arc<str>,
        block: [u32; 3],
    },
    /// A device kernel generated and prepared per plan (the built-in operators of the GPU
    /// vendors): `kind` is its source language (`"wgsl"`, `"cuda-c"`).
    Prepared {
        kind: &'static str,
        prepare: PrepareKernel,
    },
}

impl KernelImpl {
    /// What kind of source the kernel is, for listings.
    pub fn source_kind(&self) -> &'static str {
        match self {
            KernelImpl::Host(_) | KernelImpl::HostPerItem(_) => "rust",
            KernelImpl::Wgsl { .. } => "wgsl",
            KernelImpl::CudaC { .. } => "cuda-c",
            KernelImpl::Prepared { kind, .. } => kind,
        }
    }
}

impl std::fmt::Debug for KernelImpl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelImpl::Wgsl { entry, .. } | KernelImpl::CudaC { entry, .. } => {
                write!(f, "{}({entry})", self.source_kind())
            }
            _ => write!(f, "{}", self.source_kind()),
        }
    }
}

/// One row of the registry, as `unirt kernels --list` prints it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelKey {
    pub op: String,
    pub device: DeviceKind,
    pub dtype: DType,
}

#[derive(Clone)]
struct Entry {
    kernel: KernelImpl,
    builtin: bool,
}

/// The table of kernels.
#[derive(Default)]
pub struct KernelRegistry {
    map: BTreeMap<KernelKey, Entry>,
}

impl KernelRegistry {
    /// Registers a built-in kernel (what a vendor's `register` calls).
    pub fn builtin(&mut self, op: &str, device: DeviceKind, dtype: DType, kernel: KernelImpl) {
        let key = KernelKey {
            op: op.into(),
            device,
            dtype,
        };
        self.map.insert(
            key,
            Entry {
                kernel,
                builtin: true,
            },
        );
    }

    fn get(&self, op: &str, device: DeviceKind, dtype: DType) -> Option<&Entry> {
        // A BTreeMap keyed by an owned String cannot be probed by &str without a key; the
        // registry is small and lookups happen at plan time, not per launch.
        self.map.get(&KernelKey {
            op: op.into(),
            device,
            dtype,
        })
    }
}

fn global() -> &'static RwLock<KernelRegistry> {
    static REGISTRY: OnceLock<RwLock<KernelRegistry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut reg = KernelRegistry::default();
        crate::vendors::register_kernels(&mut reg);
        RwLock::new(reg)
    })
}

/// The kernel for (op, device, dtype), or [`Error::UnsupportedKernel`].
pub fn lookup(op: &str, device: DeviceKind, dtype: DType) -> Result<KernelImpl> {
    global()
        .read()
        .get(op, device, dtype)
        .map(|e| e.kernel.clone())
        .ok_or_else(|| Error::UnsupportedKernel {
            op: op.into(),
            device,
            dtype,
        })
}

/// Whether (op, device, dtype) has a kernel.
pub fn is_registered(op: &str, device: DeviceKind, dtype: DType) -> bool {
    global().read().get(op, device, dtype).is_some()
}

/// Registers a user kernel for (op, device, dtype). Built-in kernels cannot be replaced
/// ([`Error::BadParam`]); a user kernel registered again is replaced. A kernel whose source
/// kind the device kind cannot run (WGSL on CPU, …) is refused.
///
/// ```
/// use unirt::ops::{self, KernelCall, KernelImpl};
/// use unirt::{DeviceKind, tensor::DType};
/// fn twice(call: &KernelCall<'_>, at: [u32; 3]) {
///     let _ = (call, at); // per grid point
/// }
/// ops::register_kernel("my_twice", DeviceKind::Cpu, DType::F32, KernelImpl::HostPerItem(twice))?;
/// assert!(ops::is_registered("my_twice", DeviceKind::Cpu, DType::F32));
/// assert!(ops::register_kernel("add", DeviceKind::Cpu, DType::F32, KernelImpl::HostPerItem(twice)).is_err());
/// # Ok::<(), unirt::Error>(())
/// ```
pub fn register_kernel(
    op: &str,
    device: DeviceKind,
    dtype: DType,
    kernel: KernelImpl,
) -> Result<()> {
    let fits = matches!(
        (device, &kernel),
        (
            DeviceKind::Cpu,
            KernelImpl::Host(_) | KernelImpl::HostPerItem(_)
        ) | (DeviceKind::Wgpu, KernelImpl::Wgsl { .. })
            | (DeviceKind::Cuda, KernelImpl::CudaC { .. })
    ) || matches!(
        (device, &kernel),
        (DeviceKind::Wgpu, KernelImpl::Prepared { kind: "wgsl", .. })
            | (
                DeviceKind::Cuda,
                KernelImpl::Prepared { kind: "cuda-c", .. }
            )
    );
    if !fits {
        return Err(Error::BadParam(format!(
            "a {} kernel cannot run on {device}",
            kernel.source_kind()
        )));
    }
    if op.is_empty() {
        return Err(Error::BadParam("an operator needs a name".into()));
    }
    let mut reg = global().write();
    if reg.get(op, device, dtype).is_some_and(|e| e.builtin) {
        return Err(Error::BadParam(format!(
            "{op} for ({device}, {dtype}) is a built-in kernel and cannot be replaced"
        )));
    }
    reg.map.insert(
        KernelKey {
            op: op.into(),
            device,
            dtype,
        },
        Entry {
            kernel,
            builtin: false,
        },
    );
    Ok(())
}

/// Every registered kernel: key, source kind, and whether it is built in. Sorted by op,
/// device kind, dtype.
pub fn kernels() -> Vec<(KernelKey, &'static str, bool)> {
    global()
        .read()
        .map
        .iter()
        .map(|(k, e)| (k.clone(), e.kernel.source_kind(), e.builtin))
        .collect()
}
