//! CPU streams: an ordered queue of commands run by one worker thread per stream.
//!
//! Enqueueing is a lock, a channel send and a counter bump; the worker runs commands in order
//! and counts completions, which `synchronize` waits on. While a stream is capturing, its
//! commands go into the capture list instead (see `graph.rs`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use super::event::CpuEvent;
use super::graph::Capture;
use super::kernels::CpuKernel;
use super::memory;
use crate::error::{Error, Result};
use crate::hal::{HostTask, KernelArg};
use crate::progress::Progress;

/// One command a worker runs.
#[derive(Clone)]
pub(crate) enum Op {
    /// `memmove` of `len` bytes; both ranges validated at enqueue time.
    Copy {
        dst: u64,
        src: u64,
        len: usize,
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
    /// Stream-ordered free of a device allocation (already removed from the table).
    Free {
        ptr: u64,
        size: u64,
    },
    /// A host function (a CPU operator kernel); its ranges were checked at enqueue time.
    Host(HostTask),
    /// A replayed graph: its commands, counted as one completion.
    Batch(Arc<[Op]>),
}

impl Op {
    fn run(&self) -> Result<()> {
        match self {
            Op::Copy { dst, src, len } => {
                // SAFETY: device-side ranges were checked against the allocation table when
                // enqueued and cannot be freed before this runs; host-side ranges are the
                // caller's promise (memcpy_async is unsafe). ptr::copy allows overlap.
                unsafe {
                    std::ptr::copy(*src as usize as *const u8, *dst as usize as *mut u8, *len)
                }
            }
            Op::Set { dst, value, len } => {
                // SAFETY: the range was checked against the allocation table when enqueued.
                unsafe { std::ptr::write_bytes(*dst as usize as *mut u8, *value, *len) }
            }
            Op::Kernel { run, args } => run(args),
            Op::Stamp { event, generation } => event.complete(*generation),
            Op::Wait { event, generation } => event.wait(*generation),
            Op::Free { ptr, size } => memory::release(*ptr, *size, memory::DEVICE_ALIGN),
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
}

pub(crate) struct CpuStream {
    /// The sender, under a lock so the sequence numbers match the channel order even with
    /// several threads enqueueing on one stream.
    tx: Mutex<Sender<Op>>,
    submitted: AtomicU64,
    shared: Arc<Shared>,
    pub capture: Mutex<Option<Capture>>,
}

impl CpuStream {
    pub fn new(name: String) -> Result<Self> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let shared = Arc::new(Shared::default());
        let worker_shared = shared.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || worker(rx, worker_shared))
            .map_err(|e| Error::Internal(format!("cannot start a stream worker thread: {e}")))?;
        Ok(CpuStream {
            tx: Mutex::new(tx),
            submitted: AtomicU64::new(0),
            shared,
            capture: Mutex::new(None),
        })
    }

    /// Queues `op` to run after everything queued before it.
    pub fn enqueue(&self, op: Op) -> Result<()> {
        let tx = self.tx.lock();
        tx.send(op)
            .map_err(|_| Error::Internal("stream worker has exited".into()))?;
        self.submitted.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    pub fn is_capturing(&self) -> bool {
        self.capture.lock().is_some()
    }

    /// Whether everything enqueued so far has run (one atomic load each side).
    pub fn is_idle(&self) -> bool {
        self.shared.done.get() >= self.submitted.load(Ordering::SeqCst)
    }

    /// Waits for everything enqueued so far; reports a command's failure once.
    pub fn synchronize(&self) -> Result<()> {
        if !self.is_idle() {
            self.shared
                .done
                .wait_for(self.submitted.load(Ordering::SeqCst));
        }
        if !self.shared.failed.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        match self.shared.error.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn worker(rx: Receiver<Op>, shared: Arc<Shared>) {
    for op in rx {
        match catch_unwind(AssertUnwindSafe(|| op.run())) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                shared.error.lock().get_or_insert(e);
                shared.failed.store(true, Ordering::Release);
            }
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a command panicked".into());
                shared
                    .error
                    .lock()
                    .get_or_insert(Error::Internal(format!("stream command failed: {msg}")));
                shared.failed.store(true, Ordering::Release);
            }
        }
        shared.done.increment();
    }
}
