//! Scaled dot-product attention: `q [b, hq, lq, d]`, `k` and `v [b, hkv, lkv, d]` with `hkv`
//! dividing `hq` (grouped-query: q head `h` reads kv head `h / (hq / hkv)`), output
//! `[b, hq, lq, d]`. Causal: query `i` sees keys `j <= i + (lkv − lq)`, the queries being the
//! last `lq` positions of a cache of `lkv ≥ lq`.

use super::{out_desc, same_device_dtype, Params, Plan, PlanBuilder, TensorDesc};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// `scale` defaults to `1/sqrt(d)`.
pub fn attention(
    q: &TensorDesc,
    k: &TensorDesc,
    v: &TensorDesc,
    causal: bool,
    scale: Option<f64>,
) -> Result<Plan> {
    let (device, dtype) = same_device_dtype("attention", &[q, k, v])?;
    let (sq, sk) = (q.shape(), k.shape());
    if sq.len() != 4 || sk.len() != 4 || v.shape() != sk {
        return Err(Error::BadTensorShape(format!(
            "attention needs q [b, hq, lq, d], k and v [b, hkv, lkv, d]; got {sq:?}, {sk:?}, {:?}",
            v.shape()
        )));
    }
    let (b, hq, lq, d) = (sq[0], sq[1], sq[2], sq[3]);
    let (hkv, lkv) = (sk[1], sk[2]);
    if sk[0] != b || sk[3] != d {
        return Err(Error::ShapeMismatch {
            op: "attention (k, v)".into(),
            expected: vec![b, hkv, lkv, d],
            got: sk.to_vec(),
        });
    }
    if hkv == 0 || hq % hkv != 0 {
        return Err(Error::BadTensorShape(format!(
            "attention: {hkv} kv heads do not divide {hq} query heads"
        )));
    }
    if causal && lkv < lq {
        return Err(Error::BadTensorShape(format!(
            "causal attention: {lq} queries over {lkv} cached keys"
        )));
    }
    let scale = scale.unwrap_or(1.0 / (d.max(1) as f64).sqrt());
    let mut p = PlanBuilder::new("attention", dtype, vec![q.clone(), k.clone(), v.clone()]);
    p.outputs = vec![out_desc(device, dtype, sq)];
    p.params = Params::Attention { scale, causal };
    if lq == 1 && device.kind == crate::DeviceKind::Cuda {
        p.workspace = decode_workspace(b * hq, d);
    }
    p.build()
}

/// The most key chunks a GPU kernel splits one query's attention into (split-K decode).
pub const DECODE_SPLITS_MAX: usize = 64;

/// Bytes of workspace for the split-K decode of `rows` (batch × head) single queries of
/// dimension `d`: every chunk's running max, sum and `d` accumulators in f32.
pub fn decode_workspace(rows: usize, d: usize) -> usize {
    rows * DECODE_SPLITS_MAX * (d + 2) * 4
}

impl Tensor {
    /// Scaled dot-product attention of `self` (the queries); see [`attention`].
    pub fn attention(&self, k: &Tensor, v: &Tensor, causal: bool) -> Result<Tensor> {
        attention(&self.desc(), &k.desc(), &v.desc(), causal, None)?.run1(&[self, k, v])
    }
}
