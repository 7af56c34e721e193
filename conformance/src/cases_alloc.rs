//! Allocator cases: reuse, rounding, split and merge, segments, stream-aware reuse and
//! statistics (graph-private pools, OOM, concurrency and the pinned pool are in
//! `cases_alloc_pools.rs`; `Memory`, `Runtime` and context in `cases_context.rs`).
//!
//! Every case builds its own allocator (or a standalone runtime) over the device so the
//! statistics start at zero while other cases run in parallel, and checks real addresses and
//! real statistics. Device memory is only ever touched through the HAL (copies, memset,
//! kernels), so the cases hold on devices whose memory the host cannot address.

use std::sync::Arc;

use super::*;
use crate::ensure;
use unirt::alloc::CachingAllocator;
use unirt::hal::{DevicePtr, EventStatus, StreamId};
use unirt::stream::{BackendExt, Event, Stream};

pub(super) const MIB: u64 = 1 << 20;

/// A new allocator with the default policy ([`default_policy`]).
pub(super) fn fresh(ctx: &Ctx) -> Arc<CachingAllocator> {
    default_policy(CachingAllocator::new(ctx.backend.clone()))
}

/// `a` with strict and exact mode off, whatever `UNIRT_ALLOC_STRICT` and `UNIRT_ALLOC_EXACT`
/// say: the allocator cases check rounding, splitting and reuse as documented.
pub(super) fn default_policy(a: Arc<CachingAllocator>) -> Arc<CachingAllocator> {
    a.set_strict(None);
    a.set_exact(false);
    a
}

/// Writes a pattern through the HAL and reads it back.
pub(super) fn roundtrip(ctx: &Ctx, p: DevicePtr, len: usize, seed: u32) -> Result<(), Failure> {
    let data = pattern(len, seed);
    ctx.copy_to_device(p, &data)?;
    same(
        &ctx.read_vec(p, len)?,
        &data,
        "device memory from the allocator",
    )
}

fn reuse_freed_block(ctx: &Ctx) -> Result<(), Failure> {
    let a = fresh(ctx);
    let s = ctx.default_stream();
    let p = a.malloc(4096, s)?;
    roundtrip(ctx, p, 4096, 1)?;
    a.free(p)?;
    let q = a.malloc(4096, s)?;
    ensure!(
        q == p,
        "a freed 4 KiB block was not reused: {p:?} then {q:?}"
    );
    a.free(q)?;
    let r = a.malloc(3000, s)?;
    ensure!(
        r == p,
        "a smaller request did not reuse the free block: {r:?} vs {p:?}"
    );
    roundtrip(ctx, r, 3000, 2)?;
    let st = a.stats();
    ensure!(
        st.cache_misses == 1 && st.cache_hits == 2 && st.segments.current == 1,
        "expected 1 miss, 2 hits, 1 segment: {st}"
    );
    a.free(r)?;
    Ok(())
}

fn rounds_to_512(ctx: &Ctx) -> Result<(), Failure> {
    let a = fresh(ctx);
    let s = ctx.default_stream();
    let (p1, p2, p3) = (a.malloc(1, s)?, a.malloc(1, s)?, a.malloc(513, s)?);
    ensure!(
        p2.0 == p1.0 + 512 && p3.0 == p2.0 + 512,
        "1, 1 and 513 byte blocks are not packed at 512 B steps: {p1:?} {p2:?} {p3:?}"
    );
    let size = a.block(p3).map(|b| b.size);
    ensure!(
        size == Some(1024),
        "513 bytes rounded to {size:?}, not 1024"
    );
    let st = a.stats();
    ensure!(
        st.allocated_bytes.current == 2048 && st.requested_bytes.current == 515,
        "allocated {} / requested {} bytes, expected 2048 / 515",
        st.allocated_bytes.current,
        st.requested_bytes.current
    );
    for p in [p1, p2, p3] {
        a.free(p)?;
    }
    Ok(())
}

fn split_and_merge(ctx: &Ctx) -> Result<(), Failure> {
    let a = fresh(ctx);
    let s = ctx.default_stream();
    let p = a.malloc(1000, s)?;
    let q = a.malloc(3000, s)?;
    let r = a.malloc(600, s)?;
    ensure!(
        q.0 == p.0 + 1024 && r.0 == q.0 + 3072,
        "blocks were not split from one segment: {p:?} {q:?} {r:?}"
    );
    roundtrip(ctx, q, 3000, 3)?;
    // Middle first, then both ends: the segment must merge back into one block.
    a.free(q)?;
    a.free(p)?;
    a.free(r)?;
    let whole = a.malloc(MIB as usize, s)?;
    ensure!(
        whole == p,
        "after freeing every piece a 1 MiB block came from {whole:?}, not the merged segment at {p:?}"
    );
    let st = a.stats();
    ensure!(
        st.segments.current == 1 && st.cache_misses == 1,
        "merging must not need a new segment: {st}"
    );
    roundtrip(ctx, whole, MIB as usize, 4)?;
    a.free(whole)?;
    Ok(())
}

fn segment_sizes(ctx: &Ctx) -> Result<(), Failure> {
    let a = fresh(ctx);
    let s = ctx.default_stream();
    let small = a.malloc(4096, s)?;
    let r1 = a.stats().reserved_bytes.current;
    ensure!(
        r1 == 2 * MIB,
        "a small request reserved {r1} B, not a 2 MiB segment"
    );
    // From 10 MiB a request gets its own segment, rounded to 2 MiB; the 1 MiB left over is
    // not worth a split in the large pool, so the block is the whole segment.
    let huge = a.malloc(11 * MIB as usize, s)?;
    let r2 = a.stats().reserved_bytes.current;
    ensure!(
        r2 == r1 + 12 * MIB,
        "an 11 MiB request reserved {} B, not 12 MiB",
        r2 - r1
    );
    let hs = a.block(huge).map(|b| b.size);
    ensure!(
        hs == Some(12 * MIB),
        "the 11 MiB block is {hs:?} B, not the whole 12 MiB segment"
    );
    let l1 = a.malloc(3 * MIB as usize, s)?;
    let r3 = a.stats().reserved_bytes.current;
    ensure!(
        r3 == r2 + 20 * MIB,
        "a 3 MiB request reserved {} B, not 20 MiB",
        r3 - r2
    );
    let l2 = a.malloc(3 * MIB as usize, s)?;
    ensure!(
        l2.0 == l1.0 + 3 * MIB && a.stats().reserved_bytes.current == r3,
        "a second 3 MiB request did not come from the 20 MiB segment: {l1:?} {l2:?}"
    );
    roundtrip(ctx, huge, 11 * MIB as usize, 5)?;
    for p in [small, l1, l2, huge] {
        a.free(p)?;
    }
    a.empty_cache()?;
    let st = a.stats();
    ensure!(
        st.reserved_bytes.current == 0 && st.raw_frees == 3,
        "empty_cache left {st}"
    );
    Ok(())
}

fn stream_aware_reuse(ctx: &Ctx) -> Result<(), Failure> {
    let a = fresh(ctx);
    let (s1, s2) = (Stream::new(&ctx.backend)?, Stream::new(&ctx.backend)?);
    let p = a.malloc(8192, s1.id())?;
    a.free(p)?;
    let q = a.malloc(8192, s2.id())?;
    ensure!(
        q != p,
        "a block freed on one stream was handed to another stream"
    );
    let r = a.malloc(8192, s1.id())?;
    ensure!(
        r == p,
        "a block freed on s1 was not reused on s1: {p:?} then {r:?}"
    );
    ensure!(
        a.stats().segments.current == 2,
        "each stream should have had its own segment"
    );
    a.free(q)?;
    a.free(r)?;
    Ok(())
}

/// Enqueues `k` fills of `n` u32s at `big` on `s` (work that keeps the stream busy).
pub(super) fn keep_busy(
    ctx: &Ctx,
    s: StreamId,
    big: DevicePtr,
    n: u32,
    k: usize,
) -> Result<(), Failure> {
    for i in 0..k {
        ctx.launch("fill", &[big.into(), (i as u32).into(), n.into()], s)?;
    }
    Ok(())
}

fn record_stream_defers_reuse(ctx: &Ctx) -> Result<(), Failure> {
    let a = fresh(ctx);
    let (s1, s2) = (Stream::new(&ctx.backend)?, Stream::new(&ctx.backend)?);
    let n: u32 = 4 << 20;
    let big = Buf::new(&ctx.backend, 4 * n as usize)?;
    for round in 0..7 {
        let p = a.malloc(65536, s1.id())?;
        a.record_stream(p, s2.id())?;
        keep_busy(ctx, s2.id(), big.ptr, n, 2 << round)?;
        ctx.launch("fill", &[p.into(), 9u32.into(), 16384u32.into()], s2.id())?;
        let marker = Event::new(&ctx.backend)?;
        marker.record(&s2)?;
        a.free(p)?;
        let q = a.malloc(65536, s1.id())?;
        // The marker was recorded before the allocator's event on the same stream: if it is
        // still pending now, the allocator's event was pending during the malloc above.
        let busy = marker.query()? == EventStatus::NotReady;
        if busy {
            ensure!(q != p, "a block still used by another stream was reused");
            let st = a.stats();
            ensure!(
                st.active_blocks.current == 2 && st.allocations.current == 1,
                "a pending block must count as active, not allocated: {st}"
            );
        }
        s2.synchronize()?;
        a.free(q)?;
        let reserved = a.stats().reserved_bytes.current;
        let (r1, r2) = (a.malloc(65536, s1.id())?, a.malloc(65536, s1.id())?);
        ensure!(
            r1 == p || r2 == p,
            "after the other stream finished the block was not reused"
        );
        ensure!(
            a.stats().reserved_bytes.current == reserved,
            "reserved memory grew although freed blocks were available"
        );
        a.free(r1)?;
        a.free(r2)?;
        if busy {
            return Ok(());
        }
    }
    Err(Failure::Failed(
        "the second stream never stayed busy long enough to test deferred reuse".into(),
    ))
}

fn stats_arithmetic(ctx: &Ctx) -> Result<(), Failure> {
    let a = fresh(ctx);
    let s = ctx.default_stream();
    let (pa, pb, pc) = (
        a.malloc(1000, s)?,
        a.malloc(5000, s)?,
        a.malloc(3 * MIB as usize, s)?,
    );
    let big = 3 * MIB;
    let st = a.stats();
    let want_alloc = 1024 + 5120 + big;
    ensure!(
        st.allocated_bytes.current == want_alloc
            && st.requested_bytes.current == 6000 + big
            && st.reserved_bytes.current == 22 * MIB
            && st.allocations.current == 3
            && st.segments.current == 2
            && st.cache_misses == 2
            && st.cache_hits == 1,
        "after 3 allocations: {st:?}"
    );
    a.free(pb)?;
    let st = a.stats();
    ensure!(
        st.allocated_bytes.current == 1024 + big
            && st.allocated_bytes.peak == want_alloc
            && st.allocated_bytes.total == want_alloc
            && st.allocated_bytes.freed == 5120
            && st.allocations.current == 2
            && st.active_bytes.current == 1024 + big,
        "after one free: {st:?}"
    );
    a.reset_peak();
    let st = a.stats();
    ensure!(
        st.allocated_bytes.peak == st.allocated_bytes.current
            && st.reserved_bytes.peak == st.reserved_bytes.current,
        "reset_peak did not reset: {st:?}"
    );
    let pd = a.malloc(200, s)?;
    ensure!(pd == pb, "200 B did not reuse the freed 5000 B slot");
    let st = a.stats();
    ensure!(
        st.allocated_bytes.peak == 1024 + 512 + big
            && st.allocated_bytes.total == want_alloc + 512
            && st.cache_hits == 2,
        "after the reuse: {st:?}"
    );
    for p in [pa, pc, pd] {
        a.free(p)?;
    }
    let st = a.stats();
    ensure!(
        st.allocated_bytes.current == 0
            && st.active_bytes.current == 0
            && st.reserved_bytes.current == 22 * MIB,
        "after freeing everything: {st:?}"
    );
    a.empty_cache()?;
    let st = a.stats();
    ensure!(
        st.reserved_bytes.current == 0 && st.segments.current == 0 && st.raw_frees == 2,
        "after empty_cache: {st:?}"
    );
    Ok(())
}

pub(super) const CASES: &[Case] = &[
    Case {
        name: "alloc::reuse_freed_block",
        needs: &[],
        run: reuse_freed_block,
    },
    Case {
        name: "alloc::rounds_to_512",
        needs: &[],
        run: rounds_to_512,
    },
    Case {
        name: "alloc::split_and_merge",
        needs: &[],
        run: split_and_merge,
    },
    Case {
        name: "alloc::segment_sizes",
        needs: &[],
        run: segment_sizes,
    },
    Case {
        name: "alloc::stream_aware_reuse",
        needs: &[],
        run: stream_aware_reuse,
    },
    Case {
        name: "alloc::record_stream_defers_reuse",
        needs: &[Need::AsyncStreams],
        run: record_stream_defers_reuse,
    },
    Case {
        name: "alloc::stats_arithmetic",
        needs: &[],
        run: stats_arithmetic,
    },
    Case {
        name: "alloc::strict_mode_refuses_stale_pointers",
        needs: &[],
        run: strict_mode,
    },
    Case {
        name: "alloc::exact_mode_sizes_blocks_to_the_byte",
        needs: &[],
        run: exact_mode,
    },
];

/// Exact mode (`UNIRT_ALLOC_EXACT`, here switched on per allocator): each request that misses
/// the cache is a segment of exactly its bytes (odd sizes included, which every backend's raw
/// allocation must take), that holds data like any block, and a freed block serves only a
/// request of its own size again.
fn exact_mode(ctx: &Ctx) -> Result<(), Failure> {
    let a = fresh(ctx);
    let s = ctx.default_stream();
    a.set_exact(true);
    ensure!(a.exact(), "set_exact(true) did not turn exact mode on");
    let sizes = [1usize, 6, 513, 4098, 3 * MIB as usize + 2];
    let mut ptrs = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let p = a.malloc(n, s)?;
        let got = a.block(p).map(|b| b.size);
        ensure!(
            got == Some(n as u64),
            "a {n} B request got a {got:?} B block"
        );
        roundtrip(ctx, p, n, 30 + i as u32)?;
        ptrs.push(p);
    }
    let total: u64 = sizes.iter().map(|&n| n as u64).sum();
    let st = a.stats();
    ensure!(
        st.reserved_bytes.current == total
            && st.allocated_bytes.current == total
            && st.segments.current == sizes.len() as u64,
        "{} exact blocks of {total} B in all: {st:?}",
        sizes.len()
    );
    let freed = ptrs[2];
    a.free(freed)?;
    let smaller = a.malloc(512, s)?;
    ensure!(
        smaller != freed,
        "a 512 B request reused the freed 513 B block"
    );
    let same = a.malloc(513, s)?;
    ensure!(
        same == freed,
        "a 513 B request did not reuse the freed 513 B block: {same:?} vs {freed:?}"
    );
    roundtrip(ctx, same, 513, 40)?;
    ptrs[2] = same;
    ptrs.push(smaller);
    for p in ptrs {
        a.free(p)?;
    }
    a.empty_cache()?;
    let st = a.stats();
    ensure!(
        st.reserved_bytes.current == 0 && st.segments.current == 0,
        "empty_cache kept segments in exact mode: {st:?}"
    );
    a.set_exact(false);
    let p = a.malloc(1, s)?;
    let got = a.block(p).map(|b| b.size);
    a.free(p)?;
    ensure!(
        got == Some(512),
        "with exact mode off again, 1 B got a {got:?} B block, not 512"
    );
    Ok(())
}

/// Strict mode (`UNIRT_ALLOC_STRICT`, here switched on per allocator): a pointer kept after
/// its block was freed is a typed error instead of an alias of the next allocation, and the
/// quarantine gives its memory back on `empty_cache`.
fn strict_mode(ctx: &Ctx) -> Result<(), Failure> {
    let a = fresh(ctx);
    let s = ctx.default_stream();
    a.set_strict(Some(1 << 20));
    let p = a.malloc(4096, s)?;
    roundtrip(ctx, p, 4096, 21)?;
    a.free(p)?;
    let q = a.malloc(4096, s)?;
    ensure!(q != p, "a quarantined block was handed out again");
    expect_err(a.free(p), &["invalid_handle"], "freeing a stale pointer")?;
    expect_err(
        a.check_not_freed(DevicePtr(p.0 + 100), 8),
        &["invalid_handle"],
        "using a stale interior pointer",
    )?;
    a.check_not_freed(q, 4096)?;
    roundtrip(ctx, q, 4096, 22)?;
    a.free(q)?;
    a.empty_cache()?;
    let st = a.stats();
    ensure!(
        st.reserved_bytes.current == 0,
        "empty_cache kept {} bytes reserved in strict mode",
        st.reserved_bytes.current
    );
    a.check_not_freed(p, 1)?;
    Ok(())
}
