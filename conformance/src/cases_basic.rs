//! Discovery, device memory, memset and kernels.

use super::*;
use crate::ensure;
use unirt::hal::{DevicePtr, KernelArg};
use unirt::stream::BackendExt;
use unirt::Backend;

pub(super) const CASES: &[Case] = &[
    Case {
        name: "discovery::device_listed",
        needs: &[],
        run: device_listed,
    },
    Case {
        name: "discovery::mem_info",
        needs: &[],
        run: mem_info,
    },
    Case {
        name: "memory::malloc_free_sizes",
        needs: &[],
        run: malloc_free_sizes,
    },
    Case {
        name: "memory::alignment_256",
        needs: &[],
        run: alignment,
    },
    Case {
        name: "memory::malloc_zero_is_null",
        needs: &[],
        run: malloc_zero,
    },
    Case {
        name: "memory::no_overlap",
        needs: &[],
        run: no_overlap,
    },
    Case {
        name: "memory::pinned_host_roundtrip",
        needs: &[],
        run: pinned_roundtrip,
    },
    Case {
        name: "memory::interior_pointers",
        needs: &[],
        run: interior_pointers,
    },
    Case {
        name: "memset::every_byte_value",
        needs: &[],
        run: memset_values,
    },
    Case {
        name: "memset::odd_offsets_and_sizes",
        needs: &[],
        run: memset_odd,
    },
    Case {
        name: "memset::async_in_stream_order",
        needs: &[],
        run: memset_async_order,
    },
    Case {
        name: "kernel::fill",
        needs: &[],
        run: kernel_fill,
    },
    Case {
        name: "kernel::add_f32_vs_f64_reference",
        needs: &[],
        run: kernel_add,
    },
    Case {
        name: "kernel::add_f32_interior_offsets",
        needs: &[],
        run: kernel_add_offsets,
    },
    Case {
        name: "kernel::add_f32_in_place",
        needs: &[],
        run: kernel_add_in_place,
    },
    Case {
        name: "kernel::zero_elements_is_noop",
        needs: &[],
        run: kernel_zero,
    },
];

fn device_listed(ctx: &Ctx) -> Result<(), Failure> {
    let d = unirt::discover();
    let info = d.info(ctx.device)?;
    ensure!(!info.name.is_empty(), "device has no name");
    ensure!(info.memory_total > 0, "memory_total is 0");
    ensure!(
        info.index == ctx.device.index,
        "index {} != {}",
        info.index,
        ctx.device.index
    );
    ensure!(
        ctx.kind() == ctx.device.kind,
        "backend kind {} != {}",
        ctx.kind(),
        ctx.device.kind
    );
    ensure!(
        d.devices().contains(&ctx.device),
        "{} not in discover().devices()",
        ctx.device
    );
    Ok(())
}

fn mem_info(ctx: &Ctx) -> Result<(), Failure> {
    let m = ctx.mem_info()?;
    ensure!(m.total > 0, "total memory 0");
    ensure!(m.free <= m.total, "free {} > total {}", m.free, m.total);
    Ok(())
}

fn malloc_free_sizes(ctx: &Ctx) -> Result<(), Failure> {
    let mut ptrs = Vec::new();
    for size in [1usize, 3, 255, 256, 4097, 1 << 20, (3 << 20) + 5] {
        let p = ctx.malloc(size)?;
        ensure!(!p.is_null(), "malloc({size}) returned null");
        ptrs.push(p);
    }
    let mut sorted = ptrs.clone();
    sorted.sort();
    sorted.dedup();
    ensure!(
        sorted.len() == ptrs.len(),
        "malloc returned the same address twice"
    );
    for p in ptrs {
        ctx.free(p)?;
    }
    Ok(())
}

fn alignment(ctx: &Ctx) -> Result<(), Failure> {
    for size in [1usize, 7, 300, 4096 + 1] {
        let b = Buf::new(&ctx.backend, size)?;
        ensure!(
            b.ptr.0 % 256 == 0,
            "malloc({size}) = {:?} is not 256-byte aligned",
            b.ptr
        );
    }
    Ok(())
}

fn malloc_zero(ctx: &Ctx) -> Result<(), Failure> {
    let p = ctx.malloc(0)?;
    ensure!(p.is_null(), "malloc(0) = {p:?}, expected null");
    ctx.free(DevicePtr::NULL)?;
    ctx.free_host(unirt::HostPtr::NULL)?;
    Ok(())
}

fn no_overlap(ctx: &Ctx) -> Result<(), Failure> {
    let bufs: Vec<Buf> = (0..6)
        .map(|i| Buf::with(&ctx.backend, &pattern(1000 + i * 17, i as u32)))
        .collect::<Result<_, _>>()?;
    for (i, b) in bufs.iter().enumerate() {
        same(
            &b.read()?,
            &pattern(1000 + i * 17, i as u32),
            &format!("buffer {i}"),
        )?;
    }
    Ok(())
}

fn pinned_roundtrip(ctx: &Ctx) -> Result<(), Failure> {
    let n = 64 * 1024 + 3;
    let (h_in, h_out) = (ctx.malloc_host(n)?, ctx.malloc_host(n)?);
    ensure!(
        !h_in.is_null() && !h_out.is_null(),
        "malloc_host returned null"
    );
    ensure!(
        h_in.0 % 4096 == 0,
        "pinned memory {h_in:?} is not page-aligned"
    );
    let data = pattern(n, 7);
    let d = Buf::new(&ctx.backend, n)?;
    let s = ctx.default_stream();
    // SAFETY: both host buffers are live pinned allocations of n bytes, kept until after sync.
    let r = unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), h_in.as_mut_ptr(), n);
        std::ptr::write_bytes(h_out.as_mut_ptr(), 0, n);
        ctx.memcpy_async(d.ptr.0, h_in.0, n, unirt::MemcpyKind::H2D, s)
            .and_then(|_| ctx.memcpy_async(h_out.0, d.ptr.0, n, unirt::MemcpyKind::D2H, s))
            .and_then(|_| ctx.stream_synchronize(s))
    };
    // SAFETY: h_out holds n initialised bytes.
    let got = unsafe { std::slice::from_raw_parts(h_out.as_mut_ptr(), n) }.to_vec();
    ctx.free_host(h_in)?;
    ctx.free_host(h_out)?;
    r?;
    same(&got, &data, "pinned H2D then D2H")
}

fn interior_pointers(ctx: &Ctx) -> Result<(), Failure> {
    let b = Buf::with(&ctx.backend, &vec![0u8; 4096])?;
    let part = pattern(100, 3);
    ctx.copy_to_device(b.at(1001), &part)?;
    let mut want = vec![0u8; 4096];
    want[1001..1101].copy_from_slice(&part);
    same(&b.read()?, &want, "after a copy into an interior pointer")?;
    let got = ctx.read_vec(b.at(1050), 51)?;
    same(&got, &part[49..], "read from an interior pointer")
}

fn memset_values(ctx: &Ctx) -> Result<(), Failure> {
    let b = Buf::new(&ctx.backend, 4099)?;
    for v in [0x00u8, 0x01, 0x5a, 0x80, 0xa5, 0xff] {
        ctx.memset(b.ptr, v, b.len)?;
        same(&b.read()?, &vec![v; b.len], &format!("memset {v:#04x}"))?;
    }
    Ok(())
}

fn memset_odd(ctx: &Ctx) -> Result<(), Failure> {
    let n = 4096 + 37;
    let b = Buf::with(&ctx.backend, &pattern(n, 11))?;
    let mut want = pattern(n, 11);
    for (off, len, v) in [
        (3usize, 5usize, 0xeeu8),
        (1, 1, 0x11),
        (7, 4096 - 7, 0x22),
        (4097, 0, 0x33),
        (n - 2, 2, 0x44),
    ] {
        ctx.memset(b.at(off), v, len)?;
        want[off..off + len].fill(v);
        same(
            &b.read()?,
            &want,
            &format!("memset at +{off} of {len} bytes"),
        )?;
    }
    Ok(())
}

fn memset_async_order(ctx: &Ctx) -> Result<(), Failure> {
    let s = unirt::Stream::new(&ctx.backend)?;
    let n = 1 << 20;
    let b = Buf::new(&ctx.backend, n)?;
    let mut out = vec![0u8; n];
    for v in [1u8, 2, 3] {
        s.memset(b.ptr, v, n)?;
    }
    // SAFETY: `out` outlives the copy: the stream is synchronised before it is read.
    unsafe {
        ctx.memcpy_async(
            out.as_mut_ptr() as u64,
            b.ptr.0,
            n,
            unirt::MemcpyKind::D2H,
            s.id(),
        )?
    };
    s.synchronize()?;
    same(
        &out,
        &vec![3u8; n],
        "three memsets then a copy on one stream",
    )
}

fn kernel_fill(ctx: &Ctx) -> Result<(), Failure> {
    let n = 1000u32;
    let b = Buf::new(&ctx.backend, 4 * n as usize + 8)?;
    ctx.memset(b.ptr, 0, b.len)?;
    let s = ctx.default_stream();
    ctx.launch(
        "fill",
        &[
            KernelArg::Ptr(b.ptr),
            KernelArg::U32(0xdead_beef),
            KernelArg::U32(n),
        ],
        s,
    )?;
    ctx.stream_synchronize(s)?;
    let got = b.read()?;
    let mut want: Vec<u8> = (0..n).flat_map(|_| 0xdead_beefu32.to_le_bytes()).collect();
    want.extend_from_slice(&[0; 8]);
    same(&got, &want, "fill of 1000 words (and nothing past them)")
}

/// Random f32 vectors checked against an f64 reference sum rounded once.
fn add_check(ctx: &Ctx, n: usize, off: [usize; 3], seed: u32) -> Result<(), Failure> {
    let gen = |s: u32| -> Vec<f32> {
        pattern(n * 4, s)
            .chunks_exact(4)
            .map(|c| (u32::from_le_bytes([c[0], c[1], c[2], c[3]]) % 20001) as f32 / 100.0 - 100.0)
            .collect()
    };
    let (a, b) = (gen(seed), gen(seed + 1));
    let total = |o: usize| 4 * (n + o);
    let da = Buf::new(&ctx.backend, total(off[0]))?;
    let db = Buf::new(&ctx.backend, total(off[1]))?;
    let dc = Buf::new(&ctx.backend, total(off[2]))?;
    ctx.copy_to_device(da.at(4 * off[0]), &f32_bytes(&a))?;
    ctx.copy_to_device(db.at(4 * off[1]), &f32_bytes(&b))?;
    let s = ctx.default_stream();
    let args = [
        da.at(4 * off[0]).into(),
        db.at(4 * off[1]).into(),
        dc.at(4 * off[2]).into(),
        KernelArg::U32(n as u32),
    ];
    ctx.launch("add_f32", &args, s)?;
    ctx.stream_synchronize(s)?;
    let got = bytes_f32(&ctx.read_vec(dc.at(4 * off[2]), 4 * n)?);
    for i in 0..n {
        let want = (f64::from(a[i]) + f64::from(b[i])) as f32;
        ensure!(
            got[i] == want,
            "add_f32[{i}] = {}, reference {want} ({} + {})",
            got[i],
            a[i],
            b[i]
        );
    }
    Ok(())
}

fn kernel_add(ctx: &Ctx) -> Result<(), Failure> {
    for n in [1usize, 3, 256, 1000, 65_537] {
        add_check(ctx, n, [0, 0, 0], n as u32)?;
    }
    Ok(())
}

fn kernel_add_offsets(ctx: &Ctx) -> Result<(), Failure> {
    add_check(ctx, 777, [1, 5, 3], 5)?;
    add_check(ctx, 64, [64, 63, 17], 9)
}

fn kernel_add_in_place(ctx: &Ctx) -> Result<(), Failure> {
    let n = 300;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let da = Buf::with(&ctx.backend, &f32_bytes(&a))?;
    let s = ctx.default_stream();
    for _ in 0..3 {
        ctx.launch(
            "add_f32",
            &[
                da.ptr.into(),
                da.ptr.into(),
                da.ptr.into(),
                (n as u32).into(),
            ],
            s,
        )?;
    }
    ctx.stream_synchronize(s)?;
    let got = bytes_f32(&da.read()?);
    for (i, g) in got.iter().enumerate() {
        ensure!(
            *g == 8.0 * i as f32,
            "a[{i}] after three in-place doublings = {g}, want {}",
            8 * i
        );
    }
    Ok(())
}

fn kernel_zero(ctx: &Ctx) -> Result<(), Failure> {
    let b = Buf::with(&ctx.backend, &[9u8; 16])?;
    let s = ctx.default_stream();
    ctx.launch("fill", &[b.ptr.into(), 0u32.into(), 0u32.into()], s)?;
    ctx.launch(
        "add_f32",
        &[b.ptr.into(), b.ptr.into(), b.ptr.into(), 0u32.into()],
        s,
    )?;
    ctx.stream_synchronize(s)?;
    same(&b.read()?, &[9u8; 16], "kernels over zero elements")
}
