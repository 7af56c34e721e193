//! Ordering across the streams of one CUDA device: the default stream for synchronous calls,
//! joining the other streams' queued work, device-wide waits that never disturb a capture, the
//! end events of destroyed streams, and the markers of work queued before a capture began.

use std::sync::Arc;

use super::event::cu_flags;
use super::stream::CudaStream;
use super::CudaBackend;
use crate::checked;
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::hal::*;

impl CudaBackend {
    /// The default stream, refused while it is capturing (synchronous calls use it).
    pub(super) fn sync_stream(&self) -> Result<Arc<CudaStream>> {
        let s = self.stream(self.default_stream())?;
        if s.is_capturing() {
            return Err(Error::Capturing(
                "a synchronous call while the default stream is capturing".into(),
            ));
        }
        Ok(s)
    }

    /// Makes `s` wait for the work queued so far on every other stream of the device that is
    /// not capturing, and for the ends of destroyed streams (stream-ordered, no host wait).
    pub(super) fn join_other_streams(&self, s: &CudaStream) -> Result<()> {
        let streams = self.streams.values();
        for o in streams.iter().filter(|o| o.raw != s.raw) {
            let _gate = o.gate.shared();
            if o.gate.is_destroyed() {
                continue;
            }
            if let Some(entry) = o.capture_entry() {
                // Capturing: what it enqueues now is captured, not run; its real work is what
                // was queued before the capture began, which ends at the entry event.
                if let Some(e) = entry {
                    // SAFETY: the entry event lives while the capture does (end_capture, which
                    // destroys it, takes `o`'s gate exclusively); `s` is live and not capturing.
                    unsafe { self.drv.stream_wait_event(s.raw, e, false) }?;
                }
                continue;
            }
            // A fresh event per join, destroyed at once: the wait keeps what it needs (CUDA
            // releases an event's resources after its pending uses), and no event outlives
            // the call.
            let e = self
                .drv
                .event_create(cu_flags(EventFlags::DISABLE_TIMING))?;
            // SAFETY: `o` is live and not capturing (checked under its gate, which destroy and
            // begin_capture take exclusively); `e` was just created; `s` is live and not
            // capturing (free_async refused that).
            let joined = unsafe {
                self.drv
                    .event_record(e, o.raw, false)
                    .and_then(|()| self.drv.stream_wait_event(s.raw, e, false))
            };
            // SAFETY: created above and used only here: destroyed once (or, if the driver
            // refuses now, listed with the retired ends, whose release is retried).
            if unsafe { self.drv.event_destroy(e) }.is_err() {
                self.retired_streams.lock().push(e);
            }
            joined?;
        }
        for &e in self.retired_streams.lock().iter() {
            // SAFETY: a retired-stream event stays live while listed (the lock is held).
            unsafe { self.drv.stream_wait_event(s.raw, e, false) }?;
        }
        Ok(())
    }

    /// Waits for every stream's work (a device-wide synchronize that never disturbs a capture
    /// in progress); with `faults`, then checks the device faults of every stream waited for
    /// and of the streams destroyed since (see `fault.rs`).
    pub(crate) fn wait_all(&self, faults: bool) -> Result<()> {
        self.bind()?;
        let streams = self.streams.values();
        // Every stream's gate, shared: none starts capturing or is destroyed while we wait
        // (recursive reads: two synchronizing threads never wait on each other through a
        // queued writer).
        let _gates: Vec<_> = streams.iter().map(|s| s.gate.shared()).collect();
        let mut first = if !streams.iter().any(|s| s.is_capturing()) {
            self.drv.ctx_synchronize()?;
            // Destroyed streams' work is the context's too; their end events are waited for
            // anyway (already complete: no cost), so this holds whatever the driver counts.
            self.release_retired_streams(true)
        } else {
            // cuCtxSynchronize during a capture would invalidate it: wait stream by stream,
            // and for the end of every stream destroyed with work queued.
            let mut first = self.release_retired_streams(true);
            for s in streams.iter() {
                if s.gate.is_destroyed() {
                    continue;
                }
                let waited = match s.capture_entry() {
                    // SAFETY: the stream is live (not destroyed, checked under the gate that
                    // destroy takes exclusively) and not capturing.
                    None => unsafe { self.drv.stream_synchronize(s.raw) },
                    // Capturing: its real work ends at the event recorded as the capture began.
                    // SAFETY: the entry event lives while the capture does (end_capture takes
                    // the gate we hold shared).
                    Some(Some(e)) => unsafe { self.drv.event_synchronize(e) },
                    Some(None) => Ok(()),
                };
                if let Err(e) = waited {
                    first = first.and(Err(e));
                }
            }
            first
        };
        if !faults {
            return first;
        }
        // Then the device faults of every stream waited for — reported, and left for the
        // stream's own synchronisation (another thread's, perhaps) — and, taken, those of the
        // streams destroyed since the last device-wide synchronisation (on the default stream).
        for s in streams.iter().filter(|s| s.waitable()) {
            first = first.and(self.check_faults(s.raw, &s.noted_faults(), false));
            if s.raw == self.default_stream {
                let orphans = std::mem::take(&mut *self.orphan_faults.lock());
                first = first.and(self.check_faults(s.raw, &orphans, true));
            }
        }
        first
    }

    /// Releases the events marking the ends of destroyed streams: all of them after waiting
    /// for each (`wait`), or only those already reached (a query each, no waiting). An event
    /// whose wait failed, or that the driver does not release, stays listed for a later call.
    pub(super) fn release_retired_streams(&self, wait: bool) -> Result<()> {
        // One release at a time, and the list never looks empty meanwhile: a device-wide wait
        // on another thread that found it taken (as it once was, for the length of this call)
        // returned before a destroyed stream's work had run, and a free after it released
        // memory that work still wrote (over the fake driver: a sticky illegal address, with
        // cases capturing in parallel). A wait queues behind the release in progress; a mere
        // clean-up (`wait == false`) skips when one is running.
        let _turn = if wait {
            self.retire_turn.lock()
        } else {
            match self.retire_turn.try_lock() {
                Some(t) => t,
                None => return Ok(()),
            }
        };
        let listed = self.retired_streams.lock().clone();
        let mut first = Ok(());
        for e in listed {
            // SAFETY: the event was created and recorded by stream_destroy (or a stream-ordered
            // free, or a capture's entry) and stays live while listed; only a release, one at a
            // time (`retire_turn`), takes it off the list and destroys it.
            let reached = unsafe {
                if wait {
                    self.drv.event_synchronize(e).map(|()| true)
                } else {
                    Ok(self.drv.event_query(e).unwrap_or(false))
                }
            };
            match reached {
                Ok(true) => {
                    // Off the list first (a join enqueueing a wait on it holds the list), then
                    // destroyed; one the driver keeps goes back on.
                    self.retired_streams.lock().retain(|&x| x != e);
                    // SAFETY: as above; no longer listed, so destroyed once here.
                    if unsafe { self.drv.event_destroy(e) }.is_err() {
                        self.retired_streams.lock().push(e);
                    }
                }
                Ok(false) => {}
                Err(err) => first = first.and(Err(err)),
            }
        }
        first
    }

    /// An event marking the end of the work queued on `s` so far, for a capture about to begin
    /// (see `CaptureLog::entry`); where none can be recorded, the stream is drained instead and
    /// there is nothing to mark (`None`).
    pub(super) fn mark_queued_work(&self, s: &CudaStream) -> Result<Option<u64>> {
        match self.end_marker(s) {
            Ok(e) => Ok(Some(e)),
            // SAFETY: the stream is live (begin_capture holds its gate exclusively).
            Err(_) => unsafe { self.drv.stream_synchronize(s.raw) }.map(|()| None),
        }
    }

    /// A new event recorded at the current end of `s`'s queued work. `s` must be live and not
    /// capturing, with its gate held exclusively by the caller (begin_capture, stream_destroy).
    pub(super) fn end_marker(&self, s: &CudaStream) -> Result<u64> {
        let e = self
            .drv
            .event_create(super::event::cu_flags(EventFlags::DISABLE_TIMING))?;
        // SAFETY: the event was just created; the stream is live and not capturing (the
        // caller's contract).
        match unsafe { self.drv.event_record(e, s.raw, false) } {
            Ok(()) => Ok(e),
            Err(err) => {
                // SAFETY: created above, never handed out: destroyed once.
                let _ = unsafe { self.drv.event_destroy(e) };
                Err(err)
            }
        }
    }

    /// Destroys a capture's entry event (taken out of its log, so used by nothing new; waits
    /// already enqueued on it keep what they need). One the driver refuses to destroy joins
    /// the retired-stream ends, whose release is retried, so it is never leaked.
    pub(super) fn destroy_marker(&self, e: u64) {
        // SAFETY: created by mark_queued_work, taken out of every list here: destroyed once
        // (or handed to the retired list, which destroys it once).
        if unsafe { self.drv.event_destroy(e) }.is_err() {
            self.retired_streams.lock().push(e);
        }
    }

    pub(super) fn refuse_capturing(&self, s: &CudaStream, what: &str) -> Result<()> {
        checked::unsupported_while_capturing(s.is_capturing(), what, DeviceKind::Cuda)
    }
}
