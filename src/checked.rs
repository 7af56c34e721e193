//! The checked layer the backends that keep their own tables (cpu, wgpu) share: address
//! checks that hold for the whole operation, the tracking of everything unirt handed out, and
//! the HAL rules about streams and capture that do not depend on the vendor.
//!
//! **Lifetimes.** Every check of an address range returns the [`AllocRef`] of the allocation
//! it lies in, collected in the operation's [`Pins`]. A synchronous copy holds them until it
//! returns, a queued command until it has run, a graph replay until the replay has run. `free`
//! only unregisters the address ([`AllocTable::remove`]); the memory is released when the last
//! reference drops. So a free never waits for the device, yet no operation — on a live,
//! capturing, dropped or destroyed stream, or racing the free on another thread — ever touches
//! released memory. A captured graph keeps [`Recorded`] weak references instead: replaying it
//! re-pins every allocation and is refused when one was freed since the capture.
//!
//! **Everything unirt handed out is tracked.** The host side of a copy is checked against the
//! pinned host memory *and* the device memory: pinned memory is bounds-checked and pinned like
//! device memory; a device address on the host side is refused where device memory is not
//! host memory (wgpu's device addresses are virtual), and used — bounds-checked — where it is
//! (CPU).

use std::sync::{Arc, Weak};

use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::hal::{CaptureMode, MemcpyKind, StreamId};
use crate::hostmem::{HostBlock, HostHeap};
use crate::memtable::{AllocRef, AllocTable, Allocation};

/// One allocation an operation uses: the range it touches and the reference that keeps the
/// allocation alive.
pub enum Use<D> {
    Device(u64, u64, AllocRef<D>),
    Pinned(u64, u64, AllocRef<HostBlock>),
}

/// Uses kept inline: a memset has one, a copy two, the widest kernel three, so the common
/// enqueue allocates nothing for its pins.
const INLINE: usize = 3;

/// The allocations one operation uses, kept alive while it holds them.
pub struct Pins<D> {
    inline: [Option<Use<D>>; INLINE],
    more: Vec<Use<D>>,
}

impl<D> Default for Pins<D> {
    fn default() -> Self {
        Pins {
            inline: [None, None, None],
            more: Vec::new(),
        }
    }
}

impl<D> Pins<D> {
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&mut self, u: Use<D>) -> &Use<D> {
        match self.inline.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => slot.insert(u),
            None => {
                self.more.push(u);
                &self.more[self.more.len() - 1]
            }
        }
    }

    fn uses(&self) -> impl Iterator<Item = &Use<D>> {
        self.inline.iter().flatten().chain(self.more.iter())
    }

    /// Keeps `a` alive with this operation (an allocation freed with `free_async`, released
    /// when the stream reaches the free).
    pub fn hold_device(&mut self, a: AllocRef<D>) {
        self.push(Use::Device(a.base, a.size, a));
    }

    pub fn is_empty(&self) -> bool {
        self.uses().next().is_none()
    }

    /// Adds another operation's references.
    pub fn append(&mut self, other: Pins<D>) {
        let Pins { inline, more } = other;
        for u in inline.into_iter().flatten().chain(more) {
            self.push(u);
        }
    }

    /// The device allocations, in the order they were checked.
    pub fn device(&self) -> impl Iterator<Item = &AllocRef<D>> {
        self.uses().filter_map(|u| match u {
            Use::Device(_, _, a) => Some(a),
            Use::Pinned(..) => None,
        })
    }
}

/// One use recorded by a capture: the range, and a weak reference naming the allocation.
enum RecordedUse<D> {
    Device(u64, u64, Weak<Allocation<D>>),
    Pinned(u64, u64, Weak<Allocation<HostBlock>>),
}

impl<D> Clone for RecordedUse<D> {
    fn clone(&self) -> Self {
        match self {
            RecordedUse::Device(a, l, w) => RecordedUse::Device(*a, *l, w.clone()),
            RecordedUse::Pinned(a, l, w) => RecordedUse::Pinned(*a, *l, w.clone()),
        }
    }
}

/// The allocations a captured graph uses, held weakly: a graph does not keep freed memory
/// alive, and a replay re-pins them ([`CheckedMemory::repin`]) or is refused.
pub struct Recorded<D> {
    uses: Vec<RecordedUse<D>>,
}

impl<D> Default for Recorded<D> {
    fn default() -> Self {
        Recorded { uses: Vec::new() }
    }
}

impl<D> Clone for Recorded<D> {
    fn clone(&self) -> Self {
        Recorded {
            uses: self.uses.clone(),
        }
    }
}

impl<D> Recorded<D> {
    /// Records what `pins` uses.
    pub fn record(&mut self, pins: &Pins<D>) {
        self.uses.extend(pins.uses().map(|u| match u {
            Use::Device(a, l, r) => RecordedUse::Device(*a, *l, Arc::downgrade(r)),
            Use::Pinned(a, l, r) => RecordedUse::Pinned(*a, *l, Arc::downgrade(r)),
        }));
    }

    /// Records everything `other` recorded (a graph launched inside a capture).
    pub fn extend(&mut self, other: &Recorded<D>) {
        self.uses.extend(other.uses.iter().cloned());
    }

    /// Merges the uses that name the same allocation into one use covering all of them (the
    /// smallest range holding each), keeping first-use order: a replay then re-checks each
    /// allocation once, however many recorded commands use it. Each merged range lies inside
    /// its allocation, as every part was checked against it, so the re-check refuses exactly
    /// what re-checking the parts would (the allocation freed since, or its address reused).
    pub fn coalesce(&mut self) {
        let mut at: std::collections::HashMap<(bool, *const ()), usize> =
            std::collections::HashMap::with_capacity(self.uses.len());
        let mut merged: Vec<RecordedUse<D>> = Vec::with_capacity(self.uses.len());
        for u in self.uses.drain(..) {
            let (addr, len, key) = match &u {
                RecordedUse::Device(a, l, w) => (*a, *l, (false, w.as_ptr().cast::<()>())),
                RecordedUse::Pinned(a, l, w) => (*a, *l, (true, w.as_ptr().cast::<()>())),
            };
            match at.get(&key) {
                Some(&i) => {
                    let (ma, ml) = match &mut merged[i] {
                        RecordedUse::Device(a, l, _) | RecordedUse::Pinned(a, l, _) => (a, l),
                    };
                    let end = (*ma + *ml).max(addr + len);
                    *ma = (*ma).min(addr);
                    *ml = end - *ma;
                }
                None => {
                    at.insert(key, merged.len());
                    merged.push(u);
                }
            }
        }
        self.uses = merged;
    }

    /// Number of recorded uses.
    pub fn len(&self) -> usize {
        self.uses.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.uses.is_empty()
    }
}

/// Device memory and pinned host memory of one device, with the checks every operation makes.
pub struct CheckedMemory<D> {
    /// Device allocations.
    pub device: AllocTable<D>,
    /// Pinned host allocations.
    pub pinned: HostHeap,
    /// Device memory is host memory (CPU): a device address on the host side of a copy is a
    /// valid host address.
    device_is_host: bool,
    /// The device, for error messages.
    name: String,
}

/// Which host sides of a copy are *pageable*: host memory unirt did not hand out (neither a
/// pinned-host allocation nor, on the CPU, device memory). CUDA's rules for such memory are
/// what C code written for `cudaMemcpyAsync` (and InfiniCore's CPU runtime, whose async copy
/// is a plain `memcpy`) relies on, and every backend keeps them outside captures: a copy *from*
/// pageable memory has read it when the call returns, a copy *into* pageable memory has
/// completed when the call returns — so the caller may reuse or free the buffer at once.
/// Pinned memory is copied asynchronously and must live until the copy has run (which
/// `free_host` guarantees).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pageable {
    pub dst: bool,
    pub src: bool,
}

impl<D> CheckedMemory<D> {
    pub fn new(backend: DeviceKind, name: impl Into<String>, device_is_host: bool) -> Self
    where
        D: Send + Sync + 'static,
    {
        let name = name.into();
        let device = AllocTable::new("device");
        if !device_is_host {
            device.mark_not_host(&name);
        }
        CheckedMemory {
            device,
            pinned: HostHeap::new(backend, name.clone()),
            device_is_host,
            name,
        }
    }

    /// Checks a device range and pins its allocation. An empty range is fine anywhere and pins
    /// nothing (None).
    pub fn device_range<'p>(
        &self,
        addr: u64,
        len: u64,
        pins: &'p mut Pins<D>,
    ) -> Result<Option<&'p AllocRef<D>>> {
        if len == 0 {
            return Ok(None);
        }
        if addr == 0 {
            return Err(Error::NullPointer("device address".into()));
        }
        let a = self.device.lookup(addr, len)?;
        match pins.push(Use::Device(addr, len, a)) {
            Use::Device(_, _, a) => Ok(Some(a)),
            Use::Pinned(..) => Err(Error::Internal("a device pin reads as pinned".into())),
        }
    }

    /// Checks the host side of a copy and pins it when unirt handed it out; `true` when it is
    /// host memory unirt does not know — *pageable* memory, which cannot be checked (it is the
    /// caller's promise: `memcpy` is unsafe) and may be freed by the caller as soon as a copy
    /// call returns (see [`Pageable`]).
    pub fn host_range(&self, addr: u64, len: u64, pins: &mut Pins<D>) -> Result<bool> {
        if len == 0 {
            return Ok(false);
        }
        if addr == 0 {
            return Err(Error::NullPointer("host address".into()));
        }
        if let Some(a) = self.device.find(addr) {
            if !self.device_is_host {
                return Err(Error::BadParam(format!(
                    "{addr:#x} is {} device memory (the allocation at {:#x}), not host memory: \
                     name the device side of a copy with a device-side kind (H2D, D2H, D2D)",
                    self.name, a.base
                )));
            }
            let a = self.device.lookup(addr, len)?;
            pins.push(Use::Device(addr, len, a));
            return Ok(false);
        }
        if let Some(a) = self.pinned.table().check_host(addr, len)? {
            pins.push(Use::Pinned(addr, len, a));
            return Ok(false);
        }
        refuse_other_device_memory(addr, len, &self.name)?;
        Ok(true)
    }

    /// Checks both sides of a copy of `bytes` bytes and pins what they lie in.
    pub fn copy(&self, dst: u64, src: u64, bytes: usize, kind: MemcpyKind) -> Result<Pins<D>> {
        self.copy_sides(dst, src, bytes, kind).map(|(pins, _)| pins)
    }

    /// As [`copy`](Self::copy), also telling which host sides are pageable.
    pub fn copy_sides(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        kind: MemcpyKind,
    ) -> Result<(Pins<D>, Pageable)> {
        let len = bytes as u64;
        let mut pins = Pins::new();
        let mut pageable = [false; 2];
        for (i, (addr, on_device)) in [(dst, kind.dst_on_device()), (src, kind.src_on_device())]
            .into_iter()
            .enumerate()
        {
            if on_device {
                self.device_range(addr, len, &mut pins)?;
            } else {
                pageable[i] = self.host_range(addr, len, &mut pins)?;
            }
        }
        let [dst, src] = pageable;
        Ok((pins, Pageable { dst, src }))
    }

    /// Pins every allocation a graph recorded again, refusing the replay when one was freed
    /// since (or freed and its address handed out anew).
    pub fn repin(&self, recorded: &Recorded<D>) -> Result<Pins<D>> {
        let mut pins = Pins::new();
        for u in &recorded.uses {
            pins.push(match u {
                RecordedUse::Device(a, l, w) => {
                    Use::Device(*a, *l, self.device.relookup(*a, *l, w)?)
                }
                RecordedUse::Pinned(a, l, w) => {
                    Use::Pinned(*a, *l, self.pinned.table().relookup(*a, *l, w)?)
                }
            });
        }
        Ok(pins)
    }

    /// Unregisters the device allocation at `ptr` (null: None). The address is dead for new
    /// work at once; the memory lives while the returned reference or an operation's does.
    pub fn unregister(&self, ptr: u64) -> Result<Option<AllocRef<D>>> {
        if ptr == 0 {
            return Ok(None);
        }
        self.device.remove(ptr).map(Some)
    }
}

/// Refuses a host side of a copy on `device` that is another device's memory the host cannot
/// touch (see [`not_host_owner`](crate::memtable::not_host_owner)): dereferenced as host
/// memory, it would crash the process.
pub fn refuse_other_device_memory(addr: u64, len: u64, device: &str) -> Result<()> {
    match crate::memtable::not_host_owner(addr, len) {
        Some(owner) => Err(Error::BadParam(format!(
            "[{addr:#x}, +{len}) is device memory of {owner}, not host memory: a copy on \
             {device} cannot read or write it (copy between devices through the host, or \
             with Tensor::to)"
        ))),
        None => Ok(()),
    }
}

/// The default stream cannot be destroyed.
pub fn check_destroyable(default: StreamId, stream: StreamId) -> Result<()> {
    if stream == default {
        return Err(Error::BadParam(
            "the default stream cannot be destroyed".into(),
        ));
    }
    Ok(())
}

/// Starts a capture in a stream's capture slot; a stream captures once at a time.
pub fn begin_capture<C>(slot: &mut Option<C>, capture: C) -> Result<()> {
    if slot.is_some() {
        return Err(Error::Capturing(
            "begin_capture on a stream that is already capturing".into(),
        ));
    }
    *slot = Some(capture);
    Ok(())
}

/// Which thread may end a capture. CUDA requires the thread that began a Global or
/// ThreadLocal capture to end it (`CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`, and the capture
/// goes on); a Relaxed capture may be ended by any thread. Every backend keeps that rule, so
/// unirt refuses the call before a driver can, and its own record of the capture never
/// disagrees with the driver's.
#[derive(Debug, Default, Clone, Copy)]
pub struct CaptureOwner(Option<std::thread::ThreadId>);

impl CaptureOwner {
    /// The owner of a capture the calling thread begins in `mode`.
    pub fn new(mode: CaptureMode) -> Self {
        CaptureOwner(match mode {
            CaptureMode::Relaxed => None,
            CaptureMode::Global | CaptureMode::ThreadLocal => {
                Some(crate::thread_state::thread_identity())
            }
        })
    }

    /// `Ok` when the calling thread may end the capture.
    pub fn check_end(&self) -> Result<()> {
        match self.0 {
            Some(t) if t != crate::thread_state::thread_identity() => Err(Error::Capturing(
                "end_capture on another thread than the one that began a Global or \
                 ThreadLocal capture (begin it Relaxed to end it elsewhere)"
                    .into(),
            )),
            _ => Ok(()),
        }
    }
}

/// A backend's record of a capture in progress, which knows its [`CaptureOwner`].
pub trait OwnedCapture {
    fn owner(&self) -> &CaptureOwner;
}

/// Ends the capture in a stream's capture slot, on a thread allowed to.
pub fn end_capture<C: OwnedCapture>(slot: &mut Option<C>) -> Result<C> {
    match slot {
        None => Err(Error::NotCapturing),
        Some(c) => {
            c.owner().check_end()?;
            slot.take().ok_or(Error::NotCapturing)
        }
    }
}

/// How many captures in progress have recorded an event.
///
/// While one has, the event's latest record is a node of a graph that has not run: CUDA
/// invalidates the capture when such an event is queried or waited for from outside it, and
/// on every backend a wait would never see that record complete. So every backend refuses
/// those calls with [`Error::Capturing`] until the capture ends, and the capture holds.
#[derive(Debug, Default)]
pub struct InCapture(std::sync::atomic::AtomicU32);

impl InCapture {
    /// A capture in progress recorded the event.
    pub fn enter(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// A capture that recorded the event ended (with a graph or not).
    pub fn leave(&self) {
        let _ = self.0.fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |n| n.checked_sub(1),
        );
    }

    /// Refuses `what` (query, synchronise, wait from outside, elapsed time) while a capture in
    /// progress has recorded the event.
    pub fn refuse(&self, what: &str) -> Result<()> {
        if self.0.load(std::sync::atomic::Ordering::Acquire) > 0 {
            return Err(Error::Capturing(format!(
                "{what}: the event was recorded inside a capture still in progress (that record \
                 runs only when the graph is launched)"
            )));
        }
        Ok(())
    }
}

/// Refuses `what` on a capturing stream (a wait, a synchronous call on the default stream).
pub fn refuse_while_capturing(capturing: bool, what: &str) -> Result<()> {
    if capturing {
        return Err(Error::Capturing(what.into()));
    }
    Ok(())
}

/// Refuses `what` (stream-ordered allocation or free) inside a capture: no backend records
/// allocation nodes.
pub fn unsupported_while_capturing(capturing: bool, what: &str, backend: DeviceKind) -> Result<()> {
    if capturing {
        return Err(Error::unsupported(
            format!("{what} during capture"),
            backend,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device table whose payload reports its own drop, as host memory would be released.
    struct Tracked(Arc<std::sync::atomic::AtomicBool>);

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn released(flag: &Arc<std::sync::atomic::AtomicBool>) -> bool {
        flag.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn a_free_releases_only_after_the_last_operation_lets_go() -> Result<()> {
        let mem: CheckedMemory<Tracked> = CheckedMemory::new(DeviceKind::Cpu, "test:0", false);
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        mem.device.insert(0x1000, 0x100, Tracked(flag.clone()))?;
        let pins = mem.copy(0x1000, 0x1010, 0x10, MemcpyKind::D2D)?;
        mem.unregister(0x1000)?;
        assert!(!released(&flag), "released under a pinned operation");
        assert!(matches!(
            mem.copy(0x1000, 0x1010, 0x10, MemcpyKind::D2D),
            Err(Error::OutOfBounds { .. })
        ));
        drop(pins);
        assert!(released(&flag));
        Ok(())
    }

    #[test]
    fn host_side_device_addresses_are_refused_or_checked() -> Result<()> {
        let virt: CheckedMemory<()> = CheckedMemory::new(DeviceKind::Cpu, "virt:0", false);
        virt.device.insert(0x1000, 0x100, ())?;
        for kind in [MemcpyKind::H2H, MemcpyKind::H2D, MemcpyKind::D2H] {
            assert!(matches!(
                virt.copy(0x1000, 0x1000, 8, kind),
                Err(Error::BadParam(_))
            ));
        }
        let host: CheckedMemory<()> = CheckedMemory::new(DeviceKind::Cpu, "host:0", true);
        host.device.insert(0x1000, 0x100, ())?;
        assert_eq!(
            host.copy(0x1000, 0x1080, 0x80, MemcpyKind::H2H)?
                .device()
                .count(),
            2
        );
        assert!(matches!(
            host.copy(0x1000, 0x1080, 0x81, MemcpyKind::H2H),
            Err(Error::OutOfBounds { .. })
        ));
        // Host memory unirt never handed out is the caller's promise: nothing to pin.
        assert!(
            host.copy(0x9000, 0x1000, 8, MemcpyKind::D2H)?
                .device()
                .count()
                == 1
        );
        Ok(())
    }

    #[test]
    fn replays_repin_pinned_memory_and_refuse_it_once_freed() -> Result<()> {
        let mem: CheckedMemory<()> = CheckedMemory::new(DeviceKind::Cpu, "test:0", false);
        let h = mem.pinned.alloc(4096)?;
        mem.device.insert(1 << 40, 4096, ())?;
        let pins = mem.copy(h.0, 1 << 40, 4096, MemcpyKind::D2H)?;
        let mut recorded = Recorded::default();
        recorded.record(&pins);
        drop(pins);
        let replay = mem.repin(&recorded)?;
        mem.pinned.free(h)?;
        // The replay in flight still holds the memory; the next one is refused.
        assert!(mem.repin(&recorded).is_err());
        drop(replay);
        // An allocation at the same address is another allocation.
        let again = mem.pinned.alloc(4096)?;
        assert!(matches!(
            mem.repin(&recorded),
            Err(Error::OutOfBounds { .. })
        ));
        mem.pinned.free(again)?;
        Ok(())
    }

    #[test]
    fn coalesced_uses_check_each_allocation_once_and_still_refuse_freed_memory() -> Result<()> {
        let mem: CheckedMemory<()> = CheckedMemory::new(DeviceKind::Cpu, "test:0", false);
        mem.device.insert(0x1000, 0x100, ())?;
        mem.device.insert(0x2000, 0x100, ())?;
        let mut recorded = Recorded::default();
        // Ten "launches" over the two allocations, at different ranges of the first.
        for i in 0..10u64 {
            let mut pins = Pins::new();
            mem.device_range(0x1000 + 8 * i, 16, &mut pins)?;
            mem.device_range(0x2000, 0x100, &mut pins)?;
            recorded.record(&pins);
        }
        assert_eq!(recorded.len(), 20);
        recorded.coalesce();
        assert_eq!(recorded.len(), 2);
        let ranges: Vec<(u64, u64)> = recorded
            .uses
            .iter()
            .map(|u| match u {
                RecordedUse::Device(a, l, _) | RecordedUse::Pinned(a, l, _) => (*a, *l),
            })
            .collect();
        assert_eq!(ranges, vec![(0x1000, 8 * 9 + 16), (0x2000, 0x100)]);
        assert_eq!(mem.repin(&recorded)?.device().count(), 2);
        // Freed, then the address handed out again (larger): still refused.
        mem.unregister(0x1000)?;
        assert!(matches!(
            mem.repin(&recorded),
            Err(Error::OutOfBounds { .. })
        ));
        mem.device.insert(0x1000, 0x200, ())?;
        assert!(matches!(
            mem.repin(&recorded),
            Err(Error::OutOfBounds { .. })
        ));
        Ok(())
    }

    #[derive(Debug)]
    struct Cap(u32, CaptureOwner);

    impl OwnedCapture for Cap {
        fn owner(&self) -> &CaptureOwner {
            &self.1
        }
    }

    #[test]
    fn capture_and_stream_rules() {
        let mut slot = None;
        let relaxed = CaptureOwner::new(CaptureMode::Relaxed);
        assert!(begin_capture(&mut slot, Cap(1, relaxed)).is_ok());
        assert!(matches!(
            begin_capture(&mut slot, Cap(2, relaxed)),
            Err(Error::Capturing(_))
        ));
        assert_eq!(end_capture(&mut slot).ok().map(|c| c.0), Some(1));
        assert!(matches!(end_capture(&mut slot), Err(Error::NotCapturing)));
        // A Global capture is ended by its own thread only; the refusal leaves it in place.
        let mut slot = Some(Cap(3, CaptureOwner::new(CaptureMode::Global)));
        let there = std::thread::scope(|s| s.spawn(|| end_capture(&mut slot).is_err()).join());
        assert!(matches!(there, Ok(true)));
        assert_eq!(end_capture(&mut slot).ok().map(|c| c.0), Some(3));
        assert!(check_destroyable(StreamId(1), StreamId(1)).is_err());
        assert!(check_destroyable(StreamId(1), StreamId(2)).is_ok());
        assert!(refuse_while_capturing(true, "x").is_err());
        assert!(unsupported_while_capturing(true, "x", DeviceKind::Cpu).is_err());
    }
}
