//! Where a kernel keeps the numbers of its plan's shapes, and when a shape is written into
//! the code — "automatic dynamic shapes" for the adapters on the host's cores.
//!
//! On lavapipe and llvmpipe the host forms write extents and strides into their code
//! ([`Read::None`]): the compiler then turns each division by an extent into a multiply
//! and a shift (with run-time divisors, strided kernels ran 6–9× slower), but every new shape
//! is a new kernel, and a kernel costs 15–30 ms to compile there. A loop whose shapes change
//! every step — an eager decode step over a KV cache that grows by a key, read through
//! `narrow` views of a preallocated cache — paid that per operator per step.
//!
//! So a family that writes numbers into its code builds its kernel through [`twin`], once
//! per kind of [`Numbers`]: all written in (the literal kernel, which also records them, in
//! order — its [`Slots`]), all read from the plan's constants (bound a second time as a
//! uniform buffer, since lavapipe loads storage words lane by lane: this build's code names
//! the *structure*), and, once the structure has met [`LITERAL_SHAPES`] shapes
//! (`UNIRT_WGPU_LITERAL_SHAPES`), one that reads only the numbers that have changed between
//! them and keeps the rest in its code. [`ShapeHistory`] remembers per device, for each
//! structure, its literal shapes and which of its numbers changed — as PyTorch's compiler
//! marks a dimension dynamic once it has changed, per number here: over a KV cache read
//! through `narrow`, the length is read and the head dim, the strides and the other extents
//! stay literal (a strided add ran about 1.25× faster than with every number read; the
//! literal kernel's divisions by constants are what is left). A loop of fixed shapes
//! compiles once and runs literal kernels; once a number that had kept still changes (a
//! count of tiles that follows the length in steps), the structure reads them all: one
//! kernel more, at most. Every form computes the same values in the same order, so which one a plan
//! took never shows in its results. On a GPU the families read shapes from the constants
//! anyway (a pipeline compiles in milliseconds there) and generate one kernel.

use std::cell::RefCell;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use parking_lot::Mutex;

use super::op::OpSource;
use crate::error::Result;
use crate::ops::PlanSpec;

/// How a kernel's code holds the numbers of its plan's shapes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Numbers<'a> {
    /// The host's cores: each number is written into the code or read from the plan's
    /// constants through their uniform binding, as `slots` says for it ([`Slots`]), and is
    /// recorded there.
    Host(&'a Slots),
    /// Read from the plan's constants as every kernel binds them (`cfg`, a storage buffer):
    /// the GPU forms, compiled once per structure anyway.
    Storage,
}

/// The numbers one build of a host-form kernel meets, in the order its code uses them, and
/// which of them the code reads from the plan's constants instead of writing them in. Every
/// build of a structure meets the same sequence (whether a number is 0, 1 or a power of two
/// changes the code, so it is part of the structure, and such numbers are not slots); a
/// build that reads its `k`th number from the constants reads it there for every shape.
#[derive(Debug)]
pub(crate) struct Slots {
    met: RefCell<Vec<usize>>,
    read: Read,
}

/// Which of a build's numbers its code reads from the plan's constants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Read {
    /// None: every number written into the code (the literal kernel).
    None,
    /// All of them (the shape-generic kernel of the structure).
    All,
    /// Those marked (a number past the end is read too): the numbers that have changed
    /// between the shapes met so far.
    Some(Vec<bool>),
}

impl Slots {
    pub(crate) fn new(read: Read) -> Self {
        Slots {
            met: RefCell::default(),
            read,
        }
    }

    /// The numbers met so far, in order.
    pub(crate) fn met(&self) -> Vec<usize> {
        self.met.borrow().clone()
    }
}

impl Numbers<'_> {
    /// Meets the build's next number `v`: whether the code writes it in (else it reads it from
    /// the constants).
    fn literal(self, v: usize) -> bool {
        let Numbers::Host(slots) = self else {
            return false;
        };
        let mut met = slots.met.borrow_mut();
        let k = met.len();
        met.push(v);
        match &slots.read {
            Read::None => true,
            Read::All => false,
            Read::Some(read) => !read.get(k).copied().unwrap_or(true),
        }
    }

    /// `v` as a WGSL `u32` expression: a literal, or a `cfg` word appended to `cfg` (read
    /// as [`Numbers::word`] says).
    pub(crate) fn num(self, cfg: &mut Vec<u32>, v: usize) -> String {
        match self.literal(v) {
            true => format!("{v}u"),
            false => self.push(cfg, v),
        }
    }

    /// `v` appended to `cfg`, as the code reads it.
    fn push(self, cfg: &mut Vec<u32>, v: usize) -> String {
        cfg.push(v as u32);
        self.word(cfg.len() - 1)
    }

    /// Word `k` of the plan's constants, at an index written into the code. A shape-generic
    /// kernel (one that reads numbers on the host's cores) reads it through `cfgu`, the
    /// constants buffer bound a second time as a uniform buffer ([`UNIFORM_CFG_BINDING`]):
    /// lavapipe loads such a word once for all the lanes of a SIMD batch, a storage word lane
    /// by lane, which made a strided add whose extents were read from `cfg` 3.2× slower than
    /// with them in its code (4.2 against 1.3 ms, [8, 700, 64] f32; 2.4 through `cfgu`, what
    /// is left being the compiler not knowing the numbers: the same code with them written
    /// in ran 1.3).
    pub(crate) fn word(self, k: usize) -> String {
        match self {
            Numbers::Host(slots) if slots.read != Read::None => {
                format!("cfgu[{}u].{}", k / 4, ["x", "y", "z", "w"][k % 4])
            }
            _ => format!("cfg[{k}u]"),
        }
    }

    /// Meets `v`, an extent a view's code divides by: `Some((w0, w1))`, the words of
    /// `v`'s [`divisor_words`] at descriptor words `at` and `at + 1`, where the code reads it
    /// on the host's cores; `None` where it writes it in.
    pub(crate) fn divisor_at(self, v: usize, at: usize) -> Option<(String, String)> {
        (!self.literal(v)).then(|| (self.word(at), self.word(at + 1)))
    }

    /// `x / v` as WGSL (`x` a `u32` expression, `v` > 0): by a literal; read on the host's
    /// cores through `v`'s [`magic`] numbers and `unirt_udiv`, a multiply-high and shifts as
    /// a compiler divides by a constant (a CPU has no vector division; with the numbers
    /// written in, a strided add through `unirt_udiv` ran at the literal kernel's speed); on
    /// a GPU by the word.
    pub(crate) fn div(self, cfg: &mut Vec<u32>, x: &str, v: usize) -> String {
        if self.literal(v) {
            return format!("({x} / {v}u)");
        }
        self.read_div(cfg, x, v)
    }

    /// `x % v` as WGSL, as [`Numbers::div`] divides (`x` is evaluated twice).
    pub(crate) fn rem(self, cfg: &mut Vec<u32>, x: &str, v: usize) -> String {
        if self.literal(v) {
            return format!("({x} % {v}u)");
        }
        match self {
            Numbers::Host(_) if v.is_power_of_two() => {
                let (mask, _) = self.divisor(cfg, v);
                format!("({x} & {mask})")
            }
            Numbers::Host(_) => {
                let q = self.read_div(cfg, x, v);
                format!("({x} - {q} * {})", self.push(cfg, v))
            }
            Numbers::Storage => format!("({x} % {})", self.push(cfg, v)),
        }
    }

    /// `x / v` with `v` read from the constants.
    fn read_div(self, cfg: &mut Vec<u32>, x: &str, v: usize) -> String {
        match self {
            Numbers::Host(_) => {
                let (w0, w1) = self.divisor(cfg, v);
                match v.is_power_of_two() {
                    true => format!("({x} >> {w1})"),
                    false => format!("unirt_udiv({x}, {w0}, {w1})"),
                }
            }
            Numbers::Storage => format!("({x} / {})", self.push(cfg, v)),
        }
    }

    /// `v`'s [`divisor_words`] appended to `cfg`, as the code reads them.
    fn divisor(self, cfg: &mut Vec<u32>, v: usize) -> (String, String) {
        let (w0, w1) = divisor_words(v as u32);
        cfg.extend([w0, w1]);
        (self.word(cfg.len() - 2), self.word(cfg.len() - 1))
    }

    /// Meets `v`, a number a view's code reads at descriptor word `at`: the literal or the
    /// word.
    pub(crate) fn num_at(self, v: usize, at: usize) -> String {
        match self.literal(v) {
            true => format!("{v}u"),
            false => self.word(at),
        }
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
/// of one strided structure (and compiles once) may raise it. With 0, every plan of a
/// structure takes the kernel that reads all its numbers (a test of that form).
const LITERAL_SHAPES: usize = 3;

/// Structures remembered per device before the history starts afresh (a program that plans
/// ever new structures must not grow it without end; forgetting only costs literal kernels).
const MAX_STRUCTURES: usize = 4096;

/// What a family generates for one plan, on the host's cores: the kernel with its shape's
/// numbers in the code while its structure has met few shapes ([`ShapeHistory`]), else the
/// kernel that reads the numbers that have changed between those shapes from the constants
/// and keeps the others in its code; elsewhere the one kernel, generated with
/// [`Numbers::Storage`]. `build` generates the kernel for the numbers it is given.
pub(crate) fn twin(
    spec: &PlanSpec<'_>,
    build: impl Fn(Numbers<'_>) -> Result<OpSource>,
) -> Result<OpSource> {
    if !super::on_host_cores(spec) {
        return build(Numbers::Storage);
    }
    let shape = Slots::new(Read::None);
    let literal = build(Numbers::Host(&shape))?;
    // The structure: the code with every number read.
    let generic = build(Numbers::Host(&Slots::new(Read::All)))?;
    let (structure, hash) = (code_hash(&generic), code_hash(&literal));
    if structure == hash || generic.cfg.len() > MAX_UNIFORM_WORDS {
        return Ok(literal);
    }
    let Some(read) = super::op::with_shape_history(spec, |h| h.read(structure, hash, &shape.met()))
    else {
        return Ok(literal);
    };
    let mut source = match read {
        Read::None => return Ok(literal),
        Read::All => generic,
        read => build(Numbers::Host(&Slots::new(read)))?,
    };
    let decl = format!(
        "@group(0) @binding({UNIFORM_CFG_BINDING}) var<uniform> cfgu: array<vec4<u32>, {}>;\n",
        source.cfg.len().div_ceil(4).max(1)
    );
    let variants = [
        Some(&mut source.passes),
        source.aligned.as_mut(),
        source.textured.as_mut().map(|t| &mut t.passes),
    ];
    for (code, _) in variants.into_iter().flatten().flatten() {
        // After the directives (`enable f16;`), which come first.
        let at = directives_end(code);
        code.insert_str(at, &decl);
    }
    Ok(source)
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

/// What [`ShapeHistory`] knows of one structure.
#[derive(Default)]
struct Structure {
    /// The literal kernels it has had (by their code), at most `literal_shapes`.
    shapes: Vec<u64>,
    /// The numbers of the first shape met.
    first: Vec<usize>,
    /// Which numbers have differed from `first` in a shape met since.
    changed: Vec<bool>,
    /// The numbers the structure's kernel read when it first read some (`None`: not yet).
    read: Option<Vec<bool>>,
}

/// Per device, for each structure of host-form kernel (by the code that reads all its
/// numbers): the shapes it has met and which of its numbers changed between them — PyTorch's
/// compiler marks a dimension dynamic once it has changed, and this does it per number.
pub(crate) struct ShapeHistory {
    seen: Mutex<HashMap<u64, Structure>>,
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

    /// Which numbers the kernel of a plan of `structure` reads from its constants, its shape
    /// being the literal kernel `shape` of numbers `met`: none while the structure has met at
    /// most `literal_shapes` shapes (or this one before: its kernel is likely still
    /// compiled), then those that have changed between the shapes met — one kernel for
    /// every later shape that changes only those. Once another number changes, all of them
    /// (one more kernel, and no further one); a structure whose builds disagree on their count
    /// of numbers (which the families rule out) reads all of them too.
    pub(crate) fn read(&self, structure: u64, shape: u64, met: &[usize]) -> Read {
        let mut seen = self.seen.lock();
        if seen.len() >= MAX_STRUCTURES && !seen.contains_key(&structure) {
            seen.clear();
        }
        let s = seen.entry(structure).or_default();
        if s.shapes.is_empty() && s.first.is_empty() {
            s.first = met.to_vec();
            s.changed = vec![false; met.len()];
        }
        if s.first.len() != met.len() {
            return Read::All;
        }
        for ((changed, a), b) in s.changed.iter_mut().zip(&s.first).zip(met) {
            *changed |= a != b;
        }
        if s.shapes.contains(&shape) {
            Read::None
        } else if s.shapes.len() < self.literal_shapes {
            s.shapes.push(shape);
            Read::None
        } else if self.literal_shapes == 0
            || s.changed.iter().all(|&c| c)
            || !s.changed.contains(&true)
            || s.read.as_ref().is_some_and(|r| *r != s.changed)
        {
            // Nothing known to have changed (a difference outside the numbers), or more than
            // when the structure first read some — a number that follows the changing ones
            // in steps, as a count of tiles does, and would cost a kernel at each new one:
            // read them all, as with no literal shapes at all.
            Read::All
        } else {
            s.read = Some(s.changed.clone());
            Read::Some(s.changed.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The history's answers for a structure met in shapes of numbers `shapes`, in order (a
    /// shape's hash is its numbers').
    fn reads(h: &ShapeHistory, shapes: &[&[usize]]) -> Vec<Read> {
        shapes
            .iter()
            .map(|met| {
                let mut hash = DefaultHasher::new();
                met.hash(&mut hash);
                h.read(7, hash.finish(), met)
            })
            .collect()
    }

    #[test]
    fn a_structure_reads_the_numbers_that_changed_after_its_literal_shapes() {
        let h = ShapeHistory::with_limit(LITERAL_SHAPES);
        let some = |r: &[bool]| Read::Some(r.to_vec());
        assert_eq!(
            reads(
                &h,
                &[
                    &[64, 30, 4],
                    &[64, 31, 4],
                    &[64, 32, 4],
                    // The fourth shape: the one number that changed is read.
                    &[64, 33, 4],
                    &[64, 34, 4],
                    // Shapes met before keep their literal kernels.
                    &[64, 30, 4],
                    // Once another number changes, every number is read.
                    &[64, 35, 8],
                    &[64, 36, 4],
                ]
            ),
            [
                Read::None,
                Read::None,
                Read::None,
                some(&[false, true, false]),
                some(&[false, true, false]),
                Read::None,
                Read::All,
                Read::All,
            ]
        );
        // Every number changed: the kernel that reads them all.
        assert_eq!(reads(&h, &[&[1, 2, 3]])[0], Read::All);
    }

    #[test]
    fn without_literal_shapes_every_number_is_read() {
        let h = ShapeHistory::with_limit(0);
        assert_eq!(reads(&h, &[&[64, 30], &[64, 31]]), [Read::All, Read::All]);
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
        let literal = Slots::new(Read::None);
        let lit = Numbers::Host(&literal);
        let all = Slots::new(Read::All);
        let uni = Numbers::Host(&all);
        let mut cfg = vec![7];
        assert_eq!(lit.num(&mut cfg, 12), "12u");
        assert_eq!(cfg, [7]);
        assert_eq!(uni.num(&mut cfg, 12), "cfgu[0u].y");
        assert_eq!(Numbers::Storage.num(&mut cfg, 13), "cfg[2u]");
        assert_eq!(cfg, [7, 12, 13]);
        assert_eq!(lit.rem(&mut cfg, "i", 5), "(i % 5u)");
        assert_eq!(Numbers::Storage.div(&mut cfg, "i", 5), "(i / cfg[3u])");
        let q = "unirt_udiv(i, cfgu[1u].x, cfgu[1u].y)";
        assert_eq!(uni.rem(&mut cfg, "i", 5), format!("(i - {q} * cfgu[1u].z)"));
        assert_eq!(cfg[4..], [magic(5).0, magic(5).1, 5]);
        // Powers of two: a mask and a shift.
        assert_eq!(uni.rem(&mut cfg, "i", 64), "(i & cfgu[1u].w)");
        assert_eq!(uni.div(&mut cfg, "i", 64), "(i >> cfgu[2u].z)");
        assert_eq!(cfg[7..], [63, 6, 63, 6]);
        // Each call meets one number, whatever it appends.
        assert_eq!(literal.met(), [12, 5]);
        assert_eq!(all.met(), [12, 5, 64, 64]);
        // Numbers read as marked: the second of three.
        let marked = Slots::new(Read::Some(vec![false, true]));
        let mixed = Numbers::Host(&marked);
        let mut cfg = vec![];
        assert_eq!(
            [
                mixed.num(&mut cfg, 3),
                mixed.num(&mut cfg, 4),
                mixed.num(&mut cfg, 5)
            ],
            // A number past the marks is read.
            ["3u", "cfgu[0u].x", "cfgu[0u].y"]
        );
        assert_eq!(cfg, [4, 5]);
    }
}
