//! Events: native `CUevent`s created with timing enabled unless asked otherwise.

use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::sys::CUevent_flags;

use crate::hal::EventFlags;

/// One event. `raw` is the `CUevent` and also the HAL handle.
#[derive(Debug)]
pub(super) struct CudaEvent {
    pub raw: u64,
    pub flags: EventFlags,
    /// Recorded outside a capture at least once (elapsed time needs it).
    pub recorded: AtomicBool,
    /// Captures in progress that recorded this event: until they end, querying or waiting
    /// for it from outside would invalidate them, so unirt refuses it first.
    pub captured: crate::checked::InCapture,
    /// Held by every call that hands the event to the driver; destroy waits for them.
    pub gate: super::gate::HandleGate,
}

impl CudaEvent {
    pub fn new(raw: u64, flags: EventFlags) -> Self {
        CudaEvent {
            raw,
            flags,
            recorded: AtomicBool::new(false),
            captured: Default::default(),
            gate: Default::default(),
        }
    }

    pub fn mark_recorded(&self) {
        self.recorded.store(true, Ordering::Release);
    }

    pub fn was_recorded(&self) -> bool {
        self.recorded.load(Ordering::Acquire)
    }
}

/// unirt's (infinirt's) event flags as `CU_EVENT_*` bits. The two enumerations number the
/// same flags differently, and timing stays on unless DISABLE_TIMING is asked for: cudarc's
/// default creates events with timing disabled, which would make elapsed time fail.
pub(super) fn cu_flags(flags: EventFlags) -> u32 {
    let mut f = CUevent_flags::CU_EVENT_DEFAULT as u32;
    if !flags.timing() {
        f |= CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    }
    if flags.blocking() {
        f |= CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_stays_on_unless_disabled() {
        assert_eq!(cu_flags(EventFlags::DEFAULT), 0);
        assert_eq!(cu_flags(EventFlags::DISABLE_TIMING), 0x2);
        assert_eq!(cu_flags(EventFlags::BLOCKING_SYNC), 0x1);
        assert_eq!(cu_flags(EventFlags(0x3)), 0x3);
    }
}
