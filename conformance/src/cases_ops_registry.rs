//! The kernel registry itself: every built-in kernel of a device has cases (so a kernel
//! cannot be registered without being checked), a missing kernel is a typed error, and user
//! kernels run with typed scalars and a 2-D launch grid.

use unirt::ops::{self, KernelCall, KernelImpl};
use unirt::tensor::{DType, Tensor};
use unirt::{DeviceKind, KernelArg};

use crate::ops_check::*;
use crate::{Case, Ctx, Failure};

pub(super) const CASES: &[Case] = &[
    Case {
        name: "ops::registry::every_kernel_has_cases",
        needs: &[],
        run: every_kernel_has_cases,
    },
    Case {
        name: "ops::registry::missing_kernel_is_typed",
        needs: &[],
        run: missing_kernel_is_typed,
    },
    Case {
        name: USER_KERNEL_CASE,
        needs: &[],
        run: user_kernel,
    },
];

/// The user-kernel case: the same operator registered as a Rust function, WGSL and CUDA C.
pub(super) const USER_KERNEL_CASE: &str = "ops::user_affine::f32::grid_2d_typed_scalars";

fn every_kernel_has_cases(ctx: &Ctx) -> Result<(), Failure> {
    let names: Vec<&str> = crate::cases().iter().map(|c| c.name).collect();
    let mut missing = Vec::new();
    let mut count = 0;
    for (key, _, builtin) in ops::kernels() {
        if !builtin || key.device != ctx.device.kind {
            continue;
        }
        count += 1;
        let prefix = format!("ops::{}::{}::", key.op, key.dtype);
        if !names.iter().any(|n| n.starts_with(&prefix)) {
            missing.push(format!("{}/{}", key.op, key.dtype));
        }
    }
    if !missing.is_empty() {
        return Err(fail(format!(
            "{} registered kernels of {} have no conformance case: {}",
            missing.len(),
            ctx.device.kind,
            missing.join(", ")
        )));
    }
    if ctx.device.kind == DeviceKind::Cpu && count < 100 {
        return Err(fail(format!("the CPU registers only {count} kernels")));
    }
    Ok(())
}

fn missing_kernel_is_typed(ctx: &Ctx) -> Result<(), Failure> {
    let x = Tensor::zeros(&[4], DType::I32, ctx.device).map_err(err("zeros"))?;
    match ops::elementwise::unary(ops::UnaryOp::Exp, &x.desc()) {
        Err(unirt::Error::UnsupportedKernel { op, device, dtype }) => {
            if op != "exp" || device != ctx.device.kind || dtype != DType::I32 {
                return Err(fail(format!(
                    "UnsupportedKernel names {op}/{device}/{dtype}"
                )));
            }
        }
        other => {
            return Err(fail(format!(
                "exp of i32: expected UnsupportedKernel, got {other:?}"
            )))
        }
    }
    expect_kind(
        plan_over("no_such_operator", &x, &[], [4, 1, 1]),
        &["unsupported_kernel"],
        "an operator nobody registered",
    )?;
    expect_kind(
        ops::register_kernel(
            "add",
            DeviceKind::Cpu,
            DType::F32,
            KernelImpl::Host(|_| Ok(())),
        ),
        &["bad_param"],
        "replacing a built-in kernel",
    )?;
    let wgsl = KernelImpl::Wgsl {
        source: "".into(),
        entry: "main".into(),
        workgroup: [64, 1, 1],
    };
    expect_kind(
        ops::register_kernel("x", DeviceKind::Cpu, DType::F32, wgsl),
        &["bad_param"],
        "WGSL for the CPU",
    )
}

/// `out[y, x] = a[y, x] · s + bias + half + (x as f32)`, one grid point per element.
fn affine(call: &KernelCall<'_>, at: [u32; 3]) {
    let (a, out) = (&call.inputs[0], &call.outputs[0]);
    let (s, bias, half) = match call.scalars {
        [KernelArg::F32(s), KernelArg::I64(b), KernelArg::F16(h)] => (*s, *b as f32, h.to_f32()),
        _ => return,
    };
    let (x, y) = (at[0] as usize, at[1] as usize);
    let cols = a.layout.shape()[1];
    let (ia, io) = (
        y * a.layout.strides()[0] + x * a.layout.strides()[1],
        y * cols + x,
    );
    // SAFETY: the grid is [cols, rows] and the plan made `out` a contiguous [rows, cols] f32
    // tensor, so both elements exist; every grid point writes its own element.
    unsafe {
        let v = *(a.ptr() as usize as *const f32).add(ia);
        *(out.ptr() as usize as *mut f32).add(io) = v * s + bias + half + x as f32;
    }
}

/// [`affine`] in WGSL, over the prelude unirt gives WGSL user kernels (tensor accessors
/// `ld_t0` / `st_t1`, `shape_`/`stride_`, `grid()`, typed scalars `arg0()`…).
const AFFINE_WGSL: &str = "
@compute @workgroup_size(8, 8, 1)
fn affine(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x >= grid().x || g.y >= grid().y) { return; }
    let ia = g.y * stride_t0(0u) + g.x * stride_t0(1u);
    let io = g.y * shape_t0(1u) + g.x;
    st_t1(io, ld_t0(ia) * arg0() + f32(arg1()) + arg2() + f32(g.x));
}
";

/// [`affine`] in CUDA C, over the prelude unirt gives CUDA C user kernels (the same names as
/// WGSL's; `UNIRT_PARAMS` is the parameter list unirt passes).
const AFFINE_CUDA: &str = "
extern \"C\" __global__ void affine(UNIRT_PARAMS) {
    unsigned x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= grid().x || y >= grid().y) return;
    i64 ia = y * stride_t0(0) + x * stride_t0(1);
    i64 io = y * shape_t0(1) + x;
    st_t1(io, ld_t0(ia) * arg0() + (float)arg1() + arg2() + (float)x);
}
";

/// `op` planned over `a` in, a tensor like it out, with `scalars` over `grid`.
fn plan_over(
    op: &str,
    a: &Tensor,
    scalars: &[KernelArg],
    grid: [u32; 3],
) -> unirt::Result<unirt::ops::Plan> {
    ops::custom(op, DType::F32, &[a.desc()], &[a.desc()], scalars, grid)
}

/// Kernels in the device's own language that cannot be planned: each is a typed error at
/// plan time (compile error, a launch shape the device cannot run, a kernel declared with
/// parameters other than the ones unirt passes), never a launch.
fn user_kernel_bad_input(ctx: &Ctx, a: &Tensor, scalars: &[KernelArg]) -> Result<(), Failure> {
    let cases: Vec<(&str, KernelImpl, &[&str])> = match ctx.device.kind {
        DeviceKind::Cuda => vec![
            (
                "user_bad_source",
                KernelImpl::CudaC {
                    source: "extern \"C\" __global__ void affine(UNIRT_PARAMS) { undeclared; }"
                        .into(),
                    entry: "affine".into(),
                    block: [8, 8, 1],
                },
                &["kernel_compile"],
            ),
            (
                "user_bad_signature",
                KernelImpl::CudaC {
                    source: "extern \"C\" __global__ void affine(float *p) { p[0] = 1.0f; }".into(),
                    entry: "affine".into(),
                    block: [8, 8, 1],
                },
                &["bad_param"],
            ),
            (
                "user_bad_entry",
                KernelImpl::CudaC {
                    source: AFFINE_CUDA.into(),
                    entry: "not_there".into(),
                    block: [8, 8, 1],
                },
                &["bad_param"],
            ),
            (
                "user_bad_block",
                KernelImpl::CudaC {
                    source: AFFINE_CUDA.into(),
                    entry: "affine".into(),
                    block: [64, 32, 1],
                },
                &["bad_param"],
            ),
        ],
        DeviceKind::Wgpu => vec![
            (
                "user_bad_source",
                KernelImpl::Wgsl {
                    source: "@compute @workgroup_size(8, 8, 1) fn affine() { undeclared(); }"
                        .into(),
                    entry: "affine".into(),
                    workgroup: [8, 8, 1],
                },
                &["kernel_compile"],
            ),
            (
                "user_bad_block",
                KernelImpl::Wgsl {
                    source: AFFINE_WGSL.into(),
                    entry: "affine".into(),
                    workgroup: [8, 0, 1],
                },
                &["bad_param"],
            ),
            // Registered larger than declared: the dispatch would cover a quarter of the grid.
            (
                "user_other_workgroup",
                KernelImpl::Wgsl {
                    source: AFFINE_WGSL.into(),
                    entry: "affine".into(),
                    workgroup: [16, 16, 1],
                },
                &["bad_param"],
            ),
            (
                "user_bad_entry",
                KernelImpl::Wgsl {
                    source: AFFINE_WGSL.into(),
                    entry: "not_there".into(),
                    workgroup: [8, 8, 1],
                },
                &["bad_param", "kernel_compile"],
            ),
        ],
        _ => Vec::new(),
    };
    let mut cases = cases;
    if ctx.device.kind == DeviceKind::Wgpu {
        // A binding of its own: unirt binds nothing there (binding 31 once read the operator
        // constants' uniform copy, silently), so it is refused at plan time.
        for (op, binding, read) in [
            (
                "user_own_binding",
                "@group(0) @binding(31) var<uniform> extra: vec4<u32>;",
                "f32(extra.x)",
            ),
            (
                "user_own_group",
                "@group(1) @binding(0) var<storage, read> extra: array<f32>;",
                "extra[0]",
            ),
        ] {
            let source = AFFINE_WGSL.replace("+ f32(g.x)", &format!("+ f32(g.x) + {read}"));
            cases.push((
                op,
                KernelImpl::Wgsl {
                    source: format!("{binding}\n{source}").into(),
                    entry: "affine".into(),
                    workgroup: [8, 8, 1],
                },
                &["bad_param"],
            ));
        }
    }
    if ctx.device.kind == DeviceKind::Wgpu {
        // Sources deep enough to crash a compiler: a 20 000-term sum overflowed the planning
        // thread's stack inside naga (the process aborted); 100 000 `let`s each using the one
        // before crashed lavapipe's LLVM. Both are refused at plan time, nothing compiled.
        let sum = format!("st_t1(io, ld_t0(ia){});", " + 1.0".repeat(20_000));
        let lets: String = (0..6_000)
            .map(|i| format!("let a{} = a{i} * 1.5 + 1.0;\n", i + 1))
            .collect();
        let lets = format!("let a0 = ld_t0(ia);\n{lets}st_t1(io, a6000);");
        for (op, body) in [("user_deep_expression", sum), ("user_long_chain", lets)] {
            let source = AFFINE_WGSL.replace(
                "st_t1(io, ld_t0(ia) * arg0() + f32(arg1()) + arg2() + f32(g.x));",
                &body,
            );
            cases.push((
                op,
                KernelImpl::Wgsl {
                    source: source.into(),
                    entry: "affine".into(),
                    workgroup: [8, 8, 1],
                },
                &["bad_param"],
            ));
        }
    }
    for (op, kernel, kinds) in cases {
        ops::register_kernel(op, ctx.device.kind, DType::F32, kernel).map_err(err("register"))?;
        expect_kind(plan_over(op, a, scalars, [7, 5, 1]), kinds, op)?;
    }
    Ok(())
}

/// A grid of more blocks or workgroups than the device dispatches is refused at plan time.
/// On wgpu it once reached the command encoder, whose validation error also dropped the work
/// batched before it: a sum queued earlier on the stream read back as an error, and an
/// operator that used the sum afterwards read zeros.
fn user_kernel_huge_grid(ctx: &Ctx, a: &Tensor, scalars: &[KernelArg]) -> Result<(), Failure> {
    if ctx.device.kind == DeviceKind::Cpu {
        return Ok(()); // the CPU runs any grid (one call per point)
    }
    let before = a.add_scalar(5.0).map_err(err("add_scalar"))?;
    // y beyond 65 535 blocks on both; x beyond 65 535 workgroups on wgpu (CUDA's x goes to
    // 2^31 - 1 blocks).
    let grids: &[[u32; 3]] = match ctx.device.kind {
        DeviceKind::Wgpu => &[[u32::MAX, 1, 1], [8, u32::MAX, 1]],
        _ => &[[8, u32::MAX, 1]],
    };
    for &grid in grids {
        expect_kind(
            plan_over("user_affine", a, scalars, grid),
            &["bad_param"],
            &format!("a grid of {grid:?}"),
        )?;
    }
    let after = before.mul_scalar(2.0).map_err(err("mul_scalar"))?;
    let want: Vec<f64> = values(a, "a")?.iter().map(|v| (v + 5.0) * 2.0).collect();
    close(
        "work queued around the refused plans",
        &values(&after, "after")?,
        &want,
        DType::F32,
        None,
    )
}

fn user_kernel(ctx: &Ctx) -> Result<(), Failure> {
    ops::register_kernel(
        "user_affine",
        DeviceKind::Cpu,
        DType::F32,
        KernelImpl::HostPerItem(affine),
    )
    .map_err(err("register"))?;
    ops::register_kernel(
        "user_affine",
        DeviceKind::Wgpu,
        DType::F32,
        KernelImpl::Wgsl {
            source: AFFINE_WGSL.into(),
            entry: "affine".into(),
            workgroup: [8, 8, 1],
        },
    )
    .map_err(err("register"))?;
    ops::register_kernel(
        "user_affine",
        DeviceKind::Cuda,
        DType::F32,
        KernelImpl::CudaC {
            source: AFFINE_CUDA.into(),
            entry: "affine".into(),
            block: [8, 8, 1],
        },
    )
    .map_err(err("register"))?;
    let (base, vb) = random(&[7, 5], -1.0, 1.0, 900, DType::F32, ctx.device)?;
    let a = base.transpose(0, 1).map_err(err("transpose"))?; // [5, 7], strided
    let scalars = [
        KernelArg::F32(0.5),
        KernelArg::I64(-3),
        KernelArg::F16(half::f16::from_f32(0.25)),
    ];
    user_kernel_bad_input(ctx, &a, &scalars)?;
    user_kernel_huge_grid(ctx, &a, &scalars)?;
    let plan = plan_over("user_affine", &a, &scalars, [7, 5, 1]).map_err(err("plan"))?;
    let out = plan.run1(&[&a]).map_err(err("launch"))?;
    let ha = host_view(&vb, a.layout());
    let want: Vec<f64> = (0..35)
        .map(|i| ha[i] * 0.5 - 3.0 + 0.25 + (i % 7) as f64)
        .collect();
    close(
        "user kernel",
        &values(&out, "user kernel")?,
        &want,
        DType::F32,
        None,
    )?;
    expect_kind(
        plan_over("user_affine", &a, &scalars, [7, 0, 1]),
        &["bad_param"],
        "an empty grid dimension",
    )
}
