//! The kernels of [`crate::kernel::KERNELS`] in Rust, run by a stream's worker thread.

use crate::error::{Error, Result};
use crate::hal::KernelArg;

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
