//! `cast` in WGSL between every pair of dtypes, with Rust's `as` semantics through f64 as
//! the CPU kernel has them (floats to integers saturate, NaN to 0; integers to integers
//! saturate; anything to bool is `!= 0`). Floats convert through f32 (the value every float
//! dtype here computes in); integer sources convert exactly (i64 through its two words).
//!
//! Constants: `cfg[0]` the element count, `cfg[1]` where the source's view starts.

use std::sync::Arc;

use super::elementwise::groups_for;
use super::op::{prepare as prepare_op, OpSource};
use super::shapes::{self, Numbers};
use super::wgsl::{self, Bind, ViewCode, LINEAR_ID, MAIN_1D};
use crate::error::{Error, Result};
use crate::ops::{Params, PlanSpec, PreparedKernel};
use crate::tensor::DType;

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// The body converting source element `j` into output element `i`.
fn convert(from: DType, to: DType) -> String {
    if from == to || (is_float(from) && is_float(to)) {
        return if from == to {
            "str_dst(i, ldr_src(j));".into()
        } else {
            "st_dst(i, ld_src(j));".into()
        };
    }
    if is_float(from) {
        let v = "let v = ld_src(j);\n    ";
        return match to {
            DType::I32 => format!(
                "{v}sti_dst(i, select(select(i32(clamp(v, -2147483648.0, 2147483520.0)), 2147483647, \
                 v >= 2147483648.0), 0, is_nan(v)));"
            ),
            DType::I64 => format!(
                "{v}let c = select(clamp(v, -9223372036854775808.0, 9223371487098961920.0), 0.0, is_nan(v));\n    \
                 let t = trunc(c);\n    if (abs(t) < 2147483648.0) {{ sti_dst(i, i32(t)); return; }}\n    let hi = floor(t / 4294967296.0);\n    \
                 let lo = t - hi * 4294967296.0;\n    \
                 var w = vec2<u32>(u32(lo), bitcast<u32>(i32(hi)));\n    \
                 if (v >= 9223372036854775808.0) {{ w = vec2<u32>(0xffffffffu, 0x7fffffffu); }}\n    \
                 str_dst(i, w);"
            ),
            DType::U8 => {
                format!("{v}str_dst(i, vec2<u32>(select(u32(clamp(v, 0.0, 255.0)), 0u, is_nan(v)), 0u));")
            }
            _ => format!("{v}str_dst(i, vec2<u32>(select(0u, 1u, v != 0.0 || is_nan(v)), 0u));"),
        };
    }
    if from == DType::I64 {
        let w = "let w = ldr_src(j);\n    let lo = bitcast<i32>(w.x);\n    let hi = bitcast<i32>(w.y);\n    ";
        return match to {
            // bf16 keeps 8 bits: rounded once from the f64 value, as the CPU does (through
            // f32 first, a value could round twice).
            DType::BF16 => "st_dst(i, i64_f32_src(ldr_src(j), 8u));".into(),
            t if is_float(t) => "st_dst(i, ld_src(j));".into(),
            DType::I32 => format!(
                "{w}sti_dst(i, select(select(2147483647, -2147483647 - 1, hi < 0), lo, hi == (lo >> 31u)));"
            ),
            DType::U8 => format!(
                "{w}str_dst(i, vec2<u32>(select(select(255u, 0u, hi < 0), min(w.x, 255u), hi == 0), 0u));"
            ),
            _ => format!("{w}str_dst(i, vec2<u32>(select(0u, 1u, (w.x | w.y) != 0u), 0u));"),
        };
    }
    // i32, u8, bool sources: exact as i32.
    let v = "let v = ldi_src(j);\n    ";
    match to {
        t if is_float(t) => format!("{v}st_dst(i, f32(v));"),
        DType::I32 | DType::I64 => format!("{v}sti_dst(i, v);"),
        DType::U8 => format!("{v}str_dst(i, vec2<u32>(u32(clamp(v, 0, 255)), 0u));"),
        _ => format!("{v}str_dst(i, vec2<u32>(select(0u, 1u, v != 0), 0u));"),
    }
}

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let Params::Cast { to } = *spec.params else {
        return Err(Error::Internal(format!(
            "cast: parameters {:?}",
            spec.params
        )));
    };
    prepare_op(
        spec,
        shapes::twin(spec, |numbers| Ok(source(spec, to, numbers)))?,
    )
}

/// The kernel casting the plan's input to `to`, a strided source's shape held as `numbers`
/// says on the host's cores.
fn source(spec: &PlanSpec<'_>, to: DType, numbers: Numbers) -> OpSource {
    let (src, dst) = (&spec.inputs[0], &spec.outputs[0]);
    let n = dst.layout.numel();
    let mut cfg = vec![n as u32, 0];
    cfg[1] = wgsl::push_view(&mut cfg, src.layout.shape(), src.layout.strides());
    let binds = [Bind::read("src", src.dtype), Bind::write("dst", to)];
    let mut views = String::new();
    let j = if src.layout.is_contiguous() {
        "i".to_string()
    } else {
        let (shape, strides) = (src.layout.shape(), src.layout.strides());
        let code = ViewCode::of(super::on_host_cores(spec), numbers);
        wgsl::view_index(&mut views, "view_src", "i", (&cfg, 1), shape, strides, code)
    };
    let source = format!(
        "{}\n{views}{MAIN_1D} {{\n    let i = {LINEAR_ID};\n    if (i >= cfg[0]) {{ return; }}\n    \
         let j = {j};\n    {}\n}}\n",
        wgsl::prelude(&binds, wgsl::Dialect::of(spec)),
        convert(src.dtype, to),
    );
    OpSource::plain(
        format!("cast {} to {to}", src.dtype),
        vec![(source, groups_for(n as u64))],
        cfg,
    )
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    super::reg_all(reg, "cast", &DType::ALL, prepare);
}
