//! wgpu memory: device allocations as virtual addresses over wgpu buffers, and host memory.
//!
//! Every `malloc` creates one wgpu buffer and hands out an address from a private virtual
//! range (from 2^40 up, 256-byte aligned, never reused, with an unmapped gap after each
//! allocation so an overrun lands in no allocation). The allocation table maps an address to
//! (buffer, offset), which makes pointer arithmetic and interior pointers work as on CPU.
//! Buffers are padded to whole 32-bit words: wgpu copies move 4-byte units, and the padding
//! lets a copy or kernel touch the last partial word without leaving the buffer (the padding
//! bytes are never visible through any address).
//!
//! Host and "pinned" host memory: wgpu has no way to register host memory with a device, so
//! `malloc_host` returns page-aligned host memory that this backend bounds-checks; copies from
//! and to it still stage through wgpu buffers. `Capabilities::pinned_host_memory` says false.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Alignment of device addresses (as CUDA's allocations).
pub(crate) const DEVICE_ALIGN: u64 = 256;
/// Unmapped addresses left after each allocation.
const GAP: u64 = 64 << 10;

/// The payload of one device allocation: its buffer and padded size.
#[derive(Clone, Debug)]
pub(crate) struct DevBuf {
    /// Unique id (bind-group cache key).
    pub id: u64,
    pub buffer: wgpu::Buffer,
    /// A staging or scratch buffer of one command: its bind groups are not cached.
    pub temp: bool,
    /// The allocation's entry in the host's memory ledger, on adapters that keep buffers in
    /// host memory (see `meminfo`); released with the last clone.
    pub host_grant: Option<std::sync::Arc<crate::meminfo::HostGrant>>,
}

impl DevBuf {
    pub fn new(buffer: wgpu::Buffer, temp: bool) -> Self {
        DevBuf {
            id: crate::handles::fresh_id(),
            buffer,
            temp,
            host_grant: None,
        }
    }

    /// Enters the buffer's `bytes` in the host's memory ledger: an adapter emulated on the
    /// host processor keeps its buffers in host memory that no reading shows until touched.
    pub fn in_host_memory(mut self, bytes: u64) -> Self {
        self.host_grant = Some(std::sync::Arc::new(crate::meminfo::HostGrant::new(bytes)));
        self
    }
}

/// Hands out virtual device addresses, from one counter for every wgpu device of the process:
/// no two devices hand out the same address, so a pointer of one passed to another is an
/// address unknown there (an error), never one of its own buffers. (Each device once counted
/// from the same base, and wgpu:0's first buffer was wgpu:1's first buffer's address.)
pub(crate) struct AddressSpace {
    next: &'static AtomicU64,
}

static NEXT_ADDRESS: AtomicU64 = AtomicU64::new(1 << 40);

impl AddressSpace {
    pub fn new() -> Self {
        AddressSpace {
            next: &NEXT_ADDRESS,
        }
    }

    /// A fresh base address for `size` bytes.
    pub fn reserve(&self, size: u64) -> Result<u64> {
        let span = round_up(size, DEVICE_ALIGN)
            .and_then(|s| s.checked_add(GAP))
            .ok_or_else(|| Error::BadParam(format!("{size} bytes overflow the address space")))?;
        let base = self.next.fetch_add(span, Ordering::Relaxed);
        if base.checked_add(span).is_none() {
            return Err(Error::Internal(
                "the wgpu virtual address space is exhausted".into(),
            ));
        }
        Ok(base)
    }
}

/// `v` rounded up to a multiple of `to` (a power of two), or None on overflow.
pub(crate) fn round_up(v: u64, to: u64) -> Option<u64> {
    Some(v.checked_add(to - 1)? & !(to - 1))
}

pub(crate) fn floor4(v: u64) -> u64 {
    v & !3
}

pub(crate) fn ceil4(v: u64) -> u64 {
    (v + 3) & !3
}

/// Creates a buffer, turning wgpu's validation and out-of-memory errors into unirt errors
/// instead of the uncaptured-error path.
pub(crate) fn create_buffer(
    device: &wgpu::Device,
    size: u64,
    usage: wgpu::BufferUsages,
    mapped: bool,
    who: &str,
) -> Result<wgpu::Buffer> {
    let scope_oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let scope_val = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let buffer = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("unirt"),
        size,
        usage,
        mapped_at_creation: mapped,
    });
    let val = pollster::block_on(scope_val.pop());
    let oom = pollster::block_on(scope_oom.pop());
    if let Some(e) = oom {
        return Err(Error::OutOfMemory {
            backend: crate::device::DeviceKind::Wgpu,
            device: who.to_string(),
            requested: size,
            detail: e.to_string(),
        });
    }
    if let Some(e) = val {
        return Err(Error::Driver {
            backend: crate::device::DeviceKind::Wgpu,
            call: "create_buffer".into(),
            code: None,
            message: e.to_string(),
        });
    }
    Ok(buffer)
}

/// A wgpu error caught in an error scope, as a unirt error.
pub(crate) fn wgpu_error(call: &str, e: wgpu::Error) -> Error {
    match e {
        wgpu::Error::OutOfMemory { .. } => Error::OutOfMemory {
            backend: crate::device::DeviceKind::Wgpu,
            device: "wgpu".into(),
            requested: 0,
            detail: format!("{call}: {e}"),
        },
        e => Error::Driver {
            backend: crate::device::DeviceKind::Wgpu,
            call: call.into(),
            code: None,
            message: e.to_string(),
        },
    }
}

/// Reusable staging buffers, so large host copies do not allocate (and fault in) fresh
/// memory each time: mappable upload buffers wait here *mapped*, ready to write; read-back
/// buffers wait unmapped, ready to be copied into.
#[derive(Default)]
pub(crate) struct StagingPool {
    uploads: parking_lot::Mutex<Vec<wgpu::Buffer>>,
    reads: parking_lot::Mutex<Vec<wgpu::Buffer>>,
}

/// Bytes each pool keeps at most; larger buffers are never kept.
const POOL_BYTES: u64 = 256 << 20;
const POOL_MAX_BUFFER: u64 = 128 << 20;
/// Staging sizes are rounded up to this, so nearby sizes share buffers.
const POOL_GRAIN: u64 = 64 << 10;

impl StagingPool {
    fn take(list: &parking_lot::Mutex<Vec<wgpu::Buffer>>, size: u64) -> Option<wgpu::Buffer> {
        let mut l = list.lock();
        // Best fit, and never more than twice the need.
        let i = l
            .iter()
            .enumerate()
            .filter(|(_, b)| b.size() >= size && b.size() <= 2 * size.max(POOL_GRAIN))
            .min_by_key(|(_, b)| b.size())
            .map(|(i, _)| i)?;
        Some(l.swap_remove(i))
    }

    fn give(list: &parking_lot::Mutex<Vec<wgpu::Buffer>>, b: wgpu::Buffer) {
        if b.size() > POOL_MAX_BUFFER {
            return;
        }
        let mut l = list.lock();
        let held: u64 = l.iter().map(|b| b.size()).sum();
        if held + b.size() <= POOL_BYTES {
            l.push(b);
        }
    }

    fn grain(size: u64) -> u64 {
        round_up(size, POOL_GRAIN).unwrap_or(size)
    }

    /// A mapped MAP_WRITE | COPY_SRC buffer of at least `size` bytes.
    pub fn upload(&self, device: &wgpu::Device, size: u64, who: &str) -> Result<wgpu::Buffer> {
        if let Some(b) = Self::take(&self.uploads, size) {
            return Ok(b);
        }
        create_buffer(
            device,
            Self::grain(size),
            wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            true,
            who,
        )
    }

    /// Maps an upload buffer again once the submission that reads it has run, then keeps it.
    pub fn recycle_upload(self: &std::sync::Arc<Self>, b: wgpu::Buffer) {
        let pool = self.clone();
        let buf = b.clone();
        b.slice(..).map_async(wgpu::MapMode::Write, move |r| {
            if r.is_ok() {
                Self::give(&pool.uploads, buf);
            }
        });
    }

    /// An unmapped MAP_READ | COPY_DST buffer of at least `size` bytes.
    pub fn read(&self, device: &wgpu::Device, size: u64, who: &str) -> Result<wgpu::Buffer> {
        if let Some(b) = Self::take(&self.reads, size) {
            return Ok(b);
        }
        create_buffer(
            device,
            Self::grain(size),
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            false,
            who,
        )
    }

    /// Keeps a read-back buffer that has been read and unmapped.
    pub fn recycle_read(&self, b: wgpu::Buffer) {
        Self::give(&self.reads, b);
    }
}
