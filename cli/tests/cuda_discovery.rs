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
