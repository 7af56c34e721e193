//! The CPU kernels, run by a stream's worker thread: the HAL's built-in `fill` / `add_f32`
//! (by name, see [`crate::kernel::KERNELS`]) and the operator kernels of [`crate::ops`], one
//! file per operator family with the same names in every vendor. [`register`] is the one
//! place the CPU's operator kernels enter the [`KernelRegistry`].
//!
//! Kernels receive checked launches: every tensor's byte range was checked against the
//! allocation table when the launch was enqueued, and the memory cannot be freed while the
//! stream has not run it (free waits for the device; stream-ordered frees and cached blocks
//! are reused in stream order). That is the safety argument of the raw accesses below.
//! Parallel kernels fork through `util::fork_tasks`: the stream's worker runs tasks itself
//! while rayon's global pool helps. f16 and bf16 compute in f32.

mod attention;
mod cast;
mod elementwise;
mod embedding;
mod fused;
mod gemv;
mod gemv_rows;
mod matmul;
mod norm;
mod rearrange;
mod reduce;
mod rope;
mod sample;
mod sgemm;
mod softmax;
mod util;

pub(crate) use matmul::workspace as matmul_workspace;
pub(crate) use util::{help_open_forks, roomy_stack as can_help_forks};

use crate::error::{Error, Result};
use crate::hal::KernelArg;
use crate::ops::KernelRegistry;

/// Registers every CPU operator kernel.
pub(crate) fn register(reg: &mut KernelRegistry) {
    elementwise::register(reg);
    cast::register(reg);
    rearrange::register(reg);
    reduce::register(reg);
    softmax::register(reg);
    norm::register(reg);
    matmul::register(reg);
    embedding::register(reg);
    fused::register(reg);
    rope::register(reg);
    attention::register(reg);
    sample::register(reg);
}

/// A kernel body: the launch arguments, already checked by [`crate::kernel::check_launch`].
pub(crate) type CpuKernel = fn(&[KernelArg]);

pub(crate) fn lookup(name: &str) -> Result<CpuKernel> {
    match name {
        "fill" => Ok(fill),
        "add_f32" => Ok(add_f32),
        _ => Err(Error::BadParam(format!(
            "the cpu backend has no kernel {name:?}"
        ))),
    }
}

fn ptr_arg(args: &[KernelArg], i: usize) -> u64 {
    match args.get(i) {
        Some(KernelArg::Ptr(p)) => p.0,
        _ => 0,
    }
}

fn u32_arg(args: &[KernelArg], i: usize) -> u32 {
    match args.get(i) {
        Some(KernelArg::U32(v)) => *v,
        _ => 0,
    }
}

fn fill(args: &[KernelArg]) {
    let (dst, value, n) = (
        ptr_arg(args, 0) as *mut u32,
        u32_arg(args, 1),
        u32_arg(args, 2),
    );
    if dst.is_null() {
        return;
    }
    // SAFETY: check_launch verified that [dst, dst + 4n) lies in one live allocation and that
    // dst is 4-byte aligned; the allocation cannot be freed while work on it is pending (free
    // synchronises the device, free_async is ordered after this on the stream).
    let out = unsafe { std::slice::from_raw_parts_mut(dst, n as usize) };
    out.fill(value);
}

fn add_f32(args: &[KernelArg]) {
    let (a, b, out) = (
        ptr_arg(args, 0) as *const f32,
        ptr_arg(args, 1) as *const f32,
        ptr_arg(args, 2) as *mut f32,
    );
    let n = u32_arg(args, 3) as usize;
    if a.is_null() || b.is_null() || out.is_null() {
        return;
    }
    // `out` may alias `a` or `b` (in-place add), so no slices over them: element-wise reads
    // before each write keep that well-defined.
    for i in 0..n {
        // SAFETY: all three ranges of n f32s were bounds- and alignment-checked at launch.
        unsafe { *out.add(i) = *a.add(i) + *b.add(i) };
    }
}
