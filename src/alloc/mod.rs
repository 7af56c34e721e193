//! The caching device allocator, one implementation for every vendor, above the HAL's raw
//! `malloc` / `free`.
//!
//! - Requests are rounded to 512 bytes. Requests up to 1 MiB come from the *small* pool (2 MiB
//!   segments); larger ones from the *large* pool (20 MiB segments below 10 MiB, a segment of
//!   their own rounded to 2 MiB above).
//! - A cached block is reused only on the stream it was allocated on (work on one stream is
//!   ordered, so the next user runs after the last), best fit, lowest address first; it is split
//!   when the rest is worth keeping, and merged with free neighbours when freed.
//! - A stream that is dropped (a thread's own stream when the thread exits) leaves its cached
//!   segments to the next stream that misses its cache, ordered after the dropped stream's
//!   queued work ([`retire_stream`]).
//! - [`record_stream`](CachingAllocator::record_stream) names other streams that used a block:
//!   at free time an event is recorded on each, and the block is reused only once they all
//!   query complete.
//! - While a graph is recorded ([`begin_private`](CachingAllocator::begin_private), which the
//!   [`Runtime`](crate::Runtime) calls around stream capture), allocations come from a
//!   *graph-private pool*: frees during the recording are reused only inside it, and its
//!   memory stays reserved while any [`PrivatePool`] handle (held by the graph and its
//!   executables) lives, so a replay never writes memory that was handed to someone else — the
//!   stale-address bug of InfiniCore's pin mode.
//! - A failed raw allocation frees the cache and retries once; a second failure is
//!   [`Error::OutOfMemory`] with the statistics in its message.
//!
//! One mutex per device allocator. Free blocks sit in one `BTreeSet` per pool keyed by
//! `(stream, size, addr)` — a size-ordered set per (stream, pool) — and allocated blocks in a
//! hash map keyed by address. In front of the sets, a quick list keeps the last
//! [`QUICK`] freed blocks unmerged (glibc's tcache idea): freeing a block and
//! allocating the same size on the same stream again — the common pattern — is a hit there
//! with no set operation. Any request the quick list cannot serve exactly flushes it, merging
//! every parked block, before the best-fit search, so split and coalesce behave as without it.

mod block;
pub mod exact;
mod fault;
mod host;
mod pool;
mod retire;
mod stats;
pub mod strict;

pub use block::{
    round_size, segment_size, LARGE_DIRECT, LARGE_ROUND, LARGE_SEGMENT, MIN_BLOCK, QUICK,
    SMALL_REQUEST, SMALL_SEGMENT,
};
pub use fault::FaultInjector;
pub use host::PinnedHostPool;
pub use retire::{retire_stream, retire_stream_later};
pub use stats::{HostStats, MemoryStats, Stat};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::hal::{Backend, DevicePtr, EventFlags, EventStatus, StreamId};
use crate::vendors::AnyBackend;
use block::BlockState;
use pool::{Released, State};

/// Whether a debugging switch's value (`UNIRT_ALLOC_STRICT`, `UNIRT_ALLOC_EXACT`) turns it on:
/// any value but the "off" words `0`, `off`, `false`, `no` and the empty one; absent is off.
fn switch_on(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "" | "0" | "off" | "false" | "no"
        )
    })
}

/// Where the allocator gets and returns whole segments: the backend's raw allocation, or a
/// wrapper around it (such as the [`FaultInjector`]).
pub trait RawAllocator: Send + Sync {
    /// The device behind the allocations (events and streams come from it).
    fn backend(&self) -> &AnyBackend;
    /// One raw allocation of `bytes` (> 0) bytes.
    fn raw_malloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// Returns a raw allocation.
    fn raw_free(&self, ptr: DevicePtr) -> Result<()>;
}

impl RawAllocator for AnyBackend {
    fn backend(&self) -> &AnyBackend {
        self
    }

    fn raw_malloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.malloc(bytes)
    }

    fn raw_free(&self, ptr: DevicePtr) -> Result<()> {
        self.free(ptr)
    }
}

/// The device name used in error messages.
pub(crate) fn device_of(b: &AnyBackend) -> Device {
    Device::new(b.kind(), b.info().index)
}

/// What the allocator knows about one allocated block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo {
    pub addr: DevicePtr,
    /// The block's size after rounding (and after an unsplittable remainder was kept).
    pub size: u64,
    pub requested: u64,
    /// The stream whose cache the block returns to when freed: the one it was allocated on,
    /// or, once that stream was dropped, a retired key and then the stream that adopted it
    /// (see [`retire_stream`]).
    pub stream: StreamId,
    /// True for a block of a graph-private pool.
    pub private: bool,
}

/// The caching allocator of one device. Share it as `Arc<CachingAllocator>`.
pub struct CachingAllocator {
    raw: Arc<dyn RawAllocator>,
    device: Device,
    state: Mutex<State>,
    /// The pool of [`set_pin_mode`](Self::set_pin_mode), while pin mode is on.
    pinned: Mutex<Option<Arc<PrivatePool>>>,
    /// Strict mode's quarantine limit in bytes, 0 when off ([`strict`]).
    strict: AtomicU64,
    /// Exact mode: a segment of exactly the requested size per block ([`exact`]).
    exact: AtomicBool,
}

impl CachingAllocator {
    /// An allocator over `raw` (an `Arc<AnyBackend>` or a wrapper of one); strict mode
    /// ([`strict`]) is on when `UNIRT_ALLOC_STRICT` asks for it, exact mode ([`exact`]) when
    /// `UNIRT_ALLOC_EXACT` does.
    pub fn new(raw: Arc<dyn RawAllocator>) -> Arc<Self> {
        let device = device_of(raw.backend());
        let allocator = Arc::new(CachingAllocator {
            raw,
            device,
            state: Mutex::new(State::default()),
            pinned: Mutex::new(None),
            strict: AtomicU64::new(strict::limit_from_env().map_or(0, |l| l.max(1))),
            exact: AtomicBool::new(exact::from_env()),
        });
        retire::register(&allocator);
        allocator
    }

    /// The device this allocator serves.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The backend behind it.
    pub fn backend(&self) -> &AnyBackend {
        self.raw.backend()
    }

    /// `bytes` bytes usable by work on `stream`. Zero bytes gives [`DevicePtr::NULL`].
    pub fn malloc(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let requested = bytes as u64;
        // Exact mode: the block is the request, in a segment of its own, reused only at its size.
        let exact = self.exact.load(Ordering::Relaxed);
        let size = if exact {
            requested
        } else {
            round_size(requested).ok_or_else(|| self.too_large(requested))?
        };
        let mut st = self.state.lock();
        if !st.pending.is_empty() {
            self.process_events(&mut st, false);
        }
        let pool = st.pool_for(size);
        if let Some(a) = st.take_quick(pool, stream.0, size, requested) {
            return self.checked(a);
        }
        if !st.quick.is_empty() {
            let mut out = Released::new();
            st.flush_quick(&mut out);
            st.deferred_raw.extend(out);
        }
        if let Some(a) = st.take_free(pool, stream.0, size, requested, exact) {
            return self.checked(a);
        }
        // Segments of destroyed streams (see `retire`) before a new one.
        if !st.retiring.is_empty()
            && st.recording.is_none()
            && self.adopt_retired(&mut st, stream.0)
        {
            if let Some(a) = st.take_free(pool, stream.0, size, requested, exact) {
                return self.checked(a);
            }
        }
        let seg = if exact {
            size
        } else {
            segment_size(size).ok_or_else(|| self.too_large(requested))?
        };
        let seg_usize = usize::try_from(seg).map_err(|_| self.too_large(requested))?;
        let first = match self.raw.raw_malloc(seg_usize) {
            Ok(p) => {
                return self.checked(st.add_segment(pool, stream.0, p.0, seg, size, requested))
            }
            Err(e @ Error::OutOfMemory { .. }) => e,
            Err(e) => return Err(e),
        };
        // Out of memory: wait for blocks other streams still use, give the whole cache back,
        // and try once more.
        st.stats.retries += 1;
        self.process_events(&mut st, true);
        let mut out = take_deferred_raw(&mut st);
        st.flush_quarantine(&mut out);
        st.drain_cache(&mut out);
        drop(st);
        self.free_raw(out);
        let mut st = self.state.lock();
        let pool = st.pool_for(size);
        if let Some(a) = st.take_free(pool, stream.0, size, requested, exact) {
            return self.checked(a);
        }
        match self.raw.raw_malloc(seg_usize) {
            Ok(p) => self.checked(st.add_segment(pool, stream.0, p.0, seg, size, requested)),
            Err(Error::OutOfMemory { detail, .. }) => {
                st.stats.ooms += 1;
                Err(Error::OutOfMemory {
                    backend: self.device.kind,
                    device: self.device.to_string(),
                    requested,
                    detail: format!(
                        "a {seg} B segment failed after freeing the cache ({detail}; first \
                         attempt: {first}); allocator: {}",
                        st.stats
                    ),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// A block address from the state; zero would mean broken book-keeping, reported instead
    /// of handed out as a null pointer.
    fn checked(&self, addr: u64) -> Result<DevicePtr> {
        if addr == 0 {
            return Err(Error::Internal(format!(
                "{}: the caching allocator lost track of a block",
                self.device
            )));
        }
        Ok(DevicePtr(addr))
    }

    fn too_large(&self, requested: u64) -> Error {
        Error::TooLarge {
            device: self.device.to_string(),
            requested,
            limit: isize::MAX as u64,
        }
    }

    /// Returns a block. Reuse waits for the streams named by
    /// [`record_stream`](Self::record_stream). Null is a no-op; a pointer this allocator did
    /// not hand out (or already took back) is [`Error::InvalidHandle`] — in strict mode
    /// ([`strict`]) with kind [`strict::FREED_KIND`] while the block is quarantined.
    pub fn free(&self, ptr: DevicePtr) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let mut st = self.state.lock();
        let Some(idx) = st.unlive(ptr.0) else {
            return Err(st.not_live(ptr.0));
        };
        let uses = match st.blocks.get_mut(idx) {
            Some(b) if !b.uses.is_empty() => std::mem::take(&mut b.uses),
            _ => Vec::new(),
        };
        let mut out = take_deferred_raw(&mut st);
        if uses.is_empty() {
            if !st.quarantine(idx, self.strict_limit(), &mut out) {
                st.park(idx, &mut out);
            }
        } else if st.in_recording_pool(idx) {
            // Events recorded now would be captured into the graph, not run; keep the block
            // out of reuse until its pool goes.
            if let Some(b) = st.blocks.get_mut(idx) {
                b.state = BlockState::Retired;
            }
        } else {
            self.defer(&mut st, idx, &uses, &mut out);
        }
        drop(st);
        self.free_raw(out);
        Ok(())
    }

    /// Records an event on each stream in `uses`; the block becomes free when all complete.
    fn defer(&self, st: &mut State, idx: u32, uses: &[u64], out: &mut Released) {
        let b = self.raw.backend();
        let mut n = 0;
        for &s in uses {
            let ev = match st.spare_events.pop() {
                Some(e) => Ok(e),
                None => b.event_create(EventFlags::DISABLE_TIMING),
            };
            match ev.and_then(|e| b.event_record(e, StreamId(s)).map(|_| e)) {
                Ok(e) => {
                    st.pending.push((e, idx));
                    n += 1;
                }
                // The stream is gone or the event failed: wait for the whole device instead,
                // which covers whatever that stream had enqueued.
                Err(_) => {
                    let _ = b.synchronize();
                }
            }
        }
        match st.blocks.get_mut(idx) {
            Some(blk) if n > 0 => {
                blk.state = BlockState::Pending;
                blk.pending = n;
            }
            _ => st.release_block(idx, out),
        }
    }

    /// Frees blocks whose events have completed (all of them, waiting, when `wait`).
    fn process_events(&self, st: &mut State, wait: bool) {
        let b = self.raw.backend();
        let pending = std::mem::take(&mut st.pending);
        let mut out = Released::new();
        for (ev, idx) in pending {
            let done = if wait {
                // Errors count as done, as below.
                let _ = b.event_synchronize(ev);
                true
            } else {
                // An error (a lost device) counts as done: nothing will ever complete it.
                !matches!(b.event_query(ev), Ok(EventStatus::NotReady))
            };
            if !done {
                st.pending.push((ev, idx));
                continue;
            }
            st.spare_events.push(ev);
            let last = match st.blocks.get_mut(idx) {
                Some(blk) => {
                    blk.pending = blk.pending.saturating_sub(1);
                    blk.pending == 0
                }
                None => false,
            };
            if last && !st.quarantine(idx, self.strict_limit(), &mut out) {
                st.release_block(idx, &mut out);
            }
        }
        // Only released private pools produce raw frees here; the lock is held, so they wait
        // in a side list for the next caller that frees raw memory.
        st.deferred_raw.extend(out);
    }

    /// Marks `ptr` (an allocated block, or an address inside one) as used by work on `stream`,
    /// so that its reuse after [`free`](Self::free) waits for that work.
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        let mut st = self.state.lock();
        let idx = *st
            .live
            .get(&ptr.0)
            .ok_or_else(|| Error::invalid("device pointer", ptr.0))?;
        if let Some(b) = st.blocks.get_mut(idx) {
            if b.stream != stream.0 && !b.uses.contains(&stream.0) {
                b.uses.push(stream.0);
            }
        }
        Ok(())
    }

    /// Returns every cached, wholly free segment to the backend. Blocks in use, blocks waiting
    /// on streams and live graph-private pools stay; strict mode's quarantine is emptied first.
    pub fn empty_cache(&self) -> Result<()> {
        let mut st = self.state.lock();
        self.process_events(&mut st, false);
        let mut out = take_deferred_raw(&mut st);
        st.flush_quarantine(&mut out);
        st.drain_cache(&mut out);
        drop(st);
        self.free_raw_checked(out)
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> MemoryStats {
        self.state.lock().stats
    }

    /// Sets every peak statistic to its current value.
    pub fn reset_peak(&self) {
        self.state.lock().stats.reset_peak()
    }

    /// What the allocator knows about the allocated block starting at `ptr`.
    pub fn block(&self, ptr: DevicePtr) -> Option<BlockInfo> {
        let st = self.state.lock();
        let idx = *st.live.get(&ptr.0)?;
        let b = st.blocks.get(idx)?;
        let private = matches!(
            st.pools
                .get(b.pool as usize)
                .and_then(|p| p.as_ref())
                .map(|p| p.owner),
            Some(pool::PoolOwner::Private(_))
        );
        Some(BlockInfo {
            addr: DevicePtr(b.addr),
            size: b.size,
            requested: b.requested,
            stream: StreamId(b.stream),
            private,
        })
    }

    /// Starts routing every allocation into a new graph-private pool. The pool stays reserved
    /// while the returned handle (or a clone) lives. [`Error::Capturing`] if a private pool is
    /// already recording on this device.
    pub fn begin_private(self: &Arc<Self>) -> Result<Arc<PrivatePool>> {
        let mut st = self.state.lock();
        if st.recording.is_some() {
            return Err(Error::Capturing(format!(
                "{}: a graph-private pool is already recording",
                self.device
            )));
        }
        let id = st.new_private();
        st.recording = Some(id);
        Ok(Arc::new(PrivatePool {
            alloc: self.clone(),
            id,
        }))
    }

    /// Stops routing allocations into `pool` (which stays reserved while handles live).
    pub fn end_private(&self, pool: &PrivatePool) {
        let mut st = self.state.lock();
        if st.recording == Some(pool.id) {
            st.recording = None;
        }
    }

    /// Whether allocations go to a graph-private pool now.
    pub fn is_recording(&self) -> bool {
        self.state.lock().recording.is_some()
    }

    /// InfiniCore's `set_pin_mode`: `true` starts a private pool (as [`begin_private`]);
    /// `false` stops it and hands back the pool, which stays reserved until the handle drops —
    /// keep it as long as anything may replay the addresses handed out meanwhile. Switching to
    /// the mode already in effect is a no-op returning `None`.
    ///
    /// [`begin_private`]: Self::begin_private
    ///
    /// While pin mode is on, the allocator holds the pool (and the pool the allocator).
    pub fn set_pin_mode(self: &Arc<Self>, pinned: bool) -> Result<Option<Arc<PrivatePool>>> {
        let mut held = self.pinned.lock();
        match (pinned, held.is_some()) {
            (true, false) => {
                *held = Some(self.begin_private()?);
                Ok(None)
            }
            (false, true) => {
                let pool = held.take();
                if let Some(p) = &pool {
                    self.end_private(p);
                }
                Ok(pool)
            }
            _ => Ok(None),
        }
    }

    fn release_private(&self, id: u64) {
        let mut st = self.state.lock();
        let mut out = take_deferred_raw(&mut st);
        st.release_private(id, &mut out);
        drop(st);
        self.free_raw(out);
    }

    /// Raw frees, errors ignored (used on paths that must not fail: drop, retry).
    fn free_raw(&self, segs: Released) {
        let _ = self.free_raw_checked(segs);
    }

    /// Raw frees; a segment the backend failed to free (a driver error) is kept in the
    /// deferred list, retried by the next caller that frees raw memory and at drop, instead
    /// of being forgotten while the backend still holds it.
    fn free_raw_checked(&self, segs: Released) -> Result<()> {
        let mut first = Ok(());
        let mut failed = Released::new();
        for (addr, size) in segs {
            if let Err(e) = self.raw.raw_free(DevicePtr(addr)) {
                first = first.and(Err(e));
                failed.push((addr, size));
            }
        }
        if !failed.is_empty() {
            self.state.lock().deferred_raw.extend(failed);
        }
        first
    }
}

fn take_deferred_raw(st: &mut State) -> Released {
    std::mem::take(&mut st.deferred_raw)
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        // Nobody holds a block handle any more (they keep the allocator alive), so every
        // segment goes back; pointers from the raw `malloc` API die with the allocator.
        let st = self.state.get_mut();
        let b = self.raw.backend();
        for (ev, _) in st.pending.drain(..) {
            let _ = b.event_synchronize(ev);
            let _ = b.event_destroy(ev);
        }
        for ev in st.spare_events.drain(..) {
            let _ = b.event_destroy(ev);
        }
        for ev in st.retiring.drain(..).filter_map(|r| r.event) {
            let _ = b.event_synchronize(ev);
            let _ = b.event_destroy(ev);
        }
        let mut segs = st.all_segments();
        segs.append(&mut st.deferred_raw);
        for (addr, _) in segs {
            let _ = self.raw.raw_free(DevicePtr(addr));
        }
    }
}

/// A graph-private pool: while any handle lives its memory stays reserved; when the last one
/// drops, its free segments go back to the backend (segments with live blocks follow when the
/// blocks are freed).
pub struct PrivatePool {
    alloc: Arc<CachingAllocator>,
    id: u64,
}

impl PrivatePool {
    /// The pool's id (unique per allocator).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The allocator it belongs to.
    pub fn allocator(&self) -> &Arc<CachingAllocator> {
        &self.alloc
    }
}

impl Drop for PrivatePool {
    fn drop(&mut self) {
        self.alloc.release_private(self.id);
    }
}

impl std::fmt::Debug for PrivatePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PrivatePool({} on {})", self.id, self.alloc.device)
    }
}

#[cfg(test)]
mod tests;
