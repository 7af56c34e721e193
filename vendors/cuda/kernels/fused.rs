//! `fused_elementwise` in CUDA C: a chain of elementwise steps as one kernel, its source
//! generated from the [`FusedProgram`] at plan time, compiled by NVRTC and cached like every
//! op family's (in memory and on disk, keyed by the source's hash).
//!
//! The source is the elementwise family's own file with its kernels left out
//! (`UNIRT_FUSED`), so each step calls the very function its unfused kernel calls
//! (`add_fn`, `gelu_fn`, …), followed by the generated kernel. Each step's result passes
//! through `keep`: rounded to the dtype as the unfused kernel stores it, and XORed with a
//! parameter that is 0 at run time. The unfused kernels store every result, so a multiply in
//! one step contracted with an add in the next into one FMA (which NVRTC does by default)
//! would round differently; `keep` hides each result from the compiler, so a fused chain is
//! bitwise the unfused one. Scalars are kernel parameters, as in the unfused kernels (a
//! literal could be folded differently).
//!
//! The kernel moves 16 bytes per access when every operand is 16-byte aligned (checked on
//! the device, as the elementwise kernels do), else one element per thread and step of a
//! grid-stride loop. Its parameters: the output, each input, then `struct Fused { i64 n;
//! Chain c; }` (element count, then the program's `struct Chain { i64 mask; double
//! s[steps]; }`: the opaque zero, each step's scalar).
//!
//! The program part — the elementwise functions, `Chain`, `keep` and `chain(c, x0, …)` — is
//! [`with_chain`], which `matmul_epilogue`'s kernels (matmul.rs) put before their own code:
//! one generator for every kernel that runs a [`FusedProgram`].

use std::fmt::Write as _;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::args::{blocks, Args, BLOCK};
use super::prepared::{ready, with_backend, Operand, Step};
use super::{elementwise, op_source};
use crate::error::{Error, Result};
use crate::ops::fused::{
    planned, FusedProgram, FusedSrc, FusedStep, FUSED_ELEMENTWISE, MAX_FUSED_INPUTS,
};
use crate::ops::{PlanSpec, PreparedKernel};
use crate::tensor::DType;

/// The kernel's `extern "C"` name.
pub(super) const ENTRY: &str = "fused_elementwise";

/// The CUDA C every kernel running `prog` over `inputs` operands in `dtype` starts with: the
/// elementwise family's functions (its file with `UNIRT_FUSED`: no kernels), then
///
/// - `struct Chain { i64 mask; double s[steps]; }`, the program's by-value parameters
///   ([`chain_args`]: the opaque zero, each step's scalar);
/// - `keep(v, mask)`, a result rounded to the dtype as an unfused kernel stores it and hidden
///   from the compiler;
/// - `chain(c, x0, …, x{inputs - 1})`, the program over its operands' values (in f32, as
///   the unfused kernels read them), each step's result passed through `keep`.
pub(super) fn with_chain(prog: &FusedProgram, inputs: usize, dtype: DType) -> Result<String> {
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(Error::Internal(format!(
            "{FUSED_ELEMENTWISE}: no CUDA kernel for {dtype}"
        )));
    }
    if prog.steps.is_empty() || inputs == 0 || inputs > MAX_FUSED_INPUTS {
        return Err(Error::Internal(format!(
            "{FUSED_ELEMENTWISE}: {inputs} inputs, {} steps (unchecked program)",
            prog.steps.len()
        )));
    }
    prog.validate(inputs)?;
    let operand = |src: FusedSrc| match src {
        FusedSrc::Input(k) => format!("x{k}"),
        FusedSrc::Step(k) => format!("t{k}"),
    };
    let mut body = String::new();
    for (s, step) in prog.steps.iter().enumerate() {
        // The unfused kernels call unary functions as f(x, x) and scalar ones as f(x, s).
        let call = match *step {
            FusedStep::Unary(u, a) => format!("{}_fn()({a}, {a})", u.name(), a = operand(a)),
            FusedStep::Binary(o, a, b) => {
                format!("{}_fn()({}, {})", o.name(), operand(a), operand(b))
            }
            FusedStep::Scalar(o, a, _) => {
                format!("{}_fn()({}, (float)c.s[{s}])", o.name(), operand(a))
            }
            FusedStep::Swiglu(up, gate) => {
                format!("swiglu_fn()({}, {})", operand(up), operand(gate))
            }
        };
        let _ = writeln!(body, "    float t{s} = keep({call}, m);");
    }
    let last = prog.steps.len() - 1;
    let steps = prog.steps.len();
    let xs = (0..inputs)
        .map(|k| format!("float x{k}"))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(format!(
        r#"#define UNIRT_FUSED 1
{elementwise}
#line 1 "fused_chain.cu"
// Generated from a FusedProgram of {steps} steps over {inputs} inputs (vendors/cuda/kernels/fused.rs).
struct Chain {{
    i64 mask;
    double s[{steps}];
}};

// A step's result as the unfused kernel stores it, hidden from the compiler (mask is 0).
__device__ __forceinline__ float keep(float v, int mask)
{{
    return __int_as_float(__float_as_int(to_f32(from_f32<T>(v))) ^ mask);
}}

__device__ __forceinline__ float chain(const Chain &c, {xs})
{{
    int m = (int)c.mask;
{body}    return t{last};
}}
"#,
        elementwise = op_source(&elementwise::FAMILY, dtype),
    ))
}

/// The words of `struct Chain` for `prog` (see [`with_chain`]).
pub(super) fn chain_args(prog: &FusedProgram, a: &mut Args) {
    a.int(0);
    for step in &prog.steps {
        a.float(match *step {
            FusedStep::Scalar(_, _, c) => c,
            _ => 0.0,
        });
    }
}

/// The CUDA C of `prog` over `inputs` inputs for `dtype`: [`with_chain`], then the generated
/// kernel [`ENTRY`].
pub(super) fn source(prog: &FusedProgram, inputs: usize, dtype: DType) -> Result<String> {
    let head = with_chain(prog, inputs, dtype)?;
    let n = inputs;
    let list = |f: &dyn Fn(usize) -> String| (0..n).map(f).collect::<Vec<_>>().join(", ");
    let params = list(&|k| format!("const T *__restrict__ in{k}"));
    let args_of = |at: &dyn Fn(usize) -> String| list(&|k| format!("to_f32({})", at(k)));
    let aligned = (0..n)
        .map(|k| format!("aligned_to(in{k}, 16)"))
        .collect::<Vec<_>>()
        .join(" && ");
    let loads: String = (0..n)
        .map(|k| format!("            TPack p{k} = ((const TPack *)in{k})[p];\n"))
        .collect();
    let text = format!(
        r#"
#line 1 "fused_elementwise.cu"
struct Fused {{
    i64 n;
    Chain c;
}};

extern "C" __global__ void {ENTRY}(T *__restrict__ out, {params}, Fused e)
{{
    if (aligned_to(out, 16) && {aligned}) {{
        i64 packs = e.n / VEC;
        GRID_LOOP(p, packs)
        {{
{loads}            TPack r;
#pragma unroll
            for (int j = 0; j < VEC; ++j) r.v[j] = from_f32<T>(chain(e.c, {vec_args}));
            ((TPack *)out)[p] = r;
        }}
        // Fewer than VEC elements are left; the first threads take one each.
        i64 t = packs * VEC + (i64)blockIdx.x * blockDim.x + threadIdx.x;
        if (t < e.n) out[t] = from_f32<T>(chain(e.c, {tail_args}));
        return;
    }}
    GRID_LOOP(i, e.n) out[i] = from_f32<T>(chain(e.c, {elem_args}));
}}
"#,
        vec_args = list(&|k| format!("to_f32(p{k}.v[j])")),
        tail_args = args_of(&|k| format!("in{k}[t]")),
        elem_args = args_of(&|k| format!("in{k}[i]")),
    );
    Ok(format!("{head}{text}"))
}

/// The by-value parameters of a launch over `n` elements: `struct Fused`.
fn params(prog: &FusedProgram, n: usize) -> Args {
    let mut a = Args::new();
    a.int(n);
    chain_args(prog, &mut a);
    a
}

/// The module name of a generated source, `<kind>-<dtype>-<hash>`: unique per source (it
/// keys the image caches and a device's loaded modules).
pub(super) fn module_name(kind: &str, dtype: DType, text: &str) -> String {
    let hash: String = Sha256::digest(text.as_bytes())
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{kind}-{dtype}-{hash}")
}

pub(super) fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let (prog, out) = planned(spec)?;
    let text = source(prog, spec.inputs.len(), spec.dtype)?;
    let name = module_name("fused", spec.dtype, &text);
    let func = with_backend(spec, |b| {
        b.module_function_of(&name, "fused_elementwise.cu", || text, ENTRY)
    })??;
    let n = out.layout.numel();
    // Sized for the vector path (16 bytes a thread); the grid-stride loop covers the rest.
    let vector = 16 / spec.dtype.size();
    let mut step = Step::new(
        ENTRY,
        [blocks(n.div_ceil(vector) as i64, BLOCK as i64), 1, 1],
        [BLOCK, 1, 1],
    );
    step.ptrs.push(Operand::Out(0, 0));
    step.ptrs.extend((0..spec.inputs.len()).map(Operand::In));
    step.args = params(prog, n);
    ready(spec.device, vec![(func, step)])
}

/// The parameter bytes of [`ENTRY`] for `prog` over `inputs` inputs.
pub(super) fn param_bytes(prog: &FusedProgram, inputs: usize) -> u32 {
    (8 * (1 + inputs + 2 + prog.steps.len())) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{BinaryOp, UnaryOp};
    use crate::vendors::cuda::nvrtc::{nvrtc, Target};

    fn ptx(prog: &FusedProgram, inputs: usize, dtype: DType) -> Option<String> {
        let Ok(nv) = nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return None;
        };
        let text = source(prog, inputs, dtype).unwrap();
        let (img, _) = nv
            .compile("fused_elementwise.cu", &text, Target::Ptx(80))
            .unwrap();
        Some(String::from_utf8_lossy(&img).into_owned())
    }

    /// `a·b + 0.5` fused: without `keep` NVRTC contracts the multiply of one step and the add
    /// of the next into one FMA, which the unfused kernels (each storing its result) never do.
    #[test]
    fn steps_are_not_contracted_across() {
        let prog = FusedProgram {
            steps: vec![
                FusedStep::Binary(BinaryOp::Mul, FusedSrc::Input(0), FusedSrc::Input(1)),
                FusedStep::Scalar(BinaryOp::Add, FusedSrc::Step(0), 0.5),
            ],
        };
        for dtype in [DType::F32, DType::BF16] {
            let Some(ptx) = ptx(&prog, 2, dtype) else {
                return;
            };
            assert!(ptx.contains(&format!(".entry {ENTRY}(")), "{ptx}");
            assert!(!ptx.contains("fma."), "{dtype}: a contracted step\n{ptx}");
            assert!(ptx.contains("xor.b32"), "{dtype}: no barrier\n{ptx}");
            // The by-value parameters are read in place (see the elementwise family's test).
            assert!(
                !ptx.contains("__local_depot"),
                "{dtype}: local memory\n{ptx}"
            );
        }
    }

    /// Every elementwise function compiles into a fused kernel whose parameters are what the
    /// host passes, for every dtype.
    #[test]
    fn every_function_compiles_with_the_host_parameter_size() {
        let Ok(nv) = nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return;
        };
        let prog = FusedProgram::every_function();
        let fns = UnaryOp::ALL.len() + 2 * BinaryOp::ALL.len() + 1;
        assert!(prog.steps.len() > fns, "{}", prog.steps.len());
        for dtype in DType::FLOATS {
            let text = source(&prog, 2, dtype).unwrap();
            let (img, log) = nv
                .compile("fused_elementwise.cu", &text, Target::Cubin(80))
                .unwrap();
            assert_eq!(
                super::super::cubin::param_bytes(&img, ENTRY),
                Some(param_bytes(&prog, 2)),
                "{dtype}: {log}"
            );
            assert_eq!(
                params(&prog, 10).0.len() * 8 + 8 * 3,
                param_bytes(&prog, 2) as usize
            );
        }
        // Programs that the planner never makes are refused before any compile.
        assert!(source(&FusedProgram::default(), 1, DType::F32).is_err());
        assert!(source(&prog, 2, DType::I32).is_err());
        let bad = FusedProgram {
            steps: vec![FusedStep::Unary(UnaryOp::Neg, FusedSrc::Input(3))],
        };
        assert!(source(&bad, 1, DType::F32).is_err());
    }
}
