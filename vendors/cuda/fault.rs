//! Device-side faults on CUDA: how a kernel that finds bad data on the device (an embedding id
//! outside the table) reports it as a typed error. A kernel cannot return one, and checking
//! the data on the host first would synchronise the stream — which a captured launch must not.
//!
//! A plan whose kernel can fault holds a [`FaultWord`]: 16 bytes of device memory, zero until
//! a thread finds bad data and claims it (`atomicExch` on word 0, so exactly one thread writes
//! the offending value into words 1 and 2). The words come from slabs the device allocates
//! and zeroes once (4096 words a slab) and frees when it is dropped, so no word is ever freed
//! under a queued kernel; a word goes back to its slab's free list when no plan, stream or
//! graph holds it any more.
//!
//! Each launch notes its word on its stream — or, while the stream captures, in the capture,
//! so the graph and every exec of it carry the word and each replay notes it on the stream it
//! runs on. A stream's synchronisation (after the driver's) reads the noted words back and
//! clears them on that stream, then waits for that; a claimed word is the error it returns
//! ([`Error::IndexOutOfRange`]), as the CPU backend reports a failed kernel at the stream's
//! next synchronisation. The words of a stream destroyed with work queued are checked by the
//! next device-wide synchronisation. A plan launched on two streams at once shares its word: a
//! fault is then reported by whichever synchronises first.

use std::sync::Arc;

use parking_lot::Mutex;

use super::CudaBackend;
use crate::error::{Error, Result};
use crate::vendors::device_fault::FaultMeaning;
pub(crate) use crate::vendors::device_fault::{note, FAULT_BYTES};

/// Words per slab (one allocation of 64 KiB).
const SLAB_WORDS: u64 = 4096;

/// The device's slabs of fault words.
#[derive(Default)]
pub(crate) struct FaultSlabs {
    /// The slabs' device addresses (freed when the device is dropped).
    pub bases: Vec<u64>,
    /// Cleared words no one holds.
    free: Vec<u64>,
}

/// One plan's fault word and what its claim means.
pub(crate) struct FaultWord {
    /// The word's device address.
    pub addr: u64,
    meaning: FaultMeaning,
    slabs: Arc<Mutex<FaultSlabs>>,
}

impl std::fmt::Debug for FaultWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultWord({} at {:#x})", self.meaning.op, self.addr)
    }
}

impl Drop for FaultWord {
    fn drop(&mut self) {
        // Every launch that used the word was checked (and the word cleared) before the last
        // holder let go: a stream holds it until it has been synchronised.
        self.slabs.lock().free.push(self.addr);
    }
}

impl CudaBackend {
    /// A cleared fault word for `op`'s values that must lie in `0..limit` (plan time). A new
    /// slab is allocated and zeroed on an internal stream of its own, in Relaxed capture mode
    /// like unirt's other internal work, so a capture in progress elsewhere is not disturbed.
    pub(crate) fn fault_word(&self, op: &str, limit: u64, wide: bool) -> Result<Arc<FaultWord>> {
        let mut slabs = self.fault_slabs.lock();
        if slabs.free.is_empty() {
            self.bind()?;
            let bytes = (SLAB_WORDS * FAULT_BYTES) as usize;
            let base = self.drv.mem_alloc(bytes, &self.name)?;
            let zeroed = self.drv.stream_create().and_then(|s| {
                // SAFETY: `base` is a live allocation of `bytes` bytes made above, used by no
                // other work yet; `s` was just created and is destroyed once, after the wait.
                let r = unsafe {
                    self.drv
                        .memset_d8(base, 0, bytes, s)
                        .and_then(|()| self.drv.stream_synchronize(s))
                };
                // SAFETY: as above.
                let _ = unsafe { self.drv.stream_destroy(s) };
                r
            });
            if let Err(e) = zeroed {
                // SAFETY: allocated above, never handed out, no work queued on it any more
                // (the memset failed or was waited for): freed once.
                let _ = unsafe { self.drv.mem_free(base) };
                return Err(e);
            }
            slabs.bases.push(base);
            slabs
                .free
                .extend((0..SLAB_WORDS).rev().map(|i| base + i * FAULT_BYTES));
        }
        let addr = slabs
            .free
            .pop()
            .ok_or_else(|| Error::Internal("no fault word after a new slab".into()))?;
        Ok(Arc::new(FaultWord {
            addr,
            meaning: FaultMeaning {
                op: op.to_string(),
                limit,
                wide,
            },
            slabs: self.fault_slabs.clone(),
        }))
    }

    /// Reads `words` back — and clears them when `take` — on `stream` (live, not capturing,
    /// and synchronised: the work that may claim them has finished), then waits; the first
    /// claimed word is the error.
    pub(crate) fn check_faults(
        &self,
        stream: u64,
        words: &[Arc<FaultWord>],
        take: bool,
    ) -> Result<()> {
        if words.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let mut host = vec![[0u32; 4]; words.len()];
        for (w, slot) in words.iter().zip(host.iter_mut()) {
            // SAFETY: `slot` is 16 writable host bytes that outlive the copy (waited for
            // below); the word lies in a slab this device keeps allocated until it is dropped;
            // the stream is live (the caller's contract).
            unsafe {
                self.drv.copy_d2h(
                    slot.as_mut_ptr() as u64,
                    w.addr,
                    FAULT_BYTES as usize,
                    stream,
                )?;
                if take {
                    self.drv
                        .memset_d8(w.addr, 0, FAULT_BYTES as usize, stream)?;
                }
            }
        }
        // SAFETY: the stream is live (the caller's contract).
        unsafe { self.drv.stream_synchronize(stream) }?;
        for (w, words) in words.iter().zip(host) {
            if let Some(e) = w.meaning.error(words) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Frees the slabs (the device is being dropped, after its work finished).
    pub(crate) fn free_fault_slabs(&self) {
        for base in std::mem::take(&mut self.fault_slabs.lock().bases) {
            // SAFETY: each slab was allocated by this device and is freed once, here, after
            // the device's final synchronize; no plan can launch on a dropped device.
            let _ = unsafe { self.drv.mem_free(base) };
        }
    }
}
