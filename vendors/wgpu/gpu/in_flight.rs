//! How far ahead of a device its submitters may run (see [`IN_FLIGHT_LIMIT`]).

use super::Gpu;
use crate::progress::Backpressure;

/// Submissions a device holds in flight (handed over, not completed) before a submitter waits
/// for half of them, as CUDA blocks a launch once its queue is full. Unbounded, a loop that
/// queued faster than the device ran grew without end: 200 000 memsets of 1 MiB (about 200
/// submissions of a stream's 1024 gathered commands) grew the process from 94 to 290 MB.
const IN_FLIGHT_LIMIT: u64 = 32;

/// How long a submitter waits for a device that completes nothing before it submits anyway.
const IN_FLIGHT_STALL: std::time::Duration = std::time::Duration::from_secs(1);

/// The device's [`Backpressure`], giving up after [`IN_FLIGHT_STALL`].
pub(super) fn backpressure() -> Backpressure {
    Backpressure::new(IN_FLIGHT_STALL)
}

impl Gpu {
    /// Waits, while more than [`IN_FLIGHT_LIMIT`] submissions have not completed, until half
    /// of them have — or until none has completed for [`IN_FLIGHT_STALL`] (a long kernel on a
    /// software adapter; a submission waiting for something the caller holds). The device is
    /// polled meanwhile, as a wait does; an error is left to the submission that follows.
    pub(super) fn make_room(&self) {
        let seq = self.submitted.lock().seq;
        if seq.saturating_sub(self.completed.done()) <= IN_FLIGHT_LIMIT {
            return;
        }
        let done =
            || (self.alive().is_ok() && self.poll_once().is_ok()).then(|| self.completed.done());
        self.room
            .wait(done, |done| seq.saturating_sub(done), IN_FLIGHT_LIMIT / 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checked::Pins;
    use crate::vendors::wgpu::plan::Plan;
    use crate::vendors::wgpu::stream::{BufClear, Cmd};
    use crate::vendors::AnyBackend;
    use crate::DeviceKind;

    /// Submissions far ahead of the device wait for room: never more than the limit in flight
    /// (one over, counting the one being handed over) unless the device stalled.
    #[test]
    fn submitters_wait_for_room() {
        let devices = crate::discover().devices();
        for dev in devices.into_iter().filter(|d| d.kind == DeviceKind::Wgpu) {
            let backend = crate::open(dev).unwrap();
            let AnyBackend::Wgpu(w) = &*backend else {
                unreachable!("{dev} is a wgpu device")
            };
            let gpu = &w.gpu;
            let size = 16 << 20;
            let buf = gpu
                .buffer(
                    size,
                    wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                )
                .unwrap();
            let clear = || {
                Cmd::Clear(BufClear {
                    buf: buf.clone(),
                    off: 0,
                    size,
                })
            };
            let mut most = 0;
            for _ in 0..4 * IN_FLIGHT_LIMIT {
                let t = gpu
                    .submit(&Plan::new((0..8).map(|_| clear())), Pins::new())
                    .unwrap();
                let ahead = t.seq - gpu.completed.done();
                most = most.max(ahead);
                assert!(
                    ahead <= IN_FLIGHT_LIMIT + 1 || gpu.room.stalled().is_some(),
                    "{dev}: {ahead} submissions in flight"
                );
            }
            gpu.wait(&gpu.last()).unwrap();
            eprintln!("{dev}: at most {most} submissions in flight");
        }
    }
}
