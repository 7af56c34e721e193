//! Event records racing waits on other threads (issue 17). Several threads share streams and
//! events: each records shared events on its stream, makes its stream wait for shared events,
//! queues memsets, replays a graph that records an event, and synchronizes streams and events.
//! Every call is legal use, and a wait sees the last record *call* that returned before it, so
//! every dependency points at work already queued: the streams can never wait on each other in
//! a cycle. A backend that let a wait see a record whose work was not queued yet hung here (the
//! CPU backend did, found by the C ABI fuzzer at four threads).
//!
//! A second case races captures begun and ended on one thread against host copies queued on
//! the same stream by another: each copy lands either eagerly or in the capture, whole (wgpu
//! chose its staging — pooled or the graph's own — before taking the stream, and a pooled
//! buffer captured that way was recycled by every replay while other copies reused it).
//!
//! The race runs on its own thread with a time bound: a hang is reported as a failure naming
//! the seed, not a test run that never ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

use unirt::hal::{CaptureMode, EventFlags, EventId, GraphExecId, MemcpyKind, StreamId};
use unirt::Backend;

pub(super) const CASES: &[Case] = &[
    Case {
        name: "robust::event_records_race_waits",
        needs: &[],
        run: records_race_waits,
    },
    Case {
        name: "robust::captures_race_host_copies",
        needs: &[Need::Capture],
        run: captures_race_host_copies,
    },
];

const THREADS: usize = 4;
const EVENTS: usize = 6;
const STEPS: usize = 4000;
const RUN_FOR: Duration = Duration::from_millis(1500);
const HANG_AFTER: Duration = Duration::from_secs(90);
const SLICE: usize = 4096;

fn records_race_waits(ctx: &Ctx) -> Result<(), Failure> {
    let seed = std::env::var("UNIRT_RACE_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0x5eed_e7e7);
    let backend = ctx.backend.clone();
    within(
        HANG_AFTER,
        &format!(
            "{THREADS} threads recording and waiting on shared events (seed {seed:#x}, \
             UNIRT_RACE_SEED)"
        ),
        move || race(&backend, seed),
    )
}

/// xorshift64*: the choices of one thread depend on the seed only.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }
}

fn race(b: &Arc<AnyBackend>, seed: u64) -> Result<(), Failure> {
    let streams = (0..THREADS)
        .map(|_| b.stream_create())
        .collect::<Result<Vec<StreamId>, _>>()?;
    let events = (0..EVENTS)
        .map(|_| b.event_create(EventFlags::DISABLE_TIMING))
        .collect::<Result<Vec<EventId>, _>>()?;
    let buf = b.malloc(SLICE * THREADS)?;
    // A graph per thread that memsets the thread's slice and records a shared event: its
    // replays record events as the eager calls do.
    let execs: Vec<Option<GraphExecId>> = if b.info().capabilities.capture {
        (0..THREADS)
            .map(|t| -> Result<Option<GraphExecId>, Failure> {
                let s = streams[t];
                b.begin_capture(s, CaptureMode::ThreadLocal)?;
                let queued = b
                    .memset_async(buf.offset((t * SLICE) as u64), 7, SLICE, s)
                    .and_then(|()| b.event_record(events[t % EVENTS], s));
                let graph = b.end_capture(s);
                queued?;
                let graph = graph?;
                let exec = b.graph_instantiate(graph);
                b.graph_destroy(graph)?;
                Ok(Some(exec?))
            })
            .collect::<Result<_, _>>()?
    } else {
        vec![None; THREADS]
    };
    let deadline = Instant::now() + RUN_FOR;
    let result = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (streams, events) = (&streams, &events);
                let exec = execs[t];
                scope.spawn(move || -> Result<(), Failure> {
                    let mut rng = Rng(seed ^ ((t as u64 + 1) << 40) | 1);
                    let mine = streams[t];
                    for step in 0..STEPS {
                        if step % 64 == 0 && Instant::now() > deadline {
                            break;
                        }
                        let at = |what: &str| format!("thread {t} step {step}: {what}");
                        let e = events[rng.below(EVENTS)];
                        let r = match rng.below(16) {
                            0..=4 => b.event_record(e, mine).map_err(|x| (at("event_record"), x)),
                            5..=9 => b
                                .stream_wait_event(mine, e)
                                .map_err(|x| (at("stream_wait_event"), x)),
                            10 | 11 => b
                                .memset_async(
                                    buf.offset((t * SLICE) as u64),
                                    step as u8,
                                    SLICE,
                                    mine,
                                )
                                .map_err(|x| (at("memset_async"), x)),
                            12 => match exec {
                                Some(x) => {
                                    b.graph_launch(x, mine).map_err(|x| (at("graph_launch"), x))
                                }
                                None => Ok(()),
                            },
                            13 => b
                                .stream_synchronize(streams[rng.below(THREADS)])
                                .map_err(|x| (at("stream_synchronize"), x)),
                            14 => b
                                .event_synchronize(e)
                                .map_err(|x| (at("event_synchronize"), x)),
                            _ => b
                                .event_record(e, streams[rng.below(THREADS)])
                                .map_err(|x| (at("event_record on another thread's stream"), x)),
                        };
                        r.map_err(|(what, x)| Failure::from(x).context(what))?;
                    }
                    Ok(())
                })
            })
            .collect();
        join_workers(workers)
    });
    for s in &streams {
        b.stream_synchronize(*s)?;
    }
    for x in execs.into_iter().flatten() {
        b.graph_exec_destroy(x)?;
    }
    for e in events {
        b.event_destroy(e)?;
    }
    for s in streams {
        b.stream_destroy(s)?;
    }
    b.free(buf)?;
    result.map(|_| ())
}

fn captures_race_host_copies(ctx: &Ctx) -> Result<(), Failure> {
    let backend = ctx.backend.clone();
    within(HANG_AFTER, "captures racing host copies", move || {
        capture_race(&backend)
    })
}

fn capture_race(b: &Arc<AnyBackend>) -> Result<(), Failure> {
    const N: usize = 64 * 1024 + 4;
    let (s, t) = (b.stream_create()?, b.stream_create()?);
    let host_in = b.malloc_host(N)?;
    let host_out = b.malloc_host(N)?;
    let dev = b.malloc(N)?;
    let deadline = Instant::now() + RUN_FOR;
    let result = std::thread::scope(|scope| {
        let copier = scope.spawn(|| -> Result<(), Failure> {
            let mut k = 0usize;
            while Instant::now() < deadline && k < STEPS {
                // SAFETY: pinned buffers of N bytes that outlive every copy and replay (freed
                // after both streams are synchronized below).
                unsafe {
                    b.memcpy_async(dev.0, host_in.0, N - k % 4, MemcpyKind::H2D, s)
                        .map_err(|e| Failure::from(e).context(format!("copy {k}: H2D")))?;
                    b.memcpy_async(host_out.0, dev.0, N - k % 4, MemcpyKind::D2H, s)
                        .map_err(|e| Failure::from(e).context(format!("copy {k}: D2H")))?;
                }
                k += 1;
            }
            Ok(())
        });
        let capturer = scope.spawn(|| -> Result<(), Failure> {
            let mut k = 0usize;
            while Instant::now() < deadline && k < STEPS / 8 {
                // Relaxed: the other thread's copies to the capturing stream join the capture.
                b.begin_capture(s, CaptureMode::Relaxed)?;
                std::thread::yield_now();
                let g = b.end_capture(s)?;
                let x = b.graph_instantiate(g);
                b.graph_destroy(g)?;
                let x = x?;
                let launched = b.graph_launch(x, t).and_then(|()| b.graph_launch(x, t));
                b.graph_exec_destroy(x)?;
                launched.map_err(|e| Failure::from(e).context(format!("replay {k}")))?;
                k += 1;
            }
            Ok(())
        });
        let join = |h: std::thread::ScopedJoinHandle<'_, Result<(), Failure>>| {
            h.join()
                .unwrap_or_else(|_| Err(Failure::Failed("a race thread panicked".into())))
        };
        join(copier).and(join(capturer))
    });
    let synced = b.stream_synchronize(s).and(b.stream_synchronize(t));
    b.stream_destroy(s)?;
    b.stream_destroy(t)?;
    b.free(dev)?;
    b.free_host(host_in)?;
    b.free_host(host_out)?;
    result?;
    synced.map_err(|e| Failure::from(e).context("synchronize after the race".into()))
}
