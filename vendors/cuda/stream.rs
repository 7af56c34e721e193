//! Streams: native non-blocking `CUstream`s, plus what unirt tracks about a capture.

use std::sync::Arc;

use parking_lot::Mutex;

use super::event::CudaEvent;
use super::fault::FaultWord;
use super::gate::HandleGate;
use super::memory::{AllocKind, PeerInfo};
use crate::memtable::{AllocTable, RecordedRange};

/// A device range captured work uses, with the device whose allocation table holds it (this
/// one, or the peer of a copy between devices) and the very allocation it lay in.
#[derive(Debug, Clone)]
pub(super) struct DeviceUse {
    pub owner: Arc<PeerInfo>,
    pub range: RecordedRange<AllocKind>,
}

impl DeviceUse {
    /// Still the allocation it was captured in: freed since — even if the address was handed
    /// out anew — is refused. The driver's graph nodes refer to the allocation the capture saw;
    /// instantiating or replaying them after it was freed is undefined behaviour in libcuda.
    pub fn recheck(&self) -> crate::error::Result<()> {
        self.owner.mem.recheck(&self.range).map(drop)
    }
}

/// What a capturing stream has recorded so far, beyond what CUDA keeps: the device ranges its
/// work touches, so instantiate and every replay can refuse a graph whose memory was freed.
#[derive(Debug, Default)]
pub(super) struct CaptureLog {
    pub ranges: Vec<DeviceUse>,
    /// Pinned host ranges the captured copies use.
    pub pinned: Vec<RecordedRange<()>>,
    /// Events recorded inside the capture: each replay records them.
    pub events: Vec<Arc<CudaEvent>>,
    /// Events the captured work waits on (event-wait nodes): the graph names them too.
    pub waits: Vec<Arc<CudaEvent>>,
    /// The thread that may end the capture.
    pub owner: crate::checked::CaptureOwner,
    /// Fault words the captured kernels may claim: each replay notes them on its stream.
    pub checks: Vec<Arc<FaultWord>>,
    /// An event recorded on the stream just before the capture began: the end of the real work
    /// queued on it then. While it captures, unirt waits on this (an event recorded on the
    /// stream now would go into the capture) — a stream-ordered free or a device-wide wait
    /// from another thread must still wait for that work. `None`: the stream was drained
    /// instead (no event could be had).
    pub entry: Option<u64>,
}

impl CudaStream {
    /// `None` when not capturing; else what the stream's real (not captured) work ends with:
    /// `Some(None)` nothing pending, `Some(Some(e))` the event recorded as the capture began.
    /// Read with `gate` held shared (begin and end capture take it exclusively).
    pub fn capture_entry(&self) -> Option<Option<u64>> {
        self.capture.lock().as_ref().map(|c| c.entry)
    }
}

/// One stream of a device. `raw` is the `CUstream` and also the HAL handle.
#[derive(Debug)]
pub(super) struct CudaStream {
    pub raw: u64,
    pub capture: Mutex<Option<CaptureLog>>,
    /// Held shared while unirt itself waits for this stream on behalf of a device-wide
    /// synchronize (or a free), exclusively while the stream starts capturing or is
    /// destroyed. Another thread's device synchronize therefore never waits on a stream that
    /// has just begun capturing (CUDA would invalidate that capture) or that is being
    /// destroyed (a dead `CUstream` handle reaching the driver).
    ///
    /// Every call that hands the stream to the driver holds it shared too, so a destroy on
    /// another thread waits for it and the call never reaches the driver with a dead handle.
    pub gate: HandleGate,
    /// Fault words the work enqueued since the last synchronisation may have claimed.
    pub checks: Mutex<Vec<Arc<FaultWord>>>,
}

impl CudaStream {
    pub fn new(raw: u64) -> Self {
        CudaStream {
            raw,
            capture: Mutex::new(None),
            gate: HandleGate::default(),
            checks: Mutex::new(Vec::new()),
        }
    }

    /// Notes fault words that work enqueued now may claim: in the capture when capturing,
    /// else for the stream's next synchronisation.
    pub fn note_faults(&self, words: &[Arc<FaultWord>]) {
        if words.is_empty() {
            return;
        }
        match self.capture.lock().as_mut() {
            Some(c) => super::fault::note(&mut c.checks, words.iter().cloned()),
            None => super::fault::note(&mut self.checks.lock(), words.iter().cloned()),
        }
    }

    /// Takes the fault words noted for the next synchronisation.
    pub fn take_faults(&self) -> Vec<Arc<FaultWord>> {
        std::mem::take(&mut *self.checks.lock())
    }

    /// The fault words noted for the next synchronisation, left noted.
    pub fn noted_faults(&self) -> Vec<Arc<FaultWord>> {
        self.checks.lock().clone()
    }

    /// Not destroyed and not capturing: unirt may wait for it on its own account. Read with
    /// `gate` held shared.
    pub fn waitable(&self) -> bool {
        !self.gate.is_destroyed() && !self.is_capturing()
    }

    pub fn is_capturing(&self) -> bool {
        self.capture.lock().is_some()
    }

    /// Notes an event recorded by work enqueued now; `false` when not capturing.
    pub fn note_event(&self, e: &Arc<CudaEvent>) -> bool {
        match self.capture.lock().as_mut() {
            Some(c) => {
                e.captured.enter();
                c.events.push(e.clone());
                true
            }
            None => false,
        }
    }

    /// Notes an event waited on by work enqueued now, when capturing.
    pub fn note_wait(&self, e: &Arc<CudaEvent>) {
        if let Some(c) = self.capture.lock().as_mut() {
            c.waits.push(e.clone());
        }
    }

    /// Notes pinned host ranges (of `table`) used by copies enqueued now, when capturing.
    pub fn note_pinned(&self, table: &AllocTable<()>, ranges: &[(u64, u64)]) {
        if ranges.is_empty() {
            return;
        }
        if let Some(c) = self.capture.lock().as_mut() {
            c.pinned
                .extend(ranges.iter().map(|&(a, l)| table.record(a, l)));
        }
    }

    /// Notes device ranges of `owner`'s memory used by work enqueued now, when capturing.
    /// Empty ranges touch no allocation and are not noted.
    pub fn note_ranges(&self, owner: &Arc<PeerInfo>, ranges: &[(u64, u64)]) {
        if let Some(c) = self.capture.lock().as_mut() {
            c.ranges.extend(
                ranges
                    .iter()
                    .filter(|&&(_, l)| l > 0)
                    .map(|&(a, l)| DeviceUse {
                        owner: owner.clone(),
                        range: owner.mem.record(a, l),
                    }),
            );
        }
    }
}
