//! Memory lifetimes under queued work, threads and graphs (issue 10, scenarios 1–6): an
//! allocation is never released while work may still touch it, a check holds for the whole
//! operation, and every address unirt handed out — device or pinned host — is tracked.
//!
//! Each scenario runs with a small buffer and a large one (64 MiB, so the host allocator maps
//! it with `mmap` and a premature release unmaps it: a use-after-free faults instead of
//! silently writing reused heap memory).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::*;
use crate::ensure;
use unirt::hal::{CaptureMode, DevicePtr, EventFlags, EventStatus, MemcpyKind};
use unirt::{Backend, BackendExt, Stream};

const SMALL: usize = 4 << 10;
const LARGE: usize = 64 << 20;
const STREAMS: &[Need] = &[Need::AsyncStreams];
const CAP: &[Need] = &[Need::Capture];
const ORDERED: &[Need] = &[Need::StreamOrderedMemory, Need::AsyncStreams];

pub(super) const CASES: &[Case] = &[
    Case {
        name: "lifetime::free_after_destroying_a_busy_stream",
        needs: STREAMS,
        run: |c| destroyed_stream_then_free(c, SMALL),
    },
    Case {
        name: "lifetime::free_after_destroying_a_busy_stream_64mib",
        needs: STREAMS,
        run: |c| destroyed_stream_then_free(c, LARGE),
    },
    Case {
        name: "lifetime::free_after_dropping_a_stream_with_50_fills_64mib",
        needs: STREAMS,
        run: dropped_stream_fills_then_free,
    },
    Case {
        name: "lifetime::free_after_capture_began",
        needs: CAP,
        run: |c| free_after_capture_began(c, SMALL),
    },
    Case {
        name: "lifetime::free_after_capture_began_64mib",
        needs: CAP,
        run: |c| free_after_capture_began(c, LARGE),
    },
    Case {
        name: "lifetime::replay_into_freed_pinned_memory",
        needs: CAP,
        run: |c| replay_into_freed_pinned(c, SMALL),
    },
    Case {
        name: "lifetime::replay_into_freed_pinned_memory_64mib",
        needs: CAP,
        run: |c| replay_into_freed_pinned(c, LARGE),
    },
    Case {
        name: "lifetime::copy_and_memset_racing_free",
        needs: &[],
        run: |c| racing_free(c, SMALL, 400),
    },
    Case {
        name: "lifetime::copy_and_memset_racing_free_64mib",
        needs: &[],
        run: |c| racing_free(c, LARGE, 12),
    },
    Case {
        name: "lifetime::free_async_while_another_stream_writes",
        needs: ORDERED,
        run: |c| free_async_other_stream(c, SMALL),
    },
    Case {
        name: "lifetime::free_async_while_another_stream_writes_64mib",
        needs: ORDERED,
        run: |c| free_async_other_stream(c, LARGE),
    },
    Case {
        name: "lifetime::free_async_after_another_stream_began_capturing",
        needs: &[Need::StreamOrderedMemory, Need::AsyncStreams, Need::Capture],
        run: |c| free_async_after_capture_began(c, SMALL),
    },
    Case {
        name: "lifetime::free_async_after_another_stream_began_capturing_64mib",
        needs: &[Need::StreamOrderedMemory, Need::AsyncStreams, Need::Capture],
        run: |c| free_async_after_capture_began(c, LARGE),
    },
    Case {
        name: "lifetime::host_kinds_given_device_pointers",
        needs: &[],
        run: |c| wrong_kind(c, SMALL),
    },
    Case {
        name: "lifetime::host_kinds_given_device_pointers_64mib",
        needs: &[],
        run: |c| wrong_kind(c, LARGE),
    },
];

/// Whether device memory is host memory on this device (the CPU backend), so a host-side
/// argument that is a device address is a valid host address there.
fn device_is_host(ctx: &Ctx) -> bool {
    ctx.kind() == unirt::DeviceKind::Cpu
}

/// Scenario 1: work queued on a stream that is then destroyed still completes, `free` and
/// `free_host` neither wait forever nor release memory under it, and device synchronize waits
/// for it.
fn destroyed_stream_then_free(ctx: &Ctx, bytes: usize) -> Result<(), Failure> {
    let p = ctx.malloc(bytes)?;
    let h = ctx.malloc_host(bytes)?;
    let marker = Buf::new(&ctx.backend, SMALL)?;
    let s = ctx.stream_create()?;
    let done = ctx.event_create(EventFlags::DISABLE_TIMING)?;
    for i in 0..8u8 {
        ctx.memset_async(p, i, bytes, s)?;
    }
    // SAFETY: `h` is pinned memory of `bytes` bytes, freed only through the backend, which
    // must keep it alive until this copy has run.
    unsafe { ctx.memcpy_async(h.0, p.0, bytes, MemcpyKind::D2H, s)? };
    ctx.memset_async(marker.ptr, 0x5a, SMALL, s)?;
    ctx.event_record(done, s)?;
    ctx.stream_destroy(s)?;
    ctx.free(p)?;
    ctx.free_host(h)?;
    ctx.synchronize()?;
    let status = ctx.event_query(done)?;
    ctx.event_destroy(done)?;
    ensure!(
        status == EventStatus::Complete,
        "device synchronize returned while a destroyed stream's work was pending"
    );
    same(
        &marker.read()?,
        &[0x5a; SMALL],
        "the destroyed stream's last memset",
    )
}

/// Scenario 1 from the Rust API: 50 fills over 64 MiB on a `Stream`, the `Stream` dropped,
/// then the buffer freed.
fn dropped_stream_fills_then_free(ctx: &Ctx) -> Result<(), Failure> {
    let n = (LARGE / 4) as u32;
    let p = ctx.malloc(LARGE)?;
    let marker = Buf::new(&ctx.backend, SMALL)?;
    {
        let s = Stream::new(&ctx.backend)?;
        for i in 0..50u32 {
            s.launch("fill", &[p.into(), i.into(), n.into()])?;
        }
        s.launch(
            "fill",
            &[marker.ptr.into(), 0x0102_0304u32.into(), 1024u32.into()],
        )?;
    }
    ctx.free(p)?;
    ctx.synchronize()?;
    let want: Vec<u8> = std::iter::repeat_n(0x0102_0304u32.to_le_bytes(), 1024)
        .flatten()
        .collect();
    same(&marker.read()?, &want, "the dropped stream's last fill")
}

/// Scenario 2: a free while the stream that still runs work on the buffer is capturing; and a
/// graph captured over a buffer freed during the capture is refused at instantiate.
fn free_after_capture_began(ctx: &Ctx, bytes: usize) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let p = ctx.malloc(bytes)?;
    for i in 0..4u8 {
        ctx.memset_async(p, i, bytes, s.id())?;
    }
    ctx.begin_capture(s.id(), CaptureMode::Relaxed)?;
    let freed = ctx.free(p);
    let g = ctx.end_capture(s.id())?;
    ctx.graph_destroy(g)?;
    match freed {
        Ok(()) => {}
        Err(e) if e.kind_name() == "capturing" => ctx.free(p)?,
        Err(e) => return Err(Failure::Failed(format!("free during a capture: {e}"))),
    }
    s.synchronize()?;

    let q = ctx.malloc(bytes)?;
    ctx.memset_async(q, 1, bytes, s.id())?;
    ctx.begin_capture(s.id(), CaptureMode::Relaxed)?;
    ctx.memset_async(q, 2, bytes, s.id())?;
    let freed = ctx.free(q);
    let g = ctx.end_capture(s.id())?;
    let r = ctx.graph_instantiate(g);
    if let Ok(x) = r {
        ctx.graph_exec_destroy(x)?;
    }
    ctx.graph_destroy(g)?;
    s.synchronize()?;
    if freed.is_err() {
        ctx.free(q)?;
        return Ok(());
    }
    expect_err(
        r,
        &["out_of_bounds", "invalid_handle"],
        "instantiating a graph whose buffer was freed during the capture",
    )
}

/// Scenario 3: a graph that copies into (or out of) pinned host memory is refused once that
/// memory is freed; a free while a replay is in flight waits for it or defers the release.
fn replay_into_freed_pinned(ctx: &Ctx, bytes: usize) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let data = pattern(bytes, 3);
    let p = Buf::with(&ctx.backend, &data)?;
    for kind in [MemcpyKind::D2H, MemcpyKind::H2D] {
        let h = ctx.malloc_host(bytes)?;
        ctx.begin_capture(s.id(), CaptureMode::Global)?;
        let (dst, src) = match kind {
            MemcpyKind::D2H => (h.0, p.ptr.0),
            _ => (p.ptr.0, h.0),
        };
        // SAFETY: `h` is pinned memory of `bytes` bytes; the backend must refuse a replay
        // once it is freed.
        let recorded = unsafe { ctx.memcpy_async(dst, src, bytes, kind, s.id()) };
        let g = ctx.end_capture(s.id())?;
        recorded?;
        let x = ctx.graph_instantiate(g)?;
        if kind == MemcpyKind::H2D {
            // SAFETY: `h` is live pinned memory of `bytes` bytes.
            unsafe { std::slice::from_raw_parts_mut(h.as_mut_ptr(), bytes) }.copy_from_slice(&data);
        }
        ctx.graph_launch(x, s.id())?;
        s.synchronize()?;
        if kind == MemcpyKind::D2H {
            // SAFETY: `h` is live pinned memory of `bytes` bytes; the replay has completed.
            let got = unsafe { std::slice::from_raw_parts(h.as_mut_ptr(), bytes) };
            same(got, &data, "replayed copy into pinned memory")?;
        }
        // A free right behind a replay: the replay still runs on live memory.
        ctx.graph_launch(x, s.id())?;
        ctx.free_host(h)?;
        s.synchronize()?;
        let r = ctx.graph_launch(x, s.id());
        s.synchronize()?;
        ctx.graph_exec_destroy(x)?;
        ctx.graph_destroy(g)?;
        expect_err(
            r,
            &["out_of_bounds", "invalid_handle"],
            &format!(
                "replaying a {} copy whose pinned memory was freed",
                kind.as_str()
            ),
        )?;
    }
    same(&p.read()?, &data, "the device buffer after the replays")
}

/// Scenario 4: one thread allocates and frees buffers while another copies into and sets the
/// current one (synchronously and on a stream). Every call completes or fails with a typed
/// error; none touches freed memory.
fn racing_free(ctx: &Ctx, bytes: usize, rounds: usize) -> Result<(), Failure> {
    let current = AtomicU64::new(0);
    let finished = AtomicBool::new(false);
    let data = pattern(bytes, 4);
    let allowed = ["out_of_bounds", "invalid_handle", "bad_param"];
    let backend = &ctx.backend;
    std::thread::scope(|scope| {
        let user = scope.spawn(|| -> Result<usize, Failure> {
            let s = Stream::new(backend)?;
            let mut calls = 0;
            let mut i = 0u32;
            while !finished.load(Ordering::Acquire) {
                let p = DevicePtr(current.load(Ordering::Acquire));
                if p.is_null() {
                    std::thread::yield_now();
                    continue;
                }
                i += 1;
                let r = match i % 3 {
                    0 => backend.copy_to_device(p, &data),
                    1 => backend.memset(p, i as u8, bytes),
                    _ => backend
                        .memset_async(p, i as u8, bytes, s.id())
                        .and_then(|()| s.synchronize()),
                };
                calls += 1;
                if let Err(e) = r {
                    ensure!(
                        allowed.contains(&e.kind_name()),
                        "a call racing a free failed with {e}"
                    );
                }
            }
            Ok(calls)
        });
        let owner = (|| -> Result<(), Failure> {
            for _ in 0..rounds {
                let p = backend.malloc(bytes)?;
                current.store(p.0, Ordering::Release);
                std::thread::yield_now();
                backend.free(p)?;
            }
            Ok(())
        })();
        finished.store(true, Ordering::Release);
        let used = user
            .join()
            .map_err(|_| Failure::Failed("the racing thread panicked".into()))?;
        owner?;
        used.map(|_| ())
    })
}

/// Scenario 5: `free_async(p, s2)` while `s1` still writes `p`.
fn free_async_other_stream(ctx: &Ctx, bytes: usize) -> Result<(), Failure> {
    let (s1, s2) = (Stream::new(&ctx.backend)?, Stream::new(&ctx.backend)?);
    let marker = Buf::new(&ctx.backend, SMALL)?;
    let p = ctx.malloc_async(bytes, s1.id())?;
    for i in 0..8u8 {
        ctx.memset_async(p, i, bytes, s1.id())?;
    }
    ctx.memset_async(marker.ptr, 0x77, SMALL, s1.id())?;
    ctx.free_async(p, s2.id())?;
    s2.synchronize()?;
    s1.synchronize()?;
    expect_err(
        ctx.memset(p, 0, bytes),
        &["out_of_bounds", "invalid_handle"],
        "memset of memory freed with free_async",
    )?;
    same(&marker.read()?, &[0x77; SMALL], "s1's last memset")
}

/// Scenario 5 with a capture: the stream that queued work on the memory has begun capturing
/// when another stream frees it stream-ordered. The free still waits for the work queued before
/// the capture (a capturing stream cannot be waited on through an event recorded now — that
/// would go into its capture — so unirt waits on one recorded when the capture began). Over the
/// fake driver a release ahead of that work is a sticky illegal address, as a real GPU's pool
/// would hand the memory to the next allocation under the queued writes.
fn free_async_after_capture_began(ctx: &Ctx, bytes: usize) -> Result<(), Failure> {
    let (s1, s2) = (Stream::new(&ctx.backend)?, Stream::new(&ctx.backend)?);
    let marker = Buf::new(&ctx.backend, SMALL)?;
    let p = ctx.malloc_async(bytes, s1.id())?;
    s1.synchronize()?;
    for i in 0..8u8 {
        ctx.memset_async(p, i, bytes, s1.id())?;
    }
    ctx.memset_async(marker.ptr, 0x77, SMALL, s1.id())?;
    ctx.begin_capture(s1.id(), CaptureMode::Relaxed)?;
    let freed = ctx.free_async(p, s2.id());
    let synced = s2.synchronize();
    let g = ctx.end_capture(s1.id())?;
    ctx.graph_destroy(g)?;
    synced?;
    match freed {
        Ok(()) => {}
        Err(e) if e.kind_name() == "capturing" => ctx.free_async(p, s2.id())?,
        Err(e) => return Err(Failure::Failed(format!("free_async during a capture: {e}"))),
    }
    s2.synchronize()?;
    s1.synchronize()?;
    same(
        &marker.read()?,
        &[0x77; SMALL],
        "s1's last memset before the capture",
    )
}

/// Scenario 6: host-to-host, host-to-device and device-to-host copies given device pointers
/// on the host side. Where device memory is host memory (CPU) the copy happens, bounds
/// checked; elsewhere it is refused — never a dereference of a device address on the host.
fn wrong_kind(ctx: &Ctx, bytes: usize) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let data = pattern(bytes, 6);
    let src = Buf::with(&ctx.backend, &data)?;
    let dst = Buf::new(&ctx.backend, bytes)?;
    let mut host = vec![0u8; bytes];
    let host_addr = host.as_mut_ptr() as usize as u64;
    for kind in [MemcpyKind::H2H, MemcpyKind::H2D, MemcpyKind::D2H] {
        for on_stream in [false, true] {
            ctx.memset(dst.ptr, 0, bytes)?;
            let what = format!(
                "{} {} given two device pointers",
                kind.as_str(),
                if on_stream { "memcpy_async" } else { "memcpy" }
            );
            // SAFETY: both addresses are device allocations of `bytes` bytes; the backend must
            // either use them as host memory (CPU) or refuse.
            let r = unsafe {
                if on_stream {
                    ctx.memcpy_async(dst.ptr.0, src.ptr.0, bytes, kind, s.id())
                        .and_then(|()| s.synchronize())
                } else {
                    ctx.memcpy(dst.ptr.0, src.ptr.0, bytes, kind)
                }
            };
            if device_is_host(ctx) {
                r.map_err(|e| Failure::Failed(format!("{what}: {e}")))?;
                same(&dst.read()?, &data, &what)?;
            } else {
                expect_err(r, &["bad_param"], &what)?;
            }
            // One byte past the end of the device allocation is never read.
            // SAFETY: as above; the range runs one byte past both allocations.
            let r = unsafe { ctx.memcpy(dst.ptr.0, src.ptr.0, bytes + 1, kind) };
            expect_err(
                r,
                &["out_of_bounds", "bad_param"],
                &format!("{what}, +1 byte"),
            )?;
        }
    }
    // Host-to-host with one side real host memory and the other a device pointer.
    host.fill(0);
    ctx.memset(dst.ptr, 0, bytes)?;
    for (d, h, what) in [
        (
            host_addr,
            src.ptr.0,
            "h2h reading a device pointer as host memory",
        ),
        (
            dst.ptr.0,
            data.as_ptr() as usize as u64,
            "h2h writing a device pointer as host memory",
        ),
    ] {
        // SAFETY: `host` and `data` are live vectors of `bytes` bytes; the device pointer is
        // checked by the backend.
        let r = unsafe { ctx.memcpy(d, h, bytes, MemcpyKind::H2H) };
        if device_is_host(ctx) {
            r.map_err(|e| Failure::Failed(format!("{what}: {e}")))?;
        } else {
            expect_err(r, &["bad_param"], what)?;
        }
    }
    if device_is_host(ctx) {
        same(&host, &data, "h2h from a device pointer")?;
        same(&dst.read()?, &data, "h2h into a device pointer")?;
    }
    Ok(())
}
