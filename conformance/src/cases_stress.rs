//! Eight threads of seeded random operations on one device (issue 10): malloc / free / copies /
//! memsets / streams destroyed with queued work / events / capture and replay / pinned memory /
//! stream-ordered frees. Each thread checks the data of its own buffers against a host model.
//! The threads also share buffers and a stream: they queue work on a shared buffer (on their
//! own stream or the shared one) and other threads free and replace it while that work is
//! still queued or running. A release under that work would let it write memory that a later
//! allocation handed to another thread, which that thread's data check would catch. Every call
//! is correct use, so every call must succeed: no crash, no hang, no error, no corrupted data.
//!
//! The seed is printed; `UNIRT_STRESS_SEED` replays one, `UNIRT_STRESS_SECONDS` changes the
//! time bound (default 6 s per device: the run stops at the bound or after
//! [`OPS_PER_THREAD`] operations per thread, whichever comes first).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::{Duration, Instant};

use super::*;
use unirt::hal::{CaptureMode, DevicePtr, EventFlags, MemcpyKind, StreamId};
use unirt::{Backend, BackendExt};

pub(super) const CASES: &[Case] = &[Case {
    name: "lifetime::eight_threads_random_operations",
    needs: &[],
    run: stress,
}];

const THREADS: usize = 8;
const OPS_PER_THREAD: usize = 3000;
const SHARED_BUFFERS: usize = 8;
const DEFAULT_SEED: u64 = 0x0005_7e55_1234;

/// xorshift64*: the choices depend on the seed only.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// What the threads share: buffers any of them may use, free and replace, and one stream. A
/// slot's lock covers the call that names its address, not the work that call queues.
struct Common {
    buffers: Vec<RwLock<(DevicePtr, usize)>>,
    stream: StreamId,
    calls: AtomicU64,
}

/// One buffer a thread owns, and what it must hold once the thread's stream has caught up.
struct Owned {
    ptr: DevicePtr,
    model: Vec<u8>,
}

struct Worker<'a> {
    ctx: &'a Ctx,
    common: &'a Common,
    rng: Rng,
    stream: StreamId,
    owned: Vec<Owned>,
    seed: u64,
}

fn stress(ctx: &Ctx) -> Result<(), Failure> {
    let seed = env_u64("UNIRT_STRESS_SEED").unwrap_or(DEFAULT_SEED);
    let seconds = env_u64("UNIRT_STRESS_SECONDS").unwrap_or(6);
    eprintln!(
        "{}: lifetime stress, {THREADS} threads, seed {seed:#x} (UNIRT_STRESS_SEED), {seconds} s",
        ctx.device
    );
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut buffers = Vec::new();
    for i in 0..SHARED_BUFFERS {
        let len = 256 << (i % 6);
        buffers.push(RwLock::new((ctx.malloc(len)?, len)));
    }
    let common = Common {
        buffers,
        stream: ctx.stream_create()?,
        calls: AtomicU64::new(0),
    };
    let results: Vec<Result<(), Failure>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let common = &common;
                let thread_seed = seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                scope.spawn(move || -> Result<(), Failure> {
                    let mut w = Worker {
                        ctx,
                        common,
                        rng: Rng(thread_seed | 1),
                        stream: ctx.stream_create()?,
                        owned: Vec::new(),
                        seed,
                    };
                    let run = w.run(deadline);
                    let end = w.finish();
                    run.and(end)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Failure::Failed("a stress thread panicked".into())))
            })
            .collect()
    });
    ctx.stream_synchronize(common.stream)?;
    ctx.stream_destroy(common.stream)?;
    for slot in &common.buffers {
        ctx.free(slot.read().unwrap_or_else(PoisonError::into_inner).0)?;
    }
    ctx.synchronize()?;
    eprintln!(
        "{}: lifetime stress seed {seed:#x}: {} calls",
        ctx.device,
        common.calls.load(Ordering::Relaxed)
    );
    for r in results {
        r.map_err(|f| match f {
            Failure::Failed(m) => Failure::Failed(format!("seed {seed:#x}: {m}")),
            f => f,
        })?;
    }
    Ok(())
}

impl Worker<'_> {
    fn fail(&self, what: &str, e: impl std::fmt::Display) -> Failure {
        Failure::Failed(format!("seed {:#x}: {what}: {e}", self.seed))
    }

    fn ok(&self, what: &str, r: unirt::Result<()>) -> Result<(), Failure> {
        r.map_err(|e| self.fail(what, e))
    }

    fn run(&mut self, deadline: Instant) -> Result<(), Failure> {
        let caps = self.ctx.info().capabilities;
        for i in 0..OPS_PER_THREAD {
            if i % 16 == 0 && Instant::now() >= deadline {
                break;
            }
            self.common.calls.fetch_add(1, Ordering::Relaxed);
            match self.rng.below(16) {
                0 | 1 => self.alloc_owned()?,
                2 => self.free_owned(false)?,
                3 if caps.stream_ordered_memory => self.free_owned(true)?,
                4 | 5 => self.set_owned()?,
                6 => self.copy_owned()?,
                7 => self.verify()?,
                8 => self.replace_stream()?,
                9 if caps.capture => self.capture_replay()?,
                10 => self.pinned_round_trip()?,
                11 | 12 => self.use_shared()?,
                13 => self.replace_shared()?,
                14 => self.events()?,
                _ => {
                    if self.rng.below(8) == 0 {
                        self.ctx.synchronize()?;
                    }
                }
            }
        }
        Ok(())
    }

    fn pick(&mut self) -> Option<usize> {
        (!self.owned.is_empty()).then(|| self.rng.below(self.owned.len()))
    }

    fn alloc_owned(&mut self) -> Result<(), Failure> {
        if self.owned.len() >= 6 {
            return self.free_owned(false);
        }
        let len = match self.rng.below(10) {
            0 => 1 << 20,
            1..=3 => 64 << 10,
            _ => 64 + self.rng.below(4096),
        };
        let ptr = self.ctx.malloc(len)?;
        let model = pattern(len, self.rng.next() as u32);
        self.ctx.copy_to_device(ptr, &model)?;
        self.owned.push(Owned { ptr, model });
        Ok(())
    }

    /// Frees an owned buffer right behind queued work on it (`free` or `free_async`).
    fn free_owned(&mut self, stream_ordered: bool) -> Result<(), Failure> {
        let Some(i) = self.pick() else {
            return Ok(());
        };
        let b = self.owned.swap_remove(i);
        let len = b.model.len();
        self.ctx.memset_async(b.ptr, 0xee, len, self.stream)?;
        if stream_ordered {
            self.ctx.free_async(b.ptr, self.stream)?;
        } else {
            self.ctx.free(b.ptr)?;
        }
        Ok(())
    }

    fn set_owned(&mut self) -> Result<(), Failure> {
        let Some(i) = self.pick() else {
            return self.alloc_owned();
        };
        let v = self.rng.next() as u8;
        let len = self.owned[i].model.len();
        let off = self.rng.below(len);
        let n = self.rng.below(len - off) + 1;
        self.ctx
            .memset_async(self.owned[i].ptr.offset(off as u64), v, n, self.stream)?;
        self.owned[i].model[off..off + n].fill(v);
        Ok(())
    }

    fn copy_owned(&mut self) -> Result<(), Failure> {
        let (Some(a), Some(b)) = (self.pick(), self.pick()) else {
            return Ok(());
        };
        let n = self.owned[a].model.len().min(self.owned[b].model.len());
        let n = self.rng.below(n) + 1;
        // SAFETY: both are device ranges inside owned allocations (bounds-checked anyway).
        unsafe {
            self.ctx.memcpy_async(
                self.owned[b].ptr.0,
                self.owned[a].ptr.0,
                n,
                MemcpyKind::D2D,
                self.stream,
            )?
        };
        let src = self.owned[a].model[..n].to_vec();
        self.owned[b].model[..n].copy_from_slice(&src);
        Ok(())
    }

    fn verify(&mut self) -> Result<(), Failure> {
        self.ctx.stream_synchronize(self.stream)?;
        for (i, b) in self.owned.iter().enumerate() {
            let got = self.ctx.read_vec(b.ptr, b.model.len())?;
            same(
                &got,
                &b.model,
                &format!("seed {:#x}: owned buffer {i}", self.seed),
            )?;
        }
        Ok(())
    }

    /// Destroys the thread's stream with work queued on it; the new stream waits for that work
    /// through an event.
    fn replace_stream(&mut self) -> Result<(), Failure> {
        let e = self.ctx.event_create(EventFlags::DISABLE_TIMING)?;
        self.ctx.event_record(e, self.stream)?;
        let next = self.ctx.stream_create()?;
        self.ctx.stream_wait_event(next, e)?;
        self.ctx.stream_destroy(self.stream)?;
        self.ctx.event_destroy(e)?;
        self.stream = next;
        Ok(())
    }

    fn capture_replay(&mut self) -> Result<(), Failure> {
        let Some(i) = self.pick() else {
            return Ok(());
        };
        let v = self.rng.next() as u8;
        let len = self.owned[i].model.len();
        self.ctx
            .begin_capture(self.stream, CaptureMode::ThreadLocal)?;
        let recorded = self
            .ctx
            .memset_async(self.owned[i].ptr, v, len, self.stream);
        let g = self.ctx.end_capture(self.stream)?;
        recorded?;
        let x = self.ctx.graph_instantiate(g)?;
        self.ctx.graph_destroy(g)?;
        for _ in 0..1 + self.rng.below(3) {
            self.ctx.graph_launch(x, self.stream)?;
        }
        self.owned[i].model.fill(v);
        if self.rng.below(4) == 0 {
            // Free the graph's buffer behind its replays: the next replay is refused.
            let b = self.owned.swap_remove(i);
            self.ctx.free(b.ptr)?;
            // Refused even when another thread has been handed the same address since: the
            // graph names the allocation, not the address.
            let r = self.ctx.graph_launch(x, self.stream);
            if let Err(f) = expect_err(r, &["out_of_bounds"], "replay after free") {
                self.ctx.graph_exec_destroy(x)?;
                return Err(f);
            }
        }
        self.ctx.graph_exec_destroy(x)?;
        Ok(())
    }

    /// Pinned memory filled from an owned buffer; sometimes freed while the copy is queued.
    fn pinned_round_trip(&mut self) -> Result<(), Failure> {
        let Some(i) = self.pick() else {
            return Ok(());
        };
        let len = self.owned[i].model.len();
        let h = self.ctx.malloc_host(len)?;
        // SAFETY: `h` is pinned memory of `len` bytes, freed only through the backend.
        unsafe {
            self.ctx
                .memcpy_async(h.0, self.owned[i].ptr.0, len, MemcpyKind::D2H, self.stream)?
        };
        if self.rng.below(2) == 0 {
            self.ctx.stream_synchronize(self.stream)?;
            // SAFETY: `h` is live pinned memory of `len` bytes; the copy has completed.
            let got = unsafe { std::slice::from_raw_parts(h.as_mut_ptr(), len) };
            same(got, &self.owned[i].model, "pinned copy of an owned buffer")?;
        }
        self.ctx.free_host(h)?;
        Ok(())
    }

    /// Queues (or makes) a call on a shared buffer; the slot is held only for the call.
    fn use_shared(&mut self) -> Result<(), Failure> {
        let i = self.rng.below(self.common.buffers.len());
        let slot = self.common.buffers[i]
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let (p, len) = *slot;
        let v = self.rng.next() as u8;
        let r = match self.rng.below(6) {
            0 => self.ctx.memset(p, v, len),
            1 | 2 => self.ctx.memset_async(p, v, len, self.stream),
            3 => self.ctx.memset_async(p, v, len, self.common.stream),
            4 => self.ctx.copy_to_device(p, &vec![v; len]),
            _ => self.ctx.read_vec(p, len).map(drop),
        };
        drop(slot);
        self.ok("a call on a shared buffer", r)
    }

    /// Replaces a shared buffer and frees the old one while work that others queued on it may
    /// still be pending.
    fn replace_shared(&mut self) -> Result<(), Failure> {
        let len = 64 + self.rng.below(8192);
        let fresh = self.ctx.malloc(len)?;
        let i = self.rng.below(self.common.buffers.len());
        let old = std::mem::replace(
            &mut *self.common.buffers[i]
                .write()
                .unwrap_or_else(PoisonError::into_inner),
            (fresh, len),
        );
        if self.rng.below(2) == 0 {
            let r = self.ctx.memset_async(old.0, 1, old.1, self.common.stream);
            self.ok("a set on the shared stream", r)?;
        }
        self.ctx.free(old.0)?;
        Ok(())
    }

    fn events(&mut self) -> Result<(), Failure> {
        let a = self.ctx.event_create(EventFlags::DEFAULT)?;
        let b = self.ctx.event_create(EventFlags::DEFAULT)?;
        self.ctx.event_record(a, self.stream)?;
        self.set_owned()?;
        self.ctx.event_record(b, self.stream)?;
        self.ctx.event_query(a)?;
        if self.rng.below(2) == 0 {
            self.ctx.event_synchronize(b)?;
            self.ctx.event_elapsed_ms(a, b)?;
        }
        self.ctx.event_destroy(a)?;
        self.ctx.event_destroy(b)?;
        Ok(())
    }

    /// Checks and frees everything the thread owns, then destroys its stream.
    fn finish(&mut self) -> Result<(), Failure> {
        let checked = self.verify();
        for b in self.owned.drain(..) {
            self.ctx.free(b.ptr)?;
        }
        self.ctx.stream_destroy(self.stream)?;
        checked
    }
}
