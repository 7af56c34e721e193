//! User kernels written in WGSL ([`KernelImpl::Wgsl`], registered with
//! [`crate::ops::register_kernel`]) prepared like the built-in operators and launched through
//! the same path (allocation-table checks, bind-group cache, stream capture).
//!
//! The user's source is compiled after a prelude that gives it, for tensor `t<k>` (inputs then
//! outputs, in plan order): `ld_t<k>(i) -> f32` / `st_t<k>(i, v)` (element `i` counted from the
//! tensor's first element, strides applied by the caller: `stride_t<k>(d)`, `shape_t<k>(d)`,
//! `ldi_`/`sti_` for integers, `ldr_`/`str_` for raw bits); `grid() -> vec3<u32>` (the plan's
//! launch grid; the dispatch covers it with workgroups of the registered size, so the kernel
//! checks its bounds); and `arg<k>()` for scalar `k`: f32 for float scalars, i32 for signed
//! ones, u32 for unsigned ones.

use std::fmt::Write;
use std::sync::Arc;

use super::op::{prepare as prepare_op, OpSource};
use super::user_limits::{
    dependency_depth, nesting_estimate, MAX_DEPENDENCY_DEPTH, MAX_NESTING, PARSE_STACK,
};
use super::wgsl::{self, Bind};
use crate::error::{Error, Result};
use crate::hal::KernelArg;
use crate::ops::{KernelImpl, PlanSpec, PreparedKernel};

const NAMES: [&str; 8] = ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"];

/// Prepares a registered WGSL kernel for a plan.
pub(crate) fn prepare(spec: &PlanSpec<'_>, kernel: &KernelImpl) -> Result<Arc<dyn PreparedKernel>> {
    let KernelImpl::Wgsl {
        source,
        entry,
        workgroup,
    } = kernel
    else {
        return Err(Error::Internal(format!("{}: not a WGSL kernel", spec.op)));
    };
    if workgroup.contains(&0) {
        return Err(Error::BadParam(format!(
            "{}: workgroup size {workgroup:?} has an empty dimension",
            spec.op
        )));
    }
    let tensors: Vec<_> = spec.inputs.iter().chain(spec.outputs).collect();
    if tensors.len() > NAMES.len() {
        return Err(Error::BadParam(format!(
            "{}: a WGSL kernel takes at most {} tensors",
            spec.op,
            NAMES.len()
        )));
    }
    let mut cfg: Vec<u32> = spec.grid.to_vec();
    let mut pre =
        String::from("fn grid() -> vec3<u32> { return vec3<u32>(cfg[0], cfg[1], cfg[2]); }\n");
    let mut binds = Vec::new();
    for (k, t) in tensors.iter().enumerate() {
        let n = NAMES[k];
        let at = wgsl::push_view_exact(&mut cfg, t.layout.shape(), t.layout.strides());
        let _ = writeln!(
            pre,
            "fn shape_{n}(d: u32) -> u32 {{ return cfg[{}u + d]; }}\n\
             fn stride_{n}(d: u32) -> u32 {{ return cfg[{}u + cfg[{at}u] + d]; }}",
            at + 1,
            at + 1
        );
        binds.push(if k < spec.inputs.len() {
            Bind::read(n, t.dtype)
        } else {
            Bind::write(n, t.dtype)
        });
    }
    for (k, a) in spec.scalars.iter().enumerate() {
        let at = cfg.len();
        let (ty, word) = match *a {
            KernelArg::F32(v) => ("f32", v.to_bits()),
            KernelArg::F64(v) => ("f32", (v as f32).to_bits()),
            KernelArg::F16(v) => ("f32", v.to_f32().to_bits()),
            KernelArg::BF16(v) => ("f32", v.to_f32().to_bits()),
            KernelArg::I32(v) => ("i32", v as u32),
            KernelArg::I64(v) => (
                "i32",
                i32::try_from(v).map_err(|_| {
                    Error::BadParam(format!(
                        "{}: scalar {k} ({v}) does not fit WGSL's i32",
                        spec.op
                    ))
                })? as u32,
            ),
            KernelArg::U32(v) => ("u32", v),
            KernelArg::U64(v) => (
                "u32",
                u32::try_from(v).map_err(|_| {
                    Error::BadParam(format!(
                        "{}: scalar {k} ({v}) does not fit WGSL's u32",
                        spec.op
                    ))
                })?,
            ),
            KernelArg::U8(v) => ("u32", u32::from(v)),
            KernelArg::Bool(v) => ("u32", u32::from(v)),
            KernelArg::Ptr(_) => {
                return Err(Error::BadParam(format!(
                    "{}: scalar {k} is a pointer; pass tensors as the plan's inputs and outputs",
                    spec.op
                )))
            }
        };
        cfg.push(word);
        let _ = writeln!(
            pre,
            "fn arg{k}() -> {ty} {{ return bitcast<{ty}>(cfg[{at}u]); }}"
        );
    }
    let groups = [0, 1, 2].map(|d| spec.grid[d].div_ceil(workgroup[d]));
    let src = format!(
        "{}{pre}\n{source}\n",
        wgsl::prelude(&binds, wgsl::Dialect::of(spec))
    );
    // Checked and compiled on a thread whose stack is known to be enough (see user_limits):
    // naga parses on the calling thread, whatever its stack.
    let tensors = tensors.len();
    let compile = move || -> Result<Arc<dyn PreparedKernel>> {
        check_module(spec.op, source, &src, entry, *workgroup, tensors)?;
        prepare_op(
            spec,
            OpSource {
                name: spec.op.to_string(),
                passes: vec![(src, groups)],
                cfg,
                entry: Some(entry.clone()),
                zero_workgroup_memory: true,
                aligned: None,
                textured: None,
            },
        )
    };
    std::thread::scope(|s| {
        let thread = std::thread::Builder::new()
            .name("unirt-wgsl-compile".into())
            .stack_size(PARSE_STACK)
            .spawn_scoped(s, compile)
            .map_err(|e| Error::Internal(format!("{}: no compile thread: {e}", spec.op)))?;
        thread.join().unwrap_or_else(|_| {
            Err(Error::Internal(format!(
                "{}: compiling the WGSL kernel panicked",
                spec.op
            )))
        })
    })
}

/// What the compiler cannot refuse but unirt must, in `src` (the user's `source` after the
/// prelude):
/// - The user's source nests no expression deeper than [`MAX_NESTING`] and the module's
///   longest chain of dependent operations is at most [`MAX_DEPENDENCY_DEPTH`]
///   (`user_limits.rs`): deeper ones crash compilers.
/// - The entry point's declared `@workgroup_size` must be the registered one: the dispatch is
///   sized with the registered one, so a kernel declaring a smaller size would silently leave
///   part of its grid unprocessed (seen: `[16, 16, 1]` registered, `(8, 8, 1)` declared, half
///   of a 64-element grid untouched). Sizes set by pipeline-overridable constants are not
///   known here and pass.
/// - The source declares no binding of its own (the prelude's are `@group(0)`, the
///   constants then the `tensors`): unirt binds nothing else, and the operator layout's
///   binding 31 (the constants' uniform copy) would have been read silently.
///
/// Source that does not parse is left to the compiler, whose error names the problem.
fn check_module(
    op: &str,
    source: &str,
    src: &str,
    entry: &str,
    workgroup: [u32; 3],
    tensors: usize,
) -> Result<()> {
    let nesting = nesting_estimate(source);
    if nesting > MAX_NESTING {
        return Err(Error::BadParam(format!(
            "{op}: the WGSL source nests an expression about {nesting} operators deep; unirt \
             takes at most {MAX_NESTING} (naga's front end recurses once per level: split the \
             expression with `let`s)"
        )));
    }
    let Ok(module) = naga::front::wgsl::parse_str(src) else {
        return Ok(());
    };
    let chain = dependency_depth(&module);
    if chain > MAX_DEPENDENCY_DEPTH {
        return Err(Error::BadParam(format!(
            "{op}: the WGSL source computes a chain of {chain} dependent operations; unirt \
             takes at most {MAX_DEPENDENCY_DEPTH} (drivers' compilers recurse along such \
             chains: lavapipe's crashed at 200 000): carry the value through a `var`"
        )));
    }
    for (_, g) in module.global_variables.iter() {
        if let Some(b) = &g.binding {
            if b.group != 0 || b.binding as usize > tensors {
                return Err(Error::BadParam(format!(
                    "{op}: the WGSL source declares @group({}) @binding({}){}, which unirt does \
                     not bind: a user kernel reads its tensors and scalars through the \
                     prelude's functions (ld_t0, st_t1, arg0, …)",
                    b.group,
                    b.binding,
                    g.name
                        .as_deref()
                        .map(|n| format!(" ({n})"))
                        .unwrap_or_default()
                )));
            }
        }
    }
    let Some(ep) = module.entry_points.iter().find(|e| e.name == entry) else {
        return Err(Error::BadParam(format!(
            "{op}: the WGSL source has no entry point {entry:?}"
        )));
    };
    if ep.stage != naga::ShaderStage::Compute {
        return Err(Error::BadParam(format!(
            "{op}: entry point {entry:?} is not a compute shader"
        )));
    }
    if ep.workgroup_size_overrides.is_none() && ep.workgroup_size != workgroup {
        return Err(Error::BadParam(format!(
            "{op}: entry point {entry:?} declares @workgroup_size{:?}, registered as {workgroup:?}",
            ep.workgroup_size
        )));
    }
    Ok(())
}
