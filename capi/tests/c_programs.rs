//! Builds the C test programs with the system C compiler, links them against the
//! `libinfinirt.so` cargo just built for this test run, and runs them.
//!
//! The cdylib is produced by the same rustc invocation as the rlib this test links against
//! (the crate's lib target lists both), so it is always fresh when the test runs. It sits in
//! the test executable's own directory (`target/<profile>/deps/`) and is uplifted to
//! `target/<profile>/`.
//!
//! Without a C compiler (`CC`, else `cc`) the tests print why and pass; `ci/capi-valgrind.sh`
//! and CI images have one.

use std::path::{Path, PathBuf};
use std::process::Command;

const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");

/// The directory holding the freshly built `libinfinirt.so`.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe
        .parent()
        .expect("test executable directory")
        .to_path_buf();
    let mut candidates = vec![deps.clone()];
    if let Some(profile) = deps.parent() {
        candidates.push(profile.to_path_buf());
    }
    if let Ok(t) = std::env::var("CARGO_TARGET_DIR") {
        candidates.push(Path::new(&t).join("debug"));
    }
    candidates
        .into_iter()
        .find(|d| d.join("libinfinirt.so").is_file())
        .unwrap_or_else(|| panic!("libinfinirt.so not found next to {}", exe.display()))
}

fn compiler(var: &str, default: &str) -> Option<String> {
    let cc = std::env::var(var).unwrap_or_else(|_| default.to_string());
    let found = Command::new(&cc)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if found {
        Some(cc)
    } else {
        eprintln!("SKIPPED: no C compiler ({var}={cc} not runnable)");
        None
    }
}

/// Compiles `source` into an executable linked with `-linfinirt`; None without a compiler.
fn build(source: &Path, name: &str) -> Option<PathBuf> {
    let cc = compiler("CC", "cc")?;
    let lib = lib_dir();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let include = Path::new(MANIFEST).join("include");
    let tests_c = Path::new(MANIFEST).join("tests/c");
    let status = Command::new(&cc)
        .args(["-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(&include)
        .arg("-I")
        .arg(&tests_c)
        .arg(source)
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(&lib)
        .arg("-linfinirt")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lpthread")
        .arg("-ldl")
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "compiling {} failed", source.display());
    Some(out)
}

fn run(exe: &Path) {
    let out = Command::new(exe)
        .env("LD_LIBRARY_PATH", lib_dir())
        .output()
        .expect("run the C test program");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{} failed: {}",
        exe.display(),
        out.status
    );
}

#[test]
fn abi_test_c() {
    if let Some(exe) = build(&Path::new(MANIFEST).join("tests/c/abi_test.c"), "abi_test") {
        run(&exe);
    }
}

#[test]
fn infinirt_test_c() {
    if let Some(exe) = build(
        &Path::new(MANIFEST).join("tests/c/infinirt_test.c"),
        "infinirt_test",
    ) {
        run(&exe);
    }
}

/// Memory lifetimes under queued work, threads and graphs (issue 10).
#[test]
fn lifetime_test_c() {
    if let Some(exe) = build(
        &Path::new(MANIFEST).join("tests/c/lifetime_test.c"),
        "lifetime_test",
    ) {
        run(&exe);
    }
}

/// A child forked while work is pending gets statuses for the parent's objects and works on
/// fresh ones; it never hangs (the program kills a child that does, and fails).
#[test]
fn fork_test_c() {
    if let Some(exe) = build(
        &Path::new(MANIFEST).join("tests/c/fork_test.c"),
        "fork_test",
    ) {
        run(&exe);
    }
}

/// Discovery and each device's first use from a thread with a 32 KiB stack: no overflow (unirt
/// runs them on a roomy stack of its own), and every device works after.
#[test]
fn small_stack_test_c() {
    if let Some(exe) = build(
        &Path::new(MANIFEST).join("tests/c/small_stack_test.c"),
        "small_stack_test",
    ) {
        run(&exe);
    }
}

/// A pthread key destructor (run after the library's thread-locals are gone) that sets a
/// device, copies, times, captures, replays and frees: each call works, on the device it set.
#[test]
fn thread_exit_test_c() {
    if let Some(exe) = build(
        &Path::new(MANIFEST).join("tests/c/thread_exit_test.c"),
        "thread_exit_test",
    ) {
        run(&exe);
    }
}

/// Sizes no machine can give, through every call that takes one: statuses, no abort.
#[test]
fn sizes_test_c() {
    if let Some(exe) = build(
        &Path::new(MANIFEST).join("tests/c/sizes_test.c"),
        "sizes_test",
    ) {
        run(&exe);
    }
}

/// The C ABI fuzzer (`tests/c/fuzz_test.c`) for a few seconds on every device, single-threaded
/// (seeds replay exactly) and with four threads sharing one seed's objects; `ci/test.sh` runs
/// it longer, over the fake CUDA driver too. A failing seed is printed; see
/// docs/RELIABILITY.md.
#[test]
fn fuzz_test_c() {
    let Some(exe) = build(
        &Path::new(MANIFEST).join("tests/c/fuzz_test.c"),
        "fuzz_test",
    ) else {
        return;
    };
    let seconds = std::env::var("UNIRT_CAPI_FUZZ_SECONDS").unwrap_or_else(|_| "2".into());
    for threads in ["1", "4"] {
        let out = Command::new(&exe)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("UNIRT_CAPI_FUZZ_SECONDS", &seconds)
            .env("UNIRT_CAPI_FUZZ_THREADS", threads)
            .output()
            .expect("run the C fuzzer");
        let stdout = String::from_utf8_lossy(&out.stdout);
        // The per-seed lines are for replaying a crash; show the summary and any failure.
        for line in stdout.lines().filter(|l| !l.starts_with("fuzz: device ")) {
            println!("{line}");
        }
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success(),
            "fuzz_test ({threads} threads) failed: {}; the last seed line: {:?}",
            out.status,
            stdout.lines().rfind(|l| l.starts_with("fuzz: device "))
        );
    }
}

#[test]
fn example_capture_replay_c() {
    let src = Path::new(MANIFEST).join("../examples/c/capture_replay.c");
    if let Some(exe) = build(&src, "capture_replay") {
        run(&exe);
    }
}

/// The headers are valid C++ too (`extern "C"` linkage), as upstream's C++ users need.
#[test]
fn headers_compile_as_cxx() {
    let Some(cxx) = compiler("CXX", "c++") else {
        return;
    };
    let src = Path::new(env!("CARGO_TARGET_TMPDIR")).join("headers_check.cc");
    std::fs::write(
        &src,
        "#include <infinirt.h>\n\
         static_assert(sizeof(infinirtDeviceResourceSnapshot_t) == 80, \"layout\");\n\
         int main() { infiniDevice_t d = INFINI_DEVICE_UNIRT_WGPU; (void)d;\n\
         return infinirtGraphLuanch(nullptr, nullptr) == INFINI_STATUS_SUCCESS; }\n",
    )
    .expect("write the C++ check");
    let status = Command::new(cxx)
        .args(["-std=c++11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"])
        .arg("-I")
        .arg(Path::new(MANIFEST).join("include"))
        .arg(&src)
        .status()
        .expect("run the C++ compiler");
    assert!(status.success(), "the headers do not compile as C++");
}

/// The static library links with the system libraries the README names, and works.
#[test]
fn example_links_statically() {
    let Some(cc) = compiler("CC", "cc") else {
        return;
    };
    let archive = lib_dir().join("libinfinirt.a");
    assert!(archive.is_file(), "{} missing", archive.display());
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("capture_replay_static");
    let status = Command::new(cc)
        .args(["-std=c11", "-Wall", "-Werror"])
        .arg("-I")
        .arg(Path::new(MANIFEST).join("include"))
        .arg(Path::new(MANIFEST).join("../examples/c/capture_replay.c"))
        .arg(&archive)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&out)
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "static link failed");
    run(&out);
}

#[test]
fn calls_from_thread_exit_and_atexit_work() {
    if let Some(exe) = build(
        &Path::new(MANIFEST).join("tests/c/exit_paths.c"),
        "exit_paths",
    ) {
        run(&exe);
    }
}
