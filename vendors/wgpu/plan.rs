//! Prepared submissions: recorded commands turned, once, into the exact sequence of encoder
//! calls and the host-side work around the submit.
//!
//! A [`Plan`] is what [`super::gpu::Gpu::submit`] encodes. Every decision is taken when the
//! plan is made: where compute passes begin and end, which pipeline, bind group and immediates
//! changes are needed (redundant ones are dropped), and which uploads, read-backs and pooled
//! buffers go with the submit. A stream makes a plan from its batch at each flush; a graph
//! makes one at instantiate and every replay encodes that same plan (wgpu command buffers
//! cannot be resubmitted, so a replay re-encodes, but it looks nothing up, decides nothing
//! and allocates nothing of its own beyond wgpu's encoder).

use std::sync::Arc;

use super::contents::{TexContents, Writes};
use super::event::WEvent;
use super::stream::{BufClear, BufCopy, Cmd, Imm, TexCopy};

/// One encoder call.
pub(crate) enum Step {
    BeginPass,
    EndPass,
    Pipeline(wgpu::ComputePipeline),
    Group(wgpu::BindGroup),
    Immediates(Imm),
    Dispatch([u32; 3]),
    Copy(BufCopy),
    Clear(BufClear),
    ToTexture(TexCopy),
    /// No encoder call: what the steps before it wrote, for the texture contents
    /// ([`Plan::decide`]).
    Wrote(Writes),
    /// An event record (a timestamp where the event has a query set).
    Record(Arc<WEvent>),
}

/// A host-to-device copy done just before the submit: `len` bytes from `host` into `staging`
/// at byte `off`.
pub(crate) struct Upload {
    pub host: u64,
    pub staging: wgpu::Buffer,
    pub off: u64,
    pub len: usize,
}

/// A device-to-host copy finished after the submit: bytes `[skip, skip + len)` of `staging`
/// go to `host`; `pooled` staging buffers go back to the pool afterwards.
pub(crate) struct Readback {
    pub staging: wgpu::Buffer,
    pub skip: u64,
    pub host: u64,
    pub len: usize,
    pub pooled: bool,
}

/// The host-side work around one submit (shared by every replay of a graph).
#[derive(Default)]
pub(crate) struct Io {
    pub uploads: Vec<Upload>,
    pub readbacks: Vec<Readback>,
    /// Pooled upload buffers the submission reads: mapped again for reuse after it.
    pub recycle: Vec<wgpu::Buffer>,
}

impl Io {
    fn is_empty(&self) -> bool {
        self.uploads.is_empty() && self.readbacks.is_empty() && self.recycle.is_empty()
    }
}

/// A prepared submission.
pub(crate) struct Plan {
    pub steps: Vec<Step>,
    /// The events the steps record, in order.
    pub records: Vec<Arc<WEvent>>,
    /// None when there is nothing to do around the submit (the usual kernel batch).
    pub io: Option<Arc<Io>>,
    /// Whether a step copies into a texture: then its encoding depends on [`Plan::decide`].
    pub copies_to_textures: bool,
}

impl Plan {
    /// Prepares `cmds`, in order.
    pub fn new(cmds: impl IntoIterator<Item = Cmd>) -> Self {
        let mut steps = Vec::new();
        let mut records = Vec::new();
        let mut io = Io::default();
        let mut in_pass = false;
        let mut pipe: Option<wgpu::ComputePipeline> = None;
        let mut group: Option<wgpu::BindGroup> = None;
        let mut imm: Option<Imm> = None;
        for c in cmds {
            if let Cmd::Dispatch {
                pipeline,
                group: g,
                imm: i,
                groups,
            } = c
            {
                if !in_pass {
                    steps.push(Step::BeginPass);
                    in_pass = true;
                }
                if pipe.as_ref() != Some(&pipeline) {
                    pipe = Some(pipeline.clone());
                    steps.push(Step::Pipeline(pipeline));
                    // wgpu's GL backend emulates immediates with per-program uniforms: a new
                    // pipeline needs them set again.
                    imm = None;
                }
                if group.as_ref() != Some(&g) {
                    group = Some(g.clone());
                    steps.push(Step::Group(g));
                }
                // A kernel without immediates (`Imm::NONE`) has nothing to set.
                if i.len > 0 && imm != Some(i) {
                    imm = Some(i);
                    steps.push(Step::Immediates(i));
                }
                steps.push(Step::Dispatch(groups));
                continue;
            }
            // Bookkeeping only: it neither ends a compute pass nor needs one.
            if let Cmd::Wrote(w) = c {
                steps.push(Step::Wrote(w));
                continue;
            }
            // Everything else is host work or encoder work outside a compute pass.
            let step = match c {
                Cmd::Copy(c) => Some(Step::Copy(c)),
                Cmd::Clear(c) => Some(Step::Clear(c)),
                Cmd::ToTexture(c) => Some(Step::ToTexture(c)),
                Cmd::Record(e) => {
                    records.push(e.clone());
                    Some(Step::Record(e))
                }
                Cmd::Upload {
                    host,
                    staging,
                    off,
                    len,
                } => {
                    io.uploads.push(Upload {
                        host,
                        staging,
                        off,
                        len,
                    });
                    None
                }
                Cmd::Readback {
                    staging,
                    skip,
                    host,
                    len,
                    gate,
                } => {
                    io.readbacks.push(Readback {
                        staging,
                        skip,
                        host,
                        len,
                        pooled: gate.is_none(),
                    });
                    None
                }
                Cmd::Recycle(b) => {
                    io.recycle.push(b);
                    None
                }
                Cmd::Wait | Cmd::Check(_) | Cmd::Dispatch { .. } | Cmd::Wrote(_) => None,
            };
            if let Some(step) = step {
                if in_pass {
                    steps.push(Step::EndPass);
                    in_pass = false;
                    (pipe, group, imm) = (None, None, None);
                }
                steps.push(step);
            }
        }
        if in_pass {
            steps.push(Step::EndPass);
        }
        Plan {
            copies_to_textures: steps.iter().any(|s| matches!(s, Step::ToTexture(_))),
            steps,
            records,
            io: (!io.is_empty()).then(|| Arc::new(io)),
        }
    }

    /// Takes this submission's texture decisions, in submission order (the caller holds the
    /// lock that orders submissions): which copies into textures are skipped because the
    /// texture already holds their unchanged source, and which textures the writes make
    /// strangers. One flag per `ToTexture` step, in order; empty when the plan has none.
    pub fn decide(&self, contents: &TexContents) -> Vec<bool> {
        let mut skips = Vec::new();
        for s in &self.steps {
            match s {
                Step::ToTexture(c) => skips.push(c.held.fill(c.source(), c.reusable)),
                Step::Wrote(w) => contents.wrote(w),
                _ => {}
            }
        }
        skips
    }

    /// Whether submitting this plan does nothing.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.io.is_none()
    }

    /// Records the steps into `enc`; `timestamp` gives, for each event record with a query
    /// set in turn, the buffer its timestamp is copied into (None: that record has host
    /// timing); `skips` are [`Plan::decide`]'s flags (copies past their end are encoded).
    /// Returns the event records with their timestamp buffers, to be tied to the submission.
    pub fn encode(
        &self,
        enc: &mut wgpu::CommandEncoder,
        mut timestamp: impl FnMut() -> Option<wgpu::Buffer>,
        skips: &[bool],
    ) -> Vec<(Arc<WEvent>, Option<wgpu::Buffer>)> {
        let mut records = Vec::new();
        let mut skips = skips.iter();
        let mut pass: Option<wgpu::ComputePass<'static>> = None;
        for s in &self.steps {
            match s {
                Step::BeginPass => {
                    pass = Some(
                        enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default())
                            .forget_lifetime(),
                    )
                }
                Step::EndPass => pass = None,
                Step::Pipeline(p) => {
                    if let Some(pass) = pass.as_mut() {
                        pass.set_pipeline(p)
                    }
                }
                Step::Group(g) => {
                    if let Some(pass) = pass.as_mut() {
                        pass.set_bind_group(0, g, &[])
                    }
                }
                Step::Immediates(i) => {
                    if let Some(pass) = pass.as_mut() {
                        pass.set_immediates(0, bytemuck::cast_slice(i.as_slice()))
                    }
                }
                Step::Dispatch([x, y, z]) => {
                    if let Some(pass) = pass.as_mut() {
                        pass.dispatch_workgroups(*x, *y, *z)
                    }
                }
                Step::Copy(c) => c.encode(enc),
                Step::Clear(c) => c.encode(enc),
                Step::ToTexture(c) => {
                    if skips.next() != Some(&true) {
                        c.encode(enc)
                    }
                }
                Step::Wrote(_) => {}
                Step::Record(e) => {
                    let read = match &e.query {
                        Some((qs, resolve)) => timestamp().inspect(|read| {
                            enc.write_timestamp(qs, 0);
                            enc.resolve_query_set(qs, 0..1, resolve, 0);
                            enc.copy_buffer_to_buffer(resolve, 0, read, 0, 8);
                        }),
                        None => None,
                    };
                    records.push((e.clone(), read));
                }
            }
        }
        drop(pass);
        records
    }
}
