//! Streams, events and the work they run.
//!
//! Each created stream is a worker thread draining an ordered queue of [`Op`]s, so work is
//! asynchronous as on a GPU: a call returns once its work is queued, events report NOT_READY
//! until the work before them ran, and `cuEventElapsedTime` measures the time between two
//! records as they executed. The legacy stream (handle 0, `CU_STREAM_LEGACY`,
//! `CU_STREAM_PER_THREAD`) runs work on the calling thread after the context's blocking
//! streams have drained — a legal schedule of CUDA's legacy-stream semantics, not the only one.
//!
//! Copies to or from pageable (not `cuMemAllocHost`) host memory follow CUDA's documented
//! behaviour: a host-to-device copy stages the source before returning; a device-to-host copy
//! returns only after the copy is done.
//!
//! When a context is poisoned by a sticky error, its queued work is skipped (events still
//! complete, so nobody waits forever) and every call reports the error.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::kernels::Twin;
use crate::result::*;
use crate::state::{self, Ctx, DevBuf};

/// Where one side of a copy is.
#[derive(Clone)]
pub enum Loc {
    /// A device address (resolved when the copy runs).
    Dev(u64),
    /// A host address the caller keeps valid until the copy has run.
    Host(u64),
    /// Pageable host data staged at the call.
    Staged(Arc<Vec<u8>>),
}

/// One unit of stream work (also a graph node).
#[derive(Clone)]
pub enum Op {
    Copy {
        dst: Loc,
        src: Loc,
        bytes: u64,
    },
    Set {
        dst: u64,
        value: u8,
        bytes: u64,
    },
    Kernel {
        twin: Twin,
        args: Vec<u64>,
    },
    /// Records `ev`; `gen` is assigned when the op is queued (0 in a graph).
    Record {
        ev: Arc<Event>,
        gen: u64,
    },
    /// Waits for `ev`'s record number `gen` (snapshot when queued).
    Wait {
        ev: Arc<Event>,
        gen: u64,
    },
    /// Stream-ordered free: the allocation at `base` goes when the stream gets here.
    Release {
        base: u64,
    },
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A raw host pointer for one side of a copy; device sides keep their buffer alive in `keep`.
fn host_ptr(loc: &Loc, len: u64, keep: &mut Vec<Arc<DevBuf>>) -> Result<*mut u8, CUresult> {
    match loc {
        Loc::Host(p) => Ok(*p as usize as *mut u8),
        Loc::Staged(v) => Ok(v.as_ptr() as *mut u8),
        Loc::Dev(a) => {
            let g = state::lock();
            let d = g.as_ref().ok_or(ILLEGAL_ADDRESS)?;
            // A device range that is no longer (or never was) allocated: the GPU faults.
            let (buf, off) = d.resolve(*a, len).ok_or(ILLEGAL_ADDRESS)?;
            // SAFETY: off + len <= the buffer's size (checked by resolve).
            let p = unsafe { buf.ptr().add(off) };
            keep.push(buf);
            Ok(p)
        }
    }
}

/// Runs one op; an error is a device fault that poisons the context.
pub fn execute(op: &Op) -> Result<(), CUresult> {
    match op {
        Op::Copy { dst, src, bytes } => {
            let mut keep = Vec::new();
            let d = host_ptr(dst, *bytes, &mut keep)?;
            let s = host_ptr(src, *bytes, &mut keep)?;
            // SAFETY: device sides are in bounds of live buffers held in `keep`; host sides are
            // the caller's contract (valid until the copy has run), staged data is owned.
            unsafe { std::ptr::copy(s, d, *bytes as usize) };
            Ok(())
        }
        Op::Set { dst, value, bytes } => {
            let mut keep = Vec::new();
            let d = host_ptr(&Loc::Dev(*dst), *bytes, &mut keep)?;
            // SAFETY: in bounds of a live buffer held in `keep`.
            unsafe { std::ptr::write_bytes(d, *value, *bytes as usize) };
            Ok(())
        }
        Op::Kernel { twin, args } => crate::kernels::run(*twin, args),
        Op::Record { ev, gen } => {
            ev.complete(*gen);
            Ok(())
        }
        Op::Wait { ev, gen } => {
            ev.wait(*gen);
            Ok(())
        }
        Op::Release { base } => {
            let mut g = state::lock();
            let d = g.as_mut().ok_or(ILLEGAL_ADDRESS)?;
            d.free(*base)
        }
    }
}

#[derive(Default)]
struct Queue {
    ops: VecDeque<Op>,
    submitted: u64,
    completed: u64,
    closing: bool,
}

/// A created stream: an ordered queue and the worker thread that drains it.
pub struct Stream {
    pub handle: u64,
    pub ctx: Arc<Ctx>,
    /// Created without `CU_STREAM_NON_BLOCKING`: synchronises with the legacy stream.
    pub blocking: bool,
    q: Mutex<Queue>,
    cv: Condvar,
}

impl Stream {
    /// A stream with its worker; `None` when the host cannot start a thread.
    pub fn spawn(handle: u64, ctx: Arc<Ctx>, blocking: bool) -> Option<Arc<Stream>> {
        let s = Arc::new(Stream {
            handle,
            ctx,
            blocking,
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
        });
        let w = s.clone();
        std::thread::Builder::new()
            .name(format!("fakecuda-stream-{handle:#x}"))
            .spawn(move || w.work())
            .ok()?;
        Some(s)
    }

    fn work(&self) {
        loop {
            let op = {
                let mut q = lock(&self.q);
                loop {
                    if let Some(op) = q.ops.pop_front() {
                        break op;
                    }
                    if q.closing {
                        return;
                    }
                    q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            let poisoned = self.ctx.sticky().is_some();
            if poisoned {
                // A dead context runs nothing; events still complete so that nobody hangs.
                if let Op::Record { ev, gen } = &op {
                    ev.complete(*gen);
                }
            } else if let Err(r) = execute(&op) {
                self.ctx.poison(r);
            }
            drop(op);
            let mut q = lock(&self.q);
            q.completed += 1;
            self.cv.notify_all();
        }
    }

    /// Queues `op`; returns its sequence number.
    pub fn push(&self, op: Op) -> u64 {
        let mut q = lock(&self.q);
        q.ops.push_back(op);
        q.submitted += 1;
        self.cv.notify_all();
        q.submitted
    }

    /// Waits until op number `seq` has run.
    pub fn wait_for(&self, seq: u64) {
        let mut q = lock(&self.q);
        while q.completed < seq {
            q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits for everything queued so far; the context's sticky error, if any.
    pub fn sync(&self) -> CUresult {
        let target = lock(&self.q).submitted;
        self.wait_for(target);
        self.ctx.sticky().unwrap_or(SUCCESS)
    }

    /// Whether everything queued so far has run.
    pub fn idle(&self) -> bool {
        let q = lock(&self.q);
        q.completed >= q.submitted
    }

    /// Lets the worker finish the queued work and exit (`cuStreamDestroy` returns at once).
    pub fn close(&self) {
        lock(&self.q).closing = true;
        self.cv.notify_all();
    }
}

#[derive(Default)]
struct EvState {
    /// Records queued so far.
    recorded: u64,
    /// The highest record number that has run.
    done: u64,
    /// When the newest completed record ran.
    time: Option<Instant>,
    /// Set when last recorded (without RECORD_EXTERNAL) inside this stream's capture.
    captured_in: Option<u64>,
}

/// An event.
pub struct Event {
    pub handle: u64,
    pub ctx: u64,
    pub timing: bool,
    st: Mutex<EvState>,
    cv: Condvar,
}

impl Event {
    pub fn new(handle: u64, ctx: u64, timing: bool) -> Event {
        Event {
            handle,
            ctx,
            timing,
            st: Mutex::new(EvState::default()),
            cv: Condvar::new(),
        }
    }

    /// A new record number for a record being queued now.
    pub fn bump(&self) -> u64 {
        let mut s = lock(&self.st);
        s.recorded += 1;
        s.captured_in = None;
        s.recorded
    }

    /// The latest record number queued (what a wait queued now waits for).
    pub fn latest(&self) -> u64 {
        lock(&self.st).recorded
    }

    fn complete(&self, gen: u64) {
        let mut s = lock(&self.st);
        if gen >= s.done {
            s.done = gen;
            s.time = Some(Instant::now());
        }
        self.cv.notify_all();
    }

    fn wait(&self, gen: u64) {
        let mut s = lock(&self.st);
        while s.done < gen {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Whether the latest record has run (an event never recorded is complete).
    pub fn is_done(&self) -> bool {
        let s = lock(&self.st);
        s.done >= s.recorded
    }

    /// Blocks until the latest record queued so far has run.
    pub fn synchronize(&self) {
        let gen = self.latest();
        self.wait(gen);
    }

    /// (ever recorded, complete, time of the newest completed record).
    pub fn timing_state(&self) -> (bool, bool, Option<Instant>) {
        let s = lock(&self.st);
        (s.recorded > 0, s.done >= s.recorded, s.time)
    }

    pub fn captured_in(&self) -> Option<u64> {
        lock(&self.st).captured_in
    }

    pub fn set_captured_in(&self, stream: u64) {
        lock(&self.st).captured_in = Some(stream);
    }
}

/// Turns a graph node into the op to queue now (records and waits get their numbers now).
pub fn instantiate_op(op: &Op) -> Op {
    match op {
        Op::Record { ev, .. } => Op::Record {
            ev: ev.clone(),
            gen: ev.bump(),
        },
        Op::Wait { ev, .. } => Op::Wait {
            ev: ev.clone(),
            gen: ev.latest(),
        },
        other => other.clone(),
    }
}
