//! The kernels every backend offers, described once.
//!
//! A kernel is named by a string and has a fixed signature: buffer parameters (with their
//! element size), then scalars, one of which is the element count `n`. Every backend validates
//! a launch through [`check_launch`] before it enqueues anything, so bad arguments are the
//! same typed error on CPU, CUDA and wgpu. The sources live beside each vendor: Rust in
//! `vendors/cpu/kernels.rs`, CUDA C in `vendors/cuda/kernels/`, WGSL in `vendors/wgpu/kernels/`.

use crate::error::{Error, Result};
use crate::hal::{DevicePtr, KernelArg};

/// One parameter of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// A device buffer of `n` elements of `elem_bytes` bytes, aligned to `elem_bytes`.
    Buffer {
        name: &'static str,
        elem_bytes: u64,
        writes: bool,
    },
    U32 {
        name: &'static str,
    },
    F32 {
        name: &'static str,
    },
}

/// A kernel's name and parameters. `count` is the index of the `U32` parameter that gives the
/// number of elements (the launch grid covers `n` work items).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSignature {
    pub name: &'static str,
    pub params: &'static [Param],
    pub count: usize,
    pub doc: &'static str,
}

/// `fill(dst: *u32, value: u32, n: u32)`: `dst[i] = value` for `i < n`.
pub const FILL: KernelSignature = KernelSignature {
    name: "fill",
    params: &[
        Param::Buffer {
            name: "dst",
            elem_bytes: 4,
            writes: true,
        },
        Param::U32 { name: "value" },
        Param::U32 { name: "n" },
    ],
    count: 2,
    doc: "dst[i] = value for i < n (32-bit words)",
};

/// `add_f32(a: *f32, b: *f32, out: *f32, n: u32)`: `out[i] = a[i] + b[i]`; `out` may alias.
pub const ADD_F32: KernelSignature = KernelSignature {
    name: "add_f32",
    params: &[
        Param::Buffer {
            name: "a",
            elem_bytes: 4,
            writes: false,
        },
        Param::Buffer {
            name: "b",
            elem_bytes: 4,
            writes: false,
        },
        Param::Buffer {
            name: "out",
            elem_bytes: 4,
            writes: true,
        },
        Param::U32 { name: "n" },
    ],
    count: 3,
    doc: "out[i] = a[i] + b[i] for i < n (f32)",
};

/// Every kernel, in a stable order.
pub const KERNELS: &[KernelSignature] = &[FILL, ADD_F32];

/// The signature of a kernel by name.
pub fn signature(name: &str) -> Result<&'static KernelSignature> {
    KERNELS.iter().find(|k| k.name == name).ok_or_else(|| {
        Error::BadParam(format!(
            "unknown kernel {name:?} (known: {})",
            KERNELS
                .iter()
                .map(|k| k.name)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

/// A launch that passed [`check_launch`]: the signature, the element count, and every buffer
/// argument with the byte range it touches.
#[derive(Debug, Clone)]
pub struct CheckedLaunch {
    pub signature: &'static KernelSignature,
    pub n: u32,
    pub buffers: Vec<(DevicePtr, u64)>,
}

/// Checks `args` against the kernel's signature: count, kinds, non-null aligned buffers. Every
/// buffer's range `[ptr, ptr + n * elem_bytes)` is then passed to `check_range`, which the
/// backend points at its allocation table.
pub fn check_launch(
    name: &str,
    args: &[KernelArg],
    mut check_range: impl FnMut(DevicePtr, u64) -> Result<()>,
) -> Result<CheckedLaunch> {
    let sig = signature(name)?;
    if args.len() != sig.params.len() {
        return Err(Error::BadParam(format!(
            "kernel {} takes {} arguments, got {}",
            sig.name,
            sig.params.len(),
            args.len()
        )));
    }
    let n = match args[sig.count] {
        KernelArg::U32(n) => n,
        other => {
            return Err(Error::BadParam(format!(
                "kernel {}: the count argument must be u32, got {other:?}",
                sig.name
            )))
        }
    };
    let mut buffers = Vec::new();
    for (i, (p, a)) in sig.params.iter().zip(args).enumerate() {
        match (p, a) {
            (
                Param::Buffer {
                    name, elem_bytes, ..
                },
                KernelArg::Ptr(ptr),
            ) => {
                if ptr.is_null() {
                    return Err(Error::NullPointer(format!(
                        "kernel {} argument {i} ({name})",
                        sig.name
                    )));
                }
                if ptr.0 % elem_bytes != 0 {
                    return Err(Error::BadParam(format!(
                        "kernel {} argument {i} ({name}) at {:#x} is not {elem_bytes}-byte aligned",
                        sig.name, ptr.0
                    )));
                }
                let len = u64::from(n) * elem_bytes;
                if len > 0 {
                    check_range(*ptr, len)?;
                }
                buffers.push((*ptr, len));
            }
            (Param::U32 { .. }, KernelArg::U32(_)) | (Param::F32 { .. }, KernelArg::F32(_)) => {}
            (p, a) => {
                return Err(Error::BadParam(format!(
                    "kernel {} argument {i}: expected {p:?}, got {a:?}",
                    sig.name
                )))
            }
        }
    }
    Ok(CheckedLaunch {
        signature: sig,
        n,
        buffers,
    })
}
