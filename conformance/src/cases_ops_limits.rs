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
//!
//! `ops::workspace_checks`: the workspace a plan's launch is given.

use unirt::ops::{attention, matmul, reduce, sample, softmax, TensorDesc};
use unirt::tensor::{DType, Layout, Tensor};
use unirt::Backend;

use crate::ops_check::{err, expect_kind, fail};
use crate::{Case, Ctx, Failure};

/// The case of plans' workspaces.
pub(crate) const WORKSPACE_CASE: &str = "ops::workspace_checks";

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "ops::loop_limits",
            needs: &[],
            run: loop_limits,
        },
        Case {
            name: WORKSPACE_CASE,
            needs: &[],
            run: workspace_checks,
        },
    ]
}

/// Why a backend has no case of workspaces.
pub(crate) const NO_WORKSPACE_WGPU: &str = "no wgpu operator asks for a workspace: its kernels \
    hand partial results to each other through buffers their plans own";

/// `ops::workspace_checks`: a plan that asks for a workspace (the first of a few operators
/// that do on some backend: an f16 product on the CPU, split reductions and decode attention
/// on CUDA) refuses, before any kernel runs, none, one too small, one on another device, a
/// broadcast view (a few bytes behind many elements: the kernel would write past them), a
/// strided view and a view that starts off `WORKSPACE_ALIGN` (kernels store words and
/// vectors there); with a proper one it gives the eager result.
fn workspace_checks(ctx: &Ctx) -> Result<(), Failure> {
    let dev = ctx.device;
    let r = |shape: &[usize], seed, dt| {
        Tensor::rand_uniform(shape, -1.0, 1.0, seed, dt, dev).map_err(err("rand_uniform"))
    };
    let product = [
        r(&[256, 256], 1, DType::F16)?,
        r(&[256, 256], 2, DType::F16)?,
    ];
    let long = [r(&[2, 1 << 21], 3, DType::F32)?];
    let q = r(&[1, 32, 1, 128], 4, DType::F32)?;
    let kv = r(&[1, 32, 4096, 128], 5, DType::F32)?;
    let candidates: [(&[&Tensor], unirt::Result<unirt::ops::Plan>); 3] = [
        (
            &[&product[0], &product[1]],
            matmul::matmul(&product[0].desc(), &product[1].desc(), 1.0),
        ),
        (
            &[&long[0]],
            reduce::reduce(reduce::ReduceOp::Sum, &long[0].desc(), &[1], false),
        ),
        (
            &[&q, &kv, &kv],
            attention::attention(&q.desc(), &kv.desc(), &kv.desc(), false, None),
        ),
    ];
    let mut found = None;
    for (inputs, plan) in candidates {
        let plan = plan.map_err(err("plan"))?;
        if plan.workspace_size() > 0 {
            found = Some((inputs, plan));
            break;
        }
    }
    let Some((inputs, plan)) = found else {
        return Err(Failure::Unsupported(match dev.kind {
            unirt::DeviceKind::Wgpu => NO_WORKSPACE_WGPU.into(),
            _ => "no operator planned on this device asks for a workspace".into(),
        }));
    };
    let need = plan.workspace_size();
    let stream = inputs[0].stream().map_err(err("stream"))?;
    let outs: Vec<Tensor> = plan
        .outputs()
        .iter()
        .map(|o| Tensor::empty(o.shape(), o.dtype, dev))
        .collect::<unirt::Result<_>>()
        .map_err(err("outputs"))?;
    let outputs: Vec<&Tensor> = outs.iter().collect();
    let bytes = |n: usize, d| Tensor::empty(&[n], DType::U8, d).map_err(err("workspace"));
    let whole = bytes(need + 512, dev)?;
    let other = match dev.kind {
        unirt::DeviceKind::Cpu => None,
        _ => Some(bytes(need, unirt::Device::CPU)?),
    };
    let bad: Vec<(&str, Option<Tensor>, &[&str])> = vec![
        ("no workspace", None, &["insufficient_workspace"]),
        (
            "one too small",
            Some(bytes(need - 1, dev)?),
            &["insufficient_workspace"],
        ),
        ("one on another device", other, &["device_mismatch"]),
        (
            "a broadcast view of one byte",
            Some(bytes(1, dev)?.expand(&[need]).map_err(err("expand"))?),
            &["bad_param"],
        ),
        (
            "a strided view",
            Some(
                Tensor::empty(&[need, 2], DType::U8, dev)
                    .and_then(|t| t.narrow(1, 0, 1))
                    .map_err(err("strided"))?,
            ),
            &["bad_param"],
        ),
        (
            "a view starting off the alignment",
            Some(whole.narrow(0, 8, need).map_err(err("narrow"))?),
            &["bad_param"],
        ),
    ];
    for (what, ws, kinds) in bad {
        if what == "one on another device" && ws.is_none() {
            continue;
        }
        let got = plan.launch(inputs, &outputs, ws.as_ref(), stream);
        expect_kind(got, kinds, &format!("{} with {what}", plan.op()))?;
    }
    // A proper one: an aligned view into a larger buffer, of another dtype.
    let aligned = whole
        .narrow(0, unirt::ops::WORKSPACE_ALIGN as usize, need)
        .map_err(err("narrow"))?;
    plan.launch(inputs, &outputs, Some(&aligned), stream)
        .map_err(err("launch with a proper workspace"))?;
    let eager = plan.run(inputs).map_err(err("eager"))?;
    for (o, e) in outs.iter().zip(&eager) {
        let (got, want) = (o.to_bytes(), e.to_bytes());
        if got.map_err(err("read"))? != want.map_err(err("read"))? {
            return Err(fail(format!(
                "{}: the launch with a workspace differs from the eager run",
                plan.op()
            )));
        }
    }
    Ok(())
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
