//! Streams, events and stream-ordered memory.

use super::*;
use crate::ensure;
use unirt::hal::{EventFlags, EventStatus, KernelArg, MemcpyKind, StreamId};
use unirt::{Backend, Event, Stream};

pub(super) const CASES: &[Case] = &[
    Case {
        name: "stream::create_destroy_many",
        needs: &[],
        run: create_destroy,
    },
    Case {
        name: "stream::ordering",
        needs: &[],
        run: ordering,
    },
    Case {
        name: "stream::cross_stream_wait",
        needs: &[],
        run: cross_wait,
    },
    Case {
        name: "stream::device_synchronize",
        needs: &[],
        run: device_sync,
    },
    Case {
        name: "stream::default_stream_is_usable",
        needs: &[],
        run: default_usable,
    },
    Case {
        name: "stream::concurrent_enqueue_threads",
        needs: &[],
        run: threads,
    },
    Case {
        name: "event::never_recorded_is_complete",
        needs: &[],
        run: never_recorded,
    },
    Case {
        name: "event::not_ready_while_pending",
        needs: &[Need::AsyncStreams],
        run: not_ready,
    },
    Case {
        name: "event::elapsed_positive_and_monotonic",
        needs: &[],
        run: elapsed,
    },
    Case {
        name: "event::disable_timing_refuses_elapsed",
        needs: &[],
        run: disable_timing,
    },
    Case {
        name: "event::synchronize_then_data_visible",
        needs: &[],
        run: sync_visible,
    },
    Case {
        name: "event::rerecord_tracks_latest",
        needs: &[],
        run: rerecord,
    },
    Case {
        name: "event::blocking_sync_flag",
        needs: &[],
        run: blocking,
    },
    Case {
        name: "stream_ordered::alloc_use_free",
        needs: &[Need::StreamOrderedMemory],
        run: ordered_alloc,
    },
    Case {
        name: "stream_ordered::across_streams",
        needs: &[Need::StreamOrderedMemory],
        run: ordered_cross,
    },
];

/// Enqueues `rounds` memsets over a 64 MiB buffer: work that takes a while on any device.
fn busy(ctx: &Ctx, s: StreamId, buf: &Buf, rounds: usize) -> Result<(), Failure> {
    for i in 0..rounds {
        ctx.memset_async(buf.ptr, i as u8, buf.len, s)?;
    }
    Ok(())
}

fn create_destroy(ctx: &Ctx) -> Result<(), Failure> {
    let ids: Vec<StreamId> = (0..8)
        .map(|_| ctx.stream_create())
        .collect::<Result<_, _>>()?;
    let mut uniq = ids.clone();
    uniq.sort();
    uniq.dedup();
    ensure!(uniq.len() == 8, "stream_create returned duplicate handles");
    let b = Buf::new(&ctx.backend, 64)?;
    for &s in &ids {
        ctx.memset_async(b.ptr, 1, 64, s)?;
    }
    for s in ids {
        ctx.stream_synchronize(s)?;
        ctx.stream_destroy(s)?;
    }
    Ok(())
}

fn ordering(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let n = 1 << 20;
    let (a, b, c) = (
        Buf::new(&ctx.backend, n)?,
        Buf::new(&ctx.backend, n)?,
        Buf::new(&ctx.backend, n)?,
    );
    // SAFETY: device-only copies.
    unsafe {
        s.memset(a.ptr, 1, n)?;
        ctx.memcpy_async(b.ptr.0, a.ptr.0, n, MemcpyKind::D2D, s.id())?;
        s.memset(a.ptr, 2, n)?;
        ctx.memcpy_async(c.ptr.0, a.ptr.0, n, MemcpyKind::D2D, s.id())?;
    }
    s.launch(
        "fill",
        &[a.ptr.into(), 0x0303_0303u32.into(), ((n / 4) as u32).into()],
    )?;
    s.synchronize()?;
    same(&b.read()?, &vec![1; n], "copy after the first memset")?;
    same(&c.read()?, &vec![2; n], "copy after the second memset")?;
    same(&a.read()?, &vec![3; n], "fill last")
}

fn cross_wait(ctx: &Ctx) -> Result<(), Failure> {
    let (s1, s2) = (Stream::new(&ctx.backend)?, Stream::new(&ctx.backend)?);
    let big = Buf::new(&ctx.backend, 64 << 20)?;
    let (x, y) = (
        Buf::new(&ctx.backend, 4096)?,
        Buf::with(&ctx.backend, &[0u8; 4096])?,
    );
    let e = Event::new(&ctx.backend)?;
    for round in 1..=3u8 {
        busy(ctx, s1.id(), &big, 4)?;
        s1.memset(x.ptr, round, 4096)?;
        e.record(&s1)?;
        s2.wait_event(&e)?;
        // SAFETY: device-only copy.
        unsafe { ctx.memcpy_async(y.ptr.0, x.ptr.0, 4096, MemcpyKind::D2D, s2.id())? };
        s2.synchronize()?;
        same(
            &y.read()?,
            &[round; 4096],
            &format!("round {round}: s2 copied before s1's memset finished"),
        )?;
    }
    s1.synchronize()?;
    Ok(())
}

fn device_sync(ctx: &Ctx) -> Result<(), Failure> {
    let streams: Vec<Stream> = (0..3)
        .map(|_| Stream::new(&ctx.backend))
        .collect::<Result<_, _>>()?;
    let bufs: Vec<Buf> = (0..3)
        .map(|_| Buf::new(&ctx.backend, 1 << 20))
        .collect::<Result<_, _>>()?;
    let mut outs = vec![vec![0u8; 1 << 20]; 3];
    for (i, (s, b)) in streams.iter().zip(&bufs).enumerate() {
        s.memset(b.ptr, 10 + i as u8, b.len)?;
        // SAFETY: `outs` outlives the device synchronisation below.
        unsafe {
            ctx.memcpy_async(
                outs[i].as_mut_ptr() as u64,
                b.ptr.0,
                b.len,
                MemcpyKind::D2H,
                s.id(),
            )?
        };
    }
    ctx.synchronize()?;
    for (i, o) in outs.iter().enumerate() {
        same(
            o,
            &vec![10 + i as u8; 1 << 20],
            &format!("stream {i} after device synchronize"),
        )?;
    }
    Ok(())
}

fn default_usable(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::default_of(&ctx.backend);
    let b = Buf::new(&ctx.backend, 100)?;
    s.memset(b.ptr, 0x42, 100)?;
    s.synchronize()?;
    same(&b.read()?, &[0x42; 100], "memset on the default stream")?;
    expect_err(
        ctx.stream_destroy(ctx.default_stream()),
        &["bad_param", "invalid_handle"],
        "destroying the default stream",
    )?;
    s.memset(b.ptr, 0x43, 100)?;
    s.synchronize()?;
    same(&b.read()?, &[0x43; 100], "default stream still works")
}

fn threads(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let b = Buf::with(&ctx.backend, &[0u8; 8 * 256])?;
    let sid = s.id();
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8u8)
            .map(|t| {
                let backend = ctx.backend.clone();
                let p = b.at(256 * t as usize);
                sc.spawn(move || -> unirt::Result<()> {
                    for v in 0..50u8 {
                        backend.memset_async(p, v.wrapping_add(t), 256, sid)?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(unirt::Error::Internal("thread panicked".into())))
        })
    })?;
    s.synchronize()?;
    let got = b.read()?;
    for t in 0..8usize {
        ensure!(
            got[256 * t..256 * (t + 1)]
                .iter()
                .all(|&x| x == 49 + t as u8),
            "thread {t}'s last memset lost"
        );
    }
    Ok(())
}

fn never_recorded(ctx: &Ctx) -> Result<(), Failure> {
    let e = Event::new(&ctx.backend)?;
    ensure!(
        e.query()? == EventStatus::Complete,
        "a never-recorded event should query Complete"
    );
    e.synchronize()?;
    let s = Stream::new(&ctx.backend)?;
    s.wait_event(&e)?;
    s.synchronize()?;
    Ok(())
}

fn not_ready(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let big = Buf::new(&ctx.backend, 64 << 20)?;
    let (e0, e1) = (Event::new(&ctx.backend)?, Event::new(&ctx.backend)?);
    // Grow the workload until the query beats it (a fast device finishes small work first).
    for rounds in [8usize, 32, 128] {
        e0.record(&s)?;
        busy(ctx, s.id(), &big, rounds)?;
        e1.record(&s)?;
        let q = e1.query()?;
        if q == EventStatus::NotReady {
            match e0.elapsed_ms(&e1) {
                // The work finished between the query and this call (a loaded machine): try
                // again with more.
                Ok(_) if e1.query()? == EventStatus::Complete => {
                    s.synchronize()?;
                    continue;
                }
                r => expect_err(r, &["not_ready"], "elapsed time of a pending event")?,
            }
            e1.synchronize()?;
            ensure!(
                e1.query()? == EventStatus::Complete,
                "Complete after synchronize"
            );
            return Ok(());
        }
        s.synchronize()?;
    }
    Err(Failure::Failed(
        "event never reported NotReady with 128 × 64 MiB memsets pending".into(),
    ))
}

fn elapsed(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let big = Buf::new(&ctx.backend, 16 << 20)?;
    let ev: Vec<Event> = (0..3)
        .map(|_| Event::new(&ctx.backend))
        .collect::<Result<_, _>>()?;
    ev[0].record(&s)?;
    busy(ctx, s.id(), &big, 4)?;
    ev[1].record(&s)?;
    busy(ctx, s.id(), &big, 4)?;
    ev[2].record(&s)?;
    ev[2].synchronize()?;
    let (t01, t02, t12) = (
        ev[0].elapsed_ms(&ev[1])?,
        ev[0].elapsed_ms(&ev[2])?,
        ev[1].elapsed_ms(&ev[2])?,
    );
    ensure!(
        t01 > 0.0,
        "elapsed over 4 × 16 MiB memsets = {t01} ms, want > 0"
    );
    ensure!(t12 > 0.0, "second interval = {t12} ms, want > 0");
    ensure!(
        t02 >= t01 && t02 >= t12,
        "not monotonic: t01 {t01}, t12 {t12}, t02 {t02}"
    );
    ensure!(
        (t01 + t12 - t02).abs() <= 0.01 * t02 + 0.01,
        "t01 + t12 = {} != t02 = {t02}",
        t01 + t12
    );
    ensure!(t02 < 60_000.0, "elapsed {t02} ms is not in milliseconds");
    let self_t = ev[1].elapsed_ms(&ev[1])?;
    ensure!(self_t == 0.0, "an event's time to itself = {self_t}");
    Ok(())
}

fn disable_timing(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let a = Event::with_flags(&ctx.backend, EventFlags::DISABLE_TIMING)?;
    let b = Event::new(&ctx.backend)?;
    a.record(&s)?;
    b.record(&s)?;
    s.synchronize()?;
    ensure!(
        a.query()? == EventStatus::Complete,
        "DISABLE_TIMING event still records completion"
    );
    expect_err(
        a.elapsed_ms(&b),
        &["bad_param"],
        "elapsed from a DISABLE_TIMING event",
    )?;
    expect_err(
        b.elapsed_ms(&a),
        &["bad_param"],
        "elapsed to a DISABLE_TIMING event",
    )?;
    let never = Event::new(&ctx.backend)?;
    expect_err(
        b.elapsed_ms(&never),
        &["bad_param", "not_ready"],
        "elapsed to a never-recorded event",
    )?;
    Ok(())
}

fn sync_visible(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let n = 1 << 20;
    let b = Buf::new(&ctx.backend, n)?;
    let mut out = vec![0u8; n];
    let e = Event::new(&ctx.backend)?;
    s.memset(b.ptr, 0x77, n)?;
    // SAFETY: `out` outlives the event synchronisation.
    unsafe { ctx.memcpy_async(out.as_mut_ptr() as u64, b.ptr.0, n, MemcpyKind::D2H, s.id())? };
    e.record(&s)?;
    e.synchronize()?;
    ensure!(
        e.query()? == EventStatus::Complete,
        "Complete after synchronize"
    );
    same(&out, &vec![0x77; n], "data after event synchronize")
}

fn rerecord(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let b = Buf::new(&ctx.backend, 4096)?;
    let e = Event::new(&ctx.backend)?;
    let mut out = [0u8; 4096];
    for v in 1..=3u8 {
        s.memset(b.ptr, v, 4096)?;
        // SAFETY: `out` outlives the event synchronisation.
        unsafe {
            ctx.memcpy_async(
                out.as_mut_ptr() as u64,
                b.ptr.0,
                4096,
                MemcpyKind::D2H,
                s.id(),
            )?
        };
        e.record(&s)?;
        e.synchronize()?;
        ensure!(
            out.iter().all(|&x| x == v),
            "record {v}: synchronize returned before the latest record's work"
        );
    }
    Ok(())
}

fn blocking(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let e = Event::with_flags(
        &ctx.backend,
        EventFlags(EventFlags::BLOCKING_SYNC.0 | EventFlags::DISABLE_TIMING.0),
    )?;
    let b = Buf::new(&ctx.backend, 1 << 20)?;
    s.memset(b.ptr, 5, 1 << 20)?;
    e.record(&s)?;
    e.synchronize()?;
    same(&b.read()?, &vec![5; 1 << 20], "after a blocking-sync event")
}

fn ordered_alloc(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let n = 100_000;
    let p = ctx.malloc_async(n, s.id())?;
    ensure!(!p.is_null(), "malloc_async returned null");
    let mut out = vec![0u8; n];
    s.launch(
        "fill",
        &[p.into(), 0x0909_0909u32.into(), ((n / 4) as u32).into()],
    )?;
    // SAFETY: `out` outlives the synchronisation.
    unsafe { ctx.memcpy_async(out.as_mut_ptr() as u64, p.0, n, MemcpyKind::D2H, s.id())? };
    ctx.free_async(p, s.id())?;
    expect_err(
        ctx.memset_async(p, 0, n, s.id()),
        &["out_of_bounds", "invalid_handle"],
        "memset after free_async",
    )?;
    expect_err(
        ctx.free_async(p, s.id()),
        &["invalid_handle", "bad_param"],
        "second free_async",
    )?;
    s.synchronize()?;
    same(&out, &vec![9; n], "stream-ordered allocation's contents")?;
    // The address space is reusable afterwards.
    let q = ctx.malloc_async(n, s.id())?;
    ctx.free_async(q, s.id())?;
    s.synchronize()?;
    Ok(())
}

fn ordered_cross(ctx: &Ctx) -> Result<(), Failure> {
    let (s1, s2) = (Stream::new(&ctx.backend)?, Stream::new(&ctx.backend)?);
    let n = 1 << 20;
    let p = ctx.malloc_async(n, s1.id())?;
    s1.launch(
        "fill",
        &[
            KernelArg::Ptr(p),
            0x0101_0101u32.into(),
            ((n / 4) as u32).into(),
        ],
    )?;
    let e = Event::new(&ctx.backend)?;
    e.record(&s1)?;
    s2.wait_event(&e)?;
    let mut out = vec![0u8; n];
    // SAFETY: `out` outlives the synchronisation.
    unsafe { ctx.memcpy_async(out.as_mut_ptr() as u64, p.0, n, MemcpyKind::D2H, s2.id())? };
    ctx.free_async(p, s2.id())?;
    s2.synchronize()?;
    s1.synchronize()?;
    same(
        &out,
        &vec![1; n],
        "memory allocated on s1, used on s2 after a wait",
    )
}
