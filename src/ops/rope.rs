//! Rotary position embedding of `x [.., seq, heads, dim]` at positions `pos [seq]` (i32/i64):
//! pairs rotate by `pos · theta^(−2i/dim)`; the pairs are `(i, i + dim/2)` in the half
//! rotation (Llama) and `(2i, 2i + 1)` interleaved (GPT-J).

use super::{out_desc, Params, Plan, PlanBuilder, TensorDesc};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

pub fn rope(x: &TensorDesc, pos: &TensorDesc, theta: f64, interleaved: bool) -> Result<Plan> {
    let nd = x.layout.ndim();
    if nd < 3 || !x.shape()[nd - 1].is_multiple_of(2) {
        return Err(Error::BadTensorShape(format!(
            "rope needs x [.., seq, heads, dim] with an even dim, got {:?}",
            x.shape()
        )));
    }
    if !matches!(pos.dtype, DType::I32 | DType::I64) {
        return Err(Error::DTypeMismatch {
            op: "rope (positions)".into(),
            expected: DType::I64,
            got: pos.dtype,
        });
    }
    if pos.shape() != [x.shape()[nd - 3]] {
        return Err(Error::ShapeMismatch {
            op: "rope (positions)".into(),
            expected: vec![x.shape()[nd - 3]],
            got: pos.shape().to_vec(),
        });
    }
    if pos.device != x.device {
        return Err(Error::DeviceMismatch {
            op: "rope".into(),
            expected: x.device,
            got: pos.device,
        });
    }
    if !(theta.is_finite() && theta > 0.0) {
        return Err(Error::BadParam(format!("rope theta {theta}")));
    }
    let mut p = PlanBuilder::new("rope", x.dtype, vec![x.clone(), pos.clone()]);
    p.outputs = vec![out_desc(x.device, x.dtype, x.shape())];
    p.params = Params::Rope { interleaved, theta };
    p.in_place = true;
    p.build()
}

impl Tensor {
    /// Rotary embedding (see [`rope`]).
    pub fn rope(&self, pos: &Tensor, theta: f64, interleaved: bool) -> Result<Tensor> {
        rope(&self.desc(), &pos.desc(), theta, interleaved)?.run1(&[self, pos])
    }
}
