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
        .filter_map(|d| match (ax.binary_search(&d).is_ok(), keepdim) {
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
    let outputs: usize = shape.iter().product();
    let mut p = PlanBuilder::new(op.name(), x.dtype, vec![x.clone()]);
    p.outputs = vec![out_desc(x.device, out_dtype, &shape)];
    p.params = Params::Reduce { axes: ax, keepdim };
    if x.device.kind == crate::DeviceKind::Cuda {
        p.workspace = split_workspace(outputs, split_count(outputs, reduced));
    }
    p.build()
}

/// The fewest elements a chunk of a split reduction holds (64 per thread of a 256-thread
/// block): below that a second launch costs more than the chunk's read saves.
pub const SPLIT_CHUNK_MIN: usize = 16_384;

/// The most chunks one output's reduction is split into.
pub const SPLITS_MAX: usize = 256;

/// How many chunks a GPU backend that reduces each output in one block (CUDA) splits each of
/// `outputs` reductions of `reduced` elements into, so that a few outputs over many elements
/// occupy the whole device: 1 (no split) for many outputs or short reductions, else up to
/// [`SPLITS_MAX`] chunks of at least [`SPLIT_CHUNK_MIN`], about 1024 blocks in all at most.
///
/// ```
/// use unirt::ops::reduce::split_count;
/// assert_eq!(split_count(1, 1 << 24), 256); // a whole-tensor sum of 16 Mi elements
/// assert_eq!(split_count(1, 32_000), 1); // one logit row: one block reads it soon enough
/// assert_eq!(split_count(1, 128_256), 7); // a Llama 3 logit row
/// assert_eq!(split_count(4096, 1 << 20), 1); // enough outputs to fill the device
/// ```
pub fn split_count(outputs: usize, reduced: usize) -> usize {
    if outputs == 0 || outputs > 128 || reduced < 4 * SPLIT_CHUNK_MIN {
        return 1;
    }
    (reduced / SPLIT_CHUNK_MIN)
        .min(1024 / outputs)
        .clamp(1, SPLITS_MAX)
}

/// Bytes of workspace a split reduction takes: an f32 partial per chunk, then (from an 8-byte
/// boundary) an i64 index per chunk for argmax; 0 when `splits` is 1.
pub fn split_workspace(outputs: usize, splits: usize) -> usize {
    if splits <= 1 {
        return 0;
    }
    let partials = outputs * splits;
    partials.next_multiple_of(2) * 4 + partials * 8
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
