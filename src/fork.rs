//! Fork detection: what a child process made by `fork()` may still use.
//!
//! A forked child has one thread — the one that called `fork` — and a copy of the parent's
//! memory: unirt's stream workers, the wgpu submitter and the drivers' own threads are gone,
//! while the objects that wait on them are still there. Waiting on them would hang forever
//! (issue 10). So unirt counts forks: a `pthread_atfork` child handler, registered the first
//! time unirt records an [`Epoch`], bumps a process-wide generation. Every object that owns
//! threads or driver state records the generation it was made in and checks it on use — one
//! relaxed atomic load, no system call — answering [`Error::Forked`] in a child. The
//! process-wide caches (discovery, opened devices, runtimes, the wgpu adapters) are
//! [`PerProcess`] values, made again in the child on first use, so a child can start over on
//! fresh state; the parent's copies are left alone (never dropped), because dropping them would
//! wait for threads that do not exist in the child.
//!
//! What this cannot lift is the POSIX limit of forking a threaded process: a lock that
//! another thread holds inside a driver or another library at the instant of the fork (Mesa's,
//! LLVM's, or std's backtrace lock that wgpu-core's debug builds take) stays held in the child,
//! and a fresh device there may wait on it. unirt's own objects never wait in a child; fork
//! while the drivers are idle (queued, unsubmitted work is fine), or start workers with
//! spawn/exec. A child made by a raw `clone`/`vfork` system call (no atfork handlers) is not
//! detected; a child that only calls `exec` needs nothing.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Once, OnceLock};

use crate::error::{Error, Result};

/// How many forks separate this process from the one that first loaded unirt.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Runs in the child, on its only thread, before `fork` returns there: only atomics.
extern "C" fn after_fork_in_child() {
    GENERATION.fetch_add(1, Ordering::SeqCst);
    crate::handles::note_fork();
    crate::exit::after_fork_in_child();
}

/// Registers the child handler (once per process; the registration is inherited by children).
fn arm() {
    static ARMED: Once = Once::new();
    ARMED.call_once(|| {
        // SAFETY: registers a handler that only touches atomics, which is all a fork child
        // handler may do; the function lives as long as the process (unirt is never unloaded
        // while registered: a cdylib's atfork handlers are removed by glibc on dlclose).
        let rc = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        if rc != 0 {
            tracing::warn!("pthread_atfork failed ({rc}): forked children are not detected");
        }
    });
}

/// The current fork generation (0 in the process that loaded unirt, +1 per fork since).
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

/// The process image an object was made in.
///
/// ```
/// let born = unirt::fork::Epoch::now();
/// assert!(born.is_current());
/// assert!(born.check("a stream").is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch(u64);

impl Epoch {
    /// The current process image (and arms fork detection).
    pub fn now() -> Self {
        arm();
        Epoch(generation())
    }

    /// Whether no fork happened since this epoch was taken (one relaxed atomic load).
    #[inline]
    pub fn is_current(self) -> bool {
        self.0 == GENERATION.load(Ordering::Relaxed)
    }

    /// `Ok` in the process that made the object; [`Error::Forked`] naming `what` in a child.
    #[inline]
    pub fn check(self, what: &str) -> Result<()> {
        if self.is_current() {
            Ok(())
        } else {
            Err(forked(what))
        }
    }
}

/// The error for an object made before the fork that made this process.
#[cold]
pub fn forked(what: &str) -> Error {
    Error::Forked(format!(
        "{what} was made before this process was forked; a forked child cannot use its \
         parent's streams, events, memory or devices: open the device again in the child"
    ))
}

/// A lazily made value that is made again in a forked child.
///
/// The value of the process that made it is kept (leaked) in the child, never dropped: it may
/// own threads or driver state whose teardown would wait forever there. One value is leaked per
/// fork that uses it.
pub struct PerProcess<T: 'static> {
    slot: AtomicPtr<Slot<T>>,
    _owns: PhantomData<T>,
}

struct Slot<T: 'static> {
    generation: u64,
    value: OnceLock<T>,
    /// The value of the nearest ancestor process that made one.
    parent: Option<&'static T>,
}

impl<T: Send + Sync + 'static> PerProcess<T> {
    pub const fn new() -> Self {
        PerProcess {
            slot: AtomicPtr::new(std::ptr::null_mut()),
            _owns: PhantomData,
        }
    }

    /// This process's value, made by `init` on first use in this process image.
    pub fn get_or_init(&'static self, init: impl FnOnce() -> T) -> &'static T {
        self.get_or_init_after_fork(|_| init())
    }

    /// As [`get_or_init`](Self::get_or_init), and `init` is shown the value of the process
    /// this one was forked from, if it had made one — to read (plain data only: its locks may
    /// be held by threads the child does not have).
    pub fn get_or_init_after_fork(
        &'static self,
        init: impl FnOnce(Option<&'static T>) -> T,
    ) -> &'static T {
        arm();
        let generation = generation();
        let mut current = self.slot.load(Ordering::Acquire);
        loop {
            // SAFETY: slots are leaked boxes, never freed, so a non-null pointer stays valid.
            let previous: Option<&'static Slot<T>> = unsafe { current.as_ref() };
            if let Some(slot) = previous {
                if slot.generation == generation {
                    let parent = slot.parent;
                    return slot.value.get_or_init(|| init(parent));
                }
            }
            let fresh = Box::into_raw(Box::new(Slot {
                generation,
                value: OnceLock::new(),
                parent: previous.and_then(|p| p.value.get().or(p.parent)),
            }));
            match self
                .slot
                .compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => current = fresh,
                Err(winner) => {
                    // SAFETY: `fresh` was never shared; it is ours to free.
                    drop(unsafe { Box::from_raw(fresh) });
                    current = winner;
                }
            }
        }
    }
}

impl<T: Send + Sync + 'static> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_process_values_are_made_once() {
        static V: PerProcess<u32> = PerProcess::new();
        let a = V.get_or_init(|| 7) as *const u32;
        let b = V.get_or_init(|| 8) as *const u32;
        assert_eq!(a, b);
        assert_eq!(*V.get_or_init(|| 9), 7);
    }

    #[test]
    fn epochs_are_current_without_a_fork() {
        let e = Epoch::now();
        assert!(e.is_current());
        assert_eq!(e.check("x"), Ok(()));
        assert_eq!(forked("x").kind_name(), "forked");
    }
}
