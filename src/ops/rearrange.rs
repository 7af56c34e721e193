//! `rearrange`: a strided copy of any layout into any layout (what `contiguous()` uses), and
//! `concat` along an axis.

use super::{out_desc, Params, Plan, PlanBuilder, TensorDesc};
use crate::error::{Error, Result};
use crate::tensor::{normalize_axis, Tensor};

/// A contiguous copy of `src`.
pub fn copy(src: &TensorDesc) -> Result<Plan> {
    let mut p = PlanBuilder::new("rearrange", src.dtype, vec![src.clone()]);
    p.outputs = vec![out_desc(src.device, src.dtype, src.shape())];
    p.build()
}

/// A copy of `src` into a tensor laid out as `dst` (same shape and dtype, any strides).
pub fn copy_into(src: &TensorDesc, dst: &TensorDesc) -> Result<Plan> {
    super::same_device_dtype("rearrange", &[src, dst])?;
    if src.shape() != dst.shape() {
        return Err(Error::ShapeMismatch {
            op: "rearrange".into(),
            expected: dst.shape().to_vec(),
            got: src.shape().to_vec(),
        });
    }
    let mut p = PlanBuilder::new("rearrange", src.dtype, vec![src.clone()]);
    p.outputs = vec![dst.clone()];
    p.build()
}

/// The inputs joined along `axis`; every other dimension must agree.
pub fn concat(inputs: &[TensorDesc], axis: isize) -> Result<Plan> {
    let refs: Vec<&TensorDesc> = inputs.iter().collect();
    let (device, dtype) = super::same_device_dtype("concat", &refs)?;
    let first = &inputs[0];
    let ax = normalize_axis("concat", axis, first.layout.ndim())?;
    let mut shape = first.shape().to_vec();
    shape[ax] = 0;
    for d in inputs {
        let mut want = first.shape().to_vec();
        want[ax] = d.shape().get(ax).copied().unwrap_or(0);
        if d.shape() != want {
            return Err(Error::ShapeMismatch {
                op: format!("concat (all dimensions but {ax})"),
                expected: want,
                got: d.shape().to_vec(),
            });
        }
        shape[ax] = shape[ax].checked_add(d.shape()[ax]).ok_or_else(|| {
            Error::BadTensorShape(format!(
                "concat along {ax}: the lengths add up past usize::MAX"
            ))
        })?;
    }
    let mut p = PlanBuilder::new("concat", dtype, inputs.to_vec());
    p.outputs = vec![out_desc(device, dtype, &shape)];
    p.params = Params::Concat { axis: ax };
    p.build()
}

impl Tensor {
    /// Copies `src` into this tensor's view (same shape and dtype), in stream order.
    pub fn copy_from(&self, src: &Tensor) -> Result<()> {
        let plan = copy_into(&src.desc(), &self.desc())?;
        plan.launch(&[src], &[self], None, self.stream()?)
    }

    /// The tensors joined along `axis`.
    pub fn concat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let descs: Vec<TensorDesc> = tensors.iter().map(|t| t.desc()).collect();
        concat(&descs, axis)?.run1(tensors)
    }
}
