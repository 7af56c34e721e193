//! The CUDA C kernels, compiled by NVRTC at first use: the HAL's built-in kernels of
//! [`crate::kernel::KERNELS`] (`builtin.cu`, fetched by name) and the operator kernels of
//! [`crate::ops`], one op family per file with the same names as every vendor's kernel files
//! (`elementwise.cu` + `elementwise.rs`, …).
//!
//! An op family's source is generated per dtype from its one template: `common.cuh` (unirt's
//! f16 / bf16 storage types and conversions, layouts, block reductions — no toolkit header is
//! needed), a prelude `typedef <element> T;` + `#define UNIRT_DTYPE_<NAME> 1`, then the
//! family's `.cu` file, whose `extern "C"` entries instantiate C++ templates over `T`. The
//! family's `.rs` file plans the launches ([`prepared::Step`]: entry, grid, block, by-value
//! parameter struct) from the operator's [`PlanSpec`]; [`prepared::prepare`] compiles the
//! source for the device's architecture (cached in memory and on disk, [`cache`]), loads the
//! module and fetches the functions, all at plan time. [`register`] is the one place the CUDA
//! operator kernels enter the [`KernelRegistry`].

mod args;
mod cache;
mod cubin;
mod prepared;

mod attention;
mod cast;
mod elementwise;
mod embedding;
mod fused;
mod matmul;
mod matmul_epilogue;
mod norm;
mod rearrange;
mod reduce;
mod rope;
mod sample;
mod softmax;
mod user;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

pub(crate) use matmul_epilogue::epilogue_workspace as matmul_epilogue_workspace;

use super::nvrtc::{Nvrtc, Target};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::ops::{KernelImpl, KernelRegistry, PlanSpec, PrepareKernel};
use crate::tensor::DType;

/// One kernel's CUDA C source.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// The kernel (and `__global__` function) name, as in [`crate::kernel::KERNELS`].
    pub name: &'static str,
    /// The file under `vendors/cuda/kernels/`.
    pub file: &'static str,
    pub source: &'static str,
}

/// The HAL's built-in kernels.
const BUILTIN: &str = include_str!("builtin.cu");

/// Every HAL kernel, in the order of [`crate::kernel::KERNELS`].
pub const SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "fill",
        file: "builtin.cu",
        source: BUILTIN,
    },
    KernelSource {
        name: "add_f32",
        file: "builtin.cu",
        source: BUILTIN,
    },
];

/// The source of a HAL kernel by name.
pub fn source(name: &str) -> Result<&'static KernelSource> {
    SOURCES
        .iter()
        .find(|k| k.name == name)
        .ok_or_else(|| Error::BadParam(format!("the cuda backend has no kernel {name:?}")))
}

/// The compiled image of a HAL kernel for `target` (see [`cache::image`]).
pub fn image(
    nv: &Nvrtc,
    k: &'static KernelSource,
    target: Target,
    fresh: bool,
) -> Result<Arc<Vec<u8>>> {
    let src = cache::Source {
        name: k.name,
        file: k.file,
        text: k.source,
    };
    cache::image(nv, &src, target, fresh)
}

/// The prelude every op family's source starts with.
const COMMON: &str = include_str!("common.cuh");

/// An operator family's CUDA C template and what it registers.
#[derive(Debug)]
pub struct Family {
    /// The family's name (`src/ops/<name>.rs`, `kernels/<name>.cu`).
    pub name: &'static str,
    /// The template (`kernels/<name>.cu`).
    pub text: &'static str,
    /// The registry operators it implements.
    pub ops: &'static [&'static str],
    /// The dtypes it is generated and registered for.
    pub dtypes: &'static [DType],
    /// Every `extern "C"` entry of the generated source (checked in ahead-of-time builds).
    pub entries: &'static [&'static str],
    /// Plans the launches of one of its operators.
    pub prepare: PrepareKernel,
    /// Every entry's parameters: this many pointers, then one by-value struct of this many
    /// 64-bit words (checked when a step is prepared, and against the CUBIN's own parameter
    /// size in ahead-of-time builds).
    pub params: (usize, usize),
    /// The dtype whose generated source serves `dtype` (dtypes whose kernels are the same
    /// code share one source, one compile and one module).
    pub source_dtype: fn(DType) -> DType,
}

/// Every dtype has its own source.
pub(crate) fn own_source(dtype: DType) -> DType {
    dtype
}

/// Bit-for-bit kernels: one source per element size.
pub(crate) fn by_size(dtype: DType) -> DType {
    match dtype {
        DType::F32 | DType::I32 => DType::I32,
        DType::F16 | DType::BF16 => DType::F16,
        DType::U8 | DType::Bool => DType::U8,
        DType::I64 => DType::I64,
    }
}

/// Every op family.
const FAMILIES: &[&Family] = &[
    &elementwise::FAMILY,
    &cast::FAMILY,
    &rearrange::FAMILY,
    &reduce::FAMILY,
    &softmax::FAMILY,
    &norm::FAMILY,
    &matmul::FAMILY,
    &embedding::FAMILY,
    &rope::FAMILY,
    &attention::FAMILY,
    &sample::FAMILY,
];

/// The float dtypes most families are generated for.
const FLOATS: &[DType] = &DType::FLOATS;

/// The C element type of `dtype` in the generated sources.
fn c_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F16 => "uhalf",
        DType::BF16 => "ubf16",
        DType::I32 => "int",
        DType::I64 => "i64",
        DType::U8 | DType::Bool => "u8",
    }
}

/// `family`'s source generated for `dtype`: the common prelude, the element type, the
/// template.
pub fn op_source(family: &Family, dtype: DType) -> String {
    let dtype = (family.source_dtype)(dtype);
    format!(
        "{COMMON}\n// ---- generated for {dtype}\ntypedef {} T;\n#define UNIRT_DTYPE_{} 1\n#line 1 \"{}.cu\"\n{}",
        c_type(dtype),
        dtype.to_string().to_uppercase(),
        family.name,
        family.text
    )
}

/// The loaded op modules of a device, by source name (`op-<family>-<dtype>` for a family's
/// source, `user-<op>-<hash>` for a user kernel's) → (CUmodule, entry → CUfunction).
pub type OpModules = Mutex<HashMap<String, (u64, HashMap<String, u64>)>>;

/// Prepares a user kernel registered as CUDA C for a plan on a CUDA device.
pub(crate) fn prepare_user(
    spec: &PlanSpec<'_>,
    kernel: &KernelImpl,
) -> Result<Arc<dyn crate::ops::PreparedKernel>> {
    user::prepare(spec, kernel)
}

/// Registers every CUDA operator kernel.
pub(crate) fn register(reg: &mut KernelRegistry) {
    for f in FAMILIES {
        for &op in f.ops {
            for &dt in f.dtypes {
                reg.builtin(
                    op,
                    DeviceKind::Cuda,
                    dt,
                    KernelImpl::Prepared {
                        kind: "cuda-c",
                        prepare: f.prepare,
                    },
                );
            }
        }
    }
    // Generated per program at plan time, not from a family's template (matmul_epilogue's
    // kernels too, registered by the matmul family).
    for &dt in FLOATS {
        reg.builtin(
            crate::ops::fused::FUSED_ELEMENTWISE,
            DeviceKind::Cuda,
            dt,
            KernelImpl::Prepared {
                kind: "cuda-c",
                prepare: fused::prepare,
            },
        );
    }
}

/// The family of a plan's operator, or an internal error (the registry routed it here).
fn unexpected(spec: &PlanSpec<'_>, family: &str) -> Error {
    Error::Internal(format!(
        "{}: not an operator of the CUDA {family} kernels (params {:?})",
        spec.op, spec.params
    ))
}

/// One kernel compiled for one architecture ahead of time.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompiledKernel {
    /// The kernel: a HAL kernel's name, or `<family>/<dtype>:<entry>` for an op kernel.
    pub kernel: String,
    /// `sm_XY`.
    pub arch: String,
    /// The source file under `vendors/cuda/kernels/` it was compiled from.
    pub file: String,
    /// Whether NVRTC produced a CUBIN holding this kernel.
    pub ok: bool,
    /// NVRTC's log (empty when it had nothing to say).
    pub log: String,
    /// Size of the CUBIN in bytes (0 on failure).
    pub bytes: usize,
}

/// A source to compile ahead of time and the kernels it must hold.
struct Unit {
    label: String,
    file: String,
    text: String,
    entries: Vec<String>,
    /// The bytes of every entry's parameters, when known (the op families).
    param_bytes: Option<u32>,
}

fn units() -> Vec<Unit> {
    let mut u = vec![Unit {
        label: String::new(),
        file: "builtin.cu".into(),
        text: BUILTIN.into(),
        entries: SOURCES.iter().map(|k| k.name.to_string()).collect(),
        param_bytes: None,
    }];
    for f in FAMILIES {
        let mut seen = Vec::new();
        for &dt in f.dtypes {
            let dt = (f.source_dtype)(dt);
            if seen.contains(&dt) {
                continue;
            }
            seen.push(dt);
            u.push(Unit {
                label: format!("{}/{dt}:", f.name),
                file: format!("{}.cu", f.name),
                text: op_source(f, dt),
                entries: f.entries.iter().map(|e| e.to_string()).collect(),
                param_bytes: Some(8 * (f.params.0 + f.params.1) as u32),
            });
        }
    }
    // A fused chain's generated source, for a program calling every elementwise function.
    let sample = crate::ops::fused::FusedProgram::every_function();
    for &dt in FLOATS {
        if let Ok(text) = fused::source(&sample, 2, dt) {
            u.push(Unit {
                label: format!("fused_elementwise/{dt}:"),
                file: "fused_elementwise.cu".into(),
                text,
                entries: vec![fused::ENTRY.to_string()],
                param_bytes: Some(fused::param_bytes(&sample, 2)),
            });
        }
    }
    // Both matmul_epilogue kernels, generated for a program reading every extra operand.
    let (sample, extras) = matmul_epilogue::sample_program();
    for &dt in FLOATS {
        for kernel in [
            matmul_epilogue::EpilogueKernel::Gemm,
            matmul_epilogue::EpilogueKernel::Pass,
        ] {
            if let Ok(text) = matmul_epilogue::epilogue_source(&sample, extras, dt, kernel) {
                u.push(Unit {
                    label: format!("matmul_epilogue/{dt}:"),
                    file: "matmul_epilogue.cu".into(),
                    text,
                    entries: vec![kernel.entry().to_string()],
                    param_bytes: Some(kernel.param_bytes(sample.steps.len()) as u32),
                });
            }
        }
    }
    u
}

/// How many kernels an ahead-of-time build compiles per architecture.
pub(crate) fn kernel_count() -> usize {
    units().iter().map(|u| u.entries.len()).sum()
}

/// Compiles every kernel source (the HAL's file, every op family for every dtype) to CUBIN for
/// each `sm_XY` in `archs`, without a GPU and without any cache: the check that the sources
/// are valid CUDA C for those architectures. Sources compile in parallel; each kernel gets a
/// row, which fails when the image does not hold its symbol.
pub(crate) fn compile_all(nv: &Nvrtc, archs: &[u32]) -> Vec<CompiledKernel> {
    let units = units();
    let jobs: Vec<(&Unit, u32)> = archs
        .iter()
        .flat_map(|&a| units.iter().map(move |u| (u, a)))
        .collect();
    crate::host_threads::map(&jobs, |&(u, arch)| {
        let target = Target::Cubin(arch);
        let compiled = nv.compile(&u.file, &u.text, target).map_err(|e| match e {
            Error::KernelCompile { log, .. } => log,
            other => other.to_string(),
        });
        u.entries
            .iter()
            .map(|e| match &compiled {
                Ok((img, log)) => {
                    // A CUBIN is an ELF image whose symbol table names its kernels and
                    // whose `.nv.info.<kernel>` says how many bytes of parameters it takes.
                    let found = img.starts_with(b"\x7fELF")
                        && img.windows(e.len()).any(|w| w == e.as_bytes());
                    let declared = cubin::param_bytes(img, e);
                    let abi = match (u.param_bytes, declared) {
                        (Some(want), Some(got)) if want != got => Some(format!(
                            "the kernel takes {got} bytes of parameters; the host builds {want}"
                        )),
                        (Some(_), None) => {
                            Some("the CUBIN does not state the kernel's parameter size".into())
                        }
                        _ => None,
                    };
                    CompiledKernel {
                        kernel: format!("{}{e}", u.label),
                        arch: target.arch(),
                        file: u.file.clone(),
                        ok: found && abi.is_none(),
                        log: match abi {
                            Some(why) => format!("{why}\n{log}"),
                            None => log.clone(),
                        },
                        bytes: img.len(),
                    }
                }
                Err(log) => CompiledKernel {
                    kernel: format!("{}{e}", u.label),
                    arch: target.arch(),
                    file: u.file.clone(),
                    ok: false,
                    log: log.clone(),
                    bytes: 0,
                },
            })
            .collect::<Vec<_>>()
    })
    .into_iter()
    .flatten()
    .collect()
}

/// Parses `sm_70,sm_80,90` into `[70, 80, 90]`.
pub fn parse_archs(list: &str) -> Result<Vec<u32>> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let digits = s.strip_prefix("sm_").unwrap_or(s);
            digits
                .parse::<u32>()
                .ok()
                .filter(|&v| (10..=200).contains(&v))
                .ok_or_else(|| Error::BadParam(format!("bad architecture {s:?} (expected sm_XY)")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_has_cuda_source() {
        for sig in crate::kernel::KERNELS {
            let k = source(sig.name).unwrap();
            assert!(
                k.source.contains(&format!("void {}(", sig.name)),
                "{}",
                k.file
            );
        }
        assert_eq!(SOURCES.len(), crate::kernel::KERNELS.len());
    }

    /// A compile error is `KernelCompile` carrying NVRTC's log (when NVRTC is installed).
    #[test]
    fn compile_errors_carry_the_log() {
        let Ok(nv) = crate::vendors::cuda::nvrtc::nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return;
        };
        let bad = "extern \"C\" __global__ void broken(int *p) { p[0] = undeclared_name; }";
        match nv.compile("broken.cu", bad, Target::Cubin(80)) {
            Err(Error::KernelCompile { kernel, log }) => {
                assert!(kernel.contains("broken.cu"), "{kernel}");
                assert!(log.contains("undeclared_name"), "{log}");
            }
            other => panic!("expected KernelCompile, got {other:?}"),
        }
        let rows = compile_all(nv, &[80]);
        assert!(rows.iter().all(|r| r.ok && r.bytes > 0), "{rows:?}");
        let rows = compile_all(nv, &[12]);
        assert!(rows.iter().all(|r| !r.ok && !r.log.is_empty()), "{rows:?}");
    }

    /// The memory-bound families read their by-value parameter struct in place. Handing its
    /// address to an out-of-line function once made every thread copy all 344 bytes of it to
    /// local memory, and the elementwise ops ran at a fortieth of an H100's bandwidth; the PTX
    /// shows such a copy as a `__local_depot` the size of the struct. (sin and cos keep the
    /// 28-byte scratch of CUDA's slow argument reduction.)
    #[test]
    fn memory_bound_kernels_use_no_local_memory() {
        let Ok(nv) = crate::vendors::cuda::nvrtc::nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return;
        };
        for family in [
            &elementwise::FAMILY,
            &cast::FAMILY,
            &rearrange::FAMILY,
            &norm::FAMILY,
            &softmax::FAMILY,
        ] {
            for dtype in [DType::F32, DType::BF16] {
                let (ptx, _) = nv
                    .compile(family.name, &op_source(family, dtype), Target::Ptx(80))
                    .unwrap();
                let ptx = String::from_utf8_lossy(&ptx);
                let mut entries = 0;
                for body in ptx.split(".entry ").skip(1) {
                    entries += 1;
                    let name = body.split('(').next().unwrap_or_default();
                    let local: usize = body
                        .split("__local_depot")
                        .skip(1)
                        .filter_map(|d| d.split(['[', ']']).nth(1)?.parse::<usize>().ok())
                        .sum();
                    assert!(
                        local <= 32,
                        "{}/{dtype}: {name} keeps {local} bytes in local memory",
                        family.name
                    );
                }
                assert_eq!(entries, family.entries.len(), "{}", family.name);
            }
        }
    }

    /// Compiles `family` to PTX in f16 and bf16 for sm_80 and sm_90 and checks that each of
    /// `entries` holds every instruction of `needles` and no `__local_depot` (an array in local
    /// memory: indexed by a value the compiler could not unroll).
    fn check_tensor_core_ptx(family: &Family, entries: &[&str], needles: &[&str]) {
        let Ok(nv) = crate::vendors::cuda::nvrtc::nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return;
        };
        for dtype in [DType::F16, DType::BF16] {
            for arch in [80, 90] {
                let (ptx, _) = nv
                    .compile(family.name, &op_source(family, dtype), Target::Ptx(arch))
                    .unwrap();
                let ptx = String::from_utf8_lossy(&ptx);
                for entry in entries {
                    let body = ptx
                        .split(".entry ")
                        .find(|b| b.strip_prefix(entry).is_some_and(|r| r.starts_with('(')))
                        .unwrap_or_else(|| panic!("{entry} in the PTX"));
                    for needle in needles {
                        assert!(
                            body.contains(needle),
                            "{entry} {dtype} sm_{arch}: no {needle}"
                        );
                    }
                    assert!(
                        !body.contains("__local_depot"),
                        "{entry} {dtype} sm_{arch}: an array in local memory"
                    );
                }
            }
        }
    }

    /// The tensor-core flash kernel keeps its Q fragments, scores and accumulators in
    /// registers.
    #[test]
    fn flash_attention_fragments_stay_in_registers() {
        check_tensor_core_ptx(
            &attention::FAMILY,
            &["op_attention_flash", "op_attention_flash_d64"],
            &[
                "mma.sync.aligned.m16n8k16",
                "ldmatrix.sync.aligned.m8n8.x4.trans",
            ],
        );
    }

    /// The tensor-core GEMM (unirt's own, where cuBLAS is absent) keeps its 128 accumulators
    /// and fragments in registers and reads its tiles by ldmatrix after cp.async copies, in
    /// both B layouts.
    #[test]
    fn tensor_core_gemm_stays_in_registers() {
        check_tensor_core_ptx(
            &matmul::FAMILY,
            &["op_matmul_mma"],
            &[
                "mma.sync.aligned.m16n8k16",
                "ldmatrix.sync.aligned.m8n8.x4.trans",
                "ldmatrix.sync.aligned.m8n8.x4.shared",
                "cp.async.cg.shared.global",
            ],
        );
    }

    /// Occupancy without a GPU: the row kernels fit in 64 registers with nothing spilled (at 159
    /// registers `op_rms_norm` held one block per multiprocessor and ran at 0.17× PyTorch on an
    /// H200), and the attention kernels spill nothing. Read from the CUBIN's attributes.
    #[test]
    fn row_and_flash_kernels_keep_their_registers() {
        let Ok(nv) = crate::vendors::cuda::nvrtc::nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return;
        };
        // Per family, the dtypes to build and each entry's register bound: one compile per
        // (family, dtype, architecture) serves all its entries.
        type Bound = (&'static str, u32);
        let (f32_bf16, halves) = (
            &[DType::F32, DType::BF16][..],
            &[DType::F16, DType::BF16][..],
        );
        let cases: [(&Family, &[DType], &[Bound]); 5] = [
            // 128 accumulators a thread; two blocks of 128 threads fit a multiprocessor at
            // any count up to 255, but a spill would sit in the inner loop.
            (&matmul::FAMILY, halves, &[("op_matmul_mma", 255)]),
            (
                &norm::FAMILY,
                f32_bf16,
                &[("op_rms_norm", 64), ("op_layer_norm", 64)],
            ),
            (&softmax::FAMILY, f32_bf16, &[("op_softmax", 64)]),
            (
                &attention::FAMILY,
                halves,
                &[("op_attention_flash", 255), ("op_attention_flash_d64", 255)],
            ),
            (
                &attention::FAMILY,
                f32_bf16,
                &[("op_attention_decode", 128)],
            ),
        ];
        for (family, dtypes, bounds) in cases {
            for &dtype in dtypes {
                for arch in [80, 90] {
                    let (img, _) = nv
                        .compile(family.name, &op_source(family, dtype), Target::Cubin(arch))
                        .unwrap();
                    for &(entry, most) in bounds {
                        let r = cubin::resources(&img, entry).expect("the kernel's resources");
                        assert!(
                            r.registers <= most && r.frame_bytes == 0,
                            "{entry} {dtype} sm_{arch}: {r:?} (at most {most} registers, no spills)"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn arch_lists_parse() {
        assert_eq!(parse_archs("sm_70, sm_80,90").unwrap(), [70, 80, 90]);
        assert!(parse_archs("sm_x").is_err());
    }
}
