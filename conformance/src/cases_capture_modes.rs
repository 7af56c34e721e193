//! What each capture mode allows while a capture is in progress: one case per call class, each
//! run in all three modes, from the capturing thread and (where the class can be) from another
//! thread at the same time.
//!
//! The semantics every backend implements (see [`unirt::hal::CaptureMode`]):
//! - only work enqueued on the capturing stream is recorded; it does not run until a replay;
//! - everything else runs as it would without a capture, in every mode: synchronous copies and
//!   sets on other streams, raw and cached allocations and frees, device synchronisation
//!   (which waits for every stream but the capturing one), events and streams that are not
//!   part of the capture;
//! - a call that would have to wait for recorded work — synchronising the capturing stream,
//!   querying or synchronising an event recorded inside the capture — is refused with
//!   [`unirt::Error::Capturing`], and the capture goes on unharmed;
//! - none of the above invalidates the capture: it ends with a graph that replays what was
//!   recorded;
//! - a Global or ThreadLocal capture is ended by the thread that began it (CUDA's rule): another
//!   thread's `end_capture` is refused with [`unirt::Error::Capturing`] and the capture goes on;
//!   a Relaxed capture may be ended by any thread.
//!
//! The modes exist for CUDA code outside unirt (they decide which of *its* "potentially
//! unsafe" calls CUDA refuses); unirt's own calls never depend on them.

use std::sync::Arc;

use super::*;
use crate::ensure;
use crate::ops_check::fail;
use unirt::alloc::CachingAllocator;
use unirt::hal::{CaptureMode, EventFlags, EventStatus, MemcpyKind, StreamId};
use unirt::stream::Stream;

const CAP: &[Need] = &[Need::Capture];
const MODES: [CaptureMode; 3] = [
    CaptureMode::Global,
    CaptureMode::ThreadLocal,
    CaptureMode::Relaxed,
];

pub(super) const CASES: &[Case] = &[
    Case {
        name: "capture::modes::sync_copy_on_other_streams",
        needs: CAP,
        run: sync_copies,
    },
    Case {
        name: "capture::modes::caching_allocator",
        needs: CAP,
        run: caching_allocator,
    },
    Case {
        name: "capture::modes::raw_malloc_and_free",
        needs: CAP,
        run: raw_alloc,
    },
    Case {
        name: "capture::modes::event_sync",
        needs: CAP,
        run: event_sync,
    },
    Case {
        name: "capture::modes::device_synchronize",
        needs: CAP,
        run: device_sync,
    },
    Case {
        name: "capture::modes::stream_sync_and_query",
        needs: CAP,
        run: stream_sync,
    },
    Case {
        name: "capture::modes::end_on_another_thread",
        needs: CAP,
        run: end_elsewhere,
    },
];

/// Ending a capture from a thread other than the one that began it: refused (and harmless) in
/// Global and ThreadLocal mode, allowed in Relaxed mode.
fn end_elsewhere(ctx: &Ctx) -> Result<(), Failure> {
    for mode in MODES {
        let s = Stream::new(&ctx.backend)?;
        let marker = Buf::with(&ctx.backend, &[0u8; MARK])?;
        ctx.begin_capture(s.id(), mode)?;
        ctx.memset_async(marker.ptr, 5, MARK, s.id())?;
        let there = std::thread::scope(|sc| {
            sc.spawn(|| ctx.end_capture(s.id()))
                .join()
                .map_err(|_| Failure::Failed("the other thread panicked".into()))
        })?;
        let g = match (mode, there) {
            (CaptureMode::Relaxed, Ok(g)) => g,
            (CaptureMode::Relaxed, Err(e)) => {
                return Err(fail(format!("Relaxed: end_capture on another thread: {e}")))
            }
            (_, Ok(_)) => {
                return Err(fail(format!(
                    "{mode:?}: end_capture on another thread succeeded"
                )))
            }
            (_, Err(Error::Capturing(_))) => {
                // Still capturing, unharmed: more work records, and this thread ends it.
                ctx.memset_async(marker.ptr, 6, MARK / 2, s.id())?;
                ctx.end_capture(s.id())?
            }
            (_, Err(e)) => {
                return Err(fail(format!(
                    "{mode:?}: end_capture on another thread: expected Capturing, got {e}"
                )))
            }
        };
        same(
            &marker.read()?,
            &[0; MARK],
            &format!("{mode:?}: before replay"),
        )?;
        let x = ctx.graph_instantiate(g)?;
        ctx.graph_launch(x, s.id())?;
        s.synchronize()?;
        let mut want = vec![5u8; MARK];
        if mode != CaptureMode::Relaxed {
            want[..MARK / 2].fill(6);
        }
        same(&marker.read()?, &want, &format!("{mode:?}: after replay"))?;
        ctx.graph_exec_destroy(x)?;
        ctx.graph_destroy(g)?;
    }
    Ok(())
}

const MARK: usize = 4096;

/// Begins a capture in `mode` on a fresh stream, records a memset of a marker buffer, runs
/// `during(capturing stream)`, ends the capture and checks that nothing ran before the replay
/// and that the replay ran what was recorded.
fn around_capture(
    ctx: &Ctx,
    mode: CaptureMode,
    during: impl FnOnce(StreamId) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let marker = Buf::with(&ctx.backend, &[0u8; MARK])?;
    ctx.begin_capture(s.id(), mode)?;
    ctx.memset_async(marker.ptr, 7, MARK, s.id())?;
    let body = during(s.id());
    let ended = ctx.end_capture(s.id());
    body.map_err(|f| f.context(format!("{mode:?} capture")))?;
    let g = ended.map_err(|e| {
        Failure::Failed(format!(
            "{mode:?}: the capture did not hold through the calls: {e}"
        ))
    })?;
    same(
        &marker.read()?,
        &[0; MARK],
        &format!("{mode:?}: marker before replay"),
    )?;
    let x = ctx.graph_instantiate(g)?;
    ctx.graph_launch(x, s.id())?;
    s.synchronize()?;
    same(
        &marker.read()?,
        &[7; MARK],
        &format!("{mode:?}: marker after replay"),
    )?;
    ctx.graph_exec_destroy(x)?;
    ctx.graph_destroy(g)?;
    Ok(())
}

/// Runs `f` on this thread and, at the same time, on another thread.
fn here_and_there(f: impl Fn() -> Result<(), Failure> + Sync) -> Result<(), Failure> {
    std::thread::scope(|sc| {
        let other = sc.spawn(&f);
        let here = f();
        let there = other
            .join()
            .unwrap_or_else(|_| Err(Failure::Failed("the other thread panicked".into())));
        here.and(there.map_err(|e| e.context("on another thread".into())))
    })
}

fn sync_copies(ctx: &Ctx) -> Result<(), Failure> {
    let copy_round = || -> Result<(), Failure> {
        let data = pattern(10_000, 3);
        let b = Buf::new(&ctx.backend, data.len())?;
        // Synchronous copies and sets run on the default stream, which is not capturing.
        // SAFETY: `data` is a live host buffer of that length.
        unsafe { ctx.memcpy(b.ptr.0, data.as_ptr() as u64, data.len(), MemcpyKind::H2D)? };
        same(&b.read()?, &data, "a synchronous H2D + D2H round trip")?;
        ctx.memset(b.ptr, 9, 100)?;
        ensure!(
            b.read()?[..100] == [9; 100],
            "a synchronous memset did not land"
        );
        // Async work on another stream runs and can be waited for.
        let other = Stream::new(&ctx.backend)?;
        let c = Buf::new(&ctx.backend, data.len())?;
        // SAFETY: device-only copy, checked by the backend.
        unsafe { ctx.memcpy_async(c.ptr.0, b.ptr.0, data.len(), MemcpyKind::D2D, other.id())? };
        other.synchronize()?;
        let got = c.read()?;
        ensure!(
            got[..100] == [9; 100] && got[100..] == data[100..],
            "a D2D copy on another stream"
        );
        Ok(())
    };
    for mode in MODES {
        around_capture(ctx, mode, |_| here_and_there(copy_round))?;
    }
    Ok(())
}

fn caching_allocator(ctx: &Ctx) -> Result<(), Failure> {
    for mode in MODES {
        let a = Arc::new(CachingAllocator::new(ctx.backend.clone()));
        let other = Stream::new(&ctx.backend)?;
        around_capture(ctx, mode, |_| {
            here_and_there(|| {
                // Growth (a new segment) and reuse on a stream that is not capturing.
                let p = a.malloc(3 << 20, other.id())?;
                ctx.memset_async(p, 1, 3 << 20, other.id())?;
                a.free(p)?;
                let q = a.malloc(1000, other.id())?;
                a.free(q)?;
                other.synchronize()?;
                a.empty_cache()?;
                Ok(())
            })
        })?;
    }
    Ok(())
}

fn raw_alloc(ctx: &Ctx) -> Result<(), Failure> {
    for mode in MODES {
        around_capture(ctx, mode, |_| {
            here_and_there(|| {
                let p = ctx.malloc(1 << 20)?;
                ctx.memset(p, 3, 1 << 20)?;
                ctx.free(p)?;
                let h = ctx.malloc_host(1 << 16)?;
                ctx.free_host(h)?;
                Ok(())
            })
        })?;
    }
    Ok(())
}

fn event_sync(ctx: &Ctx) -> Result<(), Failure> {
    for mode in MODES {
        let other = Stream::new(&ctx.backend)?;
        let outside = ctx.event_create(EventFlags::DEFAULT)?;
        let inside = ctx.event_create(EventFlags::DEFAULT)?;
        let r = around_capture(ctx, mode, |s| {
            // An event of work that is not recorded: waits, queries and synchronises as usual.
            ctx.memset_async(Buf::new(&ctx.backend, 64)?.ptr, 0, 64, other.id())?;
            ctx.event_record(outside, other.id())?;
            ctx.event_synchronize(outside)?;
            ensure!(
                ctx.event_query(outside)? == EventStatus::Complete,
                "an event of finished work is not complete"
            );
            // An event recorded inside the capture stands for work that has not run: waiting
            // for it is refused, and the capture holds.
            ctx.event_record(inside, s)?;
            expect_err(
                ctx.event_query(inside),
                &["capturing"],
                "querying an event recorded inside the capture",
            )?;
            expect_err(
                ctx.event_synchronize(inside),
                &["capturing"],
                "synchronising an event recorded inside the capture",
            )?;
            Ok(())
        });
        ctx.event_destroy(outside)?;
        ctx.event_destroy(inside)?;
        r?;
    }
    Ok(())
}

fn device_sync(ctx: &Ctx) -> Result<(), Failure> {
    for mode in MODES {
        let other = Stream::new(&ctx.backend)?;
        let b = Buf::new(&ctx.backend, 1 << 20)?;
        around_capture(ctx, mode, |_| {
            ctx.memset_async(b.ptr, 5, 1 << 20, other.id())?;
            // Waits for every stream but the capturing one (whose recorded work never runs).
            ctx.synchronize()?;
            let got = b.read()?;
            ensure!(
                got.iter().all(|&v| v == 5),
                "device synchronize returned before another stream's work"
            );
            here_and_there(|| Ok(ctx.synchronize()?))
        })?;
    }
    Ok(())
}

fn stream_sync(ctx: &Ctx) -> Result<(), Failure> {
    for mode in MODES {
        let other = Stream::new(&ctx.backend)?;
        around_capture(ctx, mode, |s| {
            expect_err(
                ctx.stream_synchronize(s),
                &["capturing"],
                "synchronising the capturing stream",
            )?;
            other.synchronize()?;
            ctx.stream_synchronize(ctx.default_stream())?;
            Ok(())
        })?;
    }
    Ok(())
}
