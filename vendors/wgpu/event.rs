//! wgpu events: a record is a point in a stream's submission; timing comes from a timestamp
//! query written into the encoder where the adapter has them (`EventTiming::Device`), else from
//! the host clock when the completion of the submission is noticed (`EventTiming::Host`).
//!
//! Each record gets its own small readback buffer, so reading one record's timestamp never
//! conflicts with a later record of the same event that is still in flight.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::gpu::{Gpu, Ticket};
use crate::error::{Error, Result};
use crate::hal::{EventFlags, EventStatus};

/// One record of an event: the submission it completes with and where its time lands.
pub(crate) struct Slot {
    pub ticket: Ticket,
    /// Device timing: the resolved timestamp is copied here (8 bytes, mappable).
    pub read: Option<wgpu::Buffer>,
    /// Host timing: stamped when the submission's completion is noticed.
    pub host: Mutex<Option<Instant>>,
    ticks: Mutex<Option<u64>>,
}

impl Slot {
    pub fn new(ticket: Ticket, read: Option<wgpu::Buffer>) -> Self {
        Slot {
            ticket,
            read,
            host: Mutex::new(None),
            ticks: Mutex::new(None),
        }
    }

    pub fn stamp_host(&self) {
        self.host.lock().get_or_insert_with(Instant::now);
    }

    /// The device timestamp of this record, read back once.
    fn ticks(&self, gpu: &Gpu) -> Result<u64> {
        let mut cached = self.ticks.lock();
        if let Some(t) = *cached {
            return Ok(t);
        }
        let read = self
            .read
            .as_ref()
            .ok_or_else(|| Error::Internal("event record has no timestamp buffer".into()))?;
        let bytes = gpu.read_mappable(read, 8)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[..8]);
        let t = u64::from_le_bytes(b);
        *cached = Some(t);
        Ok(t)
    }
}

/// A wgpu event.
pub(crate) struct WEvent {
    pub flags: EventFlags,
    /// Device timing: a one-entry query set and the buffer it resolves into.
    pub query: Option<(wgpu::QuerySet, wgpu::Buffer)>,
    pub last: Mutex<Option<Arc<Slot>>>,
    /// Captures in progress that recorded this event (waiting for it is refused meanwhile).
    pub captured: crate::checked::InCapture,
}

impl WEvent {
    pub fn new(gpu: &Gpu, flags: EventFlags) -> Result<Self> {
        let query = if flags.timing() && gpu.timing {
            let qs = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("unirt event"),
                ty: wgpu::QueryType::Timestamp,
                count: 1,
            });
            let resolve = gpu.buffer(
                8,
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            )?;
            Some((qs, resolve))
        } else {
            None
        };
        Ok(WEvent {
            flags,
            query,
            last: Mutex::new(None),
            captured: Default::default(),
        })
    }

    fn slot(&self) -> Option<Arc<Slot>> {
        self.last.lock().clone()
    }

    pub fn status(&self, gpu: &Gpu) -> Result<EventStatus> {
        match self.slot() {
            None => Ok(EventStatus::Complete),
            Some(s) if gpu.is_done(&s.ticket)? => Ok(EventStatus::Complete),
            Some(_) => Ok(EventStatus::NotReady),
        }
    }

    pub fn wait(&self, gpu: &Gpu) -> Result<()> {
        match self.slot() {
            None => Ok(()),
            Some(s) => gpu.wait(&s.ticket),
        }
    }

    fn done_slot(&self, gpu: &Gpu, which: &str) -> Result<Arc<Slot>> {
        if !self.flags.timing() {
            return Err(Error::BadParam(format!(
                "the {which} event was created with DISABLE_TIMING"
            )));
        }
        let s = self
            .slot()
            .ok_or_else(|| Error::BadParam(format!("the {which} event was never recorded")))?;
        if !gpu.is_done(&s.ticket)? {
            return Err(Error::NotReady(format!(
                "the {which} event has not completed"
            )));
        }
        Ok(s)
    }

    /// Milliseconds from `start` to `end` (negative if `end` came first).
    pub fn elapsed_ms(gpu: &Gpu, start: &WEvent, end: &WEvent) -> Result<f32> {
        let (a, b) = (start.done_slot(gpu, "start")?, end.done_slot(gpu, "end")?);
        if a.read.is_some() && b.read.is_some() {
            let (ta, tb) = (a.ticks(gpu)?, b.ticks(gpu)?);
            let ns_per_tick = f64::from(gpu.queue.get_timestamp_period());
            let ticks = tb as i128 - ta as i128;
            return Ok((ticks as f64 * ns_per_tick / 1e6) as f32);
        }
        let (ta, tb) = (*a.host.lock(), *b.host.lock());
        match (ta, tb) {
            (Some(t0), Some(t1)) => Ok(if t1 >= t0 {
                (t1 - t0).as_secs_f64() * 1e3
            } else {
                -((t0 - t1).as_secs_f64() * 1e3)
            } as f32),
            _ => Err(Error::Internal(
                "a completed event has no time stamp".into(),
            )),
        }
    }
}
