//! What gets loaded (issue 17, item 5): with an empty entry in `LD_LIBRARY_PATH`, wgpu's bare
//! `dlopen("libvulkan.so.1")` / `dlopen("libEGL.so.1")` would load a library planted in the
//! current directory. unirt must not start those loaders then, and must say why.
//!
//! The test plants libraries whose constructor writes a marker file in a temporary directory,
//! and runs discovery in a child process (this test binary again: the dynamic linker reads
//! `LD_LIBRARY_PATH` only at start-up) with that directory as its working directory. A control
//! run that opts in with `UNIRT_TRUST_LD_LIBRARY_PATH=1` shows the planted libraries really
//! would have run.

use std::path::{Path, PathBuf};
use std::process::Command;

const CHILD: &str = "UNIRT_LOADER_TEST_CHILD";
const MARKER: &str = "UNIRT_LOADER_TEST_MARKER";

/// The names wgpu (and libglvnd) open by bare name.
const PLANTED: [&str; 4] = [
    "libvulkan.so.1",
    "libEGL.so.1",
    "libEGL.so",
    "libEGL_mesa.so.0",
];

/// In the child: discovery, and the wgpu line of its report on stdout.
fn child() {
    let d = unirt::discover();
    let w = d.backend(unirt::DeviceKind::Wgpu).expect("a wgpu entry");
    println!(
        "WGPU {} {} :: {}",
        w.status,
        w.devices.len(),
        w.reason.clone().unwrap_or_default()
    );
    let cpu = d.backend(unirt::DeviceKind::Cpu).expect("a cpu entry");
    assert!(cpu.available(), "the CPU must stay available");
}

/// Builds the planted libraries into `dir`; false without a C compiler.
fn plant(dir: &Path) -> bool {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let src = dir.join("planted.c");
    std::fs::write(
        &src,
        "#include <fcntl.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
         __attribute__((constructor)) static void planted(void) {\n\
           const char *m = getenv(\"UNIRT_LOADER_TEST_MARKER\");\n\
           if (m) { int fd = open(m, O_CREAT | O_WRONLY | O_APPEND, 0600);\n\
                    if (fd >= 0) { (void)!write(fd, \"ran\\n\", 4); close(fd); } }\n\
         }\n",
    )
    .expect("write the planted source");
    let lib = dir.join("planted.so");
    match Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
    {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("building the planted library failed: {s}"),
        Err(e) => {
            println!("skipped: no C compiler ({cc}: {e})");
            return false;
        }
    }
    for name in PLANTED {
        std::fs::copy(&lib, dir.join(name)).expect("plant a copy");
    }
    true
}

/// Runs the child in `dir` with an empty entry in front of `LD_LIBRARY_PATH`; returns its
/// wgpu line and whether a planted constructor ran.
fn run_child(dir: &Path, marker: &Path, trust: bool) -> (String, bool) {
    let _ = std::fs::remove_file(marker);
    let inherited = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
    cmd.args([
        "child_process",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .current_dir(dir)
    .env(CHILD, "1")
    .env(MARKER, marker)
    .env("LD_LIBRARY_PATH", format!(":{inherited}"))
    .env_remove("UNIRT_BACKENDS")
    .env_remove("UNIRT_WGPU_BACKENDS");
    if trust {
        cmd.env("UNIRT_TRUST_LD_LIBRARY_PATH", "1");
    } else {
        cmd.env_remove("UNIRT_TRUST_LD_LIBRARY_PATH");
    }
    let out = cmd.output().expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the child failed ({}): {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // libtest prints the test's own output after "test child_process ... ".
    let line = stdout
        .lines()
        .find_map(|l| l.find("WGPU ").map(|at| l[at..].to_string()))
        .unwrap_or_else(|| format!("(no wgpu line in the child's output: {stdout})"));
    (line, marker.exists())
}

/// The child half (runs only when re-executed by the test below).
#[test]
fn child_process() {
    if std::env::var(CHILD).is_ok() {
        child();
    }
}

#[test]
fn a_planted_loader_in_the_working_directory_never_runs() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let dir: PathBuf =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("planted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    if !plant(&dir) {
        return;
    }
    let marker = dir.join("marker");

    let (line, ran) = run_child(&dir, &marker, false);
    println!("default: {line}");
    assert!(!ran, "a planted library ran: {line}");
    assert!(
        line.starts_with("WGPU unavailable 0 :: ")
            && line.contains("LD_LIBRARY_PATH")
            && line.contains("an empty entry"),
        "{line}"
    );

    // The control: trusting the search path loads the planted libraries, so the check above
    // is meaningful here.
    let (line, ran) = run_child(&dir, &marker, true);
    println!("trusted: {line}");
    assert!(
        ran,
        "the planted libraries were not loaded even when trusted: {line}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
