//! The allocation table every backend keeps: which address ranges are live allocations.
//!
//! It is what makes unirt's copies, sets, kernel arguments and frees bounds-checked on every
//! vendor: a range must lie inside one live allocation (interior pointers are fine), a free must
//! name the start of one, and a double free or an unknown pointer is an error, not corruption.
//! Lookups are a `BTreeMap` range query under a read lock (tens of nanoseconds).

use std::collections::BTreeMap;

use parking_lot::RwLock;

use crate::error::{Error, Result};
use crate::fork::Epoch;

/// One live allocation: `[base, base + size)` and the backend's own payload (a buffer id on
/// wgpu, nothing on CPU).
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Live allocations of one address space, keyed by base address.
#[derive(Debug)]
pub struct AllocTable<T = ()> {
    what: &'static str,
    /// A table made before a fork answers `Error::Forked` in the child.
    born: Epoch,
    map: RwLock<BTreeMap<u64, Allocation<T>>>,
}

impl<T: Clone> AllocTable<T> {
    /// `what` names the memory in error messages ("device", "pinned host").
    pub fn new(what: &'static str) -> Self {
        AllocTable {
            what,
            born: Epoch::now(),
            map: RwLock::new(BTreeMap::new()),
        }
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

    /// Registers `[base, base + size)`. Overlap with a live allocation is an internal error
    /// (the backend handed out the same address twice).
    pub fn insert(&self, base: u64, size: u64, payload: T) -> Result<()> {
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
        map.insert(
            base,
            Allocation {
                base,
                size,
                payload,
            },
        );
        Ok(())
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
        self.insert(base, size, payload).inspect_err(|_| {
            release(base);
        })
    }

    /// Unregisters the allocation that starts at `base` once `drain` has succeeded: the wait
    /// for pending work that a synchronous free owes (as `cudaFree` does). The pointer is
    /// checked first, so a bad free waits for nothing. The caller releases the memory.
    pub fn retire(&self, base: u64, drain: impl FnOnce() -> Result<()>) -> Result<Allocation<T>> {
        self.get_start(base)?;
        drain()?;
        self.remove(base)
    }

    /// Unregisters the allocation that starts at `base`.
    pub fn remove(&self, base: u64) -> Result<Allocation<T>> {
        self.live()?;
        let mut map = self.map.write();
        if let Some(a) = map.remove(&base) {
            return Ok(a);
        }
        Err(self.not_a_start(&map, base))
    }

    /// The allocation that starts exactly at `base`.
    pub fn get_start(&self, base: u64) -> Result<Allocation<T>> {
        self.live()?;
        let map = self.map.read();
        match map.get(&base) {
            Some(a) => Ok(a.clone()),
            None => Err(self.not_a_start(&map, base)),
        }
    }

    fn not_a_start(&self, map: &BTreeMap<u64, Allocation<T>>, base: u64) -> Error {
        match Self::containing(map, base) {
            Some(a) => Error::BadParam(format!(
                "{base:#x} is inside the {} allocation at {:#x}, not its start",
                self.what, a.base
            )),
            None => Error::invalid("pointer", base),
        }
    }

    fn containing(map: &BTreeMap<u64, Allocation<T>>, addr: u64) -> Option<&Allocation<T>> {
        map.range(..=addr)
            .next_back()
            .map(|(_, a)| a)
            .filter(|a| addr < a.end())
    }

    /// The allocation holding all of `[addr, addr + len)`; `len` may be zero only for an address
    /// inside an allocation.
    pub fn lookup(&self, addr: u64, len: u64) -> Result<Allocation<T>> {
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
    pub fn check_host(&self, addr: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if addr == 0 {
            return Err(Error::NullPointer("host address".into()));
        }
        self.live()?;
        if self.find(addr).is_some() {
            self.lookup(addr, len)?;
        }
        Ok(())
    }

    /// The allocation containing `addr`, if any.
    pub fn find(&self, addr: u64) -> Option<Allocation<T>> {
        Self::containing(&self.map.read(), addr).cloned()
    }

    /// Number of live allocations and their total size.
    pub fn usage(&self) -> (usize, u64) {
        let map = self.map.read();
        (map.len(), map.values().map(|a| a.size).sum())
    }

    /// Removes and returns every allocation (for teardown).
    pub fn drain(&self) -> Vec<Allocation<T>> {
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
}
