//! The allocation table every backend keeps: which address ranges are live allocations.
//!
//! It is what makes unirt's copies, sets, kernel arguments and frees bounds-checked on every
//! vendor: a range must lie inside one live allocation (interior pointers are fine), a free must
//! name the start of one, and a double free or an unknown pointer is an error, not corruption.
//! Lookups are a `BTreeMap` range query under a read lock (tens of nanoseconds).
//!
//! The table holds each allocation as an [`AllocRef`], a counted reference, and every lookup
//! hands out another one. Holding it keeps the allocation — its payload, and with payloads that
//! own their memory (the CPU backend's [`HostBlock`](crate::hostmem::HostBlock)) the memory
//! itself — alive: an operation that holds the references of what it touches can never see its
//! memory released under it, whoever frees it meanwhile. Removing an allocation only makes the
//! address dead for new work; the memory goes when the last reference drops.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::RwLock;

use crate::error::{Error, Result};
use crate::fork::Epoch;

/// One allocation: `[base, base + size)` and the backend's own payload (a wgpu buffer, the
/// host memory on CPU).
#[derive(Debug, PartialEq, Eq)]
pub struct Allocation<T = ()> {
    pub base: u64,
    pub size: u64,
    pub payload: T,
}

impl<T> Allocation<T> {
    pub fn end(&self) -> u64 {
        self.base + self.size
    }
}

/// A counted reference to one allocation; see the module docs.
pub type AllocRef<T = ()> = Arc<Allocation<T>>;

/// A range remembered for later use (a captured graph's operands) with the allocation it lay
/// in, so that a later [`AllocTable::recheck`] tells "still that allocation" from "freed, and
/// the address handed out anew" — which an address-only lookup cannot. The weak reference keeps
/// the allocation's record from being reused for a new one, so the comparison is exact.
#[derive(Debug)]
pub struct RecordedRange<T> {
    pub addr: u64,
    pub len: u64,
    was: Weak<Allocation<T>>,
}

impl<T> Clone for RecordedRange<T> {
    fn clone(&self) -> Self {
        RecordedRange {
            addr: self.addr,
            len: self.len,
            was: self.was.clone(),
        }
    }
}

/// Live allocations of one address space, keyed by base address.
#[derive(Debug)]
pub struct AllocTable<T = ()> {
    what: &'static str,
    /// A table made before a fork answers `Error::Forked` in the child.
    born: Epoch,
    map: Arc<Entries<T>>,
}

/// A table's allocations, shared with the registry of device memory the host cannot touch
/// ([`not_host_owner`]).
#[derive(Debug)]
struct Entries<T> {
    map: RwLock<BTreeMap<u64, AllocRef<T>>>,
    span: Arc<Span>,
}

/// The span `[lo, hi)` of every allocation a table ever held, so that the registry passes over
/// an address outside it with two loads (and no reference count touched).
#[derive(Debug)]
struct Span {
    lo: AtomicU64,
    hi: AtomicU64,
}

impl Span {
    fn may_hold(&self, addr: u64, end: u64) -> bool {
        end > self.lo.load(Ordering::Acquire) && addr < self.hi.load(Ordering::Acquire)
    }
}

impl<T> std::ops::Deref for Entries<T> {
    type Target = RwLock<BTreeMap<u64, AllocRef<T>>>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

/// What the registry asks of a table whatever its payload.
trait Overlaps: Send + Sync {
    fn overlaps(&self, addr: u64, len: u64) -> bool;
}

impl<T: Send + Sync> Overlaps for Entries<T> {
    fn overlaps(&self, addr: u64, len: u64) -> bool {
        let end = addr.saturating_add(len.max(1));
        let map = self.map.read();
        map.range(..end)
            .next_back()
            .is_some_and(|(_, a)| a.end() > addr)
    }
}

/// One table of the registry: its device, its span, its allocations while it lives.
type NotHostEntry = (String, Arc<Span>, Weak<dyn Overlaps>);

/// Device memory the host cannot touch — wgpu's virtual addresses, CUDA's device memory — of
/// every table marked so ([`AllocTable::mark_not_host`]).
static NOT_HOST: parking_lot::RwLock<Vec<NotHostEntry>> = parking_lot::const_rwlock(Vec::new());
/// Set once a table is marked: a process with only host-memory devices takes no lock.
static ANY_NOT_HOST: AtomicBool = AtomicBool::new(false);

/// The device whose memory (a live allocation the host cannot touch) overlaps
/// `[addr, addr + len)`, when one does: an address a backend would otherwise take for host
/// memory and dereference on the CPU — another device's pointer handed over as the host side
/// of a copy, which would crash the process (wgpu's addresses are not mapped at all).
pub fn not_host_owner(addr: u64, len: u64) -> Option<String> {
    if !ANY_NOT_HOST.load(Ordering::Acquire) {
        return None;
    }
    let end = addr.saturating_add(len.max(1));
    NOT_HOST
        .read()
        .iter()
        .find(|(_, span, t)| {
            span.may_hold(addr, end) && t.upgrade().is_some_and(|t| t.overlaps(addr, len))
        })
        .map(|(name, _, _)| name.clone())
}

impl<T> AllocTable<T> {
    /// `what` names the memory in error messages ("device", "pinned host").
    pub fn new(what: &'static str) -> Self {
        AllocTable {
            what,
            born: Epoch::now(),
            map: Arc::new(Entries {
                map: RwLock::new(BTreeMap::new()),
                span: Arc::new(Span {
                    lo: AtomicU64::new(u64::MAX),
                    hi: AtomicU64::new(0),
                }),
            }),
        }
    }

    /// Enters this table in the registry of device memory the host cannot touch, as
    /// `device`'s ([`not_host_owner`]); tables dropped since are pruned here.
    pub fn mark_not_host(&self, device: &str)
    where
        T: Send + Sync + 'static,
    {
        let entries: Arc<dyn Overlaps> = self.map.clone();
        let mut reg = NOT_HOST.write();
        reg.retain(|(_, _, t)| t.strong_count() > 0);
        reg.push((
            device.to_string(),
            self.map.span.clone(),
            Arc::downgrade(&entries),
        ));
        ANY_NOT_HOST.store(true, Ordering::Release);
    }

    /// `Ok` unless the table was made before a fork that made this process (one atomic load).
    #[inline]
    fn live(&self) -> Result<()> {
        if self.born.is_current() {
            Ok(())
        } else {
            Err(crate::fork::forked(&format!("{} memory", self.what)))
        }
    }

    /// What the table holds, for error messages ("device", "pinned host").
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// Registers `[base, base + size)`. Overlap with a live allocation is an internal error
    /// (the backend handed out the same address twice); the payload is dropped then.
    pub fn insert(&self, base: u64, size: u64, payload: T) -> Result<AllocRef<T>> {
        self.live()?;
        let mut map = self.map.write();
        let end = base
            .checked_add(size)
            .ok_or_else(|| Error::Internal(format!("allocation at {base:#x} wraps")))?;
        if let Some((_, prev)) = map.range(..end).next_back() {
            if prev.end() > base {
                return Err(Error::Internal(format!(
                    "{} allocation [{base:#x}, {end:#x}) overlaps a live one at {:#x}",
                    self.what, prev.base
                )));
            }
        }
        let a = Arc::new(Allocation {
            base,
            size,
            payload,
        });
        map.insert(base, a.clone());
        self.map.span.lo.fetch_min(base, Ordering::AcqRel);
        self.map.span.hi.fetch_max(end, Ordering::AcqRel);
        Ok(a)
    }

    /// Registers memory the backend has just acquired. If registration fails, `release` hands
    /// the memory back, so a failed allocation call leaks nothing.
    pub fn adopt<R>(
        &self,
        base: u64,
        size: u64,
        payload: T,
        release: impl FnOnce(u64) -> R,
    ) -> Result<()> {
        self.insert(base, size, payload)
            .map(|_| ())
            .inspect_err(|_| {
                release(base);
            })
    }

    /// Unregisters the allocation that starts at `base` once `drain` has succeeded: the wait
    /// for pending work that a synchronous free owes (as `cudaFree` does). The pointer is
    /// checked first, so a bad free waits for nothing. The caller releases the memory.
    pub fn retire(&self, base: u64, drain: impl FnOnce() -> Result<()>) -> Result<AllocRef<T>> {
        self.get_start(base)?;
        drain()?;
        self.remove(base)
    }

    /// Unregisters the allocation that starts at `base`: the address is dead for new work at
    /// once. The allocation itself lives while the returned reference, or one an operation in
    /// flight holds, does.
    pub fn remove(&self, base: u64) -> Result<AllocRef<T>> {
        self.live()?;
        let mut map = self.map.write();
        if let Some(a) = map.remove(&base) {
            return Ok(a);
        }
        Err(self.not_a_start(&map, base))
    }

    /// The allocation that starts exactly at `base`.
    pub fn get_start(&self, base: u64) -> Result<AllocRef<T>> {
        self.live()?;
        let map = self.map.read();
        match map.get(&base) {
            Some(a) => Ok(a.clone()),
            None => Err(self.not_a_start(&map, base)),
        }
    }

    fn not_a_start(&self, map: &BTreeMap<u64, AllocRef<T>>, base: u64) -> Error {
        match Self::containing(map, base) {
            Some(a) => Error::BadParam(format!(
                "{base:#x} is inside the {} allocation at {:#x}, not its start",
                self.what, a.base
            )),
            None => Error::invalid("pointer", base),
        }
    }

    fn containing(map: &BTreeMap<u64, AllocRef<T>>, addr: u64) -> Option<&AllocRef<T>> {
        map.range(..=addr)
            .next_back()
            .map(|(_, a)| a)
            .filter(|a| addr < a.end())
    }

    /// The allocation holding all of `[addr, addr + len)`; `len` may be zero only for an address
    /// inside an allocation. The reference keeps it alive while the caller uses the range.
    pub fn lookup(&self, addr: u64, len: u64) -> Result<AllocRef<T>> {
        self.live()?;
        let map = self.map.read();
        let a = Self::containing(&map, addr).ok_or_else(|| Error::OutOfBounds {
            addr,
            len,
            detail: format!("is not in any live {} allocation", self.what),
        })?;
        match addr.checked_add(len) {
            Some(end) if end <= a.end() => Ok(a.clone()),
            _ => Err(Error::OutOfBounds {
                addr,
                len,
                detail: format!(
                    "runs past the end of the {} allocation [{:#x}, +{})",
                    self.what, a.base, a.size
                ),
            }),
        }
    }

    /// Checks the host side of a copy: non-null, and in bounds when it starts inside one of this
    /// table's allocations (a backend's pinned-host memory). Other host memory cannot be
    /// checked; it is the caller's promise (`memcpy` is unsafe). Empty ranges are fine.
    /// Returns the allocation when the range is in one, to be held while the copy runs.
    pub fn check_host(&self, addr: u64, len: u64) -> Result<Option<AllocRef<T>>> {
        if len == 0 {
            return Ok(None);
        }
        if addr == 0 {
            return Err(Error::NullPointer("host address".into()));
        }
        self.live()?;
        if self.find(addr).is_some() {
            return self.lookup(addr, len).map(Some);
        }
        Ok(None)
    }

    /// The allocation containing `addr`, if any.
    pub fn find(&self, addr: u64) -> Option<AllocRef<T>> {
        Self::containing(&self.map.read(), addr).cloned()
    }

    /// The allocation holding `[addr, addr + len)` again, refused unless it is still the very
    /// allocation `was` named (a graph's buffers at replay): freed since, or freed and its
    /// address handed out anew, is `OutOfBounds`.
    pub fn relookup(&self, addr: u64, len: u64, was: &Weak<Allocation<T>>) -> Result<AllocRef<T>> {
        let now = self.lookup(addr, len).map_err(|e| match e {
            Error::OutOfBounds { addr, len, .. } => Error::OutOfBounds {
                addr,
                len,
                detail: format!("was freed since it was recorded ({} memory)", self.what),
            },
            e => e,
        })?;
        if !std::ptr::eq(Arc::as_ptr(&now), was.as_ptr()) {
            return Err(Error::OutOfBounds {
                addr,
                len,
                detail: format!(
                    "was freed since it was recorded; the address now names another {} \
                     allocation",
                    self.what
                ),
            });
        }
        Ok(now)
    }

    /// Remembers `[addr, addr + len)` together with the allocation it lies in now (none: the
    /// record never passes [`recheck`](Self::recheck)).
    pub fn record(&self, addr: u64, len: u64) -> RecordedRange<T> {
        RecordedRange {
            addr,
            len,
            was: self
                .find(addr)
                .map(|a| Arc::downgrade(&a))
                .unwrap_or_default(),
        }
    }

    /// The recorded range again, refused unless it still lies in the very allocation it was
    /// recorded in ([`relookup`](Self::relookup)).
    pub fn recheck(&self, r: &RecordedRange<T>) -> Result<AllocRef<T>> {
        self.relookup(r.addr, r.len, &r.was)
    }

    /// Number of live allocations and their total size.
    pub fn usage(&self) -> (usize, u64) {
        let map = self.map.read();
        (map.len(), map.values().map(|a| a.size).sum())
    }

    /// Removes and returns every allocation (for teardown).
    pub fn drain(&self) -> Vec<AllocRef<T>> {
        std::mem::take(&mut *self.map.write())
            .into_values()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interior_and_bounds() -> Result<()> {
        let t: AllocTable = AllocTable::new("device");
        t.insert(0x1000, 0x100, ())?;
        t.insert(0x2000, 0x10, ())?;
        assert!(t.lookup(0x1000, 0x100).is_ok());
        assert!(t.lookup(0x10ff, 1).is_ok());
        assert!(matches!(
            t.lookup(0x10ff, 2),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            t.lookup(0x1100, 1),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(t.lookup(0xfff, 1), Err(Error::OutOfBounds { .. })));
        assert!(matches!(
            t.lookup(u64::MAX, 2),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(t.remove(0x1001), Err(Error::BadParam(_))));
        assert!(t.insert(0x10f0, 0x20, ()).is_err());
        t.remove(0x1000)?;
        assert!(matches!(t.remove(0x1000), Err(Error::InvalidHandle { .. })));
        assert_eq!(t.usage(), (1, 0x10));
        Ok(())
    }

    #[test]
    fn references_outlive_removal_and_relookup_names_the_same_allocation() -> Result<()> {
        let t: AllocTable<Vec<u8>> = AllocTable::new("device");
        let a = t.insert(0x1000, 0x100, vec![7])?;
        let held = t.lookup(0x1010, 4)?;
        let weak = Arc::downgrade(&a);
        drop(a);
        assert!(t.relookup(0x1010, 4, &weak).is_ok());
        t.remove(0x1000)?;
        // The table's reference is gone; the holder's keeps the payload alive.
        assert_eq!(held.payload, vec![7]);
        assert!(matches!(
            t.relookup(0x1010, 4, &weak),
            Err(Error::OutOfBounds { .. })
        ));
        // The same address handed out again is another allocation.
        t.insert(0x1000, 0x100, vec![8])?;
        assert!(matches!(
            t.relookup(0x1010, 4, &weak),
            Err(Error::OutOfBounds { .. })
        ));
        drop(held);
        assert!(weak.upgrade().is_none());
        Ok(())
    }

    /// A table marked as memory the host cannot touch is found by any address in a live
    /// allocation, not by one past it or freed, and not once the table is gone.
    #[test]
    fn memory_the_host_cannot_touch_is_found_by_address() -> Result<()> {
        // An address no other test's table uses (the registry is process-wide).
        let base = 0x3f00_0000_0000u64;
        let t: AllocTable = AllocTable::new("device");
        t.mark_not_host("test:7");
        t.insert(base, 4096, ())?;
        t.insert(base + 8192, 4096, ())?;
        assert_eq!(not_host_owner(base + 10, 4).as_deref(), Some("test:7"));
        // A range that starts before the allocation and runs into it.
        assert_eq!(not_host_owner(base - 8, 16).as_deref(), Some("test:7"));
        assert_eq!(not_host_owner(base + 4096, 4096), None);
        assert_eq!(not_host_owner(base - 8, 8), None);
        t.remove(base + 8192)?;
        assert_eq!(not_host_owner(base + 8200, 4), None);
        drop(t);
        assert_eq!(not_host_owner(base + 10, 4), None);
        Ok(())
    }
}
