//! The process exits while threads use the GL adapter (`vendors/wgpu/exit.rs`) or NVRTC
//! (`vendors/cuda/nvrtc.rs`).
//!
//! Each case is a child process (this binary again, told which case by
//! `UNIRT_EXIT_RACE_CHILD`) that must exit with status 0 and print no panic, many times over:
//!
//! - `delay:<µs>`: four threads each copy through the GL device, report done, and exit with a
//!   thread-local destructor that sleeps for the given time, so that their exit overlaps the
//!   process's; `main` returns as soon as all four reported. Without the fix glibc aborted
//!   (`double free or corruption`, `free(): invalid pointer`) in about a third of the runs;
//!   the library's unit tests failed on CI so, once.
//! - `busy`: four threads copy through the GL device in a loop while `main` returns. Without
//!   the fix: SIGSEGV or a malloc abort in about one run in five.
//!
//! - `kernels:<ms>`: two threads each make a new kernel every step (a user WGSL kernel of a
//!   new name: a new pipeline, compiled by LLVM on lavapipe and llvmpipe) and run it, while
//!   `main` returns after the given time; Mesa's shader cache is off, so every kernel is
//!   compiled. Run on every wgpu adapter. Without the fix: SIGSEGV in LLVM's code generator,
//!   "LLVM ERROR", "stack smashing detected" in 15 of 24 runs on lavapipe, 11 of 16 on
//!   llvmpipe.
//! - `compile:<ms>`: a thread compiles every CUDA kernel with NVRTC (on rayon's threads)
//!   while `main` returns after the given time. Without the fix: SIGSEGV inside
//!   `nvrtcCompileProgram` in about one run in four. Needs NVRTC only (no GPU, no libcuda).
//!
//! Its own binary without the test harness: each case is a process exit, and the harness's
//! own threads would blur which exit is being tested.

use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use unirt::ops::{self, KernelImpl};
use unirt::{discover, open, Backend, BackendExt, DType, Device, DeviceKind, KernelArg, Tensor};

const CHILD: &str = "UNIRT_EXIT_RACE_CHILD";
const DEVICE: &str = "UNIRT_EXIT_RACE_DEVICE";
const THREADS: usize = 4;

fn main() {
    match std::env::var(CHILD) {
        Ok(case) => child(&case),
        Err(_) => parent(),
    }
}

struct SlowExit(Duration);

impl Drop for SlowExit {
    fn drop(&mut self) {
        std::thread::sleep(self.0);
    }
}

thread_local! {
    static SLOW_EXIT: std::cell::RefCell<Option<SlowExit>> = const { std::cell::RefCell::new(None) };
}

/// One copy through the device; errors are the child's failure only where no exit is near.
fn round_trip(dev: &unirt::AnyBackend) -> unirt::Result<()> {
    let p = dev.malloc(4096)?;
    dev.copy_to_device(p, &[7u8; 4096])?;
    let back = dev.read_vec(p, 4096)?;
    dev.free(p)?;
    assert!(back.iter().all(|&b| b == 7), "the copy came back wrong");
    Ok(())
}

/// Registers, compiles and runs a kernel no other step has (its name and constants are new).
fn new_kernel(device: Device, thread: usize, step: usize) -> unirt::Result<Vec<f32>> {
    let name = format!("exit_race_{thread}_{step}");
    let source = format!(
        "@compute @workgroup_size(64, 1, 1)
fn k(@builtin(global_invocation_id) g: vec3<u32>) {{
    if (g.x >= grid().x) {{ return; }}
    var v = ld_t0(g.x);
    for (var j = 0u; j < {}u; j = j + 1u) {{ v = sin(v) * 1.0001 + {}.0; }}
    st_t1(g.x, v);
}}",
        3 + step % 5,
        step
    );
    let kernel = KernelImpl::Wgsl {
        source: source.into(),
        entry: "k".into(),
        workgroup: [64, 1, 1],
    };
    ops::register_kernel(&name, DeviceKind::Wgpu, DType::F32, kernel)?;
    let x = Tensor::zeros(&[256], DType::F32, device)?;
    let y = Tensor::zeros(&[256], DType::F32, device)?;
    let plan = ops::custom(
        &name,
        DType::F32,
        &[x.desc()],
        &[y.desc()],
        &[] as &[KernelArg],
        [256, 1, 1],
    )?;
    plan.launch(&[&x], &[&y], None, x.stream()?)?;
    y.to_vec()
}

fn child(case: &str) {
    if let Some(ms) = case.strip_prefix("compile:") {
        let ms: u64 = ms.parse().expect("milliseconds");
        std::thread::spawn(|| loop {
            if let Err(e) = unirt::vendors::cuda::compile_kernels(&[80]) {
                println!("compile: {e}");
                return;
            }
        });
        // Loading NVRTC takes milliseconds, compiling every kernel seconds: `main` returns
        // while rayon's threads compile.
        std::thread::sleep(Duration::from_millis(ms));
        return;
    }
    let device: Device = std::env::var(DEVICE)
        .expect("the parent names the device")
        .parse()
        .expect("a device name");
    let dev = open(device).expect("the device opens");
    let (tx, rx) = mpsc::channel();
    if let Some(ms) = case.strip_prefix("kernels:") {
        let ms: u64 = ms.parse().expect("milliseconds");
        for t in 0..2 {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for step in 0.. {
                    // Errors are possible once the process is exiting.
                    let _ = new_kernel(device, t, step);
                    if step == 0 {
                        tx.send(()).unwrap();
                    }
                }
            });
        }
        for _ in 0..2 {
            rx.recv().expect("every thread reports");
        }
        std::thread::sleep(Duration::from_millis(ms));
    } else if let Some(us) = case.strip_prefix("delay:") {
        let delay = Duration::from_micros(us.parse().expect("microseconds"));
        for _ in 0..THREADS {
            let (dev, tx) = (dev.clone(), tx.clone());
            std::thread::spawn(move || {
                round_trip(&dev).expect("a copy before the exit");
                SLOW_EXIT.with(|s| *s.borrow_mut() = Some(SlowExit(delay)));
                tx.send(()).unwrap();
            });
        }
        for _ in 0..THREADS {
            rx.recv().expect("every thread reports");
        }
    } else if case == "busy" {
        for _ in 0..THREADS {
            let (dev, tx) = (dev.clone(), tx.clone());
            std::thread::spawn(move || {
                round_trip(&dev).expect("a copy before the exit");
                tx.send(()).unwrap();
                // Errors are possible once the process is exiting (the device is held).
                loop {
                    let _ = round_trip(&dev);
                }
            });
        }
        for _ in 0..THREADS {
            rx.recv().expect("every thread reports");
        }
        std::thread::sleep(Duration::from_millis(20));
    } else {
        panic!("unknown case {case}");
    }
    // Returning from main: `exit`, with the threads still exiting or working.
}

fn parent() {
    let exe = std::env::current_exe().expect("this test's path");
    let mut cases: Vec<(String, Option<Device>)> = Vec::new();
    let wgpu: Vec<Device> = discover()
        .devices()
        .into_iter()
        .filter(|d| d.kind == DeviceKind::Wgpu && open(*d).is_ok())
        .collect();
    for &d in &wgpu {
        for step in 0..12 {
            cases.push((format!("kernels:{}", 40 + 45 * step), Some(d)));
        }
    }
    match wgpu
        .iter()
        .find(|d| open(**d).is_ok_and(|b| b.info().api == "gl"))
    {
        Some(&gl) => {
            // The window is where `exit` runs the library destructors, whose start depends on
            // the machine: the delays sweep 0.5–6.25 ms.
            for step in 0..24 {
                cases.push((format!("delay:{}", 500 + 250 * step), Some(gl)));
            }
            cases.extend(std::iter::repeat_n(("busy".to_string(), Some(gl)), 24));
        }
        None => println!("exit_race: no GL adapter on this machine: no GL case"),
    }
    for step in 0..12 {
        cases.push((format!("compile:{}", 50 + 90 * step), None));
    }
    let mut failed = Vec::new();
    let mut ran = 0;
    for (case, device) in &cases {
        let mut cmd = Command::new(&exe);
        // Every kernel is compiled, none read from Mesa's cache of an earlier run.
        cmd.env(CHILD, case)
            .env("MESA_SHADER_CACHE_DISABLE", "true");
        if let Some(d) = device {
            cmd.env(DEVICE, d.to_string());
        }
        let out = cmd.output().expect("the child starts");
        let stdout = String::from_utf8_lossy(&out.stdout);
        if case.starts_with("compile:") && stdout.contains("compile: ") {
            // No NVRTC here (or it cannot compile): every compile case would be the same.
            println!(
                "exit_race: NVRTC cannot compile here ({}): no compile case",
                stdout.trim()
            );
            break;
        }
        ran += 1;
        // A panic caught during the exit still prints (and means a driver call was cut short).
        let panicked = String::from_utf8_lossy(&out.stderr).contains("panicked");
        if !out.status.success() || panicked {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(6).collect();
            eprintln!(
                "exit_race: {case}: {} — stderr ends:\n  {}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n  ")
            );
            failed.push(case.clone());
        }
    }
    if failed.is_empty() {
        println!("exit_race: {ran} exits, all clean");
    } else {
        eprintln!(
            "exit_race: {} of {ran} exits failed: {failed:?}",
            failed.len()
        );
        std::process::exit(1);
    }
}
