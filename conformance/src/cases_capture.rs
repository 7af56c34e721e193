//! Stream capture and replay.

use super::*;
use crate::ensure;
use unirt::hal::{CaptureMode, EventStatus, KernelArg, MemcpyKind};
use unirt::{Backend, Event, Stream};

const CAP: &[Need] = &[Need::Capture];

pub(super) const CASES: &[Case] = &[
    Case {
        name: "capture::replay_kernels_and_copies",
        needs: CAP,
        run: replay,
    },
    Case {
        name: "capture::nothing_runs_while_capturing",
        needs: CAP,
        run: nothing_runs,
    },
    Case {
        name: "capture::replay_many_times_accumulates",
        needs: CAP,
        run: accumulate,
    },
    Case {
        name: "capture::host_copies_reread_on_replay",
        needs: CAP,
        run: host_reread,
    },
    Case {
        name: "capture::event_nodes",
        needs: CAP,
        run: event_nodes,
    },
    Case {
        name: "capture::exec_outlives_graph",
        needs: CAP,
        run: exec_outlives_graph,
    },
    Case {
        name: "capture::state_errors",
        needs: CAP,
        run: state_errors,
    },
    Case {
        name: "capture::graph_objects_used_from_several_threads",
        needs: CAP,
        run: graph_objects_from_threads,
    },
    Case {
        name: "capture::empty_graph",
        needs: CAP,
        run: empty,
    },
    Case {
        name: "capture::graph_launched_into_a_capture",
        needs: CAP,
        run: launch_into_capture,
    },
    Case {
        name: "capture::execs_sharing_read_backs_replay_back_to_back",
        needs: CAP,
        run: shared_read_backs,
    },
    Case {
        name: "capture::stream_dropped_while_capturing_ends_it",
        needs: CAP,
        run: dropped_mid_capture,
    },
];

fn replay(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let n = 4096u32;
    let bytes = 4 * n as usize;
    let (a, b, c) = (
        Buf::new(&ctx.backend, bytes)?,
        Buf::new(&ctx.backend, bytes)?,
        Buf::new(&ctx.backend, bytes)?,
    );
    ctx.begin_capture(s.id(), CaptureMode::Global)?;
    s.launch("fill", &[a.ptr.into(), 1.5f32.to_bits().into(), n.into()])?;
    // SAFETY: device-only copy.
    unsafe { ctx.memcpy_async(b.ptr.0, a.ptr.0, bytes, MemcpyKind::D2D, s.id())? };
    s.launch(
        "add_f32",
        &[a.ptr.into(), b.ptr.into(), c.ptr.into(), n.into()],
    )?;
    let g = ctx.end_capture(s.id())?;
    let x = ctx.graph_instantiate(g)?;
    ctx.graph_launch(x, s.id())?;
    s.synchronize()?;
    let got = bytes_f32(&c.read()?);
    ensure!(
        got.iter().all(|&v| v == 3.0),
        "replayed fill + copy + add gave {:?}…",
        &got[..4]
    );
    ctx.graph_exec_destroy(x)?;
    ctx.graph_destroy(g)?;
    Ok(())
}

/// A graph launched into another stream's capture is captured (CPU, wgpu) or refused with a
/// `capturing` error (CUDA, whose driver refuses it); either way the capture goes on intact:
/// work after it is captured and its graph replays.
fn launch_into_capture(ctx: &Ctx) -> Result<(), Failure> {
    let (s, t) = (Stream::new(&ctx.backend)?, Stream::new(&ctx.backend)?);
    let n = 1024u32;
    let a = Buf::new(&ctx.backend, 4 * n as usize)?;
    ctx.begin_capture(s.id(), CaptureMode::Global)?;
    s.launch("fill", &[a.ptr.into(), 1.0f32.to_bits().into(), n.into()])?;
    let g = ctx.end_capture(s.id())?;
    let x = ctx.graph_instantiate(g)?;
    ctx.begin_capture(t.id(), CaptureMode::Global)?;
    let nested = ctx.graph_launch(x, t.id());
    if nested.is_err() {
        expect_err(nested, &["capturing"], "a graph launched into a capture")?;
    }
    t.launch("fill", &[a.ptr.into(), 2.5f32.to_bits().into(), n.into()])?;
    let g2 = ctx.end_capture(t.id())?;
    let x2 = ctx.graph_instantiate(g2)?;
    ctx.graph_launch(x2, t.id())?;
    t.synchronize()?;
    let got = bytes_f32(&a.read()?);
    ensure!(
        got.iter().all(|&v| v == 2.5),
        "the capture after the nested launch replayed to {:?}…",
        &got[..4]
    );
    for x in [x, x2] {
        ctx.graph_exec_destroy(x)?;
    }
    for g in [g, g2] {
        ctx.graph_destroy(g)?;
    }
    Ok(())
}

fn nothing_runs(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let b = Buf::with(&ctx.backend, &[1u8; 1024])?;
    ctx.begin_capture(s.id(), CaptureMode::ThreadLocal)?;
    s.memset(b.ptr, 2, 1024)?;
    // The default stream is not capturing: a synchronous read is allowed and must see 1s.
    let during = b.read();
    let g = ctx.end_capture(s.id())?;
    same(&during?, &[1; 1024], "memory during capture")?;
    same(
        &b.read()?,
        &[1; 1024],
        "memory after capture, before launch",
    )?;
    let x = ctx.graph_instantiate(g)?;
    ctx.graph_launch(x, s.id())?;
    s.synchronize()?;
    same(&b.read()?, &[2; 1024], "memory after launch")?;
    ctx.graph_exec_destroy(x)?;
    ctx.graph_destroy(g)?;
    Ok(())
}

fn accumulate(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let n = 256u32;
    let acc = Buf::with(&ctx.backend, &f32_bytes(&vec![0.0; n as usize]))?;
    let one = Buf::with(&ctx.backend, &f32_bytes(&vec![1.0; n as usize]))?;
    ctx.begin_capture(s.id(), CaptureMode::Relaxed)?;
    for _ in 0..10 {
        s.launch(
            "add_f32",
            &[acc.ptr.into(), one.ptr.into(), acc.ptr.into(), n.into()],
        )?;
    }
    let g = ctx.end_capture(s.id())?;
    let x = ctx.graph_instantiate(g)?;
    for k in 1..=5 {
        ctx.graph_launch(x, s.id())?;
        s.synchronize()?;
        let got = bytes_f32(&acc.read()?);
        ensure!(
            got.iter().all(|&v| v == 10.0 * k as f32),
            "after {k} replays: {:?}…, want {}",
            &got[..4],
            10 * k
        );
    }
    // Replays enqueued back to back run in order too.
    for _ in 0..5 {
        ctx.graph_launch(x, s.id())?;
    }
    s.synchronize()?;
    let got = bytes_f32(&acc.read()?);
    ensure!(
        got.iter().all(|&v| v == 100.0),
        "after 10 replays: {:?}…",
        &got[..4]
    );
    ctx.graph_exec_destroy(x)?;
    ctx.graph_destroy(g)?;
    Ok(())
}

fn host_reread(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let n = 4096 + 3;
    let host = ctx.malloc_host(n)?;
    let out = ctx.malloc_host(n)?;
    let d = Buf::new(&ctx.backend, n)?;
    let run = || -> Result<(), Failure> {
        ctx.begin_capture(s.id(), CaptureMode::Global)?;
        // SAFETY: pinned buffers of n bytes live until freed below, after every replay.
        unsafe {
            ctx.memcpy_async(d.ptr.0, host.0, n, MemcpyKind::H2D, s.id())?;
            ctx.memcpy_async(out.0, d.ptr.0, n, MemcpyKind::D2H, s.id())?;
        }
        let g = ctx.end_capture(s.id())?;
        let x = ctx.graph_instantiate(g)?;
        for seed in 0..3u32 {
            let data = pattern(n, seed);
            // SAFETY: host is a live pinned allocation of n bytes; no replay is pending.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), host.as_mut_ptr(), n) };
            ctx.graph_launch(x, s.id())?;
            s.synchronize()?;
            // SAFETY: out holds n bytes written by the replay.
            let got = unsafe { std::slice::from_raw_parts(out.as_mut_ptr(), n) };
            same(got, &data, &format!("replay {seed} re-reads host memory"))?;
        }
        ctx.graph_exec_destroy(x)?;
        ctx.graph_destroy(g)?;
        Ok(())
    };
    let r = run();
    ctx.free_host(host)?;
    ctx.free_host(out)?;
    r
}

fn event_nodes(ctx: &Ctx) -> Result<(), Failure> {
    let (s, t) = (Stream::new(&ctx.backend)?, Stream::new(&ctx.backend)?);
    let (e0, e1) = (Event::new(&ctx.backend)?, Event::new(&ctx.backend)?);
    let b = Buf::new(&ctx.backend, 1 << 20)?;
    ctx.begin_capture(s.id(), CaptureMode::Global)?;
    e0.record(&s)?;
    s.memset(b.ptr, 0x3c, 1 << 20)?;
    e1.record(&s)?;
    let g = ctx.end_capture(s.id())?;
    ensure!(
        e1.query()? == EventStatus::Complete,
        "a record inside a capture must not make the event pending"
    );
    let x = ctx.graph_instantiate(g)?;
    ctx.graph_launch(x, s.id())?;
    t.wait_event(&e1)?;
    let c = Buf::new(&ctx.backend, 1 << 20)?;
    // SAFETY: device-only copy.
    unsafe { ctx.memcpy_async(c.ptr.0, b.ptr.0, 1 << 20, MemcpyKind::D2D, t.id())? };
    t.synchronize()?;
    same(
        &c.read()?,
        &vec![0x3c; 1 << 20],
        "stream waiting on an event recorded by a replay",
    )?;
    e1.synchronize()?;
    let ms = e0.elapsed_ms(&e1)?;
    ensure!(ms >= 0.0, "elapsed across a replay = {ms}");
    ctx.graph_exec_destroy(x)?;
    ctx.graph_destroy(g)?;
    Ok(())
}

fn exec_outlives_graph(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let b = Buf::new(&ctx.backend, 256)?;
    ctx.begin_capture(s.id(), CaptureMode::Global)?;
    s.launch(
        "fill",
        &[KernelArg::Ptr(b.ptr), 0x0707_0707u32.into(), 64u32.into()],
    )?;
    let g = ctx.end_capture(s.id())?;
    let x = ctx.graph_instantiate(g)?;
    ctx.graph_destroy(g)?;
    expect_err(
        ctx.graph_instantiate(g),
        &["invalid_handle"],
        "instantiate a destroyed graph",
    )?;
    ctx.graph_launch(x, s.id())?;
    s.synchronize()?;
    same(
        &b.read()?,
        &[7; 256],
        "replay after its graph was destroyed",
    )?;
    ctx.graph_exec_destroy(x)?;
    expect_err(
        ctx.graph_launch(x, s.id()),
        &["invalid_handle"],
        "launch a destroyed exec",
    )?;
    expect_err(
        ctx.graph_exec_destroy(x),
        &["invalid_handle"],
        "destroy an exec twice",
    )?;
    Ok(())
}

fn state_errors(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    expect_err(
        ctx.end_capture(s.id()),
        &["not_capturing"],
        "end_capture without begin",
    )?;
    ctx.begin_capture(s.id(), CaptureMode::Global)?;
    expect_err(
        ctx.begin_capture(s.id(), CaptureMode::Global),
        &["capturing"],
        "begin_capture twice",
    )?;
    expect_err(
        ctx.stream_synchronize(s.id()),
        &["capturing"],
        "synchronize a capturing stream",
    )?;
    let g = ctx.end_capture(s.id())?;
    expect_err(
        ctx.end_capture(s.id()),
        &["not_capturing"],
        "end_capture twice",
    )?;
    ctx.graph_destroy(g)?;
    expect_err(
        ctx.graph_destroy(g),
        &["invalid_handle"],
        "destroy a graph twice",
    )?;
    s.synchronize()?;
    Ok(())
}

/// Four threads instantiate one graph and launch one exec, each on a stream of its own, 50
/// times each: every call succeeds and every replay lands. A backend must serialise what its
/// driver does not (CUDA graph objects are not internally synchronised: over the fake driver
/// an overlap inside one graph object is recorded as misuse and fails the run). The graph
/// fills with a constant, so the result does not depend on the replays' order.
fn graph_objects_from_threads(ctx: &Ctx) -> Result<(), Failure> {
    let n = 4096u32;
    let a = Buf::new(&ctx.backend, 4 * n as usize)?;
    let s = Stream::new(&ctx.backend)?;
    ctx.begin_capture(s.id(), CaptureMode::Global)?;
    s.launch("fill", &[a.ptr.into(), 3.25f32.to_bits().into(), n.into()])?;
    let g = ctx.end_capture(s.id())?;
    let x = ctx.graph_instantiate(g)?;
    let outcome = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                sc.spawn(|| -> Result<(), Failure> {
                    let t = Stream::new(&ctx.backend)?;
                    for _ in 0..50 {
                        let mine = ctx.graph_instantiate(g)?;
                        ctx.graph_launch(x, t.id())?;
                        ctx.graph_launch(mine, t.id())?;
                        t.synchronize()?;
                        ctx.graph_exec_destroy(mine)?;
                    }
                    Ok(())
                })
            })
            .collect();
        join_workers(workers)
    });
    ctx.graph_exec_destroy(x)?;
    ctx.graph_destroy(g)?;
    outcome?;
    let want: Vec<u8> = (0..n).flat_map(|_| 3.25f32.to_le_bytes()).collect();
    same(
        &a.read()?,
        &want,
        "the buffer after 400 replays from four threads",
    )
}

fn empty(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    ctx.begin_capture(s.id(), CaptureMode::Global)?;
    let g = ctx.end_capture(s.id())?;
    let x = ctx.graph_instantiate(g)?;
    ctx.graph_launch(x, s.id())?;
    s.synchronize()?;
    ctx.graph_exec_destroy(x)?;
    ctx.graph_destroy(g)?;
    Ok(())
}

/// Two execs of one graph, and a third from a graph that captured two replays of the first,
/// all copy to the host: they share whatever the backend captured for the copy (wgpu: the
/// mappable staging buffer; one submission cannot map it twice). Replayed back to back on two streams with no synchronize between,
/// every replay must run and land its bytes; none may find the staging buffer still mapped by
/// another (wgpu refused such a submission with a validation error and dropped its work; the
/// C ABI fuzzer found it with four threads).
fn shared_read_backs(ctx: &Ctx) -> Result<(), Failure> {
    let (s, t) = (Stream::new(&ctx.backend)?, Stream::new(&ctx.backend)?);
    let n = 64 * 1024 + 3;
    let host = ctx.malloc_host(n)?;
    let outs = [ctx.malloc_host(n)?, ctx.malloc_host(n)?];
    let d = Buf::new(&ctx.backend, n)?;
    let data = pattern(n, 41);
    let run = || -> Result<(), Failure> {
        // SAFETY: host is a live pinned allocation of n bytes; nothing is queued yet.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), host.as_mut_ptr(), n) };
        let mut graphs = Vec::new();
        let mut execs = Vec::new();
        let r = (|| -> Result<(), Failure> {
            ctx.begin_capture(s.id(), CaptureMode::Global)?;
            // SAFETY: pinned buffers of n bytes live until freed below, after every replay.
            unsafe {
                ctx.memcpy_async(d.ptr.0, host.0, n, MemcpyKind::H2D, s.id())?;
                ctx.memcpy_async(outs[0].0, d.ptr.0, n, MemcpyKind::D2H, s.id())?;
            }
            graphs.push(ctx.end_capture(s.id())?);
            execs.push(ctx.graph_instantiate(graphs[0])?);
            execs.push(ctx.graph_instantiate(graphs[0])?);
            // A graph made of two replays of the first exec, then a copy of its own.
            ctx.begin_capture(t.id(), CaptureMode::Global)?;
            ctx.graph_launch(execs[0], t.id())?;
            ctx.graph_launch(execs[0], t.id())?;
            // SAFETY: as above.
            unsafe { ctx.memcpy_async(outs[1].0, d.ptr.0, n, MemcpyKind::D2H, t.id())? };
            graphs.push(ctx.end_capture(t.id())?);
            execs.push(ctx.graph_instantiate(graphs[1])?);
            for (k, x) in execs.iter().cycle().take(12).enumerate() {
                ctx.graph_launch(*x, if k % 2 == 0 { s.id() } else { t.id() })?;
            }
            s.synchronize()?;
            t.synchronize()?;
            for (i, out) in outs.iter().enumerate() {
                // SAFETY: out holds n bytes written by the replays, all finished.
                let got = unsafe { std::slice::from_raw_parts(out.as_mut_ptr(), n) };
                same(
                    got,
                    &data,
                    &format!("host buffer {i} after back-to-back replays"),
                )?;
            }
            Ok(())
        })();
        // A failure inside is the case's result; cleanup after it (a capture it left open
        // refuses destroys) must not hide it.
        let mut cleanup: Result<(), Failure> = Ok(());
        for x in execs {
            cleanup = cleanup.and(ctx.graph_exec_destroy(x).map_err(Failure::from));
        }
        for g in graphs {
            cleanup = cleanup.and(ctx.graph_destroy(g).map_err(Failure::from));
        }
        r.and(cleanup)
    };
    let r = run();
    ctx.free_host(host)?;
    for out in outs {
        ctx.free_host(out)?;
    }
    r
}

/// A `Stream` dropped in the middle of a global-mode capture (as an early return does) ends
/// the capture and discards it: nothing captured runs, synchronising calls work again and a
/// new capture can begin.
fn dropped_mid_capture(ctx: &Ctx) -> Result<(), Failure> {
    let b = Buf::with(&ctx.backend, &[1u8; 256])?;
    let dropped = {
        let s = Stream::new(&ctx.backend)?;
        ctx.begin_capture(s.id(), CaptureMode::Global)?;
        s.memset(b.ptr, 2, 256)?;
        s.id()
    };
    // The stream is gone, its capture with it: ending it now is refused (a stale handle).
    if let Ok(g) = ctx.backend.end_capture(dropped) {
        ctx.graph_destroy(g)?;
        return Err(Failure::Failed(
            "the dropped stream's capture was still open".into(),
        ));
    }
    ctx.backend.synchronize()?;
    same(&b.read()?, &[1; 256], "memory after the dropped capture")?;
    let s = Stream::new(&ctx.backend)?;
    ctx.begin_capture(s.id(), CaptureMode::Global)?;
    s.memset(b.ptr, 3, 256)?;
    let g = ctx.end_capture(s.id())?;
    ctx.graph_destroy(g)?;
    Ok(())
}
