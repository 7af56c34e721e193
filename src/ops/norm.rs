//! rms_norm and layer_norm over the last dimension, with a weight (and bias) of that size.

use super::{out_desc, same_device_dtype, Params, Plan, PlanBuilder, TensorDesc};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

fn check_last(op: &str, x: &TensorDesc, w: &TensorDesc) -> Result<()> {
    let d = x
        .shape()
        .last()
        .copied()
        .ok_or_else(|| Error::BadTensorShape(format!("{op} needs at least one dimension")))?;
    if w.shape() != [d] {
        return Err(Error::ShapeMismatch {
            op: format!("{op} (weight)"),
            expected: vec![d],
            got: w.shape().to_vec(),
        });
    }
    Ok(())
}

/// `x / sqrt(mean(x²) + eps) · weight` over the last dimension.
pub fn rms_norm(x: &TensorDesc, weight: &TensorDesc, eps: f64) -> Result<Plan> {
    let (device, dtype) = same_device_dtype("rms_norm", &[x, weight])?;
    check_last("rms_norm", x, weight)?;
    let mut p = PlanBuilder::new("rms_norm", dtype, vec![x.clone(), weight.clone()]);
    p.outputs = vec![out_desc(device, dtype, x.shape())];
    p.params = Params::Norm { eps };
    p.in_place = true;
    p.build()
}

/// `(x − mean) / sqrt(var + eps) · weight + bias` over the last dimension (biased variance).
pub fn layer_norm(
    x: &TensorDesc,
    weight: &TensorDesc,
    bias: &TensorDesc,
    eps: f64,
) -> Result<Plan> {
    let (device, dtype) = same_device_dtype("layer_norm", &[x, weight, bias])?;
    check_last("layer_norm", x, weight)?;
    check_last("layer_norm", x, bias)?;
    let mut p = PlanBuilder::new(
        "layer_norm",
        dtype,
        vec![x.clone(), weight.clone(), bias.clone()],
    );
    p.outputs = vec![out_desc(device, dtype, x.shape())];
    p.params = Params::Norm { eps };
    p.in_place = true;
    p.build()
}

impl Tensor {
    pub fn rms_norm(&self, weight: &Tensor, eps: f64) -> Result<Tensor> {
        rms_norm(&self.desc(), &weight.desc(), eps)?.run1(&[self, weight])
    }

    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
        layer_norm(&self.desc(), &weight.desc(), &bias.desc(), eps)?.run1(&[self, weight, bias])
    }
}
