//! softmax, log_softmax and causal_softmax in WGSL: one workgroup per row (every index but
//! the axis; on the host's cores one invocation per row, or a few where the row is long:
//! [`rowwise::row_kernel`]), three strided sweeps of the row (max, sum of exponentials,
//! write), so the input is read in place and the output may be the input's very view.
//!
//! Constants: `cfg[0]` rows, `cfg[1]` the axis length, `cfg[2]` / `cfg[3]` the axis strides of
//! the input and the output, `cfg[4]` / `cfg[5]` where the rows' views start, `cfg[6]` 1 when
//! causal, `cfg[7]` the query length, `cfg[8]` the causal offset.

use std::sync::Arc;

use super::op::{prepare as prepare_op, OpSource, TexRead};
use super::rowwise;
use super::textures::row_texture;
use super::wgsl::{self, Bind};
use super::{reg_all, FLOATS};
use crate::error::{Error, Result};
use crate::ops::{Params, PlanSpec, PreparedKernel};

const BODY: &str = "
    if (row >= cfg[0]) { return; }
    let len = cfg[1];
    let xb = view_off(row, cfg[4]);
    let ob = view_off(row, cfg[5]);
    var vis = len;
    if (cfg[6] != 0u) { vis = min(len, row % cfg[7] + cfg[8] + 1u); }
    var m = neg_inf();
    for (var j = lid; j < vis; j = j + LANES) { m = max(m, ld_x(xb + j * cfg[2])); }
    m = wg_max(m, lid);
    var s = 0.0;
    for (var j = lid; j < vis; j = j + LANES) { s = s + exp(ld_x(xb + j * cfg[2]) - m); }
    s = wg_sum(s, lid);
    let ls = log(s);
    for (var j = lid; j < len; j = j + LANES) {
        var y = MASKED;
        if (j < vis) { let v = ld_x(xb + j * cfg[2]) - m; y = RESULT; }
        st_out(ob + j * cfg[3], y);
    }
";

/// The quad variant on the host's cores (not causal; contiguous rows of 4k elements along the
/// last axis): four elements per load, the max and the sum kept in the four lanes of a vec4,
/// each lane taking every `LANES`-th quad (with one lane, the whole row in order).
const BODY_QUADS: &str = "
    if (row >= cfg[0]) { return; }
    let len = cfg[1];
    let xb = view_off(row, cfg[4]);
    let ob = view_off(row, cfg[5]);
    var m4 = vec4<f32>(neg_inf());
    for (var j = lid * 4u; j < len; j = j + 4u * LANES) { m4 = max(m4, ld4_x(xb + j)); }
    let m = wg_max(max(max(m4.x, m4.y), max(m4.z, m4.w)), lid);
    var s4 = vec4<f32>(0.0);
    for (var j = lid * 4u; j < len; j = j + 4u * LANES) { s4 = s4 + exp(ld4_x(xb + j) - m); }
    let s = wg_sum(s4.x + s4.y + s4.z + s4.w, lid);
    let ls = log(s);
    for (var j = lid * 4u; j < len; j = j + 4u * LANES) {
        let v = ld4_x(xb + j) - m;
        st4_out(ob + j, RESULT);
    }
";

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let Params::Softmax { axis, log, causal } = *spec.params else {
        return Err(Error::Internal(format!(
            "{}: parameters {:?}",
            spec.op, spec.params
        )));
    };
    let (x, out) = (&spec.inputs[0], &spec.outputs[0]);
    let shape = x.layout.shape();
    let (ks, xst) = wgsl::kept(shape, x.layout.strides(), &[axis]);
    let (_, ost) = wgsl::kept(shape, out.layout.strides(), &[axis]);
    let rows: usize = ks.iter().product();
    let nd = shape.len();
    let q_len = if nd >= 2 { shape[nd - 2] } else { 1 };
    let mut cfg = vec![
        rows as u32,
        shape[axis] as u32,
        x.layout.strides()[axis] as u32,
        out.layout.strides()[axis] as u32,
        0,
        0,
        u32::from(causal.is_some()),
        q_len.max(1) as u32,
        causal.unwrap_or(0) as u32,
    ];
    cfg[4] = wgsl::push_view(&mut cfg, &ks, &xst);
    cfg[5] = wgsl::push_view(&mut cfg, &ks, &ost);
    let binds = [Bind::read("x", x.dtype), Bind::write("out", out.dtype)];
    let (masked, result) = if log {
        ("neg_inf()", "v - ls")
    } else {
        ("0.0", "exp(v) / s")
    };
    let body = BODY.replace("MASKED", masked).replace("RESULT", result);
    // Three sweeps of the row (max, sum, write), by one lane or several (see `row_lanes`).
    let len = shape[axis] as u64;
    let lanes = super::row_lanes(spec, rows, len, 3)?;
    let dialect = wgsl::Dialect::of(spec);
    let prelude = wgsl::prelude(&binds, dialect);
    let (source, grid) = rowwise::row_kernel(&prelude, &body, lanes, rows, dialect);
    let quads = super::on_host_cores(spec)
        && causal.is_none()
        && axis + 1 == shape.len()
        && wgsl::quad_rows(x)
        && wgsl::quad_rows(out);
    let (aligned, textured) = match (quads, wgsl::prelude_quads(&binds)) {
        (true, Some(prelude)) => {
            let body = BODY_QUADS.replace("RESULT", result);
            let aligned = vec![rowwise::row_kernel(&prelude, &body, lanes, rows, dialect)];
            // The rows through a texture (see `TexRead`) when they are contiguous and many.
            let textured =
                row_texture(x, &binds, (rows, shape[axis])).map(|(inputs, decl, read)| {
                    let body = body.replace("ld4_x(xb + j)", read);
                    let prelude = format!("{prelude}{decl}");
                    TexRead {
                        passes: vec![rowwise::row_kernel(&prelude, &body, lanes, rows, dialect)],
                        inputs,
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
            vec![(source, grid)],
            cfg,
            aligned,
            textured,
        ),
    )
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    for op in ["softmax", "log_softmax", "causal_softmax"] {
        reg_all(reg, op, FLOATS, prepare);
    }
}
