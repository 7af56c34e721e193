//! [`CudaOp`]: an operator's CUDA kernels made ready for one plan — the family's source
//! generated for the dtype and compiled (or read from the cache), its module loaded and its
//! functions fetched at plan time; the launch shapes and the by-value parameter structs fixed
//! too. A launch only fills in the tensors' addresses and enqueues through the backend's
//! checked path ([`CudaBackend::launch_op`]): ranges checked against the allocation table under
//! the enqueue gate, noted for a capture, no host synchronisation and no allocation, so an op
//! launch can be captured into a CUDA graph like any other stream work.

use std::sync::Arc;

use super::args::Args;
use super::Family;
use crate::device::{Device, DeviceKind};
use crate::error::{Error, Result};
use crate::hal::{DevicePtr, StreamId};
use crate::ops::{KernelCall, PlanSpec, PreparedKernel};
use crate::tensor::DType;
use crate::vendors::cuda::blas::Gemm;
use crate::vendors::cuda::fault::FaultWord;
use crate::vendors::cuda::CudaBackend;
use crate::vendors::AnyBackend;

/// Where a kernel's pointer parameter comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Operand {
    /// Input `i`'s first element.
    In(usize),
    /// Output `i`'s first element, plus `elements` further on (a concat slice).
    Out(usize, i64),
    /// The plan's workspace.
    Workspace,
    /// The plan's fault word (see `vendors/cuda/fault.rs`).
    Fault,
}

/// One kernel launch of a plan.
#[derive(Debug, Clone)]
pub struct Step {
    /// The `extern "C"` entry of the family's source.
    pub entry: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Pointer parameters, in the kernel's order, before the struct.
    pub ptrs: Vec<Operand>,
    /// The by-value struct that follows them.
    pub args: Args,
    /// Instead of a kernel: a cuBLAS GEMM over (A, B, C).
    pub gemm: Option<(Gemm, [Operand; 3])>,
}

impl Step {
    pub fn new(entry: impl Into<String>, grid: [u32; 3], block: [u32; 3]) -> Self {
        Step {
            entry: entry.into(),
            grid,
            block,
            ptrs: Vec::new(),
            args: Args::new(),
            gemm: None,
        }
    }

    /// A cuBLAS GEMM step.
    pub fn blas(gemm: Gemm, operands: [Operand; 3]) -> Self {
        let mut s = Step::new("cublasGemmStridedBatchedEx", [1; 3], [1; 3]);
        s.gemm = Some((gemm, operands));
        s
    }
}

/// One piece of work a launch enqueues.
pub enum Work<'a> {
    /// A kernel: function, grid, block, pointer parameters, struct words.
    Kernel(u64, [u32; 3], [u32; 3], &'a [u64], &'a [i64]),
    /// A cuBLAS GEMM on (A, B, C).
    Gemm(&'a Gemm, [u64; 3]),
}

/// A launch ready to go: the loaded function and its step.
struct Ready {
    func: u64,
    step: Step,
}

/// The prepared kernels of one plan.
pub struct CudaOp {
    device: Device,
    steps: Vec<Ready>,
    /// The plan's fault word, for kernels that can fault (noted on the stream of each launch).
    fault: Option<Arc<FaultWord>>,
}

/// The CUDA backend of `device`, opened through its runtime.
fn backend_of(device: Device) -> Result<Arc<crate::Runtime>> {
    if device.kind != DeviceKind::Cuda {
        return Err(Error::Internal(format!(
            "a CUDA kernel prepared for {device}"
        )));
    }
    crate::Runtime::get(device)
}

/// Runs `f` on the CUDA backend of the plan's device (plan-time questions: is cuBLAS there?).
pub fn with_backend<R>(spec: &PlanSpec<'_>, f: impl FnOnce(&CudaBackend) -> R) -> Result<R> {
    let rt = backend_of(spec.device)?;
    match &**rt.backend() {
        AnyBackend::Cuda(b) => Ok(f(b)),
        _ => Err(Error::Internal(format!(
            "{}: {} is not a CUDA backend",
            spec.op, spec.device
        ))),
    }
}

/// Compiles `family` for `dtype` on the plan's device and fetches the entries of `steps`.
pub fn prepare(
    spec: &PlanSpec<'_>,
    family: &'static Family,
    dtype: DType,
    steps: Vec<Step>,
) -> Result<Arc<dyn PreparedKernel>> {
    Ok(Arc::new(CudaOp {
        device: spec.device,
        steps: ready_steps(spec, family, dtype, steps)?,
        fault: None,
    }))
}

/// [`prepare`] for kernels that can find bad data on the device: the plan gets a fault word
/// (values must lie in `0..limit`; `wide` when 64-bit), passed where a step names
/// [`Operand::Fault`] and checked at the next synchronisation of each launch's stream.
pub fn prepare_checked(
    spec: &PlanSpec<'_>,
    family: &'static Family,
    dtype: DType,
    steps: Vec<Step>,
    limit: u64,
    wide: bool,
) -> Result<Arc<dyn PreparedKernel>> {
    let steps = ready_steps(spec, family, dtype, steps)?;
    let fault = with_backend(spec, |b| b.fault_word(spec.op, limit, wide))??;
    Ok(Arc::new(CudaOp {
        device: spec.device,
        steps,
        fault: Some(fault),
    }))
}

fn ready_steps(
    spec: &PlanSpec<'_>,
    family: &'static Family,
    dtype: DType,
    steps: Vec<Step>,
) -> Result<Vec<Ready>> {
    let rt = backend_of(spec.device)?;
    let AnyBackend::Cuda(b) = &**rt.backend() else {
        return Err(Error::Internal(format!(
            "{}: {} is not a CUDA backend",
            spec.op, spec.device
        )));
    };
    steps
        .into_iter()
        .map(|step| {
            let (ptrs, words) = family.params;
            if step.gemm.is_none() && (step.ptrs.len() != ptrs || step.args.0.len() != words) {
                return Err(Error::Internal(format!(
                    "{}: {} built {} pointers and {} words for {}, which takes {ptrs} and {words}",
                    spec.op,
                    family.name,
                    step.ptrs.len(),
                    step.args.0.len(),
                    step.entry
                )));
            }
            let func = match step.gemm {
                Some(_) => 0,
                None => b.op_function(family, dtype, &step.entry)?,
            };
            Ok(Ready { func, step })
        })
        .collect()
}

/// A plan's kernels whose functions are already fetched (user kernels: their module is
/// compiled from the user's source, not from a family).
pub(crate) fn ready(device: Device, steps: Vec<(u64, Step)>) -> Result<Arc<dyn PreparedKernel>> {
    Ok(Arc::new(CudaOp {
        device,
        steps: steps
            .into_iter()
            .map(|(func, step)| Ready { func, step })
            .collect(),
        fault: None,
    }))
}

impl PreparedKernel for CudaOp {
    fn launch(
        &self,
        backend: &AnyBackend,
        call: &KernelCall<'_>,
        ranges: &[(DevicePtr, u64)],
        stream: StreamId,
    ) -> Result<()> {
        let AnyBackend::Cuda(b) = backend else {
            return Err(Error::Internal(format!(
                "{}: a CUDA kernel launched on another backend",
                call.op
            )));
        };
        if b.index() != self.device.index {
            return Err(Error::Internal(format!(
                "{}: prepared for {} but launched on cuda:{}",
                call.op,
                self.device,
                b.index()
            )));
        }
        let ptr = |o: Operand| -> Result<u64> {
            let (t, extra) = match o {
                Operand::In(i) => (call.inputs.get(i), 0),
                Operand::Out(i, e) => (call.outputs.get(i), e),
                Operand::Workspace => {
                    return call.workspace.map(|(addr, _)| addr).ok_or_else(|| {
                        Error::Internal(format!("{}: launched without its workspace", call.op))
                    })
                }
                Operand::Fault => {
                    return self.fault.as_ref().map(|w| w.addr).ok_or_else(|| {
                        Error::Internal(format!("{}: planned without a fault word", call.op))
                    })
                }
            };
            let t = t.ok_or_else(|| {
                Error::Internal(format!("{}: operand {o:?} missing at launch", call.op))
            })?;
            Ok(t.ptr()
                .wrapping_add((extra as u64).wrapping_mul(t.dtype.size() as u64)))
        };
        b.launch_op(ranges, stream, self.fault.as_slice(), |enqueue| {
            for r in &self.steps {
                let mut ptrs = [0u64; MAX_PTRS];
                if r.step.ptrs.len() > ptrs.len() {
                    return Err(Error::Internal(format!(
                        "{}: {} pointer parameters",
                        call.op,
                        r.step.ptrs.len()
                    )));
                }
                if let Some((g, [a, bm, c])) = &r.step.gemm {
                    enqueue(Work::Gemm(g, [ptr(*a)?, ptr(*bm)?, ptr(*c)?]))?;
                    continue;
                }
                for (slot, &o) in ptrs.iter_mut().zip(&r.step.ptrs) {
                    *slot = ptr(o)?;
                }
                enqueue(Work::Kernel(
                    r.func,
                    r.step.grid,
                    r.step.block,
                    &ptrs[..r.step.ptrs.len()],
                    &r.step.args.0,
                ))?;
            }
            Ok(())
        })
    }
}

/// Pointer parameters a step may take (the driver's `launch_op` takes as many).
pub const MAX_PTRS: usize = 8;

/// Enqueues one piece of work.
pub type Enqueue<'a> = dyn FnMut(Work<'_>) -> Result<()> + 'a;

impl CudaBackend {
    /// This device's cuBLAS handle, made at first use (plan time) with its own workspace, or
    /// why cuBLAS is not used.
    pub(crate) fn blas_handle(&self) -> Result<(&'static crate::vendors::cuda::blas::Cublas, u64)> {
        use crate::vendors::cuda::blas;
        let made = self.blas.get_or_init(|| {
            let lib = blas::cublas()?;
            self.bind().map_err(|e| e.to_string())?;
            let ws = self
                .drv
                .mem_alloc(blas::WORKSPACE, &self.name)
                .map_err(|e| format!("cuBLAS workspace: {e}"))?;
            // SAFETY: the device's context is current (bind); `ws` is a fresh allocation of
            // WORKSPACE bytes freed only after the handle is destroyed (Drop).
            match unsafe { lib.create(ws) } {
                Ok(h) => Ok((h, ws)),
                Err(e) => {
                    // SAFETY: allocated above and never handed out: freed once.
                    let _ = unsafe { self.drv.mem_free(ws) };
                    Err(e.to_string())
                }
            }
        });
        match made {
            Ok((h, _)) => Ok((
                blas::cublas().map_err(|r| Error::unsupported(r, DeviceKind::Cuda))?,
                *h,
            )),
            Err(why) => Err(Error::unsupported(
                format!("cuBLAS: {why}"),
                DeviceKind::Cuda,
            )),
        }
    }

    /// This device's index (`cuda:N`).
    pub(crate) fn index(&self) -> usize {
        self.shared.index
    }

    /// The function `entry` of `family` compiled for `dtype`, loading the module at first use
    /// (plan time). The module stays loaded until the device is dropped.
    pub(crate) fn op_function(
        &self,
        family: &'static Family,
        dtype: DType,
        entry: &str,
    ) -> Result<u64> {
        let dtype = (family.source_dtype)(dtype);
        let name = format!("op-{}-{}", family.name, dtype);
        let file = format!("{}.cu", family.name);
        self.module_function_of(&name, &file, || super::op_source(family, dtype), entry)
    }

    /// The function `entry` of the module compiled from `text()` (named `name`, which must be
    /// unique per distinct source: it keys the image caches and this device's loaded modules),
    /// loading the module at first use. The module stays loaded until the device is dropped.
    pub(crate) fn module_function_of(
        &self,
        name: &str,
        file: &str,
        text: impl FnOnce() -> String,
        entry: &str,
    ) -> Result<u64> {
        if let Some(&f) = self
            .op_modules
            .lock()
            .get(name)
            .and_then(|(_, fns)| fns.get(entry))
        {
            return Ok(f);
        }
        self.bind()?;
        let module = {
            let loaded = self.op_modules.lock().get(name).map(|(m, _)| *m);
            match loaded {
                Some(m) => m,
                None => {
                    let nv = super::super::nvrtc::require()?;
                    let target = nv.target_for(self.cc);
                    let text = text();
                    let src = super::cache::Source {
                        name,
                        file,
                        text: &text,
                    };
                    let img = super::cache::image(nv, &src, target, false)?;
                    let m = match self.drv.module_load(&img) {
                        Ok(m) => m,
                        // A stale or damaged cache entry: compile afresh once.
                        Err(_) => self
                            .drv
                            .module_load(&super::cache::image(nv, &src, target, true)?)?,
                    };
                    let mut mods = self.op_modules.lock();
                    if let Some((other, _)) = mods.get(name) {
                        // Another thread loaded it first; keep that one.
                        // SAFETY: loaded just above, never shared: unloaded once, here.
                        let _ = unsafe { self.drv.module_unload(m) };
                        *other
                    } else {
                        mods.insert(name.to_string(), (m, Default::default()));
                        m
                    }
                }
            }
        };
        // SAFETY: the module is in op_modules, which unloads it only when the device drops.
        let f = unsafe { self.drv.module_function(module, entry) }?;
        if let Some((_, fns)) = self.op_modules.lock().get_mut(name) {
            fns.insert(entry.to_string(), f);
        }
        Ok(f)
    }

    /// The checked launch path of the op kernels: the stream is looked up and held alive,
    /// `ranges` are
    /// checked against the allocation table and noted for a capture, all under the enqueue
    /// gate (a free waits for it), then `body` enqueues its kernels. Nothing here synchronises
    /// or allocates, so a capture can record it.
    pub(crate) fn launch_op(
        &self,
        ranges: &[(DevicePtr, u64)],
        stream: StreamId,
        faults: &[Arc<FaultWord>],
        body: impl FnOnce(&mut Enqueue<'_>) -> Result<()>,
    ) -> Result<()> {
        let s = self.stream(stream)?;
        // The stream stays alive (not destroyed by another thread) until the work is enqueued.
        let _s_use = s.gate.enter(StreamId::KIND, s.raw)?;
        let _gate = self.enqueue_gate.read();
        for &(p, len) in ranges {
            self.check_device(p.0, len)?;
        }
        self.bind()?;
        let raw: Vec<(u64, u64)> = ranges.iter().map(|(p, l)| (p.0, *l)).collect();
        s.note_ranges(&self.shared, &raw);
        let drv = self.drv;
        body(&mut |work| match work {
            // SAFETY: `f` is a function of a module this device keeps loaded; the pointer
            // parameters and the struct match the entry's C signature (built by the family's
            // planner for that entry); every tensor range was checked above against the
            // allocation table and stays allocated while the stream may use it (free waits
            // for the gate and the queued work); the stream came from the stream table.
            Work::Kernel(f, grid, block, ptrs, args) => unsafe {
                drv.launch_op(f, grid, block, ptrs, args, s.raw)
            },
            Work::Gemm(g, [a, b, c]) => {
                let (blas, handle) = self.blas_handle()?;
                // One thread at a time on a handle (its stream is set per call).
                let _one = self.blas_lock.lock();
                // SAFETY: the handle is this device's (live until it drops) and used under
                // blas_lock only; the stream is live; the matrices' ranges were checked above
                // (the planner derived `g` from the same layouts).
                unsafe { blas.gemm(handle, s.raw, g, a, b, c) }
            }
        })?;
        // Enqueued: the stream (or its capture) checks the fault words its work may claim.
        s.note_faults(faults);
        Ok(())
    }
}
