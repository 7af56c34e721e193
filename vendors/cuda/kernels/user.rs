//! User kernels written in CUDA C ([`KernelImpl::CudaC`], registered with
//! [`crate::ops::register_kernel`]) compiled by NVRTC, cached and launched exactly as the
//! built-in operators are ([`CudaOp`](super::prepared::CudaOp): allocation-table checks under the enqueue
//! gate, no host synchronisation, stream capture into CUDA graphs).
//!
//! The user's source is compiled after `common.cuh` (unirt's f16 / bf16 storage types `uhalf`
//! and `ubf16`, `to_f32`, `from_f32<E>`, …) and a prelude generated for the plan, which gives
//! the same names as the WGSL prelude (`vendors/wgpu/kernels/user.rs`), so one kernel reads
//! alike in both languages:
//!
//! - `UNIRT_PARAMS`: the kernel's parameter list. The entry must be declared
//!   `extern "C" __global__ void <entry>(UNIRT_PARAMS)`; unirt checks the compiled kernel's
//!   parameter size against it, so another signature is a [`Error::BadParam`], never a kernel
//!   reading past its parameters.
//! - `t0`, `t1`, …: the tensors (inputs then outputs, in plan order) as pointers to their
//!   first element, typed by dtype (`float`, `uhalf`, `ubf16`, `int`, `i64`, `u8`; inputs
//!   `const`). `ld_t<k>(i)` reads element `i` (counted from the first element; the caller
//!   applies strides) as `float` for float dtypes and as its own type for integers;
//!   `st_t<k>(i, v)` stores `v` rounded to the tensor's dtype.
//! - `ndim_t<k>()`, `shape_t<k>(d)`, `stride_t<k>(d)` (64-bit, strides in elements).
//! - `grid()`: the plan's launch grid as a `uint3`. The launch covers it with blocks of the
//!   registered size (rounded up), so the kernel checks its bounds.
//! - `arg<k>()` for scalar `k`, typed: `float` for f32 (and for f16 / bf16 scalars, converted
//!   exactly), `double`, `int`, `i64`, `unsigned`, `u64`, `u8`, `bool`.

use std::fmt::Write;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::args::{Args, MAX_DIMS};
use super::prepared::{Operand, Step, MAX_PTRS};
use super::{c_type, COMMON};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::hal::KernelArg;
use crate::ops::{KernelImpl, PlanSpec, PreparedKernel};

/// Scalars a user kernel may take (each one word of the parameter struct).
const MAX_SCALARS: usize = 32;

/// Words of the parameter struct before the scalars: the grid, then per tensor its rank, shape
/// and strides.
fn tensor_words(tensors: usize) -> usize {
    3 + tensors * (1 + 2 * MAX_DIMS)
}

/// A user kernel made ready to compile: the generated source and the by-value struct.
#[derive(Debug)]
pub(crate) struct UserKernel {
    /// `common.cuh`, the prelude and the user's source.
    pub text: String,
    /// The parameter struct's words for this plan.
    pub args: Args,
    /// Tensors passed as pointer parameters.
    pub tensors: usize,
    /// Blocks and threads per block.
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

impl UserKernel {
    /// Bytes of the kernel's parameters: the pointers, then the struct.
    pub fn param_bytes(&self) -> u32 {
        8 * (self.tensors + self.args.0.len()) as u32
    }

    /// The name that keys the image caches and the device's modules: the operator and a hash
    /// of the whole source (distinct sources never share a name).
    pub fn cache_name(&self, op: &str) -> String {
        let hash: String = Sha256::digest(self.text.as_bytes())
            .iter()
            .take(12)
            .map(|b| format!("{b:02x}"))
            .collect();
        let op: String = op
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(48)
            .collect();
        format!("user-{op}-{hash}")
    }
}

/// One scalar as a struct word and the C expression that reads it back from `w` (the
/// expression naming that word).
fn scalar(op: &str, k: usize, a: &KernelArg, w: &str) -> Result<(i64, String)> {
    let float = |v: f32| (i64::from(v.to_bits()), format!("__int_as_float((int){w})"));
    Ok(match *a {
        KernelArg::F32(v) => float(v),
        KernelArg::F16(v) => float(v.to_f32()),
        KernelArg::BF16(v) => float(v.to_f32()),
        KernelArg::F64(v) => (v.to_bits() as i64, format!("__longlong_as_double({w})")),
        KernelArg::I32(v) => (i64::from(v), format!("((int){w})")),
        KernelArg::I64(v) => (v, format!("((i64){w})")),
        KernelArg::U32(v) => (i64::from(v), format!("((unsigned){w})")),
        KernelArg::U64(v) => (v as i64, format!("((u64){w})")),
        KernelArg::U8(v) => (i64::from(v), format!("((u8){w})")),
        KernelArg::Bool(v) => (i64::from(v), format!("({w} != 0)")),
        KernelArg::Ptr(_) => {
            return Err(Error::BadParam(format!(
                "{op}: scalar {k} is a pointer; pass tensors as the plan's inputs and outputs \
                 (their ranges are checked, a raw pointer's are not)"
            )))
        }
    })
}

/// Generates the source and the parameters of a registered CUDA C kernel for a plan, and
/// checks what can be checked before compiling: tensor count and rank, scalars, block and
/// grid limits.
pub(crate) fn generate(spec: &PlanSpec<'_>, kernel: &KernelImpl) -> Result<UserKernel> {
    let KernelImpl::CudaC {
        source,
        entry,
        block,
    } = kernel
    else {
        return Err(Error::Internal(format!("{}: not a CUDA C kernel", spec.op)));
    };
    let op = spec.op;
    if block.contains(&0) {
        return Err(Error::BadParam(format!(
            "{op}: block size {block:?} has an empty dimension"
        )));
    }
    let threads = u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2]);
    if threads > 1024 || block[2] > 64 {
        return Err(Error::BadParam(format!(
            "{op}: block size {block:?} exceeds CUDA's limits (at most 1024 threads, z at most 64)"
        )));
    }
    let grid = [0, 1, 2].map(|d| spec.grid[d].div_ceil(block[d]));
    if grid[1] > 65535 || grid[2] > 65535 || grid[0] > i32::MAX as u32 {
        return Err(Error::BadParam(format!(
            "{op}: launch grid {:?} over blocks of {block:?} needs {grid:?} blocks, beyond \
             CUDA's limits (y and z at most 65535)",
            spec.grid
        )));
    }
    if !entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || entry.is_empty() {
        return Err(Error::BadParam(format!(
            "{op}: entry {entry:?} is not a C identifier"
        )));
    }
    let tensors: Vec<_> = spec.inputs.iter().chain(spec.outputs).collect();
    if tensors.len() > MAX_PTRS {
        return Err(Error::BadParam(format!(
            "{op}: a CUDA C kernel takes at most {MAX_PTRS} tensors, got {}",
            tensors.len()
        )));
    }
    if spec.scalars.len() > MAX_SCALARS {
        return Err(Error::BadParam(format!(
            "{op}: a CUDA C kernel takes at most {MAX_SCALARS} scalars, got {}",
            spec.scalars.len()
        )));
    }
    let mut args = Args::new();
    for g in spec.grid {
        args.int(g);
    }
    let mut params = Vec::new();
    let mut pre = String::new();
    for (k, t) in tensors.iter().enumerate() {
        let (shape, strides) = (t.layout.shape(), t.layout.strides());
        if shape.len() > MAX_DIMS {
            return Err(Error::unsupported(
                format!(
                    "{op}: a CUDA C kernel's tensors have at most {MAX_DIMS} dimensions \
                     (tensor {k} has {})",
                    shape.len()
                ),
                DeviceKind::Cuda,
            ));
        }
        let at = args.0.len();
        args.int(shape.len());
        for d in 0..MAX_DIMS {
            args.int(shape.get(d).copied().unwrap_or(1));
        }
        for d in 0..MAX_DIMS {
            args.int(strides.get(d).copied().unwrap_or(0));
        }
        let ty = c_type(t.dtype);
        let input = k < spec.inputs.len();
        params.push(format!("{}{ty} *t{k}", if input { "const " } else { "" }));
        let float = t.dtype.is_float();
        let _ = writeln!(
            pre,
            "#define ndim_t{k}() ((int)unirt_a.w[{at}])\n\
             #define shape_t{k}(d) (unirt_a.w[{} + (d)])\n\
             #define stride_t{k}(d) (unirt_a.w[{} + (d)])\n\
             #define ld_t{k}(i) ({})",
            at + 1,
            at + 1 + MAX_DIMS,
            if float {
                format!("to_f32(t{k}[(i)])")
            } else {
                format!("t{k}[(i)]")
            },
        );
        if !input {
            let _ = writeln!(
                pre,
                "#define st_t{k}(i, v) (t{k}[(i)] = {})",
                if float {
                    format!("from_f32<{ty}>((float)(v))")
                } else {
                    format!("({ty})(v)")
                }
            );
        }
    }
    for (k, a) in spec.scalars.iter().enumerate() {
        let (word, read) = scalar(op, k, a, &format!("unirt_a.w[{}]", args.0.len()))?;
        args.0.push(word);
        let _ = writeln!(pre, "#define arg{k}() {read}");
    }
    debug_assert_eq!(
        args.0.len(),
        tensor_words(tensors.len()) + spec.scalars.len()
    );
    params.push("const unirt_user_args unirt_a".into());
    let words = args.0.len();
    let text = format!(
        "{COMMON}\n// ---- unirt user kernel {op}: prelude\n\
         struct unirt_user_args {{ i64 w[{words}]; }};\n\
         #define UNIRT_PARAMS {}\n\
         #define grid() make_uint3((u32)unirt_a.w[0], (u32)unirt_a.w[1], (u32)unirt_a.w[2])\n\
         {pre}#line 1 \"{op}.cu\"\n{source}\n",
        params.join(", ")
    );
    Ok(UserKernel {
        text,
        args,
        tensors: tensors.len(),
        grid,
        block: *block,
    })
}

/// Whether the compiled image `img` holds the kernel `entry` with `want` bytes of parameters;
/// a typed error saying what is wrong otherwise. A CUBIN states each kernel's parameter size;
/// PTX (a GPU newer than NVRTC knows) declares the parameters as text.
pub(crate) fn check_image(op: &str, img: &[u8], entry: &str, want: u32) -> Result<()> {
    let declare = format!("extern \"C\" __global__ void {entry}(UNIRT_PARAMS)");
    let got = if img.starts_with(b"\x7fELF") {
        super::cubin::param_bytes(img, entry)
    } else {
        ptx_param_bytes(&String::from_utf8_lossy(img), entry)
    };
    match got {
        Some(got) if got == want => Ok(()),
        Some(got) => Err(Error::BadParam(format!(
            "{op}: kernel {entry} takes {got} bytes of parameters, the plan passes {want}: \
             declare it as `{declare}`"
        ))),
        None => Err(Error::BadParam(format!(
            "{op}: the source defines no kernel {entry}: declare it as `{declare}`"
        ))),
    }
}

/// The bytes of `entry`'s parameters in PTX text (each `.param` is a `.u64`/`.b32`/… scalar
/// or an `.align A .b8 name[N]` array, laid out with its alignment).
fn ptx_param_bytes(ptx: &str, entry: &str) -> Option<u32> {
    let start = ptx.find(&format!(".entry {entry}("))?;
    let list = ptx[start..].split_once('(')?.1.split_once(')')?.0;
    let mut bytes = 0u32;
    for p in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let words: Vec<&str> = p.split_whitespace().collect();
        let (size, align) = if let Some(arr) = words.last().and_then(|w| w.split_once('[')) {
            let n: u32 = arr.1.trim_end_matches(']').parse().ok()?;
            let align = words
                .iter()
                .position(|w| *w == ".align")
                .and_then(|i| words.get(i + 1)?.parse().ok())
                .unwrap_or(1);
            (n, align)
        } else {
            let ty = words.get(1)?;
            let bits: u32 = ty
                .trim_start_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .ok()?;
            (bits / 8, bits / 8)
        };
        bytes = bytes.div_ceil(align.max(1)) * align.max(1) + size;
    }
    Some(bytes)
}

/// Prepares a registered CUDA C kernel for a plan: generated, compiled for the device (cached
/// in memory and on disk like unirt's own kernels), its parameters checked against the
/// compiled image, its module loaded and its function fetched — all at plan time.
pub(crate) fn prepare(spec: &PlanSpec<'_>, kernel: &KernelImpl) -> Result<Arc<dyn PreparedKernel>> {
    let KernelImpl::CudaC { entry, .. } = kernel else {
        return Err(Error::Internal(format!("{}: not a CUDA C kernel", spec.op)));
    };
    let user = generate(spec, kernel)?;
    let name = user.cache_name(spec.op);
    let file = format!("{}.cu", spec.op);
    let func = super::prepared::with_backend(spec, |b| -> Result<u64> {
        let nv = super::super::nvrtc::require()?;
        let src = super::cache::Source {
            name: &name,
            file: &file,
            text: &user.text,
        };
        let img = super::cache::image(nv, &src, nv.target_for(b.cc), false)?;
        check_image(spec.op, &img, entry, user.param_bytes())?;
        b.module_function_of(&name, &file, || user.text.clone(), entry)
    })??;
    let mut step = Step::new(entry.to_string(), user.grid, user.block);
    step.ptrs = (0..spec.inputs.len())
        .map(Operand::In)
        .chain((0..spec.outputs.len()).map(|i| Operand::Out(i, 0)))
        .collect();
    step.args = user.args;
    super::prepared::ready(spec.device, vec![(func, step)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::ops::{Params, TensorDesc};
    use crate::tensor::{DType, Layout};
    use crate::vendors::cuda::nvrtc::Target;

    const AFFINE: &str = "
extern \"C\" __global__ void affine(UNIRT_PARAMS) {
    unsigned x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= grid().x || y >= grid().y) return;
    i64 ia = y * stride_t0(0) + x * stride_t0(1);
    i64 io = y * shape_t0(1) + x;
    st_t1(io, ld_t0(ia) * arg0() + (float)arg1() + arg2() + (float)x + (arg3() ? 1.0f : 0.0f));
}
";

    fn spec_with<R>(
        source: &str,
        entry: &str,
        dtype: DType,
        f: impl FnOnce(&PlanSpec<'_>, &KernelImpl) -> R,
    ) -> R {
        let device = Device::new(DeviceKind::Cuda, 0);
        let a = TensorDesc::new(
            device,
            dtype,
            Layout::contiguous(&[7, 5]).transpose(0, 1).unwrap(),
        );
        let o = TensorDesc::new(device, dtype, Layout::contiguous(&[5, 7]));
        let scalars = [
            KernelArg::F32(0.5),
            KernelArg::I64(-3),
            KernelArg::F16(half::f16::from_f32(0.25)),
            KernelArg::Bool(true),
        ];
        let params = Params::None;
        let spec = PlanSpec {
            op: "user_affine",
            device,
            dtype,
            params: &params,
            inputs: std::slice::from_ref(&a),
            outputs: std::slice::from_ref(&o),
            scalars: &scalars,
            grid: [7, 5, 1],
            workspace: 0,
        };
        let k = KernelImpl::CudaC {
            source: source.into(),
            entry: entry.into(),
            block: [8, 8, 1],
        };
        f(&spec, &k)
    }

    /// The generated prelude compiles with NVRTC alone for every architecture CI targets, in
    /// every float dtype, and the compiled kernel takes exactly the parameters the host
    /// passes; a kernel declared with another signature, or a missing entry, is refused.
    #[test]
    fn user_kernels_compile_and_match_their_parameters() {
        let Ok(nv) = crate::vendors::cuda::nvrtc::nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return;
        };
        for dtype in DType::FLOATS {
            let user = spec_with(AFFINE, "affine", dtype, generate).unwrap();
            assert_eq!(user.grid, [1, 1, 1]);
            assert_eq!(user.args.0.len(), tensor_words(2) + 4);
            for arch in [70, 80, 90] {
                let (img, _) = nv
                    .compile("user_affine.cu", &user.text, Target::Cubin(arch))
                    .unwrap_or_else(|e| panic!("{dtype} sm_{arch}: {e}"));
                check_image("user_affine", &img, "affine", user.param_bytes()).unwrap();
                assert!(check_image("user_affine", &img, "nope", user.param_bytes()).is_err());
            }
            let (ptx, _) = nv
                .compile("user_affine.cu", &user.text, Target::Ptx(80))
                .unwrap();
            check_image("user_affine", &ptx, "affine", user.param_bytes()).unwrap();
        }
        let other = AFFINE.replace("affine(UNIRT_PARAMS)", "affine(float *p, int n)");
        let user = spec_with(&other, "affine", DType::F32, generate);
        let compiled = user.and_then(|u| {
            let (img, _) = nv.compile("bad.cu", &u.text, Target::Cubin(80))?;
            check_image("user_affine", &img, "affine", u.param_bytes())
        });
        match compiled {
            Err(Error::BadParam(m)) => assert!(m.contains("UNIRT_PARAMS"), "{m}"),
            // The body no longer compiles against that signature: also refused, typed.
            Err(Error::KernelCompile { .. }) => {}
            other => panic!("a foreign signature: {other:?}"),
        }
        let sig = "extern \"C\" __global__ void wrong(float *p, int n) { p[0] = n; }\n";
        let u = spec_with(sig, "wrong", DType::F32, generate).unwrap();
        let (img, _) = nv.compile("bad.cu", &u.text, Target::Cubin(80)).unwrap();
        match check_image("user_affine", &img, "wrong", u.param_bytes()) {
            Err(Error::BadParam(m)) => assert!(m.contains("12 bytes"), "{m}"),
            other => panic!("a foreign signature: {other:?}"),
        }
    }

    #[test]
    fn launch_limits_and_scalars_are_checked_before_compiling() {
        let bad = |block: [u32; 3]| {
            let k = KernelImpl::CudaC {
                source: AFFINE.into(),
                entry: "affine".into(),
                block,
            };
            spec_with(AFFINE, "affine", DType::F32, |s, _| generate(s, &k))
        };
        assert!(matches!(bad([0, 1, 1]), Err(Error::BadParam(_))));
        assert!(matches!(bad([64, 32, 1]), Err(Error::BadParam(_))));
        assert!(matches!(bad([1, 1, 65]), Err(Error::BadParam(_))));
        assert!(bad([1024, 1, 1]).is_ok());
        assert!(matches!(
            spec_with(AFFINE, "af fine", DType::F32, generate),
            Err(Error::BadParam(_))
        ));
        let (word, read) = scalar("t", 0, &KernelArg::F64(1.5), "w").unwrap();
        assert_eq!(word, 1.5f64.to_bits() as i64);
        assert!(read.contains("double"));
        assert!(scalar("t", 0, &KernelArg::Ptr(crate::hal::DevicePtr(8)), "w").is_err());
    }

    #[test]
    fn ptx_parameter_lists_are_measured_with_alignment() {
        let ptx = ".visible .entry k(\n .param .u64 k_param_0,\n .param .u32 k_param_1,\n \
                   .param .align 8 .b8 k_param_2[24]\n)\n{";
        assert_eq!(ptx_param_bytes(ptx, "k"), Some(8 + 4 + 4 + 24));
        assert_eq!(ptx_param_bytes(ptx, "other"), None);
    }
}
