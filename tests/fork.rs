//! Fork safety (issue 10, scenario 7), on every CPU and wgpu device this machine has.
//!
//! The parent uses a device and forks while work is still queued — what Python's
//! multiprocessing does by default. In the child, every call on an object made before the fork
//! must return `Error::Forked` (kind `forked`) at once, dropping those objects must not block,
//! and the child must be able to start again on fresh state: discovery, `open`, `Runtime` and
//! `context` give new devices that work. The parent runs the child under a timeout and kills
//! it when it hangs, so a regression fails the test instead of hanging CI.
//!
//! Everything runs in one `#[test]`, so no other test thread of this binary holds a lock at the
//! moment of the fork.

use std::io::Read;
use std::os::fd::FromRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use unirt::{context, AnyBackend, Backend, BackendExt, Device, DeviceKind, Event, Stream};

/// How long a child may take before it counts as hung (it needs well under a second).
const CHILD_TIMEOUT: Duration = Duration::from_secs(20);

/// A failed check in the child, as a message for the parent.
type Check = Result<(), String>;

macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// Runs `body` in a forked child; returns its failure message, or that it hung or died.
fn in_child(what: &str, body: impl FnOnce() -> Check) -> Check {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    check!(unsafe { libc::pipe(fds.as_mut_ptr()) } == 0, "pipe failed");
    // SAFETY: the child only runs `body` (unirt calls and allocation, which glibc's fork
    // handlers keep usable) and leaves with _exit, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let outcome = catch_unwind(AssertUnwindSafe(body));
        let (code, msg) = match outcome {
            Ok(Ok(())) => (0, String::new()),
            Ok(Err(m)) => (1, m),
            Err(_) => (2, "the child panicked".to_string()),
        };
        // SAFETY: writes the message bytes to our end of the pipe, then ends the child
        // without running the parent's exit handlers.
        unsafe {
            libc::write(fds[1], msg.as_ptr().cast(), msg.len());
            libc::_exit(code);
        }
    }
    // SAFETY: closes the parent's copy of the write end (the child has its own).
    unsafe { libc::close(fds[1]) };
    check!(pid > 0, "fork failed");
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let mut status = 0;
    loop {
        // SAFETY: waits (without blocking) for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            // SAFETY: the read end is ours; the File closes it.
            unsafe { drop(std::fs::File::from_raw_fd(fds[0])) };
            return Err(format!(
                "{what}: the child hung (killed after {CHILD_TIMEOUT:?})"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut msg = String::new();
    // SAFETY: the read end is ours; the File owns and closes it.
    let _ = unsafe { std::fs::File::from_raw_fd(fds[0]) }.read_to_string(&mut msg);
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else if libc::WIFSIGNALED(status) {
        Err(format!(
            "{what}: the child died of signal {}",
            libc::WTERMSIG(status)
        ))
    } else {
        Err(format!(
            "{what}: the child failed (exit {}): {msg}",
            libc::WEXITSTATUS(status)
        ))
    }
}

/// Checks that `r` failed with `Error::Forked`.
fn forked<T: std::fmt::Debug>(r: unirt::Result<T>, call: &str) -> Check {
    match r {
        Err(e) if e.kind_name() == "forked" => Ok(()),
        Err(e) => Err(format!("{call}: expected a forked error, got {e}")),
        Ok(v) => Err(format!("{call}: expected a forked error, got Ok({v:?})")),
    }
}

/// A buffer of `n` f32 filled with `value` by the `fill` kernel, read back and checked.
fn fill_and_check(dev: &Arc<AnyBackend>, n: u32, value: f32) -> Check {
    let e = |e: unirt::Error| e.to_string();
    let s = Stream::new(dev).map_err(e)?;
    let buf = dev.malloc(4 * n as usize).map_err(e)?;
    s.launch("fill", &[buf.into(), value.to_bits().into(), n.into()])
        .map_err(e)?;
    let ev = Event::new(dev).map_err(e)?;
    ev.record(&s).map_err(e)?;
    ev.synchronize().map_err(e)?;
    s.synchronize().map_err(e)?;
    let back = dev.read_vec(buf, 4 * n as usize).map_err(e)?;
    let want = value.to_le_bytes();
    check!(
        back.chunks_exact(4).all(|c| c == want),
        "fill({value}) read back wrong data"
    );
    dev.free(buf).map_err(e)?;
    dev.synchronize().map_err(e)
}

/// What the child does: pre-fork objects fail fast, fresh ones work.
fn child_checks(
    device: Device,
    dev: &Arc<AnyBackend>,
    private: Arc<AnyBackend>,
    stream: Stream,
    event: Event,
    buf: unirt::DevicePtr,
    held: unirt::Memory,
) -> Check {
    // Objects from before the fork: a typed error at once, never a wait.
    forked(stream.synchronize(), "stream_synchronize (pre-fork stream)")?;
    forked(event.synchronize(), "event_synchronize (pre-fork event)")?;
    forked(event.query(), "event_query (pre-fork event)")?;
    forked(dev.synchronize(), "synchronize (pre-fork device)")?;
    forked(dev.free(buf), "free (pre-fork buffer)")?;
    forked(dev.malloc(4096), "malloc (pre-fork device)")?;
    forked(dev.stream_create(), "stream_create (pre-fork device)")?;
    forked(
        dev.memset(buf, 0, 16),
        "memset (pre-fork device, pre-fork buffer)",
    )?;
    forked(
        stream.launch("fill", &[buf.into(), 0u32.into(), 4u32.into()]),
        "launch (pre-fork stream)",
    )?;
    // Dropping them must not block either (RAII handles, a private device, held memory).
    drop(stream);
    drop(event);
    drop(private);
    drop(held);

    // A fresh start: discovery, open, the Runtime and the thread context.
    let d = unirt::discover();
    let info = d
        .info(device)
        .map_err(|e| format!("{device} in the child's discovery: {e}"))?;
    if info.api == "gl" {
        // Mesa's EGL state is per process and the parent started it: GL cannot come back in a
        // forked child, which says so; the child goes on with the CPU.
        match unirt::open(device) {
            Err(e) if e.kind_name() == "unavailable" && e.to_string().contains("forked") => {}
            Err(e) => return Err(format!("open({device}) in the child: {e}")),
            Ok(_) => return Err(format!("{device} (GL) opened in a forked child")),
        }
        return fresh_start(Device::CPU, None);
    }
    fresh_start(device, Some(dev))
}

/// The child opens `device` again and uses it through every front end.
fn fresh_start(device: Device, parents: Option<&Arc<AnyBackend>>) -> Check {
    let fresh = unirt::open(device).map_err(|e| format!("open({device}) in the child: {e}"))?;
    check!(
        !parents.is_some_and(|p| Arc::ptr_eq(&fresh, p)),
        "open({device}) in the child returned the parent's device"
    );
    fill_and_check(&fresh, 1 << 16, 3.5)?;
    let again = unirt::open(device).map_err(|e| e.to_string())?;
    check!(
        Arc::ptr_eq(&fresh, &again),
        "open({device}) is not cached within the child"
    );
    let e = |e: unirt::Error| format!("context in the child: {e}");
    context::set_device(device).map_err(e)?;
    let m = context::allocate_memory(4096).map_err(e)?;
    context::memcpy_d2d(m.device_ptr(), m.device_ptr(), 16, false).map_err(e)?;
    context::sync_stream().map_err(e)?;
    context::sync_device().map_err(e)?;
    drop(m);
    let h = context::allocate_pinned_host_memory(4096).map_err(e)?;
    drop(h);
    Ok(())
}

fn fork_device(device: Device) -> Check {
    let e = |e: unirt::Error| format!("{device} in the parent: {e}");
    let dev = unirt::open(device).map_err(e)?;
    let private = unirt::discovery::open_private(device).map_err(e)?;
    private.synchronize().map_err(e)?;
    // The context path too: the thread's stream and runtime memory, made before the fork.
    context::set_device(device).map_err(e)?;
    let held = context::allocate_memory(1 << 20).map_err(e)?;
    context::sync_stream().map_err(e)?;

    let n: u32 = 4 << 20; // 16 MiB of f32
    let stream = Stream::new(&dev).map_err(e)?;
    let event = Event::new(&dev).map_err(e)?;
    let buf = dev.malloc(4 * n as usize).map_err(e)?;
    let queue_fills = || -> Check {
        for i in 0..16u32 {
            stream
                .launch("fill", &[buf.into(), (i as f32).to_bits().into(), n.into()])
                .map_err(e)?;
        }
        Ok(())
    };
    // Queue enough work that it is still pending when the child starts.
    queue_fills()?;
    event.record(&stream).map_err(e)?;
    if device.kind == DeviceKind::Wgpu {
        // On wgpu, the pending work is what unirt's own stream holds: the driver is let go
        // idle first, then more is queued and not yet submitted. A fork while another thread
        // is inside the driver (or, in debug builds, inside wgpu-core's lock tracing, which
        // takes std's process-wide backtrace lock) can leave the child a lock nobody will
        // release — the POSIX limit of forking a threaded process, which no library can lift
        // for code it does not own.
        event.synchronize().map_err(e)?;
        queue_fills()?;
    }

    // The child takes the objects (to drop them there); the parent keeps its own copies.
    let mut objects = Some((private, stream, event, held));
    let outcome = in_child(&device.to_string(), || {
        let (private, stream, event, held) = objects.take().ok_or("no objects")?;
        child_checks(device, &dev, private, stream, event, buf, held)
    });
    let (_private, stream, event, _held) = objects.ok_or("the parent lost its objects")?;

    // The parent is untouched by the child: its work completes and its objects work.
    event.synchronize().map_err(e)?;
    stream.synchronize().map_err(e)?;
    dev.synchronize().map_err(e)?;
    let back = dev.read_vec(buf, 16).map_err(e)?;
    let want = 15.0f32.to_le_bytes();
    let parent_ok = back.chunks_exact(4).all(|c| c == want);
    dev.free(buf).map_err(e)?;
    fill_and_check(&dev, 1024, 1.25).map_err(|m| format!("{device} parent after fork: {m}"))?;
    outcome?;
    check!(parent_ok, "{device}: the parent's queued work was lost");
    Ok(())
}

#[test]
fn a_forked_child_gets_errors_for_old_objects_and_works_on_fresh_ones() {
    let mut failures = Vec::new();
    if let Err(m) = cuda_in_a_forked_child_is_unavailable_with_the_reason() {
        failures.push(m);
    }
    let devices: Vec<Device> = unirt::discover()
        .devices()
        .into_iter()
        .filter(|d| d.kind != DeviceKind::Cuda)
        .collect();
    assert!(!devices.is_empty(), "no CPU device");
    for device in devices {
        match fork_device(device) {
            Ok(()) => println!("{device}: fork checks passed"),
            Err(m) => failures.push(m),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// CUDA cannot be used in a forked child once the parent initialised it: discovery in the
/// child says so instead of calling into the driver. (Checked where libcuda loads; on a
/// machine without it, the child's probe simply searches again.)
fn cuda_in_a_forked_child_is_unavailable_with_the_reason() -> Check {
    let parent = unirt::discover()
        .backend(DeviceKind::Cuda)
        .cloned()
        .expect("a cuda entry");
    let loaded = parent
        .reason
        .as_deref()
        .is_none_or(|r| r.starts_with("libcuda "));
    let outcome = in_child("cuda", move || {
        let b = unirt::discover()
            .backend(DeviceKind::Cuda)
            .cloned()
            .ok_or("no cuda entry in the child")?;
        check!(!b.available(), "cuda is available in a forked child");
        let reason = b.reason.unwrap_or_default();
        if loaded {
            check!(
                reason.contains("fork"),
                "the child's cuda reason does not mention the fork: {reason}"
            );
        }
        check!(
            unirt::open(Device::new(DeviceKind::Cuda, 0)).is_err(),
            "cuda:0 opened in a forked child"
        );
        Ok(())
    });
    outcome
}
