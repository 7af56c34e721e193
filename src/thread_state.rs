//! The per-thread state under [`context`](crate::context) and [`Runtime`](crate::Runtime):
//! the calling thread's current device and its own stream per device.
//!
//! It sits below both so that neither imports the other for it: `context` reads and sets the
//! current device, a `Runtime` hands out the thread's stream on its device, and both come here.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

use crate::device::{Device, DeviceKind};
use crate::error::Result;
use crate::hal::StreamId;
use crate::stream::Stream;
use crate::vendors::AnyBackend;

thread_local! {
    static CURRENT: Cell<Device> = const { Cell::new(Device::CPU) };
    /// Destroyed (each stream with its device) when the thread exits.
    static STREAMS: RefCell<ThreadStreams> = RefCell::new(ThreadStreams(HashMap::new()));
}

/// The thread's streams. When the thread exits, wgpu streams go to the [`reaper`] thread
/// instead of being destroyed in this destructor: destroying one submits its gathered work
/// through wgpu, and a debug build of wgpu-core keeps a lock trace in a thread-local of its
/// own, which may already be gone by then (every call panics, and the exiting thread's queued
/// work was lost). The other backends' streams are destroyed here.
struct ThreadStreams(HashMap<Device, Stream>);

impl Drop for ThreadStreams {
    fn drop(&mut self) {
        for (device, stream) in self.0.drain() {
            if device.kind == DeviceKind::Wgpu {
                // Its cached memory is retired now, not when the reaper gets to it; the
                // allocators that took it are let go there too (one may be the last handle).
                let allocators = crate::alloc::retire_stream_later(stream.backend(), stream.id());
                reaper::destroy_later(stream, allocators);
            }
        }
    }
}

/// A process-wide thread that destroys the streams of exited threads (see [`ThreadStreams`]),
/// started from an ordinary call (the first wgpu thread stream), never from a destructor.
mod reaper {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Condvar, Mutex, OnceLock};

    use crate::alloc::CachingAllocator;
    use crate::stream::Stream;

    /// A stream to destroy, and the allocators that retired its memory, to let go after it.
    type Reaped = (Stream, Vec<std::sync::Arc<CachingAllocator>>);

    struct Reaper {
        /// The process that started the thread: a forked child has no reaper thread, and
        /// destroys its streams in place.
        pid: u32,
        queue: Mutex<Vec<Reaped>>,
        ready: Condvar,
        /// Whether the thread was started (a failed spawn leaves streams to their threads).
        running: AtomicBool,
    }

    static REAPER: OnceLock<Reaper> = OnceLock::new();

    /// Starts the thread (once per process); false if it could not be started.
    pub(super) fn start() -> bool {
        let r = REAPER.get_or_init(|| Reaper {
            pid: std::process::id(),
            queue: Mutex::new(Vec::new()),
            ready: Condvar::new(),
            running: AtomicBool::new(false),
        });
        if r.pid != std::process::id() {
            return false;
        }
        static STARTED: OnceLock<bool> = OnceLock::new();
        *STARTED.get_or_init(|| {
            let spawned = std::thread::Builder::new()
                .name("unirt-stream-reaper".into())
                .spawn(|| {
                    if let Some(r) = REAPER.get() {
                        run(r)
                    }
                })
                .is_ok();
            r.running.store(spawned, Ordering::Release);
            spawned
        })
    }

    fn run(r: &Reaper) {
        loop {
            let batch = {
                let mut q = r.queue.lock().unwrap_or_else(|e| e.into_inner());
                while q.is_empty() {
                    q = r.ready.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                std::mem::take(&mut *q)
            };
            // Dropping a stream destroys it (its queued work still runs); then its allocators.
            drop(batch);
        }
    }

    /// Hands `stream` and `allocators` to the thread, or drops them here where there is none
    /// (never started, or this is a forked child). Only a mutex and a condition variable: no
    /// thread-local.
    pub(super) fn destroy_later(stream: Stream, allocators: Vec<std::sync::Arc<CachingAllocator>>) {
        match REAPER.get() {
            Some(r) if r.pid == std::process::id() && r.running.load(Ordering::Acquire) => {
                r.queue
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((stream, allocators));
                r.ready.notify_one();
            }
            _ => drop((stream, allocators)),
        }
    }
}

thread_local! {
    /// Set on a helper thread that makes calls for an exiting thread (the wgpu backend's, see
    /// `vendors/wgpu/guard.rs`): the identity those calls carry.
    static ACTING_FOR: Cell<Option<std::thread::ThreadId>> = const { Cell::new(None) };
}

/// The identity of the calling thread as unirt's per-thread rules see it (which thread may end
/// a capture): its own, or that of the exiting thread a helper makes the call for.
pub(crate) fn thread_identity() -> std::thread::ThreadId {
    ACTING_FOR
        .get()
        .unwrap_or_else(|| std::thread::current().id())
}

/// Runs `f` with the calling (helper) thread carrying the identity `of`.
pub(crate) fn acting_for<R>(of: std::thread::ThreadId, f: impl FnOnce() -> R) -> R {
    let before = ACTING_FOR.replace(Some(of));
    let r = f();
    ACTING_FOR.set(before);
    r
}

/// The calling thread's current device (`cpu:0` until set).
pub(crate) fn current_device() -> Device {
    CURRENT.with(|c| c.get())
}

/// Makes `device` the calling thread's current device (no check: callers open it first).
pub(crate) fn set_current_device(device: Device) {
    CURRENT.with(|c| c.set(device));
}

/// The calling thread's stream on `device`, created on `backend` on first use — and again
/// when the device was opened anew (in a forked child, whose thread keeps the parent's stream
/// in its thread-local map; dropping that one is a harmless `Error::Forked`).
pub(crate) fn thread_stream(device: Device, backend: &Arc<AnyBackend>) -> Result<StreamId> {
    let own = STREAMS.try_with(|s| {
        let creating = || {
            if device.kind == DeviceKind::Wgpu {
                // Where the reaper cannot run, the stream is destroyed in the destructor as before.
                reaper::start();
            }
        };
        stream_in(&mut s.borrow_mut().0, device, backend, creating).map(|(id, _old)| id)
    });
    match own {
        Ok(id) => id,
        // The thread is exiting and its streams are gone: a thread-local destructor that runs
        // after theirs (a user's thread-local holding a tensor, or computing at exit).
        Err(_) => {
            let mut streams = EXITING.lock().unwrap_or_else(|e| e.into_inner());
            let found = stream_in(
                streams.get_or_insert_with(HashMap::new),
                device,
                backend,
                || {},
            );
            // A replaced stream is dropped after the lock is let go.
            drop(streams);
            found.map(|(id, _old)| id)
        }
    }
}

/// Streams for calls made after the calling thread's own streams were destroyed, from
/// thread-local destructors that run after [`STREAMS`]'s: one per device, shared by every
/// exiting thread and kept for the life of the process (a stream is usable from any thread;
/// tensors order themselves across streams). A lock and a map: no thread-local.
static EXITING: std::sync::Mutex<Option<HashMap<Device, Stream>>> = std::sync::Mutex::new(None);

/// The stream of `map` for `device`, created on `backend` when there is none or the one there
/// belongs to an earlier opening of the device (a forked child's inherited one, returned to
/// be dropped: that is a harmless `Error::Forked`). `creating` runs before a stream is made.
fn stream_in(
    map: &mut HashMap<Device, Stream>,
    device: Device,
    backend: &Arc<AnyBackend>,
    creating: impl FnOnce(),
) -> Result<(StreamId, Option<Stream>)> {
    if let Some(st) = map.get(&device) {
        if Arc::ptr_eq(st.backend(), backend) {
            return Ok((st.id(), None));
        }
    }
    creating();
    let st = Stream::new(backend)?;
    let id = st.id();
    Ok((id, map.insert(device, st)))
}
