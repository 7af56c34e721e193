//! Helpers shared by the CUDA integration tests: run the built `unirt` binary with driver
//! overrides, and find out on our own which CUDA packages this machine has, so every test
//! checks the right outcome on machines with and without them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `unirt` with `args`, with the CUDA overrides set as given (and unset otherwise).
pub fn unirt(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_unirt"));
    cmd.args(args)
        .env_remove("UNIRT_CUDA_LIBRARY")
        .env_remove("UNIRT_NVRTC_LIBRARY")
        .env_remove("UNIRT_BACKENDS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the unirt binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked"),
        "unirt {args:?} panicked: {stderr}"
    );
    out
}

/// The `cuda` entry of `unirt devices --json` under `env`: (status, reason, devices).
pub fn cuda_report(env: &[(&str, &str)]) -> (String, String, Vec<serde_json::Value>) {
    let out = unirt(&["devices", "--json"], env);
    assert!(out.status.success(), "unirt devices --json failed: {out:?}");
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("devices --json prints JSON");
    let cuda = v["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["kind"] == "cuda"))
        .cloned()
        .expect("a cuda entry in the discovery report");
    (
        cuda["status"].as_str().unwrap_or_default().to_string(),
        cuda["reason"].as_str().unwrap_or_default().to_string(),
        cuda["devices"].as_array().cloned().unwrap_or_default(),
    )
}

/// Directories where a distribution or NVIDIA's installer puts libcuda / NVRTC.
fn lib_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|s| s.starts_with('/'))
        .map(PathBuf::from)
        .collect();
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/lib64",
        "/usr/lib",
        "/usr/lib/wsl/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

fn has_file(dir: &Path, pred: impl Fn(&str) -> bool) -> bool {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .any(|e| pred(&e.file_name().to_string_lossy()) && e.path().is_file())
        })
        .unwrap_or(false)
}

/// Whether a libcuda is installed in a standard place.
pub fn libcuda_installed() -> bool {
    lib_dirs()
        .iter()
        .any(|d| d.join("libcuda.so.1").is_file() || d.join("libcuda.so").is_file())
}

/// Whether an NVRTC is installed in a standard place (unirt also looks in a few more).
pub fn nvrtc_installed() -> bool {
    let mut dirs = lib_dirs();
    for t in ["/usr/local/cuda/lib64", "/usr/local/cuda/lib"] {
        dirs.push(PathBuf::from(t));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(PathBuf::from(&v).join("lib64"));
            dirs.push(PathBuf::from(&v).join("lib"));
        }
    }
    dirs.iter().any(|d| {
        has_file(d, |n| {
            n.strip_prefix("libnvrtc.so")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        })
    })
}

/// Whether the NVIDIA kernel driver shows a GPU.
pub fn gpu_present() -> bool {
    Path::new("/dev/nvidia0").exists()
        || std::fs::read_dir("/proc/driver/nvidia/gpus")
            .map(|mut rd| rd.next().is_some())
            .unwrap_or(false)
}
