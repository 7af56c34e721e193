//! Unit tests of split / coalesce and the pools, on the CPU backend.

use super::*;
use crate::device::Device;

fn alloc() -> (Arc<AnyBackend>, Arc<CachingAllocator>) {
    let dev = crate::open(Device::CPU).expect("cpu opens");
    let a = CachingAllocator::new(dev.clone());
    (dev, a)
}

#[test]
fn split_then_coalesce_back_to_one_segment() {
    let (dev, a) = alloc();
    let s = dev.default_stream();
    let p = a.malloc(1000, s).unwrap();
    let q = a.malloc(3000, s).unwrap();
    let r = a.malloc(512, s).unwrap();
    assert_eq!(q.0, p.0 + 1024);
    assert_eq!(r.0, q.0 + 3072);
    assert_eq!(a.stats().segments.current, 1);
    // Free the middle, then the ends: everything merges into one 2 MiB block.
    a.free(q).unwrap();
    a.free(p).unwrap();
    a.free(r).unwrap();
    let big = a.malloc(1 << 20, s).unwrap();
    assert_eq!(big, p);
    assert_eq!(a.stats().segments.current, 1);
    assert_eq!(a.stats().cache_misses, 1);
    a.free(big).unwrap();
    a.empty_cache().unwrap();
    let st = a.stats();
    assert_eq!((st.reserved_bytes.current, st.segments.current), (0, 0));
}

#[test]
fn best_fit_prefers_smallest_block() {
    let (dev, a) = alloc();
    let s = dev.default_stream();
    let x: Vec<DevicePtr> = (0..5).map(|_| a.malloc(4096, s).unwrap()).collect();
    // Holes of 4 KiB (x[1]) and 8 KiB (x[3]); keep x[0], x[2], x[4] as walls.
    a.free(x[1]).unwrap();
    let y = a.malloc(4096, s).unwrap();
    assert_eq!(y, x[1]);
    a.free(y).unwrap();
    let tail_before = a.malloc(8192, s).unwrap();
    // 8 KiB does not fit the 4 KiB hole, so it comes from the tail.
    assert!(tail_before.0 > x[4].0);
    let z = a.malloc(2048, s).unwrap();
    assert_eq!(z, x[1], "smallest hole first");
    for p in [x[0], x[2], x[3], x[4], tail_before, z] {
        a.free(p).unwrap();
    }
    assert_eq!(a.stats().allocated_bytes.current, 0);
}

#[test]
fn large_pool_does_not_shred() {
    let (dev, a) = alloc();
    let s = dev.default_stream();
    let p = a.malloc(19 << 20, s).unwrap();
    let info = a.block(p).unwrap();
    // 1 MiB left in a 20 MiB segment is not worth a split in the large pool.
    assert_eq!(info.size, 20 << 20);
    assert_eq!(info.requested, 19 << 20);
    a.free(p).unwrap();
    assert!(a.free(p).is_err(), "double free is an error");
}

#[test]
fn private_pool_released_with_last_handle() {
    let (dev, a) = alloc();
    let s = dev.default_stream();
    let pool = a.begin_private().unwrap();
    assert!(a.begin_private().is_err());
    let p = a.malloc(4096, s).unwrap();
    assert!(a.block(p).unwrap().private);
    a.free(p).unwrap();
    a.end_private(&pool);
    let q = a.malloc(4096, s).unwrap();
    assert_ne!(q, p, "private memory is not handed out after the recording");
    assert_eq!(a.stats().segments.current, 2);
    drop(pool);
    assert_eq!(a.stats().segments.current, 1);
    a.free(q).unwrap();
}

#[test]
fn quick_list_parks_then_merges_on_a_miss() {
    let (dev, a) = alloc();
    let s = dev.default_stream();
    let p = a.malloc(4096, s).unwrap();
    let q = a.malloc(4096, s).unwrap();
    a.free(p).unwrap();
    // Parked, not merged: the same size comes straight back.
    assert_eq!(a.malloc(4096, s).unwrap(), p);
    a.free(p).unwrap();
    a.free(q).unwrap();
    let st = a.stats();
    assert_eq!(
        (st.allocated_bytes.current, st.active_bytes.current),
        (0, 0)
    );
    // A size the quick list cannot serve flushes it: p, q and the rest merge into one block.
    let big = a.malloc(1 << 20, s).unwrap();
    assert_eq!(big, p);
    assert_eq!(a.stats().segments.current, 1);
    a.free(big).unwrap();
}

#[test]
fn quick_list_overflow_merges_the_oldest() {
    let (dev, a) = alloc();
    let s = dev.default_stream();
    let ps: Vec<DevicePtr> = (0..QUICK + 2).map(|_| a.malloc(512, s).unwrap()).collect();
    for &p in &ps {
        a.free(p).unwrap();
    }
    let st = a.stats();
    assert_eq!(st.allocations.current, 0);
    assert_eq!(st.active_blocks.current, 0);
    // Everything is free: after a flush the whole segment is one block again.
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes.current, 0);
}

#[test]
fn pinned_pool_classes_and_interior_addresses() {
    let dev = crate::open(Device::CPU).unwrap();
    let pool = PinnedHostPool::new(dev.clone());
    assert_eq!(PinnedHostPool::class_of(1), Some(512));
    assert_eq!(PinnedHostPool::class_of(5000), Some(8192));
    let h = pool.malloc(5000).unwrap();
    assert!(pool.contains(h.0 + 8191));
    assert!(!pool.contains(h.0 + 8192));
    assert!(pool.record_stream(h.0 + 100, dev.default_stream()));
    assert!(!pool.record_stream(h.0 + 9000, dev.default_stream()));
    pool.free(h).unwrap();
    assert!(pool.free(h).is_err(), "double free");
    dev.synchronize().unwrap();
    assert_eq!(
        pool.malloc(6000).unwrap(),
        h,
        "same class, reused after the stream finished"
    );
    let st = pool.stats();
    assert_eq!((st.cache_misses, st.cache_hits), (1, 1));
}

#[test]
fn fault_injector_counts() {
    let dev = crate::open(Device::CPU).unwrap();
    let f = Arc::new(FaultInjector::new(dev.clone(), 2, 1));
    let a = CachingAllocator::new(f.clone());
    let s = dev.default_stream();
    let p = a.malloc(4096, s).unwrap(); // raw #1
    let q = a.malloc(3 << 20, s).unwrap(); // raw #2 fails, #3 succeeds
    assert_eq!((f.calls(), f.failed()), (3, 1));
    assert_eq!(a.stats().retries, 1);
    a.free(p).unwrap();
    a.free(q).unwrap();
}

#[test]
fn dropping_a_private_pool_keeps_the_shared_cache() {
    let (dev, a) = alloc();
    let s = dev.default_stream();
    let p = a.malloc(4096, s).unwrap();
    a.free(p).unwrap();
    let pool = a.begin_private().unwrap();
    let q = a.malloc(4096, s).unwrap();
    a.free(q).unwrap();
    a.end_private(&pool);
    assert_eq!(a.stats().segments.current, 2);
    drop(pool);
    let st = a.stats();
    assert_eq!(
        (st.segments.current, st.reserved_bytes.current),
        (1, 2 << 20)
    );
    assert_eq!(
        a.malloc(4096, s).unwrap(),
        p,
        "the shared cache is still warm"
    );
}

/// Strict mode (issue 17): a stale pointer kept after its block was freed is a typed error,
/// not a silent alias of the next allocation. The same sequence without strict mode shows the
/// alias, so the test fails if quarantining stops happening.
#[test]
fn strict_mode_turns_stale_pointers_into_errors() {
    let (dev, a) = alloc();
    let s = dev.default_stream();
    a.set_strict(None);
    // Default: the freed block comes straight back, and a stale free frees the new owner's.
    let p = a.malloc(4096, s).unwrap();
    a.free(p).unwrap();
    let q = a.malloc(4096, s).unwrap();
    assert_eq!(
        q, p,
        "without strict mode the next allocation aliases the stale pointer"
    );
    a.free(q).unwrap();

    a.set_strict(Some(1 << 20));
    assert_eq!(a.strict(), Some(1 << 20));
    let p = a.malloc(4096, s).unwrap();
    a.free(p).unwrap();
    let q = a.malloc(4096, s).unwrap();
    assert_ne!(q, p, "a quarantined block was handed out again");
    let freed = |e: Error| {
        matches!(e, Error::InvalidHandle { kind, handle }
            if kind == strict::FREED_KIND && (p.0..p.0 + 4096).contains(&handle))
    };
    assert!(freed(a.free(p).unwrap_err()), "double free");
    assert!(freed(
        a.check_not_freed(DevicePtr(p.0 + 100), 8).unwrap_err()
    ));
    assert!(
        a.check_not_freed(q, 4096).is_ok(),
        "a live block is not stale"
    );
    a.free(q).unwrap();

    // Beyond the limit the oldest blocks go back to the cache (reusable, no longer caught).
    let many: Vec<DevicePtr> = (0..300).map(|_| a.malloc(4096, s).unwrap()).collect();
    for &m in &many {
        a.free(m).unwrap();
    }
    let st = a.stats();
    assert_eq!(st.allocated_bytes.current, 0);
    assert!(
        st.active_bytes.current <= (1 << 20) + 4096,
        "quarantine over its limit: {}",
        st.active_bytes.current
    );
    assert!(
        a.check_not_freed(many[0], 1).is_ok(),
        "the oldest left the quarantine"
    );
    assert!(
        a.check_not_freed(many[299], 1).is_err(),
        "the newest is still there"
    );

    // empty_cache and turning strict mode off both release the quarantine.
    a.empty_cache().unwrap();
    assert!(a.check_not_freed(many[299], 1).is_ok());
    let st = a.stats();
    assert_eq!((st.active_bytes.current, st.reserved_bytes.current), (0, 0));
    let p = a.malloc(4096, s).unwrap();
    a.free(p).unwrap();
    a.set_strict(None);
    assert!(a.check_not_freed(p, 1).is_ok());
    assert_eq!(
        a.malloc(4096, s).unwrap(),
        p,
        "turning strict off released the quarantine"
    );
}

/// The environment switch: the off words, the on words, and the size variable.
#[test]
fn strict_mode_environment_values() {
    use strict::limit_from;
    for off in [
        None,
        Some(""),
        Some("0"),
        Some("off"),
        Some("FALSE"),
        Some("no"),
    ] {
        assert_eq!(limit_from(off, None), None, "{off:?}");
    }
    assert_eq!(limit_from(Some("1"), None), Some(256 << 20));
    assert_eq!(limit_from(Some("on"), Some("8")), Some(8 << 20));
    assert_eq!(limit_from(Some("yes"), Some("lots")), Some(256 << 20));
}

/// A block freed after use on another stream is quarantined once its events complete.
#[test]
fn strict_mode_covers_blocks_freed_after_other_streams() {
    let (dev, a) = alloc();
    let s = dev.default_stream();
    let other = dev.stream_create().unwrap();
    a.set_strict(Some(1 << 20));
    let p = a.malloc(4096, s).unwrap();
    a.record_stream(p, other).unwrap();
    a.free(p).unwrap();
    dev.synchronize().unwrap();
    let q = a.malloc(4096, s).unwrap();
    assert_ne!(q, p);
    assert!(a.check_not_freed(p, 1).is_err());
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    dev.stream_destroy(other).unwrap();
}

/// Through the Runtime: a pointer kept after its `Memory` dropped is refused by the copies.
#[test]
fn strict_mode_refuses_copies_through_a_dropped_memory() {
    let rt = crate::Runtime::standalone(crate::open(Device::CPU).expect("cpu opens"));
    rt.allocator().set_strict(Some(1 << 20));
    let live = rt.allocate_memory(64).unwrap();
    let m = rt.allocate_memory(64).unwrap();
    let stale = m.device_ptr();
    rt.memcpy_d2d(stale, live.device_ptr(), 64, false).unwrap();
    drop(m);
    let again = rt.allocate_memory(64).unwrap();
    assert_ne!(again.device_ptr(), stale);
    for r in [
        rt.memcpy_d2d(stale, live.device_ptr(), 64, false),
        rt.memcpy_d2d(live.device_ptr(), stale, 64, false),
    ] {
        assert!(
            matches!(r, Err(Error::InvalidHandle { kind, .. }) if kind == strict::FREED_KIND),
            "{r:?}"
        );
    }
    let mut host = [0u8; 64];
    // SAFETY: `host` is writable for 64 bytes; the copy is refused before it is enqueued.
    let r = unsafe { rt.memcpy_d2h(host.as_mut_ptr(), stale, 64) };
    assert!(r.is_err());
}
