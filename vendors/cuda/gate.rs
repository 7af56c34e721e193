//! Keeping a native handle alive while a call hands it to the driver.
//!
//! A `CUstream`, `CUevent`, `CUgraph` or `CUgraphExec` destroyed by one thread while another
//! thread's call is between its handle-table lookup and the driver call would reach libcuda
//! dead — undefined behaviour there (the H100 crash inside `cuGraphInstantiateWithFlags` had
//! that shape). Every call that passes a handle to the driver holds its [`HandleGate`] shared
//! for the duration; destroy takes it exclusively (so it waits for the calls in flight) and
//! marks the handle destroyed, which every later [`HandleGate::enter`] refuses with
//! [`Error::InvalidHandle`].
//!
//! Graphs and execs are entered exclusively by every call (instantiate, launch) as well:
//! CUDA's graph objects are not internally synchronised, and its documentation allows no
//! call — not even the seemingly read-only `cuGraphInstantiate` — on one graph object from two
//! threads at once.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{Error, Result};

#[derive(Debug, Default)]
pub(super) struct HandleGate {
    lock: RwLock<()>,
    destroyed: AtomicBool,
}

impl HandleGate {
    /// Held while a call uses the handle; refused once it is destroyed. Recursive: a thread
    /// never waits on a queued writer while it already holds the gate, and readers on
    /// different threads never wait on each other.
    pub fn enter(&self, kind: &'static str, raw: u64) -> Result<RwLockReadGuard<'_, ()>> {
        let g = self.lock.read_recursive();
        if self.is_destroyed() {
            return Err(Error::invalid(kind, raw));
        }
        Ok(g)
    }

    /// Held shared without the check, by callers that check [`is_destroyed`](Self::is_destroyed)
    /// themselves (a device-wide synchronize skips destroyed streams).
    pub fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.lock.read_recursive()
    }

    /// Held exclusively: waits for every call in flight on the handle. Refused once the
    /// handle is destroyed.
    pub fn exclusive(&self, kind: &'static str, raw: u64) -> Result<RwLockWriteGuard<'_, ()>> {
        let g = self.lock.write();
        if self.is_destroyed() {
            return Err(Error::invalid(kind, raw));
        }
        Ok(g)
    }

    /// Marks the native handle destroyed; call with [`exclusive`](Self::exclusive) held.
    pub fn mark_destroyed(&self) {
        self.destroyed.store(true, Ordering::Release);
    }

    pub fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }
}
