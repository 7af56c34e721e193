//! `C = alpha·A·B + beta·C` (batched, broadcast batch dimensions, any strides) in WGSL: a
//! tiled GEMM. Each 16×16 workgroup computes a 64×64 tile of C, each invocation a 4×4 block
//! held in registers; A and B stream through workgroup memory 16 columns / rows at a time,
//! read in place through their strides. The batch index is the grid's second dimension.
//!
//! Constants: `cfg[0..3]` m, n, k; `cfg[3]` tiles along n; `cfg[4..10]` the row and column
//! strides of A, B and C; `cfg[10]` / `cfg[11]` alpha and beta (f32 bits); `cfg[12..15]` where
//! the batch views of A, B and C start.

use std::sync::Arc;

use super::op::{prepare as prepare_op, OpSource};
use super::wgsl::{self, Bind};
use super::{reg_all, FLOATS};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::ops::{Params, PlanSpec, PreparedKernel};

const TILE: usize = 64;

const KERNEL: &str = "
var<workgroup> As: array<f32, 1024>;
var<workgroup> Bs: array<f32, 1024>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let m = cfg[0];
    let n = cfg[1];
    let k = cfg[2];
    let row0 = (wid.x / cfg[3]) * 64u;
    let col0 = (wid.x % cfg[3]) * 64u;
    let ab = view_off(wid.y, cfg[12]);
    let bb = view_off(wid.y, cfg[13]);
    let cb = view_off(wid.y, cfg[14]);
    let ars = cfg[4]; let acs = cfg[5];
    let brs = cfg[6]; let bcs = cfg[7];
    var acc: array<f32, 16>;
    for (var t = 0u; t < 16u; t = t + 1u) { acc[t] = 0.0; }
    for (var k0 = 0u; k0 < k; k0 = k0 + 16u) {
        for (var t = 0u; t < 4u; t = t + 1u) {
            let e = lid + t * 256u;
            // A: 64 rows × 16 columns, stored column-major; B: 16 rows × 64 columns.
            let ar = e / 16u; let ac = e % 16u;
            let gr = row0 + ar; let gk = k0 + ac;
            var av = 0.0;
            if (gr < m && gk < k) { av = ld_a(ab + gr * ars + gk * acs); }
            As[ac * 64u + ar] = av;
            let br = e / 64u; let bc = e % 64u;
            let gk2 = k0 + br; let gc = col0 + bc;
            var bv = 0.0;
            if (gk2 < k && gc < n) { bv = ld_b(bb + gk2 * brs + gc * bcs); }
            Bs[br * 64u + bc] = bv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk = kk + 1u) {
            let a = vec4<f32>(As[kk * 64u + l.y], As[kk * 64u + l.y + 16u], As[kk * 64u + l.y + 32u], As[kk * 64u + l.y + 48u]);
            let b = vec4<f32>(Bs[kk * 64u + l.x], Bs[kk * 64u + l.x + 16u], Bs[kk * 64u + l.x + 32u], Bs[kk * 64u + l.x + 48u]);
            for (var i = 0u; i < 4u; i = i + 1u) {
                acc[i * 4u] = acc[i * 4u] + a[i] * b.x;
                acc[i * 4u + 1u] = acc[i * 4u + 1u] + a[i] * b.y;
                acc[i * 4u + 2u] = acc[i * 4u + 2u] + a[i] * b.z;
                acc[i * 4u + 3u] = acc[i * 4u + 3u] + a[i] * b.w;
            }
        }
        workgroupBarrier();
    }
    let alpha = cfg_f(10u);
    let beta = cfg_f(11u);
    for (var i = 0u; i < 4u; i = i + 1u) {
        let r = row0 + l.y + i * 16u;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let c = col0 + l.x + j * 16u;
            if (r < m && c < n) {
                let o = cb + r * cfg[8] + c * cfg[9];
                var v = alpha * acc[i * 4u + j];
                if (beta != 0.0) { v = v + beta * ld_c(o); }
                st_c(o, v);
            }
        }
    }
}
";

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let Params::Matmul { alpha, beta } = *spec.params else {
        return Err(Error::Internal(format!(
            "matmul: parameters {:?}",
            spec.params
        )));
    };
    let (a, b, c) = (&spec.inputs[0], &spec.inputs[1], &spec.outputs[0]);
    let cs = c.layout.shape();
    let nd = cs.len();
    let (m, n) = (cs[nd - 2], cs[nd - 1]);
    let k = a.shape()[a.shape().len() - 1];
    let batch_shape = &cs[..nd - 2];
    let batch: usize = batch_shape.iter().product();
    let tiles_n = n.div_ceil(TILE).max(1);
    let tiles = m.div_ceil(TILE).max(1) * tiles_n;
    if tiles > 65535 || batch > 65535 {
        return Err(Error::unsupported(
            format!("matmul on wgpu with {tiles} tiles of 64×64 and {batch} batches (at most 65535 each)"),
            DeviceKind::Wgpu,
        ));
    }
    let rc = |d: &crate::ops::TensorDesc| {
        let (s, st) = (d.layout.shape(), d.layout.strides());
        let r = s.len();
        (st[r - 2] as u32, st[r - 1] as u32)
    };
    let ((ars, acs), (brs, bcs), (crs, ccs)) = (rc(a), rc(b), rc(c));
    let mut cfg = vec![
        m as u32,
        n as u32,
        k as u32,
        tiles_n as u32,
        ars,
        acs,
        brs,
        bcs,
        crs,
        ccs,
        wgsl::f(alpha),
        wgsl::f(beta),
        0,
        0,
        0,
    ];
    for (slot, d) in [(12, a), (13, b), (14, c)] {
        let r = d.layout.ndim();
        let s = wgsl::broadcast_strides(
            &d.layout.shape()[..r - 2],
            &d.layout.strides()[..r - 2],
            batch_shape,
        );
        cfg[slot] = wgsl::push_view(&mut cfg, batch_shape, &s);
    }
    let binds = [
        Bind::read("a", a.dtype),
        Bind::read("b", b.dtype),
        Bind::write("c", c.dtype),
    ];
    let source = format!("{}{KERNEL}", wgsl::prelude(&binds));
    prepare_op(
        spec,
        OpSource {
            name: "matmul".into(),
            passes: vec![(source, [tiles as u32, batch.max(1) as u32, 1])],
            cfg,
            entry: None,
        },
    )
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    reg_all(reg, "matmul", FLOATS, prepare);
}
