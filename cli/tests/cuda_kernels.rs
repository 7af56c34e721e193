//! Every CUDA kernel (the HAL's and every op family × dtype, each with the parameter size its
//! CUBIN declares checked against the host's) compiles to CUBIN for sm_70/80/90 with NVRTC —
//! no GPU needed — through `unirt kernels --compile cuda`; `ci/test.sh` runs this test. Without NVRTC the test says it is skipped and why, and checks
//! the command's "not found" failure instead.

mod cuda_common;

use cuda_common::*;

const ARCHS: &str = "sm_70,sm_80,sm_90";

fn json_path(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("unirt-kernels-{tag}-{}.json", std::process::id()))
}

#[test]
fn every_cuda_kernel_compiles_for_sm70_sm80_sm90() {
    let json = json_path("all");
    let out = unirt(
        &[
            "kernels",
            "--compile",
            "cuda",
            "--arch",
            ARCHS,
            "--json",
            json.to_str().unwrap(),
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if stderr.contains("NVRTC not found") {
        println!("skipped: NVRTC not found: {}", stderr.trim());
        assert!(
            !nvrtc_installed(),
            "NVRTC is installed but unirt missed it: {stderr}"
        );
        assert_eq!(out.status.code(), Some(2));
        assert!(stderr.contains("(searched "), "{stderr}");
        return;
    }
    println!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(out.status.success(), "kernels --compile failed: {stderr}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let rows = v["compiled"].as_array().expect("a compiled array");
    // The HAL's two kernels and every op family's entries for every dtype, for every arch.
    let count = v["kernel_count"].as_u64().unwrap_or(0) as usize;
    assert!(count > 100, "the op kernels are listed: {count}");
    assert_eq!(rows.len(), count * 3, "every kernel for every arch");
    for row in rows {
        assert_eq!(row["ok"], true, "{row}");
    }
    for op in [
        "elementwise/f16:op_add",
        "matmul/bf16:op_matmul",
        "attention/f32:op_attention_decode",
    ] {
        assert!(rows.iter().any(|r| r["kernel"] == op), "no row for {op}");
    }
    for arch in ["sm_70", "sm_80", "sm_90"] {
        for kernel in ["fill", "add_f32"] {
            let row = rows
                .iter()
                .find(|r| r["arch"] == arch && r["kernel"] == kernel)
                .unwrap_or_else(|| panic!("no row for {kernel} {arch}: {v}"));
            assert_eq!(row["ok"], true, "{row}");
            assert!(row["log"].is_string());
            assert!(row["bytes"].as_u64().unwrap_or(0) > 0, "{row}");
        }
    }
}

#[test]
fn an_unknown_architecture_fails_with_nvrtcs_log_and_exit_1() {
    let json = json_path("bad");
    let out = unirt(
        &[
            "kernels",
            "--compile",
            "cuda",
            "--arch",
            "sm_12",
            "--json",
            json.to_str().unwrap(),
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("NVRTC not found") {
        println!("skipped: NVRTC not found");
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    for row in v["compiled"].as_array().unwrap() {
        assert_eq!(row["ok"], false, "{row}");
        assert!(!row["log"].as_str().unwrap_or("").is_empty(), "{row}");
    }
}

#[test]
fn hidden_nvrtc_makes_compile_fail_cleanly() {
    let out = unirt(
        &["kernels", "--compile", "cuda", "--arch", ARCHS],
        &[("UNIRT_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("NVRTC not found (searched UNIRT_NVRTC_LIBRARY=/nonexistent/libnvrtc.so"),
        "{stderr}"
    );
}
