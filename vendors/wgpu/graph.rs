//! wgpu stream capture: the captured commands, with their pipelines and bind groups already
//! made, prepared at instantiate into a [`Plan`]; each replay hands that plan to the submitter
//! thread, which encodes it into one encoder and submits it once (wgpu command buffers cannot
//! be resubmitted).
//!
//! Event records inside a capture complete with the replay's submission (timestamped when the
//! device can); waits are kept for their place but need no device work, as one queue already
//! orders them. A graph holds its buffers — device and pinned host — weakly; a replay pins
//! them again first, so a graph whose buffers were freed fails with `OutOfBounds` instead of
//! touching a dead buffer or writing freed host memory, and the replay's submission holds them
//! until it has completed.

use std::sync::Arc;

use parking_lot::Mutex;

use super::gpu::{Gpu, Ticket};
use super::memory::DevBuf;
use super::plan::Plan;
use super::stream::Cmd;
use crate::checked::{CaptureOwner, OwnedCapture, Recorded};
use crate::error::Result;
use crate::hal::CaptureMode;

/// The recording in progress on a stream.
pub(crate) struct Capture {
    pub owner: CaptureOwner,
    pub cmds: Vec<Cmd>,
    /// The memory the commands use, re-pinned at instantiate and at each launch.
    pub uses: Recorded<DevBuf>,
}

impl Capture {
    pub fn new(mode: CaptureMode) -> Self {
        Capture {
            owner: CaptureOwner::new(mode),
            cmds: Vec::new(),
            uses: Recorded::default(),
        }
    }
}

impl OwnedCapture for Capture {
    fn owner(&self) -> &CaptureOwner {
        &self.owner
    }
}

/// A finished capture.
pub(crate) struct WGraph {
    pub cmds: Arc<[Cmd]>,
    /// One entry per allocation ([`Recorded::coalesce`]).
    pub uses: Arc<Recorded<DevBuf>>,
}

/// An instantiated graph: its commands prepared once into the plan every replay encodes.
pub(crate) struct WGraphExec {
    /// The commands, for a replay launched inside another capture.
    pub cmds: Arc<[Cmd]>,
    /// What each replay encodes and does around its submit, validated at instantiate.
    pub plan: Arc<Plan>,
    /// The memory the graph uses, one entry per allocation: re-checked at each replay.
    pub uses: Arc<Recorded<DevBuf>>,
    /// The graph reads back to the host through its own staging buffers, which must not be
    /// mapped by one replay while the next one is submitted.
    pub reads_back: bool,
    /// The last replay's submission.
    pub last: Mutex<Ticket>,
}

impl WGraphExec {
    /// Prepares and validates the graph's plan.
    pub fn new(gpu: &Gpu, g: &WGraph) -> Result<Self> {
        let plan = Plan::new(g.cmds.iter().cloned());
        gpu.validate(&plan)?;
        Ok(WGraphExec {
            cmds: g.cmds.clone(),
            reads_back: plan.reads_back(),
            plan: Arc::new(plan),
            uses: g.uses.clone(),
            last: Mutex::new(Ticket::default()),
        })
    }
}
