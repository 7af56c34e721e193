//! embedding: gather rows of a table `[vocab, dim]` by i32/i64 ids `[..]` into `[.., dim]`.
//! An id outside `0..vocab` is [`Error::IndexOutOfRange`], reported by the stream's next
//! synchronisation (the ids live on the device: the CPU kernel checks them all before it
//! writes anything; a GPU kernel writes zeros for the bad row and claims the plan's fault
//! word, which the synchronisation reads back — see docs/RELIABILITY.md, "Device faults").

use super::{out_desc, Plan, PlanBuilder, TensorDesc};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

pub fn embedding(ids: &TensorDesc, table: &TensorDesc) -> Result<Plan> {
    if !matches!(ids.dtype, DType::I32 | DType::I64) {
        return Err(Error::DTypeMismatch {
            op: "embedding (ids)".into(),
            expected: DType::I64,
            got: ids.dtype,
        });
    }
    if table.layout.ndim() != 2 {
        return Err(Error::BadTensorShape(format!(
            "embedding table must be [vocab, dim], got {:?}",
            table.shape()
        )));
    }
    if ids.device != table.device {
        return Err(Error::DeviceMismatch {
            op: "embedding".into(),
            expected: table.device,
            got: ids.device,
        });
    }
    let mut shape = ids.shape().to_vec();
    shape.push(table.shape()[1]);
    let mut p = PlanBuilder::new("embedding", table.dtype, vec![ids.clone(), table.clone()]);
    p.outputs = vec![out_desc(table.device, table.dtype, &shape)];
    p.build()
}

impl Tensor {
    /// Rows of `self` (a `[vocab, dim]` table) picked by `ids`.
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        embedding(&ids.desc(), &self.desc())?.run1(&[ids, self])
    }
}
