//! CPU events: stamped with the host clock when the stream's worker reaches them.
//!
//! `recorded` counts records whose stamp is already queued; `completed` is the highest record
//! the worker has reached. Query is two atomic loads; synchronize waits on `completed`.
//!
//! A record takes its generation and queues its stamp under the event's `record_lock`, and
//! only then publishes the generation. A wait issued on another thread meanwhile therefore sees
//! either the previous record or this one with its stamp already queued — never a generation
//! whose stamp is not yet in any queue. Every dependency a wait adds then points at a command
//! queued before the wait itself, so waits cannot form a cycle (they did when the generation was
//! visible before its stamp was queued: a stream could wait on a stamp queued behind its own
//! wait). A record whose enqueue fails publishes nothing, so no wait is left on a stamp that
//! will never run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::hal::{EventFlags, EventStatus};
use crate::progress::Progress;

#[derive(Debug)]
pub(crate) struct CpuEvent {
    pub flags: EventFlags,
    recorded: AtomicU64,
    /// Held while a record takes its generation and queues its stamp.
    record_lock: Mutex<()>,
    completed: Progress,
    stamp: Mutex<Option<Instant>>,
    /// Captures in progress that recorded this event (waiting for it is refused meanwhile).
    pub captured: crate::checked::InCapture,
}

impl CpuEvent {
    pub fn new(flags: EventFlags) -> Self {
        CpuEvent {
            flags,
            recorded: AtomicU64::new(0),
            record_lock: Mutex::new(()),
            completed: Progress::for_cpu_work(),
            captured: Default::default(),
            stamp: Mutex::new(None),
        }
    }

    /// Records the event: `enqueue` queues the stamp for the generation it is given; the
    /// generation becomes visible to waits only once that succeeded.
    pub fn record(&self, enqueue: impl FnOnce(u64) -> Result<()>) -> Result<()> {
        let _guard = self.record_lock.lock();
        let generation = self.current() + 1;
        enqueue(generation)?;
        self.recorded.store(generation, Ordering::SeqCst);
        Ok(())
    }

    /// Records several events at once (a graph replay with event-record nodes). `enqueue` gets
    /// the last published generation of each event in `events` (distinct), takes new ones by
    /// raising those numbers, and queues every stamp; the raised numbers are published only
    /// once it succeeded. The locks are taken in address order, so two replays recording
    /// overlapping sets cannot deadlock.
    pub fn record_all<T>(
        events: &[&CpuEvent],
        enqueue: impl FnOnce(&mut [u64]) -> Result<T>,
    ) -> Result<T> {
        let mut order: Vec<usize> = (0..events.len()).collect();
        order.sort_by_key(|&i| events[i] as *const CpuEvent as usize);
        let _guards: Vec<_> = order
            .iter()
            .map(|&i| events[i].record_lock.lock())
            .collect();
        let mut generations: Vec<u64> = events.iter().map(|e| e.current()).collect();
        let out = enqueue(&mut generations)?;
        for (e, g) in events.iter().zip(&generations) {
            e.recorded.store(*g, Ordering::SeqCst);
        }
        Ok(out)
    }

    /// The generation a wait issued now must see completed: the last record whose stamp is
    /// queued.
    pub fn current(&self) -> u64 {
        self.recorded.load(Ordering::SeqCst)
    }

    /// Called by the worker when it reaches record `generation`.
    pub fn complete(&self, generation: u64) {
        if self.flags.timing() {
            *self.stamp.lock() = Some(Instant::now());
        }
        self.completed.advance(generation);
    }

    pub fn status(&self) -> EventStatus {
        if self.completed.get() >= self.current() {
            EventStatus::Complete
        } else {
            EventStatus::NotReady
        }
    }

    pub fn wait(&self, generation: u64) {
        self.completed.wait_for(generation);
    }

    fn time(&self, which: &str) -> Result<Instant> {
        if !self.flags.timing() {
            return Err(Error::BadParam(format!(
                "the {which} event was created with DISABLE_TIMING"
            )));
        }
        if self.current() == 0 {
            return Err(Error::BadParam(format!(
                "the {which} event was never recorded"
            )));
        }
        if self.status() == EventStatus::NotReady {
            return Err(Error::NotReady(format!(
                "the {which} event has not completed"
            )));
        }
        (*self.stamp.lock()).ok_or_else(|| Error::Internal(format!("{which} event has no stamp")))
    }

    /// Milliseconds from `start` to `end` (negative if `end` completed first).
    pub fn elapsed_ms(start: &CpuEvent, end: &CpuEvent) -> Result<f32> {
        let (t0, t1) = (start.time("start")?, end.time("end")?);
        let ms = if t1 >= t0 {
            (t1 - t0).as_secs_f64() * 1e3
        } else {
            -((t0 - t1).as_secs_f64() * 1e3)
        };
        Ok(ms as f32)
    }
}
