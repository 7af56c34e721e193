//! Shared by the fake-driver test targets: builds `libunirt_fakecuda.so` and reaches its control
//! interface (`unirt_fakecuda_*`) through the dynamic loader, on the very library instance
//! unirt's CUDA backend loaded (the same absolute path is one instance in a process).

#![allow(dead_code)]

use std::ffi::{c_char, c_int, CString};
use std::path::PathBuf;
use std::process::Command;

/// The fake driver's shared library: `UNIRT_FAKECUDA_LIB` when set, else built now with the
/// cargo that runs these tests (same profile, same target directory).
pub fn library() -> PathBuf {
    if let Some(p) = std::env::var_os("UNIRT_FAKECUDA_LIB") {
        return PathBuf::from(p);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--quiet",
        "-p",
        "unirt-fakecuda",
        "--message-format=json-render-diagnostics",
    ]);
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    let out = cmd
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo to build unirt-fakecuda");
    assert!(
        out.status.success(),
        "cargo build -p unirt-fakecuda failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] == "compiler-artifact" && v["target"]["name"] == "unirt_fakecuda" {
            if let Some(files) = v["filenames"].as_array() {
                for f in files.iter().filter_map(|f| f.as_str()) {
                    if f.ends_with(".so") {
                        return PathBuf::from(f);
                    }
                }
            }
        }
    }
    panic!("cargo built unirt-fakecuda but named no .so artifact");
}

/// Points unirt at the fake driver. Call first thing in `main`, before any thread starts and
/// before unirt looks for drivers (discovery reads the environment once).
pub fn use_fake_driver(extra: &[(&str, &str)]) -> (PathBuf, Control) {
    let lib = library();
    // SAFETY (of the environment writes, for editions where they are unsafe): main has not
    // started any thread yet.
    std::env::set_var("UNIRT_CUDA_LIBRARY", &lib);
    for (k, v) in extra {
        std::env::set_var(k, v);
    }
    let ctl = Control::open(&lib);
    (lib, ctl)
}

type SetFaults = unsafe extern "C" fn(*const c_char) -> c_int;
type Calls = unsafe extern "C" fn(*const c_char) -> u64;
type Count = unsafe extern "C" fn() -> u64;
type Log = unsafe extern "C" fn(*mut c_char, usize) -> usize;
type Live = unsafe extern "C" fn(c_int) -> u64;

/// The fake driver's control interface.
pub struct Control {
    set_faults: SetFaults,
    calls: Calls,
    fired: Count,
    misuses: Count,
    poisoned: Count,
    reset: unsafe extern "C" fn(),
    log: Log,
    live: Live,
    _lib: libloading::Library,
}

/// What `unirt_fakecuda_live` counts, by index.
pub const LIVE_KINDS: [&str; 10] = [
    "device allocations",
    "pinned allocations",
    "streams",
    "events",
    "graphs",
    "graph execs",
    "modules",
    "context references",
    "captures",
    "device bytes",
];

impl Control {
    pub fn open(lib: &std::path::Path) -> Control {
        // SAFETY: the fake driver's initialisers have no preconditions; every symbol below is
        // declared with the prototype the fake driver exports it with.
        unsafe {
            let l = libloading::Library::new(lib).expect("loading the fake driver");
            Control {
                set_faults: *l.get::<SetFaults>(b"unirt_fakecuda_set_faults\0").unwrap(),
                calls: *l.get::<Calls>(b"unirt_fakecuda_calls\0").unwrap(),
                fired: *l.get::<Count>(b"unirt_fakecuda_fired\0").unwrap(),
                misuses: *l.get::<Count>(b"unirt_fakecuda_misuses\0").unwrap(),
                poisoned: *l.get::<Count>(b"unirt_fakecuda_poisoned\0").unwrap(),
                reset: *l
                    .get::<unsafe extern "C" fn()>(b"unirt_fakecuda_reset\0")
                    .unwrap(),
                log: *l.get::<Log>(b"unirt_fakecuda_misuse_log\0").unwrap(),
                live: *l.get::<Live>(b"unirt_fakecuda_live\0").unwrap(),
                _lib: l,
            }
        }
    }

    /// Replaces the fault list (see the fake driver's `faults` module); panics when it does
    /// not parse (a typo in a test).
    pub fn set_faults(&self, spec: &str) {
        let c = CString::new(spec).unwrap();
        // SAFETY: a NUL-terminated string.
        let r = unsafe { (self.set_faults)(c.as_ptr()) };
        assert_eq!(r, 0, "fault list {spec:?} rejected");
    }

    pub fn calls(&self, name: &str) -> u64 {
        let c = CString::new(name).unwrap();
        // SAFETY: a NUL-terminated string.
        unsafe { (self.calls)(c.as_ptr()) }
    }

    pub fn fired(&self) -> u64 {
        // SAFETY: no arguments.
        unsafe { (self.fired)() }
    }

    pub fn misuses(&self) -> u64 {
        // SAFETY: no arguments.
        unsafe { (self.misuses)() }
    }

    /// Contexts poisoned by injected sticky errors so far.
    pub fn poisoned(&self) -> u64 {
        // SAFETY: no arguments.
        unsafe { (self.poisoned)() }
    }

    /// Destroys every context in the driver (as process exit would).
    pub fn reset(&self) {
        // SAFETY: no arguments.
        unsafe { (self.reset)() }
    }

    pub fn misuse_log(&self) -> String {
        let mut buf = vec![0u8; 1 << 16];
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { (self.log)(buf.as_mut_ptr() as *mut c_char, buf.len()) };
        buf.truncate(n.min(buf.len() - 1));
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Every live count, in [`LIVE_KINDS`] order.
    pub fn live(&self) -> [u64; 10] {
        // SAFETY: kinds 0..10 are defined.
        std::array::from_fn(|k| unsafe { (self.live)(k as c_int) })
    }
}

/// The CUDA driver entry points unirt loads, read from the CUDA backend's own declaration (the
/// `cuda_api!` list in `vendors/cuda/`), so a new one is covered by the fault matrix without
/// editing this list.
pub fn loaded_symbols() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../vendors/cuda");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    for f in files {
        let src = std::fs::read_to_string(&f).unwrap_or_default();
        let Some(start) = src.find("cuda_api! {") else {
            continue;
        };
        let body = &src[start..];
        let end = body.find("\n}").unwrap_or(body.len());
        let names: Vec<String> = body[..end]
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                (l.starts_with("cu") && l.ends_with(");"))
                    .then(|| l.split('(').next().unwrap_or("").to_string())
            })
            .filter(|n| !n.is_empty())
            .collect();
        assert!(
            !names.is_empty(),
            "{}: an empty cuda_api! list",
            f.display()
        );
        return names;
    }
    panic!("no cuda_api! list under {}", dir.display());
}
