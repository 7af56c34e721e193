//! The allocator's state under its mutex: pools with size-ordered free sets, the block arena,
//! split and coalesce, pending (stream-used) blocks, and graph-private pools.
//!
//! Nothing here calls the backend except through the closures the caller passes for events;
//! raw frees are *returned* (as [`Released`] lists) so the caller performs them after dropping
//! the lock — a raw free may synchronise the device, and no thread should wait for that while
//! holding the allocator.

use std::collections::{BTreeSet, HashMap};

use super::block::*;
use super::stats::MemoryStats;
use crate::hal::EventId;

/// Segments `(addr, size)` to hand back to the backend once the lock is dropped.
pub type Released = Vec<(u64, u64)>;

/// Who a pool belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolOwner {
    /// The device-wide cache.
    DeviceCache,
    /// A graph-private pool, by id.
    Private(u64),
}

/// One pool: a size class (small / large) of one owner, with its free set.
#[derive(Debug)]
pub struct Pool {
    pub small: bool,
    pub owner: PoolOwner,
    pub free: BTreeSet<FreeKey>,
}

impl Pool {
    pub fn new(small: bool, owner: PoolOwner) -> Self {
        // A sentinel no query reaches (no stream is u64::MAX, no block has index NIL) keeps
        // the set from ever becoming empty: an empty BTreeSet frees its root node, and the
        // hot path would pay a malloc and a free for it on every hit.
        let mut free = BTreeSet::new();
        free.insert((u64::MAX, u64::MAX, u64::MAX, NIL));
        Pool { small, owner, free }
    }
}

/// Book-keeping of one graph-private pool.
#[derive(Debug)]
pub struct Private {
    /// Indices of its small and large pools.
    pub pools: [u32; 2],
    /// True once the last handle dropped: free segments go back to the backend.
    pub released: bool,
    /// Segments still reserved.
    pub segments: u64,
}

/// Indices of the shared small and large pools.
pub const SHARED: [u32; 2] = [0, 1];

/// Everything behind the allocator's mutex.
#[derive(Debug)]
pub struct State {
    pub blocks: Arena,
    /// Allocated blocks by address (what `free` looks up).
    pub live: HashMap<u64, u32, AddrBuild>,
    pub pools: Vec<Option<Pool>>,
    pub privates: HashMap<u64, Private>,
    /// The private pool new allocations come from, while one is recording.
    pub recording: Option<u64>,
    /// `(event, block)` for blocks waiting on other streams.
    pub pending: Vec<(EventId, u32)>,
    /// Completed events kept for reuse (creating one is a backend call).
    pub spare_events: Vec<EventId>,
    pub stats: MemoryStats,
    pub next_private: u64,
    /// Raw frees found while the lock was needed for longer (processing events), done by the
    /// next caller that frees raw memory.
    pub deferred_raw: Released,
    /// Recently freed blocks `(stream, size, pool, index)`, newest last.
    pub quick: Vec<(u64, u64, u32, u32)>,
    /// Strict mode's quarantine: freed blocks held out of reuse, oldest first.
    pub quarantine: super::strict::Quarantine,
    /// Segments of the device cache per stream key (see [`super::retire`]): a stream that
    /// holds none costs nothing when it goes.
    pub stream_segments: HashMap<u64, u32>,
    /// Retired keys with the event recorded on their stream before it went; the next stream
    /// that misses its cache once the event has completed adopts their segments.
    pub retiring: Vec<super::retire::Retiring>,
    /// The next retired key's number.
    pub next_retired: u64,
}

impl Default for State {
    fn default() -> Self {
        let shared = |small| Some(Pool::new(small, PoolOwner::DeviceCache));
        State {
            blocks: Arena::default(),
            live: HashMap::default(),
            pools: vec![shared(true), shared(false)],
            privates: HashMap::new(),
            recording: None,
            pending: Vec::new(),
            spare_events: Vec::new(),
            stats: MemoryStats::default(),
            next_private: 1,
            deferred_raw: Released::new(),
            quick: Vec::with_capacity(QUICK),
            quarantine: Default::default(),
            stream_segments: HashMap::new(),
            retiring: Vec::new(),
            next_retired: 0,
        }
    }
}

impl State {
    /// The pool a rounded request is served from now.
    pub fn pool_for(&self, size: u64) -> u32 {
        let which = usize::from(!is_small(size));
        match self.recording.and_then(|id| self.privates.get(&id)) {
            Some(p) => p.pools[which],
            None => SHARED[which],
        }
    }

    pub(super) fn pool_owner(&self, pool: u32) -> Option<PoolOwner> {
        self.pools.get(pool as usize)?.as_ref().map(|p| p.owner)
    }

    fn pool_mut(&mut self, i: u32) -> Option<&mut Pool> {
        self.pools.get_mut(i as usize)?.as_mut()
    }

    /// An exact-size block of `pool` for `stream` from the quick list.
    pub fn take_quick(&mut self, pool: u32, stream: u64, size: u64, requested: u64) -> Option<u64> {
        let i = self
            .quick
            .iter()
            .rposition(|q| q.0 == stream && q.1 == size && q.2 == pool)?;
        let idx = self.quick.remove(i).3;
        self.stats.cache_hits += 1;
        Some(self.mark_allocated(idx, requested))
    }

    /// Parks a freed block in the quick list (flushing the oldest when full). Blocks of
    /// released private pools go straight back instead, so their segments can be returned.
    pub fn park(&mut self, idx: u32, out: &mut Released) {
        let Some(b) = self.blocks.get(idx) else {
            return;
        };
        let (stream, size, pool) = (b.stream, b.size, b.pool);
        let released = match self
            .pools
            .get(pool as usize)
            .and_then(|p| p.as_ref())
            .map(|p| p.owner)
        {
            Some(PoolOwner::Private(id)) => self.privates.get(&id).is_none_or(|p| p.released),
            _ => false,
        };
        if released {
            self.release_block(idx, out);
            return;
        }
        if self.quick.len() >= QUICK {
            let old = self.quick.remove(0).3;
            self.merge_free(old, out);
        }
        if let Some(b) = self.blocks.get_mut(idx) {
            b.state = BlockState::Quick;
            b.uses.clear();
        }
        self.stats.active_bytes.sub(size);
        self.stats.active_blocks.sub(1);
        self.quick.push((stream, size, pool, idx));
    }

    /// Merges every parked block into the free sets.
    pub fn flush_quick(&mut self, out: &mut Released) {
        for (_, _, _, idx) in std::mem::take(&mut self.quick) {
            self.merge_free(idx, out);
        }
    }

    /// Best fit from the free set of `pool` for `stream`: the smallest free block of at least
    /// `size` bytes (`exact`: of `size` bytes), lowest address first. Splits it when the rest
    /// is worth keeping and marks it allocated. `None` on a miss.
    pub fn take_free(
        &mut self,
        pool: u32,
        stream: u64,
        size: u64,
        requested: u64,
        exact: bool,
    ) -> Option<u64> {
        let p = self.pool_mut(pool)?;
        let largest = if exact { size } else { u64::MAX };
        let key = *p
            .free
            .range((stream, size, 0, 0)..=(stream, largest, u64::MAX, u32::MAX))
            .next()?;
        if key.3 == NIL {
            return None; // the sentinel (only reachable for a stream handle of u64::MAX)
        }
        p.free.remove(&key);
        self.stats.cache_hits += 1;
        Some(self.hand_out(key.3, size, requested))
    }

    /// Adds a fresh segment to `pool` and hands out `size` bytes of it.
    pub fn add_segment(
        &mut self,
        pool: u32,
        stream: u64,
        addr: u64,
        seg: u64,
        size: u64,
        requested: u64,
    ) -> u64 {
        self.stats.cache_misses += 1;
        self.stats.reserved_bytes.add(seg);
        self.stats.segments.add(1);
        match self.pool_owner(pool) {
            Some(PoolOwner::Private(id)) => {
                if let Some(p) = self.privates.get_mut(&id) {
                    p.segments += 1;
                }
            }
            Some(PoolOwner::DeviceCache) => {
                *self.stream_segments.entry(stream).or_default() += 1;
            }
            None => {}
        }
        let idx = self.blocks.insert(Block::segment(addr, seg, stream, pool));
        self.hand_out(idx, size, requested)
    }

    /// Marks free block `idx` allocated with `size` bytes, splitting off the rest.
    fn hand_out(&mut self, idx: u32, size: u64, requested: u64) -> u64 {
        let Some(b) = self.blocks.get(idx) else {
            return 0;
        };
        let (addr, bsize, stream, pool, next) = (b.addr, b.size, b.stream, b.pool, b.next);
        let small = self
            .pools
            .get(pool as usize)
            .and_then(|p| p.as_ref())
            .map(|p| p.small)
            .unwrap_or(true);
        if should_split(bsize, size, small) {
            let mut rest = Block::segment(addr + size, bsize - size, stream, pool);
            rest.prev = idx;
            rest.next = next;
            let key_size = rest.size;
            let r = self.blocks.insert(rest);
            if let Some(n) = self.blocks.get_mut(next) {
                n.prev = r;
            }
            if let Some(b) = self.blocks.get_mut(idx) {
                b.size = size;
                b.next = r;
            }
            if let Some(p) = self.pool_mut(pool) {
                p.free.insert((stream, key_size, addr + size, r));
            }
        }
        self.mark_allocated(idx, requested)
    }

    /// Marks a block allocated and accounts for it.
    fn mark_allocated(&mut self, idx: u32, requested: u64) -> u64 {
        let Some(b) = self.blocks.get_mut(idx) else {
            return 0;
        };
        let addr = b.addr;
        b.state = BlockState::Allocated;
        b.requested = requested;
        let size = b.size;
        self.live.insert(addr, idx);
        let s = &mut self.stats;
        s.allocated_bytes.add(size);
        s.requested_bytes.add(requested);
        s.active_bytes.add(size);
        s.allocations.add(1);
        s.active_blocks.add(1);
        addr
    }

    /// Takes an allocated block out of the live table (the first half of a free).
    pub fn unlive(&mut self, addr: u64) -> Option<u32> {
        let idx = self.live.remove(&addr)?;
        if let Some(b) = self.blocks.get(idx) {
            let (size, requested) = (b.size, b.requested);
            let s = &mut self.stats;
            s.allocated_bytes.sub(size);
            s.requested_bytes.sub(requested);
            s.allocations.sub(1);
        }
        Some(idx)
    }

    /// Whether block `idx` is in a private pool that is recording now.
    pub fn in_recording_pool(&self, idx: u32) -> bool {
        let Some(b) = self.blocks.get(idx) else {
            return false;
        };
        match self
            .pools
            .get(b.pool as usize)
            .and_then(|p| p.as_ref())
            .map(|p| p.owner)
        {
            Some(PoolOwner::Private(id)) => self.recording == Some(id),
            _ => false,
        }
    }

    /// Returns a block to its pool's free set, merging it with free neighbours. A whole
    /// segment of a released private pool goes into `out` instead.
    pub fn release_block(&mut self, idx: u32, out: &mut Released) {
        let Some(b) = self.blocks.get(idx) else {
            return;
        };
        let size = b.size;
        self.stats.active_bytes.sub(size);
        self.stats.active_blocks.sub(1);
        self.merge_free(idx, out);
    }

    /// Marks a block free and merges it into its pool (no statistics: the block has already
    /// stopped counting as active).
    fn merge_free(&mut self, mut idx: u32, out: &mut Released) {
        let Some(b) = self.blocks.get_mut(idx) else {
            return;
        };
        b.state = BlockState::Free;
        b.uses.clear();
        b.pending = 0;
        let (prev, next, pool) = (b.prev, b.next, b.pool);
        if self
            .blocks
            .get(prev)
            .is_some_and(|p| p.state == BlockState::Free)
        {
            self.merge_into(prev, idx, pool);
            idx = prev;
        }
        if self
            .blocks
            .get(next)
            .is_some_and(|n| n.state == BlockState::Free)
        {
            self.merge_into(idx, next, pool);
        }
        let Some(b) = self.blocks.get(idx) else {
            return;
        };
        let key = b.key(idx);
        let whole = b.is_whole_segment();
        let released = match self
            .pools
            .get(pool as usize)
            .and_then(|p| p.as_ref())
            .map(|p| p.owner)
        {
            Some(PoolOwner::Private(id)) => self.privates.get(&id).is_some_and(|p| p.released),
            _ => false,
        };
        if whole && released {
            self.drop_segment(idx, out);
        } else if let Some(p) = self.pool_mut(pool) {
            p.free.insert(key);
        }
    }

    /// Merges block `b` into its left neighbour `a` (`a.next == b`). A free `a` or `b` leaves
    /// the free set first.
    fn merge_into(&mut self, a: u32, b: u32, pool: u32) {
        let (Some(ab), Some(bb)) = (self.blocks.get(a), self.blocks.get(b)) else {
            return;
        };
        let (ka, kb) = (ab.key(a), bb.key(b));
        let (a_free, b_free) = (ab.state == BlockState::Free, bb.state == BlockState::Free);
        if let Some(p) = self.pool_mut(pool) {
            if a_free {
                p.free.remove(&ka);
            }
            if b_free {
                p.free.remove(&kb);
            }
        }
        let Some(bb) = self.blocks.remove(b) else {
            return;
        };
        if let Some(n) = self.blocks.get_mut(bb.next) {
            n.prev = a;
        }
        if let Some(ab) = self.blocks.get_mut(a) {
            ab.size += bb.size;
            ab.next = bb.next;
        }
    }

    /// Forgets a whole-segment block (already out of any free set) and lists it for release.
    fn drop_segment(&mut self, idx: u32, out: &mut Released) {
        let Some(b) = self.blocks.remove(idx) else {
            return;
        };
        self.stats.reserved_bytes.sub(b.size);
        self.stats.segments.sub(1);
        self.stats.raw_frees += 1;
        out.push((b.addr, b.size));
        if self.pool_owner(b.pool) == Some(PoolOwner::DeviceCache) {
            if let Some(n) = self.stream_segments.get_mut(&b.stream) {
                *n -= 1;
                if *n == 0 {
                    self.stream_segments.remove(&b.stream);
                }
            }
        }
        if let Some(PoolOwner::Private(id)) = self.pool_owner(b.pool) {
            let gone = match self.privates.get_mut(&id) {
                Some(p) => {
                    p.segments = p.segments.saturating_sub(1);
                    p.released && p.segments == 0
                }
                None => false,
            };
            if gone {
                self.forget_private(id);
            }
        }
    }

    /// Removes every whole free segment of the shared pools (and of released private pools).
    pub fn drain_cache(&mut self, out: &mut Released) {
        self.flush_quick(out);
        for pi in 0..self.pools.len() as u32 {
            let reclaim = match self.pools[pi as usize].as_ref().map(|p| p.owner) {
                Some(PoolOwner::DeviceCache) => true,
                Some(PoolOwner::Private(id)) => self.privates.get(&id).is_some_and(|p| p.released),
                None => false,
            };
            if reclaim {
                self.drain_pool(pi, out);
            }
        }
    }

    /// Removes every whole free segment of pool `pi`.
    fn drain_pool(&mut self, pi: u32, out: &mut Released) {
        let whole: Vec<FreeKey> = self
            .pools
            .get(pi as usize)
            .and_then(|p| p.as_ref())
            .map(|p| {
                p.free
                    .iter()
                    .filter(|k| self.blocks.get(k.3).is_some_and(|b| b.is_whole_segment()))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        for k in whole {
            if let Some(p) = self.pool_mut(pi) {
                p.free.remove(&k);
            }
            self.drop_segment(k.3, out);
        }
    }

    /// Creates a private pool and returns its id.
    pub fn new_private(&mut self) -> u64 {
        let id = self.next_private;
        self.next_private += 1;
        let mut slot = |small| {
            let pool = Pool::new(small, PoolOwner::Private(id));
            match self.pools.iter().position(|p| p.is_none()) {
                Some(i) => {
                    self.pools[i] = Some(pool);
                    i as u32
                }
                None => {
                    self.pools.push(Some(pool));
                    (self.pools.len() - 1) as u32
                }
            }
        };
        let pools = [slot(true), slot(false)];
        self.privates.insert(
            id,
            Private {
                pools,
                released: false,
                segments: 0,
            },
        );
        id
    }

    /// The last handle of private pool `id` dropped: retired blocks become free and every
    /// whole free segment goes back; segments with live blocks follow when those are freed.
    pub fn release_private(&mut self, id: u64, out: &mut Released) {
        if self.recording == Some(id) {
            self.recording = None;
        }
        let Some(p) = self.privates.get_mut(&id) else {
            return;
        };
        p.released = true;
        let pools = p.pools;
        let retired: Vec<u32> = self
            .blocks
            .iter()
            .filter(|(_, b)| pools.contains(&b.pool) && b.state == BlockState::Retired)
            .map(|(i, _)| i)
            .collect();
        for i in retired {
            self.release_block(i, out);
        }
        // Only this pool's segments go back; the shared cache stays warm.
        self.flush_quick(out);
        for pi in pools {
            self.drain_pool(pi, out);
        }
        if self.privates.get(&id).is_some_and(|p| p.segments == 0) {
            self.forget_private(id);
        }
    }

    fn forget_private(&mut self, id: u64) {
        if let Some(p) = self.privates.remove(&id) {
            for i in p.pools {
                if let Some(slot) = self.pools.get_mut(i as usize) {
                    *slot = None;
                }
            }
        }
    }

    /// Every segment, free or not (for dropping the allocator).
    pub fn all_segments(&self) -> Released {
        let mut v: Vec<(u64, u64)> = Vec::new();
        // A segment is a chain starting at a block with no `prev`; its size is the chain's sum.
        for (_, b) in self.blocks.iter().filter(|(_, b)| b.prev == NIL) {
            let mut size = b.size;
            let mut n = b.next;
            while let Some(nb) = self.blocks.get(n) {
                size += nb.size;
                n = nb.next;
            }
            v.push((b.addr, size));
        }
        v
    }
}
