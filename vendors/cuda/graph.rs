//! Captured graphs: native `CUgraph` / `CUgraphExec`, with what unirt tracks beside them.

use std::sync::Arc;

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
}
