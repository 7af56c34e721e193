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

fn main() {
    // The CPU backend stays on: some cases use it beside the device under test.
    let (_lib, ctl) = fakecuda_support::use_fake_driver(&[("UNIRT_BACKENDS", "cpu,cuda")]);
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

fn trial(device: Device, case: unirt_conformance::Case) -> Trial {
    let name = format!("fakecuda:{device}::{}", case.name);
    if let Some(why) = unirt_conformance::declared_unsupported(&case, device) {
        return Trial::test(name, || Ok(()))
            .with_ignored_flag(true)
            .with_kind(format!("unsupported: {why}"));
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
