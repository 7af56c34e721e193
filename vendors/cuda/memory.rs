//! Device memory bookkeeping: allocation kinds and the registry of open CUDA devices that
//! makes peer (GPU-to-GPU) copies possible.

use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;

use crate::memtable::AllocTable;

/// How a device allocation was made, which decides how it is freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AllocKind {
    /// `cuMemAlloc`: freed with `cuMemFree`.
    Plain,
    /// `cuMemAllocAsync` from the device's memory pool: freed with `cuMemFreeAsync`.
    Pool,
}

/// What other devices of this process need to know about one open device: its context (for
/// `cuMemcpyPeerAsync`) and its allocations (to bounds-check the peer side of a copy).
#[derive(Debug)]
pub(super) struct PeerInfo {
    pub index: usize,
    pub device: i32,
    pub ctx: u64,
    pub mem: AllocTable<AllocKind>,
}

fn registry() -> &'static Mutex<Vec<Weak<PeerInfo>>> {
    static REG: OnceLock<Mutex<Vec<Weak<PeerInfo>>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(Vec::new()))
}

/// Adds an open device; returns the other open devices.
pub(super) fn register(me: &Arc<PeerInfo>) -> Vec<Arc<PeerInfo>> {
    let mut reg = registry().lock();
    reg.retain(|w| w.strong_count() > 0);
    let others = reg.iter().filter_map(Weak::upgrade).collect();
    reg.push(Arc::downgrade(me));
    others
}

/// The other open device whose allocation holds `[addr, addr + len)`.
pub(super) fn peer_owner(me: usize, addr: u64, len: u64) -> Option<Arc<PeerInfo>> {
    let peers: Vec<Arc<PeerInfo>> = registry().lock().iter().filter_map(Weak::upgrade).collect();
    peers
        .into_iter()
        .find(|p| p.index != me && p.mem.lookup(addr, len).is_ok())
}
