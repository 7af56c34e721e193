//! Allocator statistics in the spirit of PyTorch's `memory_stats`: for each quantity the
//! current value, its peak since the last [`reset_peak`](MemoryStats::reset_peak), and the
//! running totals of increases and decreases.

use std::fmt;

use serde::Serialize;

/// One tracked quantity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stat {
    /// The value now.
    pub current: u64,
    /// The highest value since creation or the last reset of peaks.
    pub peak: u64,
    /// The sum of all increases (for bytes: everything ever allocated).
    pub total: u64,
    /// The sum of all decreases.
    pub freed: u64,
}

impl Stat {
    pub fn add(&mut self, n: u64) {
        self.current += n;
        self.total += n;
        if self.current > self.peak {
            self.peak = self.current;
        }
    }

    pub fn sub(&mut self, n: u64) {
        // Saturating: a bookkeeping slip must not panic a free path.
        self.current = self.current.saturating_sub(n);
        self.freed += n;
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// Statistics of one device allocator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MemoryStats {
    /// Bytes in blocks handed out (block sizes, after rounding).
    pub allocated_bytes: Stat,
    /// Bytes the callers asked for (before rounding).
    pub requested_bytes: Stat,
    /// Bytes reserved from the backend (segments).
    pub reserved_bytes: Stat,
    /// Bytes allocated or freed but still waiting for other streams.
    pub active_bytes: Stat,
    /// Blocks handed out.
    pub allocations: Stat,
    /// Segments reserved from the backend.
    pub segments: Stat,
    /// Blocks allocated or pending.
    pub active_blocks: Stat,
    /// Allocations served from the cache without a raw allocation.
    pub cache_hits: u64,
    /// Allocations that needed a raw allocation.
    pub cache_misses: u64,
    /// Raw allocations that failed and were retried after freeing the cache.
    pub retries: u64,
    /// Allocations that failed after the retry (an `OutOfMemory` error was returned).
    pub ooms: u64,
    /// Segments returned to the backend.
    pub raw_frees: u64,
}

impl MemoryStats {
    /// Sets every peak to the current value.
    pub fn reset_peak(&mut self) {
        for s in [
            &mut self.allocated_bytes,
            &mut self.requested_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.allocations,
            &mut self.segments,
            &mut self.active_blocks,
        ] {
            s.reset_peak();
        }
    }
}

impl fmt::Display for MemoryStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "allocated {} B in {} blocks (peak {} B), reserved {} B in {} segments (peak {} B), \
             active {} B, cache hits {}, misses {}, retries {}, OOMs {}",
            self.allocated_bytes.current,
            self.allocations.current,
            self.allocated_bytes.peak,
            self.reserved_bytes.current,
            self.segments.current,
            self.reserved_bytes.peak,
            self.active_bytes.current,
            self.cache_hits,
            self.cache_misses,
            self.retries,
            self.ooms
        )
    }
}

/// Statistics of the pinned host pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HostStats {
    /// Bytes handed out (block sizes).
    pub allocated_bytes: Stat,
    /// Bytes reserved from the backend.
    pub reserved_bytes: Stat,
    pub cache_hits: u64,
    pub cache_misses: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_arithmetic() {
        let mut s = Stat::default();
        s.add(10);
        s.add(5);
        s.sub(12);
        assert_eq!((s.current, s.peak, s.total, s.freed), (3, 15, 15, 12));
        s.reset_peak();
        assert_eq!(s.peak, 3);
        s.sub(100);
        assert_eq!(s.current, 0);
    }
}
