//! Captured graphs: native `CUgraph` / `CUgraphExec`, with what unirt tracks beside them, and
//! the [`CudaBackend`] calls that capture, instantiate, launch and destroy them (the `Backend`
//! methods of `backend.rs` call these): every handle, range and event re-checked before the
//! driver sees it, and calls on one graph family ordered (`GraphFamily`).

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use super::event::CudaEvent;
use super::gate::HandleGate;
use super::stream::{CaptureLog, DeviceUse};
use super::CudaBackend;
use crate::error::{Error, Result};
use crate::hal::{CaptureMode, EventId, GraphExecId, GraphId, StreamId};
use crate::memtable::RecordedRange;

/// A captured graph. `raw` is the `CUgraph` and also the HAL handle.
#[derive(Debug)]
pub(super) struct CudaGraph {
    pub raw: u64,
    /// Device ranges the captured work touches.
    pub ranges: Arc<[DeviceUse]>,
    /// Pinned host ranges (unirt's `malloc_host` memory) the captured copies touch.
    pub pinned: Arc<[RecordedRange<()>]>,
    /// Events recorded inside the capture.
    pub events: Arc<[Arc<CudaEvent>]>,
    /// Events the graph waits on: a replay must not name a destroyed one.
    pub waits: Arc<[Arc<CudaEvent>]>,
    /// Fault words the graph's kernels may claim.
    pub checks: Arc<[Arc<super::fault::FaultWord>]>,
    /// Held by instantiate; destroy waits for it.
    pub gate: HandleGate,
    /// Shared with every exec instantiated from it (see [`GraphFamily`]).
    pub family: GraphFamily,
}

/// An instantiated graph. `raw` is the `CUgraphExec` and also the HAL handle. `ranges` are
/// re-checked against the allocation tables before every launch, so a replay never writes
/// memory freed since the capture, even where the address was handed out anew (CUDA itself
/// would not notice).
#[derive(Debug)]
pub(super) struct CudaGraphExec {
    pub raw: u64,
    pub ranges: Arc<[DeviceUse]>,
    /// Pinned host ranges, re-checked against the pinned table before every launch.
    pub pinned: Arc<[RecordedRange<()>]>,
    /// Events the graph records: counted as recorded (for elapsed time) once a launch is
    /// enqueued.
    pub events: Arc<[Arc<CudaEvent>]>,
    /// Events the graph waits on.
    pub waits: Arc<[Arc<CudaEvent>]>,
    /// Fault words the graph's kernels may claim: noted on the stream of each launch.
    pub checks: Arc<[Arc<super::fault::FaultWord>]>,
    /// Held by launch; destroy waits for it.
    pub gate: HandleGate,
    /// The family of the graph it was instantiated from.
    pub family: GraphFamily,
}

/// Serialises the driver calls on a graph and on the execs instantiated from it, and the
/// creation and destruction of graph objects process-wide.
///
/// Why: libcuda crashes (SIGSEGV inside `cuGraphExecDestroy`, or in the next graph call
/// after it) when threads each instantiate an exec from one shared graph, launch it on a
/// stream of their own and destroy it, with only the instantiation serialised — every handle
/// live, each exec used by one thread. On an H200 (driver 580.159, CUDA 13.0), a plain CUDA
/// program doing that (`ci/repro/cuda_graph_exec_destroy.cu`, variant 4) crashed in 3 of 3
/// runs of 100 rounds; with each exec destroy serialised with the instantiations, 0 of 3; with
/// the launches serialised as well, 0 of 3; with a graph of its own per thread and nothing
/// serialised, 0 of 3. unirt's case `capture::graph_objects_used_from_several_threads` crashed
/// there in 10 of 24 runs (whole suite or the case alone) before this order and in none of 17
/// after. CUDA documents graph objects as not thread-safe; these calls evidently touch state
/// an exec shares with its graph and its siblings. So unirt orders instantiate, launch and
/// destroy within one family under its lock, and the creating and destroying calls
/// (instantiate, exec destroy, graph destroy) under one process-wide lock as well, in case the
/// shared state reaches past the family (not seen, and cheap to rule out: those calls take
/// tens of microseconds in the driver anyway). Launches of unrelated graphs stay concurrent.
#[derive(Debug, Clone, Default)]
pub(super) struct GraphFamily(Arc<Mutex<()>>);

/// The process-wide order of graph creation and destruction calls (see [`GraphFamily`]).
static GRAPH_LIFECYCLE: Mutex<()> = Mutex::new(());

impl GraphFamily {
    /// For a launch: this family's calls only.
    pub fn launch(&self) -> MutexGuard<'_, ()> {
        self.0.lock()
    }

    /// For an instantiate or a destroy: this family's calls, then every family's creation and
    /// destruction (always in this order, so the two locks cannot deadlock).
    pub fn lifecycle(&self) -> (MutexGuard<'_, ()>, MutexGuard<'static, ()>) {
        let family = self.0.lock();
        (family, GRAPH_LIFECYCLE.lock())
    }
}

impl CudaBackend {
    /// [`Backend::begin_capture`](crate::hal::Backend::begin_capture).
    pub(super) fn start_capture(&self, stream: StreamId, mode: CaptureMode) -> Result<()> {
        let s = self.stream(stream)?;
        self.bind()?;
        // Module loading is not allowed inside a global-mode capture: load the kernels first.
        self.preload_kernels();
        // Waits for a device-wide synchronize that is waiting on this stream right now; the
        // capture state is checked under it (a check before could be stale by now).
        let _gate = s.gate.exclusive(StreamId::KIND, s.raw)?;
        let mut cap = s.capture.lock();
        if cap.is_some() {
            return Err(Error::Capturing(
                "begin_capture on a stream that is already capturing".into(),
            ));
        }
        let entry = self.mark_queued_work(&s)?;
        // CaptureMode uses CUstreamCaptureMode's numbering (global 0, thread-local 1, relaxed 2).
        // SAFETY: the stream came from the stream table and is not capturing (checked above).
        if let Err(e) = unsafe { self.drv.begin_capture(s.raw, mode as i32) } {
            if let Some(ev) = entry {
                self.destroy_marker(ev);
            }
            return Err(e);
        }
        *cap = Some(CaptureLog {
            owner: crate::checked::CaptureOwner::new(mode),
            entry,
            ..Default::default()
        });
        Ok(())
    }

    /// [`Backend::end_capture`](crate::hal::Backend::end_capture).
    pub(super) fn finish_capture(&self, stream: StreamId) -> Result<GraphId> {
        let s = self.stream(stream)?;
        // Until the driver has ended the capture, no device synchronize may take the stream
        // for one that is not capturing.
        let _gate = s.gate.exclusive(StreamId::KIND, s.raw)?;
        let rec = {
            let mut cap = s.capture.lock();
            // The driver would refuse another thread (and the capture would go on).
            cap.as_ref().ok_or(Error::NotCapturing)?.owner.check_end()?;
            cap.take().ok_or(Error::NotCapturing)?
        };
        for e in &rec.events {
            e.captured.leave();
        }
        self.bind()?;
        // SAFETY: the stream came from the stream table and is capturing (checked above).
        let raw = unsafe { self.drv.end_capture(s.raw) };
        if let Some(ev) = rec.entry {
            self.destroy_marker(ev);
        }
        let raw = raw?;
        self.graphs.insert_with(
            raw,
            CudaGraph {
                raw,
                ranges: rec.ranges.into(),
                pinned: rec.pinned.into(),
                events: rec.events.into(),
                waits: rec.waits.into(),
                checks: rec.checks.into(),
                gate: Default::default(),
                family: Default::default(),
            },
        );
        Ok(GraphId(raw))
    }

    /// [`Backend::graph_instantiate`](crate::hal::Backend::graph_instantiate).
    pub(super) fn instantiate_graph(&self, graph: GraphId) -> Result<GraphExecId> {
        let g = self.graphs.get(graph.0)?;
        // Exclusive: CUDA graph objects are not internally synchronised, and no call on one
        // graph — cuGraphInstantiate included — may run on two threads at once.
        let _g_use = g.gate.exclusive(GraphId::KIND, g.raw)?;
        let _events_use = enter_events(&g.events, &g.waits)?;
        // From the check to the driver's instantiate, a free on another thread waits (its
        // exclusive turn): the driver never reads nodes on memory released in between. Without
        // it the C ABI fuzzer's four threads had libcuda instantiate a graph on a freed
        // allocation over the fake driver (1 seed in 185).
        let _gate = self.enqueue_gate.read();
        self.check_graph(&g.ranges, &g.events)?;
        self.check_graph(&[], &g.waits)?;
        self.check_pinned(&g.pinned)?;
        self.bind()?;
        // Ordered with the graph's execs and every graph creation/destruction (`GraphFamily`).
        let _order = g.family.lifecycle();
        // SAFETY: the graph came from the live graph table.
        let raw = unsafe { self.drv.graph_instantiate(g.raw) }?;
        self.execs.insert_with(
            raw,
            CudaGraphExec {
                raw,
                ranges: g.ranges.clone(),
                pinned: g.pinned.clone(),
                events: g.events.clone(),
                waits: g.waits.clone(),
                checks: g.checks.clone(),
                gate: Default::default(),
                family: g.family.clone(),
            },
        );
        Ok(GraphExecId(raw))
    }

    /// [`Backend::graph_launch`](crate::hal::Backend::graph_launch).
    pub(super) fn launch_graph(&self, exec: GraphExecId, stream: StreamId) -> Result<()> {
        let (x, s) = (self.execs.get(exec.0)?, self.stream(stream)?);
        // The driver refuses a graph launched into a capture (CUDA 13 on an H200:
        // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), and a refused call there may invalidate the
        // capture; refused here, the capture goes on intact.
        if s.is_capturing() {
            return Err(Error::Capturing(
                "launching a graph into a capturing stream (CUDA cannot capture a graph launch)"
                    .into(),
            ));
        }
        // Exclusive: an exec is not internally synchronised either; launches of one exec from
        // two threads are serialised here instead of racing inside the driver.
        let _x_use = x.gate.exclusive(GraphExecId::KIND, x.raw)?;
        let _s_use = s.gate.enter(StreamId::KIND, s.raw)?;
        let _events_use = enter_events(&x.events, &x.waits)?;
        let _gate = self.enqueue_gate.read();
        // A replay must not touch memory freed (or events destroyed) since the capture.
        self.check_graph(&x.ranges, &x.events)?;
        self.check_graph(&[], &x.waits)?;
        self.check_pinned(&x.pinned)?;
        self.bind()?;
        // Ordered with the calls on the other execs of its graph (`GraphFamily`).
        let order = x.family.launch();
        // SAFETY: the exec and the stream came from their tables and the graph's ranges were
        // re-checked above.
        let launched = unsafe { self.drv.graph_launch(x.raw, s.raw) };
        drop(order);
        launched?;
        s.note_faults(&x.checks);
        for e in x.events.iter() {
            if !s.note_event(e) {
                e.mark_recorded();
            }
        }
        // Launched into a capture, the graph's event waits become the new graph's too: its
        // instantiate and launches must see them (a destroyed one is refused, never handed to
        // the driver).
        for e in x.waits.iter() {
            s.note_wait(e);
        }
        Ok(())
    }

    /// [`Backend::graph_destroy`](crate::hal::Backend::graph_destroy).
    pub(super) fn destroy_graph(&self, graph: GraphId) -> Result<()> {
        self.bind()?;
        let g = self.graphs.remove(graph.0)?;
        // Waits for an instantiate of it on another thread.
        let _excl = g.gate.exclusive(GraphId::KIND, g.raw)?;
        // Ordered with the calls on its execs and every graph creation/destruction (libcuda
        // crashes otherwise: `GraphFamily`).
        let order = g.family.lifecycle();
        // SAFETY: the graph came out of the graph table, which no longer lists it, and no call
        // is using it (gate held exclusively): destroyed once (on failure it goes back to the
        // table).
        let destroyed = unsafe { self.drv.graph_destroy(g.raw) };
        drop(order);
        destroyed
            .map(|()| g.gate.mark_destroyed())
            .inspect_err(|_| self.graphs.restore(graph.0, g.clone()))
    }

    /// [`Backend::graph_exec_destroy`](crate::hal::Backend::graph_exec_destroy).
    pub(super) fn destroy_graph_exec(&self, exec: GraphExecId) -> Result<()> {
        self.bind()?;
        let x = self.execs.remove(exec.0)?;
        // Waits for a launch of it on another thread.
        let _excl = x.gate.exclusive(GraphExecId::KIND, x.raw)?;
        // Ordered with the calls on its graph's other execs and every graph creation and
        // destruction (libcuda crashes otherwise: `GraphFamily`).
        let order = x.family.lifecycle();
        // SAFETY: the exec came out of the exec table, which no longer lists it, and no call is
        // using it (gate held exclusively): destroyed once (on failure it goes back to the
        // table).
        let destroyed = unsafe { self.drv.graph_exec_destroy(x.raw) };
        drop(order);
        destroyed
            .map(|()| x.gate.mark_destroyed())
            .inspect_err(|_| self.execs.restore(exec.0, x.clone()))
    }
}

/// Enters the gates of the events a graph records and waits on, so none is destroyed while the
/// driver instantiates or launches the graph; a destroyed one is refused.
fn enter_events<'a>(
    recorded: &'a [Arc<CudaEvent>],
    waited: &'a [Arc<CudaEvent>],
) -> Result<Vec<parking_lot::RwLockReadGuard<'a, ()>>> {
    recorded
        .iter()
        .chain(waited)
        .map(|e| e.gate.enter(EventId::KIND, e.raw))
        .collect()
}
