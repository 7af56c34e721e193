//! A raw allocator that fails on purpose: the real backend, except that chosen raw allocations
//! report `OutOfMemory`. It sits between the [`CachingAllocator`](super::CachingAllocator) and
//! a real device so the retry and OOM paths can be tested on every backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::RawAllocator;
use crate::error::{Error, Result};
use crate::hal::{Backend, DevicePtr};
use crate::vendors::AnyBackend;

/// Fails raw allocations number `first ..= first + count - 1` (counting from 1) with
/// [`Error::OutOfMemory`]; every other call goes to the backend.
///
/// ```
/// use std::sync::Arc;
/// use unirt::alloc::{CachingAllocator, FaultInjector};
/// use unirt::{Backend, Device};
/// let dev = unirt::open(Device::CPU)?;
/// let faulty = Arc::new(FaultInjector::new(dev.clone(), 1, 2)); // the 1st and 2nd fail
/// let alloc = CachingAllocator::new(faulty.clone());
/// let err = alloc.malloc(4096, dev.default_stream()).unwrap_err();
/// assert_eq!(err.kind_name(), "out_of_memory");
/// assert_eq!(alloc.stats().ooms, 1);
/// assert!(alloc.malloc(4096, dev.default_stream()).is_ok()); // the 3rd succeeds
/// # Ok::<(), unirt::Error>(())
/// ```
pub struct FaultInjector {
    inner: Arc<AnyBackend>,
    first: u64,
    count: u64,
    calls: AtomicU64,
    failed: AtomicU64,
}

impl FaultInjector {
    /// Fails `count` raw allocations starting with the `first`-th (1-based).
    pub fn new(inner: Arc<AnyBackend>, first: u64, count: u64) -> Self {
        FaultInjector {
            inner,
            first,
            count,
            calls: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    /// Raw allocations attempted so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Raw allocations failed on purpose so far.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

impl RawAllocator for FaultInjector {
    fn backend(&self) -> &AnyBackend {
        &self.inner
    }

    fn raw_malloc(&self, bytes: usize) -> Result<DevicePtr> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.first && n - self.first < self.count {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return Err(Error::OutOfMemory {
                backend: super::device_of(&self.inner).kind,
                device: format!("{} (fault injection)", super::device_of(&self.inner)),
                requested: bytes as u64,
                detail: format!("raw allocation #{n} failed on purpose"),
            });
        }
        self.inner.malloc(bytes)
    }

    fn raw_free(&self, ptr: DevicePtr) -> Result<()> {
        self.inner.free(ptr)
    }
}
