//! [`Completion`]: a future for "the recorded work has run", usable from any executor.
//!
//! unirt depends on no async runtime, and the HAL's only blocking wait is
//! [`event_synchronize`](crate::Backend::event_synchronize). So a completion first asks the
//! backend (`event_query`, cheap); if the work is still pending it hands the blocking wait to a
//! helper thread, which wakes the task when the backend reports completion. Nothing spins: the
//! helper thread sleeps inside the backend's own wait (a condition variable on the CPU backend,
//! `cuEventSynchronize` on CUDA, a device poll on wgpu), and the task sleeps in its executor.
//!
//! One helper thread per completion that is still pending at its first poll: right for
//! "await a batch of GPU work", not for awaiting thousands of tiny events concurrently.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::hal::{Backend, EventStatus};
use crate::vendors::AnyBackend;

/// An event of the HAL, shared by its [`Event`](crate::Event) handle and pending completions,
/// so that dropping the handle while a future waits destroys the event only after the wait.
pub(crate) struct EventInner {
    pub(crate) backend: Arc<AnyBackend>,
    pub(crate) id: crate::hal::EventId,
}

impl Drop for EventInner {
    fn drop(&mut self) {
        let _ = self.backend.event_destroy(self.id);
    }
}

/// What the helper thread and the polling task share.
#[derive(Default)]
struct Slot {
    /// Set once by the helper thread.
    result: Option<Result<()>>,
    /// The task to wake; replaced at every poll.
    waker: Option<Waker>,
}

/// Resolves to `Ok(())` once the work an event recorded (or a stream had enqueued) has
/// completed, or to the error the backend reported while waiting.
///
/// Made by [`Event::completion`](crate::Event::completion) and
/// [`Stream::completion`](crate::Stream::completion). It keeps the event alive until the wait
/// ends, so it may outlive the `Event` it came from.
///
/// ```
/// use unirt::{context, KernelArg};
/// let m = context::allocate_memory(4 * 4096)?;
/// let s = context::current_stream()?;
/// s.launch("fill", &[(&m).into(), KernelArg::U32(7), KernelArg::U32(4096)])?;
/// let done = s.completion()?;
/// pollster::block_on(done)?;
/// assert_eq!(s.copy_to_vec::<u32>(&m, 4096)?, vec![7; 4096]);
/// # Ok::<(), unirt::Error>(())
/// ```
#[must_use = "a future does nothing unless polled"]
pub struct Completion {
    event: Arc<EventInner>,
    slot: Arc<Mutex<Slot>>,
    waiting: bool,
}

impl Completion {
    pub(crate) fn of_event(event: Arc<EventInner>) -> Self {
        Completion {
            event,
            slot: Arc::new(Mutex::new(Slot::default())),
            waiting: false,
        }
    }

    /// Starts the helper thread that blocks in `event_synchronize` and then wakes the task.
    fn start_waiter(&mut self) -> Result<()> {
        let event = self.event.clone();
        let slot = self.slot.clone();
        std::thread::Builder::new()
            .name("unirt-completion".into())
            .spawn(move || {
                let r = event.backend.event_synchronize(event.id);
                let waker = {
                    let mut s = slot.lock();
                    s.result = Some(r);
                    s.waker.take()
                };
                // The event (and its backend reference) is released before the task runs on.
                drop(event);
                if let Some(w) = waker {
                    w.wake();
                }
            })
            .map(|_| ())
            .map_err(|e| Error::Internal(format!("cannot start a completion waiter thread: {e}")))
    }
}

impl Future for Completion {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        // Every field is Unpin, so the future is too.
        let this = self.get_mut();
        if this.waiting {
            let mut s = this.slot.lock();
            if let Some(r) = s.result.take() {
                return Poll::Ready(r);
            }
            s.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        match this.event.backend.event_query(this.event.id) {
            Ok(EventStatus::Complete) => return Poll::Ready(Ok(())),
            Ok(EventStatus::NotReady) => {}
            Err(e) => return Poll::Ready(Err(e)),
        }
        // Register the waker before the waiter can finish, so no wake-up is lost.
        this.slot.lock().waker = Some(cx.waker().clone());
        if let Err(e) = this.start_waiter() {
            return Poll::Ready(Err(e));
        }
        this.waiting = true;
        Poll::Pending
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Completion(event {:#x}, waiting: {})",
            self.event.id.0, self.waiting
        )
    }
}
