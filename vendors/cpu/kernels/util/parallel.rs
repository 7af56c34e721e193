//! The parallel walks of the CPU kernels: rows of strided operands and ranges of items split
//! into tasks, forked from the stream's worker without waiting for rayon's threads to wake,
//! and helped by threads that wait for CPU work meanwhile.

/// Below this many elements a kernel runs on the stream's worker alone (a rayon fork costs
/// more than the work).
pub const PAR_MIN: usize = 32 * 1024;

/// Calls `f(offsets, len, inner_strides)` for every row (run along the last dimension) of a
/// walk over `shape`, with each operand's element offset at the row's start, in parallel
/// chunks of about equal work when the walk is large. Rows may be split between tasks.
pub fn par_rows<const N: usize>(
    shape: &[usize],
    strides: &[[usize; N]],
    f: impl Fn([usize; N], usize, [usize; N]) + Sync,
) {
    let nd = shape.len();
    if nd == 0 {
        f([0; N], 1, [0; N]);
        return;
    }
    let inner = shape[nd - 1];
    let inner_st = strides[nd - 1];
    let total: usize = shape.iter().product();
    if total == 0 {
        return;
    }
    let tasks = if total < PAR_MIN {
        1
    } else {
        (total / (PAR_MIN / 2)).clamp(1, crate::host_threads::threads() * 4)
    };
    let per = total.div_ceil(tasks);
    let run = |t: usize| {
        let end = ((t + 1) * per).min(total);
        let mut pos = t * per;
        while pos < end {
            let (r, c) = (pos / inner, pos % inner);
            let len = (inner - c).min(end - pos);
            let mut offs = [0usize; N];
            let mut rem = r;
            for d in (0..nd - 1).rev() {
                let i = rem % shape[d];
                rem /= shape[d];
                for k in 0..N {
                    offs[k] += i * strides[d][k];
                }
            }
            for k in 0..N {
                offs[k] += c * inner_st[k];
            }
            f(offs, len, inner_st);
            pos += len;
        }
    };
    if tasks == 1 {
        run(0);
    } else {
        fork_tasks(tasks, &run);
    }
}

/// One fork of [`fork_tasks`]: its tasks, claimed from one counter by the forking thread, by
/// rayon helpers and by threads waiting for CPU work ([`help_open_forks`]).
struct Fork {
    next: std::sync::atomic::AtomicUsize,
    done: std::sync::atomic::AtomicUsize,
    // The first panic of a task, re-raised on the caller as it was.
    panic: std::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>,
    tasks: usize,
    // The caller's `run`, its lifetime erased: called only for a claimed task, and the caller
    // returns only once every claimed task is done (see `fork_tasks`).
    run: *const (dyn Fn(usize) + Sync),
    // Unparked when the last task is done.
    caller: std::thread::Thread,
}

// SAFETY: `run` is Sync and only called while the caller waits (see `fork_tasks`).
unsafe impl Send for Fork {}
// SAFETY: as above.
unsafe impl Sync for Fork {}

impl Fork {
    /// Claims and runs tasks until none is left; whether it ran any.
    fn work(&self) -> bool {
        use std::sync::atomic::Ordering;
        let mut ran = false;
        loop {
            let t = self.next.fetch_add(1, Ordering::AcqRel);
            if t >= self.tasks {
                return ran;
            }
            ran = true;
            // SAFETY: task t is claimed, so the caller is still waiting for it: `run` lives.
            let f = unsafe { &*self.run };
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(t))) {
                if let Ok(mut first) = self.panic.lock() {
                    first.get_or_insert(p);
                }
            }
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.tasks {
                self.caller.unpark();
            }
        }
    }

    fn open(&self) -> bool {
        self.next.load(std::sync::atomic::Ordering::Acquire) < self.tasks
    }
}

/// Forks whose tasks are not all claimed yet.
static OPEN_FORKS: parking_lot::Mutex<Vec<std::sync::Arc<Fork>>> =
    parking_lot::Mutex::new(Vec::new());
/// How many forks [`OPEN_FORKS`] lists (read without the lock).
static OPEN_FORK_COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Runs unclaimed tasks of CPU kernels' forks in flight on the calling thread; whether it ran
/// any. A thread waiting for a CPU stream calls it instead of sleeping: it is a free core
/// already awake, where a rayon helper may take tens of microseconds to wake on a virtual
/// machine, and having helped it is awake when the work ends (no wake-up of its own either).
/// Tasks are pure computations on memory their launch holds, safe on any thread with a roomy
/// stack ([`roomy_stack`], which the waiter checks before it calls this).
pub(crate) fn help_open_forks() -> bool {
    use std::sync::atomic::Ordering;
    if OPEN_FORK_COUNT.load(Ordering::SeqCst) == 0 {
        return false;
    }
    let fork = OPEN_FORKS.lock().iter().find(|f| f.open()).cloned();
    fork.is_some_and(|f| f.work())
}

/// Stack a waiting thread must have left to run kernel tasks: half of what rayon's threads,
/// which run them otherwise, are given.
const HELP_STACK: usize = 1 << 20;

/// Whether the calling thread has [`HELP_STACK`] of stack left below where it waits. A C
/// program may wait on a thread it made with a small stack; such a thread just sleeps, as
/// before. (The stack's bound is looked up once per thread; this is a subtraction.)
pub(crate) fn roomy_stack() -> bool {
    crate::host_threads::stack_left().is_some_and(|left| left >= HELP_STACK)
}

/// Runs `run(t)` for every `t < tasks`, the calling thread taking tasks itself while up to
/// one fewer than rayon's threads help (claiming tasks from one counter), and so do threads
/// waiting for CPU work meanwhile ([`help_open_forks`]). A fork from the stream's worker (not
/// a rayon thread) through rayon's own calls would block the worker and wait for pool threads
/// to wake, which on a virtual machine takes tens of microseconds: here the caller starts at
/// once, and a helper that wakes late finds the tasks taken. Every task has run when it
/// returns; a task that panics is re-raised here.
pub fn fork_tasks(tasks: usize, run: &(dyn Fn(usize) + Sync)) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    if tasks <= 1 {
        (0..tasks).for_each(run);
        return;
    }
    let _busy = crate::progress::AllCoresBusy::enter();
    // SAFETY: only the lifetime is erased; the wait below outlives every use.
    let run: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(run) };
    let fork = Arc::new(Fork {
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panic: std::sync::Mutex::new(None),
        tasks,
        run,
        caller: std::thread::current(),
    });
    // Published before the spinning waiters are counted (both SeqCst): a waiter that stops
    // spinning after the count was read looks once more and finds this fork
    // (`progress::spin_until`).
    {
        let mut open = OPEN_FORKS.lock();
        open.push(fork.clone());
        OPEN_FORK_COUNT.store(open.len(), Ordering::SeqCst);
    }
    // Threads spinning on a wait help at once; rayon's threads are asked for the rest of
    // the cores (one thread per core: more would only take turns on them).
    // Without the pool (the host refused its threads) the caller and the waiters run them all.
    if let Some(pool) = crate::host_threads::pool() {
        let helpers = pool
            .current_num_threads()
            .saturating_sub(1 + crate::progress::spinning_waiters())
            .min(tasks - 1);
        for _ in 0..helpers {
            let f = fork.clone();
            pool.spawn(move || {
                f.work();
            });
        }
    }
    fork.work();
    // Every task is claimed now: no new helper needs to find this fork.
    {
        let mut open = OPEN_FORKS.lock();
        open.retain(|f| !Arc::ptr_eq(f, &fork));
        OPEN_FORK_COUNT.store(open.len(), Ordering::Release);
    }
    // Wait for the tasks others run (busy for a few microseconds, the usual case, then
    // parked: with more threads than cores, a spinning caller would hold a core its helper
    // waits for). A helper claiming later finds none left and never calls `run`.
    let finished = || fork.done.load(Ordering::Acquire) >= tasks;
    let start = std::time::Instant::now();
    while !finished() {
        if start.elapsed() < std::time::Duration::from_micros(20) {
            std::hint::spin_loop();
        } else {
            std::thread::park_timeout(std::time::Duration::from_millis(1));
        }
    }
    // A task's panic (a kernel bug) continues on the caller, as rayon's own forks did; the
    // stream's worker turns it into the launch's error.
    let first = fork.panic.lock().ok().and_then(|mut p| p.take());
    if let Some(p) = first {
        std::panic::resume_unwind(p);
    }
}

/// Splits `0..n` into ranges run in parallel (one task when `n · work_per_item` is small),
/// so each task can reuse its buffers across items.
pub fn par_chunks(
    n: usize,
    work_per_item: usize,
    f: impl Fn(std::ops::Range<usize>) + Sync + Send,
) {
    let work = n.saturating_mul(work_per_item.max(1));
    if n < 2 || work < PAR_MIN {
        f(0..n);
        return;
    }
    let tasks = (work / (PAR_MIN / 2))
        .clamp(1, crate::host_threads::threads() * 4)
        .min(n);
    let per = n.div_ceil(tasks);
    fork_tasks(tasks, &|t| f(t * per..((t + 1) * per).min(n)));
}

/// [`par_chunks`] for bodies that can fail (a scratch buffer the host cannot back): every
/// range runs, and the first error is returned.
pub fn try_par_chunks(
    n: usize,
    work_per_item: usize,
    f: impl Fn(std::ops::Range<usize>) -> crate::error::Result<()> + Sync + Send,
) -> crate::error::Result<()> {
    let first = parking_lot::Mutex::new(None);
    par_chunks(n, work_per_item, |range| {
        if let Err(e) = f(range) {
            first.lock().get_or_insert(e);
        }
    });
    first.into_inner().map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every task runs once, with helpers or without, nested forks finish (a task's own fork
    /// runs its tasks itself when no helper is free), and a task's panic reaches the caller.
    #[test]
    fn fork_tasks_runs_each_task_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        for tasks in [0, 1, 2, 3, 17, 64] {
            let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            fork_tasks(tasks, &|t| {
                counts[t].fetch_add(1, Ordering::SeqCst);
            });
            assert!(
                counts.iter().all(|c| c.load(Ordering::SeqCst) == 1),
                "{tasks}"
            );
        }
        let inner = AtomicUsize::new(0);
        fork_tasks(8, &|_| {
            fork_tasks(8, &|_| {
                inner.fetch_add(1, Ordering::SeqCst);
            })
        });
        assert_eq!(inner.load(Ordering::SeqCst), 64);
        let caught = std::panic::catch_unwind(|| {
            fork_tasks(4, &|t| {
                if t == 3 {
                    panic!("task 3");
                }
            })
        });
        assert!(caught.is_err());
    }

    /// A thread with a small stack (a C program's, say) never runs kernel tasks while it
    /// waits; one with a roomy stack does (where the OS reports stacks).
    #[test]
    fn only_roomy_stacks_help() {
        let on = |bytes| {
            std::thread::Builder::new()
                .stack_size(bytes)
                .spawn(roomy_stack)
                .expect("spawn")
                .join()
                .expect("join")
        };
        assert!(!on(256 << 10));
        if cfg!(target_os = "linux") {
            assert!(on(8 << 20));
        }
    }

    /// Threads waiting in `spin_until` take tasks of open forks: with four waiters helping
    /// forks of 64 slow-ish tasks, every task still runs exactly once, and a task's panic is
    /// still re-raised on the forking thread (never on a helper).
    #[test]
    fn waiters_help_forks_and_each_task_runs_once() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let stop = AtomicBool::new(false);
        let helped_by_others = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..4 {
                sc.spawn(|| {
                    while !stop.load(Ordering::SeqCst) {
                        crate::progress::spin_until(
                            || stop.load(Ordering::SeqCst),
                            crate::progress::SPIN_FOR,
                        );
                    }
                });
            }
            let me = std::thread::current().id();
            for round in 0..20 {
                let counts: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
                fork_tasks(64, &|t| {
                    if std::thread::current().id() != me {
                        helped_by_others.fetch_add(1, Ordering::SeqCst);
                    }
                    std::hint::black_box((0..2000u64).sum::<u64>());
                    counts[t].fetch_add(1, Ordering::SeqCst);
                });
                assert!(
                    counts.iter().all(|c| c.load(Ordering::SeqCst) == 1),
                    "round {round}"
                );
            }
            let caught = std::panic::catch_unwind(|| {
                fork_tasks(16, &|t| {
                    if t == 9 {
                        panic!("task 9");
                    }
                })
            });
            assert!(caught.is_err());
            stop.store(true, Ordering::SeqCst);
        });
        // Not asserted (scheduling decides), only shown: how much the others took.
        eprintln!(
            "tasks run by other threads: {}",
            helped_by_others.load(Ordering::SeqCst)
        );
    }
}
