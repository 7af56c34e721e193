//! [`Plan`]: a planned operator, built by a family module through [`PlanBuilder`] (which
//! looks the kernel up and prepares it for the device), and launched as often as wanted:
//! each launch checks the tensors against the plan, refuses overlapping outputs where the
//! operator does not allow them, orders the tensors' storage across streams and enqueues the
//! kernel in stream order.

use std::sync::Arc;

use super::{KernelCall, KernelImpl, Params, PlanSpec, PreparedKernel, TensorDesc, TensorRef};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::hal::{Backend, DevicePtr, HostTask, KernelArg, StreamId};
use crate::tensor::{DType, Tensor};

struct PlanInner {
    op: String,
    device: Device,
    dtype: DType,
    inputs: Vec<TensorDesc>,
    outputs: Vec<TensorDesc>,
    params: Params,
    scalars: Vec<KernelArg>,
    grid: [u32; 3],
    workspace: usize,
    /// Whether an output may be the very same view as an input (elementwise in place).
    in_place: bool,
    kernel: KernelImpl,
    /// The device kernel prepared for this plan ([`KernelImpl::Prepared`]).
    prepared: Option<Arc<dyn PreparedKernel>>,
}

/// A planned operator: validated, with its output layouts, workspace size and kernel fixed.
/// Cheap to clone; launch it with [`Plan::launch`] as often as wanted.
#[derive(Clone)]
pub struct Plan(Arc<PlanInner>);

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("op", &self.0.op)
            .field("device", &self.0.device)
            .field("dtype", &self.0.dtype)
            .field("outputs", &self.0.outputs)
            .field("workspace", &self.0.workspace)
            .finish()
    }
}

/// How a plan is built: the family modules fill one in and call [`PlanBuilder::build`].
pub struct PlanBuilder {
    pub op: String,
    pub dtype: DType,
    pub inputs: Vec<TensorDesc>,
    pub outputs: Vec<TensorDesc>,
    pub params: Params,
    pub scalars: Vec<KernelArg>,
    pub grid: [u32; 3],
    pub workspace: usize,
    pub in_place: bool,
}

impl PlanBuilder {
    /// A plan of `op` whose kernel is looked up for `dtype`; outputs, parameters and the rest
    /// are set on the builder before [`build`](Self::build).
    pub fn new(op: &str, dtype: DType, inputs: Vec<TensorDesc>) -> Self {
        PlanBuilder {
            op: op.into(),
            dtype,
            inputs,
            outputs: Vec::new(),
            params: Params::None,
            scalars: Vec::new(),
            grid: [1, 1, 1],
            workspace: 0,
            in_place: false,
        }
    }

    /// Checks that every input lies on one device, looks up the kernel, and makes the plan.
    pub fn build(self) -> Result<Plan> {
        let device = self
            .inputs
            .first()
            .or(self.outputs.first())
            .map(|d| d.device)
            .ok_or_else(|| Error::BadParam(format!("{}: an operator needs a tensor", self.op)))?;
        for d in self.inputs.iter().chain(&self.outputs) {
            if d.device != device {
                return Err(Error::DeviceMismatch {
                    op: self.op.clone(),
                    expected: device,
                    got: d.device,
                });
            }
        }
        // No element count, row count or byte size computed from a shape may overflow.
        for d in self.inputs.iter().chain(&self.outputs) {
            if !crate::tensor::shape_fits(d.layout.shape(), d.dtype.size()) {
                return Err(Error::TooLarge {
                    device: format!(
                        "{} ({}: a tensor of shape {:?})",
                        device,
                        self.op,
                        d.shape()
                    ),
                    requested: u64::MAX,
                    limit: isize::MAX as u64,
                });
            }
        }
        for o in &self.outputs {
            if o.layout.has_internal_overlap() {
                return Err(Error::Aliasing {
                    op: self.op.clone(),
                    detail: format!("output layout {:?} writes one element twice", o.layout),
                });
            }
        }
        let kernel = super::registry::lookup(&self.op, device.kind, self.dtype)?;
        let spec = PlanSpec {
            op: &self.op,
            device,
            dtype: self.dtype,
            params: &self.params,
            inputs: &self.inputs,
            outputs: &self.outputs,
            scalars: &self.scalars,
            grid: self.grid,
            workspace: self.workspace,
        };
        crate::vendors::check_plan(&spec)?;
        // Nothing to compute (every output empty: a launch returns at once), so no device
        // kernel either: a generator asked for a kernel over a zero-sized dimension could
        // divide by it (the wgpu transpose once made `i % 0u`, which failed to compile).
        let nothing = computes_nothing(&self.outputs);
        // Preparing compiles (naga, NVRTC, a driver's compiler: deeply recursive), on a thread
        // with room on its stack where the caller's has little.
        let roomy = |prepare: &(dyn Fn() -> Result<Arc<dyn PreparedKernel>> + Sync)| {
            crate::host_threads::on_roomy_stack(prepare).unwrap_or_else(|| {
                Err(Error::Internal(format!(
                    "{}: cannot start a thread with room on its stack to prepare the kernel",
                    self.op
                )))
            })
        };
        let prepared = match &kernel {
            KernelImpl::Prepared { .. } if nothing => None,
            KernelImpl::Prepared { prepare, .. } => Some(roomy(&|| prepare(&spec))?),
            // User kernels in a device language are prepared by their vendor, as built-ins.
            KernelImpl::Wgsl { .. } | KernelImpl::CudaC { .. } => Some(roomy(&|| {
                crate::vendors::prepare_user_kernel(&spec, &kernel)
            })?),
            _ => None,
        };
        Ok(Plan(Arc::new(PlanInner {
            op: self.op,
            device,
            dtype: self.dtype,
            inputs: self.inputs,
            outputs: self.outputs,
            params: self.params,
            scalars: self.scalars,
            grid: self.grid,
            workspace: self.workspace,
            in_place: self.in_place,
            kernel,
            prepared,
        })))
    }
}

/// Whether a plan with these outputs has nothing to compute: it has outputs and every one is
/// empty. Such a plan prepares no device kernel and its launches return at once.
fn computes_nothing(outputs: &[TensorDesc]) -> bool {
    !outputs.is_empty() && outputs.iter().all(|o| o.layout.numel() == 0)
}

/// The alignment of a workspace's first byte ([`Plan::launch`]): CUDA's allocation alignment
/// and the graph arena's ([`crate::graph::memory::ARENA_ALIGN`]), which every backend's
/// allocations meet.
pub const WORKSPACE_ALIGN: u64 = 256;

/// Byte range `[start, end)` a tensor addresses (empty for no elements).
fn byte_range(t: &Tensor) -> (u64, u64) {
    let l = t.layout();
    if l.numel() == 0 {
        return (0, 0);
    }
    let size = t.dtype().size() as u64;
    let base = t.base_addr();
    // span_end was checked when the layout was made.
    let end = l.span_end().unwrap_or(l.offset()) as u64;
    (base + l.offset() as u64 * size, base + end * size)
}

impl Plan {
    pub fn op(&self) -> &str {
        &self.0.op
    }

    pub fn device(&self) -> Device {
        self.0.device
    }

    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    pub fn inputs(&self) -> &[TensorDesc] {
        &self.0.inputs
    }

    /// The outputs' descriptions (contiguous unless the plan was made for given outputs).
    pub fn outputs(&self) -> &[TensorDesc] {
        &self.0.outputs
    }

    pub fn params(&self) -> &Params {
        &self.0.params
    }

    /// Bytes of workspace a launch needs.
    pub fn workspace_size(&self) -> usize {
        self.0.workspace
    }

    /// Checks tensor `index` of the inputs (or outputs) against its description. The
    /// message names the operand only on failure: a launch formats nothing when it is right.
    fn check(&self, (kind, index): (&str, usize), want: &TensorDesc, t: &Tensor) -> Result<()> {
        let op = || format!("{} ({kind} {index})", self.0.op);
        if t.device() != want.device {
            return Err(Error::DeviceMismatch {
                op: op(),
                expected: want.device,
                got: t.device(),
            });
        }
        if t.dtype() != want.dtype {
            return Err(Error::DTypeMismatch {
                op: op(),
                expected: want.dtype,
                got: t.dtype(),
            });
        }
        if t.shape() != want.layout.shape() {
            return Err(Error::ShapeMismatch {
                op: op(),
                expected: want.layout.shape().to_vec(),
                got: t.shape().to_vec(),
            });
        }
        if t.layout().strides() != want.layout.strides() {
            return Err(Error::BadTensorStrides(format!(
                "{}: planned for strides {:?}, got {:?}",
                op(),
                want.layout.strides(),
                t.layout().strides()
            )));
        }
        Ok(())
    }

    /// Enqueues the operator on `stream` (of the plan's device) with tensors that match the
    /// plan's descriptions (device, dtype, shape, strides; the offset may differ) and a
    /// workspace of at least [`workspace_size`](Self::workspace_size) bytes: a contiguous
    /// view (of any dtype) whose first byte is aligned to [`WORKSPACE_ALIGN`], as every
    /// allocation is.
    pub fn launch(
        &self,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        workspace: Option<&Tensor>,
        stream: StreamId,
    ) -> Result<()> {
        let p = &self.0;
        if inputs.len() != p.inputs.len() || outputs.len() != p.outputs.len() {
            return Err(Error::BadParam(format!(
                "{} takes {} inputs and {} outputs, got {} and {}",
                p.op,
                p.inputs.len(),
                p.outputs.len(),
                inputs.len(),
                outputs.len()
            )));
        }
        for (i, (want, t)) in p.inputs.iter().zip(inputs).enumerate() {
            self.check(("input", i), want, t)?;
        }
        for (i, (want, t)) in p.outputs.iter().zip(outputs).enumerate() {
            self.check(("output", i), want, t)?;
        }
        // Outputs must not overlap one another, nor an input unless the operator works in
        // place and the output is that very view.
        for (i, o) in outputs.iter().enumerate() {
            let ro = byte_range(o);
            let overlaps = |t: &Tensor| {
                let r = byte_range(t);
                r.0 < r.1 && ro.0 < ro.1 && r.0 < ro.1 && ro.0 < r.1
            };
            for (j, o2) in outputs.iter().enumerate().skip(i + 1) {
                if overlaps(o2) {
                    return Err(Error::Aliasing {
                        op: p.op.clone(),
                        detail: format!("outputs {i} and {j} overlap"),
                    });
                }
            }
            for (j, t) in inputs.iter().enumerate() {
                let same_view = t.base_addr() == o.base_addr() && t.layout() == o.layout();
                if overlaps(t) && !(p.in_place && same_view) {
                    return Err(Error::Aliasing {
                        op: p.op.clone(),
                        detail: format!(
                            "output {i} overlaps input {j}{}",
                            if p.in_place {
                                " without being the same view"
                            } else {
                                " (this operator cannot work in place)"
                            }
                        ),
                    });
                }
            }
        }
        // While the calling thread records an operator graph on this device, the checked
        // launch is recorded instead of run (see `crate::graph::record`).
        if crate::graph::record::is_recording(p.device) {
            return crate::graph::record::record_launch(self, inputs, outputs);
        }
        let ws = match (p.workspace, workspace) {
            (0, _) => None,
            (_, Some(w)) if w.device() != p.device => {
                return Err(Error::DeviceMismatch {
                    op: format!("{} (workspace)", p.op),
                    expected: p.device,
                    got: w.device(),
                })
            }
            (need, Some(w)) if w.nbytes() >= need => {
                // A kernel writes `need` bytes from the view's first: a view that is not
                // contiguous (a broadcast one of a few bytes, a strided one) holds fewer, and
                // kernels store words (f32, i64) and vectors there.
                let start = byte_range(w).0;
                if !w.is_contiguous() || !start.is_multiple_of(WORKSPACE_ALIGN) {
                    return Err(Error::BadParam(format!(
                        "{}: the workspace must be a contiguous view starting on a multiple \
                         of {WORKSPACE_ALIGN} bytes, got shape {:?} strides {:?} at byte \
                         {start:#x}",
                        p.op,
                        w.shape(),
                        w.layout().strides()
                    )));
                }
                Some((start, need))
            }
            (need, w) => {
                return Err(Error::InsufficientWorkspace {
                    needed: need as u64,
                    given: w.map_or(0, |w| w.nbytes() as u64),
                })
            }
        };
        // The tensors have the plan's shapes (checked above).
        if computes_nothing(&p.outputs) {
            return Ok(());
        }
        let rt = match inputs.first().or(outputs.first()) {
            Some(t) => t.runtime().clone(),
            None => crate::Runtime::get(p.device)?,
        };
        let mut ranges = Vec::with_capacity(inputs.len() + outputs.len() + 1);
        let refs = |ts: &[&Tensor], ranges: &mut Vec<(DevicePtr, u64)>| -> Vec<TensorRef> {
            ts.iter()
                .map(|t| {
                    let (s, e) = byte_range(t);
                    if e > s {
                        ranges.push((DevicePtr(s), e - s));
                    }
                    TensorRef {
                        base: t.base_addr(),
                        dtype: t.dtype(),
                        layout: t.layout().clone(),
                    }
                })
                .collect()
        };
        let ins = refs(inputs, &mut ranges);
        let outs = refs(outputs, &mut ranges);
        if let Some((addr, len)) = ws {
            ranges.push((DevicePtr(addr), len as u64));
        }
        if stream != rt.stream()? {
            for t in inputs.iter().chain(outputs).chain(workspace.as_slice()) {
                t.record_stream(stream)?;
            }
        }
        // After work another thread's stream queued on an operand (see `crate::tensor`).
        for t in inputs.iter().chain(outputs).chain(workspace.as_slice()) {
            t.order_on(stream)?;
        }
        let plan = self.clone();
        let task: HostTask = match p.kernel {
            KernelImpl::Host(f) => Arc::new(move || f(&plan.call(&ins, &outs, ws))),
            KernelImpl::HostPerItem(f) => Arc::new(move || {
                let call = plan.call(&ins, &outs, ws);
                let [x, y, z] = call.grid;
                use crate::host_threads::for_each;
                let _busy = crate::progress::AllCoresBusy::enter();
                // Indices below the u32 grid's extents: the casts are lossless.
                let [x, y, z] = [x as usize, y as usize, z as usize];
                for_each(z, |k| {
                    for_each(y, |j| {
                        for_each(x, |i| f(&call, [i as u32, j as u32, k as u32]));
                    })
                });
                Ok(())
            }),
            KernelImpl::Prepared { .. } | KernelImpl::Wgsl { .. } | KernelImpl::CudaC { .. } => {
                let prepared = p
                    .prepared
                    .as_ref()
                    .ok_or_else(|| Error::Internal(format!("{}: prepared kernel missing", p.op)))?;
                return prepared.launch(rt.backend(), &self.call(&ins, &outs, ws), &ranges, stream);
            }
        };
        rt.backend().launch_host(task, &ranges, stream)
    }

    fn call<'a>(
        &'a self,
        inputs: &'a [TensorRef],
        outputs: &'a [TensorRef],
        workspace: Option<(u64, usize)>,
    ) -> KernelCall<'a> {
        KernelCall {
            op: &self.0.op,
            dtype: self.0.dtype,
            params: &self.0.params,
            inputs,
            outputs,
            scalars: &self.0.scalars,
            grid: self.0.grid,
            workspace,
        }
    }

    /// Allocates the outputs (contiguous) and a workspace on the plan's device and launches
    /// on the calling thread's stream: the eager path.
    pub fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let outs = self
            .0
            .outputs
            .iter()
            .map(|d| Tensor::empty(d.layout.shape(), d.dtype, d.device))
            .collect::<Result<Vec<_>>>()?;
        let ws = match self.0.workspace {
            0 => None,
            n => Some(Tensor::empty(&[n], DType::U8, self.0.device)?),
        };
        let out_refs: Vec<&Tensor> = outs.iter().collect();
        let stream = match inputs.first() {
            Some(t) => t.runtime().stream()?,
            None => crate::Runtime::get(self.0.device)?.stream()?,
        };
        // Fresh outputs: a graph recording takes them for intermediates.
        crate::graph::record::with_fresh_outputs(|| {
            self.launch(inputs, &out_refs, ws.as_ref(), stream)
        })?;
        Ok(outs)
    }

    /// [`run`](Self::run) for an operator with one output.
    pub fn run1(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        self.run(inputs)?
            .into_iter()
            .next()
            .ok_or_else(|| Error::Internal(format!("{} has no output", self.0.op)))
    }
}
