//! The `unirt` command's JSON shapes and exit codes, run as a user would run it.

use std::process::{Command, Output};

use serde_json::Value;

fn unirt(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_unirt"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the unirt binary runs")
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn no_panic(out: &Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "the command panicked: {err}");
}

#[test]
fn devices_json_shape() {
    let out = unirt(&["devices", "--json"], &[]);
    no_panic(&out);
    assert!(out.status.success());
    let v = json_of(&out);
    let backends = v["backends"].as_array().expect("backends array");
    let kinds: Vec<&str> = backends
        .iter()
        .map(|b| b["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["cpu", "cuda", "wgpu"]);
    for b in backends {
        let status = b["status"].as_str().unwrap();
        assert!(
            status == "available" || status == "unavailable",
            "status {status}"
        );
        assert_eq!(
            b["reason"].is_null(),
            status == "available",
            "reason iff unavailable: {b}"
        );
        assert!(b["devices"].is_array());
        assert!(b["unusable"].is_array(), "{b}");
        if status == "unavailable" {
            assert!(!b["reason"].as_str().unwrap().is_empty());
            assert_eq!(b["devices"].as_array().unwrap().len(), 0);
        }
    }
    let cpu = &backends[0];
    assert_eq!(cpu["status"], "available");
    let d = &cpu["devices"][0];
    assert_eq!(d["index"], 0);
    assert!(!d["name"].as_str().unwrap().is_empty());
    assert!(d["memory_total"].as_u64().unwrap() > 0);
}

#[test]
fn unirt_backends_restricts_probing() {
    let out = unirt(&["devices", "--json"], &[("UNIRT_BACKENDS", "cpu")]);
    no_panic(&out);
    let v = json_of(&out);
    for b in v["backends"].as_array().unwrap() {
        if b["kind"] != "cpu" {
            assert_eq!(b["status"], "unavailable");
            assert!(
                b["reason"].as_str().unwrap().contains("UNIRT_BACKENDS"),
                "{b}"
            );
        }
    }
    let typo = json_of(&unirt(
        &["devices", "--json"],
        &[("UNIRT_BACKENDS", "cpu,vulkan")],
    ));
    let reason = typo["backends"][2]["reason"].as_str().unwrap();
    assert!(reason.contains("unknown names there: vulkan"), "{reason}");
    let table = unirt(&["devices"], &[("UNIRT_BACKENDS", "cpu")]);
    assert!(table.status.success());
    assert!(String::from_utf8_lossy(&table.stdout).contains("cpu   available"));
    // A value that is not UTF-8 restricts too (it was once ignored, enabling every vendor).
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let bad = std::ffi::OsStr::from_bytes(b"cpu\xff");
        for var in ["UNIRT_BACKENDS", "UNIRT_WGPU_BACKENDS"] {
            let out = Command::new(env!("CARGO_BIN_EXE_unirt"))
                .args(["devices", "--json"])
                .env(var, bad)
                .output()
                .unwrap();
            no_panic(&out);
            let v = json_of(&out);
            let wgpu = v["backends"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["kind"] == "wgpu");
            assert_eq!(wgpu.unwrap()["status"], "unavailable", "{var}: {v}");
        }
    }
}

#[test]
fn conformance_json_and_junit_on_cpu() {
    let dir = std::env::temp_dir().join(format!("unirt-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, junit) = (dir.join("r.json"), dir.join("r.xml"));
    let out = unirt(
        &[
            "conformance",
            "--device",
            "cpu",
            "--json",
            json.to_str().unwrap(),
            "--junit",
            junit.to_str().unwrap(),
        ],
        &[],
    );
    no_panic(&out);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = v["results"].as_array().unwrap();
    assert!(results.len() >= 40);
    for r in results {
        assert_eq!(r["device"], "cpu:0");
        assert!(r["case"].is_string());
        assert!(
            ["passed", "failed", "unsupported", "skipped"].contains(&r["status"].as_str().unwrap())
        );
        assert!(r.get("message").is_some());
    }
    let passed = results.iter().filter(|r| r["status"] == "passed").count();
    assert!(passed >= 40, "only {passed} passed");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("<testsuite name=\"cpu:0\""));
    assert_eq!(xml.matches("<testcase ").count(), results.len());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn asking_for_what_is_not_here_fails_clearly() {
    // A vendor that is not probed, a vendor that is unavailable here (this machine has no
    // GPU: CUDA answers "no device" or is not installed), an index past the devices, and a
    // filter matching no case: each exits non-zero with a message, never a green empty run.
    for (args, env, says) in [
        (
            &[
                "conformance",
                "--device",
                "cuda",
                "--filter",
                "memcpy::h2d_sync",
            ][..],
            &[("UNIRT_BACKENDS", "cpu")][..],
            "cuda",
        ),
        (&["conformance", "--device", "cuda:3"], &[], "cuda"),
        (
            &["conformance", "--device", "cpu:1"],
            &[],
            "cpu has 1 device",
        ),
        (
            &[
                "conformance",
                "--device",
                "cpu:0",
                "--filter",
                "no-such-case",
            ],
            &[],
            "no conformance case matches",
        ),
    ] {
        let out = unirt(args, env);
        no_panic(&out);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(says),
            "{args:?}: stderr {err:?} lacks {says:?}"
        );
    }
}

#[test]
fn bench_memcpy_json_shape() {
    let path = std::env::temp_dir().join(format!("unirt-bench-{}.json", std::process::id()));
    let out = unirt(
        &[
            "bench",
            "memcpy",
            "--device",
            "cpu:0",
            "--max-mib",
            "1",
            "--json",
            path.to_str().unwrap(),
        ],
        &[],
    );
    no_panic(&out);
    assert!(out.status.success());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5 * 3, "4 KiB..1 MiB × h2d/d2h/d2d");
    for r in rows {
        assert!(["h2d", "d2h", "d2d"].contains(&r["kind"].as_str().unwrap()));
        assert!(r["bytes"].as_u64().unwrap() >= 4096);
        assert!(r["unirt_gbps"].as_f64().unwrap() > 0.0);
        assert!(r["baseline_gbps"].as_f64().unwrap() > 0.0);
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn bench_graph_json_shape() {
    let path = std::env::temp_dir().join(format!("unirt-bench-graph-{}.json", std::process::id()));
    let out = unirt(
        &[
            "bench",
            "graph",
            "--device",
            "cpu:0",
            "--quick",
            "--json",
            path.to_str().unwrap(),
        ],
        &[],
    );
    no_panic(&out);
    assert!(out.status.success());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["device"], "cpu:0");
    let rows = v["rows"].as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "tiny_ops_x100",
            "decode_step",
            "decode_step_device",
            "elementwise_chain4_16MiB",
            "matmul_bias_relu_residual"
        ]
    );
    for r in rows {
        assert!(r["eager_ms"].as_f64().unwrap() > 0.0);
        assert!(r["replay_ms"].as_f64().unwrap() > 0.0);
    }
    let (planned, naive) = (
        rows[1]["peak_bytes_planned"].as_u64().unwrap(),
        rows[1]["peak_bytes_naive"].as_u64().unwrap(),
    );
    assert!(planned > 0 && planned <= naive);
    // The decode steps, the chain and the projection each have fused and unfused replays;
    // the chain and the projection also batched ones.
    for r in &rows[3..] {
        assert!(r["fused_batched_ms"].as_f64().unwrap() > 0.0);
        assert!(r["unfused_batched_ms"].as_f64().unwrap() > 0.0);
    }
    for r in &rows[1..] {
        assert!(r["fused_ms"].as_f64().unwrap() > 0.0);
        assert!(r["unfused_ms"].as_f64().unwrap() > 0.0);
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn fuzz_replays_a_seed_and_names_it_first() {
    // One seed, replayed as a failure report would tell a user to: the seed line comes before
    // any work (a crash leaves it as the last line), then the summary.
    let out = unirt(
        &[
            "fuzz", "--device", "cpu:0", "--seed", "0x2a", "--runs", "1", "--steps", "300",
        ],
        &[],
    );
    no_panic(&out);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let seed_line = err
        .find("fuzz: cpu:0 seed 0x2a")
        .expect("the seed is named");
    let done = err.find("fuzz: cpu:0: 1 seed(s)").expect("one seed ran");
    assert!(seed_line < done, "{err}");
    assert!(err.contains("fuzz: ok"), "{err}");
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    for args in [
        &["conformance", "--device", "tpu:0"][..],
        &["conformance", "--device", "cpu:3"],
        &["bench", "memcpy", "--device", "cpu:7"],
        &["bench", "latency", "--device", "cpu:x"],
        &["fuzz", "--device", "cpu:5"],
        &["fuzz", "--seed", "0xnot-hex"],
        &["nonsense"],
    ] {
        let out = unirt(args, &[]);
        no_panic(&out);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!out.stderr.is_empty(), "{args:?} said nothing");
    }
}

#[test]
fn reports_are_checked_first_and_one_failure_spares_the_other() {
    // A report path that cannot be written fails before the suite runs, naming the file.
    let out = unirt(
        &[
            "conformance",
            "--device",
            "cpu:0",
            "--json",
            "/nonexistent-dir/r.json",
        ],
        &[],
    );
    no_panic(&out);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent-dir/r.json"), "{err}");
    assert!(out.stdout.is_empty(), "the suite ran before the check");

    // So is a file whose writes fail (/dev/full), even when the other report is fine; that
    // one report failing mid-run does not stop the other is a unit test of the CLI
    // (conformance::tests::one_failed_report_spares_the_other).
    let junit = std::env::temp_dir().join(format!("unirt-junit-{}.xml", std::process::id()));
    let out = unirt(
        &[
            "conformance",
            "--device",
            "cpu:0",
            "--filter",
            "memset",
            "--json",
            "/dev/full",
            "--junit",
            junit.to_str().unwrap(),
        ],
        &[],
    );
    no_panic(&out);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/dev/full"), "{err}");
    assert!(out.stdout.is_empty(), "the suite ran before the check");
    assert!(!junit.exists(), "the check left a file behind");
}

#[test]
fn nothing_to_run_on_is_an_error() {
    for args in [&["conformance"][..], &[]] {
        let out = unirt(args, &[("UNIRT_BACKENDS", "bogus")]);
        no_panic(&out);
        assert!(!out.status.success(), "{args:?} with no device succeeded");
        assert!(String::from_utf8_lossy(&out.stderr).contains("no available device"));
    }
    let out = unirt(&["bench", "dispatch", "--device", "cpu:0"], &[]);
    no_panic(&out);
    assert!(
        !out.status.success(),
        "bench dispatch on cpu printed zeros and passed"
    );
}

/// `UNIRT_WGPU_FAIL_OPEN` makes the test-open of the adapters of `wgpu:0`'s API fail: the table
/// and the JSON list them as unusable with the reason and their names, the others renumber, and
/// `conformance --device` finds the renumbered devices and not the old last index.
#[test]
fn an_adapter_that_fails_to_open_is_listed_unusable() {
    let base = json_of(&unirt(&["devices", "--json"], &[]));
    let wgpu = &base["backends"][2];
    let devices = wgpu["devices"].as_array().unwrap();
    let api = devices
        .first()
        .map(|d| d["api"].as_str().unwrap().to_string())
        .unwrap_or_else(|| "vulkan".into());
    let env = [("UNIRT_WGPU_FAIL_OPEN", api.as_str())];
    let out = unirt(&["devices", "--json"], &env);
    no_panic(&out);
    assert!(out.status.success());
    let v = json_of(&out);
    let hurt = &v["backends"][2];
    let left: Vec<&Value> = devices
        .iter()
        .filter(|d| d["api"] != api.as_str())
        .collect();
    let refused: Vec<&Value> = devices
        .iter()
        .filter(|d| d["api"] == api.as_str())
        .collect();
    let now = hurt["devices"].as_array().unwrap();
    assert_eq!(now.len(), left.len(), "{hurt}");
    for (i, (d, was)) in now.iter().zip(&left).enumerate() {
        assert_eq!(d["index"], i, "{hurt}");
        assert_eq!((&d["api"], &d["name"]), (&was["api"], &was["name"]));
    }
    let unusable = hurt["unusable"].as_array().unwrap();
    assert_eq!(unusable.len(), refused.len(), "{hurt}");
    for (u, was) in unusable.iter().zip(&refused) {
        assert_eq!((&u["api"], &u["name"]), (&was["api"], &was["name"]));
        assert!(u["reason"]
            .as_str()
            .unwrap()
            .contains("UNIRT_WGPU_FAIL_OPEN"));
    }
    if !refused.is_empty() {
        let table = unirt(&["devices"], &env);
        let text = String::from_utf8_lossy(&table.stdout);
        let name = refused[0]["name"].as_str().unwrap();
        assert!(
            text.lines().any(|l| l.contains("unusable")
                && l.contains(name)
                && l.contains("UNIRT_WGPU_FAIL_OPEN")),
            "{text}"
        );
    }
    let filter = ["--filter", "discovery::device_listed"];
    let past = format!("wgpu:{}", left.len());
    let out = unirt(
        &[&["conformance", "--device", past.as_str()][..], &filter].concat(),
        &env,
    );
    no_panic(&out);
    assert!(
        !out.status.success(),
        "{past} ran though it is past the devices"
    );
    if !left.is_empty() {
        let out = unirt(
            &[&["conformance", "--device", "wgpu:0"][..], &filter].concat(),
            &env,
        );
        no_panic(&out);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// Probing every device prints nothing on stderr, even with no desktop session (no
/// XDG_RUNTIME_DIR): the library's Vulkan instance leaves out the window-system extensions
/// that make Mesa's device-select layer look for a compositor. (The CLI sets no environment
/// variable for this; what it shows is what a program linking libinfinirt sees.)
#[test]
fn probing_is_quiet_without_a_desktop_session() {
    let out = Command::new(env!("CARGO_BIN_EXE_unirt"))
        .args(["devices"])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("NODEVICE_SELECT")
        .output()
        .expect("the unirt binary runs");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.trim().is_empty(), "stderr: {err}");
}

/// Output into a pipe closed early (`unirt kernels --list | head -1`) ends the command quietly:
/// no panic message, killed by SIGPIPE as `ls | head` is. The pipe is shrunk to one page so
/// the listing (about 10 KiB) cannot fit in it before the reader closes its end.
#[cfg(target_os = "linux")]
#[test]
fn a_closed_pipe_is_not_a_panic() {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::process::Stdio;
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2() writes. Close-on-exec, so the
    // child does not inherit the read end (which would keep the pipe open).
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just created by pipe() and are owned here only.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: a valid pipe descriptor; F_SETPIPE_SZ takes a size in bytes.
    unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 4096) };
    let mut child = Command::new(env!("CARGO_BIN_EXE_unirt"))
        .args(["kernels", "--list"])
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::piped())
        .spawn()
        .expect("the unirt binary runs");
    let mut out = std::fs::File::from(read_end);
    let mut first = [0u8; 1];
    let _ = out.read(&mut first);
    drop(out);
    let mut err = String::new();
    let _ = child
        .stderr
        .take()
        .expect("piped stderr")
        .read_to_string(&mut err);
    let status = child.wait().expect("wait");
    assert!(!err.contains("panicked"), "stderr: {err}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGPIPE),
        "{status:?}, stderr: {err}"
    );
}
