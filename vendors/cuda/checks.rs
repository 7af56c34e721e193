//! What the CUDA backend checks before a driver call: device ranges against the allocation
//! table (this device's, or a peer's for device-to-device copies), the plan of a copy (which
//! device owns each side, which host sides are pinned), the ranges and events of a graph, and
//! allocation sizes; and the copy a plan allows, enqueued and noted.

use std::sync::Arc;

use super::event::CudaEvent;
use super::memory::{self, PeerInfo};
use super::stream::{CudaStream, DeviceUse};
use super::CudaBackend;
use crate::error::{Error, Result};
use crate::hal::*;
use crate::memtable::RecordedRange;

/// Which device owns the device side(s) of a copy: `None` is this one.
pub(super) struct CopyPlan {
    ranges: Vec<(u64, u64)>,
    /// Host sides that lie in this device's pinned memory.
    pinned: Vec<(u64, u64)>,
    dst_peer: Option<Arc<PeerInfo>>,
    src_peer: Option<Arc<PeerInfo>>,
}

impl CudaBackend {
    /// Checks a device range of this device (empty ranges are fine anywhere).
    pub(super) fn check_device(&self, addr: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if addr == 0 {
            return Err(Error::NullPointer("device address".into()));
        }
        self.shared.mem.lookup(addr, len).map(|_| ())
    }

    /// A device range of this device or, for D2D, of another open CUDA device.
    pub(super) fn device_side(
        &self,
        addr: u64,
        len: u64,
        peer_ok: bool,
    ) -> Result<Option<Arc<PeerInfo>>> {
        match self.check_device(addr, len) {
            Ok(()) => Ok(None),
            Err(e @ Error::OutOfBounds { .. }) if peer_ok => {
                memory::peer_owner(self.shared.index, addr, len)
                    .map(Some)
                    .ok_or(e)
            }
            Err(e) => Err(e),
        }
    }

    pub(super) fn check_copy(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        kind: MemcpyKind,
    ) -> Result<CopyPlan> {
        let len = bytes as u64;
        // A device address handed over as host memory: under unified addressing it cannot be
        // host memory, and the host side of a copy would dereference it on the CPU.
        for (addr, host_side) in [(dst, !kind.dst_on_device()), (src, !kind.src_on_device())] {
            if host_side && len > 0 && self.shared.mem.find(addr).is_some() {
                return Err(Error::BadParam(format!(
                    "{addr:#x} is device memory of {}, given as the host side of a {} copy",
                    self.name,
                    kind.as_str()
                )));
            }
            // Another device's (a wgpu virtual address, another GPU's memory): libcuda would
            // read or write it as pageable host memory, and crash.
            if host_side && len > 0 && self.host_mem.find(addr).is_none() {
                crate::checked::refuse_other_device_memory(addr, len, &self.name)?;
            }
        }
        let peer_ok = kind == MemcpyKind::D2D;
        let mut plan = CopyPlan {
            ranges: Vec::with_capacity(2),
            pinned: Vec::new(),
            dst_peer: None,
            src_peer: None,
        };
        if kind.dst_on_device() {
            plan.dst_peer = self.device_side(dst, len, peer_ok)?;
            if plan.dst_peer.is_none() {
                plan.ranges.push((dst, len));
            }
        } else if self.host_mem.check_host(dst, len)?.is_some() {
            plan.pinned.push((dst, len));
        }
        if kind.src_on_device() {
            plan.src_peer = self.device_side(src, len, peer_ok)?;
            if plan.src_peer.is_none() {
                plan.ranges.push((src, len));
            }
        } else if self.host_mem.check_host(src, len)?.is_some() {
            plan.pinned.push((src, len));
        }
        Ok(plan)
    }

    /// Enqueues a validated copy on `stream`.
    ///
    /// # Safety
    /// Host ranges as [`Backend::memcpy_async`] requires.
    pub(super) unsafe fn enqueue_copy(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        kind: MemcpyKind,
        plan: &CopyPlan,
        stream: u64,
    ) -> Result<()> {
        let d = self.drv;
        let host_copy = || match kind {
            // SAFETY: host ranges are the caller's contract; device ranges were checked.
            MemcpyKind::H2D => unsafe { d.copy_h2d(dst, src, bytes, stream) },
            // SAFETY: as above.
            MemcpyKind::D2H => unsafe { d.copy_d2h(dst, src, bytes, stream) },
            // SAFETY: as above.
            _ => unsafe { d.copy_h2h(dst, src, bytes, stream) },
        };
        // A copy to or from pageable host memory is a "potentially unsafe" call during any
        // capture: it runs Relaxed. One whose host sides are all unirt's pinned memory is not,
        // and pays nothing extra.
        let host_sides = usize::from(!kind.src_on_device()) + usize::from(!kind.dst_on_device());
        match kind {
            MemcpyKind::H2D | MemcpyKind::D2H | MemcpyKind::H2H
                if plan.pinned.len() < host_sides =>
            {
                d.relaxed(host_copy)
            }
            MemcpyKind::H2D | MemcpyKind::D2H | MemcpyKind::H2H => host_copy(),
            MemcpyKind::D2D => match (&plan.dst_peer, &plan.src_peer) {
                // SAFETY: both ranges were bounds-checked against the allocation table above and
                // the stream is live.
                (None, None) => unsafe { d.copy_d2d(dst, src, bytes, stream) },
                (dp, sp) => {
                    let ctx =
                        |p: &Option<Arc<PeerInfo>>| p.as_ref().map_or(self.shared.ctx, |s| s.ctx);
                    // SAFETY: both ranges were bounds-checked against their devices' allocation
                    // tables, both contexts are retained, the stream is live.
                    unsafe { d.copy_peer(dst, ctx(dp), src, ctx(sp), bytes, stream) }
                }
            },
        }
    }

    /// Notes a copy's ranges in `s`'s capture, when it captures: this device's and a peer's
    /// device sides, and pinned host sides.
    pub(super) fn note_copy(&self, s: &CudaStream, dst: u64, src: u64, len: u64, plan: &CopyPlan) {
        if !s.is_capturing() {
            return;
        }
        s.note_ranges(&self.shared, &plan.ranges);
        for (peer, addr) in [(&plan.dst_peer, dst), (&plan.src_peer, src)] {
            if let Some(p) = peer {
                s.note_ranges(p, &[(addr, len)]);
            }
        }
        s.note_pinned(&self.host_mem, &plan.pinned);
    }

    /// Pinned host ranges of a graph still lie in the pinned allocations they were captured in.
    pub(super) fn check_pinned(&self, ranges: &[RecordedRange<()>]) -> Result<()> {
        for r in ranges {
            self.host_mem.recheck(r)?;
        }
        Ok(())
    }

    /// Checks what a graph uses is still what it captured: its device ranges lie in the very
    /// allocations they lay in then (a replay must not write freed memory, and libcuda must
    /// never instantiate or launch nodes on an allocation freed since, even where the address
    /// was handed out anew) and its recorded events are the live ones (CUDA would record a
    /// destroyed event).
    pub(super) fn check_graph(
        &self,
        ranges: &[DeviceUse],
        events: &[Arc<CudaEvent>],
    ) -> Result<()> {
        for r in ranges {
            r.recheck()?;
        }
        for e in events {
            match self.events.get(e.raw) {
                Ok(live) if Arc::ptr_eq(&live, e) => {}
                _ => return Err(Error::invalid(EventId::KIND, e.raw)),
            }
        }
        Ok(())
    }

    /// Refuses a device allocation larger than the device's memory before asking the driver.
    pub(super) fn check_size(&self, bytes: usize) -> Result<()> {
        let limit = self.info.memory_total;
        if bytes as u64 > limit {
            return Err(Error::TooLarge {
                device: self.name.clone(),
                requested: bytes as u64,
                limit,
            });
        }
        Ok(())
    }
}
