//! wgpu stream capture: the captured commands, with their pipelines and bind groups already
//! made, replayed as one encoder and one submit.
//!
//! Event records inside a capture complete with the replay's submission (timestamped when the
//! device can); waits are kept for their place but need no device work, as one queue already
//! orders them. A replay re-checks every device range of the graph, so a graph whose buffers
//! were freed fails with `OutOfBounds` instead of touching a dead buffer.

use std::sync::Arc;

use parking_lot::Mutex;

use super::gpu::Ticket;
use super::stream::Cmd;
use crate::hal::CaptureMode;

/// The recording in progress on a stream.
pub(crate) struct Capture {
    #[allow(dead_code)]
    pub mode: CaptureMode,
    pub cmds: Vec<Cmd>,
    /// Device ranges the commands touch, for validation at instantiate and launch.
    pub ranges: Vec<(u64, u64)>,
}

impl Capture {
    pub fn new(mode: CaptureMode) -> Self {
        Capture {
            mode,
            cmds: Vec::new(),
            ranges: Vec::new(),
        }
    }
}

/// A finished capture.
pub(crate) struct WGraph {
    pub cmds: Arc<[Cmd]>,
    pub ranges: Arc<[(u64, u64)]>,
}

/// An instantiated graph.
pub(crate) struct WGraphExec {
    pub cmds: Arc<[Cmd]>,
    pub ranges: Arc<[(u64, u64)]>,
    /// The graph reads back to the host through its own staging buffers, which must not be
    /// mapped by one replay while the next one is submitted.
    pub reads_back: bool,
    /// The last replay's submission.
    pub last: Mutex<Ticket>,
}

impl WGraphExec {
    pub fn new(g: &WGraph) -> Self {
        WGraphExec {
            cmds: g.cmds.clone(),
            ranges: g.ranges.clone(),
            reads_back: g.cmds.iter().any(|c| matches!(c, Cmd::Readback { .. })),
            last: Mutex::new(Ticket::default()),
        }
    }
}
