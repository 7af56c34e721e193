//! # unirt-conformance: the unirt conformance suite as a library
//!
//! The kit a vendor author runs against a backend: one list of cases, written once, run on
//! every device the same way.
//!
//! A [`Case`] is a function of a [`Ctx`] (one opened device) returning `Ok(())` or a
//! [`Failure`]. Cases carry capability tags ([`Need`]); a device without a capability reports
//! the case `unsupported` with the reason, as does an entry in a backend's
//! [`unsupported`] list. Nothing passes silently.
//!
//! Three front ends run the same list: `cargo test -p unirt-conformance` (one libtest-mimic
//! trial per device × case, [`trials()`]), the `unirt conformance` command of crate `unirt-cli`
//! (table, JSON, JUnit through [`report`]), and anyone adding a vendor:
//!
//! ```no_run
//! use unirt::Device;
//! // Every case on one device, then the failures.
//! let results = unirt_conformance::run_all(&[Device::CPU], None, |_, _| {});
//! for r in results.iter().filter(|r| r.status == unirt_conformance::Status::Failed) {
//!     println!("{} {}: {}", r.device, r.case, r.message.as_deref().unwrap_or(""));
//! }
//! ```

mod cases_alloc;
mod cases_alloc_pools;
mod cases_alloc_retire;
mod cases_api;
mod cases_bad_input;
mod cases_basic;
mod cases_capture;
mod cases_capture_freed;
mod cases_capture_modes;
mod cases_chaos;
mod cases_context;
mod cases_device_loss;
mod cases_epilogue;
mod cases_event_races;
mod cases_fused;
mod cases_graph;
mod cases_graph_memory;
mod cases_graph_names;
mod cases_graph_random;
mod cases_lifetime;
mod cases_memcpy;
mod cases_ops_data;
mod cases_ops_elementwise;
mod cases_ops_ew_specials;
mod cases_ops_large;
mod cases_ops_limits;
mod cases_ops_linalg;
mod cases_ops_matmul;
mod cases_ops_matmul_weights;
mod cases_ops_rank;
mod cases_ops_reduce;
mod cases_ops_registry;
mod cases_ops_specials;
mod cases_ops_threads;
mod cases_ops_views;
mod cases_reentry;
mod cases_robust;
mod cases_same_as_cpu;
mod cases_streams;
mod cases_stress;
mod cases_tensor_create;
mod cases_tensor_display;
mod cases_tensor_io;
mod cases_thread_exit;
mod fuzz;
pub mod ops_check;
mod ops_fuzz;
pub mod report;
mod trials;
mod util;

pub use cases_chaos::random_sequence;
pub use fuzz::{clock_seed, fuzz_device, say, FuzzOptions};
pub use ops_fuzz::random_op_calls;
pub use trials::{devices, trials};

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use unirt::device::{Device, DeviceKind};
use unirt::error::Error;
use unirt::hal::Backend;
use unirt::AnyBackend;

pub use util::*;

/// What a case needs from a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Capture,
    StreamOrderedMemory,
    AsyncStreams,
}

/// One conformance case.
#[derive(Clone, Copy)]
pub struct Case {
    /// `area::name`, unique.
    pub name: &'static str,
    pub needs: &'static [Need],
    pub run: fn(&Ctx) -> Result<(), Failure>,
}

/// The device a case runs on.
pub struct Ctx {
    pub device: Device,
    pub backend: Arc<AnyBackend>,
}

impl std::ops::Deref for Ctx {
    type Target = AnyBackend;
    fn deref(&self) -> &AnyBackend {
        &self.backend
    }
}

/// Why a case did not pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// A check failed or a call returned an unexpected error.
    Failed(String),
    /// The backend cannot do this; the reason says why.
    Unsupported(String),
}

impl Failure {
    /// The same failure, its message prefixed with where it happened.
    pub fn context(self, at: String) -> Failure {
        match self {
            Failure::Failed(m) => Failure::Failed(format!("{at}: {m}")),
            Failure::Unsupported(m) => Failure::Unsupported(format!("{at}: {m}")),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::Unsupported { .. } => Failure::Unsupported(e.to_string()),
            e => Failure::Failed(format!("unexpected error: {e}")),
        }
    }
}

/// The result of one case on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Passed,
    Failed,
    Unsupported,
    Skipped,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Unsupported => "unsupported",
            Status::Skipped => "skipped",
        }
    }
}

/// One row of a conformance report.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    pub device: String,
    pub case: String,
    pub status: Status,
    pub message: Option<String>,
    #[serde(skip)]
    pub duration: Duration,
}

/// Every case, in a stable order.
pub fn cases() -> Vec<Case> {
    let mut all = Vec::new();
    all.extend_from_slice(cases_basic::CASES);
    all.extend_from_slice(cases_memcpy::CASES);
    all.extend_from_slice(cases_streams::CASES);
    all.extend_from_slice(cases_capture::CASES);
    all.extend_from_slice(cases_capture_freed::CASES);
    all.extend_from_slice(cases_capture_modes::CASES);
    all.extend_from_slice(cases_bad_input::CASES);
    all.extend_from_slice(cases_chaos::CASES);
    all.extend_from_slice(cases_alloc::CASES);
    all.extend_from_slice(cases_alloc_pools::CASES);
    all.extend_from_slice(cases_alloc_retire::CASES);
    all.extend_from_slice(cases_context::CASES);
    all.extend_from_slice(cases_api::CASES);
    all.extend_from_slice(cases_reentry::CASES);
    all.extend_from_slice(cases_thread_exit::CASES);
    all.extend_from_slice(cases_tensor_create::CASES);
    all.extend_from_slice(cases_tensor_display::CASES);
    all.extend_from_slice(cases_tensor_io::CASES);
    all.extend_from_slice(cases_lifetime::CASES);
    all.extend_from_slice(cases_stress::CASES);
    all.extend_from_slice(cases_robust::CASES);
    all.extend_from_slice(cases_event_races::CASES);
    all.extend_from_slice(cases_device_loss::CASES);
    all.extend_from_slice(cases_ops_registry::CASES);
    all.extend_from_slice(cases_ops_rank::CASES);
    all.extend(cases_ops_elementwise::cases());
    all.extend(cases_ops_data::cases());
    all.extend(cases_ops_reduce::cases());
    all.extend(cases_ops_matmul::cases());
    all.extend(cases_ops_linalg::cases());
    all.extend(cases_graph::cases());
    all.extend(cases_graph_memory::cases());
    all.extend(cases_graph_names::cases());
    all.extend(cases_graph_random::cases());
    all.extend(cases_ops_threads::cases());
    all.extend(cases_ops_limits::cases());
    all.extend(cases_fused::cases());
    all.extend(cases_epilogue::cases());
    all.extend(cases_ops_views::cases());
    all.extend(cases_same_as_cpu::cases());
    all
}

/// Operator cases (`ops::<op>::<dtype>::<what>`) of a built-in operator for which the device's
/// vendor registers no kernel: declared unsupported with that reason, so they show as ignored
/// trials instead of passing or failing. (An operator planned on such a device answers
/// `Error::UnsupportedKernel`; a case that gets it without this declaration fails.)
pub fn unregistered_op(kind: DeviceKind, case: &str) -> Option<String> {
    if let Some(why) = cases_graph::unsupported_here(kind, case) {
        return Some(why);
    }
    let mut parts = case.split("::");
    let (Some("ops"), Some(op), Some(dt)) = (parts.next(), parts.next(), parts.next()) else {
        return None;
    };
    let dtype: unirt::tensor::DType = dt.parse().ok()?;
    let builtin_somewhere = unirt::ops::kernels()
        .iter()
        .any(|(k, _, builtin)| *builtin && k.op == op);
    if !builtin_somewhere || unirt::ops::is_registered(op, kind, dtype) {
        return None;
    }
    Some(match kind {
        // wgpu registers every op in every dtype the CPU does (f16/bf16 stored 16-bit and
        // computed in f32; i64/u8/bool packed in u32 words): a gap is an op added since.
        DeviceKind::Wgpu => {
            format!("wgpu registers no {dtype} kernel for {op} (no WGSL kernel written for it yet)")
        }
        _ => format!(
            "{kind} registers no {dtype} kernel for {op} (no {kind} kernel written for it \
             yet; it belongs to the {kind} operator issue)"
        ),
    })
}

/// Cases a backend declares it cannot pass, with the reason. Each entry is a promise to fix or
/// a limit of the platform; the harness reports them as `unsupported`, never as passed.
pub fn unsupported(kind: DeviceKind, case: &str) -> Option<&'static str> {
    const NO_LOSS_CPU: &str = "the CPU backend has no device apart from the host to lose";
    const NO_LOSS_CUDA: &str = "a lost CUDA device is a sticky context error: the fake \
        driver's fault matrix (fakecuda_faults: ILLEGAL_ADDRESS, LAUNCH_FAILED) injects it at \
        every entry point; a real GPU cannot be reset on purpose here";
    const NO_NESTED_LAUNCH_CUDA: &str = "the case captures replays of a graph into another \
        graph; CUDA refuses a graph launched into a capturing stream \
        (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED on an H200, CUDA 13), so unirt refuses it first \
        with a `capturing` error and the capture stays intact";
    const LOSS: &[(DeviceKind, &str, &str)] = &[
        (
            DeviceKind::Cpu,
            cases_device_loss::DEVICE_LOST_CASE,
            NO_LOSS_CPU,
        ),
        (
            DeviceKind::Cuda,
            cases_device_loss::DEVICE_LOST_CASE,
            NO_LOSS_CUDA,
        ),
        (
            DeviceKind::Cuda,
            "capture::execs_sharing_read_backs_replay_back_to_back",
            NO_NESTED_LAUNCH_CUDA,
        ),
        (
            DeviceKind::Cpu,
            cases_same_as_cpu::SAME_AS_CPU_CASE,
            cases_same_as_cpu::CPU_IS_THE_REFERENCE,
        ),
        (
            DeviceKind::Cpu,
            cases_same_as_cpu::CHANGING_SHAPES_CASE,
            cases_same_as_cpu::CPU_IS_THE_REFERENCE,
        ),
        (
            DeviceKind::Wgpu,
            cases_ops_limits::WORKSPACE_CASE,
            cases_ops_limits::NO_WORKSPACE_WGPU,
        ),
        (
            DeviceKind::Wgpu,
            cases_reentry::CPU_KERNEL_WAITS_CASE,
            cases_reentry::DEVICE_KERNELS_CANNOT_WAIT,
        ),
        (
            DeviceKind::Cuda,
            cases_reentry::CPU_KERNEL_WAITS_CASE,
            cases_reentry::DEVICE_KERNELS_CANNOT_WAIT,
        ),
    ];
    LOSS.iter()
        .find(|(k, c, _)| *k == kind && *c == case)
        .map(|(_, _, why)| *why)
}

fn missing_need(ctx: &Ctx, needs: &[Need]) -> Option<String> {
    let caps = ctx.backend.info().capabilities;
    needs.iter().find_map(|n| {
        let ok = match n {
            Need::Capture => caps.capture,
            Need::StreamOrderedMemory => caps.stream_ordered_memory,
            Need::AsyncStreams => caps.async_streams,
        };
        (!ok).then(|| format!("{} does not report {n:?}", ctx.device))
    })
}

/// Why `case` is declared unsupported on `device` (an [`unsupported`] entry or a missing
/// capability), known before it runs.
pub fn declared_unsupported(case: &Case, device: Device) -> Option<String> {
    if let Some(why) = unsupported(device.kind, case.name) {
        return Some(why.to_string());
    }
    if let Some(why) = unregistered_op(device.kind, case.name) {
        return Some(why);
    }
    let backend = unirt::open(device).ok()?;
    missing_need(&Ctx { device, backend }, case.needs)
}

/// Runs one case on one device; a panic inside the case is a failure, not an abort.
pub fn run_case(case: &Case, device: Device) -> CaseResult {
    let start = Instant::now();
    let (status, message) = match unirt::open(device) {
        Err(Error::Unavailable { reason, .. }) => (Status::Skipped, Some(reason)),
        Err(e) => (Status::Failed, Some(format!("cannot open {device}: {e}"))),
        Ok(backend) => {
            let ctx = Ctx { device, backend };
            if let Some(why) = unsupported(device.kind, case.name) {
                (Status::Unsupported, Some(why.to_string()))
            } else if let Some(why) = unregistered_op(device.kind, case.name) {
                (Status::Unsupported, Some(why))
            } else if let Some(why) = missing_need(&ctx, case.needs) {
                (Status::Unsupported, Some(why))
            } else {
                match catch_unwind(AssertUnwindSafe(|| (case.run)(&ctx))) {
                    Ok(Ok(())) => (Status::Passed, None),
                    Ok(Err(Failure::Failed(m))) => (Status::Failed, Some(m)),
                    Ok(Err(Failure::Unsupported(m))) => (Status::Unsupported, Some(m)),
                    Err(p) => {
                        let m = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        (Status::Failed, Some(format!("panicked: {m}")))
                    }
                }
            }
        }
    };
    CaseResult {
        device: device.to_string(),
        case: case.name.to_string(),
        status,
        message,
        duration: start.elapsed(),
    }
}

/// Runs every case whose name contains `filter` (all when `None`) on every device, in order.
/// `progress(done, total)` is called before each case, for a front end's progress display.
pub fn run_all(
    devices: &[Device],
    filter: Option<&str>,
    mut progress: impl FnMut(&CaseResultKey, usize),
) -> Vec<CaseResult> {
    let cases: Vec<Case> = cases()
        .into_iter()
        .filter(|c| filter.is_none_or(|f| c.name.contains(f)))
        .collect();
    let mut out = Vec::with_capacity(cases.len() * devices.len());
    for &device in devices {
        for case in &cases {
            progress(
                &CaseResultKey {
                    device,
                    case: case.name,
                },
                cases.len() * devices.len(),
            );
            out.push(run_case(case, device));
        }
    }
    out
}

/// Which case is about to run on which device (for [`run_all`]'s progress callback).
#[derive(Debug, Clone, Copy)]
pub struct CaseResultKey {
    pub device: Device,
    pub case: &'static str,
}

/// The error for a filter that matches no case, naming what a filter can match: a case's
/// name is `group::…`, and an operator's cases are `ops::<operator>::<dtype>::<case>` (by
/// operator, not by family: `sum`, not `reduce`).
fn no_match(filter: &str) -> String {
    let names: Vec<&str> = cases().iter().map(|c| c.name).collect();
    let mut groups: Vec<&str> = names.iter().filter_map(|n| n.split("::").next()).collect();
    groups.sort_unstable();
    groups.dedup();
    let mut ops: Vec<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix("ops::")?.split("::").next())
        .collect();
    ops.sort_unstable();
    ops.dedup();
    format!(
        "no conformance case matches {filter:?}: a case is named group::…::case (groups: {}); \
         operator cases are ops::<operator>::<dtype>::<case> (under ops::: {})",
        groups.join(", "),
        ops.join(", ")
    )
}

/// The cases whose name contains `filter`; an error names the filter when none does, so a
/// typo never runs nothing and passes.
pub fn filtered_cases(filter: Option<&str>) -> Result<Vec<Case>, String> {
    let all: Vec<Case> = cases()
        .into_iter()
        .filter(|c| filter.is_none_or(|f| c.name.contains(f)))
        .collect();
    if all.is_empty() {
        return Err(no_match(filter.unwrap_or_default()));
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    /// A filter that matches nothing is an error that says what names look like and lists
    /// the groups and operators (a user who guesses a family name, `reduce`, learns `sum`).
    #[test]
    fn an_unmatched_filter_names_the_groups_and_operators() {
        assert!(super::filtered_cases(Some("ops::sum::f32::sizes")).is_ok_and(|c| c.len() == 1));
        let Err(err) = super::filtered_cases(Some("reduce")) else {
            panic!("\"reduce\" matched a case");
        };
        assert!(err.contains("\"reduce\""), "{err}");
        for name in ["ops", "capture", "graph", "sum", "argmax", "matmul"] {
            assert!(err.contains(name), "{name}: {err}");
        }
    }
}
