//! The whole conformance suite on the CUDA backend, over the fake driver (crate
//! `unirt-fakecuda`, loaded through `UNIRT_CUDA_LIBRARY` as a real libcuda is). Kernels are
//! compiled by the real NVRTC and run by the fake driver's CPU twins.
//!
//! A case in [`EXPECTED_FAILURES`] must fail with the error named there — the fake driver
//! reproduces a failure seen on a real GPU — and fails this test the day it passes, so the
//! list cannot go stale. After the suite, any call the fake driver recorded as misuse (one a
//! real driver may crash on) fails the run.

mod fakecuda_support;

use libtest_mimic::{Arguments, Failed, Trial};
use unirt::{Device, DeviceKind};
use unirt_conformance::Status;

/// (case, text its failure must contain, why). Each is a CUDA backend bug the fake driver
/// reproduces as a real GPU shows it.
// Empty since the CUDA backend runs its own allocations, frees, module loads and pageable
// copies in Relaxed capture mode (issue 11): the three capture cases it once held now pass.
const EXPECTED_FAILURES: &[(&str, &str, &str)] = &[];

/// Why the fake driver cannot run an operator case on CUDA: its kernels are CUDA C, which the
/// fake driver compiles (real NVRTC) and loads but cannot execute.
const NEEDS_A_GPU: &str = "the CUDA operator kernels are CUDA C, compiled by NVRTC and loaded \
    here, but executing them needs a real GPU: the fake driver runs only CPU twins of the HAL's \
    built-in kernels (fill, add_f32) and refuses other functions (cuModuleGetFunction: \
    CUDA_ERROR_NOT_SUPPORTED); ci/gpu.sh runs these cases on cuda:N";

/// The error every such case must stop at: the kernel was compiled and its module loaded, and
/// only the function fetch was refused.
const GPU_ONLY_ERROR: &str = "cuModuleGetFunction failed: CUDA_ERROR_NOT_SUPPORTED";

/// Whether `case` is an operator case (`ops::<op>::<dtype>::…`) of a CUDA C kernel, or an
/// operator-graph case (`graph::…`), `ops::random_views` or one of the `…_same_as_cpu` cases,
/// which run such kernels.
fn needs_a_gpu(case: &str) -> bool {
    // User kernels: the CUDA C one is registered by the case itself (its bad input is checked
    // before the launch, against the real NVRTC and the fake driver's module loader).
    if case.starts_with("graph::")
        || case == "ops::random_views"
        || case == "ops::many_dimensions"
        || case == "ops::data_movement_same_as_cpu"
        || case == "ops::changing_shapes_same_as_cpu"
        // Planned with kernels, and launched.
        || case == "ops::workspace_checks"
        // Plans only, but a CUDA plan fetches its compiled kernels' functions.
        || case == "ops::loop_limits"
        || case.starts_with("ops::tensors_")
        || case.starts_with("ops::user_")
        // Strided writes, copy_from and the multiply that checks stream order are kernels.
        || case == "tensor::copy_from_slice"
        // Printing and reading views copy them by a kernel.
        || case == "tensor::display"
        || case == "tensor::read_while_recording"
        // Graphs with host steps around operator kernels.
        || case.starts_with("reentry::host_step_")
        // A GEMM, a silu and a replayed graph from a thread-local destructor.
        || case == "thread_exit::thread_local_destructors_compute"
    {
        return true;
    }
    let mut parts = case.split("::");
    let (Some("ops"), Some(op), Some(dt)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let Ok(dtype) = dt.parse::<unirt::tensor::DType>() else {
        return false;
    };
    unirt::ops::kernels().iter().any(|(k, kind, _)| {
        k.op == op && k.device == DeviceKind::Cuda && k.dtype == dtype && *kind == "cuda-c"
    })
}

fn main() {
    // The CPU backend stays on: some cases use it beside the device under test.
    // No cuBLAS (whatever this machine has): matmul runs the NVRTC kernels, the absent path
    // (the present one is the fakecuda_blas test).
    let (_lib, ctl) = fakecuda_support::use_fake_driver(&[
        ("UNIRT_BACKENDS", "cpu,cuda"),
        (
            "UNIRT_CUBLAS_LIBRARY",
            "/nonexistent/unirt-test/libcublas.so",
        ),
    ]);
    let args = Arguments::from_args();
    let d = unirt::discover();
    let mut trials = Vec::new();
    let cuda = d.backends.iter().find(|b| b.kind == DeviceKind::Cuda);
    match cuda.and_then(|b| b.reason.clone().map(Err).or(Some(Ok(b)))) {
        Some(Ok(b)) => {
            for info in &b.devices {
                let device = Device::new(DeviceKind::Cuda, info.index);
                for case in unirt_conformance::cases() {
                    trials.push(trial(device, case));
                }
                trials.push(op_kernels_compile_and_load(device));
                trials.push(Trial::test(
                    format!("fakecuda:{device}::blas_absent"),
                    || {
                        let s = unirt::vendors::cuda::blas_summary();
                        if s.starts_with("none") && s.contains("UNIRT_CUBLAS_LIBRARY") {
                            Ok(())
                        } else {
                            Err(Failed::from(format!("expected no cuBLAS, got: {s}")))
                        }
                    },
                ));
            }
        }
        Some(Err(reason)) => trials.push(Trial::test("fakecuda::driver_loads", move || {
            Err(Failed::from(format!(
                "the fake driver did not load: {reason}"
            )))
        })),
        None => trials.push(Trial::test("fakecuda::driver_loads", || {
            Err(Failed::from("discovery has no CUDA backend"))
        })),
    }
    eprintln!("unsupported: needs a GPU = {NEEDS_A_GPU}");
    let conclusion = libtest_mimic::run(&args, trials);
    let misuses = ctl.misuses();
    if misuses > 0 {
        eprintln!(
            "the fake driver recorded {misuses} call(s) a real driver may crash on:\n{}",
            ctl.misuse_log()
        );
        std::process::exit(101);
    }
    conclusion.exit();
}

/// Every operator case the fake driver cannot execute still runs up to the kernel: it must
/// stop with [`GPU_ONLY_ERROR`] (compiled and loaded; the fetch refused) or pass (it checked
/// only what comes before any kernel) — never panic, never fail otherwise.
fn op_kernels_compile_and_load(device: Device) -> Trial {
    Trial::test(
        format!("fakecuda:{device}::ops_compile_and_load"),
        move || {
            let mut bad = Vec::new();
            let mut stopped = 0;
            for case in unirt_conformance::cases() {
                if !needs_a_gpu(case.name) {
                    continue;
                }
                let r = unirt_conformance::run_case(&case, device);
                let msg = r.message.unwrap_or_default();
                match r.status {
                    // Passed: it checked only what comes before any kernel; unsupported:
                    // declared for CUDA itself (conformance's list), not for the fake driver.
                    Status::Passed | Status::Unsupported => {}
                    Status::Failed if msg.contains(GPU_ONLY_ERROR) => stopped += 1,
                    s => bad.push(format!("{}: {}: {msg}", case.name, s.as_str())),
                }
            }
            if stopped == 0 {
                bad.push("no operator case reached the kernel fetch".into());
            }
            if bad.is_empty() {
                Ok(())
            } else {
                Err(Failed::from(bad.join("\n")))
            }
        },
    )
}

fn trial(device: Device, case: unirt_conformance::Case) -> Trial {
    let name = format!("fakecuda:{device}::{}", case.name);
    if let Some(why) = unirt_conformance::declared_unsupported(&case, device) {
        // The reason is printed, not made the label (libtest pads every line to the longest).
        eprintln!("unsupported: {}: {why}", case.name);
        return Trial::test(name, || Ok(()))
            .with_ignored_flag(true)
            .with_kind("unsupported");
    }
    if needs_a_gpu(case.name) {
        // The reason is printed once, before the run (it would pad every line).
        return Trial::test(name, || Ok(()))
            .with_ignored_flag(true)
            .with_kind("unsupported: needs a GPU");
    }
    let expected = EXPECTED_FAILURES.iter().find(|(c, _, _)| *c == case.name);
    Trial::test(name, move || {
        let r = unirt_conformance::run_case(&case, device);
        let msg = r.message.unwrap_or_default();
        match (expected, r.status) {
            (None, Status::Passed) => Ok(()),
            (None, s) => Err(Failed::from(format!("{}: {msg}", s.as_str()))),
            (Some((_, needle, _)), Status::Failed) if msg.contains(needle) => Ok(()),
            (Some((_, needle, why)), s) => Err(Failed::from(format!(
                "expected to fail with {needle} ({why}); got {}: {msg}{}",
                s.as_str(),
                if s == Status::Passed {
                    " — it passes now: remove it from EXPECTED_FAILURES"
                } else {
                    ""
                }
            ))),
        }
    })
    .with_kind(if expected.is_some() {
        "expected-failure"
    } else {
        ""
    })
}
