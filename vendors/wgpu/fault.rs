//! Device-side faults: how a kernel that finds bad data on the device (an embedding id outside
//! the table) reports it as a typed error, without the host reading the data first (which
//! would synchronise the stream, and could not happen inside a captured graph at all).
//!
//! A plan whose kernel can fault owns a [`FaultWord`]: 16 bytes of device memory bound to its
//! kernel, zero until an invocation finds bad data and claims it (`atomicExchange` on word 0,
//! so exactly one invocation writes the offending value into words 1 and 2). Each launch
//! leaves a [`Cmd::Check`] marker behind its dispatches; a stream turns the markers of its
//! eager work into a list of words to check, and a capture keeps them, so every replay of the
//! graph adds them to the stream it runs on. A stream's synchronisation — after the device
//! finished its work — reads those words back and clears them in one small submission, and a
//! claimed word is the error the synchronisation returns ([`Error::IndexOutOfRange`](crate::Error::IndexOutOfRange)), as the
//! CPU backend reports a failed kernel at the stream's next synchronisation. The output of a
//! launch that faulted is unspecified (the kernel writes zeros where the data was bad, and
//! never reads or writes outside its tensors).
//!
//! A plan launched on two streams at once shares its word: a fault is then reported by
//! whichever of those streams synchronises first.

use std::sync::Arc;

use super::copy::download;
use super::gpu::Gpu;
use super::memory::DevBuf;
use super::plan::Plan;
use super::stream::{BufClear, Cmd};
use crate::checked::Pins;
use crate::error::Result;
use crate::vendors::device_fault::FaultMeaning;
pub(crate) use crate::vendors::device_fault::{note, FAULT_BYTES};

/// One plan's fault word and what its claim means.
pub(crate) struct FaultWord {
    pub buf: DevBuf,
    meaning: FaultMeaning,
}

impl FaultWord {
    /// A cleared word on `gpu` for `op`'s values that must lie in `0..limit`.
    pub fn new(gpu: &Gpu, op: &str, limit: u64, wide: bool) -> Result<Arc<Self>> {
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        // WebGPU zero-initialises every buffer: the word starts cleared.
        let b = super::memory::create_buffer(&gpu.device, FAULT_BYTES, usage, false, &gpu.name)?;
        Ok(Arc::new(FaultWord {
            buf: DevBuf::new(b, false),
            meaning: FaultMeaning {
                op: op.to_string(),
                limit,
                wide,
            },
        }))
    }
}

/// The fault words that `cmds` check (a captured graph's, noted at each replay).
pub(crate) fn checked_by(cmds: &[Cmd]) -> Vec<Arc<FaultWord>> {
    let mut list = Vec::new();
    note(
        &mut list,
        cmds.iter().filter_map(|c| match c {
            Cmd::Check(w) => Some(w.clone()),
            _ => None,
        }),
    );
    list
}

/// Reads `words` back — and clears them when `take` — after the work that may claim them has
/// finished; the first claimed one is the error.
pub(crate) fn check(gpu: &Gpu, words: &[Arc<FaultWord>], take: bool) -> Result<()> {
    if words.is_empty() {
        return Ok(());
    }
    let mut host = vec![[0u32; 4]; words.len()];
    let mut cmds = Vec::with_capacity(3 * words.len());
    for (w, slot) in words.iter().zip(host.iter_mut()) {
        download(
            gpu,
            &mut cmds,
            slot.as_mut_ptr() as u64,
            &w.buf,
            0,
            FAULT_BYTES,
            false,
        )?;
        if take {
            cmds.push(Cmd::Clear(BufClear {
                buf: w.buf.buffer.clone(),
                off: 0,
                size: FAULT_BYTES,
            }));
        }
    }
    // The read-backs write `host` when the submission completes; it is waited for here, so
    // `host` outlives them (and `words`, the buffers).
    let t = gpu.submit(&Plan::new(cmds), Pins::new())?;
    gpu.wait(&t)?;
    for (w, words) in words.iter().zip(host) {
        if let Some(e) = w.meaning.error(words) {
            return Err(e);
        }
    }
    Ok(())
}

/// WGSL that declares the fault word as binding `binding` and `fault_claim(lo, hi)`, which
/// records the first offending value.
pub(crate) fn wgsl(binding: usize) -> String {
    format!(
        "@group(0) @binding({binding}) var<storage, read_write> fault: array<atomic<u32>, 4>;\n\
         fn fault_claim(lo: u32, hi: u32) {{\n    \
         if (atomicExchange(&fault[0], 1u) == 0u) {{ atomicStore(&fault[1], lo); atomicStore(&fault[2], hi); }}\n}}\n"
    )
}
