//! wgpu streams: each stream gathers its commands and submits them as one encoder on flush.
//!
//! A flush happens on synchronize, event record, device-to-host copies, graph launches, and
//! when a stream has gathered [`FLUSH_COMMANDS`] commands or [`FLUSH_BYTES`] of staged data.
//! All streams share the device's one queue; submission order is execution order. A device
//! with many submissions in flight makes the next submitter wait for room (`gpu/in_flight.rs`).

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use super::contents::{TexHeld, TexSource, Writes};
use super::event::WEvent;
use super::fault::FaultWord;
use super::gpu::{Gpu, Ticket};
use super::graph::Capture;
use super::memory::DevBuf;
use super::plan::Plan;
use crate::checked::Pins;
use crate::error::Result;

/// Commands a stream gathers before it submits them.
pub(crate) const FLUSH_COMMANDS: usize = 1024;
/// Bytes of work (copied, set, staged or touched by kernels) a stream gathers before it
/// submits them: bounds how long one submission runs (GL holds its context lock meanwhile).
pub(crate) const FLUSH_BYTES: u64 = 1 << 30;

/// A 4-byte-aligned buffer-to-buffer copy: a recorded command and, unchanged, a plan step.
#[derive(Clone)]
pub(crate) struct BufCopy {
    pub src: wgpu::Buffer,
    pub src_off: u64,
    pub dst: wgpu::Buffer,
    pub dst_off: u64,
    pub size: u64,
}

impl BufCopy {
    pub fn encode(&self, enc: &mut wgpu::CommandEncoder) {
        enc.copy_buffer_to_buffer(&self.src, self.src_off, &self.dst, self.dst_off, self.size);
    }
}

/// A 4-byte-aligned clear to zero: a recorded command and, unchanged, a plan step.
#[derive(Clone)]
pub(crate) struct BufClear {
    pub buf: wgpu::Buffer,
    pub off: u64,
    pub size: u64,
}

impl BufClear {
    pub fn encode(&self, enc: &mut wgpu::CommandEncoder) {
        enc.clear_buffer(&self.buf, self.off, Some(self.size));
    }
}

/// A copy of a matrix's rows from a buffer into a texture (one texel per four values), before
/// a kernel that reads the matrix through the texture: a recorded command and, unchanged, a
/// plan step. The buffer offset is a multiple of the texel's size and `bytes_per_row` of 256,
/// as wgpu requires (the launch checks both). A `reusable` copy is skipped while the texture
/// still holds this source unchanged (see `contents.rs`).
#[derive(Clone)]
pub(crate) struct TexCopy {
    pub src: wgpu::Buffer,
    /// The source buffer's id (`DevBuf::id`).
    pub src_id: u64,
    pub src_off: u64,
    pub bytes_per_row: u32,
    pub texture: wgpu::Texture,
    /// What the texture holds.
    pub held: Arc<TexHeld>,
    pub reusable: bool,
    /// Texels per row and rows.
    pub width: u32,
    pub height: u32,
    /// Texels in the last row (`width` unless a run of quads ends inside it).
    pub last_width: u32,
    pub texel_bytes: u64,
}

impl TexCopy {
    /// The source range this copy reads, as `contents.rs` names it.
    pub fn source(&self) -> TexSource {
        let full_rows = u64::from(self.height - 1) * u64::from(self.bytes_per_row);
        let end = self.src_off + full_rows + u64::from(self.last_width) * self.texel_bytes;
        (self.src_id, self.src_off, end, self.bytes_per_row)
    }

    /// The copy: whole rows, then a last row that may be partly filled (a second copy of
    /// its texels alone, which reads nothing past the source's end).
    pub fn encode(&self, enc: &mut wgpu::CommandEncoder) {
        let whole = if self.last_width == self.width {
            self.height
        } else {
            self.height - 1
        };
        let copy = |enc: &mut wgpu::CommandEncoder, offset: u64, y: u32, width: u32, height| {
            enc.copy_buffer_to_texture(
                wgpu::TexelCopyBufferInfo {
                    buffer: &self.src,
                    layout: wgpu::TexelCopyBufferLayout {
                        offset,
                        bytes_per_row: Some(self.bytes_per_row),
                        rows_per_image: None,
                    },
                },
                wgpu::TexelCopyTextureInfo {
                    texture: &self.texture,
                    mip_level: 0,
                    origin: wgpu::Origin3d { x: 0, y, z: 0 },
                    aspect: wgpu::TextureAspect::All,
                },
                wgpu::Extent3d {
                    width,
                    height,
                    depth_or_array_layers: 1,
                },
            );
        };
        if whole > 0 {
            copy(enc, self.src_off, 0, self.width, whole);
        }
        if whole < self.height {
            let offset = self.src_off + u64::from(whole) * u64::from(self.bytes_per_row);
            copy(enc, offset, whole, self.last_width, 1);
        }
    }
}

/// The immediates of one dispatch: the first `len` words of `words` (the HAL's fixed kernels
/// take 4 words, the operator kernels 8, the `*Sized` fixed kernels none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Imm {
    pub words: [u32; 8],
    pub len: u8,
}

impl Imm {
    /// None: a kernel without immediates (nothing is set for its dispatch).
    pub const NONE: Imm = Imm {
        words: [0; 8],
        len: 0,
    };

    /// Four words (the fixed kernels' immediates).
    pub fn four(w: [u32; 4]) -> Self {
        Imm {
            words: [w[0], w[1], w[2], w[3], 0, 0, 0, 0],
            len: 4,
        }
    }

    /// The words that are set.
    pub fn as_slice(&self) -> &[u32] {
        &self.words[..usize::from(self.len).min(8)]
    }
}

/// One recorded command.
#[derive(Clone)]
pub(crate) enum Cmd {
    /// A 4-byte-aligned buffer copy.
    Copy(BufCopy),
    /// A 4-byte-aligned clear to zero.
    Clear(BufClear),
    /// A matrix copied into a texture for the kernel after it.
    ToTexture(TexCopy),
    /// No device work: the device memory the commands before it wrote (see `contents.rs`).
    Wrote(Writes),
    Dispatch {
        pipeline: wgpu::ComputePipeline,
        group: wgpu::BindGroup,
        imm: Imm,
        groups: [u32; 3],
    },
    /// An event record: completes with the submission, timestamped when the device can.
    Record(Arc<WEvent>),
    /// A cross-stream wait (kept in captures; with one queue the order already holds).
    Wait,
    /// Captured host-to-device copy: `len` bytes read from `host` into `staging` at `off`
    /// just before each replay is submitted.
    Upload {
        host: u64,
        staging: wgpu::Buffer,
        off: u64,
        len: usize,
    },
    /// A pooled upload buffer this batch reads: mapped again for reuse after it has run.
    Recycle(wgpu::Buffer),
    /// Device-to-host: after the submission, bytes `[skip, skip + len)` of `staging` go to
    /// `host`.
    Readback {
        staging: wgpu::Buffer,
        skip: u64,
        host: u64,
        len: usize,
        /// `None`: the staging buffer came from the pool and goes back after the read.
        /// `Some`: a captured copy's own staging buffer, reused by every replay of every exec
        /// whose commands hold this one (execs of one graph, graphs that captured a replay);
        /// the gate holds the last submission that maps it, which must have finished (and
        /// unmapped it) before the next one is submitted.
        gate: Option<StagingGate>,
    },
    /// No device work: the stream's next synchronisation checks this fault word (see
    /// `fault.rs`). Kept in captures, so each replay notes it on its stream.
    Check(Arc<FaultWord>),
}

/// The last submission that maps a captured read-back staging buffer (see `Cmd::Readback`).
pub(crate) type StagingGate = Arc<Mutex<Ticket>>;

/// What a stream holds between flushes.
pub(crate) struct StreamState {
    pub pending: Vec<Cmd>,
    /// The memory the pending commands use, handed to their submission (which holds it until
    /// it has completed: read-backs write pinned host memory then).
    pub keep: Pins<DevBuf>,
    /// Bytes of work gathered (see [`FLUSH_BYTES`]).
    pub pending_bytes: u64,
    /// This stream's last submission.
    pub last: Ticket,
    pub capture: Option<Capture>,
    /// The fault words its work since the last synchronisation may have claimed.
    pub checks: Vec<Arc<FaultWord>>,
}

pub(crate) struct WStream {
    state: Mutex<StreamState>,
}

impl WStream {
    pub fn new() -> Self {
        WStream {
            state: Mutex::new(StreamState {
                pending: Vec::new(),
                keep: Pins::new(),
                pending_bytes: 0,
                last: Ticket::default(),
                capture: None,
                checks: Vec::new(),
            }),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock()
    }

    pub fn is_capturing(&self) -> bool {
        self.state.lock().capture.is_some()
    }

    /// Submits what the stream has gathered; returns the stream's last submission.
    pub fn flush(&self, gpu: &Gpu) -> Result<Ticket> {
        let mut st = self.state.lock();
        flush_locked(gpu, &mut st)
    }

    /// Submits and waits for everything enqueued so far; a fault its kernels claimed
    /// meanwhile is the error (see `fault.rs`).
    pub fn synchronize(&self, gpu: &Gpu) -> Result<()> {
        self.wait_for_work(gpu)?;
        self.check_faults(gpu)
    }

    /// Submits and waits for everything enqueued so far, leaving its kernels' faults for the
    /// stream's next synchronisation (an ordering wait inside an asynchronous call).
    pub fn wait_for_work(&self, gpu: &Gpu) -> Result<()> {
        let t = self.flush(gpu)?;
        gpu.wait(&t)
    }

    /// Reads back (and clears) the fault words of the work waited for.
    pub fn check_faults(&self, gpu: &Gpu) -> Result<()> {
        let checks = std::mem::take(&mut self.state.lock().checks);
        super::fault::check(gpu, &checks, true)
    }

    /// Reads back the fault words of the work waited for, leaving them (claimed or not) for
    /// the stream's own synchronisation: what a device-wide synchronisation does.
    pub fn peek_faults(&self, gpu: &Gpu) -> Result<()> {
        let checks = self.state.lock().checks.clone();
        super::fault::check(gpu, &checks, false)
    }
}

/// Submits the gathered commands of a locked stream.
pub(crate) fn flush_locked(gpu: &Gpu, st: &mut StreamState) -> Result<Ticket> {
    if st.pending.is_empty() {
        return Ok(st.last.clone());
    }
    let cmds = std::mem::take(&mut st.pending);
    let keep = std::mem::take(&mut st.keep);
    st.pending_bytes = 0;
    let t = gpu.submit(&Plan::new(cmds), keep)?;
    st.last = t.clone();
    Ok(t)
}

/// Adds commands, and the memory they use, to a stream (or its capture); flushes at the
/// thresholds or when `flush`. `writes` are the device byte ranges the commands write
/// (`(buffer id, start, end)`; see `contents.rs`): every caller states them.
pub(crate) fn enqueue(
    gpu: &Gpu,
    stream: &WStream,
    cmds: impl IntoIterator<Item = Cmd>,
    writes: &[(u64, u64, u64)],
    pins: Pins<DevBuf>,
    work: u64,
    flush: bool,
) -> Result<()> {
    let mut st = stream.lock();
    push_locked(gpu, &mut st, with_writes(cmds, writes), pins, work, flush)
}

/// The commands followed by the record of what they write (when they write anything).
fn with_writes(
    cmds: impl IntoIterator<Item = Cmd>,
    writes: &[(u64, u64, u64)],
) -> impl Iterator<Item = Cmd> {
    let wrote = (!writes.is_empty()).then(|| Cmd::Wrote(writes.into()));
    cmds.into_iter().chain(wrote)
}

/// As [`enqueue`], for commands whose form depends on whether the stream is capturing (the
/// staging of host copies: pooled and recycled eagerly, the graph's own when captured).
/// `build` gets that answer under the stream's lock, so a capture begun or ended by another
/// thread cannot fall between the choice and the enqueue (pooled staging captured into a graph
/// would be recycled by every replay while other work reuses it); it returns the work and
/// whether to flush.
pub(crate) fn enqueue_built(
    gpu: &Gpu,
    stream: &WStream,
    writes: &[(u64, u64, u64)],
    pins: Pins<DevBuf>,
    build: impl FnOnce(bool, &mut Vec<Cmd>) -> Result<(u64, bool)>,
) -> Result<()> {
    let mut st = stream.lock();
    let mut cmds = Vec::new();
    let (work, flush) = build(st.capture.is_some(), &mut cmds)?;
    push_locked(gpu, &mut st, with_writes(cmds, writes), pins, work, flush)
}

fn push_locked(
    gpu: &Gpu,
    st: &mut StreamState,
    cmds: impl IntoIterator<Item = Cmd>,
    pins: Pins<DevBuf>,
    work: u64,
    flush: bool,
) -> Result<()> {
    if let Some(c) = st.capture.as_mut() {
        let from = c.cmds.len();
        c.cmds.extend(cmds);
        note_captured_records(&c.cmds[from..]);
        c.uses.record(&pins);
        return Ok(());
    }
    for c in cmds {
        match c {
            Cmd::Check(w) => super::fault::note(&mut st.checks, [w]),
            c => st.pending.push(c),
        }
    }
    st.keep.append(pins);
    st.pending_bytes += work;
    if flush || st.pending.len() >= FLUSH_COMMANDS || st.pending_bytes >= FLUSH_BYTES {
        flush_locked(gpu, st)?;
    }
    Ok(())
}

/// Marks the events these commands record as recorded inside a capture in progress (see
/// [`crate::checked::InCapture`]).
pub(crate) fn note_captured_records(cmds: &[Cmd]) {
    for c in cmds {
        if let Cmd::Record(e) = c {
            e.captured.enter();
        }
    }
}

/// Ends what [`note_captured_records`] marked: the capture holding these commands ended.
pub(crate) fn release_captured_records(cmds: &[Cmd]) {
    for c in cmds {
        if let Cmd::Record(e) = c {
            e.captured.leave();
        }
    }
}
