//! Modules and kernels: real images in, CPU twins out.
//!
//! `cuModuleLoadData` accepts what NVRTC produced — a CUBIN (an ELF image for `EM_CUDA`) or
//! NUL-terminated PTX text — and lists the kernels it defines (`.text.<name>` sections of a
//! CUBIN, `.entry <name>` of PTX); anything else is `CUDA_ERROR_INVALID_IMAGE`. Nothing of the
//! image is executed: `cuModuleGetFunction` finds a kernel by name in that list, and a launch
//! runs the CPU twin of unirt's built-in kernel of the same name (`fill`, `add_f32`), reading
//! the arguments through `kernelParams` with the kernel's C signature as CUDA does. A kernel
//! the image defines but that has no twin here is refused at `cuModuleGetFunction` with
//! `CUDA_ERROR_NOT_SUPPORTED` (and a note on stderr): it needs a real GPU.
//!
//! A twin checks what the GPU would trip over: an argument range outside every live
//! allocation is `CUDA_ERROR_ILLEGAL_ADDRESS`, a misaligned element pointer
//! `CUDA_ERROR_MISALIGNED_ADDRESS` — both sticky, reported by a later call, as on a GPU.

use std::ffi::c_void;

use crate::result::*;
use crate::state;

/// The built-in kernels this driver can run on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Twin {
    /// `fill(unsigned *dst, unsigned value, unsigned n)`.
    Fill,
    /// `add_f32(const float *a, const float *b, float *out, unsigned n)`.
    AddF32,
    /// A GEMM queued by the fake cuBLAS (`crate::cublas`); never a module's kernel.
    Gemm,
    /// unirt's elementwise `op_add` operator kernel, f32 only: `(out, in0, in1, in2, Ew)` with
    /// the by-value `Ew` struct of 43 64-bit words (space, four operands' strides, scalar).
    /// Offered only when `UNIRT_FAKECUDA_OP_TWINS=1` (the test that uses it makes only f32
    /// plans): it lets the host side of the operator kernels — module, function, parameter
    /// marshalling, range checks, capture — run end to end without a GPU.
    OpAddF32,
    /// unirt's `op_embedding_i32` / `op_embedding_i64` operator kernels, f32 tables only:
    /// `(out, ids, table, fault, Emb)` with the by-value `Emb` struct of 31 64-bit words (the
    /// ids' space, the ids' and output rows' strides, vocab, dim, table and output strides).
    /// An id outside the table writes zeros and claims the fault word, as the CUDA kernel
    /// does. Offered only with `UNIRT_FAKECUDA_OP_TWINS=1`, like `OpAddF32`.
    OpEmbeddingF32 { wide: bool },
}

/// Words of `op_add`'s `Ew` struct.
const EW_WORDS: usize = 43;

/// Words of `op_embedding_*`'s `Emb` struct.
const EMB_WORDS: usize = 31;

fn op_twins() -> bool {
    std::env::var_os("UNIRT_FAKECUDA_OP_TWINS").is_some_and(|v| v == "1")
}

/// Byte sizes of each twin's parameters, in order.
impl Twin {
    pub fn by_name(name: &str) -> Option<Twin> {
        match name {
            "fill" => Some(Twin::Fill),
            "add_f32" => Some(Twin::AddF32),
            "op_add" if op_twins() => Some(Twin::OpAddF32),
            "op_embedding_i32" if op_twins() => Some(Twin::OpEmbeddingF32 { wide: false }),
            "op_embedding_i64" if op_twins() => Some(Twin::OpEmbeddingF32 { wide: true }),
            _ => None,
        }
    }

    pub fn params(self) -> &'static [usize] {
        match self {
            Twin::Fill => &[8, 4, 4],
            Twin::AddF32 => &[8, 8, 8, 4],
            Twin::Gemm => &[],
            Twin::OpAddF32 => &[8, 8, 8, 8],
            Twin::OpEmbeddingF32 { .. } => &[8, 8, 8, 8],
        }
    }
}

/// A loaded module: the kernel names its image defines.
pub struct Module {
    pub handle: u64,
    pub ctx: u64,
    pub kernels: Vec<String>,
}

/// A kernel of a loaded module.
pub struct Function {
    pub handle: u64,
    pub ctx: u64,
    pub module: u64,
    pub twin: Twin,
}

fn idents_after(text: &[u8], marker: &[u8], stop: impl Fn(u8) -> bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(pos) = text[i..].windows(marker.len()).position(|w| w == marker) {
        let start = i + pos + marker.len();
        let end = text[start..]
            .iter()
            .position(|&b| stop(b))
            .map_or(text.len(), |p| start + p);
        if end > start {
            out.push(String::from_utf8_lossy(&text[start..end]).into_owned());
        }
        i = start;
    }
    out
}

/// The kernel names an image defines, or `INVALID_IMAGE`.
///
/// # Safety
/// `image` must point to a complete image: an ELF file (whose header gives its size) or
/// NUL-terminated text.
pub unsafe fn parse_image(image: *const c_void) -> Result<Vec<String>, CUresult> {
    if image.is_null() {
        return Err(INVALID_VALUE);
    }
    let p = image as *const u8;
    // SAFETY: every image starts with at least 4 readable bytes (ELF magic or text + NUL);
    // reads stop at the first NUL for text.
    let head = unsafe { std::slice::from_raw_parts(p, 4) };
    if head == b"\x7fELF" {
        // SAFETY: an ELF64 header is 64 bytes; e_shoff (0x28), e_shentsize (0x3a), e_shnum
        // (0x3c) give the extent of the section header table, which ends the file for NVRTC's
        // images (sections precede it).
        let hdr = unsafe { std::slice::from_raw_parts(p, 64) };
        let machine = u16::from_le_bytes([hdr[18], hdr[19]]);
        if hdr[4] != 2 || machine != 190 {
            return Err(INVALID_IMAGE);
        }
        let shoff = u64::from_le_bytes(hdr[0x28..0x30].try_into().map_err(|_| INVALID_IMAGE)?);
        let shentsize = u16::from_le_bytes([hdr[0x3a], hdr[0x3b]]) as u64;
        let shnum = u16::from_le_bytes([hdr[0x3c], hdr[0x3d]]) as u64;
        let len = shoff
            .checked_add(shentsize * shnum)
            .filter(|l| (64..(1 << 30)).contains(l))
            .ok_or(INVALID_IMAGE)?;
        // SAFETY: the image is `len` bytes long (its own header says so).
        let all = unsafe { std::slice::from_raw_parts(p, len as usize) };
        let names = idents_after(all, b".text.", |b| b == 0);
        return if names.is_empty() {
            Err(INVALID_IMAGE)
        } else {
            Ok(names)
        };
    }
    // SAFETY: not ELF, so NUL-terminated text (the caller's contract).
    let text = unsafe { std::ffi::CStr::from_ptr(p as *const std::ffi::c_char) }.to_bytes();
    if !text.windows(8).any(|w| w == b".version") || !text.windows(7).any(|w| w == b".target") {
        return Err(INVALID_IMAGE);
    }
    let names = idents_after(text, b".entry ", |b| {
        !(b.is_ascii_alphanumeric() || b == b'_' || b == b'$')
    });
    if names.is_empty() {
        return Err(INVALID_IMAGE);
    }
    Ok(names)
}

/// Reads a launch's arguments through `kernelParams` (one pointer per parameter).
///
/// # Safety
/// `params` must hold one valid pointer per parameter of `twin`, each to a value of its size.
pub unsafe fn read_args(twin: Twin, params: *mut *mut c_void) -> Result<Vec<u64>, CUresult> {
    if params.is_null() {
        return Err(INVALID_VALUE);
    }
    let mut out = Vec::new();
    for (i, &size) in twin.params().iter().enumerate() {
        // SAFETY: the caller's contract: params[i] points to a value of `size` bytes.
        let v = unsafe {
            let a = *params.add(i);
            if a.is_null() {
                return Err(INVALID_VALUE);
            }
            match size {
                8 => (a as *const u64).read_unaligned(),
                _ => (a as *const u32).read_unaligned() as u64,
            }
        };
        out.push(v);
    }
    let words = match twin {
        Twin::OpAddF32 => EW_WORDS,
        Twin::OpEmbeddingF32 { .. } => EMB_WORDS,
        _ => 0,
    };
    if words > 0 {
        // SAFETY: the caller's contract: the fifth parameter points to the by-value struct.
        let st = unsafe { *params.add(4) } as *const u64;
        if st.is_null() {
            return Err(INVALID_VALUE);
        }
        for w in 0..words {
            // SAFETY: the struct holds `words` words.
            out.push(unsafe { st.add(w).read_unaligned() });
        }
    }
    Ok(out)
}

/// A device range of `n` 4-byte elements as a host pointer, keeping its buffer alive.
fn elems(
    addr: u64,
    n: u64,
    keep: &mut Vec<std::sync::Arc<state::DevBuf>>,
) -> Result<*mut u32, CUresult> {
    if !addr.is_multiple_of(4) {
        return Err(MISALIGNED_ADDRESS);
    }
    let g = state::lock();
    let d = g.as_ref().ok_or(ILLEGAL_ADDRESS)?;
    let (buf, off) = d.resolve(addr, n * 4).ok_or(ILLEGAL_ADDRESS)?;
    // SAFETY: off + 4n is within the buffer (resolve checked it).
    let p = unsafe { buf.ptr().add(off) } as *mut u32;
    keep.push(buf);
    Ok(p)
}

/// Runs a twin; an error is the device fault it would raise.
pub fn run(twin: Twin, args: &[u64]) -> Result<(), CUresult> {
    let mut keep = Vec::new();
    match twin {
        Twin::Fill => {
            let n = args[2] as u32 as u64;
            if n == 0 {
                return Ok(());
            }
            let dst = elems(args[0], n, &mut keep)?;
            let value = args[1] as u32;
            for i in 0..n as usize {
                // SAFETY: i < n and the range holds n elements.
                unsafe { dst.add(i).write_unaligned(value) };
            }
        }
        Twin::Gemm => return crate::cublas::run_gemm(args),
        Twin::OpAddF32 => return op_add_f32(args),
        Twin::OpEmbeddingF32 { wide } => return op_embedding_f32(args, wide),
        Twin::AddF32 => {
            let n = args[3] as u32 as u64;
            if n == 0 {
                return Ok(());
            }
            let a = elems(args[0], n, &mut keep)? as *const f32;
            let b = elems(args[1], n, &mut keep)? as *const f32;
            let out = elems(args[2], n, &mut keep)? as *mut f32;
            for i in 0..n as usize {
                // SAFETY: i < n and each range holds n elements; each element is read before
                // it is written, as one GPU thread does (out may alias a or b).
                unsafe {
                    let v = a.add(i).read_unaligned() + b.add(i).read_unaligned();
                    out.add(i).write_unaligned(v);
                }
            }
        }
    }
    Ok(())
}

/// The element offset of point `i` of a space (`dims`, outermost first) under `strides`.
fn offset_in(i: i64, dims: &[u64], strides: &[u64]) -> i64 {
    let mut rest = i;
    let mut off = 0;
    for d in (0..dims.len()).rev() {
        let size = dims[d] as i64;
        off += (rest % size) * strides[d] as i64;
        rest /= size;
    }
    off
}

/// `op_embedding_i32` / `_i64` for f32 tables (see `Twin::OpEmbeddingF32`).
fn op_embedding_f32(args: &[u64], wide: bool) -> Result<(), CUresult> {
    let (ptrs, emb) = args.split_at(4);
    if emb.len() != EMB_WORDS {
        return Err(INVALID_VALUE);
    }
    let (nd, n) = (emb[0] as usize, emb[1] as i64);
    if nd > 8 {
        return Err(INVALID_VALUE);
    }
    let dims = &emb[2..2 + nd];
    let (sid, so) = (&emb[10..10 + nd], &emb[18..18 + nd]);
    let [vocab, dim, t0, t1, ost] = [emb[26], emb[27], emb[28], emb[29], emb[30]].map(|w| w as i64);
    let g = state::lock();
    let d = g.as_ref().ok_or(ILLEGAL_ADDRESS)?;
    let at = |base: u64, off: i64, size: u64| -> Result<*mut u8, CUresult> {
        let addr = (base as i64 + off * size as i64) as u64;
        let (buf, o) = d.resolve(addr, size).ok_or(ILLEGAL_ADDRESS)?;
        // SAFETY: o + size is within the buffer (resolve checked it), alive while the lock is
        // held.
        Ok(unsafe { buf.ptr().add(o) })
    };
    for i in 0..n {
        let ip = at(ptrs[1], offset_in(i, dims, sid), if wide { 8 } else { 4 })?;
        // SAFETY: `ip` addresses one id of the ids' dtype inside a live allocation.
        let id = unsafe {
            if wide {
                (ip as *const i64).read_unaligned()
            } else {
                i64::from((ip as *const i32).read_unaligned())
            }
        };
        let orow = offset_in(i, dims, so);
        for j in 0..dim {
            let y = at(ptrs[0], orow + j * ost, 4)? as *mut f32;
            if id < 0 || id >= vocab {
                // SAFETY: `y` addresses one f32 of the output inside a live allocation.
                unsafe { y.write_unaligned(0.0) };
                if j == 0 {
                    let f = at(ptrs[3], 0, 16)? as *mut u32;
                    // SAFETY: the fault word is 16 bytes inside a live allocation; the twin
                    // runs alone on the stream's worker, so the claim needs no atomics.
                    unsafe {
                        if f.read_unaligned() == 0 {
                            f.write_unaligned(1);
                            f.add(1).write_unaligned(id as u64 as u32);
                            f.add(2).write_unaligned(((id as u64) >> 32) as u32);
                        }
                    }
                }
                continue;
            }
            let x = at(ptrs[2], id * t0 + j * t1, 4)? as *const f32;
            // SAFETY: both address one f32 inside live allocations (checked by `at`).
            unsafe { y.write_unaligned(x.read_unaligned()) };
        }
    }
    Ok(())
}

/// `op_add` for f32 over unirt's iteration space (see `Twin::OpAddF32`).
fn op_add_f32(args: &[u64]) -> Result<(), CUresult> {
    let (ptrs, ew) = args.split_at(4);
    if ew.len() != EW_WORDS {
        return Err(INVALID_VALUE);
    }
    let (nd, n) = (ew[0] as usize, ew[1] as i64);
    if nd > 8 {
        return Err(INVALID_VALUE);
    }
    let dims = &ew[2..10];
    let strides = |op: usize| &ew[10 + 8 * op..18 + 8 * op];
    let g = state::lock();
    let d = g.as_ref().ok_or(ILLEGAL_ADDRESS)?;
    let at = |base: u64, off: i64| -> Result<*mut f32, CUresult> {
        let addr = (base as i64 + off * 4) as u64;
        let (buf, o) = d.resolve(addr, 4).ok_or(ILLEGAL_ADDRESS)?;
        // SAFETY: o + 4 is within the buffer (resolve checked it), alive while the lock is held.
        Ok(unsafe { buf.ptr().add(o) } as *mut f32)
    };
    for i in 0..n {
        let mut offs = [0i64; 3];
        let mut rest = i;
        for dim in (0..nd).rev() {
            let size = dims[dim] as i64;
            let idx = rest % size;
            rest /= size;
            for (op, o) in offs.iter_mut().enumerate() {
                *o += idx * strides(op)[dim] as i64;
            }
        }
        // SAFETY: each pointer addresses one f32 inside a live allocation (checked by `at`).
        unsafe {
            let v = at(ptrs[1], offs[1])?.read_unaligned() + at(ptrs[2], offs[2])?.read_unaligned();
            at(ptrs[0], offs[0])?.write_unaligned(v);
        }
    }
    Ok(())
}
