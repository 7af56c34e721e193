//! Trials that need a fresh process (faults in what runs once per process, absent symbols) and
//! regression trials.

use super::*;

/// A fault in what runs once per process (loading and initialising the driver), injected
/// through `UNIRT_FAKECUDA_FAULTS` into a fresh process: no crash, and a CUDA that is refused
/// says why.
pub(crate) fn startup_fault(spec: &str, code: &str) -> Result<(), Failed> {
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
pub(crate) fn absent(lib: &Path, sym: &str) -> Result<(), Failed> {
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
pub(crate) fn probe_child() {
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
pub(crate) fn graph_waiting_on_destroyed_event() -> Result<(), Failed> {
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
