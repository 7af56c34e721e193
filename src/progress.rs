//! A monotonic counter that threads can wait on: the completion count of a stream, the
//! completed generation of an event.
//!
//! The fast paths are one atomic each: `advance` only touches the lock when somebody waits, and
//! `wait_for` spins for a short while (`spin_until`) before it sleeps on a
//! condition variable.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Condvar, Mutex};

#[derive(Debug, Default)]
pub struct Progress {
    value: AtomicU64,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
    /// Waiters spin for [`HELPING_SPIN_FOR`], not [`SPIN_FOR`] ([`Self::for_cpu_work`]).
    cpu_work: bool,
}

impl Progress {
    pub fn new() -> Self {
        Self::default()
    }

    /// A counter of work that runs on the host's cores (a CPU stream's commands, a CPU
    /// event): its waiters spin for the longer [`HELPING_SPIN_FOR`], taking the tasks of the
    /// kernels' forks meanwhile. A counter of a GPU's work keeps the short window: a driver
    /// that runs on the host's cores (lavapipe) would otherwise lose one of them to the spin.
    pub fn for_cpu_work() -> Self {
        Progress {
            cpu_work: true,
            ..Self::default()
        }
    }

    pub fn get(&self) -> u64 {
        self.value.load(Ordering::SeqCst)
    }

    /// Raises the value to at least `to` and wakes the waiters.
    pub fn advance(&self, to: u64) {
        self.value.fetch_max(to, Ordering::SeqCst);
        self.wake();
    }

    /// Adds one and wakes the waiters.
    pub fn increment(&self) {
        self.value.fetch_add(1, Ordering::SeqCst);
        self.wake();
    }

    fn wake(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock();
            self.cv.notify_all();
        }
    }

    /// Blocks until the value is at least `target`.
    pub fn wait_for(&self, target: u64) {
        if self.get() >= target {
            return;
        }
        let window = if self.cpu_work {
            HELPING_SPIN_FOR
        } else {
            SPIN_FOR
        };
        if spin_until(|| self.get() >= target, window) {
            return;
        }
        let mut g = self.lock.lock();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        while self.get() < target {
            self.cv.wait(&mut g);
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How long a waiter keeps checking before it sleeps, unless it waits for work on the host's
/// cores ([`HELPING_SPIN_FOR`]); a stream's idle worker waiting for its next command too.
pub(crate) const SPIN_FOR: std::time::Duration = std::time::Duration::from_micros(50);

/// How long a waiter for work on the host's cores ([`Progress::for_cpu_work`]), which takes
/// the CPU kernels' fork tasks meanwhile, keeps checking before it sleeps: long enough to
/// span the hand-over of a command to a stream's worker and the fork it opens (tens to a few
/// hundred microseconds on a virtual machine whose vCPUs halt), so that the waiter is still
/// awake to take the fork's tasks and to see the work end. With 50 µs, the waiter of a
/// launch-and-synchronise loop had gone to sleep before a 256³ GEMM's fork opened in nine
/// launches of ten: the fork then woke a rayon thread (about 90 µs on the AMD VM of
/// 2026-11-27), the end woke the waiter, and the GEMM took 1.25× the time (docs/BENCHMARKS.md).
/// OpenMP runtimes spin for far longer (200 ms by default); this spin stays bounded, and a
/// waiter that cannot help a kernel running on every core sleeps at once (see [`spin`]).
const HELPING_SPIN_FOR: std::time::Duration = std::time::Duration::from_micros(500);

/// Parallel kernels in flight on the host's cores (see [`AllCoresBusy`]).
static PARALLEL_KERNELS: AtomicUsize = AtomicUsize::new(0);

/// Held while a kernel runs on every core of the host (a rayon fork of a CPU kernel): a
/// waiter does not spin then, it sleeps at once. A spinning waiter took one of the cores the
/// kernel's tasks needed; on two cores a 256³ GEMM that forks two panels took 0.21–0.24 ms
/// with the 50 µs spin beside it and 0.16 without (the wait is as long as the kernel anyway).
pub(crate) struct AllCoresBusy(());

impl AllCoresBusy {
    pub(crate) fn enter() -> Self {
        PARALLEL_KERNELS.fetch_add(1, Ordering::SeqCst);
        AllCoresBusy(())
    }
}

impl Drop for AllCoresBusy {
    fn drop(&mut self) {
        PARALLEL_KERNELS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Threads in [`spin_until`] now: each takes tasks of a CPU kernel's fork as soon as one
/// opens, so a fork asks that many fewer rayon threads to wake.
static SPINNING_WAITERS: AtomicUsize = AtomicUsize::new(0);

/// A thread counted in [`SPINNING_WAITERS`] while `counted`.
struct SpinningWaiter {
    counted: bool,
}

impl SpinningWaiter {
    /// Counted when `helps`.
    fn enter(helps: bool) -> Self {
        let mut w = SpinningWaiter { counted: false };
        w.set(helps);
        w
    }

    fn set(&mut self, counted: bool) {
        if counted != self.counted {
            if counted {
                SPINNING_WAITERS.fetch_add(1, Ordering::SeqCst);
            } else {
                SPINNING_WAITERS.fetch_sub(1, Ordering::SeqCst);
            }
            self.counted = counted;
        }
    }
}

impl Drop for SpinningWaiter {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// How many threads are spinning in [`spin_until`] (and so will help a fork).
pub(crate) fn spinning_waiters() -> usize {
    SPINNING_WAITERS.load(Ordering::SeqCst)
}

/// Checks `ready` for up to `window` ([`SPIN_FOR`], or [`HELPING_SPIN_FOR`] for work on the
/// host's cores), busy (no syscall), and says whether it became true. Most waits on a stream of small work end within microseconds; sleeping on a futex
/// instead costs a wake-up on each side, which on a virtual machine (a halted vCPU woken by
/// an interrupt) is tens of microseconds: a replayed graph of 100 tiny operators spent half
/// its time in the kernel's wake-up path. The spin does not yield: with other processes
/// busy on the cores, `sched_yield` handed the core to them for a whole time slice, and a
/// 256³ GEMM took 4 ms instead of 0.25.
///
/// While a CPU kernel runs on all cores ([`AllCoresBusy`]) the waiter takes its unclaimed
/// tasks instead ([`help_open_forks`](crate::vendors::cpu::help_open_forks)): it is a core
/// already awake, so the work ends sooner and the waiter is awake to see it end. A waiter
/// that found no task to take does not spin then: it sleeps, leaving the cores to the tasks.
pub(crate) fn spin_until(ready: impl Fn() -> bool, window: std::time::Duration) -> bool {
    // A thread with little stack left (a C program's small-stack thread) waits without
    // helping, and is not counted as help either.
    spin(ready, crate::vendors::cpu::can_help_forks(), window)
}

/// [`spin_until`] for a thread that has work of its own to take as soon as `ready` (a stream's
/// idle worker): it never takes a fork's tasks, which could hold its own stream's next
/// command back by a whole task.
pub(crate) fn spin_idle(ready: impl Fn() -> bool) -> bool {
    spin(ready, false, SPIN_FOR)
}

fn spin(ready: impl Fn() -> bool, help: bool, window: std::time::Duration) -> bool {
    let mut spinning = SpinningWaiter::enter(help);
    let mut start = std::time::Instant::now();
    let mut helped = false;
    loop {
        for _ in 0..64 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        let leaving =
            start.elapsed() >= window || (!helped && PARALLEL_KERNELS.load(Ordering::Relaxed) > 0);
        // Leaving: uncounted first, then one more look. A fork that opened while this thread
        // was still counted asked rayon for one helper fewer; it was published before it read
        // the count, so this look finds it (both sides are SeqCst).
        spinning.set(!leaving && help);
        if help && crate::vendors::cpu::help_open_forks() {
            // Working, not waiting: the spin's time counts from the last task.
            spinning.set(true);
            helped = true;
            start = std::time::Instant::now();
            continue;
        }
        if leaving {
            return ready();
        }
    }
}

/// How far a producer may run ahead of a consumer that counts its completions (a CPU stream's
/// worker, a wgpu device's submissions): once too far, the producer waits for room — unless
/// the consumer completes nothing for `stall` (a long command; one blocked on something the
/// producer holds), after which producers go on unbounded until it completes something more.
/// So a wait for room never deadlocks and costs at most `stall` once per stall.
#[derive(Debug)]
pub(crate) struct Backpressure {
    /// One more than the completion count at which a wait gave up (0: none).
    stalled_at: AtomicU64,
    stall: std::time::Duration,
}

impl Backpressure {
    pub(crate) const fn new(stall: std::time::Duration) -> Self {
        Backpressure {
            stalled_at: AtomicU64::new(0),
            stall,
        }
    }

    /// Whether a wait has given up on the consumer (ever).
    #[cfg(test)]
    pub(crate) fn stalled(&self) -> Option<u64> {
        match self.stalled_at.load(Ordering::SeqCst) {
            0 => None,
            n => Some(n - 1),
        }
    }

    /// Waits while more than `resume` are outstanding: `ahead(done)` of them, where `done()`
    /// reads the completion count (`None`: stop waiting, the consumer is gone). Polled every
    /// 200 µs, not woken: a consumer would otherwise notify on every completion, and on a
    /// software adapter the device's work runs on the cores a spinning producer would take.
    pub(crate) fn wait(
        &self,
        mut done: impl FnMut() -> Option<u64>,
        ahead: impl Fn(u64) -> u64,
        resume: u64,
    ) {
        let Some(mut seen) = done() else { return };
        if self.stalled_at.load(Ordering::Relaxed) == seen + 1 {
            return;
        }
        let mut moved = std::time::Instant::now();
        while ahead(seen) > resume {
            std::thread::sleep(std::time::Duration::from_micros(200));
            let Some(now) = done() else { return };
            if now != seen {
                (seen, moved) = (now, std::time::Instant::now());
            } else if moved.elapsed() >= self.stall {
                self.stalled_at.store(seen + 1, Ordering::Relaxed);
                return;
            }
        }
    }
}
