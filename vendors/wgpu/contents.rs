//! What each operator texture holds, so that a copy into it can be skipped while its source
//! is unchanged.
//!
//! On the software adapters an operator kernel may read an input through a texture
//! (`kernels/op.rs`, `TexRead`), and each launch copies the input into its texture first. For a
//! weight matrix that copy is the same every time: the decode step's GEMVs spent about as long
//! copying their matrices as multiplying by them (docs/BENCHMARKS.md, eleventh session). So a
//! copy marked *reusable* names its source — a byte range of one device buffer — and the
//! texture remembers the source it last received; the copy is skipped while nothing has
//! written that range since.
//!
//! Correctness rests on three rules:
//! - **Every command list that writes device memory says what it writes** ([`Writes`], carried
//!   as a `Cmd::Wrote` after the commands): an operator launch its outputs' byte ranges, a copy
//!   or a clear its destination, a user kernel every buffer it binds, whole. `enqueue` takes
//!   the writes as an argument, so no command can be added without stating them.
//! - **Decisions are taken in submission order.** Copies are kept or skipped, and writes
//!   forget the textures they overlap, when a plan is handed to the queue, under the lock that
//!   gives submissions their order (`Gpu::submit`): the one queue then runs them in that order,
//!   so the state seen by each decision is the state the device will be in. A graph's plan is
//!   decided at each replay in the same way (its captured writes travel with it).
//! - **Anything unexpected forgets everything** ([`TexContents::forget_all`]): a submission
//!   that fails to encode or is lost makes every texture a stranger again.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// Byte ranges `(buffer id, start, end)` that a command list writes; `end` may be
/// [`WHOLE`] for "to the end of the buffer".
pub(crate) type Writes = Arc<[(u64, u64, u64)]>;

/// The end of a write range that covers a buffer to its end.
pub(crate) const WHOLE: u64 = u64::MAX;

/// The source of a texture's contents: `(buffer id, first byte, end byte, bytes per row)`.
pub(crate) type TexSource = (u64, u64, u64, u32);

/// What one texture holds: the source it was last filled from, while that source is
/// unchanged; `None` when unknown.
#[derive(Default)]
pub(crate) struct TexHeld(Mutex<Option<TexSource>>);

impl TexHeld {
    /// Whether the copy of `source` into this texture may be skipped; records that the
    /// texture holds it afterwards (when `reusable`) or holds something unknown (when not).
    /// Called in submission order.
    pub fn fill(&self, source: TexSource, reusable: bool) -> bool {
        let mut h = self.0.lock();
        if reusable && *h == Some(source) {
            return true;
        }
        *h = reusable.then_some(source);
        false
    }
}

/// The textures of one device whose contents are known, for [`TexContents::wrote`] to forget.
#[derive(Default)]
pub(crate) struct TexContents {
    known: Mutex<Vec<Weak<TexHeld>>>,
}

impl TexContents {
    /// The contents record of a new texture, known to this device's writes.
    pub fn new_texture(&self) -> Arc<TexHeld> {
        let held = Arc::new(TexHeld::default());
        let mut known = self.known.lock();
        known.retain(|w| w.strong_count() > 0);
        known.push(Arc::downgrade(&held));
        held
    }

    /// Forgets the contents of every texture whose source overlaps a range in `writes`.
    pub fn wrote(&self, writes: &[(u64, u64, u64)]) {
        let known = self.known.lock();
        for held in known.iter().filter_map(Weak::upgrade) {
            let mut h = held.0.lock();
            if let Some((id, start, end, _)) = *h {
                if writes
                    .iter()
                    .any(|&(w, ws, we)| w == id && ws < end && start < we)
                {
                    *h = None;
                }
            }
        }
    }

    /// Forgets every texture's contents.
    pub fn forget_all(&self) {
        for held in self.known.lock().iter().filter_map(Weak::upgrade) {
            *held.0.lock() = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_skipped_until_its_source_is_written() {
        let c = TexContents::default();
        let t = c.new_texture();
        let src = (7, 256, 1280, 256);
        assert!(!t.fill(src, true), "the first copy runs");
        assert!(t.fill(src, true), "the same source again is skipped");
        c.wrote(&[(7, 0, 256)]);
        assert!(t.fill(src, true), "a write before the range leaves it");
        c.wrote(&[(8, 0, WHOLE)]);
        assert!(t.fill(src, true), "a write to another buffer leaves it");
        c.wrote(&[(7, 1279, 1280)]);
        assert!(!t.fill(src, true), "an overlapping write forgets it");
        assert!(t.fill(src, true));
        assert!(
            !t.fill((7, 0, 1024, 256), true),
            "another source refills it"
        );
        assert!(!t.fill(src, true));
        assert!(
            !t.fill(src, false),
            "a copy that is not reusable always runs"
        );
        assert!(!t.fill(src, true), "and leaves the contents unknown");
        c.forget_all();
        assert!(!t.fill(src, true));
    }
}
