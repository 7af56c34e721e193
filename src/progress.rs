//! A monotonic counter that threads can wait on: the completion count of a stream, the
//! completed generation of an event.
//!
//! The fast paths are one atomic each: `advance` only touches the lock when somebody waits, and
//! `wait_for` spins briefly (most waits on an idle stream end within microseconds) before it
//! sleeps on a condition variable.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Condvar, Mutex};

#[derive(Debug, Default)]
pub struct Progress {
    value: AtomicU64,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Progress {
    pub fn new() -> Self {
        Self::default()
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
        for _ in 0..64 {
            std::hint::spin_loop();
            if self.get() >= target {
                return;
            }
        }
        let mut g = self.lock.lock();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        while self.get() < target {
            self.cv.wait(&mut g);
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}
