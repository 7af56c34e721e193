//! softmax, log_softmax along an axis, and causal softmax over the last two dimensions
//! (query, key) with an offset for a KV cache: row `i` sees keys `0..=i + offset`.

use super::{out_desc, Params, Plan, PlanBuilder, TensorDesc};
use crate::error::{Error, Result};
use crate::tensor::{normalize_axis, Tensor};

/// softmax (or log_softmax when `log`) along `axis`.
pub fn softmax(x: &TensorDesc, axis: isize, log: bool) -> Result<Plan> {
    let name = if log { "log_softmax" } else { "softmax" };
    let axis = normalize_axis(name, axis, x.layout.ndim())?;
    let mut p = PlanBuilder::new(name, x.dtype, vec![x.clone()]);
    p.outputs = vec![out_desc(x.device, x.dtype, x.shape())];
    p.params = Params::Softmax {
        axis,
        log,
        causal: None,
    };
    p.in_place = true;
    p.build()
}

/// Causal softmax of scores `[…, q_len, kv_len]`: query `i` sees keys `j <= i + offset`.
/// `offset` defaults to `kv_len - q_len` (the queries are the last `q_len` positions).
pub fn causal_softmax(x: &TensorDesc, offset: Option<usize>) -> Result<Plan> {
    let nd = x.layout.ndim();
    if nd < 2 {
        return Err(Error::BadTensorShape(format!(
            "causal_softmax needs [.., q_len, kv_len], got {:?}",
            x.shape()
        )));
    }
    let (q, kv) = (x.shape()[nd - 2], x.shape()[nd - 1]);
    let offset = match offset {
        Some(o) => o,
        None => kv.checked_sub(q).ok_or_else(|| {
            Error::BadTensorShape(format!(
            "causal_softmax: {q} queries over {kv} keys (the cache must hold at least the queries)"
        ))
        })?,
    };
    let mut p = PlanBuilder::new("causal_softmax", x.dtype, vec![x.clone()]);
    p.outputs = vec![out_desc(x.device, x.dtype, x.shape())];
    p.params = Params::Softmax {
        axis: nd - 1,
        log: false,
        causal: Some(offset),
    };
    p.in_place = true;
    p.build()
}

impl Tensor {
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        softmax(&self.desc(), axis, false)?.run1(&[self])
    }

    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        softmax(&self.desc(), axis, true)?.run1(&[self])
    }

    /// See [`causal_softmax`].
    pub fn causal_softmax(&self, offset: Option<usize>) -> Result<Tensor> {
        causal_softmax(&self.desc(), offset)?.run1(&[self])
    }
}
