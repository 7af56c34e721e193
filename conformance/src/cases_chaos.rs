//! Seeded random call sequences mixing valid and invalid arguments: whatever the order, every
//! call returns `Ok` or a typed error — never a panic, a hang or memory corruption — and the
//! device still works afterwards.
//!
//! The sequence runs on a private instance of the device ([`unirt::discovery::open_private`]):
//! it captures the default stream and reuses freed addresses on purpose, which must not reach
//! the cases running beside it on the shared instance.

use super::*;
use crate::ensure;
use unirt::hal::{
    CaptureMode, DevicePtr, EventFlags, EventId, GraphExecId, GraphId, KernelArg, MemcpyKind,
    StreamId,
};
use unirt::stream::BackendExt;
use unirt::Backend;

pub(super) const CASES: &[Case] = &[
    Case {
        name: "bad::random_call_sequences",
        needs: &[],
        run: |c| chaos(c, 0x5eed_0001, 2000),
    },
    Case {
        name: "bad::random_call_sequences_second_seed",
        needs: &[],
        run: |c| chaos(c, 0x5eed_0002, 2000),
    },
    Case {
        name: "bad::random_call_sequences_20_more_seeds",
        needs: &[],
        run: twenty_seeds,
    },
    Case {
        name: "bad::random_call_sequences_regressions",
        needs: &[],
        run: regressions,
    },
];

/// Seeds the fuzzer (`conformance/tests/fuzz.rs`) found a fault with, replayed on every device.
/// 0x100d: a graph launched into a capture, whose event wait was not carried into the new
/// graph, reached `cuGraphInstantiateWithFlags` with a destroyed event (over the fake driver).
const REGRESSION_SEEDS: &[u64] = &[0x100d];

fn regressions(c: &Ctx) -> Result<(), Failure> {
    for &seed in REGRESSION_SEEDS {
        chaos(c, seed, 2000).map_err(|f| f.context(format!("seed {seed:#x}")))?;
    }
    Ok(())
}

/// Twenty more seeds (2000 calls each), every one on a fresh private instance; a failure names
/// its seed so the sequence can be replayed alone.
fn twenty_seeds(c: &Ctx) -> Result<(), Failure> {
    for seed in 0x5eed_0003..0x5eed_0003 + 20u64 {
        chaos(c, seed, 2000).map_err(|f| f.context(format!("seed {seed:#x}")))?;
    }
    Ok(())
}

/// A small xorshift generator: the sequence depends on the seed only.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<T: Copy>(&mut self, items: &[T], otherwise: T) -> T {
        if items.is_empty() {
            otherwise
        } else {
            items[self.below(items.len() as u64) as usize]
        }
    }
}

/// Everything the sequence created, live or dead, so later calls can reuse it.
#[derive(Default)]
struct World {
    live: Vec<(DevicePtr, usize)>,
    dead: Vec<DevicePtr>,
    streams: Vec<StreamId>,
    events: Vec<EventId>,
    graphs: Vec<GraphId>,
    execs: Vec<GraphExecId>,
}

impl World {
    /// A device address: a live allocation (at its start or inside, maybe past its end), a
    /// freed one, null, or garbage.
    fn addr(&self, r: &mut Rng) -> u64 {
        match r.below(6) {
            0 | 1 => {
                let (p, len) = r.pick(&self.live, (DevicePtr(0x1000), 16));
                p.0 + r.below(len as u64 + 64)
            }
            2 => {
                let (p, _) = r.pick(&self.live, (DevicePtr(0x1000), 16));
                p.0
            }
            3 => r.pick(&self.dead, DevicePtr(0x2000)).0,
            4 => 0,
            _ => r.next() & !0x3,
        }
    }

    fn stream(&self, ctx: &Ctx, r: &mut Rng) -> StreamId {
        match r.below(4) {
            0 => ctx.default_stream(),
            1 => StreamId(r.next() | 1),
            _ => r.pick(&self.streams, ctx.default_stream()),
        }
    }

    fn event(&self, r: &mut Rng) -> EventId {
        if r.below(5) == 0 {
            EventId(r.next() | 1)
        } else {
            r.pick(&self.events, EventId(0x10))
        }
    }
}

fn len(r: &mut Rng) -> usize {
    match r.below(5) {
        0 => 0,
        1 => r.below(8) as usize,
        2 => r.below(4097) as usize,
        3 => 4096,
        _ => r.below(1 << 16) as usize,
    }
}

/// Runs `steps` random calls chosen by `seed` on a private instance of `shared`'s device, then
/// requires the device to work: the conformance cases and the time-bounded fuzzer
/// (`cargo test -p unirt-conformance --test fuzz`) both run it. The same seed replays the same
/// sequence.
pub fn random_sequence(shared: &Ctx, seed: u64, steps: usize) -> Result<(), Failure> {
    chaos(shared, seed, steps)
}

fn chaos(shared: &Ctx, seed: u64, steps: usize) -> Result<(), Failure> {
    let ctx = &Ctx {
        device: shared.device,
        backend: unirt::discovery::open_private(shared.device)?,
    };
    let mut r = Rng(seed);
    let mut w = World::default();
    // Host memory the copies may touch: 64 KiB, and every host-side length stays inside it.
    let mut host = vec![0u8; 1 << 16];
    let h = host.as_mut_ptr() as u64;
    for _ in 0..steps {
        let op = r.below(22);
        // Results are deliberately ignored: any Ok or Err is fine; a panic fails the case.
        match op {
            0 | 1 => {
                let n = match r.below(6) {
                    0 => usize::MAX,
                    1 => 1usize << 50,
                    // Now and then tens to hundreds of MiB, so unmapping paths run too.
                    2 if r.below(16) == 0 => (32 << 20) + r.below(224 << 20) as usize,
                    _ => len(&mut r),
                };
                if let Ok(p) = ctx.malloc(n) {
                    if !p.is_null() {
                        w.live.push((p, n));
                    }
                }
            }
            2 => {
                let a = w.addr(&mut r);
                if ctx.free(DevicePtr(a)).is_ok() {
                    if let Some(i) = w.live.iter().position(|(p, _)| p.0 == a) {
                        w.live.swap_remove(i);
                        w.dead.push(DevicePtr(a));
                    }
                }
            }
            3 | 4 => {
                let (d, s, n) = (w.addr(&mut r), w.addr(&mut r), len(&mut r));
                let kind = MemcpyKind::ALL[r.below(4) as usize];
                let n = if kind == MemcpyKind::D2D {
                    n
                } else {
                    n.min(1 << 15)
                };
                // Host sides point into `host` with room for n bytes; device sides are checked.
                let off = r.below(1 << 15);
                let dst = if kind.dst_on_device() { d } else { h + off };
                let src = if kind.src_on_device() { s } else { h + off };
                let stream = w.stream(ctx, &mut r);
                // Only synchronous copies touch `host`, so no two queued commands ever race on it.
                let on_host = kind != MemcpyKind::D2D;
                // SAFETY: host ranges lie inside `host` (off + n <= 64 KiB) and are only used by
                // synchronous copies, done when they return; device ranges are the backend's to
                // check.
                let _ = unsafe {
                    if op == 3 || on_host {
                        ctx.memcpy(dst, src, n, kind)
                    } else {
                        ctx.memcpy_async(dst, src, n, kind, stream)
                    }
                };
            }
            5 => {
                let (d, n, v) = (w.addr(&mut r), len(&mut r), r.next() as u8);
                let _ = if r.below(2) == 0 {
                    ctx.memset(DevicePtr(d), v, n)
                } else {
                    ctx.memset_async(DevicePtr(d), v, n, w.stream(ctx, &mut r))
                };
            }
            6 | 7 => {
                let kernel = ["fill", "add_f32", "nope"][r.below(3) as usize];
                let args: Vec<KernelArg> = (0..r.below(6))
                    .map(|_| match r.below(3) {
                        0 => KernelArg::Ptr(DevicePtr(w.addr(&mut r))),
                        1 => KernelArg::U32(r.below(5000) as u32),
                        _ => KernelArg::F32(1.5),
                    })
                    .collect();
                let _ = ctx.launch(kernel, &args, w.stream(ctx, &mut r));
            }
            8 => {
                if let Ok(s) = ctx.stream_create() {
                    w.streams.push(s);
                }
            }
            9 => {
                let _ = ctx.stream_destroy(w.stream(ctx, &mut r));
            }
            10 => {
                let _ = ctx.stream_synchronize(w.stream(ctx, &mut r));
            }
            11 => {
                if let Ok(e) = ctx.event_create(EventFlags(r.below(5) as u32)) {
                    w.events.push(e);
                }
            }
            12 => {
                let _ = ctx.event_record(w.event(&mut r), w.stream(ctx, &mut r));
            }
            13 => {
                let e = w.event(&mut r);
                let _ = ctx.event_query(e);
                let _ = ctx.event_elapsed_ms(e, w.event(&mut r));
            }
            14 => {
                let _ = ctx.event_synchronize(w.event(&mut r));
            }
            15 => {
                let _ = ctx.event_destroy(w.event(&mut r));
            }
            16 => {
                let _ = ctx.stream_wait_event(w.stream(ctx, &mut r), w.event(&mut r));
            }
            17 => {
                let _ = ctx.begin_capture(w.stream(ctx, &mut r), CaptureMode::Relaxed);
            }
            18 => {
                if let Ok(g) = ctx.end_capture(w.stream(ctx, &mut r)) {
                    w.graphs.push(g);
                }
            }
            19 => {
                let g = r.pick(&w.graphs, GraphId(0x30));
                if let Ok(x) = ctx.graph_instantiate(g) {
                    w.execs.push(x);
                }
                if r.below(3) == 0 {
                    let _ = ctx.graph_destroy(g);
                }
            }
            20 => {
                let x = r.pick(&w.execs, GraphExecId(0x40));
                let _ = ctx.graph_launch(x, w.stream(ctx, &mut r));
                if r.below(4) == 0 {
                    let _ = ctx.graph_exec_destroy(x);
                }
            }
            _ => {
                let s = w.stream(ctx, &mut r);
                if let Ok(p) = ctx.malloc_async(len(&mut r), s) {
                    if r.below(2) == 0 {
                        let _ = ctx.free_async(p, w.stream(ctx, &mut r));
                    } else if !p.is_null() {
                        w.live.push((p, 0));
                    }
                }
            }
        }
    }
    // Wind down: stop every capture, wait for everything, release everything.
    let mut all_streams = w.streams.clone();
    all_streams.push(ctx.default_stream());
    for &s in &all_streams {
        if let Ok(g) = ctx.end_capture(s) {
            let _ = ctx.graph_destroy(g);
        }
    }
    ctx.synchronize()?;
    for x in w.execs {
        let _ = ctx.graph_exec_destroy(x);
    }
    for g in w.graphs {
        let _ = ctx.graph_destroy(g);
    }
    for e in w.events {
        let _ = ctx.event_destroy(e);
    }
    for s in w.streams {
        let _ = ctx.stream_destroy(s);
    }
    for (p, _) in w.live {
        let _ = ctx.free(p);
    }
    drop(host);
    // The device still works.
    let data = pattern(4099, seed as u32);
    let b = Buf::with(&ctx.backend, &data)?;
    let c = Buf::new(&ctx.backend, 4099)?;
    ctx.copy_device(c.ptr, b.ptr, 4099)?;
    same(&c.read()?, &data, "a round trip after the random sequence")?;
    let s = unirt::Stream::new(&ctx.backend)?;
    s.launch("fill", &[b.ptr.into(), 7u32.into(), 16u32.into()])?;
    s.synchronize()?;
    ensure!(
        b.read()?[..4] == 7u32.to_le_bytes(),
        "fill after the random sequence"
    );
    Ok(())
}
