//! cuBLAS, loaded at run time when installed, for matmul: found by
//! [`super::loader::find_cublas`] (the NVRTC places plus Python's `nvidia/cublas/lib` wheels;
//! `UNIRT_CUBLAS_LIBRARY` overrides), the few entry points unirt calls resolved here, every one
//! before use — a library lacking one is reported as unusable, never called. Without it,
//! matmul runs the NVRTC kernels (`kernels/matmul.cu`).
//!
//! A handle is made per device (in its primary context) when a matmul is first planned, with
//! a workspace of its own set through `cublasSetWorkspace_v2`, so a GEMM never allocates and
//! can be captured into a CUDA graph. Calls on one handle are serialised (the stream is set
//! per call). f32 GEMMs compute in f32 (TF32 off unless `UNIRT_CUDA_TF32=1`); f16 / bf16
//! accumulate in f32.

use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

use libloading::Library;

use super::loader;
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::tensor::DType;

type Status = c_int;
type Handle = *mut c_void;

const SUCCESS: Status = 0;
/// `cublasOperation_t`.
pub const OP_N: c_int = 0;
pub const OP_T: c_int = 1;
/// `cudaDataType_t`.
const R_32F: c_int = 0;
const R_16F: c_int = 2;
const R_16BF: c_int = 14;
/// `cublasComputeType_t`: f32 accumulation, no TF32.
const COMPUTE_32F: c_int = 68;
/// `cublasComputeType_t`: f32 GEMMs on TF32 tensor cores (f32 accumulation).
const COMPUTE_32F_FAST_TF32: c_int = 77;

/// Whether f32 GEMMs may use TF32 tensor cores (`UNIRT_CUDA_TF32=1`; off by default, as
/// PyTorch's `allow_tf32` for matmul).
pub fn tf32() -> bool {
    static TF32: OnceLock<bool> = OnceLock::new();
    *TF32.get_or_init(|| std::env::var_os("UNIRT_CUDA_TF32").is_some_and(|v| v == "1"))
}
/// `CUBLAS_GEMM_DEFAULT`.
const GEMM_DEFAULT: c_int = -1;

/// Bytes of workspace given to each handle (cuBLAS's recommendation for Hopper is 32 MiB).
pub const WORKSPACE: usize = 32 << 20;

#[allow(non_snake_case)]
struct Api {
    cublasCreate_v2: unsafe extern "C" fn(*mut Handle) -> Status,
    cublasDestroy_v2: unsafe extern "C" fn(Handle) -> Status,
    cublasSetStream_v2: unsafe extern "C" fn(Handle, *mut c_void) -> Status,
    cublasSetWorkspace_v2: unsafe extern "C" fn(Handle, *mut c_void, usize) -> Status,
    #[allow(clippy::type_complexity)]
    cublasGemmStridedBatchedEx: unsafe extern "C" fn(
        Handle,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
        *const c_void,
        *const c_void,
        c_int,
        c_int,
        i64,
        *const c_void,
        c_int,
        c_int,
        i64,
        *const c_void,
        *mut c_void,
        c_int,
        c_int,
        i64,
        c_int,
        c_int,
        c_int,
    ) -> Status,
}

macro_rules! sym {
    ($lib:expr, $name:ident) => {
        // SAFETY: the declared type is cublas_api.h's prototype for the symbol; the pointer
        // is used only while the 'static `Library` lives.
        *unsafe { $lib.get(concat!(stringify!($name), "\0").as_bytes()) }
            .map_err(|e| format!("it lacks {} ({e})", stringify!($name)))?
    };
}

impl Api {
    fn load(lib: &Library) -> std::result::Result<Api, String> {
        Ok(Api {
            cublasCreate_v2: sym!(lib, cublasCreate_v2),
            cublasDestroy_v2: sym!(lib, cublasDestroy_v2),
            cublasSetStream_v2: sym!(lib, cublasSetStream_v2),
            cublasSetWorkspace_v2: sym!(lib, cublasSetWorkspace_v2),
            cublasGemmStridedBatchedEx: sym!(lib, cublasGemmStridedBatchedEx),
        })
    }
}

/// The process's cuBLAS.
pub struct Cublas {
    api: Api,
    /// Where it was loaded from.
    pub path: PathBuf,
    _lib: Library,
}

/// cuBLAS, loaded once; `Err` is why it is not used (not found, or unusable).
pub fn cublas() -> std::result::Result<&'static Cublas, String> {
    static BLAS: OnceLock<std::result::Result<Cublas, String>> = OnceLock::new();
    BLAS.get_or_init(|| {
        if std::env::var_os("UNIRT_CUDA_BLAS").is_some_and(|v| v == "0" || v == "off") {
            return Err("disabled by UNIRT_CUDA_BLAS=off".into());
        }
        let (lib, path) = loader::open_first("cuBLAS", &loader::find_cublas())?;
        let api = Api::load(&lib)
            .map_err(|e| format!("cuBLAS at {} is unusable: {e}", path.display()))?;
        Ok(Cublas {
            api,
            path,
            _lib: lib,
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// One line for `unirt devices`: which BLAS matmul uses, or why none.
pub fn summary() -> String {
    match cublas() {
        Ok(b) => format!(
            "cuBLAS at {} (f32 GEMM: TF32 {})",
            b.path.display(),
            if tf32() {
                "on, UNIRT_CUDA_TF32=1"
            } else {
                "off"
            }
        ),
        Err(why) => format!("none, matmul uses unirt's NVRTC kernels ({why})"),
    }
}

fn fail(call: &str, status: Status) -> Error {
    Error::Driver {
        backend: DeviceKind::Cuda,
        call: call.into(),
        code: Some(status),
        message: format!("cublasStatus_t {status}"),
    }
}

fn check(call: &str, status: Status) -> Result<()> {
    if status == SUCCESS {
        Ok(())
    } else {
        Err(fail(call, status))
    }
}

/// The `cudaDataType_t` of a matmul dtype.
pub fn data_type(dtype: DType) -> Option<c_int> {
    match dtype {
        DType::F32 => Some(R_32F),
        DType::F16 => Some(R_16F),
        DType::BF16 => Some(R_16BF),
        _ => None,
    }
}

/// A column-major strided-batched GEMM, `C = alpha·op(A)·op(B) + beta·C`, as cuBLAS takes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    pub trans_a: c_int,
    pub trans_b: c_int,
    pub m: c_int,
    pub n: c_int,
    pub k: c_int,
    pub lda: c_int,
    pub ldb: c_int,
    pub ldc: c_int,
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
    pub batch: c_int,
    pub dtype: c_int,
    pub alpha: f32,
    pub beta: f32,
}

impl Cublas {
    /// A handle in the current context with `workspace` (device memory of [`WORKSPACE`]
    /// bytes that outlives the handle) set.
    ///
    /// # Safety
    /// A context is current on this thread; `workspace` is such an allocation.
    pub unsafe fn create(&self, workspace: u64) -> Result<u64> {
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("cublasCreate_v2", unsafe {
            (self.api.cublasCreate_v2)(&mut h)
        })?;
        // SAFETY: h was just created; the workspace is the caller's contract.
        let set =
            unsafe { (self.api.cublasSetWorkspace_v2)(h, workspace as *mut c_void, WORKSPACE) };
        if set != SUCCESS {
            // SAFETY: created above, never handed out: destroyed once.
            unsafe { (self.api.cublasDestroy_v2)(h) };
            return Err(fail("cublasSetWorkspace_v2", set));
        }
        Ok(h as u64)
    }

    /// # Safety
    /// `handle` is live and destroyed once, after its last GEMM was enqueued.
    pub unsafe fn destroy(&self, handle: u64) {
        // SAFETY: the caller's contract.
        unsafe { (self.api.cublasDestroy_v2)(handle as Handle) };
    }

    /// Enqueues `g` on `stream`.
    ///
    /// # Safety
    /// `handle` is live and used by no other thread during the call; `stream` is a live stream
    /// of the handle's context; `a`, `b`, `c` address device ranges (bounds-checked) holding
    /// the matrices `g` describes, allocated until the GEMM has run.
    pub unsafe fn gemm(
        &self,
        handle: u64,
        stream: u64,
        g: &Gemm,
        a: u64,
        b: u64,
        c: u64,
    ) -> Result<()> {
        let h = handle as Handle;
        // SAFETY: live handle and stream (the caller's contract).
        check("cublasSetStream_v2", unsafe {
            (self.api.cublasSetStream_v2)(h, stream as *mut c_void)
        })?;
        // SAFETY: the caller's contract; alpha and beta are host f32s (the default pointer
        // mode) that outlive the call.
        check("cublasGemmStridedBatchedEx", unsafe {
            (self.api.cublasGemmStridedBatchedEx)(
                h,
                g.trans_a,
                g.trans_b,
                g.m,
                g.n,
                g.k,
                &g.alpha as *const f32 as *const c_void,
                a as *const c_void,
                g.dtype,
                g.lda,
                g.stride_a,
                b as *const c_void,
                g.dtype,
                g.ldb,
                g.stride_b,
                &g.beta as *const f32 as *const c_void,
                c as *mut c_void,
                g.dtype,
                g.ldc,
                g.stride_c,
                g.batch,
                if g.dtype == R_32F && tf32() {
                    COMPUTE_32F_FAST_TF32
                } else {
                    COMPUTE_32F
                },
                GEMM_DEFAULT,
            )
        })
    }
}
