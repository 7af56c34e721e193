//! CUDA discovery in every driver situation, through the built binary: libcuda and NVRTC
//! present or absent (really, or hidden with the `UNIRT_*_LIBRARY` overrides), with and without
//! a GPU. Each case checks the reason text `unirt devices --json` gives, and that nothing
//! panics. What is expected is worked out from what this machine really has installed.

mod cuda_common;

use cuda_common::*;

const HIDDEN_CUDA: (&str, &str) = ("UNIRT_CUDA_LIBRARY", "/nonexistent/unirt-test/libcuda.so.1");
const HIDDEN_NVRTC: (&str, &str) = (
    "UNIRT_NVRTC_LIBRARY",
    "/nonexistent/unirt-test/libnvrtc.so.12",
);

/// Checks the NVRTC half of a reason against what is installed.
fn check_nvrtc_part(reason: &str) {
    if reason.contains("NVRTC not found") {
        assert!(
            !nvrtc_installed(),
            "NVRTC is installed but unirt did not find it: {reason}"
        );
        assert!(reason.contains("(searched "), "{reason}");
    } else {
        assert!(
            reason.contains("NVRTC ") && reason.contains(" at /"),
            "no NVRTC version and path in: {reason}"
        );
    }
}

#[test]
fn real_drivers_are_reported_accurately() {
    let (status, reason, devices) = cuda_report(&[]);
    println!("cuda: {status}: {reason}");
    if !libcuda_installed() && !reason.contains("libcuda ") {
        // No libcuda anywhere standard: the reason lists the search.
        assert_eq!(status, "unavailable");
        assert!(reason.contains("libcuda not found (searched "), "{reason}");
        check_nvrtc_part(&reason);
        return;
    }
    if gpu_present() && nvrtc_installed() {
        assert_eq!(status, "available", "{reason}");
        assert!(!devices.is_empty());
        for d in &devices {
            assert!(!d["name"].as_str().unwrap_or("").is_empty());
            assert!(d["memory_total"].as_u64().unwrap_or(0) > 0);
            let details = d["details"].to_string();
            assert!(details.contains("compute_capability"), "{details}");
        }
        return;
    }
    assert_eq!(status, "unavailable");
    assert!(devices.is_empty());
    if !gpu_present() {
        // A real libcuda with no GPU: cuInit says CUDA_ERROR_NO_DEVICE.
        assert!(reason.starts_with("libcuda "), "{reason}");
        assert!(
            reason.contains(" loaded, no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE"),
            "{reason}"
        );
    }
    check_nvrtc_part(&reason);
}

#[test]
fn hidden_libcuda_is_not_found_with_the_searched_path() {
    let (status, reason, devices) = cuda_report(&[HIDDEN_CUDA]);
    println!("cuda: {status}: {reason}");
    assert_eq!(status, "unavailable");
    assert!(devices.is_empty());
    assert!(
        reason.starts_with(
            "libcuda not found (searched UNIRT_CUDA_LIBRARY=/nonexistent/unirt-test/libcuda.so.1"
        ),
        "{reason}"
    );
    check_nvrtc_part(&reason);
}

#[test]
fn hidden_nvrtc_is_not_found_with_the_searched_path() {
    let (status, reason, _) = cuda_report(&[HIDDEN_NVRTC]);
    println!("cuda: {status}: {reason}");
    assert_eq!(status, "unavailable");
    assert!(
        reason.contains(
            "NVRTC not found (searched UNIRT_NVRTC_LIBRARY=/nonexistent/unirt-test/libnvrtc.so.12"
        ),
        "{reason}"
    );
    if libcuda_installed() && !gpu_present() {
        assert!(reason.contains("no CUDA device"), "{reason}");
    }
}

#[test]
fn both_hidden_lists_both_searches() {
    let (status, reason, _) = cuda_report(&[HIDDEN_CUDA, HIDDEN_NVRTC]);
    println!("cuda: {status}: {reason}");
    assert_eq!(status, "unavailable");
    assert!(
        reason.contains("libcuda not found (searched UNIRT_CUDA_LIBRARY="),
        "{reason}"
    );
    assert!(
        reason.contains("NVRTC not found (searched UNIRT_NVRTC_LIBRARY="),
        "{reason}"
    );
}

#[test]
fn relative_override_is_refused_not_loaded() {
    let (status, reason, _) = cuda_report(&[("UNIRT_CUDA_LIBRARY", "libcuda.so.1")]);
    assert_eq!(status, "unavailable");
    assert!(reason.contains("is not an absolute path"), "{reason}");
}

#[test]
fn a_file_that_is_not_libcuda_fails_cleanly() {
    let dir = std::env::temp_dir().join(format!("unirt-cuda-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("libcuda.so.1");
    std::fs::write(&junk, b"this is not an ELF shared object").unwrap();
    let (status, reason, _) = cuda_report(&[("UNIRT_CUDA_LIBRARY", junk.to_str().unwrap())]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(status, "unavailable");
    assert!(
        reason.starts_with("libcuda found but failed to load"),
        "{reason}"
    );
}

#[test]
fn benchmarking_an_unavailable_cuda_fails_cleanly() {
    let (status, _, _) = cuda_report(&[]);
    if status == "available" {
        println!("skipped: a CUDA device is present");
        return;
    }
    let args = ["bench", "cuda", "--device", "cuda:0"];
    let out = unirt(&args, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "unirt {args:?}: {stderr}");
    assert!(
        stderr.contains("cuda unavailable: "),
        "unirt {args:?}: {stderr}"
    );
    // The same with the libraries hidden: still an error message, not a crash.
    let out = unirt(&args, &[HIDDEN_CUDA, HIDDEN_NVRTC]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("libcuda not found"), "{stderr}");
}

/// Builds a stand-in libcuda whose `cuDeviceGetCount` answers `count` (every entry point
/// unirt resolves exists; all but the few discovery calls fail). None without a C compiler.
fn fake_libcuda(name: &str, count: i32) -> Option<std::path::PathBuf> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let driver_rs =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../vendors/cuda/driver.rs");
    let text = std::fs::read_to_string(&driver_rs).expect("read vendors/cuda/driver.rs");
    let table = text
        .split("cuda_api! {")
        .nth(1)
        .and_then(|t| t.split('}').next())
        .expect("the cuda_api! table");
    let special = [
        "cuInit",
        "cuDriverGetVersion",
        "cuDeviceGetCount",
        "cuGetErrorName",
        "cuGetErrorString",
    ];
    let mut c = format!(
        "int cuInit(unsigned f) {{ (void)f; return 0; }}\n\
         int cuDriverGetVersion(int *v) {{ *v = 12020; return 0; }}\n\
         int cuDeviceGetCount(int *n) {{ *n = {count}; return 0; }}\n\
         int cuGetErrorName(int r, const char **s) {{ (void)r; *s = \"CUDA_ERROR_FAKE\"; return 0; }}\n\
         int cuGetErrorString(int r, const char **s) {{ (void)r; *s = \"a stand-in driver\"; return 0; }}\n"
    );
    for line in table.lines() {
        let Some((sym, _)) = line.trim().split_once('(') else {
            continue;
        };
        if sym.starts_with("cu") && !special.contains(&sym) {
            // CUDA_ERROR_NOT_SUPPORTED for everything else.
            c.push_str(&format!("int {sym}(void) {{ return 801; }}\n"));
        }
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join("fake_cuda.c");
    std::fs::write(&src, c).ok()?;
    let lib = dir.join("libcuda.so.1");
    let built = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status();
    match built {
        Ok(s) if s.success() => Some(lib),
        Ok(s) => panic!("building the stand-in libcuda failed: {s}"),
        Err(e) => {
            println!("skipped: no C compiler ({cc}: {e})");
            None
        }
    }
}

/// A driver reporting INT_MAX devices once made discovery allocate 326 GB and abort
/// (issue 10): a count past the sane maximum is a driver fault, reported with the reason.
#[test]
fn an_absurd_device_count_is_a_reason_not_an_allocation() {
    for (name, count) in [("fake-cuda-int-max", i32::MAX), ("fake-cuda-1025", 1025)] {
        let Some(lib) = fake_libcuda(name, count) else {
            return;
        };
        let (status, reason, devices) =
            cuda_report(&[("UNIRT_CUDA_LIBRARY", lib.to_str().unwrap())]);
        println!("cuda with {count} devices: {status}: {reason}");
        assert_eq!(status, "unavailable", "{reason}");
        assert!(devices.is_empty());
        assert!(
            reason.contains(&format!("reported {count} devices")) && reason.contains("1024"),
            "{reason}"
        );
    }
}

/// `unirt devices --verbose` lists every place each library was looked for, and `--json
/// --verbose` the same under `library_searches`.
#[test]
fn verbose_lists_every_searched_place() {
    let out = unirt(&["devices", "--verbose"], &[HIDDEN_NVRTC]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("cuda libcuda: "), "{text}");
    assert!(
        text.contains("cuda NVRTC: 1 place(s) searched (UNIRT_NVRTC_LIBRARY overrides them all)"),
        "{text}"
    );
    assert!(
        text.contains("  searched  UNIRT_NVRTC_LIBRARY=/nonexistent/unirt-test/libnvrtc.so.12"),
        "{text}"
    );
    let out = unirt(&["devices", "--json", "--verbose"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let searches = v["library_searches"].as_array().expect("library_searches");
    assert!(searches
        .iter()
        .any(|s| s["library"] == "libcuda"
            && s["searched"].as_array().is_some_and(|a| !a.is_empty())));
}
