//! wgpu stream capture: the captured commands, with their pipelines and bind groups already
//! made, replayed as one encoder and one submit.
//!
//! Event records inside a capture complete with the replay's submission (timestamped when the
//! device can); waits are kept for their place but need no device work, as one queue already
//! orders them. A graph holds its buffers — device and pinned host — weakly; a replay pins
//! them again first, so a graph whose buffers were freed fails with `OutOfBounds` instead of
//! touching a dead buffer or writing freed host memory, and the replay's submission holds them
//! until it has completed.

use std::sync::Arc;

use parking_lot::Mutex;

use super::gpu::Ticket;
use super::memory::DevBuf;
use super::stream::Cmd;
use crate::checked::Recorded;
use crate::hal::CaptureMode;

/// The recording in progress on a stream.
pub(crate) struct Capture {
    #[allow(dead_code)]
    pub mode: CaptureMode,
    pub cmds: Vec<Cmd>,
    /// The memory the commands use, re-pinned at instantiate and at each launch.
    pub uses: Recorded<DevBuf>,
}

impl Capture {
    pub fn new(mode: CaptureMode) -> Self {
        Capture {
            mode,
            cmds: Vec::new(),
            uses: Recorded::default(),
        }
    }
}

/// A finished capture.
pub(crate) struct WGraph {
    pub cmds: Arc<[Cmd]>,
    pub uses: Arc<Recorded<DevBuf>>,
}

/// An instantiated graph.
pub(crate) struct WGraphExec {
    pub cmds: Arc<[Cmd]>,
    pub uses: Arc<Recorded<DevBuf>>,
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
            uses: g.uses.clone(),
            reads_back: g.cmds.iter().any(|c| matches!(c, Cmd::Readback { .. })),
            last: Mutex::new(Ticket::default()),
        }
    }
}
