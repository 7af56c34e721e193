//! Captured graphs: native `CUgraph` / `CUgraphExec`, with what unirt tracks beside them.

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use super::event::CudaEvent;
use super::gate::HandleGate;
use super::stream::DeviceUse;
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
