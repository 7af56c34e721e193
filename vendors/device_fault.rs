//! What the GPU vendors share about device faults (see `docs/RELIABILITY.md`, "Device
//! faults"): the layout of a fault word — 16 bytes, word 0 the claim, words 1 and 2 the
//! offending value — and how a claimed word read back becomes a typed error. Each vendor
//! keeps its own words (`vendors/wgpu/fault.rs`, `vendors/cuda/fault.rs`).

use std::sync::Arc;

use crate::error::Error;

/// Bytes of a fault word: claimed flag, the offending value's low and high words, spare.
pub(crate) const FAULT_BYTES: u64 = 16;

/// What a claim of one plan's fault word means.
#[derive(Debug, Clone)]
pub(crate) struct FaultMeaning {
    /// The operator, for the error.
    pub op: String,
    /// The bound the offending value broke (`0..limit`).
    pub limit: u64,
    /// Whether the offending value is 64-bit (words 1 and 2) or 32-bit signed (word 1).
    pub wide: bool,
}

impl FaultMeaning {
    /// The error a read-back word stands for, or `None` when it is clear.
    pub fn error(&self, words: [u32; 4]) -> Option<Error> {
        offending(words, self.wide).map(|index| Error::IndexOutOfRange {
            op: self.op.clone(),
            index,
            limit: self.limit,
        })
    }
}

/// The offending value a read-back word holds, when it was claimed.
fn offending(words: [u32; 4], wide: bool) -> Option<i64> {
    if words[0] == 0 {
        return None;
    }
    Some(if wide {
        ((u64::from(words[2]) << 32) | u64::from(words[1])) as i64
    } else {
        i64::from(words[1] as i32)
    })
}

/// Adds `words` to `list`, each once.
pub(crate) fn note<T>(list: &mut Vec<Arc<T>>, words: impl IntoIterator<Item = Arc<T>>) {
    for w in words {
        if !list.iter().any(|x| Arc::ptr_eq(x, &w)) {
            list.push(w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claimed_words_name_the_offending_value() {
        assert_eq!(offending([0, 7, 0, 0], false), None);
        assert_eq!(offending([1, 257, 0, 0], false), Some(257));
        assert_eq!(offending([1, u32::MAX - 6, u32::MAX, 0], false), Some(-7));
        assert_eq!(offending([1, u32::MAX, u32::MAX, 0], true), Some(-1));
        assert_eq!(offending([1, 3, 1, 0], true), Some((1 << 32) + 3));
    }
}
