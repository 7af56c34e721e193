//! memcpy: the four kinds, synchronous and on a stream, sizes 0, 1, 3, 4 KiB + 1 and 64 MiB, at
//! odd offsets on both sides; CUDA's rules for pageable host memory on a busy stream.

use super::*;
use crate::ensure;
use unirt::hal::{MemcpyKind, StreamId};
use unirt::{Backend, Stream};

pub(super) const CASES: &[Case] = &[
    Case {
        name: "memcpy::h2h_sync",
        needs: &[],
        run: |c| kind_case(c, MemcpyKind::H2H, false),
    },
    Case {
        name: "memcpy::h2h_async",
        needs: &[],
        run: |c| kind_case(c, MemcpyKind::H2H, true),
    },
    Case {
        name: "memcpy::h2d_sync",
        needs: &[],
        run: |c| kind_case(c, MemcpyKind::H2D, false),
    },
    Case {
        name: "memcpy::h2d_async",
        needs: &[],
        run: |c| kind_case(c, MemcpyKind::H2D, true),
    },
    Case {
        name: "memcpy::d2h_sync",
        needs: &[],
        run: |c| kind_case(c, MemcpyKind::D2H, false),
    },
    Case {
        name: "memcpy::d2h_async",
        needs: &[],
        run: |c| kind_case(c, MemcpyKind::D2H, true),
    },
    Case {
        name: "memcpy::d2d_sync",
        needs: &[],
        run: |c| kind_case(c, MemcpyKind::D2D, false),
    },
    Case {
        name: "memcpy::d2d_async",
        needs: &[],
        run: |c| kind_case(c, MemcpyKind::D2D, true),
    },
    Case {
        name: "memcpy::large_64mib_sync",
        needs: &[],
        run: |c| large(c, false),
    },
    Case {
        name: "memcpy::large_64mib_async",
        needs: &[],
        run: |c| large(c, true),
    },
    Case {
        name: "memcpy::zero_bytes_anywhere",
        needs: &[],
        run: zero_bytes,
    },
    Case {
        name: "memcpy::chain_in_stream_order",
        needs: &[],
        run: chain,
    },
    Case {
        name: "memcpy::many_small_async",
        needs: &[],
        run: many_small,
    },
    Case {
        name: "memcpy::pageable_host_memory_is_done_with_on_return",
        needs: &[],
        run: pageable_on_return,
    },
    Case {
        name: "memcpy::other_devices_memory_is_not_taken_for_host_memory",
        needs: &[],
        run: other_devices_memory,
    },
];

const SIZES: [usize; 4] = [0, 1, 3, 4097];
const OFFSETS: [usize; 3] = [0, 1, 3];

/// One side of a copy: host bytes or a device buffer, with an offset into it.
enum Side {
    Host(Vec<u8>),
    Dev(Buf),
}

impl Side {
    fn new(ctx: &Ctx, on_device: bool, init: &[u8]) -> Result<Self, Failure> {
        Ok(if on_device {
            Side::Dev(Buf::with(&ctx.backend, init)?)
        } else {
            Side::Host(init.to_vec())
        })
    }

    fn addr(&mut self, off: usize) -> u64 {
        match self {
            Side::Host(v) => v.as_mut_ptr() as u64 + off as u64,
            Side::Dev(b) => b.at(off).0,
        }
    }

    fn contents(&self) -> Result<Vec<u8>, Failure> {
        match self {
            Side::Host(v) => Ok(v.clone()),
            Side::Dev(b) => b.read(),
        }
    }
}

/// Copies `size` bytes from `src` at `so` to `dst` at `do_`, checks the whole destination.
fn one_copy(
    ctx: &Ctx,
    kind: MemcpyKind,
    size: usize,
    so: usize,
    do_: usize,
    stream: Option<StreamId>,
) -> Result<(), Failure> {
    let cap = size + 8;
    let src_init = pattern(cap, (size * 31 + so) as u32);
    let dst_init = pattern(cap, (size * 17 + do_ + 1000) as u32);
    let mut src = Side::new(ctx, kind.src_on_device(), &src_init)?;
    let mut dst = Side::new(ctx, kind.dst_on_device(), &dst_init)?;
    let (d, s) = (dst.addr(do_), src.addr(so));
    match stream {
        // SAFETY: host sides are vectors owned here that outlive the synchronisation below.
        Some(st) => unsafe {
            ctx.memcpy_async(d, s, size, kind, st)?;
            ctx.stream_synchronize(st)?;
        },
        // SAFETY: as above; the copy completes before memcpy returns.
        None => unsafe { ctx.memcpy(d, s, size, kind)? },
    }
    let mut want = dst_init.clone();
    want[do_..do_ + size].copy_from_slice(&src_init[so..so + size]);
    same(
        &dst.contents()?,
        &want,
        &format!("{} of {size} bytes from +{so} to +{do_}", kind.as_str()),
    )?;
    same(&src.contents()?, &src_init, "source after the copy")
}

fn kind_case(ctx: &Ctx, kind: MemcpyKind, r#async: bool) -> Result<(), Failure> {
    let stream = if r#async {
        Some(Stream::new(&ctx.backend)?)
    } else {
        None
    };
    for size in SIZES {
        for so in OFFSETS {
            for do_ in OFFSETS {
                one_copy(ctx, kind, size, so, do_, stream.as_ref().map(|s| s.id()))?;
            }
        }
    }
    Ok(())
}

fn large(ctx: &Ctx, r#async: bool) -> Result<(), Failure> {
    let n = 64 << 20;
    let stream = if r#async {
        Some(Stream::new(&ctx.backend)?)
    } else {
        None
    };
    // Odd offsets on every side: the aligned bulk and the unaligned head and tail all move.
    let data = pattern(n + 1, 99);
    let (a, b) = (
        Buf::new(&ctx.backend, n + 8)?,
        Buf::new(&ctx.backend, n + 8)?,
    );
    let mut out = vec![0u8; n + 3];
    // SAFETY: `data` and `out` outlive the copies (synchronised before they are read), and
    // every range lies inside them.
    unsafe {
        let copy = |d: u64, s: u64, k| match &stream {
            Some(st) => ctx.memcpy_async(d, s, n, k, st.id()),
            None => ctx.memcpy(d, s, n, k),
        };
        copy(a.at(1).0, data.as_ptr() as u64 + 1, MemcpyKind::H2D)?;
        copy(b.at(3).0, a.at(1).0, MemcpyKind::D2D)?;
        copy(out.as_mut_ptr() as u64 + 3, b.at(3).0, MemcpyKind::D2H)?;
    }
    if let Some(st) = &stream {
        st.synchronize()?;
    }
    ensure!(
        out[..3] == [0, 0, 0],
        "D2H wrote before its destination offset"
    );
    same(
        &out[3..],
        &data[1..],
        "64 MiB through H2D, D2D, D2H at offsets 1 and 3",
    )
}

fn zero_bytes(ctx: &Ctx) -> Result<(), Failure> {
    let b = Buf::with(&ctx.backend, &[1, 2, 3, 4])?;
    let mut host = [5u8; 4];
    let s = ctx.default_stream();
    for kind in MemcpyKind::ALL {
        // SAFETY: zero bytes are copied; the addresses are live anyway.
        unsafe {
            ctx.memcpy(b.ptr.0, host.as_mut_ptr() as u64, 0, kind)?;
            ctx.memcpy_async(host.as_mut_ptr() as u64, b.at(4).0, 0, kind, s)?;
        }
    }
    ctx.stream_synchronize(s)?;
    same(&b.read()?, &[1, 2, 3, 4], "device after zero-byte copies")?;
    ensure!(host == [5; 4], "host changed by zero-byte copies");
    Ok(())
}

fn chain(ctx: &Ctx) -> Result<(), Failure> {
    let n = 3 * 4096 + 5;
    let s = Stream::new(&ctx.backend)?;
    let data = pattern(n, 5);
    let bufs: Vec<Buf> = (0..4)
        .map(|_| Buf::new(&ctx.backend, n))
        .collect::<Result<_, _>>()?;
    let mut out = vec![0u8; n];
    // SAFETY: `data` and `out` outlive the stream synchronisation.
    unsafe {
        ctx.memcpy_async(
            bufs[0].ptr.0,
            data.as_ptr() as u64,
            n,
            MemcpyKind::H2D,
            s.id(),
        )?;
        for w in bufs.windows(2) {
            ctx.memcpy_async(w[1].ptr.0, w[0].ptr.0, n, MemcpyKind::D2D, s.id())?;
        }
        ctx.memset_async(bufs[0].ptr, 0, n, s.id())?;
        ctx.memcpy_async(
            out.as_mut_ptr() as u64,
            bufs[3].ptr.0,
            n,
            MemcpyKind::D2H,
            s.id(),
        )?;
    }
    s.synchronize()?;
    same(&out, &data, "H2D, three D2D hops, D2H in stream order")?;
    same(&bufs[0].read()?, &vec![0; n], "memset after the hops")
}

fn many_small(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let n = 1000;
    let b = Buf::with(&ctx.backend, &vec![0u8; n])?;
    let data = pattern(n, 77);
    // SAFETY: `data` outlives the synchronisation.
    unsafe {
        for i in 0..n {
            ctx.memcpy_async(
                b.at(i).0,
                data.as_ptr() as u64 + i as u64,
                1,
                MemcpyKind::H2D,
                s.id(),
            )?;
        }
    }
    s.synchronize()?;
    same(&b.read()?, &data, "1000 one-byte async copies")
}

/// Queues `rounds` memsets of `busy` on `s`: work for the copies after it to queue behind.
fn keep_busy(ctx: &Ctx, busy: &Buf, s: StreamId, rounds: u8) -> Result<(), Failure> {
    for i in 0..rounds {
        ctx.memset_async(busy.ptr, i, busy.len, s)?;
    }
    Ok(())
}

/// CUDA's rules for pageable host memory (host memory unirt did not allocate), which C code
/// written for `cudaMemcpyAsync` or InfiniCore's runtime relies on: an async copy from it has
/// read it when the call returns, an async copy into it (or between two host buffers) has
/// completed — so the caller may rewrite or free the buffer at once, even while the stream is
/// busy. The CPU backend once read and wrote such buffers later, on its worker: a buffer freed
/// after the call was read or written after its release (a crash through the C ABI).
fn pageable_on_return(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let busy = Buf::new(&ctx.backend, 16 << 20)?;
    let (row, rows) = (1000usize, 64usize);
    let big = (4 << 20) + 5;
    let d = Buf::with(&ctx.backend, &vec![0u8; row * rows])?;
    let large = Buf::with(&ctx.backend, &vec![0u8; big])?;
    let marked = Buf::with(&ctx.backend, &vec![0u8; 3 * 4096 + 1])?;
    keep_busy(ctx, &busy, s.id(), 4)?;
    // One small buffer rewritten after every call, as a decode loop sends a token each step.
    let mut host = vec![0u8; row];
    for i in 0..rows {
        host.fill(i as u8 + 1);
        // SAFETY: `host` is live for the call, which is all a pageable source needs.
        unsafe {
            ctx.memcpy_async(
                d.at(i * row).0,
                host.as_ptr() as u64,
                row,
                MemcpyKind::H2D,
                s.id(),
            )?
        };
    }
    host.fill(0xee);
    // A large source (past any staging) rewritten and freed right after the call.
    keep_busy(ctx, &busy, s.id(), 4)?;
    let mut src = pattern(big, 41);
    let want_large = src.clone();
    // SAFETY: as above.
    unsafe {
        ctx.memcpy_async(
            large.ptr.0,
            src.as_ptr() as u64,
            big,
            MemcpyKind::H2D,
            s.id(),
        )?
    };
    src.fill(0);
    drop(src);
    // Into pageable memory behind queued work: done on return, before any synchronisation.
    keep_busy(ctx, &busy, s.id(), 4)?;
    ctx.memset_async(marked.ptr, 0x5a, marked.len, s.id())?;
    let mut out = vec![0u8; marked.len];
    // SAFETY: `out` is live for the call.
    unsafe {
        ctx.memcpy_async(
            out.as_mut_ptr() as u64,
            marked.ptr.0,
            out.len(),
            MemcpyKind::D2H,
            s.id(),
        )?
    };
    ensure!(
        out.iter().all(|&b| b == 0x5a),
        "D2H into pageable memory had not completed when memcpy_async returned (byte 0: {:#x})",
        out[0]
    );
    keep_busy(ctx, &busy, s.id(), 4)?;
    let h2h_src = pattern(4097, 43);
    let mut h2h_dst = vec![0u8; 4097];
    // SAFETY: both buffers are live for the call.
    unsafe {
        ctx.memcpy_async(
            h2h_dst.as_mut_ptr() as u64,
            h2h_src.as_ptr() as u64,
            h2h_src.len(),
            MemcpyKind::H2H,
            s.id(),
        )?
    };
    same(
        &h2h_dst,
        &h2h_src,
        "H2H between pageable buffers when memcpy_async returned",
    )?;
    s.synchronize()?;
    let got = d.read()?;
    for (i, r) in got.chunks(row).enumerate() {
        ensure!(
            r.iter().all(|&b| b == i as u8 + 1),
            "row {i} of the small copies holds {:#x}, want {:#x} (the source as it was at the call)",
            r[0],
            i as u8 + 1
        );
    }
    same(
        &large.read()?,
        &want_large,
        "4 MiB H2D from a source freed after the call",
    )
}

/// Another device's pointer handed to this one. As the host side of a copy, a device whose
/// memory is host memory (the CPU's) works; one whose memory the host cannot touch (wgpu's
/// virtual addresses, CUDA's device memory) is `bad_param` — it was dereferenced on the CPU, a
/// crash. As a device side it is refused or copies exactly its bytes (CUDA peers), never
/// another buffer that happens to have that address (every wgpu device once counted addresses
/// from the same base). The other devices are every device discovered, and this one opened
/// again (a second backend, with its own table).
fn other_devices_memory(ctx: &Ctx) -> Result<(), Failure> {
    let n = 4096;
    let data = pattern(n, 71);
    let here = Buf::with(&ctx.backend, &vec![0u8; n])?;
    let mut others = unirt::discover().devices();
    others.retain(|d| *d != ctx.device);
    others.push(ctx.device);
    for other in others {
        let Ok(backend) = unirt::open(other) else {
            continue;
        };
        let what = format!("{other}'s memory on {}", ctx.device);
        let there = Buf::with(&backend, &data)?;
        let host_memory = backend.info().class == unirt::DeviceClass::Host;
        let mut out = vec![0u8; n];
        // SAFETY: `out` and `here` are live for n bytes; `there` is device memory of `other`,
        // which the backend must refuse as host memory unless it is host memory (then n live
        // bytes).
        let up = unsafe { ctx.memcpy(here.ptr.0, there.ptr.0, n, MemcpyKind::H2D) };
        let down = unsafe { ctx.memcpy(there.ptr.0, here.ptr.0, n, MemcpyKind::D2H) };
        let across = unsafe { ctx.memcpy(here.ptr.0, there.ptr.0, n, MemcpyKind::D2D) };
        if host_memory {
            up.map_err(|e| Failure::Failed(format!("{what} as an H2D source: {e}")))?;
            down.map_err(|e| Failure::Failed(format!("{what} as a D2H destination: {e}")))?;
            same(&here.read()?, &data, &format!("{what} as an H2D source"))?;
        } else {
            for (r, side) in [(up, "an H2D source"), (down, "a D2H destination")] {
                match r {
                    Err(e) if e.kind_name() == "bad_param" => {}
                    other => {
                        return Err(Failure::Failed(format!(
                            "{what} as {side}: {other:?}, want bad_param"
                        )))
                    }
                }
            }
        }
        if across.is_ok() {
            // SAFETY: `out` is a live vector of n bytes.
            unsafe { ctx.memcpy(out.as_mut_ptr() as u64, here.ptr.0, n, MemcpyKind::D2H)? };
            same(&out, &data, &format!("{what} as a D2D source (accepted)"))?;
        }
        same(&there.read()?, &data, &format!("{what}, after the copies"))?;
    }
    Ok(())
}
