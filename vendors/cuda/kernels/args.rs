//! The by-value parameter structs of the op kernels, built on the host: every field of the C
//! structs in `common.cuh` and the family files is 64-bit (`i64` or `double`), so a struct is
//! an array of `i64` words filled in field order. Iteration spaces are coalesced here, once per
//! plan: size-1 dimensions drop out and dimensions contiguous in every operand merge.

use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::tensor::Layout;

/// The C side's `UNIRT_MAX_DIMS`.
pub const MAX_DIMS: usize = 8;

/// A kernel's parameter struct, word by word.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Args(pub Vec<i64>);

impl Args {
    pub fn new() -> Self {
        Args(Vec::with_capacity(48))
    }

    /// One `i64` field.
    pub fn int(&mut self, v: impl TryInto<i64>) -> &mut Self {
        self.0.push(v.try_into().unwrap_or(i64::MAX));
        self
    }

    /// One `double` field.
    pub fn float(&mut self, v: f64) -> &mut Self {
        self.0.push(v.to_bits() as i64);
        self
    }

    /// A `Space` (nd, n, dim[MAX_DIMS]).
    pub fn space(&mut self, s: &Space) -> &mut Self {
        self.int(s.dims.len()).int(s.count());
        for d in 0..MAX_DIMS {
            self.int(s.dims.get(d).copied().unwrap_or(1));
        }
        self
    }

    /// A `Strides` (st[MAX_DIMS]), operand `i` of `s`.
    pub fn strides(&mut self, s: &Space, i: usize) -> &mut Self {
        for d in 0..MAX_DIMS {
            self.int(
                s.strides
                    .get(i)
                    .and_then(|st| st.get(d))
                    .copied()
                    .unwrap_or(0),
            );
        }
        self
    }
}

/// An iteration space shared by several operands: sizes (outermost first) and each operand's
/// strides over them, in elements.
#[derive(Debug, Clone, PartialEq)]
pub struct Space {
    pub dims: Vec<i64>,
    pub strides: Vec<Vec<i64>>,
}

impl Space {
    /// Points in the space.
    pub fn count(&self) -> i64 {
        self.dims.iter().product()
    }

    /// Whether the space is one run that the first `operands` operands all walk with unit
    /// stride: the case a kernel may move in 16-byte vectors.
    pub fn dense(&self, operands: usize) -> bool {
        self.dims.len() == 1
            && self.strides.len() >= operands
            && self.strides[..operands]
                .iter()
                .all(|s| s.first() == Some(&1))
    }

    /// Blocks of [`BLOCK`] threads for a grid-stride kernel that moves `vector` elements a
    /// thread when the space is [`dense`](Self::dense) over `operands`, else one.
    pub fn grid(&self, operands: usize, vector: i64) -> u32 {
        let per_thread = if self.dense(operands) {
            vector.max(1)
        } else {
            1
        };
        let threads = (self.count() + per_thread - 1) / per_thread;
        blocks(threads, BLOCK as i64)
    }

    /// The space of `shape` with each operand's `strides` over it (already aligned to
    /// `shape`, 0 where an operand broadcasts), coalesced. More than [`MAX_DIMS`] dimensions
    /// left after merging is [`Error::Unsupported`].
    pub fn new(op: &str, shape: &[usize], strides: &[Vec<i64>]) -> Result<Space> {
        let merged = crate::tensor::merge_dims(shape, |o, i| {
            strides.iter().all(|s| s[o] == s[i] * shape[i] as i64)
        });
        let mut dims: Vec<i64> = merged.iter().map(|&(n, _)| n as i64).collect();
        let mut st: Vec<Vec<i64>> = strides
            .iter()
            .map(|s| merged.iter().map(|&(_, d)| s[d]).collect())
            .collect();
        if shape.contains(&0) {
            dims = vec![0];
            st = vec![vec![0]; strides.len()];
        }
        if dims.len() > MAX_DIMS {
            return Err(Error::unsupported(
                format!(
                    "{op} over {} dimensions that do not merge (the CUDA kernels take {MAX_DIMS})",
                    dims.len()
                ),
                DeviceKind::Cuda,
            ));
        }
        Ok(Space { dims, strides: st })
    }
}

/// `layout`'s strides aligned to `shape` (its dimensions on the right; 0 where it has size 1
/// or no dimension, i.e. where it broadcasts).
pub fn broadcast(shape: &[usize], layout: &Layout) -> Vec<i64> {
    let (ls, lt) = (layout.shape(), layout.strides());
    let skip = shape.len().saturating_sub(ls.len());
    (0..shape.len())
        .map(|d| {
            if d < skip {
                return 0;
            }
            let i = d - skip;
            if ls[i] == 1 {
                0
            } else {
                lt[i] as i64
            }
        })
        .collect()
}

/// `layout`'s strides as words.
pub fn strides_of(layout: &Layout) -> Vec<i64> {
    layout.strides().iter().map(|&s| s as i64).collect()
}

/// Threads per block of the memory-bound kernels.
pub const BLOCK: u32 = 256;

/// Elements a thread of a row kernel holds in its `RowCache` (`ROW_PACKS` · 4, `common.cuh`).
pub const ROW_PER_THREAD: usize = 16;

/// Threads of a row kernel's block for rows of `len` elements when a thread holds
/// `per_thread` of them in registers: enough for the row, a multiple of the warp, at most
/// 1024 (longer rows take the kernels' uncached path).
pub fn row_threads(len: usize, per_thread: usize) -> u32 {
    (len.div_ceil(per_thread.max(1)).div_ceil(32) * 32).clamp(32, 1024) as u32
}

/// Blocks for `n` items at `per_block` items a block (grid-stride loops cover the rest).
pub fn blocks(n: i64, per_block: i64) -> u32 {
    let b = (n.max(1) + per_block - 1) / per_block;
    b.clamp(1, 1 << 20) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_dimensions_merge_and_broadcasts_stay() {
        let s = Space::new("t", &[2, 3, 4], &[vec![12, 4, 1], vec![0, 4, 1]]).unwrap();
        assert_eq!(s.dims, [2, 12]);
        assert_eq!(s.strides, [vec![12, 1], vec![0, 1]]);
        let s = Space::new("t", &[2, 1, 4], &[vec![4, 4, 1]]).unwrap();
        assert_eq!(s.dims, [8]);
        let s = Space::new("t", &[3, 0], &[vec![1, 1]]).unwrap();
        assert_eq!(s.count(), 0);
        let mut a = Args::new();
        a.space(&s).strides(&s, 0).float(1.5);
        assert_eq!(a.0.len(), 2 + MAX_DIMS + MAX_DIMS + 1);
    }

    #[test]
    fn row_blocks_hold_the_row_in_16_elements_a_thread() {
        let r = |len| row_threads(len, ROW_PER_THREAD);
        assert_eq!(r(0), 32);
        assert_eq!(r(7), 32);
        assert_eq!(r(513), 64);
        assert_eq!(r(4096), 256);
        assert_eq!(r(5120), 320);
        assert_eq!(r(16384), 1024);
        assert_eq!(r(1 << 20), 1024);
        // 16-bit rows held raw, 32 a thread.
        assert_eq!(row_threads(4096, 32), 128);
    }

    #[test]
    fn broadcast_strides_are_zero() {
        let l = Layout::contiguous(&[3, 1]);
        assert_eq!(broadcast(&[2, 3, 4], &l), [0, 1, 0]);
    }
}
