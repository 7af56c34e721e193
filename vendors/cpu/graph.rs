//! CPU stream capture: a recorded command list, validated at instantiate, replayed as one
//! batch.
//!
//! Event records and waits inside a capture are templates: each replay records the event anew
//! (and waits for whatever the event last recorded at replay time), as CUDA's event nodes do.
//! A graph holds its buffers — device and pinned host — weakly ([`Recorded`]); a replay pins
//! every one again first, so a graph whose buffers were freed fails with `OutOfBounds` instead
//! of writing freed memory, and memory freed while a replay runs stays alive until it ends.

use std::sync::Arc;

use super::event::CpuEvent;
use super::stream::Op;
use crate::checked::{CaptureOwner, OwnedCapture, Recorded};
use crate::hal::CaptureMode;
use crate::hostmem::HostBlock;

/// One recorded command.
#[derive(Clone)]
pub(crate) enum Node {
    /// A copy, set or kernel, run as is on each replay.
    Op(Op),
    Record(Arc<CpuEvent>),
    Wait(Arc<CpuEvent>),
}

/// The recording in progress on a stream. Every capture mode records only the capturing
/// stream's own commands; the modes differ only in which other threads' calls CUDA refuses,
/// and nothing on the CPU backend is unsafe to call during a capture.
#[derive(Default)]
pub(crate) struct Capture {
    pub nodes: Vec<Node>,
    /// The memory the nodes touch, re-pinned at instantiate and at each launch.
    pub uses: Recorded<HostBlock>,
    pub owner: CaptureOwner,
}

impl Capture {
    pub fn new(mode: CaptureMode) -> Self {
        Capture {
            owner: CaptureOwner::new(mode),
            ..Default::default()
        }
    }
}

impl OwnedCapture for Capture {
    fn owner(&self) -> &CaptureOwner {
        &self.owner
    }
}

/// A finished capture.
pub(crate) struct CpuGraph {
    pub nodes: Arc<[Node]>,
    pub uses: Arc<Recorded<HostBlock>>,
}

/// An instantiated graph: the batch is prebuilt when the graph has no event nodes, so a replay
/// is one channel send.
pub(crate) struct CpuGraphExec {
    pub nodes: Arc<[Node]>,
    pub uses: Arc<Recorded<HostBlock>>,
    pub batch: Option<Arc<[Op]>>,
}

impl CpuGraphExec {
    pub fn new(graph: &CpuGraph) -> Self {
        let batch = graph
            .nodes
            .iter()
            .map(|n| match n {
                Node::Op(op) => Some(op.clone()),
                _ => None,
            })
            .collect::<Option<Vec<Op>>>()
            .map(Arc::from);
        CpuGraphExec {
            nodes: graph.nodes.clone(),
            uses: graph.uses.clone(),
            batch,
        }
    }

    /// The commands of one replay, with event nodes turned into fresh records and waits.
    pub fn materialize(&self) -> Arc<[Op]> {
        if let Some(b) = &self.batch {
            return b.clone();
        }
        self.nodes
            .iter()
            .map(|n| match n {
                Node::Op(op) => op.clone(),
                Node::Record(e) => Op::Stamp {
                    event: e.clone(),
                    generation: e.begin_record(),
                },
                Node::Wait(e) => Op::Wait {
                    event: e.clone(),
                    generation: e.current(),
                },
            })
            .collect::<Vec<_>>()
            .into()
    }
}
