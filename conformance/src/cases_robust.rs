//! Robustness cases (issue 10): sizes no machine can give, through every API that takes a
//! size, are typed errors — never an abort ("memory allocation of … bytes failed") or a panic
//! ("capacity overflow") — and the device works normally afterwards.

use super::*;
use crate::ensure;
use unirt::context;
use unirt::hal::{DevicePtr, MemcpyKind};
use unirt::runtime::Runtime;
use unirt::stream::{BackendExt, Stream};

pub(super) const CASES: &[Case] = &[
    Case {
        name: "robust::huge_sizes_backend",
        needs: &[],
        run: huge_backend,
    },
    Case {
        name: "robust::huge_sizes_allocator",
        needs: &[],
        run: huge_allocator,
    },
    Case {
        name: "robust::huge_sizes_context",
        needs: &[],
        run: huge_context,
    },
    Case {
        name: "robust::huge_sizes_copies",
        needs: &[],
        run: huge_copies,
    },
];

/// 1 TiB, 2^62, the largest `usize` and the first size past `isize::MAX` (what `Layout`
/// refuses): none fits any machine these tests run on, nor the address space.
pub(super) const HUGE: [usize; 4] = [1 << 40, 1 << 62, usize::MAX, (isize::MAX as usize) + 1];

/// What a refused size may be.
const REFUSED: &[&str] = &["out_of_memory", "too_large"];

/// The device still allocates, copies and computes after the refusals.
fn still_works(ctx: &Ctx) -> Result<(), Failure> {
    let data = pattern(1 << 16, 77);
    let b = Buf::with(&ctx.backend, &data)?;
    same(
        &b.read()?,
        &data,
        "a 64 KiB round trip after refused huge sizes",
    )?;
    let n = 1024u32;
    let out = Buf::new(&ctx.backend, 4 * n as usize)?;
    let s = Stream::new(&ctx.backend)?;
    s.launch("fill", &[out.ptr.into(), 2.5f32.to_bits().into(), n.into()])?;
    s.synchronize()?;
    ensure!(
        bytes_f32(&out.read()?).iter().all(|&v| v == 2.5),
        "fill after refused huge sizes wrote wrong values"
    );
    Ok(())
}

fn huge_backend(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    for size in HUGE {
        expect_err(ctx.malloc(size), REFUSED, &format!("malloc({size})"))?;
        expect_err(
            ctx.malloc_host(size),
            REFUSED,
            &format!("malloc_host({size})"),
        )?;
        if ctx.info().capabilities.stream_ordered_memory {
            expect_err(
                ctx.malloc_async(size, s.id()),
                REFUSED,
                &format!("malloc_async({size})"),
            )?;
        }
    }
    s.synchronize()?;
    still_works(ctx)
}

fn huge_allocator(ctx: &Ctx) -> Result<(), Failure> {
    // A private runtime: its allocator and pinned pool start empty and count the failures.
    let rt = Runtime::standalone(ctx.backend.clone());
    let s = Stream::new(&ctx.backend)?;
    for size in HUGE {
        expect_err(
            rt.allocator().malloc(size, s.id()),
            REFUSED,
            &format!("allocator malloc({size})"),
        )?;
        expect_err(
            rt.pinned_host_pool().malloc(size),
            REFUSED,
            &format!("pinned pool malloc({size})"),
        )?;
    }
    let stats = rt.memory_stats();
    ensure!(
        stats.allocations.current == 0,
        "refused allocations left {} live blocks",
        stats.allocations.current
    );
    // The allocator still serves ordinary requests, and they work.
    let p = rt.allocator().malloc(4096, s.id())?;
    ctx.memset(p, 0x3c, 4096)?;
    ensure!(
        ctx.read_vec(p, 4096)?.iter().all(|&b| b == 0x3c),
        "memory from the allocator after refused sizes reads back wrong"
    );
    rt.allocator().free(p)?;
    let h = rt.pinned_host_pool().malloc(4096)?;
    rt.pinned_host_pool().free(h)?;
    still_works(ctx)
}

fn huge_context(ctx: &Ctx) -> Result<(), Failure> {
    let before = context::get_device();
    context::set_device(ctx.device)?;
    let r = (|| -> Result<(), Failure> {
        let rt = Runtime::get(ctx.device)?;
        for size in HUGE {
            expect_err(
                context::allocate_host_memory(size),
                REFUSED,
                &format!("context::allocate_host_memory({size})"),
            )?;
            expect_err(
                context::allocate_memory(size),
                REFUSED,
                &format!("context::allocate_memory({size})"),
            )?;
            expect_err(
                context::allocate_pinned_host_memory(size),
                REFUSED,
                &format!("context::allocate_pinned_host_memory({size})"),
            )?;
            expect_err(
                rt.allocate_memory(size),
                REFUSED,
                &format!("Runtime::allocate_memory({size})"),
            )?;
        }
        // Ordinary sizes still work through the same paths.
        let h = context::allocate_host_memory(1000)?;
        ensure!(h.size() == 1000 && !h.host_ptr().is_null(), "host memory");
        let data = pattern(1000, 5);
        // SAFETY: `h` holds 1000 bytes; `data` is a live slice of 1000.
        unsafe { context::memcpy_h2h(h.host_ptr(), data.as_ptr(), 1000)? };
        let d = context::allocate_memory(1000)?;
        // SAFETY: `h` lives until the synchronous copies return.
        unsafe {
            context::memcpy_h2d(d.device_ptr(), h.host_ptr(), 1000, false)?;
        }
        let mut back = vec![0u8; 1000];
        // SAFETY: `back` is writable for 1000 bytes.
        unsafe { context::memcpy_d2h(back.as_mut_ptr(), d.device_ptr(), 1000)? };
        same(&back, &data, "context round trip after refused huge sizes")?;
        context::sync_device()?;
        Ok(())
    })();
    context::set_device(before)?;
    r?;
    still_works(ctx)
}

fn huge_copies(ctx: &Ctx) -> Result<(), Failure> {
    let b = Buf::with(&ctx.backend, &[9u8; 256])?;
    let s = Stream::new(&ctx.backend)?;
    let mut host = [0u8; 256];
    let hp = host.as_mut_ptr() as usize as u64;
    for size in HUGE {
        // The read helper must not try to hold `size` bytes on the host first.
        expect_err(
            ctx.read_vec(b.ptr, size),
            &["out_of_memory", "out_of_bounds"],
            &format!("read_vec({size})"),
        )?;
        // The device range is checked before a host byte is touched.
        // SAFETY: the checks refuse the copy before any byte moves.
        unsafe {
            expect_err(
                ctx.memcpy(hp, b.ptr.0, size, MemcpyKind::D2H),
                &["out_of_bounds"],
                &format!("memcpy D2H of {size}"),
            )?;
            expect_err(
                ctx.memcpy(b.ptr.0, hp, size, MemcpyKind::H2D),
                &["out_of_bounds"],
                &format!("memcpy H2D of {size}"),
            )?;
            expect_err(
                ctx.memcpy_async(hp, b.ptr.0, size, MemcpyKind::D2H, s.id()),
                &["out_of_bounds"],
                &format!("memcpy_async D2H of {size}"),
            )?;
        }
        expect_err(
            ctx.copy_device(b.at(1), b.ptr, size),
            &["out_of_bounds"],
            &format!("D2D copy of {size}"),
        )?;
        expect_err(
            ctx.memset(b.ptr, 0, size),
            &["out_of_bounds"],
            &format!("memset of {size}"),
        )?;
        expect_err(
            ctx.memset_async(DevicePtr(b.ptr.0), 0, size, s.id()),
            &["out_of_bounds"],
            &format!("memset_async of {size}"),
        )?;
    }
    s.synchronize()?;
    same(
        &b.read()?,
        &[9u8; 256],
        "the buffer after refused huge copies",
    )?;
    ensure!(host == [0u8; 256], "a refused copy wrote the host buffer");
    still_works(ctx)
}
