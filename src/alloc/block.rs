//! Blocks and the size policy: how requests are rounded, which pool serves them, how big a new
//! segment is, and when a cached block is split.
//!
//! A *segment* is one raw allocation from the backend; it is carved into *blocks* that link to
//! their neighbours (`prev` / `next`) so a freed block can merge with free neighbours in O(1).
//! Blocks live in an [`Arena`] and are named by `u32` indices, which keeps the free sets' keys
//! small and the hot path free of reference counting.

/// Every block size is a multiple of this (and at least this).
pub const MIN_BLOCK: u64 = 512;
/// Requests up to this size go to the small pool.
pub const SMALL_REQUEST: u64 = 1 << 20;
/// Segment size of the small pool.
pub const SMALL_SEGMENT: u64 = 2 << 20;
/// Segment size of the large pool for requests under [`LARGE_DIRECT`].
pub const LARGE_SEGMENT: u64 = 20 << 20;
/// Large requests from this size get a segment of their own, rounded to [`LARGE_ROUND`].
pub const LARGE_DIRECT: u64 = 10 << 20;
/// Rounding of segments for large requests.
pub const LARGE_ROUND: u64 = 2 << 20;

/// Length of the quick list: the most recently freed blocks, kept unmerged so that freeing and
/// allocating the same size again (the common pattern) costs no set operations — the idea of
/// glibc's tcache. Any request the list cannot serve exactly flushes it (merging every block)
/// before the best-fit search, so splitting and coalescing behave as without it.
pub const QUICK: usize = 8;

/// The "no neighbour" index.
pub const NIL: u32 = u32::MAX;

/// Rounds a request (> 0) up to a multiple of [`MIN_BLOCK`]; `None` on overflow.
pub fn round_size(bytes: u64) -> Option<u64> {
    if bytes <= MIN_BLOCK {
        return Some(MIN_BLOCK);
    }
    bytes
        .checked_add(MIN_BLOCK - 1)
        .map(|b| b & !(MIN_BLOCK - 1))
}

/// Whether a rounded size is served by the small pool.
pub fn is_small(size: u64) -> bool {
    size <= SMALL_REQUEST
}

/// The size of the segment to reserve for a rounded request that missed the cache.
pub fn segment_size(size: u64) -> Option<u64> {
    if is_small(size) {
        Some(SMALL_SEGMENT)
    } else if size < LARGE_DIRECT {
        Some(LARGE_SEGMENT)
    } else {
        size.checked_add(LARGE_ROUND - 1)
            .map(|s| s & !(LARGE_ROUND - 1))
    }
}

/// Whether a free block of `block` bytes serving `size` bytes is split. Small blocks split down
/// to the minimum; large ones only when the rest could serve a large request, so large blocks
/// are not shredded into pieces nobody can use.
pub fn should_split(block: u64, size: u64, small: bool) -> bool {
    let rest = block - size;
    if small {
        rest >= MIN_BLOCK
    } else {
        rest > SMALL_REQUEST
    }
}

/// Where a block stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// In its pool's free set.
    Free,
    /// Handed out.
    Allocated,
    /// Freed by its owner, waiting for events on the streams that used it.
    Pending,
    /// Freed and parked unmerged in the quick list (see [`QUICK`]); neighbours do not merge
    /// with it until it is flushed.
    Quick,
    /// Freed while its private pool was recording after use on other streams: kept out of
    /// reuse until the pool is released (events recorded during capture mean nothing).
    Retired,
    /// Freed in strict mode ([`super::strict`]): held out of reuse (and away from its free
    /// neighbours) while it is in the quarantine, so a stale pointer to it is caught.
    Quarantined,
}

/// One block of a segment.
#[derive(Debug, Clone)]
pub struct Block {
    pub addr: u64,
    pub size: u64,
    /// The caller's request (before rounding), for the requested-bytes statistic.
    pub requested: u64,
    /// The stream the block was allocated on (the block is reused only on it).
    pub stream: u64,
    /// Index of the pool the block belongs to.
    pub pool: u32,
    pub prev: u32,
    pub next: u32,
    pub state: BlockState,
    /// Other streams the block was used on ([`record_stream`](super::CachingAllocator::record_stream)).
    pub uses: Vec<u64>,
    /// Events still to complete before a pending block is free.
    pub pending: u32,
}

impl Block {
    /// A whole segment, not yet split.
    pub fn segment(addr: u64, size: u64, stream: u64, pool: u32) -> Self {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            pool,
            prev: NIL,
            next: NIL,
            state: BlockState::Free,
            uses: Vec::new(),
            pending: 0,
        }
    }

    /// The block spans its whole segment (no neighbours): it can go back to the backend.
    pub fn is_whole_segment(&self) -> bool {
        self.prev == NIL && self.next == NIL
    }

    /// The key of this block in its pool's free set: best fit is the first key at or after
    /// `(stream, size, 0, 0)`.
    pub fn key(&self, idx: u32) -> FreeKey {
        (self.stream, self.size, self.addr, idx)
    }
}

/// `(stream, size, addr, index)`: ordered by stream, then size (best fit), then address.
pub type FreeKey = (u64, u64, u64, u32);

/// Blocks by index, with recycled slots.
#[derive(Debug, Default)]
pub struct Arena {
    slots: Vec<Option<Block>>,
    vacant: Vec<u32>,
}

impl Arena {
    pub fn insert(&mut self, b: Block) -> u32 {
        if let Some(i) = self.vacant.pop() {
            self.slots[i as usize] = Some(b);
            i
        } else {
            self.slots.push(Some(b));
            (self.slots.len() - 1) as u32
        }
    }

    pub fn remove(&mut self, i: u32) -> Option<Block> {
        let b = self.slots.get_mut(i as usize)?.take();
        if b.is_some() {
            self.vacant.push(i);
        }
        b
    }

    pub fn get(&self, i: u32) -> Option<&Block> {
        self.slots.get(i as usize)?.as_ref()
    }

    pub fn get_mut(&mut self, i: u32) -> Option<&mut Block> {
        self.slots.get_mut(i as usize)?.as_mut()
    }

    /// Every live block with its index.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Block)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.as_ref().map(|b| (i as u32, b)))
    }
}

/// A multiplicative hasher for `u64` keys (addresses): the std SipHash costs more than the
/// rest of a cache hit, and addresses are not attacker-chosen.
#[derive(Default, Clone, Copy)]
pub struct AddrHasher(u64);

impl std::hash::Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }

    fn write_u64(&mut self, v: u64) {
        // Fold the high half in so 512-byte aligned addresses spread over the buckets.
        let x = v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 29);
    }
}

/// `BuildHasher` for [`AddrHasher`].
pub type AddrBuild = std::hash::BuildHasherDefault<AddrHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        assert_eq!(round_size(1), Some(512));
        assert_eq!(round_size(512), Some(512));
        assert_eq!(round_size(513), Some(1024));
        assert_eq!(round_size(u64::MAX), None);
    }

    #[test]
    fn segments() {
        assert_eq!(segment_size(512), Some(SMALL_SEGMENT));
        assert_eq!(segment_size(1 << 20), Some(SMALL_SEGMENT));
        assert_eq!(segment_size((1 << 20) + 512), Some(LARGE_SEGMENT));
        assert_eq!(segment_size(11 << 20), Some(12 << 20));
        assert_eq!(segment_size(10 << 20), Some(10 << 20));
    }

    #[test]
    fn splitting() {
        assert!(should_split(SMALL_SEGMENT, 512, true));
        assert!(!should_split(1024, 1024, true));
        assert!(!should_split(
            LARGE_SEGMENT,
            LARGE_SEGMENT - (1 << 20),
            false
        ));
        assert!(should_split(LARGE_SEGMENT, 2 << 20, false));
    }

    #[test]
    fn arena_recycles() {
        let mut a = Arena::default();
        let i = a.insert(Block::segment(0x1000, 512, 1, 0));
        let j = a.insert(Block::segment(0x2000, 512, 1, 0));
        assert_ne!(i, j);
        assert!(a.remove(i).is_some());
        assert!(a.remove(i).is_none());
        assert_eq!(a.insert(Block::segment(0x3000, 512, 1, 0)), i);
        assert_eq!(a.iter().count(), 2);
    }
}
