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
mod matmul_coop;
mod matmul_host;
mod matmul_large;
mod norm;
mod op;
mod op_cache;
mod op_launch;
mod rearrange;
mod reduce;
mod rope;
mod rowwise;
mod sample;
mod shapes;
mod softmax;
mod textures;
mod user;
mod user_limits;
mod wgsl;

pub(crate) use fixed::*;
pub(crate) use matmul_coop::CoopCaps;
pub(crate) use user::prepare as prepare_user;

use crate::device::DeviceKind;
use crate::error::Result;
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

/// The host's cores, read once (the standard library asks the OS, and the cgroup's CPU
/// quota, each time).
fn host_cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Loop iterations one shader invocation may run in all on an adapter with a loop limiter
/// ([`loop_limited`]), with a margin below its 65535.
pub(crate) const LOOP_BUDGET: u64 = 65_000;

/// Whether the plan's adapter is Mesa's llvmpipe (lavapipe on Vulkan, llvmpipe on GL), whose
/// shader compiler (gallivm) guards against hangs with a *loop limiter*: every invocation
/// (each SIMD batch of invocations) gets 65535 loop iterations in all, counted over every
/// loop it runs, and past them each loop exits early — the kernel then returns, silently, a
/// result computed on part of its data (seen on Mesa 22.3: a softmax over rows of 30 000
/// strided elements — three sweeps — was wrong, one of 20 000 right; a sum over 2^18
/// elements in one invocation stopped at 262 141). Every kernel whose loops grow with the
/// data therefore checks its per-invocation count against [`LOOP_BUDGET`] at plan time
/// ([`check_loops`], [`host_form`], [`row_lanes`]), taking another form or failing with a
/// typed error.
fn loop_limited(spec: &crate::ops::PlanSpec<'_>) -> bool {
    crate::Runtime::get(spec.device)
        .map(|rt| {
            crate::hal::Backend::info(&**rt.backend())
                .name
                .contains("llvmpipe")
        })
        .unwrap_or(false)
}

/// `Ok` when a kernel whose invocations each run `iterations` loop iterations computes all of
/// them on the plan's adapter (see [`loop_limited`]), else `Error::Unsupported` naming the
/// limit; `what` says which loop it is.
pub(crate) fn check_loops(
    spec: &crate::ops::PlanSpec<'_>,
    iterations: u64,
    what: impl FnOnce() -> String,
) -> Result<()> {
    if iterations <= LOOP_BUDGET || !loop_limited(spec) {
        return Ok(());
    }
    unsupported_loops(spec, iterations, what())
}

/// Whether a family with a host form takes it: on the host's cores when the layout allows it
/// (`host_loops` is its per-invocation loop count, `None` where it does not apply) and its
/// loops fit; otherwise the GPU form runs, whose `gpu_loops` must fit ([`check_loops`]).
pub(crate) fn host_form(
    spec: &crate::ops::PlanSpec<'_>,
    host_loops: Option<u64>,
    gpu_loops: u64,
    what: impl FnOnce() -> String,
) -> Result<bool> {
    let limited = loop_limited(spec);
    let fits = |n: u64| n <= LOOP_BUDGET || !limited;
    if on_host_cores(spec) && host_loops.is_some_and(fits) {
        return Ok(true);
    }
    if fits(gpu_loops) {
        return Ok(false);
    }
    unsupported_loops(spec, gpu_loops, what())
}

/// Rows from which a row kernel on the host's cores shares a row among lanes even where one
/// lane could walk it alone (see [`row_lanes`]).
const LONG_ROW: u64 = 4096;

/// Invocations that share each of `rows` rows of `len` elements in a row kernel
/// ([`rowwise::row_kernel`]) that sweeps its row `sweeps` times.
///
/// On a GPU, [`rowwise::GPU_ROW_LANES`]. On the host's cores, 1 (one invocation walks the row
/// alone, no barrier) where the loop limiter allows it, unless the rows are too few to fill
/// the SIMD batches of every core ([`rowwise::HOST_ROWS_WG`] rows per workgroup) and long
/// ([`LONG_ROW`]); otherwise the fewest lanes from 8 (one SIMD batch on lavapipe) that fit.
/// On lavapipe (AMD EPYC, 2 cores), f32, launch and wait: softmax of 1 × 16 384 655 → 266 µs
/// with 8 lanes, of 2 × 4096 342 → 215, 64 × 32 000 (too long for one lane) 101 → 8.2 ms
/// against 256 lanes; rows of 1024 or fewer, or many rows, ran alike or faster alone.
/// `Error::Unsupported` where no form fits.
pub(crate) fn row_lanes(
    spec: &crate::ops::PlanSpec<'_>,
    rows: usize,
    len: u64,
    sweeps: u64,
) -> Result<u32> {
    let loops = |w: u32| match w {
        1 => sweeps * len,
        w => sweeps * len.div_ceil(u64::from(w)) + rowwise::WG_REDUCE_LOOPS,
    };
    let fits = |w: u32| !loop_limited(spec) || loops(w) <= LOOP_BUDGET;
    let gpu = rowwise::GPU_ROW_LANES;
    if on_host_cores(spec) {
        let few = rows < rowwise::HOST_ROWS_WG as usize * host_cores() && len >= LONG_ROW;
        let alone = (!few).then_some(1);
        let shared = (3..=gpu.ilog2()).map(|s| 1u32 << s);
        if let Some(w) = alone.into_iter().chain(shared).find(|&w| fits(w)) {
            return Ok(w);
        }
    } else if fits(gpu) {
        return Ok(gpu);
    }
    unsupported_loops(spec, loops(gpu), format!("a row of {len}"))
}

fn unsupported_loops<T>(
    spec: &crate::ops::PlanSpec<'_>,
    iterations: u64,
    what: String,
) -> Result<T> {
    Err(crate::error::Error::Unsupported {
        what: format!(
            "{} on {}: {} takes {iterations} loop iterations in one shader invocation, and \
             Mesa's llvmpipe ends every invocation's loops after 65535 (gallivm's loop \
             limiter), which would give a wrong result",
            spec.op, spec.device, what
        ),
        backend: crate::device::DeviceKind::Wgpu,
    })
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
