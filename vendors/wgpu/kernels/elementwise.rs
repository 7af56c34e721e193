//! Elementwise operators in WGSL: binary (tensor–tensor and tensor–scalar), unary, swiglu,
//! where and masked_fill, from one template: one work item per output element; each input is
//! read in place through its broadcast strides (or directly by the element index when it is
//! contiguous in the output's shape, which the generated source then says).
//!
//! Constants: `cfg[0]` the element count, `cfg[1]` the scalar (f32 bits), `cfg[2 + k]` where
//! input `k`'s view (rank, output shape, broadcast strides) starts.

use std::sync::Arc;

use super::op::{prepare as prepare_op, OpSource, TexRead};
use super::shapes::{self, Numbers};
use super::textures::{textures_for, TexturedRead};
use super::wgsl::{self, Bind, ViewCode, LINEAR_ID, MAIN_1D};
use super::{reg_all, FLOATS};
use crate::error::{Error, Result};
use crate::ops::{BinaryOp, Params, PlanSpec, PreparedKernel, TensorDesc, UnaryOp};

/// Functions WGSL lacks, shared by the unary expressions.
pub(super) const MATH: &str = "
fn unirt_tanh(x: f32) -> f32 {
    // tanh through exp of a non-positive argument: no overflow for large |x|.
    let e = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - e) / (1.0 + e);
}
// maximum / minimum give NaN for a NaN operand (WGSL leaves max and min of NaN
// undefined); NaN is tested by its bits, since lavapipe assumes floats are never NaN.
fn unirt_max(a: f32, b: f32) -> f32 { return select(max(a, b), a + b, is_nan(a) || is_nan(b)); }
fn unirt_min(a: f32, b: f32) -> f32 { return select(min(a, b), a + b, is_nan(a) || is_nan(b)); }
// C's pow, where WGSL's is exp2(y·log2 x), undefined for x < 0 and for 0 to a power ≤ 0:
// x^0 = 1 and 1^y = 1 even for NaN, NaN otherwise propagates, (−1)^±∞ = 1, a negative base
// to an integer power is real (negative for an odd power) and to any other power NaN.
fn unirt_pow(x: f32, y: f32) -> f32 {
    if (y == 0.0 || x == 1.0) { return 1.0; }
    if (is_nan(x) || is_nan(y)) { return x + y; }
    let inf = bitcast<f32>(0x7f800000u);
    let ax = abs(x);
    if (ax == 1.0 && abs(y) == inf) { return 1.0; }
    var r = select(pow(ax, y), select(0.0, inf, y < 0.0), ax == 0.0);
    if ((bitcast<u32>(x) >> 31u) == 1u) {
        if (floor(y) != y) { return bitcast<f32>(0x7fc00000u); }
        // Odd: an integer below 2^24 (every larger f32 is even) with remainder 1 by 2.
        if (abs(y) < 16777216.0 && y - 2.0 * floor(0.5 * y) == 1.0) { r = -r; }
    }
    return r;
}
fn unirt_erf(x: f32) -> f32 {
    // Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7).
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * exp(-x * x);
    return sign(x) * y;
}
";

fn binary_expr(op: BinaryOp, b: &str) -> String {
    match op {
        BinaryOp::Add => format!("x0 + {b}"),
        BinaryOp::Sub => format!("x0 - {b}"),
        BinaryOp::Mul => format!("x0 * {b}"),
        BinaryOp::Div => format!("x0 / {b}"),
        BinaryOp::Maximum => format!("unirt_max(x0, {b})"),
        BinaryOp::Minimum => format!("unirt_min(x0, {b})"),
        BinaryOp::Pow => format!("unirt_pow(x0, {b})"),
    }
}

fn unary_expr(op: UnaryOp) -> &'static str {
    match op {
        UnaryOp::Neg => "-x0",
        UnaryOp::Abs => "abs(x0)",
        UnaryOp::Exp => "exp(x0)",
        UnaryOp::Log => "log(x0)",
        UnaryOp::Sqrt => "sqrt(x0)",
        UnaryOp::Rsqrt => "inverseSqrt(x0)",
        UnaryOp::Sin => "sin(x0)",
        UnaryOp::Cos => "cos(x0)",
        UnaryOp::Tanh => "unirt_tanh(x0)",
        UnaryOp::Sigmoid => "1.0 / (1.0 + exp(-x0))",
        UnaryOp::Relu => "select(max(x0, 0.0), x0, is_nan(x0))",
        UnaryOp::Gelu => "0.5 * x0 * (1.0 + unirt_erf(x0 * 0.70710678118654752))",
        UnaryOp::GeluTanh => {
            "0.5 * x0 * (1.0 + unirt_tanh(0.79788456080286536 * (x0 + 0.044715 * x0 * x0 * x0)))"
        }
        UnaryOp::Silu => "x0 / (1.0 + exp(-x0))",
    }
}

/// The output expression of `op` over inputs `x0…` and the scalar `s`.
pub(super) fn expr(op: &str) -> Option<String> {
    if let Some(b) = BinaryOp::ALL.into_iter().find(|b| b.name() == op) {
        return Some(binary_expr(b, "x1"));
    }
    if let Some(b) = BinaryOp::ALL.into_iter().find(|b| b.scalar_name() == op) {
        return Some(binary_expr(b, "s"));
    }
    if let Some(u) = UnaryOp::ALL.into_iter().find(|u| u.name() == op) {
        return Some(unary_expr(u).into());
    }
    match op {
        "swiglu" => Some("x0 * x1 / (1.0 + exp(-x1))".into()),
        "where" => Some("select(x2, x1, x0 != 0.0)".into()),
        "masked_fill" => Some("select(x0, s, x1 != 0.0)".into()),
        _ => None,
    }
}

const NAMES: [&str; 3] = ["in0", "in1", "in2"];

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let body = expr(spec.op)
        .ok_or_else(|| Error::Internal(format!("wgpu elementwise: no operator {}", spec.op)))?;
    let out = spec
        .outputs
        .first()
        .ok_or_else(|| Error::Internal(format!("{}: no output", spec.op)))?;
    if spec.inputs.len() > NAMES.len() {
        return Err(Error::Internal(format!("{}: too many inputs", spec.op)));
    }
    let src = shapes::twin(spec, |numbers| Ok(source(spec, &body, out, numbers)))?;
    prepare_op(spec, src)
}

/// The kernel computing `body` into `out`, with its quad and texture variants; strided and
/// broadcast inputs' shapes held as `numbers` says on the host's cores.
fn source(spec: &PlanSpec<'_>, body: &str, out: &TensorDesc, numbers: Numbers) -> OpSource {
    let shape = out.layout.shape();
    let n = out.layout.numel();
    let scalar = match spec.params {
        Params::Scalar(s) => *s,
        _ => 0.0,
    };
    let mut cfg = vec![n as u32, wgsl::f(scalar)];
    cfg.extend(std::iter::repeat_n(0, spec.inputs.len()));
    let mut binds = Vec::new();
    let mut loads = String::new();
    let mut views = String::new();
    let host = super::on_host_cores(spec);
    // Each input's quad load, while every input has one (see `QuadRead`).
    let mut quad_reads: Option<Vec<QuadRead>> = n.is_multiple_of(4).then(Vec::new);
    for (k, d) in spec.inputs.iter().enumerate() {
        binds.push(Bind::read(NAMES[k], d.dtype));
        let direct = d.layout.is_contiguous() && d.layout.shape() == shape;
        let strides = wgsl::broadcast_strides(d.layout.shape(), d.layout.strides(), shape);
        cfg[2 + k] = wgsl::push_view(&mut cfg, shape, &strides);
        let quad = if direct {
            Some(QuadRead::Direct)
        } else {
            QuadRead::of(shape, &strides)
        };
        quad_reads = quad_reads.zip(quad).map(|(mut v, q)| {
            v.push(q);
            v
        });
        let index = if direct {
            "i".to_string()
        } else {
            let name = format!("view_{}", NAMES[k]);
            let code = ViewCode::of(host, numbers);
            let at = (&cfg[..], 2 + k as u32);
            wgsl::view_index(&mut views, &name, "i", at, shape, &strides, code)
        };
        loads += &format!("    let x{k} = ld_{}({index});\n", NAMES[k]);
    }
    binds.push(Bind::write("out", out.dtype));
    let source = format!(
        "{prelude}{MATH}\n{views}{MAIN_1D} {{\n    let i = {LINEAR_ID};\n    if (i >= cfg[0]) {{ return; }}\n    \
         let s = cfg_f(1u);\n{loads}    st_out(i, {body});\n}}\n",
        prelude = wgsl::prelude(&binds, wgsl::Dialect::of(spec)),
    );
    let groups = groups_for(n as u64);
    let mut textured = None;
    let aligned = quad_reads.and_then(|reads| {
        let mut helpers = String::new();
        let loads: Vec<String> = reads
            .iter()
            .enumerate()
            .map(|(k, r)| r.load(k, NAMES[k], numbers, &mut cfg, &mut helpers))
            .collect();
        if host {
            // Whole inputs through textures, and rows broadcast along the leading dimensions
            // (a bias) too, from a texture of the row alone, reusable as a weight's.
            let through: Vec<Option<TexturedRead>> = reads
                .iter()
                .map(|r| match *r {
                    QuadRead::Direct => Some(TexturedRead::whole(n)),
                    QuadRead::Rows { len } => Some(TexturedRead {
                        elements: len,
                        index: numbers.rem(&mut cfg, "i", len),
                        reusable: true,
                    }),
                    QuadRead::Spread { .. } => None,
                })
                .collect();
            textured = textures_for(&binds, &through, n, 0).and_then(|t| {
                let passes = quads(
                    &binds,
                    body,
                    n,
                    &t.loads(&loads),
                    &(helpers.clone() + &t.decls),
                )?;
                Some(TexRead {
                    inputs: t.inputs,
                    passes,
                })
            });
        }
        quads(&binds, body, n, &loads, &helpers)
    });
    OpSource::variants(
        spec.op.to_string(),
        vec![(source, groups)],
        cfg,
        aligned,
        textured,
    )
}

/// How the quad variant reads one input at the output's element `i` (a multiple of four):
/// the quad at `i`, or — for the broadcasts that are a repeated or a spread contiguous block —
/// the quad at `i mod len` (a row broadcast over leading dimensions: a bias `[n]` added to
/// `[m, n]`) or one element, `i / len`, for all four lanes (a column broadcast over trailing
/// dimensions: a per-row scale `[m, 1]`), where `len` is a multiple of four so that the four
/// elements of a quad never straddle a block. Elementwise ops with such an operand then read
/// quads too; they read each element one lane at a time, a per-lane scalar load on lavapipe
/// and llvmpipe (a broadcast add ran at a quarter of a contiguous one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QuadRead {
    Direct,
    /// The contiguous block of `len` elements repeated along the leading dimensions.
    Rows {
        len: usize,
    },
    /// Each element of a contiguous tensor spread over `len` consecutive outputs.
    Spread {
        len: usize,
    },
}

impl QuadRead {
    /// The form of an input with `strides` broadcast to the output's `shape`, if it has one.
    fn of(shape: &[usize], strides: &[usize]) -> Option<Self> {
        // Whether dims `range` are contiguous among themselves (size-1 dims aside).
        let contiguous = |range: std::ops::Range<usize>| {
            let mut want = 1;
            for d in range.rev() {
                if shape[d] != 1 && strides[d] != want {
                    return false;
                }
                want *= shape[d];
            }
            true
        };
        let zero = |range: std::ops::Range<usize>| {
            range.into_iter().all(|d| strides[d] == 0 || shape[d] == 1)
        };
        let nd = shape.len();
        let n: usize = shape.iter().product();
        // The input's own extent (`len` for rows, `n / len` for a spread) must be whole quads
        // too, so that its last quad lies inside its binding, as the variant's contract says.
        (0..nd).find_map(|p| {
            let len: usize = shape[p..].iter().product();
            if len == 0 || !len.is_multiple_of(4) {
                None
            } else if zero(0..p) && contiguous(p..nd) {
                Some(QuadRead::Rows { len })
            } else if zero(p..nd) && contiguous(0..p) && (n / len).is_multiple_of(4) {
                Some(QuadRead::Spread { len })
            } else {
                None
            }
        })
    }

    /// The WGSL expression of input `k`'s quad at `i`; a helper function it calls goes to
    /// `helpers`, and `len` is held as `numbers` says: written into the code on the host's
    /// cores (a division by a constant is a multiply there) until the structure has met
    /// several shapes, read from `cfg` on a GPU (one pipeline per dtype).
    fn load(
        self,
        k: usize,
        name: &str,
        numbers: Numbers,
        cfg: &mut Vec<u32>,
        helpers: &mut String,
    ) -> String {
        match self {
            QuadRead::Direct => format!("ld4_{name}(i)"),
            QuadRead::Rows { len } => format!("ld4_{name}({})", numbers.rem(cfg, "i", len)),
            QuadRead::Spread { len } => {
                let q = numbers.div(cfg, "i", len);
                helpers.push_str(&format!(
                    "fn spread_{name}(i: u32) -> vec4<f32> {{ let j = imm.o{k} + {q}; \
                     return vec4<f32>(ldq_{name}(j >> 2u)[j & 3u]); }}\n"
                ));
                format!("spread_{name}(i)")
            }
        }
    }
}

/// The quad variant (see [`super::op::OpSource::aligned`]) of an elementwise kernel of `n`
/// (a multiple of four) elements whose inputs are read by `loads` (WGSL expressions of the
/// input's quad at element `i`, calling `helpers`): one work item per four elements, each
/// written as one quad, computed element by element with the scalar kernel's expression (so
/// both variants give bitwise the same result). `None` when a tensor's dtype has no quad form.
pub(super) fn quads(
    binds: &[Bind],
    body: &str,
    n: usize,
    loads: &[String],
    helpers: &str,
) -> Option<Vec<(String, [u32; 3])>> {
    let prelude = wgsl::prelude_quads(binds)?;
    let lanes = quad_lanes_reading(binds, loads, |c| format!("r.{c} = {body};"));
    let out = binds[binds.len() - 1].name;
    let source = format!(
        "{prelude}{MATH}\n{helpers}{MAIN_1D} {{\n    let i = 4u * ({LINEAR_ID});\n    if (i >= cfg[0]) {{ return; }}\n    \
         let s = cfg_f(1u);\n{lanes}    st4_{out}(i, r);\n}}\n"
    );
    Some(vec![(source, groups_for(n as u64 / 4))])
}

/// The lanes of a quad kernel over `binds` (inputs, then the output): each input's quad at
/// element `i` loaded as `v<k>`, then for each of the four lanes `c` a block that names the
/// lane's inputs `x<k>` and runs `stmt(c)`, which sets `r.c` of the result quad `r`.
pub(super) fn quad_lanes(binds: &[Bind], stmt: impl Fn(&str) -> String) -> String {
    let loads: Vec<String> = binds[..binds.len() - 1]
        .iter()
        .map(|b| format!("ld4_{}(i)", b.name))
        .collect();
    quad_lanes_reading(binds, &loads, stmt)
}

/// [`quad_lanes`] with each input's quad read by its expression in `loads`.
pub(super) fn quad_lanes_reading(
    binds: &[Bind],
    loads: &[String],
    stmt: impl Fn(&str) -> String,
) -> String {
    let inputs = &binds[..binds.len() - 1];
    let mut s: String = loads
        .iter()
        .enumerate()
        .map(|(k, l)| format!("    let v{k} = {l};\n"))
        .collect();
    s += "    var r: vec4<f32>;\n";
    for c in ["x", "y", "z", "w"] {
        let xs: String = (0..inputs.len())
            .map(|k| format!("let x{k} = v{k}.{c}; "))
            .collect();
        s += &format!("    {{ {xs}{} }}\n", stmt(c));
    }
    s
}

/// The 2-D grid of [`wgsl::WG`]-wide workgroups for `items` work items.
pub(crate) fn groups_for(items: u64) -> [u32; 3] {
    wgsl::grid_for(items, wgsl::WG)
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    for b in BinaryOp::ALL {
        reg_all(reg, b.name(), FLOATS, prepare);
        reg_all(reg, b.scalar_name(), FLOATS, prepare);
    }
    for u in UnaryOp::ALL {
        reg_all(reg, u.name(), FLOATS, prepare);
    }
    for op in ["swiglu", "where", "masked_fill"] {
        reg_all(reg, op, FLOATS, prepare);
    }
}
