//! Plans the attention kernels (`attention.cu`): for one query the split-K decode (partials
//! into the plan's workspace, then a combine pass); otherwise the flash kernel on tensor cores
//! for f16/bf16 on sm_80+ with d ≤ 128 (`UNIRT_CUDA_FLASH=0` turns it off), the SIMT prefill
//! kernel elsewhere.

use std::sync::Arc;

use super::args::Args;
use super::prepared::{prepare as ready, with_backend, Operand, Step};
use super::{unexpected, Family, FLOATS};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::ops::attention::{decode_workspace, DECODE_SPLITS_MAX};
use crate::ops::{Params, PlanSpec, PreparedKernel};
use crate::tensor::DType;

pub(super) const FAMILY: Family = Family {
    name: "attention",
    text: include_str!("attention.cu"),
    ops: &["attention"],
    dtypes: FLOATS,
    entries: &[
        "op_attention_prefill",
        "op_attention_flash",
        "op_attention_flash_d64",
        "op_attention_decode",
        "op_attention_combine",
    ],
    prepare,
    params: (4, 25),
    source_dtype: super::own_source,
};

/// The largest head dimension the kernels hold in registers (8 per lane).
const MAX_HEAD_DIM: usize = 256;

/// Queries per block of the flash kernel (`FLASH_QUERIES` in `attention.cu`), and the largest
/// head dimension of its tensor-core path (`FLASH_D`).
const FLASH_QUERIES: usize = 64;
const FLASH_MAX_HEAD_DIM: usize = 128;

/// Whether the prefill of `spec` runs on the tensor-core flash kernel: f16 / bf16 on a device
/// of compute capability 8.0 or later, d ≤ 128, unless `UNIRT_CUDA_FLASH=0`.
fn flash(spec: &PlanSpec<'_>, d: usize) -> Result<bool> {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| std::env::var_os("UNIRT_CUDA_FLASH").is_some_and(|v| v == "0"));
    let half = matches!(spec.dtype, DType::F16 | DType::BF16);
    Ok(!off && half && d <= FLASH_MAX_HEAD_DIM && with_backend(spec, |b| b.cc)? >= 80)
}

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
    if bh > 65535 {
        return Err(Error::unsupported(
            format!("attention over {bh} (batch × head) pairs (the CUDA kernels take 65535)"),
            DeviceKind::Cuda,
        ));
    }
    let mut args = Args::new();
    for x in [b, hq, hkv, lq, lkv, d] {
        args.int(x);
    }
    for t in [q, k, v, o] {
        for &s in t.layout.strides() {
            args.int(s);
        }
    }
    args.int(i64::from(*causal)).float(*scale);
    let steps = if lq == 1 {
        // Split-K: about 256 keys per block, at most DECODE_SPLITS_MAX chunks (the size of the
        // plan's workspace).
        let splits = lkv.div_ceil(256).clamp(1, DECODE_SPLITS_MAX);
        if spec.workspace < decode_workspace(bh, d) {
            return Err(Error::Internal(format!(
                "attention: the plan's workspace ({} bytes) cannot hold the decode partials",
                spec.workspace
            )));
        }
        args.int(splits);
        let mut split = Step::new(
            "op_attention_decode",
            [splits as u32, bh.max(1) as u32, 1],
            [128, 1, 1],
        );
        split.ptrs = vec![
            Operand::Workspace,
            Operand::In(0),
            Operand::In(1),
            Operand::In(2),
        ];
        split.args = args.clone();
        let mut combine = Step::new(
            "op_attention_combine",
            [bh.max(1) as u32, 1, 1],
            [128, 1, 1],
        );
        combine.ptrs = vec![
            Operand::Out(0, 0),
            Operand::Workspace,
            Operand::In(1),
            Operand::In(2),
        ];
        combine.args = args;
        vec![split, combine]
    } else {
        args.int(1);
        let on_tensor_cores = flash(spec, d)?;
        let (entry, per_block) = if on_tensor_cores {
            // d ≤ 64 is padded to 64 (its own entry, half the work), any other d ≤ 128 to 128.
            let entry = if d <= 64 {
                "op_attention_flash_d64"
            } else {
                "op_attention_flash"
            };
            (entry, FLASH_QUERIES)
        } else {
            ("op_attention_prefill", 4)
        };
        let blocks = lq.div_ceil(per_block).max(1);
        // The flash kernels' grid is (batch × head, query block): longest blocks first over
        // all heads (`attention.cu`); the SIMT one's is (query group, batch × head).
        let grid = if !on_tensor_cores {
            [blocks as u32, bh.max(1) as u32, 1]
        } else if blocks > 65535 {
            return Err(Error::unsupported(
                format!(
                    "attention over {lq} queries (the CUDA flash kernel takes {} · 65535)",
                    per_block
                ),
                DeviceKind::Cuda,
            ));
        } else {
            [bh.max(1) as u32, blocks as u32, 1]
        };
        let mut step = Step::new(entry, grid, [128, 1, 1]);
        step.ptrs = vec![
            Operand::Out(0, 0),
            Operand::In(0),
            Operand::In(1),
            Operand::In(2),
        ];
        step.args = args;
        vec![step]
    };
    ready(spec, &FAMILY, spec.dtype, steps)
}
