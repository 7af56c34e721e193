//! Plans `matmul_epilogue` on CUDA (registered by the matmul family, `matmul.rs`).
//!
//! `matmul_epilogue` computes its product exactly as the plain `matmul` into a contiguous
//! output would — the same cuBLAS call, or the same tiles — so that the epilogue reads the
//! very bits the unfused operators would:
//!
//! - with cuBLAS: the GEMM into the output (or, where the output is not contiguous, into the
//!   plan's workspace, laid out as the plain matmul's output), then `op_epilogue` runs the
//!   program over the stored product, in place;
//! - without: `op_matmul_epilogue`, the NVRTC GEMM whose threads run the program over the
//!   elements they have just stored.
//!
//! Both kernels are generated per program ([`epilogue_source`]: the elementwise functions and
//! the program's chain from `fused.rs`, then `matmul.cu` with `UNIRT_EPILOGUE`), compiled and
//! cached like the fused elementwise chains.

use std::sync::Arc;

use super::args::{broadcast, strides_of, Space, BLOCK};
use super::fused;
use super::matmul::{cublas_for, Geometry, FAMILY, MM_WORDS};
use super::prepared::{ready, with_backend, Operand, Step};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::ops::fused::FusedProgram;
use crate::ops::matmul::{MATMUL_EPILOGUE, MAX_EPILOGUE_OPERANDS};
use crate::ops::{PlanSpec, PreparedKernel, TensorDesc};
use crate::tensor::{DType, Layout};

/// Bytes of workspace a CUDA `matmul_epilogue` into `out` asks for: where cuBLAS computes the
/// product and `out` is not contiguous, the product is stored in the workspace, laid out as
/// the plain matmul's contiguous output (so it is bitwise that output), and the epilogue
/// reads it from there. Whether cuBLAS runs is known only when the kernel is prepared, so a
/// non-contiguous output always asks.
pub(crate) fn epilogue_workspace(out: &TensorDesc) -> usize {
    if out.layout.is_contiguous() {
        0
    } else {
        out.layout.numel() * out.dtype.size()
    }
}

/// Which of the two epilogue kernels a generated source holds (`UNIRT_EPILOGUE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EpilogueKernel {
    /// `op_matmul_epilogue`: the tiles with the program in their store (no cuBLAS).
    Gemm,
    /// `op_epilogue`: the program over a product cuBLAS stored.
    Pass,
}

impl EpilogueKernel {
    /// The kernel's `extern "C"` name.
    pub(super) fn entry(self) -> &'static str {
        match self {
            EpilogueKernel::Gemm => "op_matmul_epilogue",
            EpilogueKernel::Pass => "op_epilogue",
        }
    }

    /// The bytes of its parameters for a program of `steps` steps: three pointers (A, B, C)
    /// or two (output, product) and one per extra operand slot ([`MAX_EPILOGUE_OPERANDS`]),
    /// then `struct MmEpi` (`Mm`, each extra operand's batch strides, row and column strides,
    /// `Chain`) or `struct EpiPass` (the space, the output's, the product's and each extra
    /// operand's strides, `Chain`).
    pub(super) fn param_bytes(self, steps: usize) -> usize {
        let dims = super::args::MAX_DIMS;
        let (ptrs, words) = match self {
            EpilogueKernel::Gemm => (3, MM_WORDS + MAX_EPILOGUE_OPERANDS * (dims + 2)),
            EpilogueKernel::Pass => (2, 2 + dims + (2 + MAX_EPILOGUE_OPERANDS) * dims),
        };
        8 * (ptrs + MAX_EPILOGUE_OPERANDS + words + 1 + steps)
    }
}

/// The program the ahead-of-time build compiles both epilogue kernels for, reading every
/// extra operand slot: `swiglu(0.5 · (gelu(p + e0) · e1 − e2), e3)`. The steps' functions
/// themselves are the fused chains' (compiled there with every function).
pub(super) fn sample_program() -> (FusedProgram, usize) {
    use crate::ops::fused::{FusedSrc::*, FusedStep::*};
    use crate::ops::{BinaryOp, UnaryOp};
    let steps = vec![
        Binary(BinaryOp::Add, Input(0), Input(1)),
        Unary(UnaryOp::Gelu, Step(0)),
        Binary(BinaryOp::Mul, Step(1), Input(2)),
        Binary(BinaryOp::Sub, Step(2), Input(3)),
        Scalar(BinaryOp::Mul, Step(3), 0.5),
        Swiglu(Step(4), Input(4)),
    ];
    (FusedProgram { steps }, MAX_EPILOGUE_OPERANDS)
}

/// The most bytes of parameters a CUDA kernel takes (CUDA 12.1 raised it to 32764 on Volta
/// and later, with a 12.1 driver; unirt keeps to the limit every driver takes).
const MAX_PARAM_BYTES: usize = 4096;

/// The CUDA C of `kernel` running `prog` over the product and `extras` extra operands in
/// `dtype`: the elementwise functions and the program's `chain` ([`fused::with_chain`]), the
/// glue `matmul.cu` expects (`EPI_EXTRAS`, `epilogue_of`), then `matmul.cu` with
/// `UNIRT_EPILOGUE` selecting the kernel.
pub(super) fn epilogue_source(
    prog: &FusedProgram,
    extras: usize,
    dtype: DType,
    kernel: EpilogueKernel,
) -> Result<String> {
    if extras > MAX_EPILOGUE_OPERANDS {
        return Err(Error::Internal(format!(
            "{MATMUL_EPILOGUE}: {extras} extra operands (unchecked plan)"
        )));
    }
    let head = fused::with_chain(prog, 1 + extras, dtype)?;
    let xs = (0..=extras)
        .map(|k| format!("x[{k}]"))
        .collect::<Vec<_>>()
        .join(", ");
    let form = match kernel {
        EpilogueKernel::Gemm => 1,
        EpilogueKernel::Pass => 2,
    };
    Ok(format!(
        r#"{head}
#line 1 "matmul_epilogue.cu"
// The glue matmul.cu's epilogue kernels expect (vendors/cuda/kernels/matmul.rs).
#define EPI_EXTRAS {extras}
__device__ __forceinline__ float epilogue_of(const Chain &c, const float (&x)[1 + EPI_EXTRAS])
{{
    return chain(c, {xs});
}}
#define UNIRT_EPILOGUE {form}
#line 1 "matmul.cu"
{text}"#,
        text = FAMILY.text,
    ))
}

/// Loads the epilogue kernel `kernel` for this plan's program, compiling it at first use.
fn epilogue_function(
    spec: &PlanSpec<'_>,
    prog: &FusedProgram,
    extras: usize,
    kernel: EpilogueKernel,
) -> Result<u64> {
    let bytes = kernel.param_bytes(prog.steps.len());
    if bytes > MAX_PARAM_BYTES {
        return Err(Error::unsupported(
            format!(
                "{MATMUL_EPILOGUE} with {} steps ({bytes} bytes of kernel parameters; CUDA \
                 takes {MAX_PARAM_BYTES})",
                prog.steps.len()
            ),
            DeviceKind::Cuda,
        ));
    }
    let text = epilogue_source(prog, extras, spec.dtype, kernel)?;
    let name = fused::module_name("epilogue", spec.dtype, &text);
    with_backend(spec, |b| {
        b.module_function_of(&name, "matmul_epilogue.cu", || text, kernel.entry())
    })?
}

/// The pointers to the extra operands: inputs 2, 3, …; the unused slots repeat input 0
/// (never read).
fn extra_ptrs(extras: usize) -> impl Iterator<Item = Operand> {
    (0..MAX_EPILOGUE_OPERANDS).map(move |q| Operand::In(if q < extras { 2 + q } else { 0 }))
}

/// `matmul_epilogue`: the product as `matmul` computes it (cuBLAS or the tiles), the program
/// over it.
pub(super) fn plan(
    spec: &PlanSpec<'_>,
    (a, b, out): (&TensorDesc, &TensorDesc, &TensorDesc),
    extras: &[TensorDesc],
    alpha: f64,
    prog: &FusedProgram,
) -> Result<Arc<dyn PreparedKernel>> {
    if extras.len() > MAX_EPILOGUE_OPERANDS || prog.steps.is_empty() {
        return Err(Error::Internal(format!(
            "{}: {} extra operands, {} steps (unchecked plan)",
            spec.op,
            extras.len(),
            prog.steps.len()
        )));
    }
    let shape = out.layout.shape();
    let nd = shape.len();
    // Each extra operand's strides broadcast to the output (0 where it broadcasts); the
    // unused slots are all zero.
    let bcast: Vec<Vec<i64>> = (0..MAX_EPILOGUE_OPERANDS)
        .map(|q| match extras.get(q) {
            Some(e) => broadcast(shape, &e.layout),
            None => vec![0; nd],
        })
        .collect();
    // The product exactly as the plain matmul computes it into a contiguous output.
    let plain = Layout::contiguous(shape);
    let g = Geometry::new(spec.op, &a.layout, &b.layout, &plain, &[])?;
    if let Some(gemm) = cublas_for(spec, &g, alpha, 0.0)? {
        // cuBLAS writes the output when it is laid out as the plain matmul's output (then
        // the call is that matmul's), else the workspace; the pass reads the product there.
        let (product, strides) = if out.layout.is_contiguous() {
            (Operand::Out(0, 0), strides_of(&out.layout))
        } else {
            let need = epilogue_workspace(out);
            if spec.workspace < need {
                return Err(Error::Internal(format!(
                    "{}: a workspace of {} bytes, {need} needed for the product",
                    spec.op, spec.workspace
                )));
            }
            (Operand::Workspace, strides_of(&plain))
        };
        let mut all = vec![strides_of(&out.layout), strides];
        all.extend(bcast);
        let space = Space::new(spec.op, shape, &all)?;
        let func = epilogue_function(spec, prog, extras.len(), EpilogueKernel::Pass)?;
        let vector = (16 / spec.dtype.size()) as i64;
        let mut pass = Step::new(
            EpilogueKernel::Pass.entry(),
            [space.grid(2 + extras.len(), vector), 1, 1],
            [BLOCK, 1, 1],
        );
        pass.ptrs = vec![Operand::Out(0, 0), product];
        pass.ptrs.extend(extra_ptrs(extras.len()));
        pass.args.space(&space);
        for i in 0..2 + MAX_EPILOGUE_OPERANDS {
            pass.args.strides(&space, i);
        }
        fused::chain_args(prog, &mut pass.args);
        let gemm = Step::blas(gemm, [Operand::In(1), Operand::In(0), product]);
        return ready(spec.device, vec![(0, gemm), (func, pass)]);
    }
    // The tiles, with each extra operand's batch strides in their batch space (operands
    // 3, 4, … after A, B and C).
    let more: Vec<Vec<i64>> = bcast.iter().map(|s| s[..nd - 2].to_vec()).collect();
    let g = Geometry::new(spec.op, &a.layout, &b.layout, &out.layout, &more)?;
    let func = epilogue_function(spec, prog, extras.len(), EpilogueKernel::Gemm)?;
    let mut step = g.tiles(EpilogueKernel::Gemm.entry(), alpha, 0.0)?;
    step.ptrs.extend(extra_ptrs(extras.len()));
    for q in 0..MAX_EPILOGUE_OPERANDS {
        step.args.strides(&g.space, 3 + q);
    }
    for s in &bcast {
        step.args.int(s[nd - 2]);
    }
    for s in &bcast {
        step.args.int(s[nd - 1]);
    }
    fused::chain_args(prog, &mut step.args);
    ready(spec.device, vec![(func, step)])
}

#[cfg(test)]
mod tests {
    use super::super::args::Args;
    use super::*;
    use crate::ops::fused::{FusedSrc, FusedStep};
    use crate::ops::{BinaryOp, UnaryOp};
    use crate::vendors::cuda::nvrtc::{nvrtc, Target};

    /// relu(p + bias) + residual: the planner's usual epilogue.
    fn bias_relu_residual() -> FusedProgram {
        FusedProgram {
            steps: vec![
                FusedStep::Binary(BinaryOp::Add, FusedSrc::Input(0), FusedSrc::Input(1)),
                FusedStep::Unary(UnaryOp::Relu, FusedSrc::Step(0)),
                FusedStep::Binary(BinaryOp::Add, FusedSrc::Step(1), FusedSrc::Input(2)),
            ],
        }
    }

    const KERNELS: [EpilogueKernel; 2] = [EpilogueKernel::Gemm, EpilogueKernel::Pass];

    /// The words of `struct Chain` for `prog`.
    fn chain_words(prog: &FusedProgram) -> usize {
        let mut a = Args::new();
        fused::chain_args(prog, &mut a);
        a.0.len()
    }

    /// Both epilogue kernels compile for every dtype, with 0 and 2 extra operands, on the
    /// SIMT (sm_70) and tensor-core (sm_80) forms, take the parameters the host builds and
    /// keep their values in registers.
    #[test]
    fn epilogue_kernels_compile_with_the_host_parameter_size() {
        let Ok(nv) = nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return;
        };
        let relu = FusedProgram {
            steps: vec![FusedStep::Unary(UnaryOp::Relu, FusedSrc::Input(0))],
        };
        // (The ahead-of-time build compiles every function with four extras on every arch.)
        for (prog, extras) in [(&relu, 0), (&bias_relu_residual(), 2)] {
            for dtype in DType::FLOATS {
                for kernel in KERNELS {
                    let text = epilogue_source(prog, extras, dtype, kernel).unwrap();
                    for arch in [70, 80] {
                        let (img, log) = nv
                            .compile("matmul_epilogue.cu", &text, Target::Cubin(arch))
                            .unwrap_or_else(|e| panic!("{dtype} {kernel:?} sm_{arch}: {e}"));
                        assert_eq!(
                            super::super::cubin::param_bytes(&img, kernel.entry()),
                            Some(kernel.param_bytes(prog.steps.len()) as u32),
                            "{dtype} {kernel:?} sm_{arch} {extras} extras: {log}"
                        );
                        // Nothing spilled (a frame of a few words saved around the batch
                        // offsets' 64-bit division subroutine is fine).
                        let r = super::super::cubin::resources(&img, kernel.entry()).unwrap();
                        assert!(r.frame_bytes <= 32, "{dtype} {kernel:?} sm_{arch}: {r:?}");
                    }
                }
            }
        }
        // The host's words match: Mm + the extras' strides + Chain.
        let p = bias_relu_residual();
        assert_eq!(
            8 * (3
                + MAX_EPILOGUE_OPERANDS
                + MM_WORDS
                + MAX_EPILOGUE_OPERANDS * 10
                + chain_words(&p)),
            EpilogueKernel::Gemm.param_bytes(p.steps.len())
        );
        // Programs the planner never makes are refused before any compile.
        assert!(epilogue_source(&p, 5, DType::F32, EpilogueKernel::Gemm).is_err());
        assert!(epilogue_source(&p, 1, DType::F32, EpilogueKernel::Gemm).is_err());
        assert!(epilogue_source(&p, 2, DType::I32, EpilogueKernel::Pass).is_err());
        assert!(epilogue_source(
            &FusedProgram::default(),
            0,
            DType::F32,
            EpilogueKernel::Pass
        )
        .is_err());
    }

    /// The product and every step's result are opaque to the compiler: no multiply of the
    /// GEMM's store or of one step is contracted with the add of the next (which the unfused
    /// kernels, each storing its result, never do); the parameter structs are read in place.
    #[test]
    fn epilogue_steps_are_not_contracted_and_use_no_local_memory() {
        let Ok(nv) = nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return;
        };
        // p·s + 0.5, then + bias: two multiply–add pairs a compiler would like to fuse.
        let prog = FusedProgram {
            steps: vec![
                FusedStep::Binary(BinaryOp::Mul, FusedSrc::Input(0), FusedSrc::Input(1)),
                FusedStep::Scalar(BinaryOp::Add, FusedSrc::Step(0), 0.5),
                FusedStep::Binary(BinaryOp::Add, FusedSrc::Step(1), FusedSrc::Input(2)),
            ],
        };
        for dtype in [DType::F32, DType::BF16] {
            for kernel in KERNELS {
                let text = epilogue_source(&prog, 2, dtype, kernel).unwrap();
                let (ptx, _) = nv
                    .compile("matmul_epilogue.cu", &text, Target::Ptx(80))
                    .unwrap();
                let ptx = String::from_utf8_lossy(&ptx);
                assert!(
                    ptx.contains(&format!(".entry {}(", kernel.entry())),
                    "{ptx}"
                );
                assert!(ptx.contains("xor.b32"), "{dtype} {kernel:?}: no barrier");
                assert!(
                    !ptx.contains("__local_depot"),
                    "{dtype} {kernel:?}: local memory\n{ptx}"
                );
                if kernel == EpilogueKernel::Pass {
                    // The tiles' own FMAs are the GEMM's; the pass has none.
                    assert!(!ptx.contains("fma."), "{dtype}: a contracted step\n{ptx}");
                }
            }
        }
    }

    /// The tile kernel with an epilogue is op_matmul's: its product is computed by the same
    /// code (only the store differs), and op_matmul itself is unchanged by the epilogue's
    /// hooks (the family's source holds it and op_matmul_mma alone).
    #[test]
    fn the_family_source_holds_op_matmul_alone() {
        let Ok(nv) = nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return;
        };
        for dtype in [DType::F32, DType::F16] {
            let (ptx, _) = nv
                .compile(
                    "matmul.cu",
                    &super::super::op_source(&FAMILY, dtype),
                    Target::Ptx(80),
                )
                .unwrap();
            let ptx = String::from_utf8_lossy(&ptx);
            assert_eq!(ptx.matches(".entry ").count(), 2, "{ptx}");
            assert!(ptx.contains(".entry op_matmul("));
            assert!(ptx.contains(".entry op_matmul_mma("));
            assert!(!ptx.contains("__local_depot"), "{dtype}: local memory");
        }
    }

    /// Contiguous outputs need no workspace; others hold the product in one.
    #[test]
    fn workspace_only_for_non_contiguous_outputs() {
        let dev = crate::Device::new(DeviceKind::Cuda, 0);
        let c = TensorDesc::new(dev, DType::BF16, Layout::contiguous(&[2, 3, 5]));
        assert_eq!(epilogue_workspace(&c), 0);
        let t = TensorDesc::new(
            dev,
            DType::BF16,
            Layout::contiguous(&[2, 5, 3]).transpose(1, 2).unwrap(),
        );
        assert_eq!(epilogue_workspace(&t), 2 * 30);
    }
}
