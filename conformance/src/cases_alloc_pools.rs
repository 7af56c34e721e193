//! Allocator cases, continued: graph-private pools and pin mode, the OOM path, empty_cache,
//! concurrent threads, and the pinned host pool.
//!
//! Every case builds its own allocator (or a standalone runtime) over the device so the
//! statistics start at zero while other cases run in parallel, and checks real addresses and
//! real statistics. Device memory is only ever touched through the HAL (copies, memset,
//! kernels), so the cases hold on devices whose memory the host cannot address.

use std::sync::Arc;

use super::*;
use crate::ensure;
use unirt::alloc::{CachingAllocator, FaultInjector, PinnedHostPool};
use unirt::hal::{CaptureMode, DevicePtr, EventStatus, HostPtr};
use unirt::runtime::Runtime;
use unirt::stream::{BackendExt, Event, Stream};

use super::cases_alloc::{default_policy, fresh, keep_busy, roundtrip, MIB};

fn private_pool_address_stability(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::standalone(ctx.backend.clone());
    // The segment arithmetic below is the default policy's.
    let a = default_policy(rt.allocator().clone());
    let s = Stream::new(&ctx.backend)?;
    let n = 1024u32;
    let bytes = 4 * n as usize;
    let out = a.malloc(bytes, s.id())?;
    ctx.memset(out, 0, bytes)?;
    let reserved0 = a.stats().reserved_bytes.current;

    rt.begin_capture(s.id(), CaptureMode::ThreadLocal)?;
    let recorded = (|| -> Result<DevicePtr, Failure> {
        let tmp = a.malloc(bytes, s.id())?;
        ensure!(
            a.block(tmp).is_some_and(|b| b.private),
            "an allocation while recording did not come from the private pool"
        );
        ctx.launch(
            "fill",
            &[tmp.into(), 0xabcd_0123u32.into(), n.into()],
            s.id(),
        )?;
        // SAFETY: both ranges are device ranges, checked by the backend.
        unsafe { ctx.memcpy_async(out.0, tmp.0, bytes, unirt::MemcpyKind::D2D, s.id())? };
        a.free(tmp)?;
        let again = a.malloc(bytes, s.id())?;
        ensure!(
            again == tmp,
            "a block freed while recording was not reused inside the pool"
        );
        a.free(again)?;
        Ok(tmp)
    })();
    let graph = rt.end_capture()?;
    let tmp = recorded?;
    ensure!(
        !a.is_recording(),
        "the allocator still routes to the private pool"
    );

    // Outside the recording the freed temporary must not be handed out again.
    let mut others = Vec::new();
    for i in 0..4 {
        let x = a.malloc(bytes, s.id())?;
        ensure!(
            x.0 + bytes as u64 <= tmp.0 || x.0 >= tmp.0 + bytes as u64,
            "allocation {i} at {x:?} overlaps the graph's temporary at {tmp:?}"
        );
        ctx.copy_to_device(x, &pattern(bytes, 10 + i))?;
        others.push(x);
    }
    let exec = graph.instantiate()?;
    exec.launch(s.id())?;
    s.synchronize()?;
    let got = bytes_f32(&ctx.read_vec(out, bytes)?);
    let want = f32::from_bits(0xabcd_0123);
    ensure!(
        got.iter().all(|v| v.to_bits() == want.to_bits()),
        "the replay did not write the recorded result"
    );
    for (i, &x) in others.iter().enumerate() {
        same(
            &ctx.read_vec(x, bytes)?,
            &pattern(bytes, 10 + i as u32),
            "memory allocated after the recording",
        )?;
    }
    let reserved1 = a.stats().reserved_bytes.current;
    drop(graph);
    ensure!(
        a.stats().reserved_bytes.current == reserved1,
        "the pool was released while an executable graph still uses it"
    );
    drop(exec);
    let reserved2 = a.stats().reserved_bytes.current;
    ensure!(
        reserved2 + 2 * MIB == reserved1 && reserved2 >= reserved0,
        "dropping the last graph did not release its 2 MiB private segment ({reserved1} -> {reserved2})"
    );
    for x in others.into_iter().chain([out]) {
        a.free(x)?;
    }
    Ok(())
}

fn pin_mode_keeps_addresses(ctx: &Ctx) -> Result<(), Failure> {
    let a = fresh(ctx);
    let s = ctx.default_stream();
    ensure!(
        a.set_pin_mode(true)?.is_none(),
        "turning pin mode on returned a pool"
    );
    let p = a.malloc(4096, s)?;
    a.free(p)?;
    let pool = a.set_pin_mode(false)?;
    ensure!(pool.is_some(), "turning pin mode off returned no pool");
    let q = a.malloc(4096, s)?;
    ensure!(q != p, "memory from pin mode was handed out after it ended");
    ensure!(
        a.stats().segments.current == 2,
        "expected a pinned and a shared segment"
    );
    drop(pool);
    ensure!(
        a.stats().segments.current == 1,
        "dropping the pin-mode pool did not release its segment"
    );
    a.free(q)?;
    Ok(())
}

fn oom_retry_frees_cache(ctx: &Ctx) -> Result<(), Failure> {
    let faulty = Arc::new(FaultInjector::new(ctx.backend.clone(), 2, 1));
    let a = default_policy(CachingAllocator::new(faulty.clone()));
    let s = ctx.default_stream();
    let small = a.malloc(4096, s)?;
    a.free(small)?;
    let big = a.malloc(3 * MIB as usize, s)?;
    roundtrip(ctx, big, 3 * MIB as usize, 6)?;
    let st = a.stats();
    ensure!(
        faulty.failed() == 1 && st.retries == 1 && st.ooms == 0,
        "expected one injected failure and one retry: failed {}, {st}",
        faulty.failed()
    );
    ensure!(
        st.reserved_bytes.current == 20 * MIB && st.raw_frees == 1,
        "the retry should have freed the cached 2 MiB segment: {st}"
    );
    a.free(big)?;
    Ok(())
}

fn oom_is_typed_with_stats(ctx: &Ctx) -> Result<(), Failure> {
    let faulty = Arc::new(FaultInjector::new(ctx.backend.clone(), 2, 2));
    let a = CachingAllocator::new(faulty.clone());
    let s = ctx.default_stream();
    let keep = a.malloc(4096, s)?;
    let r = a.malloc(3 * MIB as usize, s);
    match &r {
        Err(e @ unirt::Error::OutOfMemory { .. }) => {
            let m = e.to_string();
            ensure!(
                m.contains("reserved") && m.contains("allocated"),
                "the OOM message lacks the statistics: {m}"
            );
        }
        other => {
            return Err(Failure::Failed(format!(
                "expected OutOfMemory, got {other:?}"
            )))
        }
    }
    let st = a.stats();
    ensure!(
        st.ooms == 1 && st.retries == 1 && faulty.calls() == 3,
        "after the OOM: {st}, {} raw calls",
        faulty.calls()
    );
    // The allocator keeps working: old blocks are intact, new raw allocations succeed.
    roundtrip(ctx, keep, 4096, 7)?;
    let big = a.malloc(3 * MIB as usize, s)?;
    a.free(big)?;
    a.free(keep)?;
    Ok(())
}

fn empty_cache_keeps_live(ctx: &Ctx) -> Result<(), Failure> {
    let a = fresh(ctx);
    let s = ctx.default_stream();
    let live = a.malloc(4096, s)?;
    let big = a.malloc(3 * MIB as usize, s)?;
    a.free(big)?;
    a.empty_cache()?;
    let st = a.stats();
    ensure!(
        st.reserved_bytes.current == 2 * MIB && st.segments.current == 1,
        "empty_cache should keep only the live block's segment: {st}"
    );
    roundtrip(ctx, live, 4096, 8)?;
    a.free(live)?;
    Ok(())
}

fn concurrent_threads(ctx: &Ctx) -> Result<(), Failure> {
    const THREADS: u32 = 8;
    const ITERS: u32 = 60;
    let a = fresh(ctx);
    let results: Vec<Result<(), Failure>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let a = a.clone();
                let b = ctx.backend.clone();
                sc.spawn(move || -> Result<(), Failure> {
                    let s = if t % 2 == 0 {
                        b.default_stream()
                    } else {
                        b.stream_create()?
                    };
                    let mut x = 0x9e37_79b9u32.wrapping_mul(t + 1) | 1;
                    let mut live: Vec<(DevicePtr, usize, u8)> = Vec::new();
                    for i in 0..ITERS {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        let len = if i % 16 == 7 {
                            (2 << 20) + 3
                        } else {
                            1 + (x % 300_000) as usize
                        };
                        let p = a.malloc(len, s)?;
                        let v = (t * 31 + i) as u8;
                        b.memset(p, v, len)?;
                        live.push((p, len, v));
                        if live.len() > 3 {
                            let (p, len, v) = live.remove(0);
                            let got = b.read_vec(p, len)?;
                            ensure!(
                                got.iter().all(|&g| g == v),
                                "thread {t}: a live block was overwritten (overlapping blocks)"
                            );
                            a.free(p)?;
                        }
                    }
                    for (p, _, _) in live {
                        a.free(p)?;
                    }
                    if s != b.default_stream() {
                        b.synchronize()?;
                        b.stream_destroy(s)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Failure::Failed("a thread panicked".into())))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    let st = a.stats();
    let n = (THREADS * ITERS) as u64;
    ensure!(
        st.allocations.total == n
            && st.allocations.current == 0
            && st.allocated_bytes.current == 0
            && st.active_blocks.current == 0
            && st.cache_hits + st.cache_misses == n,
        "after {n} concurrent allocations and frees: {st:?}"
    );
    Ok(())
}

fn pinned_pool_waits_for_streams(ctx: &Ctx) -> Result<(), Failure> {
    let pool = PinnedHostPool::new(ctx.backend.clone());
    let s2 = Stream::new(&ctx.backend)?;
    let h = pool.malloc(65536)?;
    pool.free(h)?;
    let h1 = pool.malloc(60000)?;
    ensure!(
        h1 == h,
        "a freed pinned block of the same class was not reused"
    );
    let n: u32 = 4 << 20;
    let big = Buf::new(&ctx.backend, 4 * n as usize)?;
    let dst = Buf::new(&ctx.backend, 65536)?;
    for round in 0..7 {
        let p: HostPtr = if round == 0 { h1 } else { pool.malloc(65536)? };
        ensure!(p == h, "the pinned block moved: {p:?}");
        keep_busy(ctx, s2.id(), big.ptr, n, 2 << round)?;
        // SAFETY: the source is a live pinned block that stays allocated until s2 is synced.
        unsafe { ctx.memcpy_async(dst.ptr.0, p.0, 65536, unirt::MemcpyKind::H2D, s2.id())? };
        ensure!(
            pool.record_stream(p.0 + 100, s2.id()),
            "an interior pinned address was not found"
        );
        let marker = Event::new(&ctx.backend)?;
        marker.record(&s2)?;
        pool.free(p)?;
        let q = pool.malloc(65536)?;
        let busy = marker.query()? == EventStatus::NotReady;
        if busy {
            ensure!(q != p, "a pinned block still read by a stream was reused");
        }
        s2.synchronize()?;
        pool.free(q)?;
        if busy {
            let reserved = pool.stats().reserved_bytes.current;
            let r = pool.malloc(65536)?;
            ensure!(
                r == p || r == q,
                "after the stream finished no cached block was reused"
            );
            ensure!(
                pool.stats().reserved_bytes.current == reserved,
                "the pool reserved new memory instead of reusing a finished block"
            );
            pool.free(r)?;
            return Ok(());
        }
    }
    Err(Failure::Failed(
        "the stream never stayed busy long enough".into(),
    ))
}

pub(super) const CASES: &[Case] = &[
    Case {
        name: "alloc::private_pool_address_stability",
        needs: &[Need::Capture],
        run: private_pool_address_stability,
    },
    Case {
        name: "alloc::pin_mode_keeps_addresses",
        needs: &[],
        run: pin_mode_keeps_addresses,
    },
    Case {
        name: "alloc::oom_retry_frees_cache",
        needs: &[],
        run: oom_retry_frees_cache,
    },
    Case {
        name: "alloc::oom_is_typed_with_stats",
        needs: &[],
        run: oom_is_typed_with_stats,
    },
    Case {
        name: "alloc::empty_cache_keeps_live",
        needs: &[],
        run: empty_cache_keeps_live,
    },
    Case {
        name: "alloc::concurrent_threads",
        needs: &[],
        run: concurrent_threads,
    },
    Case {
        name: "alloc::pinned_pool_waits_for_streams",
        needs: &[Need::AsyncStreams],
        run: pinned_pool_waits_for_streams,
    },
];
