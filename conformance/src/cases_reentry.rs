//! Waits that would wait for themselves: code unirt runs on the user's behalf — a CPU kernel
//! on a stream's worker (or an item of one on the helper pool), a host step of a graph exec's
//! replay — calling back into unirt. Each such wait once hung the process forever; now it is
//! a typed `waits_for_itself` error, and the stream or exec goes on working.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use unirt::graph::{self, GraphExec};
use unirt::ops::{self, KernelCall, KernelImpl};
use unirt::tensor::{DType, Tensor};
use unirt::{Device, DeviceKind, Event, Runtime};

use crate::ops_check::*;
use crate::{ensure, Case, Ctx, Failure};

pub(super) const CASES: &[Case] = &[
    Case {
        name: CPU_KERNEL_WAITS_CASE,
        needs: &[],
        run: cpu_kernel_waits,
    },
    Case {
        name: "reentry::host_step_replaying_its_exec_is_refused",
        needs: &[],
        run: host_step_replays,
    },
    Case {
        name: "reentry::host_step_starting_a_recording_leaves_the_run_alone",
        needs: &[],
        run: host_step_records,
    },
];

/// The case of CPU kernels that wait (declared unsupported on the other vendors).
pub(super) const CPU_KERNEL_WAITS_CASE: &str =
    "reentry::cpu_kernel_waiting_for_cpu_work_is_refused";
/// Why it is unsupported there.
pub(super) const DEVICE_KERNELS_CANNOT_WAIT: &str =
    "only CPU kernels are host code that can call unirt; device kernels cannot wait";

/// What the waiting kernels see: the tensor they run over, an event completed before their
/// launch, and the outcome of each wait they tried (by error kind).
struct Waits {
    input: Tensor,
    done_before: Event,
    outcomes: Vec<(&'static str, String)>,
}

/// One case at a time uses the globals (kernels are plain functions, so they reach the case's
/// state through them).
static WAITS: Mutex<Option<Waits>> = Mutex::new(None);
/// An event the launching thread records behind the kernel, once the kernel runs.
static AFTER: Mutex<Option<Event>> = Mutex::new(None);
static AFTER_RECORDED: AtomicBool = AtomicBool::new(false);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn outcome<T>(r: unirt::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => e.kind_name().into(),
    }
}

/// Every wait a kernel could try, with its outcome. Called from a command: the waits on work
/// not yet done must be refused, the wait on work already done must not.
fn try_waits() {
    // The launching thread records `AFTER` once the launch is queued (bounded: a case that
    // fails to record it sees an unrecorded event, which fails the check below).
    let start = Instant::now();
    while !AFTER_RECORDED.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let Ok(mut guard) = WAITS.lock() else { return };
    let Some(w) = guard.as_mut() else { return };
    let device_sync = outcome(Runtime::get(Device::CPU).and_then(|r| r.sync_device()));
    // The input's last use is this very launch: reading it orders this thread's stream after
    // an event behind the running command.
    let read_input = outcome(w.input.to_vec::<f32>());
    let event_after = match AFTER.lock() {
        Ok(e) => e
            .as_ref()
            .map_or("not recorded".into(), |e| outcome(e.synchronize())),
        Err(_) => "poisoned".into(),
    };
    let event_before = outcome(w.done_before.synchronize());
    // Work of the thread's own stream: refused while pending, done at once when complete.
    let fresh = match outcome(
        Tensor::ones(&[4], DType::F32, Device::CPU).and_then(|t| t.add(&t)?.to_vec::<f32>()),
    ) {
        s if s == "ok" => "waits_for_itself".to_string(),
        s => s,
    };
    w.outcomes.extend([
        ("device synchronisation", device_sync),
        ("reading the kernel's input", read_input),
        ("an event recorded after the launch", event_after),
        ("an event completed before the launch", event_before),
        ("a new tensor read back", fresh),
    ]);
}

fn poisoned<T>(_: T) -> Failure {
    fail("a lock was poisoned")
}

fn waiting_kernel(_call: &KernelCall<'_>) -> unirt::Result<()> {
    try_waits();
    Ok(())
}

fn waiting_item(_call: &KernelCall<'_>, at: [u32; 3]) {
    if at == [1, 0, 0] {
        try_waits();
    }
}

fn cpu_kernel_waits(ctx: &Ctx) -> Result<(), Failure> {
    if ctx.device.kind != DeviceKind::Cpu {
        return Err(Failure::Unsupported(
            "only CPU kernels are host code that can call unirt; device kernels cannot wait".into(),
        ));
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    ops::register_kernel(
        "user_waiting_kernel",
        DeviceKind::Cpu,
        DType::F32,
        KernelImpl::Host(waiting_kernel),
    )
    .map_err(err("register"))?;
    ops::register_kernel(
        "user_waiting_item",
        DeviceKind::Cpu,
        DType::F32,
        KernelImpl::HostPerItem(waiting_item),
    )
    .map_err(err("register"))?;
    let rt = Runtime::get(ctx.device)?;
    let stream = rt.current_stream()?;
    for (op, grid) in [
        ("user_waiting_kernel", [1, 1, 1]),
        ("user_waiting_item", [4, 1, 1]),
    ] {
        let a = Tensor::full(&[4], 3.0, DType::F32, ctx.device).map_err(err("full"))?;
        let done_before = Event::new(stream.backend()).map_err(err("event"))?;
        done_before.record(&stream).map_err(err("record"))?;
        done_before.synchronize().map_err(err("synchronize"))?;
        *WAITS.lock().map_err(poisoned)? = Some(Waits {
            input: a.clone(),
            done_before,
            outcomes: Vec::new(),
        });
        AFTER_RECORDED.store(false, Ordering::SeqCst);
        let plan = ops::custom(op, DType::F32, &[a.desc()], &[a.desc()], &[], grid)
            .map_err(err("plan"))?;
        let out = plan.run1(&[&a]);
        // The event the kernel waits for, recorded behind it.
        let after = Event::new(stream.backend()).map_err(err("event"))?;
        let recorded = after.record(&stream);
        *AFTER.lock().map_err(poisoned)? = Some(after);
        AFTER_RECORDED.store(true, Ordering::SeqCst);
        // Nothing hangs: the launch, the record and everything after them complete.
        let out = out.map_err(err(op))?;
        recorded.map_err(err("record"))?;
        rt.sync_device()
            .map_err(err("sync_device after the kernel"))?;
        out.to_vec::<f32>().map_err(err("reading the output"))?;
        AFTER.lock().map_err(poisoned)?.take();
        let w = WAITS
            .lock()
            .map_err(poisoned)?
            .take()
            .ok_or_else(|| fail("state lost"))?;
        ensure!(
            w.outcomes.len() == 5,
            "{op}: the kernel tried {} waits",
            w.outcomes.len()
        );
        for (what, got) in &w.outcomes {
            let want = if what.contains("before") {
                "ok"
            } else {
                "waits_for_itself"
            };
            ensure!(got == want, "{op}, {what}: {got}, want {want}");
        }
        // The stream works on.
        let b = a.add_scalar(1.0).map_err(err("add_scalar"))?;
        ensure!(
            b.to_vec::<f32>().map_err(err("read"))? == [4.0; 4],
            "{op}: work after the refused waits computed wrongly"
        );
    }
    Ok(())
}

/// A host step that replays or feeds its own exec (a decode loop feeding the sampled token
/// back, say) waits for the exec's turn, which its own thread holds.
fn host_step_replays(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let x = Tensor::full(&[16], 1.0, DType::F32, ctx.device).map_err(err("full"))?;
    let slot: Arc<OnceLock<Arc<GraphExec>>> = Arc::new(OnceLock::new());
    let seen: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    rt.start_graph_recording()?;
    let recorded = (|| -> unirt::Result<Tensor> {
        let a = x.add_scalar(1.0)?;
        let (slot, seen) = (slot.clone(), seen.clone());
        graph::host_op(
            "replay_self",
            &[&a],
            Arc::new(move |t: &[Tensor]| {
                if let Some(exec) = slot.get() {
                    let replayed = outcome(exec.replay());
                    let fed = outcome(exec.set_input("x", &t[0]));
                    if let Ok(mut s) = seen.lock() {
                        s.extend([replayed, fed]);
                    }
                }
                Ok(())
            }),
        )?;
        a.mul_scalar(2.0)
    })();
    let mut g = rt.stop_graph_recording()?;
    let y = recorded.map_err(err("recording"))?;
    g.mark_input("x", &x).map_err(err("mark_input"))?;
    g.mark_output("y", &y).map_err(err("mark_output"))?;
    let exec = Arc::new(g.instantiate().map_err(err("instantiate"))?);
    let _ = slot.set(exec.clone());
    for round in 0..2 {
        exec.replay().map_err(err("replay"))?;
        let out = exec.output("y")?.to_vec::<f32>().map_err(err("read"))?;
        ensure!(out == [4.0; 16], "round {round}: output {:?}", &out[..2]);
    }
    let seen = seen.lock().map_err(poisoned)?.clone();
    ensure!(
        seen.len() == 4 && seen.iter().all(|s| s == "waits_for_itself"),
        "the host step's replay and set_input of its own exec gave {seen:?}, want \
         waits_for_itself each"
    );
    // Outside its host steps the exec is fed and replayed as ever.
    let two = Tensor::full(&[16], 2.0, DType::F32, ctx.device).map_err(err("full"))?;
    exec.set_input("x", &two).map_err(err("set_input"))?;
    exec.replay().map_err(err("replay"))?;
    let out = exec.output("y")?.to_vec::<f32>().map_err(err("read"))?;
    ensure!(out == [6.0; 16], "after a new input: {:?}", &out[..2]);
    Ok(())
}

/// A host step that starts recording a graph (of the user's own, for later): the operators
/// after it in the same run or replay are the graph's and must run, not join that recording.
/// They once did — `Runtime::run` returned Ok with its output never written.
fn host_step_records(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::get(ctx.device)?;
    let x = Tensor::full(&[16], 1.0, DType::F32, ctx.device).map_err(err("full"))?;
    let start = Arc::new(AtomicBool::new(false));
    rt.start_graph_recording()?;
    let recorded = (|| -> unirt::Result<Tensor> {
        let a = x.add_scalar(1.0)?;
        let start = start.clone();
        graph::host_op(
            "start_recording",
            &[&a],
            Arc::new(move |t: &[Tensor]| {
                if start.swap(false, Ordering::SeqCst) {
                    Runtime::get(t[0].device())?.start_graph_recording()?;
                }
                Ok(())
            }),
        )?;
        a.mul_scalar(2.0)?.add_scalar(0.5)
    })();
    let mut g = rt.stop_graph_recording()?;
    let y = recorded.map_err(err("recording"))?;
    g.mark_input("x", &x).map_err(err("mark_input"))?;
    g.mark_output("y", &y).map_err(err("mark_output"))?;
    // Finishes the recording the host step started: nothing of the graph's may be in it.
    let finish = |what: &str| -> Result<(), Failure> {
        let left = rt
            .stop_graph_recording()
            .map_err(err("stopping the host step's recording"))?;
        ensure!(
            left.nodes().is_empty(),
            "{what}: {} of the graph's operators joined the host step's recording",
            left.nodes().len()
        );
        Ok(())
    };
    start.store(true, Ordering::SeqCst);
    let run = rt.run(&g);
    finish("Runtime::run")?;
    run.map_err(err("run"))?;
    let out = y.to_vec::<f32>().map_err(err("read"))?;
    ensure!(
        out == [4.5; 16],
        "Runtime::run wrote {:?}, want 4.5",
        &out[..2]
    );
    let plan = g.plan().map_err(err("plan"))?;
    for capture in [false, true] {
        let options = graph::ExecOptions {
            capture,
            ..Default::default()
        };
        let exec = plan.instantiate_with(options).map_err(err("instantiate"))?;
        let two = Tensor::full(&[16], 2.0, DType::F32, ctx.device).map_err(err("full"))?;
        exec.set_input("x", &two).map_err(err("set_input"))?;
        start.store(true, Ordering::SeqCst);
        let replayed = exec.replay();
        finish("a replay")?;
        replayed.map_err(err("replay"))?;
        let out = exec.output("y")?.to_vec::<f32>().map_err(err("read"))?;
        ensure!(
            out == [6.5; 16],
            "a replay (capture {capture}) wrote {:?}, want 6.5",
            &out[..2]
        );
    }
    Ok(())
}
