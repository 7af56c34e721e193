//! The pinned host pool: a caching allocator for [`Backend::malloc_host`] memory.
//!
//! Pinned allocations are expensive (page locking, driver registration), and an async copy may
//! still read a buffer after the host code is done with it. Blocks are sized in powers of two
//! (at least 512 B) and cached per size; a block used by streams (recorded with
//! [`record_stream`](PinnedHostPool::record_stream), which the context's async copies do for
//! you) is reused only after an event recorded on each of those streams at free time completes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use super::stats::HostStats;
use crate::error::{Error, Result};
use crate::hal::{Backend, EventFlags, EventId, EventStatus, HostPtr, StreamId};
use crate::vendors::AnyBackend;

#[derive(Debug)]
struct HostBlock {
    size: u64,
    allocated: bool,
    uses: Vec<u64>,
    pending: u32,
}

#[derive(Debug, Default)]
struct HostState {
    /// Every block the pool owns, by address (interior lookups for `record_stream`).
    blocks: BTreeMap<u64, HostBlock>,
    /// Free blocks by size.
    free: HashMap<u64, Vec<u64>>,
    pending: Vec<(EventId, u64)>,
    spare_events: Vec<EventId>,
    stats: HostStats,
}

/// The caching pinned-host allocator of one device.
pub struct PinnedHostPool {
    backend: Arc<AnyBackend>,
    state: Mutex<HostState>,
}

impl PinnedHostPool {
    pub fn new(backend: Arc<AnyBackend>) -> Arc<Self> {
        Arc::new(PinnedHostPool {
            backend,
            state: Mutex::new(HostState::default()),
        })
    }

    /// The size class of a request: the next power of two, at least 512 B.
    pub fn class_of(bytes: u64) -> Option<u64> {
        bytes.max(512).checked_next_power_of_two()
    }

    /// `bytes` bytes of pinned host memory. Zero bytes gives [`HostPtr::NULL`].
    pub fn malloc(&self, bytes: usize) -> Result<HostPtr> {
        if bytes == 0 {
            return Ok(HostPtr::NULL);
        }
        let size = Self::class_of(bytes as u64).ok_or_else(|| Error::TooLarge {
            device: "pinned host".into(),
            requested: bytes as u64,
            limit: 1 << 63,
        })?;
        let mut st = self.state.lock();
        if !st.pending.is_empty() {
            self.process_events(&mut st);
        }
        if let Some(addr) = st.free.get_mut(&size).and_then(|v| v.pop()) {
            if let Some(b) = st.blocks.get_mut(&addr) {
                b.allocated = true;
            }
            st.stats.cache_hits += 1;
            st.stats.allocated_bytes.add(size);
            return Ok(HostPtr(addr));
        }
        let p = match self.backend.malloc_host(size as usize) {
            Ok(p) => p,
            Err(Error::OutOfMemory { .. }) => {
                // Give back what is cached and try once more.
                let segs = Self::drain(&mut st);
                drop(st);
                let _ = self.free_all(segs);
                let p = self.backend.malloc_host(size as usize)?;
                st = self.state.lock();
                p
            }
            Err(e) => return Err(e),
        };
        st.blocks.insert(
            p.0,
            HostBlock {
                size,
                allocated: true,
                uses: Vec::new(),
                pending: 0,
            },
        );
        st.stats.cache_misses += 1;
        st.stats.reserved_bytes.add(size);
        st.stats.allocated_bytes.add(size);
        Ok(p)
    }

    /// Marks the block holding `addr` (any address inside it) as used by work on `stream`.
    /// Addresses outside the pool are ignored (`false`): callers may pass any host buffer.
    pub fn record_stream(&self, addr: u64, stream: StreamId) -> bool {
        let mut st = self.state.lock();
        let Some((&base, b)) = st.blocks.range_mut(..=addr).next_back() else {
            return false;
        };
        // The block found starts at or below addr; it must also contain it.
        let contains = b.allocated && addr < base + b.size;
        if contains && !b.uses.contains(&stream.0) {
            b.uses.push(stream.0);
        }
        contains
    }

    /// Whether `addr` lies in a block of this pool that is allocated now.
    pub fn contains(&self, addr: u64) -> bool {
        let st = self.state.lock();
        st.blocks
            .range(..=addr)
            .next_back()
            .is_some_and(|(base, b)| b.allocated && addr < base + b.size)
    }

    /// Returns a block. Null is a no-op; anything else not handed out is an error.
    pub fn free(&self, ptr: HostPtr) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let mut st = self.state.lock();
        let (size, uses) = match st.blocks.get_mut(&ptr.0) {
            Some(b) if b.allocated => {
                b.allocated = false;
                (b.size, std::mem::take(&mut b.uses))
            }
            _ => return Err(Error::invalid("pinned host pointer", ptr.0)),
        };
        st.stats.allocated_bytes.sub(size);
        let mut n = 0;
        for s in uses {
            let ev = match st.spare_events.pop() {
                Some(e) => Ok(e),
                None => self.backend.event_create(EventFlags::DISABLE_TIMING),
            };
            match ev.and_then(|e| self.backend.event_record(e, StreamId(s)).map(|_| e)) {
                Ok(e) => {
                    st.pending.push((e, ptr.0));
                    n += 1;
                }
                Err(_) => {
                    let _ = self.backend.synchronize();
                }
            }
        }
        if n == 0 {
            st.free.entry(size).or_default().push(ptr.0);
        } else if let Some(b) = st.blocks.get_mut(&ptr.0) {
            b.pending = n;
        }
        Ok(())
    }

    fn process_events(&self, st: &mut HostState) {
        for (ev, addr) in std::mem::take(&mut st.pending) {
            if matches!(self.backend.event_query(ev), Ok(EventStatus::NotReady)) {
                st.pending.push((ev, addr));
                continue;
            }
            st.spare_events.push(ev);
            let free_size = match st.blocks.get_mut(&addr) {
                Some(b) => {
                    b.pending = b.pending.saturating_sub(1);
                    (b.pending == 0).then_some(b.size)
                }
                None => None,
            };
            if let Some(size) = free_size {
                st.free.entry(size).or_default().push(addr);
            }
        }
    }

    fn drain(st: &mut HostState) -> Vec<u64> {
        let mut out = Vec::new();
        for (_, v) in st.free.drain() {
            out.extend(v);
        }
        for a in &out {
            if let Some(b) = st.blocks.remove(a) {
                st.stats.reserved_bytes.sub(b.size);
            }
        }
        out
    }

    fn free_all(&self, addrs: Vec<u64>) -> Result<()> {
        let mut first = Ok(());
        for a in addrs {
            if let Err(e) = self.backend.free_host(HostPtr(a)) {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Returns every cached free block to the backend.
    pub fn empty_cache(&self) -> Result<()> {
        let mut st = self.state.lock();
        self.process_events(&mut st);
        let segs = Self::drain(&mut st);
        drop(st);
        self.free_all(segs)
    }

    pub fn stats(&self) -> HostStats {
        self.state.lock().stats
    }
}

impl Drop for PinnedHostPool {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        for (ev, _) in st.pending.drain(..) {
            let _ = self.backend.event_synchronize(ev);
            let _ = self.backend.event_destroy(ev);
        }
        for ev in st.spare_events.drain(..) {
            let _ = self.backend.event_destroy(ev);
        }
        let all: Vec<u64> = st.blocks.keys().copied().collect();
        let _ = self.free_all(all);
    }
}
