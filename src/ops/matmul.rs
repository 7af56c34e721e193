//! matmul / gemm: `C = alpha·A·B + beta·C` for `A [.., m, k]`, `B [.., k, n]`, batch
//! dimensions broadcast (NumPy `matmul` rules). Transposed operands are views: pass
//! `w.transpose(-1, -2)?` and no copy is made. f16/bf16 compute in f32 through a workspace.

use super::{same_device_dtype, Params, Plan, PlanBuilder, TensorDesc};
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
    // f16/bf16: A, B and C of one batch converted to f32.
    if dtype != DType::F32 {
        p.workspace = 4 * (m * k + k * n + m * n);
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
