//! The host's helper threads: a rayon pool of unirt's own, onto which the CPU kernels'
//! parallel loops (and unirt's other host-side parallel work) fork; and a thread with a roomy
//! stack for the cold paths that need one.
//!
//! Why not rayon's global pool: rayon starts it at its first use and panics where it cannot
//! start its threads (a container's `pids.max`, a thread limit), and it never tries again, so
//! one refusal would leave every later parallel loop of the process panicking. unirt starts
//! its own pool fallibly instead: while it cannot, parallel loops run on the calling thread
//! alone (slower, never wrong), and starting it is tried again a second later.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::fork::PerProcess;

/// How long after a failed start the next one is tried.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// This process's pool, and when it last failed to start (only the first failure is
/// reported). Made again in a forked child, whose copy of its parent's pool has no threads: work
/// handed to it there would never run.
struct Helpers {
    pool: OnceLock<rayon::ThreadPool>,
    failed: Mutex<Option<Instant>>,
}

static HELPERS: PerProcess<Helpers> = PerProcess::new();

/// The helper pool, started on first use; `None` while the host refuses its threads.
pub fn pool() -> Option<&'static rayon::ThreadPool> {
    let h = HELPERS.get_or_init(|| Helpers {
        pool: OnceLock::new(),
        failed: Mutex::new(None),
    });
    match h.pool.get() {
        Some(p) => Some(p),
        None => start(&h.pool, &h.failed, || {
            // The default size: RAYON_NUM_THREADS where set, else one thread per core — but
            // never more than a few threads per core: RAYON_NUM_THREADS=100000 started that
            // many threads here, and every parallel loop then took seconds to wake them.
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let asked = std::env::var("RAYON_NUM_THREADS")
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&n| n > 0)
                .unwrap_or(cores);
            rayon::ThreadPoolBuilder::new()
                .num_threads(asked.min(cores.saturating_mul(4).max(4)))
                .thread_name(|i| format!("unirt-host-{i}"))
                .build()
        }),
    }
}

/// Starts the pool in `slot` with `build`, unless the last try (in `failed`) was less than
/// [`RETRY_AFTER`] ago.
fn start<'a>(
    slot: &'a OnceLock<rayon::ThreadPool>,
    failed: &Mutex<Option<Instant>>,
    build: impl FnOnce() -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError>,
) -> Option<&'a rayon::ThreadPool> {
    let mut failed = failed.lock();
    if let Some(p) = slot.get() {
        return Some(p); // another thread started it while this one waited
    }
    if failed.is_some_and(|at| at.elapsed() < RETRY_AFTER) {
        return None;
    }
    match build() {
        Ok(p) => {
            *failed = None;
            Some(slot.get_or_init(|| p))
        }
        Err(e) => {
            if failed.is_none() {
                tracing::warn!(
                    "cannot start unirt's host helper threads ({e}): parallel loops run on \
                     the calling thread alone until they can"
                );
            }
            *failed = Some(Instant::now());
            None
        }
    }
}

/// Threads a parallel loop can use: the pool's, or 1 (the caller) without it.
pub fn threads() -> usize {
    pool().map_or(1, |p| p.current_num_threads().max(1))
}

/// Runs `f(i)` for each `i < n`, on the pool's threads where it runs, else on the caller.
/// Rayon's own calls made inside `f` use the pool, never rayon's global one. Items run as
/// part of the caller's command where the caller runs one (see [`running_command`]).
pub fn for_each(n: usize, f: impl Fn(usize) + Sync + Send) {
    use rayon::prelude::*;
    let command = running_command();
    match pool() {
        Some(p) => p.install(|| {
            (0..n)
                .into_par_iter()
                .for_each(|i| in_command(command, || f(i)))
        }),
        None => (0..n).for_each(f),
    }
}

/// `[f(&items[0]), f(&items[1]), …]`, computed on the pool's threads where it runs, else on
/// the caller (as [`for_each`] runs its items).
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync + Send) -> Vec<R> {
    use rayon::prelude::*;
    let command = running_command();
    match pool() {
        Some(p) => p.install(|| {
            items
                .par_iter()
                .map(|t| in_command(command, || f(t)))
                .collect()
        }),
        None => items.iter().map(f).collect(),
    }
}

thread_local! {
    static COMMAND: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The stream whose command the calling thread is running, as that stream's token (0 when
/// none): a CPU stream's worker runs each command under its stream's token, and [`for_each`]
/// and [`map`] carry the caller's token to the pool's threads. A command that waits for its
/// own stream waits for itself — a user's CPU kernel that synchronises the device, say — so
/// the CPU backend's waits check this first and refuse such a wait instead of hanging.
pub(crate) fn running_command() -> usize {
    COMMAND.with(|c| c.get())
}

/// Runs `f` as part of a command of the stream whose token is `command`, the thread's
/// previous mark restored afterwards (a pool thread that takes up another command's item
/// while it waits in a nested loop gets its own mark back), even when `f` panics.
pub(crate) fn in_command<R>(command: usize, f: impl FnOnce() -> R) -> R {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            COMMAND.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(COMMAND.with(|c| c.replace(command)));
    f()
}

/// Stack the cold paths — probing a vendor, opening a device, preparing a kernel (driver
/// start-up, shader and NVRTC compilers, deeply recursive) — run with in place: each took
/// less than 48 KiB in a release build here, so this leaves a wide margin (debug builds take
/// several times more). A thread with less pays a thread's start per cold path; eager
/// operators prepare their kernel on every call (from caches after the first), so such a
/// thread computes correctly but more slowly.
const COLD_PATH_STACK: usize = 256 << 10;

/// The stack of the thread that runs a cold path for a caller with less.
const ROOMY_STACK: usize = 16 << 20;

/// Runs `f` on the calling thread where it has [`COLD_PATH_STACK`] of stack left (or where the
/// OS does not say), else on a thread of its own with a roomy stack, waiting for it. A C
/// program may call unirt from a thread it made with a small stack (`PTHREAD_STACK_MIN` is
/// 16 KiB): the Vulkan loader's device enumeration and naga's WGSL parser overflowed one of
/// 32 KiB, which ends the process. `None` where that thread cannot be started.
///
/// A thread per call rather than one shared worker: a cold path may wait for another one in
/// progress (one thread's discovery, which another's device opening needs), and a single
/// worker running the second would wait for itself.
pub fn on_roomy_stack<R: Send>(f: impl FnOnce() -> R + Send) -> Option<R> {
    if stack_left().is_none_or(|left| left >= COLD_PATH_STACK) {
        return Some(f());
    }
    std::thread::scope(|scope| {
        let t = std::thread::Builder::new()
            .name("unirt-roomy-stack".into())
            .stack_size(ROOMY_STACK)
            .spawn_scoped(scope, f)
            .ok()?;
        // A panic in `f` continues on the caller, as if `f` had run here.
        Some(t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
}

/// Bytes of stack below the caller's frame, where the OS says (the stack's bounds are looked
/// up once per thread: for the main thread that reads `/proc/self/maps`).
pub fn stack_left() -> Option<usize> {
    thread_local! {
        static LOW: std::cell::Cell<Option<Option<usize>>> = const { std::cell::Cell::new(None) };
    }
    let low = LOW.with(|c| match c.get() {
        Some(low) => low,
        None => {
            let low = stack_low();
            c.set(Some(low));
            low
        }
    })?;
    let here = 0u8;
    (std::ptr::addr_of!(here) as usize).checked_sub(low)
}

/// The lowest address of the calling thread's stack.
#[cfg(target_os = "linux")]
fn stack_low() -> Option<usize> {
    let mut attr = std::mem::MaybeUninit::<libc::pthread_attr_t>::uninit();
    // SAFETY: pthread_getattr_np initialises `attr` for the calling thread when it returns 0,
    // and only then is it read and destroyed.
    unsafe {
        if libc::pthread_getattr_np(libc::pthread_self(), attr.as_mut_ptr()) != 0 {
            return None;
        }
        let mut low: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let got = libc::pthread_attr_getstack(attr.as_ptr(), &mut low, &mut size);
        libc::pthread_attr_destroy(attr.as_mut_ptr());
        (got == 0).then_some(low as usize)
    }
}

#[cfg(not(target_os = "linux"))]
fn stack_low() -> Option<usize> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_once_on_the_pool() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let counts: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        for_each(counts.len(), |i| {
            counts[i].fetch_add(1, Ordering::SeqCst);
            // Inside the pool, rayon's calls see the pool.
            assert_eq!(rayon::current_num_threads(), threads());
        });
        assert!(counts.iter().all(|c| c.load(Ordering::SeqCst) == 1));
        assert!(threads() >= 1);
        assert_eq!(map(&[0, 1, 2, 3, 4], |i| i * i), [0, 1, 4, 9, 16]);
    }

    /// A cold path called from a thread with a small stack runs on a roomy one; from a thread
    /// with room, in place.
    #[test]
    fn cold_paths_get_a_roomy_stack() {
        let run = |bytes: usize| {
            std::thread::Builder::new()
                .stack_size(bytes)
                .spawn(|| {
                    let caller = std::thread::current().id();
                    on_roomy_stack(move || {
                        (
                            std::thread::current().id() == caller,
                            stack_left().unwrap_or(0),
                        )
                    })
                })
                .expect("spawn")
                .join()
                .expect("join")
                .expect("a thread for the cold path")
        };
        if cfg!(target_os = "linux") {
            let (in_place, left) = run(64 << 10);
            assert!(!in_place && left > COLD_PATH_STACK, "{left}");
            let (in_place, _) = run(8 << 20);
            assert!(in_place);
        }
    }

    /// A pool the host refuses threads for is `None`, tried again only after a while, and
    /// started by a later try that gets its threads.
    #[test]
    fn a_refused_pool_is_tried_again_later() {
        let slot = OnceLock::new();
        let failed = Mutex::new(None);
        let refused = || {
            rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .spawn_handler(|_| Err(std::io::Error::from(std::io::ErrorKind::WouldBlock)))
                .build()
        };
        let granted = || rayon::ThreadPoolBuilder::new().num_threads(2).build();
        assert!(start(&slot, &failed, refused).is_none());
        assert!(
            start(&slot, &failed, granted).is_none(),
            "tried again at once"
        );
        *failed.lock() = Instant::now().checked_sub(RETRY_AFTER);
        let p = start(&slot, &failed, granted).expect("started on a later try");
        assert_eq!(p.current_num_threads(), 2);
        assert!(std::ptr::eq(p, start(&slot, &failed, refused).unwrap()));
    }
}
