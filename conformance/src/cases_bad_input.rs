//! Bad input: every misuse returns its documented error and leaves the device usable.

use super::*;
use unirt::hal::{
    CaptureMode, DevicePtr, EventFlags, EventId, GraphExecId, GraphId, HostPtr, KernelArg,
    MemcpyKind, StreamId,
};
use unirt::{Backend, Stream};

pub(super) const CASES: &[Case] = &[
    Case {
        name: "bad::free_unknown_pointer",
        needs: &[],
        run: free_unknown,
    },
    Case {
        name: "bad::double_free",
        needs: &[],
        run: double_free,
    },
    Case {
        name: "bad::free_interior_pointer",
        needs: &[],
        run: free_interior,
    },
    Case {
        name: "bad::memcpy_out_of_bounds",
        needs: &[],
        run: memcpy_oob,
    },
    Case {
        name: "bad::memcpy_null_pointers",
        needs: &[],
        run: memcpy_null,
    },
    Case {
        name: "bad::memset_out_of_bounds",
        needs: &[],
        run: memset_oob,
    },
    Case {
        name: "bad::destroyed_stream",
        needs: &[],
        run: destroyed_stream,
    },
    Case {
        name: "bad::destroyed_event",
        needs: &[],
        run: destroyed_event,
    },
    Case {
        name: "bad::never_created_handles",
        needs: &[],
        run: foreign_handles,
    },
    Case {
        name: "bad::event_flags",
        needs: &[],
        run: event_flags,
    },
    Case {
        name: "bad::huge_allocation",
        needs: &[],
        run: huge,
    },
    Case {
        name: "bad::allocations_not_yet_touched",
        needs: &[],
        run: untouched,
    },
    Case {
        name: "bad::kernel_arguments",
        needs: &[],
        run: kernel_args,
    },
    Case {
        name: "bad::failed_async_enqueues_nothing",
        needs: &[],
        run: failed_async,
    },
    Case {
        name: "bad::pinned_host_misuse",
        needs: &[],
        run: pinned_misuse,
    },
    Case {
        name: "bad::raw_kind_values",
        needs: &[],
        run: raw_kinds,
    },
];

fn free_unknown(ctx: &Ctx) -> Result<(), Failure> {
    expect_err(
        ctx.free(DevicePtr(0xdead_0000)),
        &["invalid_handle"],
        "free of an address never allocated",
    )?;
    let b = Buf::new(&ctx.backend, 64)?;
    expect_err(
        ctx.free(b.at(1 << 30)),
        &["invalid_handle"],
        "free far past an allocation",
    )?;
    Ok(())
}

fn double_free(ctx: &Ctx) -> Result<(), Failure> {
    let p = ctx.malloc(1000)?;
    ctx.free(p)?;
    expect_err(ctx.free(p), &["invalid_handle"], "second free")?;
    // The device is still fine.
    let b = Buf::with(&ctx.backend, &[1, 2, 3])?;
    same(&b.read()?, &[1, 2, 3], "allocation after a double free")
}

fn free_interior(ctx: &Ctx) -> Result<(), Failure> {
    let b = Buf::new(&ctx.backend, 1000)?;
    expect_err(
        ctx.free(b.at(8)),
        &["bad_param"],
        "free of an interior pointer",
    )?;
    ctx.memset(b.ptr, 4, 1000)?;
    same(
        &b.read()?,
        &[4; 1000],
        "allocation still live after the refused free",
    )
}

fn memcpy_oob(ctx: &Ctx) -> Result<(), Failure> {
    let (a, b) = (Buf::new(&ctx.backend, 100)?, Buf::new(&ctx.backend, 100)?);
    let mut host = vec![0u8; 200];
    let s = ctx.default_stream();
    let h = host.as_mut_ptr() as u64;
    // SAFETY: each call is refused before touching memory (checked by the case); host is 200 bytes.
    unsafe {
        expect_err(
            ctx.memcpy(a.ptr.0, b.ptr.0, 101, MemcpyKind::D2D),
            &["out_of_bounds"],
            "D2D one byte too many",
        )?;
        expect_err(
            ctx.memcpy(a.at(50).0, b.ptr.0, 51, MemcpyKind::D2D),
            &["out_of_bounds"],
            "D2D past dst end",
        )?;
        expect_err(
            ctx.memcpy(a.ptr.0, h, 101, MemcpyKind::H2D),
            &["out_of_bounds"],
            "H2D past dst end",
        )?;
        expect_err(
            ctx.memcpy(h, b.at(99).0, 2, MemcpyKind::D2H),
            &["out_of_bounds"],
            "D2H past src end",
        )?;
        expect_err(
            ctx.memcpy(h, b.at(100).0, 1, MemcpyKind::D2H),
            &["out_of_bounds"],
            "D2H one past the end",
        )?;
        expect_err(
            ctx.memcpy_async(a.ptr.0, b.ptr.0, 101, MemcpyKind::D2D, s),
            &["out_of_bounds"],
            "async D2D too long",
        )?;
        expect_err(
            ctx.memcpy(a.ptr.0, h, usize::MAX, MemcpyKind::H2D),
            &["out_of_bounds", "bad_param", "too_large"],
            "a size that wraps",
        )?;
        expect_err(
            ctx.memcpy(0x10, h, 4, MemcpyKind::H2D),
            &["out_of_bounds"],
            "H2D to a non-device address",
        )?;
    }
    Ok(())
}

fn memcpy_null(ctx: &Ctx) -> Result<(), Failure> {
    let b = Buf::new(&ctx.backend, 16)?;
    let mut host = [0u8; 16];
    let h = host.as_mut_ptr() as u64;
    // SAFETY: every call has a null side and is refused.
    unsafe {
        expect_err(
            ctx.memcpy(0, h, 16, MemcpyKind::H2D),
            &["null_pointer"],
            "H2D to null",
        )?;
        expect_err(
            ctx.memcpy(b.ptr.0, 0, 16, MemcpyKind::H2D),
            &["null_pointer"],
            "H2D from null",
        )?;
        expect_err(
            ctx.memcpy(0, b.ptr.0, 16, MemcpyKind::D2H),
            &["null_pointer"],
            "D2H to null",
        )?;
        expect_err(
            ctx.memcpy(h, 0, 16, MemcpyKind::H2H),
            &["null_pointer"],
            "H2H from null",
        )?;
        expect_err(
            ctx.memcpy(0, b.ptr.0, 16, MemcpyKind::D2D),
            &["null_pointer"],
            "D2D to null",
        )?;
    }
    expect_err(
        ctx.memset(DevicePtr::NULL, 0, 16),
        &["null_pointer"],
        "memset of null",
    )?;
    Ok(())
}

fn memset_oob(ctx: &Ctx) -> Result<(), Failure> {
    let b = Buf::with(&ctx.backend, &[5u8; 100])?;
    expect_err(
        ctx.memset(b.ptr, 0, 101),
        &["out_of_bounds"],
        "memset one byte too many",
    )?;
    expect_err(
        ctx.memset(b.at(100), 0, 1),
        &["out_of_bounds"],
        "memset one past the end",
    )?;
    expect_err(
        ctx.memset_async(b.at(90), 0, 11, ctx.default_stream()),
        &["out_of_bounds"],
        "async memset past the end",
    )?;
    same(&b.read()?, &[5; 100], "memory after refused memsets")
}

fn destroyed_stream(ctx: &Ctx) -> Result<(), Failure> {
    let s = ctx.stream_create()?;
    let b = Buf::new(&ctx.backend, 16)?;
    ctx.stream_destroy(s)?;
    expect_err(
        ctx.stream_synchronize(s),
        &["invalid_handle"],
        "synchronize a destroyed stream",
    )?;
    expect_err(
        ctx.memset_async(b.ptr, 0, 16, s),
        &["invalid_handle"],
        "memset on a destroyed stream",
    )?;
    expect_err(
        ctx.launch("fill", &[b.ptr.into(), 0u32.into(), 4u32.into()], s),
        &["invalid_handle"],
        "launch on a destroyed stream",
    )?;
    expect_err(
        ctx.stream_destroy(s),
        &["invalid_handle"],
        "destroy a stream twice",
    )?;
    expect_err(
        ctx.begin_capture(s, CaptureMode::Global),
        &["invalid_handle"],
        "capture a destroyed stream",
    )?;
    Ok(())
}

fn destroyed_event(ctx: &Ctx) -> Result<(), Failure> {
    let e = ctx.event_create(EventFlags::DEFAULT)?;
    let f = ctx.event_create(EventFlags::DEFAULT)?;
    ctx.event_destroy(e)?;
    let s = ctx.default_stream();
    expect_err(
        ctx.event_record(e, s),
        &["invalid_handle"],
        "record a destroyed event",
    )?;
    expect_err(
        ctx.event_query(e),
        &["invalid_handle"],
        "query a destroyed event",
    )?;
    expect_err(
        ctx.event_synchronize(e),
        &["invalid_handle"],
        "synchronize a destroyed event",
    )?;
    expect_err(
        ctx.event_elapsed_ms(e, f),
        &["invalid_handle"],
        "elapsed from a destroyed event",
    )?;
    expect_err(
        ctx.stream_wait_event(s, e),
        &["invalid_handle"],
        "wait on a destroyed event",
    )?;
    expect_err(
        ctx.event_destroy(e),
        &["invalid_handle"],
        "destroy an event twice",
    )?;
    ctx.event_destroy(f)?;
    Ok(())
}

fn foreign_handles(ctx: &Ctx) -> Result<(), Failure> {
    let (s, e) = (StreamId(0x7777_0008), EventId(0x7777_0010));
    expect_err(
        ctx.stream_synchronize(s),
        &["invalid_handle"],
        "never-created stream",
    )?;
    expect_err(
        ctx.event_query(e),
        &["invalid_handle"],
        "never-created event",
    )?;
    expect_err(
        ctx.graph_instantiate(GraphId(0x7777_0020)),
        &["invalid_handle"],
        "never-created graph",
    )?;
    expect_err(
        ctx.graph_launch(GraphExecId(0x7777_0030), ctx.default_stream()),
        &["invalid_handle"],
        "never-created exec",
    )?;
    expect_err(
        ctx.graph_exec_destroy(GraphExecId(0x7777_0030)),
        &["invalid_handle"],
        "destroy a never-created exec",
    )?;
    Ok(())
}

fn event_flags(ctx: &Ctx) -> Result<(), Failure> {
    expect_err(
        ctx.event_create(EventFlags(0x4)),
        &["bad_param"],
        "unknown event flag 0x4",
    )?;
    expect_err(
        ctx.event_create(EventFlags(0x8000_0000)),
        &["bad_param"],
        "unknown event flag 0x80000000",
    )?;
    for f in [0, 1, 2, 3] {
        let e = ctx.event_create(EventFlags(f))?;
        ctx.event_destroy(e)?;
    }
    Ok(())
}

fn huge(ctx: &Ctx) -> Result<(), Failure> {
    for size in [usize::MAX, 1usize << 62, 1 << 50] {
        expect_err(
            ctx.malloc(size),
            &["out_of_memory", "too_large"],
            &format!("malloc({size})"),
        )?;
    }
    expect_err(
        ctx.malloc_host(1usize << 62),
        &["out_of_memory", "too_large"],
        "malloc_host(2^62)",
    )?;
    let s = Stream::new(&ctx.backend)?;
    if ctx.info().capabilities.stream_ordered_memory {
        expect_err(
            ctx.malloc_async(1usize << 62, s.id()),
            &["out_of_memory", "too_large"],
            "malloc_async(2^62)",
        )?;
    }
    // More than the device can back now — its free memory and a margin, less than the
    // machine has — is refused at once, also where the host overcommits (CPU memory, wgpu
    // buffers in host memory): such an allocation would otherwise succeed and kill the
    // process when its pages were first touched (a tensor filled, a copy read back).
    let m = ctx.mem_info()?;
    let over = m.free.saturating_add((m.free / 16).max(256 << 20));
    if let Ok(size) = usize::try_from(over) {
        expect_err(
            ctx.malloc(size),
            &["out_of_memory", "too_large"],
            &format!("malloc({size}) with {} bytes free", m.free),
        )?;
        if matches!(ctx.backend.kind(), DeviceKind::Cpu | DeviceKind::Wgpu) {
            // Their pinned memory is host memory too (CUDA's is the driver's to refuse).
            expect_err(
                ctx.malloc_host(size),
                &["out_of_memory", "too_large"],
                &format!("malloc_host({size}) with {} bytes of memory free", m.free),
            )?;
        }
        let t = unirt::tensor::Tensor::zeros(&[size], unirt::tensor::DType::U8, ctx.device);
        expect_err(
            t.map(drop),
            &["out_of_memory", "too_large"],
            &format!("a tensor of {size} bytes with {} bytes free", m.free),
        )?;
    }
    // Still usable.
    let b = Buf::with(&ctx.backend, &[8; 8])?;
    same(&b.read()?, &[8; 8], "allocation after refused huge ones")
}

/// Host memory allocated and not yet touched is memory the host has promised, though no
/// reading of the host's memory shows it until its pages are first written. Where unirt itself
/// allocates it untouched — the CPU device's memory, and the pinned memory of the CPU and
/// wgpu backends — allocations of 55% of the free memory and then of the free memory again
/// must not all succeed (filling them would get the process killed), and `mem_info` must
/// show the first part. (Held for a moment only: other cases may allocate too. unirt's
/// estimate may lend up to the process's other resident memory, hence the margins. A GL
/// adapter's buffers are left out: llvmpipe fills them at creation, holding the GL context
/// for seconds.)
fn untouched(ctx: &Ctx) -> Result<(), Failure> {
    let kind = ctx.backend.kind();
    if kind == DeviceKind::Cpu {
        hold_untouched(ctx, |n| ctx.malloc(n), |p| ctx.free(p), "malloc")?;
    }
    if matches!(kind, DeviceKind::Cpu | DeviceKind::Wgpu) {
        hold_untouched(
            ctx,
            |n| ctx.malloc_host(n),
            |p| ctx.free_host(p),
            "malloc_host",
        )?;
    }
    let b = Buf::with(&ctx.backend, &[9; 8])?;
    same(&b.read()?, &[9; 8], "allocation after untouched ones")
}

/// Allocates 55% of the free memory in pieces no larger than one allocation may be, checks
/// that `mem_info` counts it and that the free memory again is refused, and frees every piece.
fn hold_untouched<P: Copy>(
    ctx: &Ctx,
    alloc: impl Fn(usize) -> unirt::Result<P>,
    free: impl Fn(P) -> unirt::Result<()>,
    what: &str,
) -> Result<(), Failure> {
    let mut ptrs = Vec::new();
    let held = fill_untouched(ctx, &mut ptrs, alloc, what);
    let mut freed = Ok(());
    for p in ptrs {
        freed = freed.and(free(p));
    }
    held?;
    Ok(freed?)
}

fn fill_untouched<P>(
    ctx: &Ctx,
    ptrs: &mut Vec<P>,
    alloc: impl Fn(usize) -> unirt::Result<P>,
    what: &str,
) -> Result<(), Failure> {
    let free = ctx.mem_info()?.free;
    let piece = (free / 20 * 11)
        .min(ctx.info().max_allocation)
        .max(64 << 20);
    let Ok(piece) = usize::try_from(piece) else {
        return Ok(());
    };
    let target = free / 20 * 11;
    let mut total = 0u64;
    while total < target {
        let p = alloc(piece).map_err(|e| {
            Failure::Failed(format!(
                "{what}({piece}) refused after {total} of {free} free bytes: {e}"
            ))
        })?;
        ptrs.push(p);
        total += piece as u64;
    }
    let after = ctx.mem_info()?.free;
    if after > free.saturating_sub(total / 4) {
        return Err(Failure::Failed(format!(
            "mem_info says {after} bytes free after {what} of {total} untouched bytes \
             (it said {free} before)"
        )));
    }
    // The free memory again: one of the pieces must be refused before it is all granted.
    let mut again = 0u64;
    while again < free {
        match alloc(piece) {
            Ok(p) => {
                ptrs.push(p);
                again += piece as u64;
            }
            Err(e) => return expect_err(Err::<(), _>(e), &["out_of_memory"], what),
        }
    }
    Err(Failure::Failed(format!(
        "{what} granted {} untouched bytes with {free} bytes free",
        total + again
    )))
}

fn kernel_args(ctx: &Ctx) -> Result<(), Failure> {
    let b = Buf::with(&ctx.backend, &[0u8; 64])?;
    let s = ctx.default_stream();
    let n = |v: u32| KernelArg::U32(v);
    let p = |d: DevicePtr| KernelArg::Ptr(d);
    expect_err(
        ctx.launch("no_such_kernel", &[], s),
        &["bad_param"],
        "unknown kernel",
    )?;
    expect_err(
        ctx.launch("fill", &[p(b.ptr), n(0)], s),
        &["bad_param"],
        "too few arguments",
    )?;
    expect_err(
        ctx.launch("fill", &[p(b.ptr), n(0), n(4), n(4)], s),
        &["bad_param"],
        "too many arguments",
    )?;
    expect_err(
        ctx.launch("fill", &[n(1), n(0), n(4)], s),
        &["bad_param"],
        "a scalar for a buffer",
    )?;
    expect_err(
        ctx.launch("fill", &[p(b.ptr), KernelArg::F32(1.0), n(4)], s),
        &["bad_param"],
        "f32 for u32",
    )?;
    expect_err(
        ctx.launch("fill", &[p(b.ptr), n(0), n(17)], s),
        &["out_of_bounds"],
        "17 words in 64 bytes",
    )?;
    expect_err(
        ctx.launch("fill", &[p(b.at(2)), n(0), n(4)], s),
        &["bad_param"],
        "misaligned buffer",
    )?;
    expect_err(
        ctx.launch("fill", &[p(DevicePtr::NULL), n(0), n(4)], s),
        &["null_pointer"],
        "null buffer",
    )?;
    expect_err(
        ctx.launch("add_f32", &[p(b.ptr), p(b.ptr), p(b.at(4)), n(16)], s),
        &["out_of_bounds"],
        "add_f32 output running past the end",
    )?;
    ctx.stream_synchronize(s)?;
    same(&b.read()?, &[0; 64], "memory after refused launches")
}

fn failed_async(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let b = Buf::with(&ctx.backend, &[1u8; 256])?;
    for _ in 0..10 {
        expect_err(
            ctx.memset_async(b.at(200), 9, 100, s.id()),
            &["out_of_bounds"],
            "async memset past the end",
        )?;
    }
    s.memset(b.ptr, 2, 256)?;
    s.synchronize()?;
    same(&b.read()?, &[2; 256], "stream after refused enqueues")
}

fn pinned_misuse(ctx: &Ctx) -> Result<(), Failure> {
    let h = ctx.malloc_host(100)?;
    expect_err(
        ctx.free_host(HostPtr(h.0 + 4)),
        &["bad_param"],
        "free_host of an interior pointer",
    )?;
    ctx.free_host(h)?;
    expect_err(ctx.free_host(h), &["invalid_handle"], "free_host twice")?;
    expect_err(
        ctx.free_host(HostPtr(0xdead_0000)),
        &["invalid_handle"],
        "free_host of an unknown pointer",
    )?;
    let d = Buf::new(&ctx.backend, 64)?;
    expect_err(
        ctx.free_host(HostPtr(d.ptr.0)),
        &["invalid_handle"],
        "free_host of device memory",
    )?;
    let h2 = ctx.malloc_host(100)?;
    // SAFETY: refused: the pinned source range is 100 bytes, the copy asks for 101.
    let r = unsafe { ctx.memcpy(d.ptr.0, h2.0, 101, MemcpyKind::H2D) };
    ctx.free_host(h2)?;
    expect_err(
        r,
        &["out_of_bounds"],
        "H2D reading past a pinned allocation",
    )
}

fn raw_kinds(_ctx: &Ctx) -> Result<(), Failure> {
    expect_err(MemcpyKind::from_raw(4), &["bad_param"], "memcpy kind 4")?;
    expect_err(MemcpyKind::from_raw(-1), &["bad_param"], "memcpy kind -1")?;
    expect_err(CaptureMode::from_raw(3), &["bad_param"], "capture mode 3")?;
    Ok(())
}
