//! The driver's state: devices, primary contexts, handles and memory.
//!
//! - **Devices** are configured from the environment at `cuInit` (see the crate docs).
//! - **Contexts** are primary contexts only (what unirt uses), reference-counted by
//!   `cuDevicePrimaryCtxRetain` / `Release`; the last release destroys the context and
//!   everything in it (streams, events, graphs, modules, memory), as CUDA does. A *sticky*
//!   error (a faulted kernel) poisons a context: every later call that uses it returns that
//!   error until the context is destroyed and retained afresh.
//! - **Handles** (streams, events, graphs, execs, modules, functions, contexts) are opaque
//!   non-null values from one counter, never reused; an unknown one is `INVALID_HANDLE` and is
//!   recorded as misuse (a real driver may crash on it).
//! - **Device memory** lives in its own address space (from [`DEVICE_BASE`]), backed by host
//!   allocations, with a gap after each allocation. A freed span is handed out again to the
//!   next allocation of the same span, as a real driver's allocator does, so that a stale
//!   address above the driver meets a new allocation (a graph node on the old one is recorded
//!   as misuse); out-of-range pointers never land in live memory.
//!   Device addresses are not host addresses: a caller that dereferences one crashes, which
//!   is the point. **Pinned host memory** is real host memory, tracked for the capture rules.

use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::capture::{Capture, Graph};
use crate::exec::{Event, Stream};
use crate::kernels::{Function, Module};
use crate::result::*;

/// The first device address handed out.
pub const DEVICE_BASE: u64 = 0x7e00_0000_0000;
/// Device allocations are aligned like cudaMalloc's (256 B); a gap follows each one.
const DEVICE_ALIGN: u64 = 512;

/// One simulated GPU.
#[derive(Debug, Clone)]
pub struct DeviceCfg {
    pub name: String,
    /// Compute capability ×10 (80 = 8.0).
    pub cc: u32,
    pub memory: u64,
    pub pools: bool,
}

/// A primary context.
#[derive(Debug)]
pub struct Ctx {
    pub handle: u64,
    pub device: usize,
    /// 0, or the sticky error that poisoned this context.
    pub sticky: AtomicI32,
}

impl Ctx {
    pub fn sticky(&self) -> Option<CUresult> {
        match self.sticky.load(Ordering::Acquire) {
            0 => None,
            r => Some(r),
        }
    }

    pub fn poison(&self, r: CUresult) {
        let _ = self
            .sticky
            .compare_exchange(0, r, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Host memory standing in for one device allocation.
pub struct DevBuf {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: DevBuf owns its allocation; concurrent access through `ptr` is the simulated
// device's memory model (racing kernels race on a GPU too); the pointer itself is plain data.
unsafe impl Send for DevBuf {}
// SAFETY: as above.
unsafe impl Sync for DevBuf {}

impl DevBuf {
    /// Zeroed memory of `size` bytes (the OS backs it lazily), or `None` when the host has none.
    fn new(size: u64) -> Option<DevBuf> {
        let layout = Layout::from_size_align(usize::try_from(size).ok()?.max(1), 64).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(DevBuf { ptr, layout })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// One live device allocation.
pub struct DevAlloc {
    pub size: u64,
    pub ctx: u64,
    pub buf: Arc<DevBuf>,
}

/// What a handle value names.
#[derive(Clone)]
pub enum Handle {
    Ctx(Arc<Ctx>),
    Stream(Arc<Stream>),
    Event(Arc<Event>),
    Graph(Arc<Graph>),
    Exec(Arc<Graph>),
    Module(Arc<Module>),
    Function(Arc<Function>),
}

/// The whole driver, behind one lock.
pub struct Driver {
    pub devices: Vec<DeviceCfg>,
    /// Primary context per device and its reference count.
    pub primary: Vec<Option<(Arc<Ctx>, u64)>>,
    pub handles: HashMap<u64, Handle>,
    pub mem: BTreeMap<u64, DevAlloc>,
    /// Bytes allocated per device.
    pub used: Vec<u64>,
    /// Pinned host allocations: base → (size, layout, owning context).
    pub pinned: BTreeMap<u64, (u64, Layout, u64)>,
    /// Enabled peer access: (context, peer context).
    pub peers: Vec<(u64, u64)>,
    /// Stream captures in progress, by stream handle.
    pub captures: HashMap<u64, Capture>,
    next_handle: u64,
    next_addr: u64,
    /// Address spans freed lately, (span, base), handed out again to an allocation of the same
    /// span (newest first), as a real driver's allocator does: a freed address soon names a
    /// new allocation, which is what makes stale-address bugs above the driver visible.
    freed: Vec<(u64, u64)>,
}

/// How many freed spans are kept for reuse.
const FREED_KEPT: usize = 64;

/// The address span an allocation of `size` bytes takes (with a gap after it).
fn span_of(size: u64) -> u64 {
    size.div_ceil(DEVICE_ALIGN) * DEVICE_ALIGN + DEVICE_ALIGN
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

impl Driver {
    fn from_env() -> Driver {
        let n = env_u64("UNIRT_FAKECUDA_DEVICES", 1).min(16) as usize;
        let cc = env_u64("UNIRT_FAKECUDA_CC", 80) as u32;
        let memory = env_u64("UNIRT_FAKECUDA_MEMORY", 8 << 30);
        let pools = env_u64("UNIRT_FAKECUDA_POOLS", 1) != 0;
        Driver {
            devices: (0..n)
                .map(|i| DeviceCfg {
                    name: format!("unirt fakecuda {i} (CPU-backed, fault-injecting)"),
                    cc,
                    memory,
                    pools,
                })
                .collect(),
            primary: vec![None; n],
            handles: HashMap::new(),
            mem: BTreeMap::new(),
            used: vec![0; n],
            pinned: BTreeMap::new(),
            peers: Vec::new(),
            captures: HashMap::new(),
            next_handle: 0x5000,
            next_addr: DEVICE_BASE,
            freed: Vec::new(),
        }
    }

    /// A fresh handle value (never reused).
    pub fn new_handle(&mut self) -> u64 {
        self.next_handle += 0x10;
        self.next_handle
    }

    /// Device memory for the current context's device.
    pub fn alloc(&mut self, ctx: &Ctx, size: u64) -> Result<u64, CUresult> {
        if size == 0 {
            return Err(INVALID_VALUE);
        }
        let d = ctx.device;
        if size > self.devices[d].memory.saturating_sub(self.used[d]) {
            return Err(OUT_OF_MEMORY);
        }
        let buf = DevBuf::new(size).ok_or(OUT_OF_MEMORY)?;
        let span = span_of(size);
        let base = match self.freed.iter().rposition(|&(s, _)| s == span) {
            Some(i) => self.freed.remove(i).1,
            None => {
                let base = self.next_addr;
                self.next_addr = self.next_addr.checked_add(span).ok_or(OUT_OF_MEMORY)?;
                base
            }
        };
        self.used[d] += size;
        self.mem.insert(
            base,
            DevAlloc {
                size,
                ctx: ctx.handle,
                buf: Arc::new(buf),
            },
        );
        Ok(base)
    }

    /// Releases the allocation that starts at `base`.
    pub fn free(&mut self, base: u64) -> Result<(), CUresult> {
        let a = self.mem.remove(&base).ok_or(INVALID_VALUE)?;
        if self.freed.len() == FREED_KEPT {
            self.freed.remove(0);
        }
        self.freed.push((span_of(a.size), base));
        if let Some(Handle::Ctx(c)) = self.handles.get(&a.ctx) {
            let d = c.device;
            self.used[d] = self.used[d].saturating_sub(a.size);
        }
        Ok(())
    }

    /// The buffer of the live device allocation `addr` lies in (its identity: a freed address
    /// handed out anew names another buffer).
    pub fn buffer_at(&self, addr: u64) -> Option<Arc<DevBuf>> {
        let (base, a) = self.mem.range(..=addr).next_back()?;
        (addr - base < a.size).then(|| a.buf.clone())
    }

    /// The device allocation holding `[addr, addr + len)`: its buffer and the offset of `addr`.
    pub fn resolve(&self, addr: u64, len: u64) -> Option<(Arc<DevBuf>, usize)> {
        let (base, a) = self.mem.range(..=addr).next_back()?;
        let off = addr - base;
        (off.checked_add(len)? <= a.size).then(|| (a.buf.clone(), off as usize))
    }

    /// Whether `addr` is inside some device allocation (of any size).
    pub fn is_device(&self, addr: u64) -> bool {
        self.resolve(addr, 0).is_some() || (addr >= DEVICE_BASE && addr < self.next_addr)
    }

    /// Whether `[addr, addr + len)` lies in pinned host memory.
    pub fn is_pinned(&self, addr: u64, len: u64) -> bool {
        self.pinned
            .range(..=addr)
            .next_back()
            .is_some_and(|(b, (s, _, _))| addr - b + len <= *s)
    }

    pub fn ctx(&self, handle: u64) -> Option<Arc<Ctx>> {
        match self.handles.get(&handle) {
            Some(Handle::Ctx(c)) => Some(c.clone()),
            _ => None,
        }
    }

    /// Streams of a context.
    pub fn streams_of(&self, ctx: u64) -> Vec<Arc<Stream>> {
        self.handles
            .values()
            .filter_map(|h| match h {
                Handle::Stream(s) if s.ctx.handle == ctx => Some(s.clone()),
                _ => None,
            })
            .collect()
    }

    /// Destroys a context and everything in it (its last primary reference was released).
    pub fn destroy_ctx(&mut self, ctx: &Arc<Ctx>) {
        let c = ctx.handle;
        self.captures.retain(|_, cap| cap.ctx != c);
        let mut gone = Vec::new();
        for (h, v) in &self.handles {
            let owner = match v {
                Handle::Stream(s) => s.ctx.handle,
                Handle::Event(e) => e.ctx,
                Handle::Graph(g) | Handle::Exec(g) => g.ctx,
                Handle::Module(m) => m.ctx,
                Handle::Function(f) => f.ctx,
                Handle::Ctx(x) => x.handle,
            };
            if owner == c {
                gone.push(*h);
            }
        }
        for h in gone {
            if let Some(Handle::Stream(s)) = self.handles.remove(&h) {
                s.close();
            }
        }
        let bases: Vec<u64> = self
            .mem
            .iter()
            .filter(|(_, a)| a.ctx == c)
            .map(|(b, _)| *b)
            .collect();
        for b in bases {
            self.mem.remove(&b);
        }
        self.used[ctx.device] = 0;
        let pinned: Vec<u64> = self
            .pinned
            .iter()
            .filter(|(_, (_, _, owner))| *owner == c)
            .map(|(b, _)| *b)
            .collect();
        for b in pinned {
            if let Some((_, layout, _)) = self.pinned.remove(&b) {
                // SAFETY: allocated by cuMemAllocHost_v2 with this layout; removed from the
                // table first, so freed once. Queued work of this context has drained (its
                // streams were closed and the caller holds no op).
                unsafe { std::alloc::dealloc(b as *mut u8, layout) };
            }
        }
        self.peers.retain(|(a, b)| *a != c && *b != c);
    }
}

/// Contexts poisoned by an injected sticky error (a test reads it to know whether a sticky
/// fault found a context to poison).
pub static POISONED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

static DRIVER: OnceLock<Mutex<Option<Driver>>> = OnceLock::new();

/// The driver lock; `None` inside until `cuInit` succeeded.
pub fn lock() -> MutexGuard<'static, Option<Driver>> {
    DRIVER
        .get_or_init(|| Mutex::new(None))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// `cuInit`: builds the driver from the environment once.
pub fn init() -> CUresult {
    let mut g = lock();
    if g.is_none() {
        *g = Some(Driver::from_env());
    }
    if g.as_ref().is_some_and(|d| d.devices.is_empty()) {
        NO_DEVICE
    } else {
        SUCCESS
    }
}

thread_local! {
    /// The calling thread's current context handle (0: none).
    pub static CURRENT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The calling thread's stream-capture interaction mode (0 global, 1 thread-local, 2 relaxed).
    pub static MODE: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// Runs `f` with the initialised driver.
pub fn with<T>(f: impl FnOnce(&mut Driver) -> Result<T, CUresult>) -> Result<T, CUresult> {
    let mut g = lock();
    let d = g.as_mut().ok_or(NOT_INITIALIZED)?;
    f(d)
}

/// Runs `f` with the driver and the calling thread's current, unpoisoned context.
pub fn with_ctx<T>(
    f: impl FnOnce(&mut Driver, &Arc<Ctx>) -> Result<T, CUresult>,
) -> Result<T, CUresult> {
    with(|d| {
        let ctx = d.ctx(CURRENT.with(|c| c.get())).ok_or(INVALID_CONTEXT)?;
        if let Some(r) = ctx.sticky() {
            return Err(r);
        }
        f(d, &ctx)
    })
}

/// Turns a `Result` into the `CUresult` an exported function returns.
pub fn code(r: Result<(), CUresult>) -> CUresult {
    match r {
        Ok(()) => SUCCESS,
        Err(e) => e,
    }
}

/// Side effects of an injected code: a sticky one poisons the current context; a capture
/// error invalidates the calling thread's captures.
pub fn apply_injected(code: CUresult) {
    let mut g = lock();
    let Some(d) = g.as_mut() else { return };
    if is_sticky(code) {
        if let Some(c) = d.ctx(CURRENT.with(|c| c.get())) {
            if c.sticky().is_none() {
                POISONED.fetch_add(1, Ordering::Relaxed);
            }
            c.poison(code);
        }
    }
    if code == STREAM_CAPTURE_INVALIDATED || code == STREAM_CAPTURE_UNSUPPORTED {
        let me = std::thread::current().id();
        for cap in d.captures.values_mut().filter(|c| c.thread == me) {
            cap.invalidated = true;
        }
    }
}

/// Writes `v` through an out-pointer, refusing null.
///
/// # Safety
/// `p` must be null or valid for one write of `T`.
pub unsafe fn put<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-null and valid for a write (the caller's contract).
    unsafe { p.write(v) };
    Ok(())
}
