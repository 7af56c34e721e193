//! CPU events: stamped with the host clock when the stream's worker reaches them.
//!
//! `recorded` counts records; `completed` is the highest record the worker has reached. Query
//! is two atomic loads; synchronize waits on `completed`.

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
            completed: Progress::new(),
            captured: Default::default(),
            stamp: Mutex::new(None),
        }
    }

    /// Starts a new record; returns the generation the worker must reach.
    pub fn begin_record(&self) -> u64 {
        self.recorded.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The generation a wait issued now must see completed.
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
