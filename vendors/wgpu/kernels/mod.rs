//! The wgpu backend's kernels: the HAL's fixed kernels (`fixed.rs`) and the operator kernels
//! of [`crate::ops`], one file per operator family with the same names as `src/ops/` and the
//! other vendors. Each family generates its WGSL from one template per kernel, with the
//! per-dtype loads and stores of [`wgsl::prelude`], and prepares it per plan through
//! [`op::prepare`]. [`register`] is the one place the wgpu operator kernels enter the
//! [`KernelRegistry`].

mod attention;
mod cast;
mod elementwise;
mod embedding;
mod fixed;
mod fused;
mod matmul;
mod matmul_large;
mod norm;
mod op;
mod rearrange;
mod reduce;
mod rope;
mod sample;
mod softmax;
mod textures;
mod user;
mod wgsl;

pub(crate) use fixed::*;
pub(crate) use user::prepare as prepare_user;

use crate::device::DeviceKind;
use crate::ops::{KernelImpl, KernelRegistry, PrepareKernel};
use crate::tensor::DType;

/// Registers `prepare` for `op` in each of `dtypes`.
fn reg_all(reg: &mut KernelRegistry, op: &str, dtypes: &[DType], prepare: PrepareKernel) {
    for &d in dtypes {
        reg.builtin(
            op,
            DeviceKind::Wgpu,
            d,
            KernelImpl::Prepared {
                kind: "wgsl",
                prepare,
            },
        );
    }
}

/// Whether the plan's device emulates a GPU on the host's cores (lavapipe, llvmpipe), where
/// some families take a barrier-free form. `UNIRT_WGPU_GPU_FORMS=1` makes every adapter take
/// the GPU forms, so that CI checks them on the Mesa adapters too.
fn on_host_cores(spec: &crate::ops::PlanSpec<'_>) -> bool {
    static GPU_FORMS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *GPU_FORMS.get_or_init(|| std::env::var("UNIRT_WGPU_GPU_FORMS").is_ok_and(|v| v == "1")) {
        return false;
    }
    crate::Runtime::get(spec.device)
        .map(|rt| {
            crate::hal::Backend::info(&**rt.backend()).class == crate::device::DeviceClass::Software
        })
        .unwrap_or(false)
}

/// The float dtypes (f16 and bf16 stored 16-bit, computed in f32).
const FLOATS: &[DType] = &DType::FLOATS;

/// Registers every wgpu operator kernel.
pub(crate) fn register(reg: &mut KernelRegistry) {
    elementwise::register(reg);
    fused::register(reg);
    cast::register(reg);
    rearrange::register(reg);
    reduce::register(reg);
    softmax::register(reg);
    norm::register(reg);
    matmul::register(reg);
    embedding::register(reg);
    rope::register(reg);
    attention::register(reg);
    sample::register(reg);
}

/// The prelude of an f16 kernel (one input, one output) with or without native f16.
#[cfg(test)]
pub(crate) fn wgsl_prelude_for_test(native_f16: bool) -> String {
    use wgsl::{Bind, Dialect};
    let binds = [Bind::read("a", DType::F16), Bind::write("out", DType::F16)];
    wgsl::prelude(
        &binds,
        Dialect {
            native_f16,
            subgroups: false,
        },
    )
}
