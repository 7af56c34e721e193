//! Operators as descriptors (infiniop's pattern), over the [`KernelRegistry`].
//!
//! An operator is first **planned** from tensor descriptions ([`TensorDesc`]: device, dtype,
//! layout): the plan validates shapes, dtypes, devices and broadcasting, fixes the output
//! layouts and the workspace size, and looks the kernel up for (op, device kind, dtype) —
//! [`Error::UnsupportedKernel`] when none is registered. A [`Plan`] is then **launched** as
//! often as wanted with tensors that match it, on any stream of its device; launching checks
//! the tensors (and refuses outputs that overlap inputs where the operator does not allow it)
//! and enqueues the kernel in stream order. The eager methods on
//! [`Tensor`](crate::tensor::Tensor) (`a.add(&b)?`, `x.matmul(&w)?`, …) plan, allocate the
//! outputs and launch on the calling thread's stream.
//!
//! One file per operator family, with the same names as the kernel files of every vendor
//! (`vendors/<vendor>/kernels/<family>.rs`); `plan.rs` holds [`Plan`] and its launch checks,
//! `registry.rs` the [`KernelRegistry`].
//!
//! ```
//! use unirt::{tensor::{DType, Tensor}, Device};
//! let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], Device::CPU)?;
//! let b = Tensor::full(&[2, 1], 10.0, DType::F32, Device::CPU)?;
//! let plan = unirt::ops::elementwise::binary(unirt::ops::BinaryOp::Add, &a.desc(), &b.desc())?;
//! assert_eq!(plan.outputs()[0].layout.shape(), [2, 3]);
//! assert_eq!(a.add(&b)?.to_vec::<f32>()?, [11.0, 12.0, 13.0, 11.0, 12.0, 13.0]);
//! # Ok::<(), unirt::Error>(())
//! ```

pub mod attention;
pub mod cast;
pub mod elementwise;
pub mod embedding;
pub mod fused;
pub mod matmul;
pub mod norm;
mod plan;
pub mod rearrange;
pub mod reduce;
pub mod registry;
pub mod rope;
pub mod sample;
pub mod softmax;

use std::sync::Arc;

pub use elementwise::{BinaryOp, UnaryOp};
pub use plan::{Plan, PlanBuilder, WORKSPACE_ALIGN};
pub use registry::{
    is_registered, kernels, lookup, register_kernel, HostItemKernel, HostKernel, KernelCall,
    KernelImpl, KernelKey, KernelRegistry, PlanSpec, PrepareKernel, PreparedKernel, TensorRef,
};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::hal::KernelArg;
use crate::tensor::{DType, Layout};

/// What a plan knows of a tensor: where it lives, its dtype and its layout.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDesc {
    pub device: Device,
    pub dtype: DType,
    pub layout: Layout,
}

impl TensorDesc {
    pub fn new(device: Device, dtype: DType, layout: Layout) -> Self {
        TensorDesc {
            device,
            dtype,
            layout,
        }
    }

    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }
}

/// The parameters of a built-in operator, fixed at plan time.
#[derive(Debug, Clone, PartialEq)]
pub enum Params {
    None,
    /// The scalar of a tensor-scalar operator (`pow_scalar`, `masked_fill`, …).
    Scalar(f64),
    /// Reduced axes (sorted) and whether they stay as size-1 dimensions.
    Reduce {
        axes: Vec<usize>,
        keepdim: bool,
    },
    /// Softmax along `axis`; `causal` masks key `j > i + offset` for row `i` (the last two
    /// dimensions are (query, key)).
    Softmax {
        axis: usize,
        log: bool,
        causal: Option<usize>,
    },
    /// rms_norm / layer_norm over the last dimension.
    Norm {
        eps: f64,
    },
    /// `C = alpha·A·B + beta·C`.
    Matmul {
        alpha: f64,
        beta: f64,
    },
    /// Rotary embedding: rotate pairs `(i, i + d/2)` (half, Llama) or `(2i, 2i + 1)`
    /// (interleaved, GPT-J) by `pos · theta^(-2i/d)`.
    Rope {
        interleaved: bool,
        theta: f64,
    },
    /// Scaled dot-product attention.
    Attention {
        scale: f64,
        causal: bool,
    },
    /// Random sampling from logits (InfiniCore's random_sample): `random` in [0, 1).
    Sample {
        random: f64,
        temperature: f64,
        top_k: usize,
        top_p: f64,
    },
    /// A fused chain of elementwise operators ([`fused`]).
    Fused(Arc<fused::FusedProgram>),
    /// `program(alpha·A·B, extra operands…)` ([`matmul::matmul_epilogue`]).
    MatmulEpilogue {
        alpha: f64,
        program: Arc<fused::FusedProgram>,
    },
    /// Concatenation along `axis`.
    Concat {
        axis: usize,
    },
    /// Cast to `to`.
    Cast {
        to: DType,
    },
}

/// Checks that every tensor lies on `device` and has `dtype`.
pub(crate) fn same_device_dtype(op: &str, descs: &[&TensorDesc]) -> Result<(Device, DType)> {
    let first = descs
        .first()
        .ok_or_else(|| Error::BadParam(format!("{op}: no tensors")))?;
    for d in descs {
        if d.device != first.device {
            return Err(Error::DeviceMismatch {
                op: op.into(),
                expected: first.device,
                got: d.device,
            });
        }
        if d.dtype != first.dtype {
            return Err(Error::DTypeMismatch {
                op: op.into(),
                expected: first.dtype,
                got: d.dtype,
            });
        }
    }
    Ok((first.device, first.dtype))
}

/// A contiguous output description.
pub(crate) fn out_desc(device: Device, dtype: DType, shape: &[usize]) -> TensorDesc {
    TensorDesc::new(device, dtype, Layout::contiguous(shape))
}

/// A user operator (see [`register_kernel`]): a plan that hands its kernel the tensors, the
/// scalars and a 1-, 2- or 3-D launch grid as they are.
///
/// ```
/// use unirt::ops::{self, KernelCall, KernelImpl};
/// use unirt::{tensor::{DType, Tensor}, Device, DeviceKind};
/// // out[i] = a[i] * k, one grid point per element.
/// fn scale(call: &KernelCall<'_>, at: [u32; 3]) {
///     let (a, out) = (&call.inputs[0], &call.outputs[0]);
///     let k = match call.scalars[0] { unirt::KernelArg::F32(k) => k, _ => 0.0 };
///     let i = at[0] as usize;
///     // SAFETY (user kernel): the plan checked that both tensors hold `grid` contiguous f32s.
///     unsafe { *(out.ptr() as *mut f32).add(i) = *(a.ptr() as *const f32).add(i) * k };
/// }
/// ops::register_kernel("doc_scale", DeviceKind::Cpu, DType::F32, KernelImpl::HostPerItem(scale))?;
/// let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], Device::CPU)?;
/// let plan = ops::custom("doc_scale", DType::F32, &[a.desc()], &[a.desc()], &[2.0f32.into()], [3, 1, 1])?;
/// let out = plan.run1(&[&a])?;
/// assert_eq!(out.to_vec::<f32>()?, [2.0, 4.0, 6.0]);
/// # Ok::<(), unirt::Error>(())
/// ```
pub fn custom(
    op: &str,
    dtype: DType,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    scalars: &[KernelArg],
    grid: [u32; 3],
) -> Result<Plan> {
    if grid.contains(&0) {
        return Err(Error::BadParam(format!(
            "{op}: launch grid {grid:?} has an empty dimension"
        )));
    }
    let mut b = PlanBuilder::new(op, dtype, inputs.to_vec());
    b.outputs = outputs
        .iter()
        .map(|d| out_desc(d.device, d.dtype, d.layout.shape()))
        .collect();
    b.scalars = scalars.to_vec();
    b.grid = grid;
    b.build()
}
