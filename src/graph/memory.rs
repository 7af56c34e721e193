//! The memory plan of a [`CapturePlan`](super::CapturePlan): every intermediate buffer gets
//! a byte offset in one arena, reusing the bytes of buffers whose last use came before its
//! first (liveness by step). Buffers are placed largest first, each at the lowest offset that
//! overlaps no buffer alive at the same time (first fit), so the arena is the peak of live
//! intermediates plus fragmentation, not their sum.

/// Alignment of every buffer in the arena (enough for any dtype and for GPU bindings).
pub const ARENA_ALIGN: usize = 256;

/// One buffer to place: its size and the steps `[first, last]` between which it is alive
/// (`last == usize::MAX`: until the end, for outputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    pub buffer: usize,
    pub bytes: usize,
    pub first: usize,
    pub last: usize,
}

impl Lifetime {
    fn overlaps(&self, o: &Lifetime) -> bool {
        self.first <= o.last && o.first <= self.last
    }
}

/// Where each intermediate lives in the arena.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryPlan {
    /// `(buffer index, byte offset)` of every placed buffer.
    pub offsets: Vec<(usize, usize)>,
    /// Bytes of the arena: the planned peak of intermediate memory.
    pub arena_bytes: usize,
    /// Bytes one buffer per intermediate would take (each rounded to the alignment).
    pub naive_bytes: usize,
}

impl MemoryPlan {
    /// The arena offset of buffer `index`, if it is placed.
    pub fn offset_of(&self, index: usize) -> Option<usize> {
        self.offsets
            .iter()
            .find(|(b, _)| *b == index)
            .map(|&(_, o)| o)
    }
}

fn align(n: usize) -> usize {
    n.div_ceil(ARENA_ALIGN) * ARENA_ALIGN
}

/// Places `lifetimes` in one arena.
pub fn plan_memory(lifetimes: &[Lifetime]) -> MemoryPlan {
    let mut order: Vec<&Lifetime> = lifetimes.iter().collect();
    // Largest first, then earliest: a stable, deterministic placement.
    order.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.first.cmp(&b.first)));
    let mut placed: Vec<(Lifetime, usize)> = Vec::with_capacity(order.len());
    let mut arena = 0usize;
    for lt in order {
        let size = align(lt.bytes.max(1));
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|(p, _)| p.overlaps(lt))
            .map(|(p, off)| (*off, *off + align(p.bytes.max(1))))
            .collect();
        busy.sort_unstable();
        let mut at = 0usize;
        for (start, end) in busy {
            if at + size <= start {
                break;
            }
            at = at.max(end);
        }
        arena = arena.max(at + size);
        placed.push((*lt, at));
    }
    let naive_bytes = lifetimes.iter().map(|l| align(l.bytes.max(1))).sum();
    let mut offsets: Vec<(usize, usize)> = placed.iter().map(|(l, o)| (l.buffer, *o)).collect();
    offsets.sort_unstable();
    MemoryPlan {
        offsets,
        arena_bytes: arena,
        naive_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_dead_buffers_and_never_overlaps_live_ones() {
        // A chain a -> b -> c -> d of 1 KiB each: two slots suffice.
        let lts: Vec<Lifetime> = (0..4)
            .map(|i| Lifetime {
                buffer: i,
                bytes: 1024,
                first: i,
                last: i + 1,
            })
            .collect();
        let p = plan_memory(&lts);
        assert_eq!(p.naive_bytes, 4096);
        assert_eq!(p.arena_bytes, 2048);
        for a in &lts {
            for b in &lts {
                if a.buffer < b.buffer && a.overlaps(b) {
                    let (oa, ob) = (p.offset_of(a.buffer), p.offset_of(b.buffer));
                    let (oa, ob) = (oa.unwrap_or(0), ob.unwrap_or(0));
                    assert!(oa + 1024 <= ob || ob + 1024 <= oa, "{a:?} {b:?} overlap");
                }
            }
        }
    }
}
