//! CPU streams: an ordered queue of commands run by one worker thread per stream.
//!
//! Enqueueing is a lock, a channel send and a counter bump (and, for a producer more than
//! [`QUEUE_LIMIT`] commands ahead, a wait for room); the worker runs commands in order and
//! counts completions, which `synchronize` waits on. While a stream is capturing, its
//! commands go into the capture list instead (see `graph.rs`).
//!
//! Each queued command carries the [`Pins`] of the memory it touches and drops them only after
//! it has run: a `free` meanwhile unregisters the address, and the memory is released by the
//! worker when the command lets go of it. A destroyed stream's worker drains its queue the
//! same way (the backend keeps the stream until then, so device synchronize waits for it).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use parking_lot::Mutex;

use super::event::CpuEvent;
use super::graph::Capture;
use super::kernels::CpuKernel;
use crate::checked::Pins;
use crate::error::{Error, Result};
use crate::fork::Epoch;
use crate::hal::{HostTask, KernelArg};
use crate::hostmem::HostBlock;
use crate::progress::{Backpressure, Progress};

/// What a worker receives: a command and the memory it keeps alive until it has run.
pub(crate) struct Job {
    op: Op,
    _keep: Pins<HostBlock>,
}

/// One command a worker runs.
#[derive(Clone)]
pub(crate) enum Op {
    /// `memmove` of `len` bytes; both ranges validated at enqueue time.
    Copy {
        dst: u64,
        src: u64,
        len: usize,
    },
    /// A copy from pageable memory, whose bytes were read into `data` when it was queued
    /// (see [`CpuStream::stage`]); `dst` was validated then.
    CopyStaged {
        dst: u64,
        data: Arc<Staged>,
    },
    /// The same for at most [`STAGE_INLINE`] bytes (a token id, a position), carried in the
    /// command itself.
    CopyInline {
        dst: u64,
        len: u8,
        data: [u8; STAGE_INLINE],
    },
    /// The same for at most [`STAGE_SMALL`] bytes, outside the staging budget (the queue's
    /// command limit bounds them).
    CopySmall {
        dst: u64,
        data: Box<[u8]>,
    },
    Set {
        dst: u64,
        value: u8,
        len: usize,
    },
    Kernel {
        run: CpuKernel,
        args: Arc<[KernelArg]>,
    },
    /// Complete record `generation` of the event.
    Stamp {
        event: Arc<CpuEvent>,
        generation: u64,
    },
    /// Block until the event reaches `generation`.
    Wait {
        event: Arc<CpuEvent>,
        generation: u64,
    },
    /// Stream-ordered free: nothing to run; the job's pins hold the allocation freed with
    /// `free_async` (already unregistered), released here unless other work still uses it.
    Release,
    /// A host function (a CPU operator kernel); its ranges were checked at enqueue time.
    Host(HostTask),
    /// A replayed graph: its commands, counted as one completion.
    Batch(Arc<[Op]>),
}

impl Op {
    fn run(&self) -> Result<()> {
        match self {
            Op::Copy { dst, src, len } => {
                // SAFETY: ranges unirt handed out were checked when enqueued and are pinned by
                // the job until this has run; other host ranges are the caller's promise
                // (memcpy_async is unsafe). ptr::copy allows overlap.
                unsafe {
                    std::ptr::copy(*src as usize as *const u8, *dst as usize as *mut u8, *len)
                }
            }
            Op::CopyStaged { dst, data } => {
                // SAFETY: `dst` was checked when queued and is pinned by the job until this
                // has run (or is the caller's promise, as for `Copy`); `data` is ours.
                unsafe {
                    std::ptr::copy(
                        data.bytes.as_ptr(),
                        *dst as usize as *mut u8,
                        data.bytes.len(),
                    )
                }
            }
            Op::CopyInline { dst, len, data } => {
                let data = &data[..(*len as usize).min(STAGE_INLINE)];
                // SAFETY: as for `CopyStaged`.
                unsafe { std::ptr::copy(data.as_ptr(), *dst as usize as *mut u8, data.len()) }
            }
            Op::CopySmall { dst, data } => {
                // SAFETY: as for `CopyStaged`.
                unsafe { std::ptr::copy(data.as_ptr(), *dst as usize as *mut u8, data.len()) }
            }
            Op::Set { dst, value, len } => {
                // SAFETY: the range was checked when enqueued and is pinned by the job.
                unsafe { std::ptr::write_bytes(*dst as usize as *mut u8, *value, *len) }
            }
            Op::Kernel { run, args } => run(args),
            Op::Stamp { event, generation } => event.complete(*generation),
            Op::Wait { event, generation } => event.wait(*generation),
            Op::Release => {}
            Op::Host(task) => return task(),
            // A failed command does not stop the replay (as a failed kernel does not stop a
            // stream); the first error is the one reported.
            Op::Batch(ops) => {
                let mut first = Ok(());
                for op in ops.iter() {
                    let r = op.run();
                    if first.is_ok() {
                        first = r;
                    }
                }
                return first;
            }
        }
        Ok(())
    }
}

/// Shared between the stream handle and its worker.
#[derive(Debug, Default)]
struct Shared {
    done: Progress,
    /// The first failure of a command (a kernel that panicked); reported by synchronize.
    error: Mutex<Option<Error>>,
    /// Set with `error`, so the common no-error synchronize takes no lock.
    failed: AtomicBool,
    /// Bytes of staged copies queued and not yet run (see [`CpuStream::stage`]).
    staged: AtomicU64,
}

/// The largest copy from pageable memory that a busy stream stages rather than waits for.
/// CUDA's rule — the caller may reuse a pageable source once the call returns — would
/// otherwise make every such copy wait for the stream's queue; small ones (a token id, a
/// position, a row of parameters, as a decode loop sends each step) are staged instead.
pub(crate) const STAGE_COPY_MAX: usize = 64 << 10;

/// Copies from pageable memory this small travel inside their command (no allocation).
pub(crate) const STAGE_INLINE: usize = 16;

/// Copies from pageable memory this small are staged outside the budget of [`STAGED_MAX`]:
/// [`QUEUE_LIMIT`] of them hold 2 MiB at most.
pub(crate) const STAGE_SMALL: usize = 256;

/// Staged bytes a stream holds queued at most; past that a copy from pageable memory waits
/// for the stream (as CUDA's does when its staging buffers are full).
const STAGED_MAX: u64 = 8 << 20;

/// The bytes of a staged copy, returned to the stream's budget when the copy has gone.
pub(crate) struct Staged {
    bytes: Box<[u8]>,
    shared: Arc<Shared>,
}

impl Drop for Staged {
    fn drop(&mut self) {
        self.shared
            .staged
            .fetch_sub(self.bytes.len() as u64, Ordering::AcqRel);
    }
}

/// Commands a stream holds queued before an enqueuing thread waits for its worker to run
/// half of them, as CUDA blocks a launch once its queue is full. Unbounded, a loop that
/// queued faster than the worker ran grew without end: 2 million 1 MiB memsets held 310 MB
/// of queue (and 44 s of work) before their synchronisation.
const QUEUE_LIMIT: u64 = 8192;

/// How long an enqueuing thread waits for a worker that runs nothing before it queues anyway:
/// a long command, or one blocked on something the enqueuing thread holds (a lock of unirt's
/// under which it records an event, a user's lock a CPU kernel takes). The stream is then
/// left unbounded until its worker moves again, so that a wait for room never deadlocks and
/// costs at most this once per stall.
const QUEUE_STALL: std::time::Duration = std::time::Duration::from_millis(20);

pub(crate) struct CpuStream {
    /// The sender, under a lock so the sequence numbers match the channel order even with
    /// several threads enqueueing on one stream.
    tx: Mutex<Sender<Job>>,
    submitted: AtomicU64,
    /// Enqueuers' waits for room (see [`QUEUE_LIMIT`]).
    room: Backpressure,
    shared: Arc<Shared>,
    pub capture: Mutex<Option<Capture>>,
    /// The worker exists only in the process that started it: a forked child must not wait
    /// for it (it would wait forever).
    born: Epoch,
}

impl CpuStream {
    pub fn new(name: String) -> Result<Self> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let shared = Arc::new(Shared {
            done: Progress::for_cpu_work(),
            ..Shared::default()
        });
        let worker_shared = shared.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || worker(rx, worker_shared))
            .map_err(|e| Error::Internal(format!("cannot start a stream worker thread: {e}")))?;
        Ok(CpuStream {
            tx: Mutex::new(tx),
            submitted: AtomicU64::new(0),
            room: Backpressure::new(QUEUE_STALL),
            shared,
            capture: Mutex::new(None),
            born: Epoch::now(),
        })
    }

    /// Queues `op` to run after everything queued before it, holding `keep` until it has run.
    pub fn enqueue(&self, op: Op, keep: Pins<HostBlock>) -> Result<()> {
        self.born.check("a cpu stream")?;
        let queued = self.submitted.load(Ordering::Relaxed);
        if queued.saturating_sub(self.shared.done.get()) >= QUEUE_LIMIT {
            self.make_room();
        }
        let tx = self.tx.lock();
        tx.send(Job { op, _keep: keep })
            .map_err(|_| Error::Internal("stream worker has exited".into()))?;
        self.submitted.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Waits until the worker has run all but half of [`QUEUE_LIMIT`] queued commands, or
    /// has run nothing for [`QUEUE_STALL`]. A command of a CPU stream (a CPU kernel queueing
    /// work) never waits: the worker it would wait for may be its own.
    fn make_room(&self) {
        if crate::host_threads::running_command() != 0 {
            return;
        }
        self.room.wait(
            || Some(self.shared.done.get()),
            |done| self.submitted.load(Ordering::Relaxed).saturating_sub(done),
            QUEUE_LIMIT / 2,
        );
    }

    pub fn is_capturing(&self) -> bool {
        self.capture.lock().is_some()
    }

    /// A copy of `src` for an [`Op::CopyStaged`], when the stream's staging budget has room
    /// for it ([`STAGED_MAX`]; the first staged copy always has).
    pub fn stage(&self, src: &[u8]) -> Option<Arc<Staged>> {
        let len = src.len() as u64;
        let before = self.shared.staged.fetch_add(len, Ordering::AcqRel);
        if before > 0 && before + len > STAGED_MAX {
            self.shared.staged.fetch_sub(len, Ordering::AcqRel);
            return None;
        }
        Some(Arc::new(Staged {
            bytes: src.into(),
            shared: self.shared.clone(),
        }))
    }

    /// Waits for everything enqueued so far, leaving a command's failure for the stream's
    /// synchronisation: what a copy to or from pageable memory waits for on a busy stream.
    /// Refused from a command of a CPU stream (see [`refuse_wait_in_command`]).
    pub fn drain(&self) -> Result<()> {
        self.born.check("a cpu stream")?;
        if !self.is_idle() {
            refuse_wait_in_command("a copy to or from pageable memory on a busy stream")?;
            self.shared
                .done
                .wait_for(self.submitted.load(Ordering::SeqCst));
        }
        Ok(())
    }

    /// Whether everything enqueued so far has run (one atomic load each side).
    pub fn is_idle(&self) -> bool {
        self.shared.done.get() >= self.submitted.load(Ordering::SeqCst)
    }

    /// Waits for everything enqueued so far; reports a command's failure without taking it:
    /// a device-wide synchronisation, which must not take a failure from the stream's own
    /// synchronisation (another thread's, perhaps).
    pub fn wait_and_peek(&self) -> Result<()> {
        self.wait_then(false)
    }

    /// Waits for everything enqueued so far; reports a command's failure once.
    pub fn synchronize(&self) -> Result<()> {
        self.wait_then(true)
    }

    /// Waits for everything enqueued so far, then reports the failure recorded, taking it
    /// when `take`.
    fn wait_then(&self, take: bool) -> Result<()> {
        self.born.check("a cpu stream")?;
        if !self.is_idle() {
            refuse_wait_in_command("a stream or device synchronisation")?;
            self.shared
                .done
                .wait_for(self.submitted.load(Ordering::SeqCst));
        }
        let failed = if take {
            self.shared.failed.swap(false, Ordering::AcqRel)
        } else {
            self.shared.failed.load(Ordering::Acquire)
        };
        if !failed {
            return Ok(());
        }
        let mut error = self.shared.error.lock();
        match if take { error.take() } else { error.clone() } {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Refuses a blocking wait for CPU work from a command a CPU stream runs (a CPU kernel, a host
/// task, or an item of one on the helper pool): the work waited for may itself wait for that
/// command — its own stream's later work, or another stream's that waits on an event behind
/// it, as ordering a tensor across streams makes it — and the wait would never end. As CUDA
/// forbids CUDA calls in a host function, a CPU command may queue work and record events but
/// not wait for them; a wait for work already done returns at once and is not refused.
pub(crate) fn refuse_wait_in_command(what: &str) -> Result<()> {
    if crate::host_threads::running_command() != 0 {
        return Err(Error::WaitsForItself(format!(
            "{what} from a CPU kernel or host task (a command of a CPU stream may queue work, \
             not wait for it)"
        )));
    }
    Ok(())
}

fn worker(rx: Receiver<Job>, shared: Arc<Shared>) {
    let token = Arc::as_ptr(&shared) as usize;
    loop {
        // The next command: taken at once when queued, else after a short spin (a caller
        // that enqueues again within microseconds does not pay for waking a parked thread),
        // else by sleeping until one comes or the stream is dropped.
        let job = match rx.try_recv() {
            Ok(job) => job,
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) => {
                crate::progress::spin_idle(|| !rx.is_empty());
                match rx.recv() {
                    Ok(job) => job,
                    Err(_) => return,
                }
            }
        };
        let run = || crate::host_threads::in_command(token, || job.op.run());
        match catch_unwind(AssertUnwindSafe(run)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                shared.error.lock().get_or_insert(e);
                shared.failed.store(true, Ordering::Release);
            }
            Err(p) => {
                let msg =
                    crate::error::panic_message(&*p).unwrap_or_else(|| "a command panicked".into());
                shared
                    .error
                    .lock()
                    .get_or_insert(Error::Internal(format!("stream command failed: {msg}")));
                shared.failed.store(true, Ordering::Release);
            }
        }
        // Release what the command held before counting it done, so memory freed meanwhile
        // is back with the host allocator when a synchronize returns.
        drop(job);
        shared.done.increment();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commands the worker has not run yet.
    fn queued(s: &CpuStream) -> u64 {
        s.submitted.load(Ordering::SeqCst) - s.shared.done.get()
    }

    /// Inline staging must not make every command bigger.
    #[test]
    fn commands_stay_small() {
        assert!(
            std::mem::size_of::<Op>() <= 32,
            "{}",
            std::mem::size_of::<Op>()
        );
    }

    #[test]
    fn a_producer_far_ahead_waits_for_room() {
        let s = CpuStream::new("bounded".into()).unwrap();
        // 1 MiB memsets take the worker far longer than a queueing takes the producer.
        let mut buf = vec![0u8; 1 << 20];
        let dst = buf.as_mut_ptr() as u64;
        let mut most = 0;
        for i in 0..3 * QUEUE_LIMIT {
            let op = Op::Set {
                dst,
                value: i as u8,
                len: buf.len(),
            };
            s.enqueue(op, Pins::new()).unwrap();
            most = most.max(queued(&s));
            // Past the limit only where the worker ran nothing for a while (a stall).
            assert!(
                queued(&s) <= QUEUE_LIMIT + 1 || s.room.stalled().is_some(),
                "{} commands queued",
                queued(&s)
            );
        }
        s.synchronize().unwrap();
        assert!(
            most >= QUEUE_LIMIT / 2,
            "the producer never got ahead: {most}"
        );
        assert!(buf.iter().all(|&b| b == (3 * QUEUE_LIMIT - 1) as u8));
    }

    #[test]
    fn a_blocked_worker_does_not_block_its_producers() {
        let s = CpuStream::new("blocked".into()).unwrap();
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        let rx = Mutex::new(rx);
        let task: HostTask = Arc::new(move || {
            let _ = rx.lock().recv();
            Ok(())
        });
        s.enqueue(Op::Host(task), Pins::new()).unwrap();
        let mut buf = vec![0u8; 64];
        let dst = buf.as_mut_ptr() as u64;
        // The worker runs nothing until the task returns: the producer gives up waiting for
        // room (once) and queues on.
        for _ in 0..2 * QUEUE_LIMIT {
            let op = Op::Set {
                dst,
                value: 7,
                len: buf.len(),
            };
            s.enqueue(op, Pins::new()).unwrap();
        }
        assert_eq!(s.room.stalled(), Some(0));
        assert_eq!(queued(&s), 2 * QUEUE_LIMIT + 1);
        tx.send(()).unwrap();
        s.synchronize().unwrap();
        assert_eq!(buf, [7; 64]);
    }
}
