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
use crate::error::Result;
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

    /// Queues one replay through `enqueue`, with event nodes turned into fresh records and
    /// waits. The events the replay records are recorded together ([`CpuEvent::record_all`]):
    /// their new generations become visible to other threads' waits only once the batch that
    /// stamps them is queued. A wait after a record of the same event in this replay waits for
    /// that record, as on CUDA.
    pub fn launch(&self, enqueue: impl FnOnce(Arc<[Op]>) -> Result<()>) -> Result<()> {
        if let Some(b) = &self.batch {
            return enqueue(b.clone());
        }
        /// A node with its event resolved to an index into `recorded`.
        enum Step<'a> {
            Op(&'a Op),
            Record(usize),
            Wait(&'a Arc<CpuEvent>),
        }
        let mut recorded: Vec<&Arc<CpuEvent>> = Vec::new();
        let steps: Vec<Step> = self
            .nodes
            .iter()
            .map(|n| match n {
                Node::Op(op) => Step::Op(op),
                Node::Wait(e) => Step::Wait(e),
                Node::Record(e) => {
                    Step::Record(match recorded.iter().position(|r| Arc::ptr_eq(r, e)) {
                        Some(i) => i,
                        None => {
                            recorded.push(e);
                            recorded.len() - 1
                        }
                    })
                }
            })
            .collect();
        let events: Vec<&CpuEvent> = recorded.iter().map(|e| &***e).collect();
        CpuEvent::record_all(&events, |generations| {
            let mut stamped = vec![false; generations.len()];
            let ops: Vec<Op> = steps
                .iter()
                .map(|step| match step {
                    Step::Op(op) => (*op).clone(),
                    Step::Record(i) => {
                        generations[*i] += 1;
                        stamped[*i] = true;
                        Op::Stamp {
                            event: recorded[*i].clone(),
                            generation: generations[*i],
                        }
                    }
                    Step::Wait(e) => {
                        let mine = recorded.iter().position(|r| Arc::ptr_eq(r, e));
                        Op::Wait {
                            event: (*e).clone(),
                            generation: match mine {
                                Some(i) if stamped[i] => generations[i],
                                _ => e.current(),
                            },
                        }
                    }
                })
                .collect();
            enqueue(ops.into())
        })
    }
}
