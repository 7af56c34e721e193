//! Reductions along axes with keepdim: sum, mean, max, min, argmax (one axis, i64 indices;
//! the first of equal maxima wins).

use super::{out_desc, Params, Plan, PlanBuilder, TensorDesc};
use crate::error::{Error, Result};
use crate::tensor::{normalize_axis, DType, Tensor};

/// The reduction operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    Argmax,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Argmax,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Argmax => "argmax",
        }
    }
}

/// Reduces `x` over `axes` (all axes when empty; negative axes count from the end).
pub fn reduce(op: ReduceOp, x: &TensorDesc, axes: &[isize], keepdim: bool) -> Result<Plan> {
    let nd = x.layout.ndim();
    let mut ax: Vec<usize> = if axes.is_empty() {
        (0..nd).collect()
    } else {
        axes.iter()
            .map(|&a| normalize_axis(op.name(), a, nd))
            .collect::<Result<_>>()?
    };
    ax.sort_unstable();
    if ax.windows(2).any(|w| w[0] == w[1]) {
        return Err(Error::BadParam(format!(
            "{}: axis repeated in {axes:?}",
            op.name()
        )));
    }
    if op == ReduceOp::Argmax && ax.len() != 1 {
        return Err(Error::BadParam(format!(
            "argmax reduces exactly one axis, got {axes:?} for {nd} dimensions"
        )));
    }
    let reduced: usize = ax.iter().map(|&a| x.shape()[a]).product();
    if reduced == 0 && matches!(op, ReduceOp::Max | ReduceOp::Min | ReduceOp::Argmax) {
        return Err(Error::BadTensorShape(format!(
            "{} of an empty set of elements (shape {:?}, axes {ax:?})",
            op.name(),
            x.shape()
        )));
    }
    let shape: Vec<usize> = (0..nd)
        .filter_map(|d| match (ax.contains(&d), keepdim) {
            (false, _) => Some(x.shape()[d]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    let out_dtype = if op == ReduceOp::Argmax {
        DType::I64
    } else {
        x.dtype
    };
    let mut p = PlanBuilder::new(op.name(), x.dtype, vec![x.clone()]);
    p.outputs = vec![out_desc(x.device, out_dtype, &shape)];
    p.params = Params::Reduce { axes: ax, keepdim };
    p.build()
}

impl Tensor {
    /// Sum over `axes` (all when empty).
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        reduce(ReduceOp::Sum, &self.desc(), axes, keepdim)?.run1(&[self])
    }

    /// Mean over `axes` (all when empty).
    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        reduce(ReduceOp::Mean, &self.desc(), axes, keepdim)?.run1(&[self])
    }

    /// Maximum over `axes` (all when empty).
    pub fn max(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        reduce(ReduceOp::Max, &self.desc(), axes, keepdim)?.run1(&[self])
    }

    /// Minimum over `axes` (all when empty).
    pub fn min(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        reduce(ReduceOp::Min, &self.desc(), axes, keepdim)?.run1(&[self])
    }

    /// Index (i64) of the maximum along `axis`.
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        reduce(ReduceOp::Argmax, &self.desc(), &[axis], keepdim)?.run1(&[self])
    }
}
