//! A fake cuBLAS in the same library, for the CUDA backend's BLAS path in CI: point
//! `UNIRT_CUBLAS_LIBRARY` at this library and unirt loads its `cublas*` entry points as it
//! would a real libcublas. `cublasGemmStridedBatchedEx` (f32, f16, bf16; f32 compute) is queued
//! on the handle's stream like a kernel and computed on the CPU when the stream gets there, so
//! matmul results are checked against the reference as on a GPU. `unirt_fakecublas_gemms`
//! counts the GEMMs enqueued.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::api_stream::run;
use crate::capture::{submit, target};
use crate::exec::Op;
use crate::kernels::Twin;
use crate::result::*;
use crate::state::with_ctx;

const STATUS_SUCCESS: c_int = 0;
const STATUS_NOT_INITIALIZED: c_int = 1;
const STATUS_INVALID_VALUE: c_int = 7;
const STATUS_EXECUTION_FAILED: c_int = 13;
const STATUS_NOT_SUPPORTED: c_int = 15;

static GEMMS: AtomicU64 = AtomicU64::new(0);

/// How many GEMMs were enqueued.
#[no_mangle]
pub extern "C" fn unirt_fakecublas_gemms() -> u64 {
    GEMMS.load(Ordering::SeqCst)
}

struct FakeHandle {
    stream: u64,
}

#[no_mangle]
pub unsafe extern "C" fn cublasCreate_v2(h: *mut *mut c_void) -> c_int {
    if h.is_null() {
        return STATUS_INVALID_VALUE;
    }
    let b = Box::new(FakeHandle { stream: 0 });
    // SAFETY: non-null, valid for a write (the caller's contract).
    unsafe { *h = Box::into_raw(b) as *mut c_void };
    STATUS_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasDestroy_v2(h: *mut c_void) -> c_int {
    if h.is_null() {
        return STATUS_NOT_INITIALIZED;
    }
    // SAFETY: made by cublasCreate_v2, destroyed once (the caller's contract).
    drop(unsafe { Box::from_raw(h as *mut FakeHandle) });
    STATUS_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetStream_v2(h: *mut c_void, s: *mut c_void) -> c_int {
    if h.is_null() {
        return STATUS_NOT_INITIALIZED;
    }
    // SAFETY: a live handle (the caller's contract).
    unsafe { (*(h as *mut FakeHandle)).stream = s as u64 };
    STATUS_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetWorkspace_v2(
    h: *mut c_void,
    _p: *mut c_void,
    _n: usize,
) -> c_int {
    if h.is_null() {
        STATUS_NOT_INITIALIZED
    } else {
        STATUS_SUCCESS
    }
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasGemmStridedBatchedEx(
    h: *mut c_void,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: *const c_void,
    atype: c_int,
    lda: c_int,
    stride_a: i64,
    b: *const c_void,
    btype: c_int,
    ldb: c_int,
    stride_b: i64,
    beta: *const c_void,
    c: *mut c_void,
    ctype: c_int,
    ldc: c_int,
    stride_c: i64,
    batch: c_int,
    compute: c_int,
    _algo: c_int,
) -> c_int {
    if h.is_null() {
        return STATUS_NOT_INITIALIZED;
    }
    if alpha.is_null() || beta.is_null() || m < 0 || n < 0 || k < 0 || batch < 0 {
        return STATUS_INVALID_VALUE;
    }
    let rows = |t: c_int, r: c_int, c2: c_int| if t == 0 { r } else { c2 };
    if lda < rows(transa, m, k).max(1) || ldb < rows(transb, k, n).max(1) || ldc < m.max(1) {
        return STATUS_INVALID_VALUE;
    }
    if atype != btype
        || atype != ctype
        || ![0, 2, 14].contains(&atype)
        || ![68, 77].contains(&compute)
    {
        return STATUS_NOT_SUPPORTED;
    }
    // SAFETY: a live handle; alpha and beta point to host f32s (compute type 32F).
    let (stream, al, be) = unsafe {
        (
            (*(h as *const FakeHandle)).stream,
            *(alpha as *const f32),
            *(beta as *const f32),
        )
    };
    let args = vec![
        transa as u64,
        transb as u64,
        m as u64,
        n as u64,
        k as u64,
        al.to_bits() as u64,
        a as u64,
        lda as u64,
        stride_a as u64,
        b as u64,
        ldb as u64,
        stride_b as u64,
        be.to_bits() as u64,
        c as u64,
        ldc as u64,
        stride_c as u64,
        batch as u64,
        atype as u64,
    ];
    let r = entry("cublasGemmStridedBatchedEx", || {
        run(with_ctx(|d, ctx| {
            let t = target(d, stream, "cublasGemmStridedBatchedEx")?;
            let op = Op::Kernel {
                twin: Twin::Gemm,
                args,
            };
            Ok((submit(d, &t, vec![op], false)?, ctx.clone()))
        }))
    });
    if r != SUCCESS {
        return STATUS_EXECUTION_FAILED;
    }
    GEMMS.fetch_add(1, Ordering::SeqCst);
    STATUS_SUCCESS
}

fn f16_to_f32(h: u16) -> f32 {
    let (sign, exp, man) = (
        (h >> 15) as u32,
        ((h >> 10) & 0x1f) as u32,
        (h & 0x3ff) as u32,
    );
    let bits = match (exp, man) {
        (0, 0) => sign << 31,
        (0, _) => {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            (sign << 31) | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
        (31, _) => (sign << 31) | 0x7f80_0000 | (man << 13),
        _ => (sign << 31) | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

fn f32_to_f16(f: f32) -> u16 {
    // Through f64 arithmetic: round to the nearest f16 value, ties to even.
    let x = f as f64;
    if x.is_nan() {
        return 0x7e00;
    }
    let sign = if x.is_sign_negative() { 0x8000u16 } else { 0 };
    let a = x.abs();
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    if a < 2f64.powi(-24) * 0.5 {
        return sign;
    }
    let e = a.log2().floor().max(-14.0) as i32;
    let q = 2f64.powi(e - 10);
    let m = (a / q).round_ties_even();
    let (e, m) = if m >= 2048.0 {
        (e + 1, m / 2.0)
    } else {
        (e, m)
    };
    if m < 1024.0 {
        return sign | m as u16; // subnormal
    }
    sign | (((e + 15) as u16) << 10) | ((m as u16) & 0x3ff)
}

fn bf16_round(f: f32) -> u16 {
    let u = f.to_bits();
    if f.is_nan() {
        return ((u >> 16) | 0x40) as u16;
    }
    ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// Runs a queued GEMM (column-major, cuBLAS's rule); an error is the device fault.
pub fn run_gemm(args: &[u64]) -> Result<(), CUresult> {
    let [ta, tb, m, n, k, al, a, lda, sa, b, ldb, sb, be, c, ldc, sc, batch, ty] = args else {
        return Err(INVALID_VALUE);
    };
    let (m, n, k, batch) = (*m as usize, *n as usize, *k as usize, *batch as usize);
    let (lda, ldb, ldc) = (*lda as usize, *ldb as usize, *ldc as usize);
    let (sa, sb, sc) = (*sa as i64, *sb as i64, *sc as i64);
    let (alpha, beta) = (f32::from_bits(*al as u32), f32::from_bits(*be as u32));
    let size = if *ty == 0 { 4 } else { 2 };
    let g = crate::state::lock();
    let d = g.as_ref().ok_or(ILLEGAL_ADDRESS)?;
    let at = |base: u64, stride: i64, z: usize, i: usize| -> Result<*mut u8, CUresult> {
        let addr = (base as i64 + (stride * z as i64 + i as i64) * size as i64) as u64;
        let (buf, off) = d.resolve(addr, size as u64).ok_or(ILLEGAL_ADDRESS)?;
        // SAFETY: off + size is within the buffer (resolve checked it); the buffer lives as
        // long as the driver state we hold locked.
        Ok(unsafe { buf.ptr().add(off) })
    };
    // SAFETY (reads and writes below): each pointer addresses `size` bytes inside a live
    // allocation (checked by `at`).
    let read = |p: *mut u8| unsafe {
        match ty {
            0 => (p as *const f32).read_unaligned(),
            2 => f16_to_f32((p as *const u16).read_unaligned()),
            _ => f32::from_bits(((p as *const u16).read_unaligned() as u32) << 16),
        }
    };
    let write = |p: *mut u8, v: f32| unsafe {
        match ty {
            0 => (p as *mut f32).write_unaligned(v),
            2 => (p as *mut u16).write_unaligned(f32_to_f16(v)),
            _ => (p as *mut u16).write_unaligned(bf16_round(v)),
        }
    };
    for z in 0..batch {
        for j in 0..n {
            for i in 0..m {
                let mut acc = 0f32;
                for l in 0..k {
                    let ai = if *ta == 0 { i + l * lda } else { l + i * lda };
                    let bi = if *tb == 0 { l + j * ldb } else { j + l * ldb };
                    acc += read(at(*a, sa, z, ai)?) * read(at(*b, sb, z, bi)?);
                }
                let p = at(*c, sc, z, i + j * ldc)?;
                let old = if beta != 0.0 { beta * read(p) } else { 0.0 };
                write(p, alpha * acc + old);
            }
        }
    }
    Ok(())
}
