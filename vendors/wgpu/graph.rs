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

use super::gpu::{Gpu, Ticket};
use super::memory::DevBuf;
use super::plan::Plan;
use super::stream::{Cmd, StagingGate};
use crate::checked::{CaptureOwner, OwnedCapture, Pins, Recorded};
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

/// The commands of a replay captured into another capture, with fresh staging buffers (and
/// gates) for its device-to-host copies. One submission cannot map a buffer twice, so a graph
/// that captured the same replay twice — or a replay beside the graph it came from — must not
/// share a read-back staging buffer within itself; the copies into each staging buffer are
/// pointed at its replacement.
pub(crate) fn restage_read_backs(gpu: &Gpu, cmds: &[Cmd]) -> Result<Vec<Cmd>> {
    let mut fresh: Vec<(wgpu::Buffer, wgpu::Buffer, StagingGate)> = Vec::new();
    for c in cmds {
        if let Cmd::Readback {
            staging,
            gate: Some(_),
            ..
        } = c
        {
            if !fresh.iter().any(|(old, _, _)| old == staging) {
                let new = gpu.buffer(
                    staging.size(),
                    wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                )?;
                fresh.push((staging.clone(), new, StagingGate::default()));
            }
        }
    }
    let replacement = |b: &wgpu::Buffer| fresh.iter().find(|(old, _, _)| old == b);
    Ok(cmds
        .iter()
        .map(|c| match c {
            Cmd::Copy(copy) => match replacement(&copy.dst) {
                Some((_, new, _)) => {
                    let mut copy = copy.clone();
                    copy.dst = new.clone();
                    Cmd::Copy(copy)
                }
                None => c.clone(),
            },
            Cmd::Readback {
                staging,
                skip,
                host,
                len,
                gate: Some(_),
            } => match replacement(staging) {
                Some((_, new, gate)) => Cmd::Readback {
                    staging: new.clone(),
                    skip: *skip,
                    host: *host,
                    len: *len,
                    gate: Some(gate.clone()),
                },
                None => c.clone(),
            },
            _ => c.clone(),
        })
        .collect())
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
    /// The gates of the captured read-back staging buffers the plan maps, distinct and in
    /// address order (the order [`WGraphExec::launch`] locks them in). Other execs may share
    /// them: execs of the same graph, and graphs that captured a replay of this one.
    pub staging_gates: Vec<StagingGate>,
    /// The fault words the graph's kernels may claim: noted on the stream of each replay.
    pub checks: Vec<Arc<super::fault::FaultWord>>,
}

impl WGraphExec {
    /// Prepares and validates the graph's plan.
    pub fn new(gpu: &Gpu, g: &WGraph) -> Result<Self> {
        let plan = Plan::new(g.cmds.iter().cloned());
        gpu.validate(&plan)?;
        let mut staging_gates: Vec<StagingGate> = g
            .cmds
            .iter()
            .filter_map(|c| match c {
                Cmd::Readback { gate, .. } => gate.clone(),
                _ => None,
            })
            .collect();
        staging_gates.sort_by_key(|g| Arc::as_ptr(g) as usize);
        staging_gates.dedup_by(|a, b| Arc::ptr_eq(a, b));
        Ok(WGraphExec {
            cmds: g.cmds.clone(),
            plan: Arc::new(plan),
            uses: g.uses.clone(),
            staging_gates,
            checks: super::fault::checked_by(&g.cmds),
        })
    }

    /// Submits one replay. A replay that maps captured staging buffers first waits until the
    /// last submission mapping each of them — this exec's or another's — has finished and
    /// unmapped it (wgpu refuses to submit work on a buffer still mapped, dropping the whole
    /// submission), and holds their gates until its own submission is queued, so replays on
    /// several threads take their turns.
    pub fn launch(&self, gpu: &Gpu, keep: Pins<DevBuf>) -> Result<Ticket> {
        let mut held: Vec<_> = self.staging_gates.iter().map(|g| g.lock()).collect();
        for last in &held {
            gpu.wait(last)?;
        }
        let t = gpu.submit_prepared(&self.plan, keep)?;
        for last in &mut held {
            **last = t.clone();
        }
        Ok(t)
    }
}
