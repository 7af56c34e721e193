//! The memory plan of a [`CapturePlan`](super::CapturePlan): every intermediate buffer gets
//! a byte offset in one arena, reusing the bytes of buffers whose last use came before its
//! first (liveness by step).
//!
//! Up to [`GREEDY_MAX_BUFFERS`] buffers are placed largest first, each at the lowest offset
//! that overlaps no buffer alive at the same time (first fit; the tightest of the two), so the
//! arena is the peak of live intermediates plus fragmentation, not their sum. That looks at
//! every buffer placed before, and at their sorted offsets, for each one: quadratic, with a
//! log factor. Longer graphs are placed in the order they run instead: a buffer takes the
//! lowest free range that fits when its first step comes and gives it back after its last,
//! which costs a walk over the free ranges per buffer. A graph of 100 000 steps planned so in
//! milliseconds where the full search took seconds, and one of 20 000 outputs alive at once
//! (where the search met every output for every buffer) in milliseconds instead of minutes.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

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
        // `offsets` is sorted by buffer index.
        self.offsets
            .binary_search_by_key(&index, |&(b, _)| b)
            .ok()
            .map(|i| self.offsets[i].1)
    }
}

/// The most buffers placed by the largest-first search (see the [module](self) docs).
pub const GREEDY_MAX_BUFFERS: usize = 2048;

fn align(n: usize) -> usize {
    n.div_ceil(ARENA_ALIGN) * ARENA_ALIGN
}

/// Places `lifetimes` in one arena (see the [module](self) docs for how).
pub fn plan_memory(lifetimes: &[Lifetime]) -> MemoryPlan {
    let placed = if lifetimes.len() <= GREEDY_MAX_BUFFERS {
        largest_first(lifetimes)
    } else {
        in_step_order(lifetimes)
    };
    let arena = placed
        .iter()
        .map(|(l, at)| at + align(l.bytes.max(1)))
        .max()
        .unwrap_or(0);
    let naive_bytes = lifetimes.iter().map(|l| align(l.bytes.max(1))).sum();
    let mut offsets: Vec<(usize, usize)> = placed.iter().map(|(l, o)| (l.buffer, *o)).collect();
    offsets.sort_unstable();
    MemoryPlan {
        offsets,
        arena_bytes: arena,
        naive_bytes,
    }
}

/// Largest first, each at the lowest offset clear of the buffers placed before that are alive
/// at the same time.
fn largest_first(lifetimes: &[Lifetime]) -> Vec<(Lifetime, usize)> {
    let mut order: Vec<&Lifetime> = lifetimes.iter().collect();
    // Largest first, then earliest: a stable, deterministic placement.
    order.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.first.cmp(&b.first)));
    let mut placed: Vec<(Lifetime, usize)> = Vec::with_capacity(order.len());
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
        placed.push((*lt, at));
    }
    placed
}

/// In step order: each buffer at its first step takes the lowest free range that fits (or
/// the arena's end), and gives it back once its last step has passed.
fn in_step_order(lifetimes: &[Lifetime]) -> Vec<(Lifetime, usize)> {
    let mut order: Vec<&Lifetime> = lifetimes.iter().collect();
    // By first step; within one, largest first (then by buffer: deterministic).
    order.sort_by(|a, b| {
        (a.first, Reverse(a.bytes), a.buffer).cmp(&(b.first, Reverse(b.bytes), b.buffer))
    });
    // Free ranges by offset (never adjacent: they merge), the ranges in use by their last
    // step, and the arena's end.
    let mut free: BTreeMap<usize, usize> = BTreeMap::new();
    let mut in_use: BinaryHeap<Reverse<(usize, usize, usize)>> = BinaryHeap::new();
    let mut end = 0usize;
    let mut placed = Vec::with_capacity(order.len());
    for lt in order {
        while let Some(&Reverse((last, at, size))) = in_use.peek() {
            if last >= lt.first {
                break;
            }
            in_use.pop();
            give_back(&mut free, at, size);
        }
        let size = align(lt.bytes.max(1));
        let fit = free
            .iter()
            .find(|&(_, &len)| len >= size)
            .map(|(&at, &len)| (at, len));
        let at = match fit {
            Some((at, len)) => {
                free.remove(&at);
                if len > size {
                    free.insert(at + size, len - size);
                }
                at
            }
            None => match free.last_key_value().map(|(&at, &len)| (at, len)) {
                // A free range at the arena's end grows into it.
                Some((at, len)) if at + len == end => {
                    free.remove(&at);
                    end = at + size;
                    at
                }
                _ => {
                    end += size;
                    end - size
                }
            },
        };
        in_use.push(Reverse((lt.last, at, size)));
        placed.push((*lt, at));
    }
    placed
}

/// Returns `[at, at + size)` to `free`, merged with the free ranges it touches.
fn give_back(free: &mut BTreeMap<usize, usize>, mut at: usize, mut size: usize) {
    if let Some((&before, &len)) = free.range(..at).next_back() {
        if before + len == at {
            free.remove(&before);
            at = before;
            size += len;
        }
    }
    if let Some(len) = free.remove(&(at + size)) {
        size += len;
    }
    free.insert(at, size);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain of `n` buffers of 1 KiB, each read by the next step.
    fn chain(n: usize) -> Vec<Lifetime> {
        (0..n)
            .map(|i| Lifetime {
                buffer: i,
                bytes: 1024,
                first: i,
                last: i + 1,
            })
            .collect()
    }

    #[test]
    fn reuses_dead_buffers_and_never_overlaps_live_ones() {
        // A chain a -> b -> c -> d: two slots suffice.
        let lts = chain(4);
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

    /// No two buffers alive at once share a byte, every offset is aligned, and the arena
    /// holds at least the peak of live bytes.
    fn check(lts: &[Lifetime], placed: &[(Lifetime, usize)], what: &str) {
        assert_eq!(placed.len(), lts.len(), "{what}");
        let span = |l: &Lifetime, at: usize| (at, at + align(l.bytes.max(1)));
        for (i, (a, oa)) in placed.iter().enumerate() {
            assert_eq!(oa % ARENA_ALIGN, 0, "{what}");
            for (b, ob) in &placed[i + 1..] {
                let ((a0, a1), (b0, b1)) = (span(a, *oa), span(b, *ob));
                assert!(
                    !a.overlaps(b) || a1 <= b0 || b1 <= a0,
                    "{what}: {a:?} at {oa} and {b:?} at {ob} share bytes"
                );
            }
        }
        let steps = lts
            .iter()
            .map(|l| l.first.max(if l.last == usize::MAX { 0 } else { l.last }))
            .max()
            .map_or(0, |m| m + 1);
        let peak = (0..steps)
            .map(|t| {
                lts.iter()
                    .filter(|l| l.first <= t && t <= l.last)
                    .map(|l| align(l.bytes.max(1)))
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0);
        let arena = placed
            .iter()
            .map(|(l, at)| span(l, *at).1)
            .max()
            .unwrap_or(0);
        assert!(
            arena >= peak,
            "{what}: arena {arena} below the live peak {peak}"
        );
    }

    #[test]
    fn both_placements_keep_live_buffers_apart() {
        let mut rng = crate::tensor::SplitMix64::new(7);
        for case in 0..300u64 {
            let steps = 1 + rng.below(200) as usize;
            let n = rng.below(120) as usize;
            let lts: Vec<Lifetime> = (0..n)
                .map(|buffer| {
                    let first = rng.below(steps as u64) as usize;
                    let last = match rng.below(10) {
                        0 => usize::MAX,
                        1 => first,
                        2 => (first + rng.below(steps as u64) as usize).min(steps - 1),
                        _ => (first + rng.below(4) as usize).min(steps - 1),
                    };
                    Lifetime {
                        buffer,
                        bytes: [0, 1, 256, 300, 1024, 4096][rng.below(6) as usize]
                            * (1 + rng.below(3) as usize),
                        first,
                        last,
                    }
                })
                .collect();
            check(
                &lts,
                &largest_first(&lts),
                &format!("largest first, case {case}"),
            );
            check(
                &lts,
                &in_step_order(&lts),
                &format!("in step order, case {case}"),
            );
        }
    }

    #[test]
    fn long_and_wide_graphs_place_in_step_order() {
        // A chain of 10 000 buffers: two slots, as the largest-first search gives.
        let long = chain(10_000);
        assert_eq!(plan_memory(&long).arena_bytes, 2048);
        check(&long[..300], &in_step_order(&long[..300]), "chain");
        // 5 000 outputs alive to the end, each made from a short-lived buffer: the outputs
        // plus one slot.
        let wide: Vec<Lifetime> = (0..10_000)
            .map(|i| Lifetime {
                buffer: i,
                bytes: 256,
                first: i,
                last: if i % 2 == 1 { usize::MAX } else { i + 1 },
            })
            .collect();
        let p = plan_memory(&wide);
        assert_eq!(p.arena_bytes, 5001 * 256);
        // Freed ranges merge: two 1 KiB buffers freed side by side hold a 2 KiB one.
        let merge = [(0, 1024, 0, 0), (1, 1024, 0, 0), (2, 2048, 1, 1)].map(
            |(buffer, bytes, first, last)| Lifetime {
                buffer,
                bytes,
                first,
                last,
            },
        );
        let placed = in_step_order(&merge);
        assert_eq!(placed[2].1, 0, "{placed:?}");
    }
}
