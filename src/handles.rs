//! Live-handle tables: how backends without native handles validate the ones they hand out.
//!
//! Ids come from one process-wide counter, so a handle of one device is never valid on
//! another and a destroyed handle is never reused.
//!
//! A table made before a fork answers [`Error::Forked`] in the child (see [`crate::fork`]),
//! and a fresh table in the child recognises handles issued before the fork and says so too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::error::{Error, Result};
use crate::fork::Epoch;

static NEXT_ID: AtomicU64 = AtomicU64::new(0x1_0000);
/// The first id issued after the latest fork (0 before any): smaller ids are the parent's.
static FORK_FLOOR: AtomicU64 = AtomicU64::new(0);

/// Called by the fork child handler (only atomics).
pub(crate) fn note_fork() {
    FORK_FLOOR.store(NEXT_ID.load(Ordering::SeqCst), Ordering::SeqCst);
}

/// A fresh, never-before-used handle value (never null, 16-byte spaced so it also looks like an
/// aligned pointer to C code that stores it as `void *`).
pub fn fresh_id() -> u64 {
    NEXT_ID.fetch_add(0x10, Ordering::Relaxed)
}

/// Live objects of one kind, by handle.
#[derive(Debug)]
pub struct HandleTable<T> {
    kind: &'static str,
    born: Epoch,
    map: RwLock<HashMap<u64, Arc<T>>>,
}

impl<T> HandleTable<T> {
    pub fn new(kind: &'static str) -> Self {
        HandleTable {
            kind,
            born: Epoch::now(),
            map: RwLock::new(HashMap::new()),
        }
    }

    /// `Ok` unless the table was made before a fork that made this process.
    #[inline]
    pub fn check_live(&self) -> Result<()> {
        self.born.check(self.kind)
    }

    /// Stores `value` under a fresh handle.
    pub fn insert(&self, value: T) -> Result<(u64, Arc<T>)> {
        self.check_live()?;
        let id = fresh_id();
        let value = Arc::new(value);
        self.map.write().insert(id, value.clone());
        Ok((id, value))
    }

    /// Stores `value` under a handle the caller chose (a native handle, just made by the
    /// driver — whose backend checked for a fork before calling it).
    pub fn insert_with(&self, id: u64, value: T) -> Arc<T> {
        let value = Arc::new(value);
        self.map.write().insert(id, value.clone());
        value
    }

    /// Puts back a value [`remove`](Self::remove) took out, when releasing the native object
    /// failed and it still exists (so a retry or the backend's teardown can release it).
    pub fn restore(&self, id: u64, value: Arc<T>) {
        self.map.write().insert(id, value);
    }

    pub fn get(&self, id: u64) -> Result<Arc<T>> {
        self.check_live()?;
        match self.map.read().get(&id) {
            Some(v) => Ok(v.clone()),
            None => Err(self.unknown(id)),
        }
    }

    pub fn remove(&self, id: u64) -> Result<Arc<T>> {
        self.check_live()?;
        let removed = self.map.write().remove(&id);
        removed.ok_or_else(|| self.unknown(id))
    }

    /// Why `id` is not here: a handle of the parent process, or simply not live.
    #[cold]
    fn unknown(&self, id: u64) -> Error {
        let floor = FORK_FLOOR.load(Ordering::Relaxed);
        if (0x1_0000..floor).contains(&id) {
            return crate::fork::forked(&format!("{} handle {id:#x}", self.kind));
        }
        Error::InvalidHandle {
            kind: self.kind,
            handle: id,
        }
    }

    pub fn values(&self) -> Vec<Arc<T>> {
        self.map.read().values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
