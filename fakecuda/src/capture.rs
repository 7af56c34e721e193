//! Stream capture, graphs, and where work goes when it is enqueued.
//!
//! A capturing stream appends its work to the capture's node list instead of running it;
//! `cuStreamEndCapture` turns the list into a graph, `cuGraphInstantiateWithFlags` copies it
//! into an executable graph, and `cuGraphLaunch` queues the nodes in order (a graph launched
//! into a capturing stream is captured as its nodes).
//!
//! Capture modes follow `cuThreadExchangeStreamCaptureMode`'s rules. A "potentially unsafe"
//! call (`cuMemAlloc`, `cuMemFree`, `cuMemAllocHost`, `cuMemFreeHost`, `cuModuleLoadData`,
//! `cuModuleUnload`, `cuCtxSynchronize`, a copy to or from pageable host memory on a stream
//! that is not capturing, and synchronising or querying a stream or an event that is not part
//! of a capture — an H100 with CUDA 13 refused `cuStreamSynchronize` and `cuEventSynchronize`
//! of such streams and events during a Global capture, and a ThreadLocal capture whose thread
//! synchronised another stream ended invalidated) is prohibited when the calling thread's mode is
//! - Global (the default): the thread has a capture in progress begun in Global or
//!   ThreadLocal mode, or any thread has one begun in Global mode;
//! - ThreadLocal: the thread has a capture in progress begun in Global or ThreadLocal mode;
//! - Relaxed: never.
//!
//! A prohibited call returns `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the
//! captures it conflicts with; so does synchronising or querying a capturing stream (in any
//! mode), or querying an event last recorded inside a capture. Work enqueued on a stream whose
//! capture was invalidated returns `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, and ending that
//! capture returns the same error and no graph, leaving the stream usable. Ending a Global or
//! ThreadLocal capture from another thread is `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`.
//!
//! Not modelled: cross-stream capture (a second stream joining a capture by waiting on an
//! event recorded in it — unirt records events as external nodes and never joins), memory
//! nodes (`cuMemAllocAsync` while capturing answers `CUDA_ERROR_NOT_SUPPORTED`).

use std::sync::{Arc, Weak};
use std::thread::ThreadId;

use crate::control::misuse;
use crate::exec::Loc;
use crate::exec::{instantiate_op, Op, Stream};
use crate::result::*;
use crate::state::{Ctx, DevBuf, Driver, Handle, CURRENT, MODE};

pub const MODE_GLOBAL: i32 = 0;
pub const MODE_THREAD_LOCAL: i32 = 1;
pub const MODE_RELAXED: i32 = 2;

/// A capture in progress on one stream.
pub struct Capture {
    pub ctx: u64,
    pub mode: i32,
    pub thread: ThreadId,
    pub nodes: Vec<Op>,
    pub uses: Vec<DeviceUse>,
    pub invalidated: bool,
}

/// A device address a captured node uses and the allocation it named at capture. A real
/// driver's memset, copy and kernel nodes refer to that allocation: instantiating or launching
/// them after it was freed — even with the address handed out anew — is undefined behaviour
/// there (the suspected cause of a SIGSEGV inside `cuGraphInstantiateWithFlags` on an H200),
/// which the fake records as misuse.
#[derive(Clone)]
pub struct DeviceUse {
    pub addr: u64,
    pub buf: Weak<DevBuf>,
}

/// A graph or an executable graph: its nodes in capture order.
pub struct Graph {
    pub handle: u64,
    /// The captured graph's handle, also in each exec instantiated from it (see
    /// [`GraphCall::family`]).
    pub family: u64,
    pub ctx: u64,
    pub nodes: Vec<Op>,
    pub uses: Vec<DeviceUse>,
}

/// The device allocations `ops` use now (kernel arguments that lie in one count as pointers).
fn device_uses(d: &Driver, ops: &[Op]) -> Vec<DeviceUse> {
    let mut addrs = Vec::new();
    for op in ops {
        match op {
            Op::Copy { dst, src, .. } => {
                for loc in [dst, src] {
                    if let Loc::Dev(a) = loc {
                        addrs.push(*a);
                    }
                }
            }
            Op::Set { dst, .. } => addrs.push(*dst),
            Op::Kernel { args, .. } => addrs.extend(args.iter().copied()),
            _ => {}
        }
    }
    addrs
        .into_iter()
        .filter_map(|addr| {
            d.buffer_at(addr).map(|b| DeviceUse {
                addr,
                buf: Arc::downgrade(&b),
            })
        })
        .collect()
}

/// Graph and exec handles some thread is inside a driver call on right now.
static GRAPHS_IN_USE: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// Marks a call on graph object `h` (a `CUgraph` or `CUgraphExec`) for its duration. CUDA's
/// graph objects are not internally synchronised: no call on one — `cuGraphInstantiate`
/// included — may overlap another on the same object from a second thread. An overlap is
/// recorded as misuse (a real driver may corrupt the object or crash).
pub struct GraphCall(u64);

impl GraphCall {
    pub fn enter(h: u64, call: &str) -> GraphCall {
        Self::mark(h, || {
            format!(
                "{call}: graph object {h:#x} is in a call on another thread (graph objects are \
                 not internally synchronised)"
            )
        })
    }

    /// Marks a call that creates or destroys a member of graph object `h`'s family (the graph
    /// and the execs instantiated from it): `cuGraphInstantiateWithFlags`, `cuGraphExecDestroy`,
    /// `cuGraphDestroy`. Two at once on one family, even on different execs, are recorded as
    /// misuse: a real driver (580, CUDA 13.0, H200) crashed inside `cuGraphExecDestroy` when
    /// threads destroyed execs of one graph while others were destroyed or instantiated, and did
    /// not when those calls were serialised (launches left concurrent). Unknown handles enter
    /// nothing (the call itself refuses them).
    pub fn family(h: u64, call: &str) -> Option<GraphCall> {
        let family = crate::state::with(|d| match d.handles.get(&h) {
            Some(Handle::Graph(g) | Handle::Exec(g)) => Ok(g.family),
            _ => Err(INVALID_HANDLE),
        })
        .ok()?;
        // A key apart from every handle value (handles are small counters).
        Some(Self::mark(family | 1 << 63, || {
            format!(
                "{call}: graph {family:#x} or an exec instantiated from it is being created or \
                 destroyed on another thread (libcuda crashed on this)"
            )
        }))
    }

    /// Marks `key` busy for the returned guard's life; recorded as misuse (`what`) when another
    /// thread holds it.
    fn mark(key: u64, what: impl FnOnce() -> String) -> GraphCall {
        let mut busy = GRAPHS_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
        if busy.contains(&key) {
            misuse(what());
        }
        busy.push(key);
        drop(busy);
        // Widen the window a little, so that racing callers overlap here as they would
        // inside a real driver's longer calls.
        std::thread::yield_now();
        GraphCall(key)
    }
}

impl Drop for GraphCall {
    fn drop(&mut self) {
        let mut busy = GRAPHS_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = busy.iter().position(|&h| h == self.0) {
            busy.swap_remove(i);
        }
    }
}

/// Records misuse (and refuses) when a graph's node uses an allocation freed since the capture.
pub fn check_uses(d: &Driver, g: &Graph, call: &str) -> Result<(), CUresult> {
    for u in &g.uses {
        let same = d
            .buffer_at(u.addr)
            .is_some_and(|b| std::ptr::eq(Arc::as_ptr(&b), u.buf.as_ptr()));
        if !same {
            misuse(format!(
                "{call}: graph {:#x} has a node on device address {:#x}, whose allocation was \
                 freed since the capture",
                g.handle, u.addr
            ));
            return Err(INVALID_VALUE);
        }
    }
    Ok(())
}

/// Where work for a stream handle goes.
pub enum Target {
    Stream(Arc<Stream>),
    /// The legacy stream of this context.
    Legacy(Arc<Ctx>),
}

/// Legacy and per-thread stream handles.
fn is_legacy(h: u64) -> bool {
    h <= 2
}

/// Resolves a stream handle for a call in the current context.
pub fn target(d: &Driver, h: u64, call: &str) -> Result<Target, CUresult> {
    let cur = d.ctx(CURRENT.with(|c| c.get())).ok_or(INVALID_CONTEXT)?;
    if let Some(r) = cur.sticky() {
        return Err(r);
    }
    if is_legacy(h) {
        return Ok(Target::Legacy(cur));
    }
    match d.handles.get(&h) {
        Some(Handle::Stream(s)) => {
            if let Some(r) = s.ctx.sticky() {
                return Err(r);
            }
            if s.ctx.handle != cur.handle {
                return Err(INVALID_CONTEXT);
            }
            Ok(Target::Stream(s.clone()))
        }
        _ => {
            misuse(format!("{call}: unknown stream handle {h:#x}"));
            Err(INVALID_HANDLE)
        }
    }
}

/// What the caller must still do, outside the driver lock, after [`submit`].
pub enum Pending {
    Nothing,
    /// Wait for the op with this sequence number (a synchronous call).
    Wait(Arc<Stream>, u64),
    /// Run on the calling thread after these blocking streams drained (the legacy stream).
    Inline(Vec<Arc<Stream>>, Vec<Op>),
}

/// Sends ops to a stream: into its capture, onto its queue, or inline for the legacy stream.
/// `wait` asks for the last op to have run before the call returns.
pub fn submit(d: &mut Driver, t: &Target, ops: Vec<Op>, wait: bool) -> Result<Pending, CUresult> {
    match t {
        Target::Stream(s) => {
            if d.captures.contains_key(&s.handle) {
                let uses = device_uses(d, &ops);
                let cap = d.captures.get_mut(&s.handle).ok_or(ILLEGAL_STATE)?;
                if cap.invalidated {
                    return Err(STREAM_CAPTURE_INVALIDATED);
                }
                cap.nodes.extend(ops);
                cap.uses.extend(uses);
                return Ok(Pending::Nothing);
            }
            let mut last = 0;
            for op in &ops {
                last = s.push(instantiate_op(op));
            }
            Ok(if wait && last > 0 {
                Pending::Wait(s.clone(), last)
            } else {
                Pending::Nothing
            })
        }
        Target::Legacy(ctx) => {
            let blocking: Vec<Arc<Stream>> = d
                .streams_of(ctx.handle)
                .into_iter()
                .filter(|s| s.blocking)
                .collect();
            // The legacy stream cannot join a capture of a blocking stream.
            let mut implicit = false;
            for s in &blocking {
                if let Some(cap) = d.captures.get_mut(&s.handle) {
                    cap.invalidated = true;
                    implicit = true;
                }
            }
            if implicit {
                return Err(STREAM_CAPTURE_IMPLICIT);
            }
            Ok(Pending::Inline(
                blocking,
                ops.iter().map(instantiate_op).collect(),
            ))
        }
    }
}

/// Finishes a submission outside the driver lock.
pub fn finish(p: Pending, ctx: &Ctx) -> CUresult {
    match p {
        Pending::Nothing => SUCCESS,
        Pending::Wait(s, seq) => {
            s.wait_for(seq);
            s.ctx.sticky().unwrap_or(SUCCESS)
        }
        Pending::Inline(blocking, ops) => {
            for s in blocking {
                s.sync();
            }
            for op in &ops {
                if ctx.sticky().is_some() {
                    break;
                }
                if let Err(r) = crate::exec::execute(op) {
                    ctx.poison(r);
                }
            }
            ctx.sticky().unwrap_or(SUCCESS)
        }
    }
}

/// Applies the capture-mode rules to a potentially unsafe call by the calling thread:
/// `Err(STREAM_CAPTURE_UNSUPPORTED)` (after invalidating the conflicting captures) when the
/// call is prohibited.
pub fn unsafe_call(d: &mut Driver, call: &str) -> Result<(), CUresult> {
    let mode = MODE.with(|m| m.get());
    if mode == MODE_RELAXED {
        return Ok(());
    }
    let me = std::thread::current().id();
    let mut prohibited = false;
    let dead: Vec<u64> = d
        .captures
        .values()
        .filter(|c| d.ctx(c.ctx).is_none_or(|x| x.sticky().is_some()))
        .map(|c| c.ctx)
        .collect();
    // A poisoned context's captures can never end well; they no longer constrain anyone.
    for cap in d.captures.values_mut().filter(|c| !dead.contains(&c.ctx)) {
        let own = cap.thread == me && cap.mode != MODE_RELAXED;
        let foreign = mode == MODE_GLOBAL && cap.thread != me && cap.mode == MODE_GLOBAL;
        if own || foreign {
            cap.invalidated = true;
            prohibited = true;
        }
    }
    if prohibited {
        eprintln!("unirt-fakecuda: {call} during a stream capture: capture invalidated");
        return Err(STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

/// Synchronising or querying a capturing stream: always prohibited; invalidates its capture.
pub fn refuse_if_capturing(d: &mut Driver, s: &Stream) -> Result<(), CUresult> {
    match d.captures.get_mut(&s.handle) {
        Some(cap) => {
            cap.invalidated = true;
            Err(STREAM_CAPTURE_UNSUPPORTED)
        }
        None => Ok(()),
    }
}

/// `cuStreamBeginCapture_v2`.
pub fn begin(d: &mut Driver, t: &Target, mode: i32) -> Result<(), CUresult> {
    let s = match t {
        Target::Stream(s) => s,
        Target::Legacy(_) => return Err(STREAM_CAPTURE_UNSUPPORTED),
    };
    if !(MODE_GLOBAL..=MODE_RELAXED).contains(&mode) {
        return Err(INVALID_VALUE);
    }
    if d.captures.contains_key(&s.handle) {
        return Err(ILLEGAL_STATE);
    }
    d.captures.insert(
        s.handle,
        Capture {
            ctx: s.ctx.handle,
            mode,
            thread: std::thread::current().id(),
            nodes: Vec::new(),
            uses: Vec::new(),
            invalidated: false,
        },
    );
    Ok(())
}

/// `cuStreamEndCapture`: the new graph's handle.
pub fn end(d: &mut Driver, t: &Target) -> Result<u64, CUresult> {
    let s = match t {
        Target::Stream(s) => s,
        Target::Legacy(_) => return Err(ILLEGAL_STATE),
    };
    let cap = d.captures.get(&s.handle).ok_or(ILLEGAL_STATE)?;
    if cap.mode != MODE_RELAXED && cap.thread != std::thread::current().id() {
        return Err(STREAM_CAPTURE_WRONG_THREAD);
    }
    let cap = d.captures.remove(&s.handle).ok_or(ILLEGAL_STATE)?;
    if cap.invalidated {
        return Err(STREAM_CAPTURE_INVALIDATED);
    }
    let h = d.new_handle();
    d.handles.insert(
        h,
        Handle::Graph(Arc::new(Graph {
            handle: h,
            family: h,
            ctx: cap.ctx,
            nodes: cap.nodes,
            uses: cap.uses,
        })),
    );
    Ok(h)
}
