//! Copies and sets of any size at any byte offset, as wgpu commands.
//!
//! wgpu copies and clears move whole 4-byte words at 4-byte offsets, and a buffer cannot be
//! copied onto itself. So: aligned ranges use `copy_buffer_to_buffer` / `clear_buffer`; a range
//! whose ends are unaligned but whose source and destination share their phase uses a word
//! copy for the middle and the byte kernel for the (at most 3-byte) head and tail; a copy
//! whose phases differ goes through the byte kernel; a copy inside one buffer goes through a
//! scratch buffer first. Kernel work is cut into pieces that fit one storage binding.

use super::gpu::Gpu;
use super::kernels::Which;
use super::memory::{ceil4, floor4, DevBuf};
use super::stream::{BufClear, BufCopy, Cmd, Imm, StagingGate};
use crate::error::{Error, Result};

/// The largest piece one byte-kernel dispatch handles.
fn chunk(gpu: &Gpu) -> u64 {
    (gpu.kernels
        .max_binding
        .saturating_sub(2 * gpu.kernels.binding_align)
        & !3)
        .max(4)
}

fn u32_of(v: u64) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Internal(format!("{v} does not fit a kernel parameter")))
}

/// Byte-kernel copy between two different buffers.
fn kernel_copy(
    gpu: &Gpu,
    out: &mut Vec<Cmd>,
    dst: &DevBuf,
    doff: u64,
    src: &DevBuf,
    soff: u64,
    n: u64,
) -> Result<()> {
    let k = &gpu.kernels;
    let pipeline = k.pipeline(&gpu.device, Which::CopyBytes)?;
    let mut done = 0;
    while done < n {
        let len = (n - done).min(chunk(gpu));
        let (dw, drel) = k.window(dst, doff + done, len)?;
        let (sw, srel) = k.window(src, soff + done, len)?;
        let group = k.bind_group(&gpu.device, Which::CopyBytes, &[dw, sw])?;
        let words = (drel % 4 + len).div_ceil(4);
        out.push(Cmd::Dispatch {
            pipeline: pipeline.clone(),
            group,
            imm: Imm::four([u32_of(drel)?, u32_of(srel)?, u32_of(len)?, 0]),
            groups: k.groups_for(words),
        });
        done += len;
    }
    Ok(())
}

/// Commands copying `n` bytes from `src` at `soff` to `dst` at `doff` (device buffers).
pub(crate) fn device_copy(
    gpu: &Gpu,
    out: &mut Vec<Cmd>,
    dst: &DevBuf,
    doff: u64,
    src: &DevBuf,
    soff: u64,
    n: u64,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    if dst.id == src.id {
        // Through a scratch buffer: wgpu refuses a copy onto the same buffer, and a kernel
        // reading and writing overlapping words of one buffer would race.
        let (lo, hi) = (floor4(soff), ceil4(soff + n));
        let scratch = gpu.buffer(
            hi - lo,
            wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::STORAGE,
        )?;
        out.push(Cmd::Copy(BufCopy {
            src: src.buffer.clone(),
            src_off: lo,
            dst: scratch.clone(),
            dst_off: 0,
            size: hi - lo,
        }));
        let scratch = DevBuf::new(scratch, true);
        return device_copy(gpu, out, dst, doff, &scratch, soff - lo, n);
    }
    if doff % 4 != soff % 4 {
        return kernel_copy(gpu, out, dst, doff, src, soff, n);
    }
    let head = ((4 - doff % 4) % 4).min(n);
    let mid = floor4(n - head);
    let tail = n - head - mid;
    if head > 0 {
        kernel_copy(gpu, out, dst, doff, src, soff, head)?;
    }
    if mid > 0 {
        out.push(Cmd::Copy(BufCopy {
            src: src.buffer.clone(),
            src_off: soff + head,
            dst: dst.buffer.clone(),
            dst_off: doff + head,
            size: mid,
        }));
    }
    if tail > 0 {
        kernel_copy(
            gpu,
            out,
            dst,
            doff + head + mid,
            src,
            soff + head + mid,
            tail,
        )?;
    }
    Ok(())
}

/// Commands setting `n` bytes at `off` of `dst` to `value`.
pub(crate) fn device_set(
    gpu: &Gpu,
    out: &mut Vec<Cmd>,
    dst: &DevBuf,
    off: u64,
    value: u8,
    n: u64,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    if value == 0 && (off | n) & 3 == 0 {
        out.push(Cmd::Clear(BufClear {
            buf: dst.buffer.clone(),
            off,
            size: n,
        }));
        return Ok(());
    }
    let k = &gpu.kernels;
    let pipeline = k.pipeline(&gpu.device, Which::Memset)?;
    let pattern = u32::from(value) * 0x0101_0101;
    let mut done = 0;
    while done < n {
        let len = (n - done).min(chunk(gpu));
        let (w, rel) = k.window(dst, off + done, len)?;
        let group = k.bind_group(&gpu.device, Which::Memset, &[w])?;
        let words = (rel % 4 + len).div_ceil(4);
        out.push(Cmd::Dispatch {
            pipeline: pipeline.clone(),
            group,
            imm: Imm::four([u32_of(rel)?, u32_of(rel + len)?, pattern, 0]),
            groups: k.groups_for(words),
        });
        done += len;
    }
    Ok(())
}

/// Commands for a host-to-device copy. Eagerly the aligned middle is staged now in a pooled
/// mappable buffer (and copied word-wise), the at most 3-byte head and tail in small storage
/// buffers (and copied by the byte kernel); in a capture the bytes are read at each replay
/// (`Cmd::Upload`), as CUDA graph copies read host memory when they run.
///
/// # Safety
/// `host` must be readable for `n` bytes (now, or at every replay when `capturing`).
pub(crate) unsafe fn upload(
    gpu: &Gpu,
    out: &mut Vec<Cmd>,
    dst: &DevBuf,
    doff: u64,
    host: u64,
    n: u64,
    capturing: bool,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let len = usize::try_from(n).map_err(|_| Error::BadParam("copy too large".into()))?;
    if capturing {
        // The staged bytes take the destination's phase so the middle is a plain word copy.
        let phase = doff % 4;
        let usage = wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST;
        let b = gpu.buffer(ceil4(phase + n), usage)?;
        out.push(Cmd::Upload {
            host,
            staging: b.clone(),
            off: phase,
            len,
        });
        let staging = DevBuf::new(b, true);
        return device_copy(gpu, out, dst, doff, &staging, phase, n);
    }
    // SAFETY: the caller promised `host` is readable for `n` bytes now.
    let src = unsafe { std::slice::from_raw_parts(host as usize as *const u8, len) };
    let head = ((4 - doff % 4) % 4).min(n) as usize;
    let mid = floor4(n - head as u64) as usize;
    if mid > 0 {
        let b = gpu.staging.upload(&gpu.device, mid as u64, &gpu.name)?;
        {
            let mut view = b
                .slice(..mid as u64)
                .get_mapped_range_mut()
                .map_err(|e| unmapped(gpu, e))?;
            view.copy_from_slice(&src[head..head + mid]);
        }
        b.unmap();
        out.push(Cmd::Copy(BufCopy {
            src: b.clone(),
            src_off: 0,
            dst: dst.buffer.clone(),
            dst_off: doff + head as u64,
            size: mid as u64,
        }));
        out.push(Cmd::Recycle(b));
    }
    for (at, bytes) in [(0, &src[..head]), (head + mid, &src[head + mid..])] {
        if bytes.is_empty() {
            continue;
        }
        let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::STORAGE;
        let b = super::memory::create_buffer(&gpu.device, 4, usage, true, &gpu.name)?;
        {
            let mut view = b
                .slice(..)
                .get_mapped_range_mut()
                .map_err(|e| unmapped(gpu, e))?;
            view.slice(..bytes.len()).copy_from_slice(bytes);
        }
        b.unmap();
        let staging = DevBuf::new(b, true);
        device_copy(
            gpu,
            out,
            dst,
            doff + at as u64,
            &staging,
            0,
            bytes.len() as u64,
        )?;
    }
    Ok(())
}

/// Commands for a device-to-host copy: the covering words go to a mappable buffer, and the
/// bytes reach `host` when the submission completes.
pub(crate) fn download(
    gpu: &Gpu,
    out: &mut Vec<Cmd>,
    host: u64,
    src: &DevBuf,
    soff: u64,
    n: u64,
    capturing: bool,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let (lo, hi) = (floor4(soff), ceil4(soff + n));
    let staging = if capturing {
        gpu.buffer(
            hi - lo,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?
    } else {
        gpu.staging.read(&gpu.device, hi - lo, &gpu.name)?
    };
    out.push(Cmd::Copy(BufCopy {
        src: src.buffer.clone(),
        src_off: lo,
        dst: staging.clone(),
        dst_off: 0,
        size: hi - lo,
    }));
    out.push(Cmd::Readback {
        staging,
        skip: soff - lo,
        host,
        len: usize::try_from(n).map_err(|_| Error::BadParam("copy too large".into()))?,
        gate: capturing.then(StagingGate::default),
    });
    Ok(())
}

/// A staging buffer created mapped that is not: wgpu's GL backend loses the device when the
/// host refuses the buffer's memory (it does not check the allocation itself), so the lost
/// device is the error then; anything else is unirt's own mistake.
fn unmapped(gpu: &Gpu, e: impl std::fmt::Display) -> Error {
    match gpu.alive() {
        Err(lost) => lost,
        Ok(()) => Error::Internal(format!("staging buffer not mapped: {e}")),
    }
}
