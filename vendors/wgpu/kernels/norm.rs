//! rms_norm and layer_norm over the last dimension in WGSL: one workgroup per row, the row
//! read in place (strided), the statistics reduced in workgroup memory, then written (on
//! adapters on the host's cores, one invocation per row, or a few where the row is long:
//! [`rowwise::row_kernel`]).
//!
//! Constants: `cfg[0]` rows, `cfg[1]` the row length, `cfg[2]` / `cfg[3]` the last-axis
//! strides of the input and the output, `cfg[4]` / `cfg[5]` where the rows' views start,
//! `cfg[6]` eps (f32 bits), `cfg[7]` / `cfg[8]` the weight's and the bias's strides.

use std::sync::Arc;

use super::op::{prepare as prepare_op, texture_binding, texture_rows, OpSource, TexRead};
use super::rowwise;
use super::textures::row_texture;
use super::wgsl::{self, Bind};
use super::{reg_all, FLOATS};
use crate::error::{Error, Result};
use crate::ops::{Params, PlanSpec, PreparedKernel};

const HEAD: &str = "
    if (row >= cfg[0]) { return; }
    let d = cfg[1];
    let xb = view_off(row, cfg[4]);
    let ob = view_off(row, cfg[5]);
    let eps = cfg_f(6u);
";

const RMS: &str = "
    var ss = 0.0;
    for (var j = lid; j < d; j = j + LANES) { let v = ld_x(xb + j * cfg[2]); ss = ss + v * v; }
    let inv = inverseSqrt(wg_sum(ss, lid) / f32(d) + eps);
    for (var j = lid; j < d; j = j + LANES) {
        st_out(ob + j * cfg[3], ld_x(xb + j * cfg[2]) * (inv * ld_w(j * cfg[7])));
    }
";

const LAYER: &str = "
    var s = 0.0;
    for (var j = lid; j < d; j = j + LANES) { s = s + ld_x(xb + j * cfg[2]); }
    let mean = wg_sum(s, lid) / f32(d);
    var ss = 0.0;
    for (var j = lid; j < d; j = j + LANES) { let v = ld_x(xb + j * cfg[2]) - mean; ss = ss + v * v; }
    let inv = inverseSqrt(wg_sum(ss, lid) / f32(d) + eps);
    for (var j = lid; j < d; j = j + LANES) {
        let v = ld_x(xb + j * cfg[2]) - mean;
        st_out(ob + j * cfg[3], v * inv * ld_w(j * cfg[7]) + ld_b(j * cfg[8]));
    }
";

/// The quad variant on the host's cores (contiguous rows of 4k elements): four elements per
/// load, the statistics summed in four lanes of a vec4, each lane taking every `LANES`-th
/// quad (with one lane, the whole row in order).
const RMS_QUADS: &str = "
    var ss = vec4<f32>(0.0);
    for (var j = lid * 4u; j < d; j = j + 4u * LANES) { let v = ld4_x(xb + j); ss = ss + v * v; }
    let inv = inverseSqrt(wg_sum(ss.x + ss.y + ss.z + ss.w, lid) / f32(d) + eps);
    for (var j = lid * 4u; j < d; j = j + 4u * LANES) {
        st4_out(ob + j, ld4_x(xb + j) * (inv * ld4_w(j)));
    }
";

const LAYER_QUADS: &str = "
    var s = vec4<f32>(0.0);
    for (var j = lid * 4u; j < d; j = j + 4u * LANES) { s = s + ld4_x(xb + j); }
    let mean = wg_sum(s.x + s.y + s.z + s.w, lid) / f32(d);
    var ss = vec4<f32>(0.0);
    for (var j = lid * 4u; j < d; j = j + 4u * LANES) { let v = ld4_x(xb + j) - mean; ss = ss + v * v; }
    let inv = inverseSqrt(wg_sum(ss.x + ss.y + ss.z + ss.w, lid) / f32(d) + eps);
    for (var j = lid * 4u; j < d; j = j + 4u * LANES) {
        st4_out(ob + j, (ld4_x(xb + j) - mean) * inv * ld4_w(j) + ld4_b(j));
    }
";

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let Params::Norm { eps } = *spec.params else {
        return Err(Error::Internal(format!(
            "{}: parameters {:?}",
            spec.op, spec.params
        )));
    };
    let layer = spec.op == "layer_norm";
    let (x, w, out) = (&spec.inputs[0], &spec.inputs[1], &spec.outputs[0]);
    let shape = x.layout.shape();
    let axis = shape.len() - 1;
    let (ks, xst) = wgsl::kept(shape, x.layout.strides(), &[axis]);
    let (_, ost) = wgsl::kept(shape, out.layout.strides(), &[axis]);
    let rows: usize = ks.iter().product();
    let bias_stride = if layer {
        spec.inputs[2].layout.strides()[0]
    } else {
        0
    };
    let mut cfg = vec![
        rows as u32,
        shape[axis] as u32,
        x.layout.strides()[axis] as u32,
        out.layout.strides()[axis] as u32,
        0,
        0,
        wgsl::f(eps),
        w.layout.strides()[0] as u32,
        bias_stride as u32,
    ];
    cfg[4] = wgsl::push_view(&mut cfg, &ks, &xst);
    cfg[5] = wgsl::push_view(&mut cfg, &ks, &ost);
    let mut binds = vec![Bind::read("x", x.dtype), Bind::read("w", w.dtype)];
    if layer {
        binds.push(Bind::read("b", spec.inputs[2].dtype));
    }
    binds.push(Bind::write("out", out.dtype));
    let body = format!("{HEAD}{}", if layer { LAYER } else { RMS });
    // Sweeps of the row: the statistics (one for rms_norm, two for layer_norm), then the
    // write; by one lane or several (see `row_lanes`).
    let sweeps = if layer { 3 } else { 2 };
    let len = shape[axis] as u64;
    let lanes = super::row_lanes(spec, rows, len, sweeps)?;
    let dialect = wgsl::Dialect::of(spec);
    let prelude = wgsl::prelude(&binds, dialect);
    let (source, grid) = rowwise::row_kernel(&prelude, &body, lanes, rows, dialect);
    let quads =
        super::on_host_cores(spec) && spec.inputs.iter().chain(spec.outputs).all(wgsl::quad_rows);
    let (aligned, textured) = match (quads, wgsl::prelude_quads(&binds)) {
        (true, Some(prelude)) => {
            let body = format!("{HEAD}{}", if layer { LAYER_QUADS } else { RMS_QUADS });
            let aligned = vec![rowwise::row_kernel(&prelude, &body, lanes, rows, dialect)];
            let textured = textured_rows(spec, &binds, &prelude, &body, (rows, lanes), shape[axis]);
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

/// The quad variant that reads the rows, the weight and the bias (one row each)
/// through textures (see [`super::op::TexRead`]), when the rows can be ([`row_texture`]);
/// `body` is the quad variant's, `lanes` its lanes per row.
fn textured_rows(
    spec: &PlanSpec<'_>,
    binds: &[Bind],
    prelude: &str,
    body: &str,
    (rows, lanes): (usize, u32),
    d: usize,
) -> Option<TexRead> {
    let kernel = |decls: &str, body: &str| {
        let prelude = format!("{prelude}{decls}");
        vec![rowwise::row_kernel(
            &prelude,
            body,
            lanes,
            rows,
            wgsl::Dialect::of(spec),
        )]
    };
    let (mut inputs, mut decls, read) = row_texture(&spec.inputs[0], binds, (rows, d))?;
    let mut body = body.replace("ld4_x(xb + j)", read);
    // The weight and the bias (one row each) through textures too where the rows have a
    // texture row each; rows wider than a texture may be leave them on their buffers.
    let per_row = read == "tx_x(row, j)";
    for (k, t) in spec.inputs.iter().enumerate().skip(1).filter(|_| per_row) {
        let name = binds[k].name;
        let binding = texture_binding(binds.len(), inputs.len());
        if let Some((input, decl)) = texture_rows(t, k, name, binding, (1, d)) {
            body = body.replace(&format!("ld4_{name}(j)"), &format!("tx_{name}(0u, j)"));
            decls += &decl;
            inputs.push(input);
        }
    }
    Some(TexRead {
        passes: kernel(&decls, &body),
        inputs,
    })
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    for op in ["rms_norm", "layer_norm"] {
        reg_all(reg, op, FLOATS, prepare);
    }
}
