//! `fused_elementwise` in WGSL: a chain of elementwise steps, one work item per element (or
//! per four, in the quad variant of launches whose tensors start on a multiple of four
//! elements), each input loaded once and only the last step stored.
//!
//! Each step calls a function whose body is the unfused operator's expression (the same text
//! as `elementwise.rs` generates), then passes its result through `keep`: rounded to the dtype
//! as the unfused operator stores it, and made opaque to the shader compiler (its bits XORed
//! with a constant that is 0 at run time). The unfused operators store every result, so a
//! multiply in one step contracted with an add in the next into one fused multiply-add would
//! round differently; behind `keep` the compiler cannot see through a step. The fused chain is
//! therefore bitwise the unfused one (conformance `ops::fused_elementwise::*` checks it).
//!
//! Constants: `cfg[0]` the element count, `cfg[1]` zero (the opaque mask). A step's scalar is
//! written into the source as its f32 bits XORed with that mask: opaque to the compiler like a
//! value read at run time, so the step rounds as the unfused operator does, but it costs no
//! load of its own — on Mesa's software adapters every distinct storage load of a work item is
//! a loop over the SIMD lanes, and the four scalars of a 4-step chain read from `cfg` made the
//! fused chain 1.4× slower (docs/BENCHMARKS.md, tenth session).

use std::sync::Arc;

use super::elementwise::{expr, groups_for, quad_lanes, quad_lanes_reading, MATH};
use super::op::{prepare as prepare_op, OpSource, TexRead, MAX_TENSORS};
use super::textures::flat_textures;
use super::wgsl::{self, Bind, LINEAR_ID, MAIN_1D};
use super::{reg_all, FLOATS};
use crate::error::{Error, Result};
use crate::ops::fused::{planned, FusedProgram, FusedSrc, FusedStep, FUSED_ELEMENTWISE};
use crate::ops::{PlanSpec, PreparedKernel};
use crate::tensor::DType;

/// The `cfg` word of a fused chain that holds the opaque zero (`keep`, the steps' scalars).
const MASK: usize = 1;

const NAMES: [&str; MAX_TENSORS - 1] = ["in0", "in1", "in2", "in3", "in4", "in5", "in6"];
// Every input a planned program may have gets a name (`planned` checks the count).
const _: () = assert!(NAMES.len() >= crate::ops::fused::MAX_FUSED_INPUTS);

/// `keep(v)`: `v` rounded to `dtype` and hidden from the optimizer (see the module docs);
/// `cfg[mask]` holds the opaque zero.
pub(super) fn keep(dtype: DType, mask: usize) -> Result<String> {
    Ok(match dtype {
        DType::F32 => format!(
            "fn keep(v: f32) -> f32 {{ return bitcast<f32>(bitcast<u32>(v) ^ cfg[{mask}]); }}\n"
        ),
        DType::F16 => format!(
            "fn keep(v: f32) -> f32 {{\n    let h = pack2x16float(vec2<f32>(v, 0.0)) & 0xffffu;\n    \
             return unpack2x16float(h ^ cfg[{mask}]).x;\n}}\n"
        ),
        DType::BF16 => format!(
            "fn keep(v: f32) -> f32 {{\n    let b = bitcast<u32>(v);\n    \
             let h = select((b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u, 0x7fc0u, is_nan(v));\n    \
             return bitcast<f32>((h ^ cfg[{mask}]) << 16u);\n}}\n"
        ),
        other => {
            return Err(Error::Internal(format!(
                "{FUSED_ELEMENTWISE}: no wgpu kernel for {other:?}"
            )))
        }
    })
}

/// The WGSL of a program's steps: one function per step (the unfused operator's expression)
/// and the body lines `let t<s> = keep(step<s>(…));`, each step's scalar its f32 bits XORed
/// with `cfg[mask]` (the opaque zero `keep` uses). Input `k` is read from `x<k>`, step `s`'s
/// result is `t<s>`. Returns (functions, body).
pub(super) fn steps_wgsl(prog: &FusedProgram, mask: usize) -> Result<(String, String)> {
    let operand = |src: FusedSrc| match src {
        FusedSrc::Input(k) => format!("x{k}"),
        FusedSrc::Step(k) => format!("t{k}"),
    };
    let (mut funcs, mut body) = (String::new(), String::new());
    for (s, step) in prog.steps.iter().enumerate() {
        let (name, a, b, scalar) = match *step {
            FusedStep::Unary(u, a) => (u.name(), a, None, 0.0),
            FusedStep::Binary(o, a, b) => (o.name(), a, Some(b), 0.0),
            FusedStep::Scalar(o, a, c) => (o.scalar_name(), a, None, c),
            FusedStep::Swiglu(a, b) => ("swiglu", a, Some(b), 0.0),
        };
        let e = expr(name).ok_or_else(|| {
            Error::Internal(format!(
                "{FUSED_ELEMENTWISE}: no wgpu expression for {name}"
            ))
        })?;
        funcs += &format!("fn step{s}(x0: f32, x1: f32, s: f32) -> f32 {{ return {e}; }}\n");
        let b = b.map_or_else(|| "0.0".to_string(), &operand);
        body += &format!(
            "    let t{s} = keep(step{s}({}, {b}, bitcast<f32>({:#x}u ^ cfg[{mask}u])));\n",
            operand(a),
            wgsl::f(scalar)
        );
    }
    Ok((funcs, body))
}

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let (prog, out) = planned(spec)?;
    let n = out.layout.numel();
    let cfg = vec![n as u32, 0]; // cfg[MASK] = 0
    let mut binds = Vec::new();
    let mut loads = String::new();
    for (k, d) in spec.inputs.iter().enumerate() {
        binds.push(Bind::read(NAMES[k], d.dtype));
        // The plan made every input contiguous of the output's shape.
        loads += &format!("    let x{k} = ld_{}(i);\n", NAMES[k]);
    }
    binds.push(Bind::write("out", out.dtype));
    let (funcs, body) = steps_wgsl(prog, MASK)?;
    let last = prog.steps.len() - 1;
    let keep = keep(out.dtype, MASK)?;
    let source = format!(
        "{prelude}{MATH}\n{keep}{funcs}\n{MAIN_1D} {{\n    let i = {LINEAR_ID};\n    \
         if (i >= cfg[0]) {{ return; }}\n{loads}{body}    st_out(i, t{last});\n}}\n",
        prelude = wgsl::prelude(&binds, wgsl::Dialect::of(spec)),
    );
    // The quad variant: four elements per load and store, each run through the same steps;
    // on the host's cores, also one that reads the inputs through textures.
    let quad_source = |prelude: &str, decls: &str, lanes: &str| {
        vec![(
            format!(
                "{prelude}{MATH}\n{keep}{funcs}\n{decls}{MAIN_1D} {{\n    let i = 4u * ({LINEAR_ID});\n    \
                 if (i >= cfg[0]) {{ return; }}\n{lanes}    st4_out(i, r);\n}}\n"
            ),
            groups_for(n as u64 / 4),
        )]
    };
    let step = |c: &str| format!("\n{body}    r.{c} = t{last};\n    ");
    let (aligned, textured) = match wgsl::prelude_quads(&binds) {
        Some(prelude) if n % 4 == 0 => {
            let aligned = quad_source(&prelude, "", &quad_lanes(&binds, step));
            let direct = vec![true; spec.inputs.len()];
            let textured = flat_textures(&binds, &direct, n)
                .filter(|_| super::on_host_cores(spec))
                .map(|t| {
                    let plain: Vec<String> = binds[..binds.len() - 1]
                        .iter()
                        .map(|b| format!("ld4_{}(i)", b.name))
                        .collect();
                    let lanes = quad_lanes_reading(&binds, &t.loads(&plain), step);
                    TexRead {
                        passes: quad_source(&prelude, &t.decls, &lanes),
                        inputs: t.inputs,
                    }
                });
            (Some(aligned), textured)
        }
        _ => (None, None),
    };
    prepare_op(
        spec,
        OpSource::variants(
            spec.op.to_string(),
            vec![(source, groups_for(n as u64))],
            cfg,
            aligned,
            textured,
        ),
    )
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    reg_all(reg, FUSED_ELEMENTWISE, FLOATS, prepare);
}
