//! Live-handle tables: how backends without native handles validate the ones they hand out.
//!
//! Ids come from one process-wide counter, so a handle of one device is never valid on
//! another and a destroyed handle is never reused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::error::{Error, Result};

static NEXT_ID: AtomicU64 = AtomicU64::new(0x1_0000);

/// A fresh, never-before-used handle value (never null, 16-byte spaced so it also looks like an
/// aligned pointer to C code that stores it as `void *`).
pub fn fresh_id() -> u64 {
    NEXT_ID.fetch_add(0x10, Ordering::Relaxed)
}

/// Live objects of one kind, by handle.
#[derive(Debug)]
pub struct HandleTable<T> {
    kind: &'static str,
    map: RwLock<HashMap<u64, Arc<T>>>,
}

impl<T> HandleTable<T> {
    pub fn new(kind: &'static str) -> Self {
        HandleTable {
            kind,
            map: RwLock::new(HashMap::new()),
        }
    }

    /// Stores `value` under a fresh handle.
    pub fn insert(&self, value: T) -> (u64, Arc<T>) {
        let id = fresh_id();
        let value = Arc::new(value);
        self.map.write().insert(id, value.clone());
        (id, value)
    }

    /// Stores `value` under a handle the caller chose (a native handle).
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
        self.map
            .read()
            .get(&id)
            .cloned()
            .ok_or(Error::InvalidHandle {
                kind: self.kind,
                handle: id,
            })
    }

    pub fn remove(&self, id: u64) -> Result<Arc<T>> {
        self.map.write().remove(&id).ok_or(Error::InvalidHandle {
            kind: self.kind,
            handle: id,
        })
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
