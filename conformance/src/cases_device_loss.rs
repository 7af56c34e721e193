//! A device lost under live objects (issue 17): what a GPU reset or a driver crash does,
//! made to happen on purpose. Every entry point then returns — a typed error, or success for
//! calls that only release unirt's own bookkeeping — and none panics or hangs; what needs the
//! device (waiting for work, reading data back, allocating) is an error; and the process's
//! other backend of the same device keeps working.
//!
//! wgpu loses its device through `wgpu::Device::destroy` (the same path as a real loss: the
//! lost-device callback); the CPU backend has no device to lose, and on CUDA a lost device is
//! a sticky context error, which the fake driver's fault matrix injects at every entry point.

use std::time::Duration;

use super::*;

use crate::ensure;
use crate::ops_check::fail;
use unirt::hal::{CaptureMode, DevicePtr, EventFlags, KernelArg, MemcpyKind};

pub(super) const CASES: &[Case] = &[Case {
    name: DEVICE_LOST_CASE,
    needs: &[],
    run: device_lost,
}];

pub(super) const DEVICE_LOST_CASE: &str = "robust::device_lost_under_live_objects";

/// How long everything after the loss may take before the case calls it a hang.
const HANG: Duration = Duration::from_secs(60);

fn lose(b: &AnyBackend) -> Result<(), Failure> {
    match b {
        AnyBackend::Wgpu(w) => {
            w.simulate_device_loss();
            Ok(())
        }
        _ => Err(fail("only wgpu devices can be lost on purpose")),
    }
}

fn device_lost(ctx: &Ctx) -> Result<(), Failure> {
    let b = unirt::discovery::open_private(ctx.device)?;
    // Live objects of every kind, with work queued and a graph captured.
    const N: usize = 1 << 20;
    let data = pattern(N, 17);
    let a = b.malloc(N)?;
    let c = b.malloc(N)?;
    // SAFETY: `data` is a live host buffer of N bytes; `a` a device buffer of N.
    unsafe { b.memcpy(a.0, data.as_ptr() as u64, N, MemcpyKind::H2D)? };
    let s = b.stream_create()?;
    let s2 = b.stream_create()?;
    let e = b.event_create(EventFlags::DEFAULT)?;
    let host = b.malloc_host(4096)?;
    b.begin_capture(s2, CaptureMode::Relaxed)?;
    b.memset_async(c, 3, N, s2)?;
    let g = b.end_capture(s2)?;
    let x = b.graph_instantiate(g)?;
    for _ in 0..8 {
        b.memset_async(c, 1, N, s)?;
        // SAFETY: device-only copy of N bytes between two live N-byte buffers.
        unsafe { b.memcpy_async(c.0, a.0, N, MemcpyKind::D2D, s)? };
    }
    b.event_record(e, s)?;

    lose(&b)?;

    // Everything after the loss runs on a watchdog'd thread: a hang fails the case.
    {
        let b = b.clone();
        within(HANG, "calls on the lost device", move || {
            after_loss(&b, a, c, s, e, host, g, x)
        })?;
    }
    // Dropping the lost backend returns too (its teardown waits for nothing that cannot end).
    within(HANG, "dropping the lost backend", move || {
        drop(b);
        Ok(())
    })?;
    // The process's shared backend of the same device is a device of its own: unharmed.
    let buf = Buf::with(&ctx.backend, &data[..4096])?;
    same(
        &buf.read()?,
        &data[..4096],
        "the shared backend after the loss",
    )
}

/// Every entry point on the lost device. Returns the first wrong answer.
#[allow(clippy::too_many_arguments)]
fn after_loss(
    b: &AnyBackend,
    a: DevicePtr,
    c: DevicePtr,
    s: unirt::hal::StreamId,
    e: unirt::hal::EventId,
    host: unirt::hal::HostPtr,
    g: unirt::hal::GraphId,
    x: unirt::hal::GraphExecId,
) -> Result<(), Failure> {
    // What needs the device is an error.
    ensure!(
        b.synchronize().is_err(),
        "synchronize succeeded on a lost device"
    );
    let mut back = vec![0u8; 4096];
    // SAFETY: `back` is a live host buffer of 4096 bytes; `a` a device buffer larger than it.
    let read = unsafe { b.memcpy(back.as_mut_ptr() as u64, a.0, 4096, MemcpyKind::D2H) };
    ensure!(read.is_err(), "a D2H copy from a lost device succeeded");
    ensure!(
        b.malloc(1 << 20).is_err(),
        "malloc succeeded on a lost device"
    );
    // The rest may be refused at once or fail later; each returns.
    let _ = b.stream_synchronize(s);
    let _ = b.event_synchronize(e);
    let _ = b.event_query(e);
    let _ = b.memset(a, 0, 4096);
    let _ = b.memset_async(a, 0, 4096, s);
    // SAFETY: device-only copy between live buffers of at least 4096 bytes.
    let _ = unsafe { b.memcpy_async(c.0, a.0, 4096, MemcpyKind::D2D, s) };
    let _ = b.launch(
        "fill",
        &[KernelArg::Ptr(a), KernelArg::U32(7), KernelArg::U32(1024)],
        s,
    );
    let _ = b.graph_launch(x, s);
    let _ = b
        .begin_capture(s, CaptureMode::Global)
        .map(|()| b.end_capture(s));
    let _ = b.stream_create().map(|s| b.stream_destroy(s));
    let _ = b
        .event_create(EventFlags::DEFAULT)
        .map(|e| b.event_destroy(e));
    let _ = b.mem_info();
    let _ = b.malloc_async(4096, s);
    let _ = b.malloc_host(4096).map(|h| b.free_host(h));
    ensure!(
        b.synchronize().is_err(),
        "synchronize succeeded on a lost device"
    );
    // Releasing still works (or says why), and a released handle is gone.
    let _ = b.graph_exec_destroy(x);
    let _ = b.graph_destroy(g);
    let _ = b.event_destroy(e);
    let _ = b.stream_destroy(s);
    let _ = b.free(a);
    let _ = b.free(c);
    let _ = b.free_host(host);
    ensure!(
        b.graph_launch(x, b.default_stream()).is_err(),
        "a destroyed exec launched"
    );
    ensure!(b.free(a).is_err(), "a freed buffer freed twice");
    Ok(())
}
