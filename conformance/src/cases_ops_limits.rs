//! `ops::loop_limits`: operators whose kernels would loop past what an adapter lets one
//! shader invocation run. Mesa's llvmpipe (lavapipe on Vulkan, llvmpipe on GL) ends every
//! loop of an invocation once the invocation has run 65535 iterations in all, and the kernel
//! then returns a result computed on part of its data; unirt plans such an operator as a
//! typed `Unsupported` error naming the limit, never a launch. Planned here from layouts
//! alone (nothing is allocated): on llvmpipe each plan must fail so, on every other device it
//! must succeed. (The largest sizes that do run there — rows of 40 000 and 70 000 — are
//! checked for values by the row cases. Reductions split a long reduction among workgroups
//! and are no longer limited: a sum and an argmax over 9 Mi elements, past what one
//! workgroup could walk when each offset cost a loop, are checked here.)

use unirt::ops::{matmul, sample, softmax, TensorDesc};
use unirt::tensor::{DType, Layout, Tensor};
use unirt::Backend;

use crate::ops_check::{err, expect_kind, fail};
use crate::{Case, Ctx, Failure};

pub(super) fn cases() -> Vec<Case> {
    vec![Case {
        name: "ops::loop_limits",
        needs: &[],
        run: loop_limits,
    }]
}

fn loop_limits(ctx: &Ctx) -> Result<(), Failure> {
    let desc = |shape: &[usize]| TensorDesc::new(ctx.device, DType::F32, Layout::contiguous(shape));
    let limited = ctx.backend.info().name.contains("llvmpipe");
    let plans: [(&str, unirt::Result<unirt::ops::Plan>); 3] = [
        (
            "a softmax over a row of 2^24 elements",
            softmax::softmax(&desc(&[1, 1 << 24]), -1, false),
        ),
        (
            "sampling (top-p) from 2^20 candidates",
            sample::random_sample(&desc(&[1, 1 << 20]), 0.5, 1.0, 0, 0.9),
        ),
        (
            "a product over k = 100 000",
            matmul::matmul(&desc(&[1, 100_000]), &desc(&[100_000, 4]), 1.0),
        ),
    ];
    for (what, plan) in plans {
        if limited {
            let msg = plan
                .as_ref()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            expect_kind(plan, &["unsupported"], what)?;
            if !msg.contains("loop limiter") {
                return Err(fail(format!(
                    "{what}: the error does not name the limit: {msg}"
                )));
            }
        } else if let Err(e) = plan {
            return Err(fail(format!("{what}: {e}")));
        }
    }
    whole_reductions(ctx)
}

/// A sum and an argmax over 9 Mi elements — more than a loop limiter lets one invocation
/// walk when each offset costs a loop — computed whole: the sum of ones is exact in f32,
/// and the maximum sits near the end, where a cut-short loop would never look.
fn whole_reductions(ctx: &Ctx) -> Result<(), Failure> {
    let n = 9 << 20;
    let ones = Tensor::ones(&[n], DType::F32, ctx.device).map_err(err("ones"))?;
    let sum = ones
        .sum(&[0], false)
        .and_then(|t| t.to_vec::<f32>())
        .map_err(err("a sum over 9 Mi ones"))?;
    if sum != [n as f32] {
        return Err(fail(format!("a sum over {n} ones gave {sum:?}")));
    }
    let mut v = vec![0f32; n];
    v[n - 3] = 1.0;
    let x = Tensor::from_slice(&v, &[n], ctx.device).map_err(err("from_slice"))?;
    let at = x
        .argmax(0, false)
        .and_then(|t| t.to_vec::<i64>())
        .map_err(err("an argmax over 9 Mi elements"))?;
    if at != [n as i64 - 3] {
        return Err(fail(format!(
            "an argmax over {n} elements, the maximum at {}, gave {at:?}",
            n - 3
        )));
    }
    Ok(())
}
