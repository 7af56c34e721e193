//! matmul / gemm: `C = alpha·A·B + beta·C` for `A [.., m, k]`, `B [.., k, n]`, batch
//! dimensions broadcast (NumPy `matmul` rules). Transposed operands are views: pass
//! `w.transpose(-1, -2)?` and no copy is made. f16/bf16 compute in f32 through a workspace.
//!
//! [`matmul_epilogue`] is the same product with an elementwise epilogue applied where the
//! GEMM stores its result (bias, activation, residual: what a [`CapturePlan`] fuses).
//!
//! [`CapturePlan`]: crate::graph::CapturePlan

use std::sync::Arc;

use super::fused::{FusedProgram, FusedSrc};
use super::{same_device_dtype, Params, Plan, PlanBuilder, TensorDesc};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::tensor::{broadcast_shapes, DType, Layout, Tensor};

/// The output shape of `a @ b`.
fn out_shape(a: &TensorDesc, b: &TensorDesc) -> Result<Vec<usize>> {
    let (sa, sb) = (a.shape(), b.shape());
    if sa.len() < 2 || sb.len() < 2 {
        return Err(Error::BadTensorShape(format!(
            "matmul needs matrices ([.., m, k] and [.., k, n]), got {sa:?} and {sb:?}"
        )));
    }
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
    if k != k2 {
        return Err(Error::ShapeMismatch {
            op: "matmul (inner dimensions)".into(),
            expected: vec![k, n],
            got: vec![k2, n],
        });
    }
    let mut shape = broadcast_shapes("matmul (batch)", &sa[..sa.len() - 2], &sb[..sb.len() - 2])?;
    shape.extend([m, n]);
    Ok(shape)
}

/// `C = alpha·A·B + beta·C` into an output laid out as `c` (any layout of the right shape,
/// read when `beta != 0`).
pub fn gemm(a: &TensorDesc, b: &TensorDesc, c: &TensorDesc, alpha: f64, beta: f64) -> Result<Plan> {
    let (device, dtype) = same_device_dtype("matmul", &[a, b, c])?;
    let shape = out_shape(a, b)?;
    if c.shape() != shape {
        return Err(Error::ShapeMismatch {
            op: "matmul (output)".into(),
            expected: shape,
            got: c.shape().to_vec(),
        });
    }
    let (m, n) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let k = a.shape()[a.shape().len() - 1];
    let mut p = PlanBuilder::new("matmul", dtype, vec![a.clone(), b.clone()]);
    p.outputs = vec![TensorDesc::new(device, dtype, c.layout.clone())];
    p.params = Params::Matmul { alpha, beta };
    // Only the CPU's f16/bf16 GEMM works in f32 copies (see its kernel).
    if device.kind == DeviceKind::Cpu {
        p.workspace = crate::vendors::cpu::matmul_workspace(dtype, m, k, n, beta, &b.layout);
    }
    p.build()
}

/// The registry name of [`matmul_epilogue`].
pub const MATMUL_EPILOGUE: &str = "matmul_epilogue";

/// The most extra operands an epilogue reads: a wgpu operator kernel binds at most eight
/// tensors, and A, B and the output take three.
pub const MAX_EPILOGUE_OPERANDS: usize = 4;

/// `out = program(alpha·A·B, extras[0], extras[1], …)`: a matmul whose result goes through
/// an elementwise epilogue before it is stored, in one kernel — the bias, activation and
/// residual that follow a projection.
///
/// In `program`, `FusedSrc::Input(0)` is the product as the plain matmul stores it (rounded
/// to the dtype) and `Input(1 + i)` is `extras[i]`, broadcast to the output's shape (a bias
/// of shape `[n]`, a residual of the output's shape, any strides). Every step rounds its
/// result to the dtype as the unfused operator stores it, so the result is bitwise that of
/// `matmul` followed by the unfused operators on the same device. The output, laid out as
/// `out` (any layout of the product's shape), may not overlap an input.
///
/// ```
/// # fn main() -> unirt::Result<()> {
/// use unirt::ops::fused::{FusedProgram, FusedSrc, FusedStep};
/// use unirt::ops::matmul::matmul_epilogue;
/// use unirt::ops::{BinaryOp, UnaryOp};
/// use unirt::tensor::{DType, Tensor};
/// let dev = unirt::Device::CPU;
/// let x = Tensor::rand_uniform(&[8, 64], -1.0, 1.0, 1, DType::F32, dev)?;
/// let w = Tensor::rand_uniform(&[64, 32], -1.0, 1.0, 2, DType::F32, dev)?;
/// let bias = Tensor::rand_uniform(&[32], -1.0, 1.0, 3, DType::F32, dev)?;
/// // relu(x·w + bias)
/// let program = FusedProgram {
///     steps: vec![
///         FusedStep::Binary(BinaryOp::Add, FusedSrc::Input(0), FusedSrc::Input(1)),
///         FusedStep::Unary(UnaryOp::Relu, FusedSrc::Step(0)),
///     ],
/// };
/// let out = Tensor::empty(&[8, 32], DType::F32, dev)?;
/// let plan = matmul_epilogue(&x.desc(), &w.desc(), &[bias.desc()], 1.0, program, &out.desc())?;
/// let y = plan.run1(&[&x, &w, &bias])?;
/// assert_eq!(y.to_bytes()?, x.matmul(&w)?.add(&bias)?.relu()?.to_bytes()?);
/// # Ok(())
/// # }
/// ```
pub fn matmul_epilogue(
    a: &TensorDesc,
    b: &TensorDesc,
    extras: &[TensorDesc],
    alpha: f64,
    program: FusedProgram,
    out: &TensorDesc,
) -> Result<Plan> {
    let mut all = vec![a, b, out];
    all.extend(extras);
    let (device, dtype) = same_device_dtype(MATMUL_EPILOGUE, &all)?;
    let shape = out_shape(a, b)?;
    if out.shape() != shape {
        return Err(Error::ShapeMismatch {
            op: format!("{MATMUL_EPILOGUE} (output)"),
            expected: shape,
            got: out.shape().to_vec(),
        });
    }
    if extras.len() > MAX_EPILOGUE_OPERANDS {
        return Err(Error::BadParam(format!(
            "{MATMUL_EPILOGUE}: {} extra operands (at most {MAX_EPILOGUE_OPERANDS})",
            extras.len()
        )));
    }
    program.validate(1 + extras.len())?;
    if !program
        .steps
        .iter()
        .any(|s| s.sources().contains(&FusedSrc::Input(0)))
    {
        return Err(Error::BadParam(format!(
            "{MATMUL_EPILOGUE}: the program never reads the product (input 0)"
        )));
    }
    for e in extras {
        // Each extra operand broadcasts to the output (NumPy rules, no copy).
        e.layout
            .broadcast_to(&shape)
            .map_err(|_| Error::NotBroadcastable {
                op: MATMUL_EPILOGUE.into(),
                lhs: e.shape().to_vec(),
                rhs: shape.clone(),
            })?;
    }
    let (m, n) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let k = a.shape()[a.shape().len() - 1];
    let mut inputs = vec![a.clone(), b.clone()];
    inputs.extend(extras.iter().cloned());
    let mut p = PlanBuilder::new(MATMUL_EPILOGUE, dtype, inputs);
    p.outputs = vec![TensorDesc::new(device, dtype, out.layout.clone())];
    p.params = Params::MatmulEpilogue {
        alpha,
        program: Arc::new(program),
    };
    match device.kind {
        DeviceKind::Cpu => {
            p.workspace = crate::vendors::cpu::matmul_workspace(dtype, m, k, n, 0.0, &b.layout)
        }
        // Where cuBLAS computes the product of a non-contiguous output (see the kernel).
        DeviceKind::Cuda => p.workspace = crate::vendors::cuda::matmul_epilogue_workspace(out),
        _ => {}
    }
    p.build()
}

/// `alpha·A·B` into a new contiguous output.
pub fn matmul(a: &TensorDesc, b: &TensorDesc, alpha: f64) -> Result<Plan> {
    let shape = out_shape(a, b)?;
    let c = TensorDesc::new(a.device, a.dtype, Layout::contiguous(&shape));
    gemm(a, b, &c, alpha, 0.0)
}

impl Tensor {
    /// `self @ other` (batched, broadcast batch dimensions).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        matmul(&self.desc(), &other.desc(), 1.0)?.run1(&[self, other])
    }

    /// `c ← alpha·self·other + beta·c`, in place on `c`, in stream order.
    pub fn gemm_into(&self, other: &Tensor, c: &Tensor, alpha: f64, beta: f64) -> Result<()> {
        let plan = gemm(&self.desc(), &other.desc(), &c.desc(), alpha, beta)?;
        let ws = match plan.workspace_size() {
            0 => None,
            n => Some(Tensor::empty(&[n], DType::U8, self.device())?),
        };
        plan.launch(&[self, other], &[c], ws.as_ref(), self.stream()?)
    }
}
