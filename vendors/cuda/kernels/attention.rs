//! Plans the attention kernels (`attention.cu`): the split-K decode kernel for one query, the
//! flash-style prefill kernel otherwise.

use std::sync::Arc;

use super::prepared::{prepare as ready, Operand, Step};
use super::{unexpected, Family, FLOATS};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::ops::{Params, PlanSpec, PreparedKernel};

pub(super) const FAMILY: Family = Family {
    name: "attention",
    text: include_str!("attention.cu"),
    ops: &["attention"],
    dtypes: FLOATS,
    entries: &["op_attention_prefill", "op_attention_decode"],
    prepare,
    params: (4, 24),
    source_dtype: super::own_source,
};

/// The largest head dimension the kernels hold in registers (8 per lane).
const MAX_HEAD_DIM: usize = 256;

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let (Params::Attention { scale, causal }, [q, k, v], [o]) =
        (spec.params, spec.inputs, spec.outputs)
    else {
        return Err(unexpected(spec, FAMILY.name));
    };
    let (qs, ks) = (q.layout.shape(), k.layout.shape());
    let (b, hq, lq, d) = (qs[0], qs[1], qs[2], qs[3]);
    let (hkv, lkv) = (ks[1], ks[2]);
    if d > MAX_HEAD_DIM {
        return Err(Error::unsupported(
            format!(
                "attention with head dimension {d} (the CUDA kernels take up to {MAX_HEAD_DIM})"
            ),
            DeviceKind::Cuda,
        ));
    }
    let bh = b * hq;
    let (entry, grid, block) = if lq == 1 {
        (
            "op_attention_decode",
            [bh.clamp(1, i32::MAX as usize) as u32, 1, 1],
            [256, 1, 1],
        )
    } else {
        if bh > 65535 {
            return Err(Error::unsupported(
                format!("attention over {bh} (batch × head) pairs (the CUDA prefill kernel takes 65535)"),
                DeviceKind::Cuda,
            ));
        }
        (
            "op_attention_prefill",
            [lq.div_ceil(4).max(1) as u32, bh.max(1) as u32, 1],
            [128, 1, 1],
        )
    };
    let mut step = Step::new(entry, grid, block);
    step.ptrs = vec![
        Operand::Out(0, 0),
        Operand::In(0),
        Operand::In(1),
        Operand::In(2),
    ];
    for x in [b, hq, hkv, lq, lkv, d] {
        step.args.int(x);
    }
    for t in [q, k, v, o] {
        for &s in t.layout.strides() {
            step.args.int(s);
        }
    }
    step.args.int(i64::from(*causal)).float(*scale);
    ready(spec, &FAMILY, spec.dtype, vec![step])
}
