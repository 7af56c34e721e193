//! Stream capture's RAII handles: [`CapturedGraph`] (what a recording captured) and [`CapturedExec`] (the
//! instantiated, replayable form). Both keep the recording's graph-private pool reserved, so a
//! replay never touches memory the allocator has handed to someone else.

use std::sync::Arc;

use crate::alloc::PrivatePool;
use crate::error::Result;
use crate::hal::{Backend, GraphExecId, GraphId, StreamId};
use crate::stream::Stream;
use crate::vendors::AnyBackend;

/// A recorded graph. It holds its graph-private pool, so memory allocated while recording
/// stays reserved as long as the graph or an executable made from it lives.
pub struct CapturedGraph {
    backend: Arc<AnyBackend>,
    id: GraphId,
    pool: Option<Arc<PrivatePool>>,
}

impl CapturedGraph {
    /// Wraps a graph the backend returned from `end_capture`; `pool` is the private pool the
    /// recording allocated from (`None` when the capture allocated nothing: an operator
    /// graph's segment, whose memory its [`GraphExec`](super::GraphExec) holds).
    pub(crate) fn from_capture(
        backend: Arc<AnyBackend>,
        id: GraphId,
        pool: Option<Arc<PrivatePool>>,
    ) -> Self {
        CapturedGraph { backend, id, pool }
    }

    /// The backend's handle.
    pub fn id(&self) -> GraphId {
        self.id
    }

    /// The private pool the recording allocated from.
    pub fn pool(&self) -> Option<&Arc<PrivatePool>> {
        self.pool.as_ref()
    }

    /// Prepares the graph for replay.
    pub fn instantiate(&self) -> Result<CapturedExec> {
        Ok(CapturedExec {
            id: self.backend.graph_instantiate(self.id)?,
            backend: self.backend.clone(),
            pool: self.pool.clone(),
        })
    }
}

impl std::fmt::Debug for CapturedGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CapturedGraph({:?}, {:?})", self.id, self.pool)
    }
}

impl std::fmt::Debug for CapturedExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CapturedExec({:?}, {:?})", self.id, self.pool)
    }
}

impl Drop for CapturedGraph {
    fn drop(&mut self) {
        let _ = self.backend.graph_destroy(self.id);
    }
}

/// A launchable graph; it too keeps the private pool reserved.
pub struct CapturedExec {
    backend: Arc<AnyBackend>,
    id: GraphExecId,
    pool: Option<Arc<PrivatePool>>,
}

impl CapturedExec {
    /// The backend's handle.
    pub fn id(&self) -> GraphExecId {
        self.id
    }

    /// The private pool the recording allocated from (kept reserved while this lives).
    pub fn pool(&self) -> Option<&Arc<PrivatePool>> {
        self.pool.as_ref()
    }

    /// Enqueues one replay on the stream with id `stream`.
    pub fn launch(&self, stream: StreamId) -> Result<()> {
        self.backend.graph_launch(self.id, stream)
    }

    /// Enqueues one replay on `stream` (which must belong to the same device).
    pub fn launch_on(&self, stream: &Stream) -> Result<()> {
        self.backend.graph_launch(self.id, stream.id())
    }
}

impl Drop for CapturedExec {
    fn drop(&mut self) {
        let _ = self.backend.graph_exec_destroy(self.id);
    }
}
