//! Where a kernel keeps the numbers of its plan's shapes, and when a shape is written into
//! the code — "automatic dynamic shapes" for the adapters on the host's cores.
//!
//! On lavapipe and llvmpipe the host forms write extents and strides into their code
//! ([`Numbers::Literal`]): the compiler then turns each division by an extent into a multiply
//! and a shift (with run-time divisors, strided kernels ran 6–9× slower), but every new shape
//! is a new kernel, and a kernel costs 15–30 ms to compile there. A loop whose shapes change
//! every step — an eager decode step over a KV cache that grows by a key, read through
//! `narrow` views of a preallocated cache — paid that per operator per step.
//!
//! So a family that writes numbers into its code generates, on the host's cores, a twin of
//! its kernel too: the same code with those numbers read from the plan's constants
//! ([`Numbers::Uniform`]; [`twin`]). [`ShapeHistory`] remembers, per device, how many
//! distinct literal kernels each twin has stood for: the first [`LITERAL_SHAPES`] shapes of a
//! structure (`UNIRT_WGPU_LITERAL_SHAPES`) get their literal kernels (a loop of fixed shapes compiles once and runs at
//! full speed), and from the next on the structure takes its twin, compiled once for all
//! later shapes — as PyTorch's compiler marks a dimension dynamic once it has changed. Both
//! kernels compute the same values in the same order, so which one a plan took never shows
//! in its results. On a GPU the families read shapes from the constants anyway (a pipeline
//! compiles in milliseconds there) and generate one kernel.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use parking_lot::Mutex;

use super::op::OpSource;
use crate::error::Result;
use crate::ops::PlanSpec;

/// How a kernel's code holds the numbers of its plan's shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Numbers {
    /// Written into the code: divisions by them compile to multiplies; one kernel per shape.
    Literal,
    /// Read from the plan's constants through their uniform binding ([`Numbers::word`]): one
    /// kernel for every shape of the structure (the host's cores' shape-generic twins).
    Uniform,
    /// Read from the plan's constants as every kernel binds them (`cfg`, a storage buffer):
    /// the GPU forms, compiled once per structure anyway.
    Storage,
}

impl Numbers {
    /// `v` as a WGSL `u32` expression: a literal, or a `cfg` word appended to `cfg` (read
    /// as [`Numbers::word`] says).
    pub(crate) fn num(self, cfg: &mut Vec<u32>, v: usize) -> String {
        match self {
            Numbers::Literal => format!("{v}u"),
            _ => {
                cfg.push(v as u32);
                self.word(cfg.len() - 1)
            }
        }
    }

    /// Word `k` of the plan's constants, at an index written into the code. A shape-generic
    /// kernel ([`Numbers::Uniform`]) reads it through `cfgu`, the constants buffer bound a
    /// second time as a uniform buffer ([`UNIFORM_CFG_BINDING`]): lavapipe loads such a
    /// word once for all the lanes of a SIMD batch, a storage word lane by lane, which made
    /// a strided add whose extents were read from `cfg` 3.2× slower than with them in its
    /// code (4.2 against 1.3 ms, [8, 700, 64] f32; 2.4 through `cfgu`, what is left being
    /// the compiler not knowing the numbers: the same code with them written in ran 1.3).
    pub(crate) fn word(self, k: usize) -> String {
        match self {
            Numbers::Uniform => format!("cfgu[{}u].{}", k / 4, ["x", "y", "z", "w"][k % 4]),
            _ => format!("cfg[{k}u]"),
        }
    }

    /// `x / v` as WGSL (`x` a `u32` expression, `v` > 0): by a literal; in a shape-generic
    /// kernel through `v`'s [`magic`] numbers and `unirt_udiv`, a multiply-high and shifts as
    /// a compiler divides by a constant (a CPU has no vector division; with the numbers
    /// written in, a strided add through `unirt_udiv` ran at the literal kernel's speed); on
    /// a GPU by the word.
    pub(crate) fn div(self, cfg: &mut Vec<u32>, x: &str, v: usize) -> String {
        match self {
            Numbers::Literal => format!("({x} / {v}u)"),
            Numbers::Uniform => {
                let (w0, w1) = self.divisor(cfg, v);
                match v.is_power_of_two() {
                    true => format!("({x} >> {w1})"),
                    false => format!("unirt_udiv({x}, {w0}, {w1})"),
                }
            }
            Numbers::Storage => format!("({x} / {})", self.num(cfg, v)),
        }
    }

    /// `x % v` as WGSL, as [`Numbers::div`] divides (`x` is evaluated twice).
    pub(crate) fn rem(self, cfg: &mut Vec<u32>, x: &str, v: usize) -> String {
        match self {
            Numbers::Literal => format!("({x} % {v}u)"),
            Numbers::Uniform if v.is_power_of_two() => {
                let (mask, _) = self.divisor(cfg, v);
                format!("({x} & {mask})")
            }
            Numbers::Uniform => {
                let q = self.div(cfg, x, v);
                format!("({x} - {q} * {})", self.num(cfg, v))
            }
            Numbers::Storage => format!("({x} % {})", self.num(cfg, v)),
        }
    }

    /// `v`'s [`divisor_words`] appended to `cfg`, as the code reads them.
    fn divisor(self, cfg: &mut Vec<u32>, v: usize) -> (String, String) {
        let (w0, w1) = divisor_words(v as u32);
        cfg.extend([w0, w1]);
        (self.word(cfg.len() - 2), self.word(cfg.len() - 1))
    }
}

/// The binding of the constants buffer as a uniform buffer, in every operator kernel's
/// layout (after the tensors, a scratch or fault buffer and the textures, whatever their
/// number); only shape-generic kernels declare it.
pub(crate) const UNIFORM_CFG_BINDING: u32 = 31;

/// The most constants a shape-generic kernel may have (16 KiB, a quarter of WebGPU's
/// default uniform binding size): a larger plan keeps its literal kernels.
const MAX_UNIFORM_WORDS: usize = 4096;

/// The two words by which a shape-generic kernel divides by an extent `d`: for a power of
/// two, `d − 1` and log₂ d (a mask and a shift: whether an extent is a power of two is part
/// of the kernel's structure, and head dims and the like are), else its [`magic`] numbers.
pub(crate) fn divisor_words(d: u32) -> (u32, u32) {
    match d.is_power_of_two() {
        true => (d - 1, d.trailing_zeros()),
        false => magic(d),
    }
}

/// The magic numbers by which WGSL's `unirt_udiv(n, m, s)` divides any `u32` `n` by `d` > 0
/// exactly: `m` = ⌊2³²·(2ˡ − d)/d⌋ + 1 with l = ⌈log₂ d⌉, and `s` the two shifts, min(l, 1)
/// in its low half and max(l, 1) − 1 in its high half; the quotient is
/// `(t + ((n − t) >> s.lo)) >> s.hi` with `t` the high word of `m·n` (Granlund and
/// Montgomery's division by invariant integers, the round-up form).
pub(crate) fn magic(d: u32) -> (u32, u32) {
    let d = d.max(1);
    let l = 32 - (d - 1).leading_zeros();
    let m = (((1u64 << 32) * ((1u64 << l) - u64::from(d))) / u64::from(d) + 1) as u32;
    (m, l.min(1) | ((l.max(1) - 1) << 16))
}

/// Distinct shapes of one structure that get a kernel with their numbers in its code, unless
/// `UNIRT_WGPU_LITERAL_SHAPES` says how many: a program that runs a fixed set of more shapes
/// of one strided structure (and compiles once) may raise it, since a twin runs up to 2×
/// slower than a literal kernel (a strided add: 2.4 against 1.3 ms on lavapipe; a transposed
/// copy or a reduction runs alike).
const LITERAL_SHAPES: usize = 3;

/// Structures remembered per device before the history starts afresh (a program that plans
/// ever new structures must not grow it without end; forgetting only costs literal kernels).
const MAX_STRUCTURES: usize = 4096;

/// What a family generates for one plan, on the host's cores: the kernel with its shape's
/// numbers in the code and, where that differs, its twin that reads them from `cfg`
/// (`OpSource::shape_generic`); elsewhere the one kernel, generated with
/// [`Numbers::Storage`]. `build` generates the kernel for the numbers it is given.
pub(crate) fn twin(
    spec: &PlanSpec<'_>,
    build: impl Fn(Numbers) -> Result<OpSource>,
) -> Result<OpSource> {
    if !super::on_host_cores(spec) {
        return build(Numbers::Storage);
    }
    let mut literal = build(Numbers::Literal)?;
    let mut generic = build(Numbers::Uniform)?;
    let (structure, shape) = (code_hash(&generic), code_hash(&literal));
    if structure != shape && generic.cfg.len() <= MAX_UNIFORM_WORDS {
        let decl = format!(
            "@group(0) @binding({UNIFORM_CFG_BINDING}) var<uniform> cfgu: array<vec4<u32>, {}>;\n",
            generic.cfg.len().div_ceil(4).max(1)
        );
        let variants = [
            Some(&mut generic.passes),
            generic.aligned.as_mut(),
            generic.textured.as_mut().map(|t| &mut t.passes),
        ];
        for (code, _) in variants.into_iter().flatten().flatten() {
            // After the directives (`enable f16;`), which come first.
            let at = directives_end(code);
            code.insert_str(at, &decl);
        }
        literal.shape_generic = Some(Box::new(ShapeGeneric {
            source: generic,
            structure,
            shape,
        }));
    }
    Ok(literal)
}

/// A kernel's shape-generic twin ([`twin`]), with the hashes [`ShapeHistory`] keys it by:
/// the twin's code (its structure) and the literal kernel's (its shape).
pub(crate) struct ShapeGeneric {
    pub source: OpSource,
    structure: u64,
    shape: u64,
}

/// Where the leading directive lines of WGSL `code` (`enable …;`, `requires …;`,
/// `diagnostic(…);`) end.
fn directives_end(code: &str) -> usize {
    let mut at = 0;
    for line in code.split_inclusive('\n') {
        let t = line.trim_start();
        let directive = ["enable ", "requires ", "diagnostic"]
            .iter()
            .any(|d| t.starts_with(d));
        if !(directive || t.is_empty()) {
            break;
        }
        at += line.len();
    }
    at
}

/// A hash of the code of every pass and variant of `src` (not of its grids or constants,
/// which follow the shape in both forms).
fn code_hash(src: &OpSource) -> u64 {
    let mut h = DefaultHasher::new();
    src.name.hash(&mut h);
    src.entry.hash(&mut h);
    let variants = [
        Some(&src.passes),
        src.aligned.as_ref(),
        src.textured.as_ref().map(|t| &t.passes),
    ];
    for (k, passes) in variants.iter().enumerate() {
        k.hash(&mut h);
        for (code, _) in passes.iter().copied().flatten() {
            code.hash(&mut h);
        }
    }
    h.finish()
}

/// Per device: for each shape-generic kernel (by its code), the literal kernels it has stood
/// for (by theirs), up to `literal_shapes` ([`LITERAL_SHAPES`]).
pub(crate) struct ShapeHistory {
    seen: Mutex<HashMap<u64, Vec<u64>>>,
    literal_shapes: usize,
}

impl Default for ShapeHistory {
    fn default() -> Self {
        let n = std::env::var("UNIRT_WGPU_LITERAL_SHAPES").ok();
        ShapeHistory::with_limit(
            n.and_then(|n| n.trim().parse().ok())
                .unwrap_or(LITERAL_SHAPES),
        )
    }
}

impl ShapeHistory {
    /// A history that gives each structure's first `literal_shapes` shapes literal kernels.
    pub(crate) fn with_limit(literal_shapes: usize) -> Self {
        ShapeHistory {
            seen: Mutex::default(),
            literal_shapes,
        }
    }

    /// The kernel a plan compiles: `src`, or its shape-generic twin once the twin's structure
    /// has been met in `literal_shapes` other shapes.
    pub(crate) fn choose<'a>(&self, src: &'a OpSource) -> &'a OpSource {
        let Some(generic) = src.shape_generic.as_deref() else {
            return src;
        };
        let (structure, shape) = (generic.structure, generic.shape);
        let mut seen = self.seen.lock();
        if seen.len() >= MAX_STRUCTURES && !seen.contains_key(&structure) {
            seen.clear();
        }
        let shapes = seen.entry(structure).or_default();
        if shapes.contains(&shape) {
            // A shape met before: its literal kernel is likely still compiled.
            src
        } else if shapes.len() < self.literal_shapes {
            shapes.push(shape);
            src
        } else {
            &generic.source
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(code: &str, generic: Option<&str>) -> OpSource {
        let mut s = OpSource::plain("k", vec![(code.to_string(), [1, 1, 1])], vec![]);
        s.shape_generic = generic.map(|g| {
            let source = source(g, None);
            Box::new(ShapeGeneric {
                structure: code_hash(&source),
                shape: code_hash(&s),
                source,
            })
        });
        s
    }

    #[test]
    fn a_structure_takes_its_twin_after_its_literal_shapes() {
        let h = ShapeHistory::with_limit(LITERAL_SHAPES);
        let shapes: Vec<OpSource> = (0..6)
            .map(|n| source(&format!("x % {n}u"), Some("x % cfg[3u]")))
            .collect();
        let chosen: Vec<String> = shapes
            .iter()
            .chain(&shapes[..2])
            .map(|s| h.choose(s).passes[0].0.clone())
            .collect();
        assert_eq!(
            chosen,
            [
                "x % 0u",
                "x % 1u",
                "x % 2u",
                "x % cfg[3u]",
                "x % cfg[3u]",
                "x % cfg[3u]",
                // Shapes met before keep their literal kernels.
                "x % 0u",
                "x % 1u",
            ]
        );
        // A kernel without a twin is always itself.
        let plain = source("y", None);
        for _ in 0..5 {
            assert_eq!(h.choose(&plain).passes[0].0, "y");
        }
    }

    /// `unirt_udiv` as the WGSL computes it, in u32 arithmetic.
    fn udiv(n: u32, (m, s): (u32, u32)) -> u32 {
        let t = ((u64::from(n) * u64::from(m)) >> 32) as u32;
        (t + ((n - t) >> (s & 31))) >> (s >> 16)
    }

    #[test]
    fn magic_numbers_divide_exactly() {
        let mut divisors: Vec<u32> = (1..=4200).collect();
        divisors.extend([
            65_535,
            65_536,
            65_537,
            700 * 64,
            (1 << 31) - 1,
            1 << 31,
            (1 << 31) + 1,
        ]);
        divisors.extend([u32::MAX - 1, u32::MAX]);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for d in divisors {
            let magic = magic(d);
            let mut ns: Vec<u32> = vec![0, 1, d - 1, d, d.wrapping_add(1), u32::MAX, u32::MAX - 1];
            ns.extend((1..40u32).map(|k| d.wrapping_mul(k).wrapping_sub(1)));
            for _ in 0..64 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ns.push(state as u32);
            }
            for n in ns {
                assert_eq!(udiv(n, magic), n / d, "{n} / {d}");
            }
        }
    }

    #[test]
    fn numbers_are_literals_or_constants() {
        let mut cfg = vec![7];
        assert_eq!(Numbers::Literal.num(&mut cfg, 12), "12u");
        assert_eq!(cfg, [7]);
        assert_eq!(Numbers::Uniform.num(&mut cfg, 12), "cfgu[0u].y");
        assert_eq!(Numbers::Storage.num(&mut cfg, 13), "cfg[2u]");
        assert_eq!(cfg, [7, 12, 13]);
        assert_eq!(Numbers::Literal.rem(&mut cfg, "i", 5), "(i % 5u)");
        assert_eq!(Numbers::Storage.div(&mut cfg, "i", 5), "(i / cfg[3u])");
        let q = "unirt_udiv(i, cfgu[1u].x, cfgu[1u].y)";
        assert_eq!(
            Numbers::Uniform.rem(&mut cfg, "i", 5),
            format!("(i - {q} * cfgu[1u].z)")
        );
        assert_eq!(cfg[4..], [magic(5).0, magic(5).1, 5]);
        // Powers of two: a mask and a shift.
        assert_eq!(Numbers::Uniform.rem(&mut cfg, "i", 64), "(i & cfgu[1u].w)");
        assert_eq!(Numbers::Uniform.div(&mut cfg, "i", 64), "(i >> cfgu[2u].z)");
        assert_eq!(cfg[7..], [63, 6, 63, 6]);
    }
}
