//! Exported entry points: streams, events, launches, capture and graphs.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use crate::capture::{
    self, check_uses, finish, refuse_if_capturing, submit, target, unsafe_call, Graph, GraphCall,
    Pending, Target,
};
use crate::control::misuse;
use crate::exec::{Event, Op, Stream};
use crate::kernels::read_args;
use crate::result::*;
use crate::state::{code, put, with_ctx, Ctx, Driver, Handle};

fn h(p: *mut c_void) -> u64 {
    p as usize as u64
}

fn event(d: &Driver, e: u64, call: &str) -> Result<Arc<Event>, CUresult> {
    match d.handles.get(&e) {
        Some(Handle::Event(ev)) => Ok(ev.clone()),
        _ => {
            misuse(format!("{call}: unknown or destroyed event {e:#x}"));
            Err(INVALID_HANDLE)
        }
    }
}

fn graph(d: &Driver, g: u64, exec: bool, call: &str) -> Result<Arc<Graph>, CUresult> {
    match (d.handles.get(&g), exec) {
        (Some(Handle::Graph(x)), false) | (Some(Handle::Exec(x)), true) => Ok(x.clone()),
        _ => {
            let what = if exec { "graph exec" } else { "graph" };
            misuse(format!("{call}: unknown or destroyed {what} {g:#x}"));
            Err(if g == 0 {
                INVALID_VALUE
            } else {
                INVALID_HANDLE
            })
        }
    }
}

/// Refuses a graph whose event nodes name an event destroyed since the capture: a real driver
/// dereferences the freed event (undefined behaviour, a crash at best).
fn check_events(d: &Driver, g: &Graph, call: &str) -> Result<(), CUresult> {
    for op in &g.nodes {
        if let Op::Record { ev, .. } | Op::Wait { ev, .. } = op {
            if !matches!(d.handles.get(&ev.handle), Some(Handle::Event(_))) {
                misuse(format!(
                    "{call}: graph {:#x} has a node on event {:#x}, destroyed since the capture",
                    g.handle, ev.handle
                ));
                return Err(INVALID_HANDLE);
            }
        }
    }
    Ok(())
}

pub(crate) fn run(r: Result<(Pending, Arc<Ctx>), CUresult>) -> CUresult {
    match r {
        Ok((p, ctx)) => finish(p, &ctx),
        Err(e) => e,
    }
}

// ---- streams -------------------------------------------------------------------------------

/// `cuStreamCreate`: a stream with its own worker thread (flag 1: non-blocking).
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(s: *mut *mut c_void, flags: c_uint) -> CUresult {
    entry("cuStreamCreate", || {
        code(with_ctx(|d, ctx| {
            if s.is_null() || flags > 1 {
                return Err(INVALID_VALUE);
            }
            let handle = d.new_handle();
            let st = Stream::spawn(handle, ctx.clone(), flags == 0).ok_or(OUT_OF_MEMORY)?;
            d.handles.insert(handle, Handle::Stream(st));
            // SAFETY: non-null and valid for a write (the caller's contract).
            unsafe { put(s, handle as usize as *mut c_void) }
        }))
    })
}

/// `cuStreamDestroy_v2`: returns at once; queued work still runs.
#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(s: *mut c_void) -> CUresult {
    entry("cuStreamDestroy_v2", || {
        code(with_ctx(|d, _| {
            let st = match target(d, h(s), "cuStreamDestroy")? {
                Target::Stream(st) => st,
                Target::Legacy(_) => return Err(INVALID_HANDLE),
            };
            d.captures.remove(&st.handle);
            d.handles.remove(&st.handle);
            // Queued work still completes; the worker exits after it.
            st.close();
            Ok(())
        }))
    })
}

/// The streams a synchronise (or query) of `t` waits for; a potentially unsafe call.
fn sync_set(d: &mut Driver, t: &Target, call: &str) -> Result<Vec<Arc<Stream>>, CUresult> {
    if let Target::Stream(s) = t {
        refuse_if_capturing(d, s)?;
    }
    unsafe_call(d, call)?;
    Ok(match t {
        Target::Stream(s) => vec![s.clone()],
        Target::Legacy(ctx) => d
            .streams_of(ctx.handle)
            .into_iter()
            .filter(|s| s.blocking)
            .collect(),
    })
}

/// `cuStreamSynchronize`: waits for the stream's work (refused, and invalidating, while it captures).
#[no_mangle]
pub extern "C" fn cuStreamSynchronize(s: *mut c_void) -> CUresult {
    entry("cuStreamSynchronize", || {
        let r = with_ctx(|d, ctx| {
            let t = target(d, h(s), "cuStreamSynchronize")?;
            Ok((sync_set(d, &t, "cuStreamSynchronize")?, ctx.clone()))
        });
        match r {
            Err(e) => e,
            Ok((streams, ctx)) => {
                for st in streams {
                    st.sync();
                }
                ctx.sticky().unwrap_or(SUCCESS)
            }
        }
    })
}

/// `cuStreamQuery`: `CUDA_ERROR_NOT_READY` while the stream has work queued.
#[no_mangle]
pub extern "C" fn cuStreamQuery(s: *mut c_void) -> CUresult {
    entry("cuStreamQuery", || {
        code(with_ctx(|d, _| {
            let t = target(d, h(s), "cuStreamQuery")?;
            let busy = sync_set(d, &t, "cuStreamQuery")?
                .iter()
                .any(|st| !st.idle());
            if busy {
                Err(NOT_READY)
            } else {
                Ok(())
            }
        }))
    })
}

/// `cuStreamIsCapturing`: 0 none, 1 active, 2 invalidated.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(s: *mut c_void, status: *mut c_int) -> CUresult {
    entry("cuStreamIsCapturing", || {
        code(with_ctx(|d, _| {
            let v = match target(d, h(s), "cuStreamIsCapturing")? {
                Target::Stream(st) => match d.captures.get(&st.handle) {
                    None => 0,
                    Some(c) if c.invalidated => 2,
                    Some(_) => 1,
                },
                Target::Legacy(_) => 0,
            };
            // SAFETY: null or valid for a write (the caller's contract).
            unsafe { put(status, v) }
        }))
    })
}

/// `cuStreamWaitEvent`: makes the stream wait for the event's latest record.
#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(s: *mut c_void, e: *mut c_void, flags: c_uint) -> CUresult {
    entry("cuStreamWaitEvent", || {
        run(with_ctx(|d, ctx| {
            let t = target(d, h(s), "cuStreamWaitEvent")?;
            let ev = event(d, h(e), "cuStreamWaitEvent")?;
            if flags > 1 {
                return Err(INVALID_VALUE);
            }
            let me = match &t {
                Target::Stream(st) => Some(st.handle),
                Target::Legacy(_) => None,
            };
            let capturing = me.is_some_and(|m| d.captures.contains_key(&m));
            let from_capture = ev.captured_in().filter(|c| d.captures.contains_key(c));
            if capturing && flags == 0 {
                match from_capture {
                    // Ordered already: same stream, same capture.
                    Some(c) if Some(c) == me => return Ok((Pending::Nothing, ctx.clone())),
                    _ => {
                        if let Some(cap) = me.and_then(|m| d.captures.get_mut(&m)) {
                            cap.invalidated = true;
                        }
                        return Err(905); // CUDA_ERROR_STREAM_CAPTURE_ISOLATION
                    }
                }
            }
            if !capturing && from_capture.is_some() {
                misuse(
                    "cuStreamWaitEvent: a stream joining another stream's capture (not modelled by the fake driver)"
                        .into(),
                );
                return Err(NOT_SUPPORTED);
            }
            let op = Op::Wait { ev, gen: 0 };
            Ok((submit(d, &t, vec![op], false)?, ctx.clone()))
        }))
    })
}

// ---- events --------------------------------------------------------------------------------

/// `cuEventCreate`: an event (flag 2: timing disabled).
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(e: *mut *mut c_void, flags: c_uint) -> CUresult {
    entry("cuEventCreate", || {
        code(with_ctx(|d, ctx| {
            if e.is_null() || flags > 0xf {
                return Err(INVALID_VALUE);
            }
            let handle = d.new_handle();
            let timing = flags & 0x2 == 0;
            d.handles.insert(
                handle,
                Handle::Event(Arc::new(Event::new(handle, ctx.handle, timing))),
            );
            // SAFETY: non-null and valid for a write (the caller's contract).
            unsafe { put(e, handle as usize as *mut c_void) }
        }))
    })
}

fn record(call: &'static str, e: *mut c_void, s: *mut c_void, flags: c_uint) -> CUresult {
    run(with_ctx(|d, ctx| {
        let t = target(d, h(s), call)?;
        let ev = event(d, h(e), call)?;
        if ev.ctx != ctx.handle || flags > 1 {
            return Err(INVALID_VALUE);
        }
        let capturing_on = match &t {
            Target::Stream(st) if d.captures.contains_key(&st.handle) => Some(st.handle),
            _ => None,
        };
        let p = submit(
            d,
            &t,
            vec![Op::Record {
                ev: ev.clone(),
                gen: 0,
            }],
            false,
        )?;
        if let (Some(st), 0) = (capturing_on, flags) {
            // A plain record inside a capture marks a point of that capture, not an external
            // event: querying it from outside is refused until the capture ends.
            ev.set_captured_in(st);
        }
        Ok((p, ctx.clone()))
    }))
}

/// `cuEventRecord`: records the event on a stream.
#[no_mangle]
pub extern "C" fn cuEventRecord(e: *mut c_void, s: *mut c_void) -> CUresult {
    entry("cuEventRecord", || record("cuEventRecord", e, s, 0))
}

/// `cuEventRecordWithFlags`: records the event; `CU_EVENT_RECORD_EXTERNAL` inside a capture makes a record node.
#[no_mangle]
pub extern "C" fn cuEventRecordWithFlags(
    e: *mut c_void,
    s: *mut c_void,
    flags: c_uint,
) -> CUresult {
    entry("cuEventRecordWithFlags", || {
        record("cuEventRecordWithFlags", e, s, flags)
    })
}

/// The event, refusing one last recorded inside a capture still in progress.
fn settled_event(d: &mut Driver, e: u64, call: &str) -> Result<Arc<Event>, CUresult> {
    let ev = event(d, e, call)?;
    if let Some(Handle::Ctx(c)) = d.handles.get(&ev.ctx) {
        if let Some(r) = c.sticky() {
            return Err(r);
        }
    }
    if let Some(cap) = ev.captured_in().and_then(|c| d.captures.get_mut(&c)) {
        cap.invalidated = true;
        return Err(CAPTURED_EVENT);
    }
    Ok(ev)
}

/// `cuEventQuery`: `CUDA_ERROR_NOT_READY` until the latest record ran.
#[no_mangle]
pub extern "C" fn cuEventQuery(e: *mut c_void) -> CUresult {
    entry("cuEventQuery", || {
        code(with_ctx(|d, _| {
            let ev = settled_event(d, h(e), "cuEventQuery")?;
            unsafe_call(d, "cuEventQuery")?;
            if ev.is_done() {
                Ok(())
            } else {
                Err(NOT_READY)
            }
        }))
    })
}

/// `cuEventSynchronize`: waits for the event's latest record.
#[no_mangle]
pub extern "C" fn cuEventSynchronize(e: *mut c_void) -> CUresult {
    entry("cuEventSynchronize", || {
        let r = with_ctx(|d, ctx| {
            let ev = settled_event(d, h(e), "cuEventSynchronize")?;
            unsafe_call(d, "cuEventSynchronize")?;
            Ok((ev, ctx.clone()))
        });
        match r {
            Err(e) => e,
            Ok((ev, ctx)) => {
                ev.synchronize();
                ctx.sticky().unwrap_or(SUCCESS)
            }
        }
    })
}

/// `cuEventElapsedTime`: milliseconds between two completed, timed records.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    a: *mut c_void,
    b: *mut c_void,
) -> CUresult {
    entry("cuEventElapsedTime", || {
        code(with_ctx(|d, _| {
            if ms.is_null() {
                return Err(INVALID_VALUE);
            }
            let (ea, eb) = (
                settled_event(d, h(a), "cuEventElapsedTime")?,
                settled_event(d, h(b), "cuEventElapsedTime")?,
            );
            let (sa, sb) = (ea.timing_state(), eb.timing_state());
            if !ea.timing || !eb.timing || !sa.0 || !sb.0 {
                return Err(INVALID_HANDLE);
            }
            if !sa.1 || !sb.1 {
                return Err(NOT_READY);
            }
            let (Some(ta), Some(tb)) = (sa.2, sb.2) else {
                return Err(NOT_READY);
            };
            let v = if tb >= ta {
                tb.duration_since(ta).as_secs_f64() * 1e3
            } else {
                -(ta.duration_since(tb).as_secs_f64() * 1e3)
            };
            // SAFETY: non-null and valid for a write (the caller's contract).
            unsafe { put(ms, v as f32) }
        }))
    })
}

/// `cuEventDestroy_v2`: destroys an event; queued records still complete.
#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(e: *mut c_void) -> CUresult {
    entry("cuEventDestroy_v2", || {
        code(with_ctx(|d, _| {
            event(d, h(e), "cuEventDestroy")?;
            // Pending records still complete (the queued op holds the event).
            d.handles.remove(&h(e));
            Ok(())
        }))
    })
}

// ---- launches ------------------------------------------------------------------------------

/// `cuLaunchKernel`: queues a kernel's CPU twin with its arguments read through `kernelParams`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shared: c_uint,
    s: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchKernel", || {
        run(with_ctx(|d, ctx| {
            let t = target(d, h(s), "cuLaunchKernel")?;
            let func = match d.handles.get(&h(f)) {
                Some(Handle::Function(func)) => func.clone(),
                _ => {
                    misuse(format!("cuLaunchKernel: unknown function {f:p}"));
                    return Err(INVALID_HANDLE);
                }
            };
            if func.ctx != ctx.handle {
                return Err(INVALID_CONTEXT);
            }
            let threads = (bx as u64) * (by as u64) * (bz as u64);
            if [gx, gy, gz, bx, by, bz].contains(&0) || threads > 1024 {
                return Err(INVALID_VALUE);
            }
            if !extra.is_null() {
                return Err(NOT_SUPPORTED);
            }
            // SAFETY: one pointer per parameter of the kernel (the caller's contract).
            let args = unsafe { read_args(func.twin, params) }?;
            let op = Op::Kernel {
                twin: func.twin,
                args,
            };
            Ok((submit(d, &t, vec![op], false)?, ctx.clone()))
        }))
    })
}

// ---- capture and graphs --------------------------------------------------------------------

/// `cuStreamBeginCapture_v2`: starts capturing a created stream in a capture mode.
#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(s: *mut c_void, mode: c_int) -> CUresult {
    entry("cuStreamBeginCapture_v2", || {
        code(with_ctx(|d, _| {
            let t = target(d, h(s), "cuStreamBeginCapture")?;
            capture::begin(d, &t, mode)
        }))
    })
}

/// `cuStreamEndCapture`: ends a capture: a graph, or the capture's error and no graph.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(s: *mut c_void, g: *mut *mut c_void) -> CUresult {
    entry_with("cuStreamEndCapture", |injected| {
        code(with_ctx(|d, _| {
            if g.is_null() {
                return Err(INVALID_VALUE);
            }
            let t = target(d, h(s), "cuStreamEndCapture")?;
            let mut r = capture::end(d, &t);
            if let (Some(code), Ok(graph)) = (injected, &r) {
                // An injected failure: the stream leaves capture mode and no graph is made.
                d.handles.remove(graph);
                r = Err(code);
            }
            let out = *r.as_ref().unwrap_or(&0);
            // SAFETY: non-null and valid for a write (the caller's contract); a failed end
            // writes NULL, as CUDA does.
            unsafe { put(g, out as usize as *mut c_void) }?;
            r.map(|_| ())
        }))
    })
}

/// `cuGraphInstantiateWithFlags`: an executable copy of a graph.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    x: *mut *mut c_void,
    g: *mut c_void,
    _flags: u64,
) -> CUresult {
    entry("cuGraphInstantiateWithFlags", || {
        let _using = GraphCall::enter(h(g), "cuGraphInstantiateWithFlags");
        let _family = GraphCall::family(h(g), "cuGraphInstantiateWithFlags");
        code(with_ctx(|d, ctx| {
            if x.is_null() {
                return Err(INVALID_VALUE);
            }
            // A real driver crashed here on a graph whose capture was invalidated (issue 11).
            let gr = graph(d, h(g), false, "cuGraphInstantiateWithFlags")?;
            if gr.ctx != ctx.handle {
                return Err(INVALID_CONTEXT);
            }
            check_events(d, &gr, "cuGraphInstantiateWithFlags")?;
            check_uses(d, &gr, "cuGraphInstantiateWithFlags")?;
            let handle = d.new_handle();
            d.handles.insert(
                handle,
                Handle::Exec(Arc::new(Graph {
                    handle,
                    family: gr.family,
                    ctx: gr.ctx,
                    nodes: gr.nodes.clone(),
                    uses: gr.uses.clone(),
                })),
            );
            // SAFETY: non-null and valid for a write (the caller's contract).
            unsafe { put(x, handle as usize as *mut c_void) }
        }))
    })
}

/// `cuGraphLaunch`: queues an executable graph's nodes in order.
#[no_mangle]
pub extern "C" fn cuGraphLaunch(x: *mut c_void, s: *mut c_void) -> CUresult {
    entry("cuGraphLaunch", || {
        let _using = GraphCall::enter(h(x), "cuGraphLaunch");
        run(with_ctx(|d, ctx| {
            let t = target(d, h(s), "cuGraphLaunch")?;
            let ex = graph(d, h(x), true, "cuGraphLaunch")?;
            if ex.ctx != ctx.handle {
                return Err(INVALID_CONTEXT);
            }
            check_events(d, &ex, "cuGraphLaunch")?;
            check_uses(d, &ex, "cuGraphLaunch")?;
            Ok((submit(d, &t, ex.nodes.clone(), false)?, ctx.clone()))
        }))
    })
}

/// `cuGraphDestroy`: destroys a graph (its executable copies live on).
#[no_mangle]
pub extern "C" fn cuGraphDestroy(g: *mut c_void) -> CUresult {
    entry("cuGraphDestroy", || {
        let _using = GraphCall::enter(h(g), "cuGraphDestroy");
        let _family = GraphCall::family(h(g), "cuGraphDestroy");
        code(with_ctx(|d, _| {
            graph(d, h(g), false, "cuGraphDestroy")?;
            d.handles.remove(&h(g));
            Ok(())
        }))
    })
}

/// `cuGraphExecDestroy`: destroys an executable graph.
#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(x: *mut c_void) -> CUresult {
    entry("cuGraphExecDestroy", || {
        let _using = GraphCall::enter(h(x), "cuGraphExecDestroy");
        let _family = GraphCall::family(h(x), "cuGraphExecDestroy");
        code(with_ctx(|d, _| {
            graph(d, h(x), true, "cuGraphExecDestroy")?;
            d.handles.remove(&h(x));
            Ok(())
        }))
    })
}
