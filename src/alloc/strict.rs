//! Strict mode: stale device pointers become typed errors instead of silent aliases.
//!
//! By default a freed block goes straight back into the cache, so a [`DevicePtr`] kept after
//! its [`Memory`](crate::Memory) dropped aliases the next allocation of that size: writes
//! through it land in someone else's buffer and `free(stale)` frees the new owner's block. That
//! is the caller's bug (CUDA behaves the same), but it is hard to find.
//!
//! With `UNIRT_ALLOC_STRICT=1` (read when a device's allocator is created, or
//! [`CachingAllocator::set_strict`]) freed blocks of the device cache go into a *quarantine*
//! first: a FIFO of up to `UNIRT_ALLOC_QUARANTINE_MIB` MiB (default 256) of freed blocks that
//! are neither reused nor merged. While a block is there,
//! - `free` of its address is [`Error::InvalidHandle`] with kind
//!   [`FREED_KIND`] (a double free, or a free through a stale copy of the pointer);
//! - the [`Runtime`](crate::Runtime)'s copies that take raw device pointers
//!   (`memcpy_h2d`, `memcpy_d2h`, `memcpy_d2d`) refuse a range touching it with the same error
//!   ([`CachingAllocator::check_not_freed`]).
//!
//! The oldest blocks leave the quarantine (into the cache, reusable) once it holds more than
//! the limit, when an allocation runs out of memory (before the cache is emptied and the
//! allocation retried) and on [`CachingAllocator::empty_cache`]; a block larger than the whole
//! quarantine passes straight through. Blocks of graph-private pools are not quarantined (their
//! addresses must stay stable for replays anyway). The cost: memory held back (counted as
//! active, not allocated, in the statistics) and one lock per checked copy.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use super::block::BlockState;
use super::pool::{PoolOwner, Released, State};
use super::CachingAllocator;
use crate::error::{Error, Result};
use crate::hal::DevicePtr;

/// Turns strict mode on for allocators created afterwards (`1`, `on`, `true`, `yes`).
pub const STRICT_ENV: &str = "UNIRT_ALLOC_STRICT";
/// The quarantine's size in MiB (default [`DEFAULT_QUARANTINE_MIB`]).
pub const QUARANTINE_ENV: &str = "UNIRT_ALLOC_QUARANTINE_MIB";
/// The default quarantine size, in MiB.
pub const DEFAULT_QUARANTINE_MIB: u64 = 256;
/// The handle kind of the error for a pointer into a quarantined (freed) block.
pub const FREED_KIND: &str = "device pointer (freed; caught by UNIRT_ALLOC_STRICT)";

/// Freed blocks held out of reuse, oldest first: `(block index, address, size)`.
#[derive(Debug, Default)]
pub struct Quarantine {
    blocks: VecDeque<(u32, u64, u64)>,
    bytes: u64,
}

impl Quarantine {
    /// Whether `[addr, addr + len)` touches a quarantined block (`len` 0 counts as 1 byte).
    fn touches(&self, addr: u64, len: u64) -> bool {
        let end = addr.saturating_add(len.max(1));
        self.blocks
            .iter()
            .any(|&(_, a, size)| addr < a.saturating_add(size) && a < end)
    }
}

/// The quarantine limit in bytes that the two variables ask for; `None` is strict mode off.
/// Unknown words for `UNIRT_ALLOC_STRICT` other than the "off" ones (`0`, `off`, `false`,
/// `no`, empty) turn it on; a size that is not a whole number of MiB is the default.
pub fn limit_from(strict: Option<&str>, mib: Option<&str>) -> Option<u64> {
    if !super::switch_on(strict) {
        return None;
    }
    let mib = mib
        .and_then(|m| m.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_QUARANTINE_MIB);
    Some(mib.saturating_mul(1 << 20))
}

/// The limit from the environment (see [`limit_from`]).
pub fn limit_from_env() -> Option<u64> {
    limit_from(
        std::env::var(STRICT_ENV).ok().as_deref(),
        std::env::var(QUARANTINE_ENV).ok().as_deref(),
    )
}

impl State {
    /// In strict mode (`limit` > 0), takes freed block `idx` of the device cache into the
    /// quarantine (evicting the oldest beyond `limit` into the cache) and returns true; false
    /// when the block is to be released as usual.
    pub(super) fn quarantine(&mut self, idx: u32, limit: u64, out: &mut Released) -> bool {
        if limit == 0 {
            return false;
        }
        let Some(pool) = self.blocks.get(idx).map(|b| b.pool) else {
            return false;
        };
        if self.pool_owner(pool) != Some(PoolOwner::DeviceCache) {
            return false;
        }
        let Some(b) = self.blocks.get_mut(idx) else {
            return false;
        };
        b.state = BlockState::Quarantined;
        b.uses.clear();
        let (addr, size) = (b.addr, b.size);
        self.quarantine.blocks.push_back((idx, addr, size));
        self.quarantine.bytes += size;
        while self.quarantine.bytes > limit {
            if !self.evict_oldest(out) {
                break;
            }
        }
        true
    }

    /// Moves the oldest quarantined block into the cache; false when the quarantine is empty.
    fn evict_oldest(&mut self, out: &mut Released) -> bool {
        let Some((idx, _, size)) = self.quarantine.blocks.pop_front() else {
            return false;
        };
        self.quarantine.bytes -= size;
        self.park(idx, out);
        true
    }

    /// Moves every quarantined block into the cache.
    pub(super) fn flush_quarantine(&mut self, out: &mut Released) {
        while self.evict_oldest(out) {}
    }

    /// The error for `addr`, which is not a live block: the strict one when it lies in a
    /// quarantined block, else the plain invalid pointer.
    pub(super) fn not_live(&self, addr: u64) -> Error {
        if self.quarantine.touches(addr, 1) {
            Error::invalid(FREED_KIND, addr)
        } else {
            Error::invalid("device pointer", addr)
        }
    }
}

impl CachingAllocator {
    /// Turns strict mode on with a quarantine of `limit` bytes (`Some`), or off (`None`, which
    /// moves every quarantined block into the cache). See the [module](self) documentation.
    pub fn set_strict(&self, limit: Option<u64>) {
        let limit = limit.map_or(0, |l| l.max(1));
        self.strict.store(limit, Ordering::Relaxed);
        if limit == 0 {
            let mut st = self.state.lock();
            let mut out = Released::new();
            st.flush_quarantine(&mut out);
            st.deferred_raw.extend(out);
        }
    }

    /// The quarantine limit in bytes while strict mode is on.
    pub fn strict(&self) -> Option<u64> {
        match self.strict.load(Ordering::Relaxed) {
            0 => None,
            l => Some(l),
        }
    }

    /// The quarantine limit, 0 when strict mode is off.
    pub(super) fn strict_limit(&self) -> u64 {
        self.strict.load(Ordering::Relaxed)
    }

    /// In strict mode, [`Error::InvalidHandle`] (kind [`FREED_KIND`]) when the device range
    /// `[ptr, ptr + len)` touches a freed block still in the quarantine; otherwise (and always
    /// when strict mode is off) `Ok`. Addresses this allocator never handed out pass: the
    /// backend checks those.
    pub fn check_not_freed(&self, ptr: DevicePtr, len: usize) -> Result<()> {
        if self.strict_limit() == 0 || ptr.is_null() {
            return Ok(());
        }
        if self.state.lock().quarantine.touches(ptr.0, len as u64) {
            return Err(Error::invalid(FREED_KIND, ptr.0));
        }
        Ok(())
    }
}
