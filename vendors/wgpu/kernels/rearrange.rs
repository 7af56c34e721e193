//! Copies between layouts in WGSL, for every dtype (raw bits through `ldr_`/`str_`):
//! `rearrange` (any view into any view) and `concat` (one pass per input, each writing its
//! slice of the contiguous output).
//!
//! rearrange constants: `cfg[0]` the element count, `cfg[1]` / `cfg[2]` where the source's and
//! the destination's views start. concat: `cfg[0]` the output's axis extent, `cfg[1]` the
//! inner size (elements after the axis), then per input `k` at `2 + 4k`: its element count,
//! its axis extent, its start along the axis, where its view starts.

use std::sync::Arc;

use super::elementwise::groups_for;
use super::op::{prepare as prepare_op, OpSource, TexRead, MAX_TENSORS};
use super::rowwise::{self, MAIN_ROWS};
use super::shapes::{self, Numbers};
use super::textures::{textures_for, TexturedRead};
use super::wgsl::{self, Bind, ViewCode, LINEAR_ID, MAIN_1D};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::ops::{Params, PlanSpec, PreparedKernel};
use crate::tensor::DType;

fn rearrange(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    prepare_op(
        spec,
        shapes::twin(spec, |numbers| Ok(rearrange_source(spec, numbers)))?,
    )
}

/// The copy from the plan's input view into its output view, the views' shapes held as
/// `numbers` says on the host's cores.
fn rearrange_source(spec: &PlanSpec<'_>, numbers: Numbers) -> OpSource {
    let (src, dst) = (&spec.inputs[0], &spec.outputs[0]);
    let n = dst.layout.numel();
    let mut cfg = vec![n as u32, 0, 0];
    cfg[1] = wgsl::push_view(&mut cfg, src.layout.shape(), src.layout.strides());
    cfg[2] = wgsl::push_view(&mut cfg, dst.layout.shape(), dst.layout.strides());
    let binds = [Bind::read("src", src.dtype), Bind::write("dst", dst.dtype)];
    let host = super::on_host_cores(spec);
    if dst.layout.is_contiguous() {
        if let Some(t) = Transpose::of(src.layout.shape(), src.layout.strides()) {
            return if host {
                t.per_invocation(&binds, spec, cfg, numbers)
            } else {
                t.per_workgroup(&binds, spec, cfg)
            };
        }
    }
    let mut views = String::new();
    let mut index = |name: &str, d: &crate::ops::TensorDesc, at: u32| {
        if d.layout.is_contiguous() {
            "i".to_string()
        } else {
            let (shape, strides) = (d.layout.shape(), d.layout.strides());
            wgsl::view_index(
                &mut views,
                name,
                "i",
                (&cfg, at),
                shape,
                strides,
                ViewCode::of(host, numbers),
            )
        }
    };
    let (di, si) = (index("view_dst", dst, 2), index("view_src", src, 1));
    let source = format!(
        "{}\n{views}{MAIN_1D} {{\n    let i = {LINEAR_ID};\n    if (i >= cfg[0]) {{ return; }}\n    \
         str_dst({di}, ldr_src({si}));\n}}\n",
        wgsl::prelude(&binds, wgsl::Dialect::of(spec)),
    );
    one_pass(source, groups_for(n as u64), cfg)
}

/// A copy of a transposed view into a contiguous tensor: the source, without its size-1
/// dimensions, is `[batch?, rows, cols]` with unit stride along the rows and not along the
/// columns (a transpose of the last two dimensions, heads swapped with a sequence, …). Element
/// by element, the reads of neighbouring invocations lie a column stride apart; both forms
/// below tile the copy so that reads and writes each run along memory.
///
/// - On the host's cores ([`Transpose::per_invocation`]): each SIMD batch of lavapipe or
///   llvmpipe touched a different cache line and page per lane (0.4–0.7 GB/s on a 16 MiB f32
///   transpose). Each invocation copies a tile of [`TILE_ROWS`] × [`TILE_COLS`] elements,
///   reading [`TILE_ROWS`]-element runs along the source's rows and writing whole cache lines
///   of each destination row, consecutive invocations taking consecutive row tiles: 2.6–3.7×
///   the element-wise kernel there (docs/BENCHMARKS.md). The tile was chosen by measuring 16
///   of them, columns × rows from 4 × 4 to 128 × 2. An f32 source that is one dense block
///   reads through a texture instead ([`Transpose::through_texture`]: 2–2.6× again on
///   lavapipe for a 16 MiB transpose).
/// - On a GPU ([`Transpose::per_workgroup`]): the classic workgroup-memory transpose. A
///   workgroup reads a 32 × 32 tile with consecutive invocations on consecutive source
///   elements (coalesced), and after a barrier writes it with consecutive invocations on
///   consecutive destination elements; the tile's rows are padded to 33 elements so that the
///   column-wise reads from workgroup memory spread over the banks (elements are raw bits,
///   two words, for any dtype). Its speed is unmeasured here (no GPU); conformance checks it
///   on the Mesa adapters with `UNIRT_WGPU_GPU_FORMS=1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Transpose {
    batch: usize,
    rows: usize,
    cols: usize,
    /// The source's strides along the batch and the columns (its row stride is 1).
    batch_stride: usize,
    col_stride: usize,
}

/// Destination rows per tile (a source run of unit stride).
const TILE_ROWS: usize = 4;
/// Destination columns per tile: 32 f32 elements are two 64-byte cache lines.
const TILE_COLS: usize = 32;

impl Transpose {
    fn of(shape: &[usize], strides: &[usize]) -> Option<Self> {
        let dims: Vec<(usize, usize)> = shape
            .iter()
            .zip(strides)
            .filter(|(&n, _)| n != 1)
            .map(|(&n, &s)| (n, s))
            .collect();
        let ((batch, batch_stride), (rows, row_stride), (cols, col_stride)) = match dims[..] {
            [r, c] => ((1, 0), r, c),
            [b, r, c] => (b, r, c),
            _ => return None,
        };
        (row_stride == 1 && col_stride != 1).then_some(Transpose {
            batch,
            rows,
            cols,
            batch_stride,
            col_stride,
        })
    }

    /// Tiles of [`TILE_ROWS`] × [`TILE_COLS`] per invocation (the host's cores).
    /// The transpose's extents and strides are held as `numbers` says.
    fn per_invocation(
        self,
        binds: &[Bind],
        spec: &PlanSpec<'_>,
        mut cfg: Vec<u32>,
        numbers: Numbers,
    ) -> OpSource {
        let Transpose {
            batch,
            rows,
            cols,
            batch_stride,
            col_stride,
        } = self;
        let (row_tiles, col_tiles) = (rows.div_ceil(TILE_ROWS), cols.div_ceil(TILE_COLS));
        let tiles_n = batch * row_tiles * col_tiles;
        let mut num = |v: usize| numbers.num(&mut cfg, v);
        let (tiles, per_batch, row_tiles_c) =
            (num(tiles_n), num(row_tiles * col_tiles), num(row_tiles));
        let (batch_stride, plane, cols_c, rows_c, col_stride) = (
            num(batch_stride),
            num(rows * cols),
            num(cols),
            num(rows),
            num(col_stride),
        );
        let source = format!(
            "{prelude}\n{MAIN_1D} {{\n    let i = {LINEAR_ID};\n    if (i >= {tiles}) {{ return; }}\n    \
             let t = i % {per_batch};\n    let b = i / {per_batch};\n    \
             let r0 = (t % {row_tiles_c}) * {TILE_ROWS}u;\n    let c0 = (t / {row_tiles_c}) * {TILE_COLS}u;\n    \
             let src_b = b * {batch_stride};\n    let dst_b = b * {plane};\n    \
             for (var a = 0u; a < {TILE_COLS}u; a++) {{\n        let c = c0 + a;\n        \
             if (c >= {cols_c}) {{ break; }}\n        \
             for (var k = 0u; k < {TILE_ROWS}u; k++) {{\n            let r = r0 + k;\n            \
             if (r >= {rows_c}) {{ break; }}\n            \
             str_dst(dst_b + r * {cols_c} + c, ldr_src(src_b + r + c * {col_stride}));\n        }}\n    }}\n}}\n",
            prelude = wgsl::prelude(binds, wgsl::Dialect::of(spec)),
        );
        let textured = self.through_texture(binds, spec, &mut cfg, numbers);
        let mut src = one_pass(source, groups_for(tiles_n as u64), cfg);
        src.textured = textured;
        src
    }

    /// The host form's variant for an f32 source that is one dense block (`[batch][cols][rows]`
    /// in memory, rows and columns multiples of four): the source is copied into a texture
    /// (`TexRead`), where a texel holds four consecutive rows of one column, and each
    /// invocation's tile of 4 rows × [`TILE_COLS`] columns reads a texel per column and stores
    /// four rows of the destination, a 4 × 4 block transposed in registers at a time. On
    /// lavapipe a storage load is a per-lane scalar loop, a texel load a gather (see
    /// `TexRead`); the copy moves the bits unchanged (f32 values are only bitcast, never
    /// computed with), so the result is the element-wise kernel's, bitwise.
    fn through_texture(
        self,
        binds: &[Bind],
        spec: &PlanSpec<'_>,
        cfg: &mut Vec<u32>,
        numbers: Numbers,
    ) -> Option<TexRead> {
        let (batch, rows, cols) = (self.batch, self.rows, self.cols);
        let plane = rows * cols;
        let n = batch * plane;
        let dense = self.col_stride == rows && (batch == 1 || self.batch_stride == plane);
        if spec.inputs[0].dtype != DType::F32
            || !dense
            || !rows.is_multiple_of(4)
            || !cols.is_multiple_of(4)
        {
            return None;
        }
        let flat = textures_for(binds, &[Some(TexturedRead::whole(n))], n, 0)?;
        let row_tiles = rows / 4;
        let col_tiles = cols.div_ceil(TILE_COLS);
        let tiles_n = batch * row_tiles * col_tiles;
        let mut num = |v: usize| numbers.num(cfg, v);
        let (tiles, per_batch, row_tiles_c) =
            (num(tiles_n), num(row_tiles * col_tiles), num(row_tiles));
        let (plane, cols, rows) = (num(plane), num(cols), num(rows));
        let mut body = String::new();
        for j in 0..4 {
            body += &format!("        let t{j} = tex4_src(src_c + {j}u * {rows});\n");
        }
        for k in 0..4 {
            body += &format!("        let o{k} = dst_b + (r0 + {k}u) * {cols} + c;\n");
            for j in 0..4 {
                body += &format!(
                    "        str_dst(o{k} + {j}u, vec2<u32>(bitcast<u32>(t{j}[{k}]), 0u));\n"
                );
            }
        }
        let source = format!(
            "{prelude}{decls}\n{MAIN_1D} {{\n    let i = {LINEAR_ID};\n    if (i >= {tiles}) {{ return; }}\n    \
             let t = i % {per_batch};\n    let b = i / {per_batch};\n    \
             let r0 = (t % {row_tiles_c}) * 4u;\n    let c0 = (t / {row_tiles_c}) * {TILE_COLS}u;\n    \
             let dst_b = b * {plane};\n    \
             for (var a = 0u; a < {TILE_COLS}u; a = a + 4u) {{\n        let c = c0 + a;\n        \
             if (c >= {cols}) {{ break; }}\n        \
             let src_c = dst_b + c * {rows} + r0;\n{body}    }}\n}}\n",
            prelude = wgsl::prelude(binds, wgsl::Dialect::of(spec)),
            decls = flat.decls,
        );
        Some(TexRead {
            inputs: flat.inputs,
            passes: vec![(source, groups_for(tiles_n as u64))],
        })
    }

    /// 32 × 32 tiles per workgroup through workgroup memory (a GPU). The sizes and strides
    /// ride in the plan's constants, not in the code, so one pipeline per dtype serves every
    /// shape (a GPU compiles a pipeline in milliseconds; the host form, which bakes them in for
    /// its compiler, pays that per shape).
    fn per_workgroup(self, binds: &[Bind], spec: &PlanSpec<'_>, mut cfg: Vec<u32>) -> OpSource {
        let (row_tiles, col_tiles) = (self.rows.div_ceil(32), self.cols.div_ceil(32));
        let tiles = self.batch * row_tiles * col_tiles;
        let at = cfg.len();
        cfg.extend(
            [
                tiles,
                row_tiles * col_tiles,
                row_tiles,
                self.rows,
                self.cols,
                self.batch_stride,
                self.col_stride,
                self.rows * self.cols,
            ]
            .map(|v| v as u32),
        );
        let c = |k: usize| format!("cfg[{}u]", at + k);
        let (tiles_c, per_batch, row_tiles_c, rows_c, cols_c, bstride, cstride, plane) =
            (c(0), c(1), c(2), c(3), c(4), c(5), c(6), c(7));
        let source = format!(
            "{prelude}\nvar<workgroup> tile: array<vec2<u32>, 1056>;\n{MAIN_ROWS} {{\n    \
             let g = wid.x + wid.y * nwg.x;\n    if (g >= {tiles_c}) {{ return; }}\n    \
             let t = g % {per_batch};\n    let b = g / {per_batch};\n    \
             let r0 = (t % {row_tiles_c}) * 32u;\n    let c0 = (t / {row_tiles_c}) * 32u;\n    \
             let rows = {rows_c};\n    let cols = {cols_c};\n    \
             let lane = lid % 32u;\n    let step = lid / 32u;\n    \
             // Read: consecutive invocations on consecutive rows (the source's unit stride).\n    \
             for (var k = 0u; k < 32u; k = k + 8u) {{\n        \
             let r = r0 + lane;\n        let c = c0 + step + k;\n        \
             if (r < rows && c < cols) {{ tile[(step + k) * 33u + lane] = \
             ldr_src(b * {bstride} + r + c * {cstride}); }}\n    }}\n    \
             workgroupBarrier();\n    \
             // Write: consecutive invocations on consecutive columns (the destination's).\n    \
             for (var k = 0u; k < 32u; k = k + 8u) {{\n        \
             let r = r0 + step + k;\n        let c = c0 + lane;\n        \
             if (r < rows && c < cols) {{ str_dst(b * {plane} + r * cols + c, \
             tile[lane * 33u + step + k]); }}\n    }}\n}}\n",
            prelude = wgsl::prelude(binds, wgsl::Dialect::of(spec)),
        );
        one_pass(source, rowwise::rows_grid(tiles), cfg)
    }
}

/// A rearrange of one pass without a quad variant.
fn one_pass(source: String, groups: [u32; 3], cfg: Vec<u32>) -> OpSource {
    OpSource::plain("rearrange", vec![(source, groups)], cfg)
}

fn concat(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let Params::Concat { axis } = *spec.params else {
        return Err(Error::Internal(format!(
            "concat: parameters {:?}",
            spec.params
        )));
    };
    if spec.inputs.len() + 1 > MAX_TENSORS {
        return Err(Error::unsupported(
            format!(
                "concat of {} tensors on wgpu (at most {} per kernel)",
                spec.inputs.len(),
                MAX_TENSORS - 1
            ),
            DeviceKind::Wgpu,
        ));
    }
    prepare_op(
        spec,
        shapes::twin(spec, |numbers| Ok(concat_source(spec, axis, numbers)))?,
    )
}

/// One pass per non-empty input, writing its slice of the output; strided inputs' shapes held
/// as `numbers` says on the host's cores.
fn concat_source(spec: &PlanSpec<'_>, axis: usize, numbers: Numbers) -> OpSource {
    let out = &spec.outputs[0];
    let shape = out.layout.shape();
    let inner: usize = shape[axis + 1..].iter().product();
    let mut cfg = vec![shape[axis] as u32, inner as u32];
    cfg.extend(std::iter::repeat_n(0, 4 * spec.inputs.len()));
    let names: Vec<&'static str> = ["x0", "x1", "x2", "x3", "x4", "x5", "x6"]
        .into_iter()
        .take(spec.inputs.len())
        .collect();
    let mut binds: Vec<Bind> = spec
        .inputs
        .iter()
        .zip(&names)
        .map(|(d, n)| Bind::read(n, d.dtype))
        .collect();
    binds.push(Bind::write("out", out.dtype));
    let prelude = wgsl::prelude(&binds, wgsl::Dialect::of(spec));
    let host = super::on_host_cores(spec);
    let mut passes = Vec::new();
    let mut start = 0;
    for (k, d) in spec.inputs.iter().enumerate() {
        let at = 2 + 4 * k;
        let numel = d.layout.numel();
        cfg[at] = numel as u32;
        cfg[at + 1] = d.layout.shape()[axis] as u32;
        cfg[at + 2] = start as u32;
        cfg[at + 3] = wgsl::push_view(&mut cfg, d.layout.shape(), d.layout.strides());
        start += d.layout.shape()[axis];
        if numel == 0 {
            continue;
        }
        let mut views = String::new();
        let idx = if d.layout.is_contiguous() {
            "i".to_string()
        } else {
            let (shape, strides) = (d.layout.shape(), d.layout.strides());
            let slot = (at + 3) as u32;
            let code = ViewCode::of(host, numbers);
            wgsl::view_index(
                &mut views,
                "view_in",
                "i",
                (&cfg, slot),
                shape,
                strides,
                code,
            )
        };
        let source = format!(
            "{prelude}\n{views}{MAIN_1D} {{\n    let i = {LINEAR_ID};\n    if (i >= cfg[{at}u]) {{ return; }}\n    \
             let inner = cfg[1u];\n    let ak = cfg[{a1}u];\n    \
             let outer = i / (ak * inner);\n    let a = (i / inner) % ak;\n    let r = i % inner;\n    \
             let o = (outer * cfg[0u] + cfg[{a2}u] + a) * inner + r;\n    \
             str_out(o, ldr_{name}({idx}));\n}}\n",
            a1 = at + 1,
            a2 = at + 2,
            name = names[k],
        );
        passes.push((source, groups_for(numel as u64)));
    }
    OpSource::plain("concat", passes, cfg)
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    super::reg_all(reg, "rearrange", &DType::ALL, rearrange);
    super::reg_all(reg, "concat", &DType::ALL, concat);
}
