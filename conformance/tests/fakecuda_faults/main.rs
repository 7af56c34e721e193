//! The fault matrix: every CUDA driver entry point unirt loads × each failure a driver can
//! answer, injected through the fake driver (crate `unirt-fakecuda`).
//!
//! Each row opens a private instance of `cuda:0`, sets one fault, and runs a workload that
//! calls every HAL entry point (device, pinned and stream-ordered memory, all copy kinds,
//! sets, both kernels, events with timing, cross-stream waits, a captured graph instantiated
//! and replayed, the caching allocator). Then, with the fault cleared, it checks:
//! - no panic, and every failure a typed `unirt::Error`;
//! - the device is usable again (a round trip and a kernel give the right bytes) — or, for a
//!   sticky error (LAUNCH_FAILED, ILLEGAL_ADDRESS), poisoned with an error that names it, as
//!   CUDA itself is until the context is destroyed;
//! - nothing leaked: retrying the releases that failed leaves the driver with no allocation,
//!   event, graph or capture, the caching allocator's stats back at zero, and after the
//!   instance is dropped the driver holds nothing at all (the context was released);
//! - a fresh instance works, and the fake driver saw no call a real driver may crash on.
//!
//! Entry points the workload does not reach are listed as ignored trials with the reason.
//! A second set of trials removes each symbol from a copy of the library: discovery must then
//! report CUDA unavailable, naming the symbol, without crashing.

#[path = "../fakecuda_support/mod.rs"]
mod fakecuda_support;
mod probes;
mod workload;

use probes::{absent, graph_waiting_on_destroyed_event, probe_child, startup_fault};
use workload::{verify, workload, Run};

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use fakecuda_support::{Control, LIVE_KINDS};
use libtest_mimic::{Arguments, Failed, Trial};
use unirt::discovery::open_private;
use unirt::{
    AnyBackend, Backend, CachingAllocator, CaptureMode, Device, DeviceKind, EventFlags, KernelArg,
    MemcpyKind,
};

/// (label, fault list with `{f}` for the function, sticky). Non-sticky faults fail every call
/// of the function; sticky ones fail once — LAUNCH_FAILED as the call's answer, ILLEGAL_ADDRESS
/// after the call succeeded (a kernel that faults on the device), as a GPU reports them.
const FAILURES: &[(&str, &str, bool)] = &[
    ("oom", "{f}:1+:CUDA_ERROR_OUT_OF_MEMORY", false),
    // Mid-sequence: the first call worked, the second fails (functions called twice or more).
    ("oom_second_call", "{f}:2:CUDA_ERROR_OUT_OF_MEMORY", false),
    ("not_ready", "{f}:1+:CUDA_ERROR_NOT_READY", false),
    (
        "capture_invalidated",
        "{f}:1+:CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        false,
    ),
    ("launch_failed", "{f}:1:CUDA_ERROR_LAUNCH_FAILED", true),
    (
        "illegal_address",
        "{f}:1:CUDA_ERROR_ILLEGAL_ADDRESS:after",
        true,
    ),
];

/// Entry points called only to describe an error: their rows add a failing `cuMemGetInfo`.
const ERROR_PATH: &[&str] = &["cuGetErrorName", "cuGetErrorString"];

/// Entry points called only when an instance is dropped: their rows fail the teardown.
const TEARDOWN: &[&str] = &["cuDevicePrimaryCtxRelease_v2", "cuModuleUnload"];

const CUDA0: Device = Device::new(DeviceKind::Cuda, 0);
const CUDA1: Device = Device::new(DeviceKind::Cuda, 1);
const N: usize = 4096;

static CTL: OnceLock<Control> = OnceLock::new();
/// The fault list is process-wide: one row at a time.
static SERIAL: Mutex<()> = Mutex::new(());
/// Rows where a fault fired but no call reported an error (printed at the end).
static SWALLOWED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn ctl() -> &'static Control {
    CTL.get().expect("control set in main")
}

fn main() {
    if std::env::var_os("FAKECUDA_PROBE_CHILD").is_some() {
        return probe_child();
    }
    let (lib, control) = fakecuda_support::use_fake_driver(&[
        ("UNIRT_BACKENDS", "cuda"),
        // Two devices: peer access and peer copies are entry points too.
        ("UNIRT_FAKECUDA_DEVICES", "2"),
    ]);
    let _ = CTL.set(control);
    let args = Arguments::from_args();
    // Load the driver now: what runs once per process (cuInit, …) is not part of a row.
    let _ = unirt::discover();

    // Which entry points does the workload reach? A clean row answers (and must pass).
    let symbols = fakecuda_support::loaded_symbols();
    let reached: Vec<(String, u64)> = {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        ctl().set_faults("");
        let mut run = Run::default();
        let _ = catch_unwind(AssertUnwindSafe(|| workload(&mut run)));
        // Counted before the teardown: the rows' faults are cleared by then (TEARDOWN rows
        // cover what only the teardown calls).
        let counts = symbols
            .iter()
            .map(|s| (s.clone(), ctl().calls(s)))
            .filter(|(_, n)| *n > 0)
            .collect();
        drop(run);
        counts
    };
    let mut trials = vec![Trial::test("fault::none", || {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        row("", false)
    })];
    for sym in &symbols {
        let calls = reached
            .iter()
            .find(|(s, _)| s == sym)
            .map_or(0, |(_, n)| *n);
        for &(label, spec, sticky) in FAILURES {
            let name = format!("fault::{sym}::{label}");
            if spec.contains(":2:") && calls < 2 {
                continue; // called at most once: the first-call rows cover it
            }
            let mut spec = spec.replace("{f}", sym);
            if TEARDOWN.contains(&sym.as_str()) {
                trials.push(Trial::test(name, move || {
                    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
                    teardown_row(&spec)
                }));
                continue;
            }
            if ERROR_PATH.contains(&sym.as_str()) {
                // Only called to describe an error: make one happen.
                spec.push_str(",cuMemGetInfo_v2:1:CUDA_ERROR_INVALID_VALUE");
            } else if calls == 0 {
                // Called once per process (loading the driver): a fresh process per fault.
                let code = code_of(&spec).to_string();
                trials.push(Trial::test(name, move || startup_fault(&spec, &code)));
                continue;
            }
            trials.push(Trial::test(name, move || {
                let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
                row(&spec, sticky)
            }));
        }
        let (lib, sym) = (lib.clone(), sym.clone());
        trials.push(Trial::test(format!("absent::{sym}"), move || {
            absent(&lib, &sym)
        }));
    }
    trials.push(Trial::test(
        "regression::graph_waiting_on_a_destroyed_event",
        || {
            let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
            graph_waiting_on_destroyed_event()
        },
    ));
    let conclusion = libtest_mimic::run(&args, trials);
    let swallowed = SWALLOWED.lock().unwrap_or_else(|e| e.into_inner());
    if !swallowed.is_empty() {
        println!(
            "\nfaults that fired without any call reporting an error ({}):",
            swallowed.len()
        );
        for s in swallowed.iter() {
            println!("  {s}");
        }
    }
    conclusion.exit();
}

/// One row of the matrix (an empty `spec` is the clean row).
fn row(spec: &str, sticky: bool) -> Result<(), Failed> {
    let ctl = ctl();
    let misuses = ctl.misuses();
    let poisoned_before = ctl.poisoned();
    ctl.set_faults(spec);
    let mut run = Run::default();
    let panicked = catch_unwind(AssertUnwindSafe(|| workload(&mut run))).is_err();
    let fired = ctl.fired();
    ctl.set_faults("");
    if panicked {
        return Err("the workload panicked".into());
    }
    if spec.is_empty() && !run.errors.is_empty() {
        return Err(format!("the clean workload failed: {:?}", run.errors).into());
    }
    if !spec.is_empty() && fired == 0 {
        return Err(
            format!("the fault {spec} never fired (the workload stopped calling it)").into(),
        );
    }
    let code = code_of(spec);
    // A sticky fault poisons the context current at the call; one that fires before any
    // context exists (device queries) is an ordinary failure.
    let poisoned = sticky && ctl.poisoned() > poisoned_before;
    let mut problems = Vec::new();
    if fired > 0 && run.errors.is_empty() {
        SWALLOWED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(spec.to_string());
    }
    if let Some(b) = run.backend.take() {
        for (name, f) in run.retry.drain(..) {
            if let Err(e) = f(&b) {
                if !poisoned {
                    problems.push(format!("retrying {name} after the fault cleared: {e}"));
                }
            }
        }
        if let Some(ca) = run.allocator.take() {
            let emptied = ca.empty_cache();
            let stats = ca.stats();
            if !poisoned
                && (emptied.is_err()
                    || stats.allocated_bytes.current != 0
                    || stats.reserved_bytes.current != 0)
            {
                problems.push(format!(
                    "caching allocator after the fault cleared: {} bytes allocated, {} reserved ({emptied:?})",
                    stats.allocated_bytes.current, stats.reserved_bytes.current
                ));
            }
        }
        // Each device works again — or, when a sticky fault poisoned its context (the one
        // current on the thread at the faulting call), every use names that error.
        for (name, dev) in [("cuda:0", Some(&b)), ("cuda:1", run.peer.as_ref())] {
            let Some(dev) = dev else { continue };
            match verify(dev) {
                Ok(()) => {}
                Err(e) if poisoned && e.to_string().contains(code) => {}
                Err(e) => problems.push(format!("{name} unusable after the fault cleared: {e}")),
            }
        }
        if !poisoned {
            let live = ctl.live();
            // What the open instances hold: a default stream and a context reference each,
            // modules as loaded.
            let open = 1 + run.peer.is_some() as u64;
            for (k, (&v, name)) in live.iter().zip(LIVE_KINDS).enumerate() {
                let expected = match k {
                    2 | 7 => open,
                    6 => v,
                    _ => 0,
                };
                if v != expected {
                    problems.push(format!(
                        "leak: the driver holds {v} {name}, expected {expected}"
                    ));
                }
            }
        }
        drop(b);
    }
    drop(run.peer.take());
    let live = ctl.live();
    if live.iter().any(|&v| v != 0) {
        let held: Vec<String> = live
            .iter()
            .zip(LIVE_KINDS)
            .filter(|(v, _)| **v != 0)
            .map(|(v, n)| format!("{v} {n}"))
            .collect();
        problems.push(format!(
            "after the instance was dropped the driver still holds {}",
            held.join(", ")
        ));
    }
    match open_private(CUDA0) {
        Ok(b) => {
            if let Err(e) = verify(&b) {
                problems.push(format!("a fresh instance fails: {e}"));
            }
        }
        Err(e) => problems.push(format!("a fresh instance cannot open: {e}")),
    }
    if ctl.misuses() != misuses {
        problems.push(format!("driver misuse:\n{}", ctl.misuse_log()));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        let errors: Vec<String> = run
            .errors
            .iter()
            .map(|(s, e)| format!("{s}: {e}"))
            .collect();
        Err(format!(
            "{}\n  (errors seen: {})",
            problems.join("\n"),
            errors.join("; ")
        )
        .into())
    }
}

/// The `CUresult` name in the first item of a fault list.
fn code_of(spec: &str) -> &str {
    let first = spec.split(',').next().unwrap_or("");
    first.split(':').nth(2).unwrap_or("")
}

/// A fault in what only an instance's teardown calls (its `Drop`): the workload runs clean,
/// the fault is set while both instances are dropped. Nothing panics; a release the driver
/// refused cannot be retried from a destructor, so the driver is then reset (as process exit
/// would) and a fresh instance must work.
fn teardown_row(spec: &str) -> Result<(), Failed> {
    let ctl = ctl();
    let misuses = ctl.misuses();
    ctl.set_faults("");
    let mut run = Run::default();
    let panicked = catch_unwind(AssertUnwindSafe(|| workload(&mut run))).is_err();
    if panicked || !run.errors.is_empty() {
        return Err(format!("the clean workload failed: {:?}", run.errors).into());
    }
    ctl.set_faults(spec);
    let panicked = catch_unwind(AssertUnwindSafe(move || drop(run))).is_err();
    let fired = ctl.fired();
    ctl.set_faults("");
    ctl.reset();
    if panicked {
        return Err("dropping the instances panicked".into());
    }
    if fired == 0 {
        return Err(format!("the fault {spec} never fired").into());
    }
    let b = open_private(CUDA0).map_err(|e| format!("a fresh instance cannot open: {e}"))?;
    verify(&b).map_err(|e| format!("a fresh instance fails: {e}"))?;
    if ctl.misuses() != misuses {
        return Err(format!("driver misuse:\n{}", ctl.misuse_log()).into());
    }
    Ok(())
}
