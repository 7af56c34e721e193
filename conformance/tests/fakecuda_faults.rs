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

mod fakecuda_support;

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

/// A release to try again once the fault is cleared.
type Retry = Box<dyn FnOnce(&AnyBackend) -> unirt::Result<()>>;

/// What one workload run left behind.
#[derive(Default)]
struct Run {
    backend: Option<Arc<AnyBackend>>,
    /// The second device (peer copies).
    peer: Option<Arc<AnyBackend>>,
    errors: Vec<(&'static str, unirt::Error)>,
    /// Releases that failed, to retry once the fault is cleared.
    retry: Vec<(&'static str, Retry)>,
    /// The caching allocator the workload used (its cache is emptied again after the fault).
    allocator: Option<Arc<CachingAllocator>>,
}

impl Run {
    fn step<T>(&mut self, name: &'static str, r: unirt::Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.errors.push((name, e));
                None
            }
        }
    }

    fn release(
        &mut self,
        name: &'static str,
        b: &AnyBackend,
        f: impl Fn(&AnyBackend) -> unirt::Result<()> + 'static,
    ) {
        if let Err(e) = f(b) {
            self.errors.push((name, e));
            self.retry.push((name, Box::new(f)));
        }
    }
}

/// Every HAL entry point, in the order an application would use them.
fn workload(run: &mut Run) {
    let b = match open_private(CUDA0) {
        Ok(b) => b,
        Err(e) => {
            run.errors.push(("open", e));
            return;
        }
    };
    run.backend = Some(b.clone());
    let def = b.default_stream();
    // Opening a second device enables peer access between the two.
    let b1 = run.step("open_peer", open_private(CUDA1));
    run.peer = b1.clone();
    run.step("mem_info", b.mem_info());
    let s = run.step("stream_create", b.stream_create());
    let st = s.unwrap_or(def);
    let e1 = run.step("event_create", b.event_create(EventFlags::DEFAULT));
    let e2 = run.step("event_create", b.event_create(EventFlags::DEFAULT));
    let a = run.step("malloc", b.malloc(N));
    let c = run.step("malloc", b.malloc(N));
    let h = run.step("malloc_host", b.malloc_host(N));
    let host = vec![1u8; N];
    let mut out = vec![0u8; N];
    if let Some(a) = a {
        // SAFETY: `host` is N readable bytes.
        let r = unsafe { b.memcpy(a.0, host.as_ptr() as u64, N, MemcpyKind::H2D) };
        run.step("memcpy_h2d", r);
    }
    if let Some(c) = c {
        run.step("memset", b.memset(c, 0, N));
    }
    if let Some(e) = e1 {
        run.step("event_record", b.event_record(e, st));
    }
    if let (Some(a), Some(c), Some(h)) = (a, c, h) {
        // SAFETY: pinned memory of N bytes from malloc_host, freed only at the end.
        let r = unsafe { b.memcpy_async(c.0, h.0, N, MemcpyKind::H2D, st) };
        run.step("memcpy_async_h2d", r);
        let n = KernelArg::U32((N / 4) as u32);
        let fill = [KernelArg::Ptr(a), KernelArg::U32(7), n];
        run.step("launch_fill", b.launch("fill", &fill, st));
        let add = [KernelArg::Ptr(a), KernelArg::Ptr(c), KernelArg::Ptr(c), n];
        run.step("launch_add", b.launch("add_f32", &add, st));
        run.step("memset_async", b.memset_async(a, 3, 64, st));
        // SAFETY: device-only copy.
        let r = unsafe { b.memcpy_async(c.0, a.0, N, MemcpyKind::D2D, st) };
        run.step("memcpy_async_d2d", r);
        // SAFETY: pinned memory, waited for below before it is freed.
        let r = unsafe { b.memcpy_async(h.0, c.0, N, MemcpyKind::D2H, st) };
        run.step("memcpy_async_d2h", r);
        // SAFETY: pinned to pinned within one allocation, non-overlapping halves.
        let r = unsafe { b.memcpy_async(h.0, h.0 + (N / 2) as u64, N / 2, MemcpyKind::H2H, st) };
        run.step("memcpy_async_h2h", r);
    }
    if let Some(e) = e2 {
        run.step("event_record", b.event_record(e, st));
        run.step("stream_wait_event", b.stream_wait_event(def, e));
        run.step("event_query", b.event_query(e));
        run.step("event_synchronize", b.event_synchronize(e));
    }
    if let (Some(x), Some(y)) = (e1, e2) {
        run.step("event_elapsed_ms", b.event_elapsed_ms(x, y));
    }
    run.step("stream_synchronize", b.stream_synchronize(st));
    if let (Some(a), Some(c)) = (a, c) {
        capture(run, &b, st, a, c, e1);
    }
    if let Some(p) = run.step("malloc_async", b.malloc_async(N, st)) {
        if let Err(e) = b.free_async(p, st) {
            run.errors.push(("free_async", e));
            run.retry.push((
                "free_async",
                Box::new(move |b| b.free_async(p, b.default_stream())),
            ));
        }
    }
    let mut peer_buf = None;
    if let (Some(a), Some(b1)) = (a, &b1) {
        if let Some(p1) = run.step("peer_malloc", b1.malloc(N)) {
            // SAFETY: device-only copy between two devices.
            let r = unsafe { b.memcpy(p1.0, a.0, N, MemcpyKind::D2D) };
            run.step("memcpy_peer", r);
            peer_buf = Some((b1.clone(), p1));
        }
    }
    if let Some(a) = a {
        // SAFETY: `out` is N writable bytes.
        let r = unsafe { b.memcpy(out.as_mut_ptr() as u64, a.0, N, MemcpyKind::D2H) };
        run.step("memcpy_d2h", r);
    }
    let ca = CachingAllocator::new(b.clone());
    if let Some(p) = run.step("caching_malloc", ca.malloc(N, def)) {
        run.step("caching_free", ca.free(p));
    }
    run.step("caching_empty_cache", ca.empty_cache());
    run.allocator = Some(ca);
    run.step("synchronize", b.synchronize());
    // Freed only now: a failed synchronous copy may still be queued on cuda:0's stream, and
    // cuda:1's free does not wait for cuda:0's work (see docs/RELIABILITY.md).
    if let Some((b1, p1)) = peer_buf {
        if let Err(e) = b1.free(p1) {
            run.errors.push(("peer_free", e));
            run.retry
                .push(("peer_free", Box::new(move |_| b1.free(p1))));
        }
    }
    for p in [a, c].into_iter().flatten() {
        run.release("free", &b, move |b| b.free(p));
    }
    if let Some(h) = h {
        run.release("free_host", &b, move |b| b.free_host(h));
    }
    for e in [e1, e2].into_iter().flatten() {
        run.release("event_destroy", &b, move |b| b.event_destroy(e));
    }
    if let Some(s) = s {
        run.release("stream_destroy", &b, move |b| b.stream_destroy(s));
    }
}

/// Capture, instantiate, replay, destroy.
fn capture(
    run: &mut Run,
    b: &Arc<AnyBackend>,
    st: unirt::StreamId,
    a: unirt::DevicePtr,
    c: unirt::DevicePtr,
    e: Option<unirt::EventId>,
) {
    if run
        .step("begin_capture", b.begin_capture(st, CaptureMode::Global))
        .is_none()
    {
        return;
    }
    let fill = [KernelArg::Ptr(c), KernelArg::U32(5), KernelArg::U32(16)];
    run.step("launch_in_capture", b.launch("fill", &fill, st));
    // SAFETY: device-only copy.
    let r = unsafe { b.memcpy_async(a.0, c.0, 64, MemcpyKind::D2D, st) };
    run.step("memcpy_async_in_capture", r);
    if let Some(e) = e {
        run.step("event_record_in_capture", b.event_record(e, st));
    }
    let Some(g) = run.step("end_capture", b.end_capture(st)) else {
        return;
    };
    if let Some(x) = run.step("graph_instantiate", b.graph_instantiate(g)) {
        run.step("graph_launch", b.graph_launch(x, st));
        run.step("stream_synchronize", b.stream_synchronize(st));
        run.release("graph_exec_destroy", b, move |b| b.graph_exec_destroy(x));
    }
    run.release("graph_destroy", b, move |b| b.graph_destroy(g));
}

/// A round trip and a kernel on the default stream, checked byte for byte.
fn verify(b: &AnyBackend) -> unirt::Result<()> {
    let data: Vec<u8> = (0..N).map(|i| (i * 7 + 1) as u8).collect();
    let p = b.malloc(N)?;
    let r = (|| {
        // SAFETY: `data` is N readable bytes.
        unsafe { b.memcpy(p.0, data.as_ptr() as u64, N, MemcpyKind::H2D)? };
        let mut back = vec![0u8; N];
        // SAFETY: `back` is N writable bytes.
        unsafe { b.memcpy(back.as_mut_ptr() as u64, p.0, N, MemcpyKind::D2H)? };
        if back != data {
            return Err(unirt::Error::Internal("round trip gave other bytes".into()));
        }
        let s = b.default_stream();
        b.launch(
            "fill",
            &[KernelArg::Ptr(p), KernelArg::U32(9), KernelArg::U32(4)],
            s,
        )?;
        b.stream_synchronize(s)?;
        // SAFETY: as above.
        unsafe { b.memcpy(back.as_mut_ptr() as u64, p.0, 16, MemcpyKind::D2H)? };
        if back[..16].chunks(4).any(|w| w != 9u32.to_le_bytes()) {
            return Err(unirt::Error::Internal("fill gave other bytes".into()));
        }
        Ok(())
    })();
    b.free(p).and(r)
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

/// A fault in what runs once per process (loading and initialising the driver), injected
/// through `UNIRT_FAKECUDA_FAULTS` into a fresh process: no crash, and a CUDA that is refused
/// says why.
fn startup_fault(spec: &str, code: &str) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = std::process::Command::new(exe)
        .env("FAKECUDA_PROBE_CHILD", "1")
        .env("UNIRT_FAKECUDA_FAULTS", spec)
        .env("UNIRT_BACKENDS", "cuda")
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("the probe crashed ({}): {text}", out.status).into());
    }
    if text.contains("fired: 0") {
        return Err(format!("{spec} never fired: {text}").into());
    }
    let refused = text.lines().find(|l| l.starts_with("unavailable:"));
    if let Some(line) = refused {
        if !line.contains(code) {
            return Err(format!("CUDA refused without naming {code}: {line}").into());
        }
    } else if !text.contains("verify: ok") {
        return Err(format!("CUDA looked available but does not work: {text}").into());
    }
    Ok(())
}

/// A copy of the library without `sym` (its dynamic symbol renamed), probed in a child process.
fn absent(lib: &Path, sym: &str) -> Result<(), Failed> {
    let mut bytes = std::fs::read(lib).map_err(|e| format!("reading {}: {e}", lib.display()))?;
    let pat = format!("\0{sym}\0").into_bytes();
    let mut hits = 0;
    let mut i = 0;
    while let Some(p) = bytes[i..]
        .windows(pat.len())
        .position(|w| w == pat.as_slice())
    {
        bytes[i + p + 1] = b'X';
        hits += 1;
        i += p + pat.len();
    }
    if hits == 0 {
        return Err(format!("{sym} not found in {}", lib.display()).into());
    }
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "unirt-fakecuda-absent-{}-{sym}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let copy = dir.join("libcuda.so.1");
    std::fs::write(&copy, &bytes).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = std::process::Command::new(exe)
        .env("FAKECUDA_PROBE_CHILD", "1")
        .env("UNIRT_CUDA_LIBRARY", &copy)
        .env("UNIRT_BACKENDS", "cuda")
        .output()
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("the probe crashed ({}): {text}", out.status).into());
    }
    if !text.contains(&format!("lacks {sym}")) {
        return Err(format!("CUDA without {sym} was not refused by name: {text}").into());
    }
    Ok(())
}

/// The child side of [`absent`]: discovery and an open, reported on stdout.
fn probe_child() {
    let d = unirt::discover();
    for b in d.backends.iter().filter(|b| b.kind == DeviceKind::Cuda) {
        match &b.reason {
            Some(r) => println!("unavailable: {r}"),
            None => println!("available: {} device(s)", b.devices.len()),
        }
    }
    match unirt::open(CUDA0) {
        Ok(b) => match verify(&b) {
            Ok(()) => println!("verify: ok"),
            Err(e) => println!("verify: {e}"),
        },
        Err(e) => println!("open: {e}"),
    }
    if let Some(lib) = std::env::var_os("UNIRT_CUDA_LIBRARY") {
        if std::env::var_os("UNIRT_FAKECUDA_FAULTS").is_some() {
            println!("fired: {}", Control::open(Path::new(&lib)).fired());
        }
    }
}

/// A graph that waits on an event (an event-wait node) must not reach the driver once the event
/// is destroyed: CUDA would dereference the freed event at instantiate or launch (a SIGSEGV
/// inside cuGraphInstantiateWithFlags was seen on an H100 during random call sequences).
fn graph_waiting_on_destroyed_event() -> Result<(), Failed> {
    let ctl = ctl();
    let misuses = ctl.misuses();
    let b = open_private(CUDA0).map_err(|e| e.to_string())?;
    let s = b.stream_create().map_err(|e| e.to_string())?;
    let e = b
        .event_create(EventFlags::DEFAULT)
        .map_err(|e| e.to_string())?;
    let p = b.malloc(N).map_err(|e| e.to_string())?;
    b.event_record(e, b.default_stream())
        .map_err(|e| e.to_string())?;
    b.begin_capture(s, CaptureMode::Global)
        .map_err(|e| e.to_string())?;
    b.stream_wait_event(s, e).map_err(|e| e.to_string())?;
    b.memset_async(p, 1, N, s).map_err(|e| e.to_string())?;
    let g = b.end_capture(s).map_err(|e| e.to_string())?;
    let x = b.graph_instantiate(g).map_err(|e| e.to_string())?;
    b.event_destroy(e).map_err(|e| e.to_string())?;
    let instantiate = b.graph_instantiate(g);
    let launch = b.graph_launch(x, s);
    let _ = b.stream_synchronize(s);
    if let Ok(x2) = instantiate {
        let _ = b.graph_exec_destroy(x2);
    }
    let _ = b.graph_exec_destroy(x);
    let _ = b.graph_destroy(g);
    let _ = b.free(p);
    let _ = b.stream_destroy(s);
    if ctl.misuses() != misuses {
        return Err(format!(
            "a graph waiting on a destroyed event reached the driver (instantiate: {:?}, launch: {:?}):\n{}",
            instantiate.map(|_| ()),
            launch,
            ctl.misuse_log()
        )
        .into());
    }
    if instantiate.is_ok() || launch.is_ok() {
        return Err(format!(
            "instantiate ({:?}) or launch ({launch:?}) of a graph waiting on a destroyed event succeeded",
            instantiate.map(|_| ())
        )
        .into());
    }
    Ok(())
}
