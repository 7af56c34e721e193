//! What the CPU kernels share: raw pointers that cross threads, the layouts of strided
//! operands (coalesced rows, lanes along an axis, gathers and scatters), and the registration
//! macro; element conversion, the SIMD tier, the parallel walks, the cache helpers, the
//! line-aligned scratch buffers and the vectorisable math each have a file of their own, re-exported here so a kernel imports
//! what it uses from one place.

mod cache;
mod dtype;
mod math;
mod parallel;
mod scratch;
mod simd;

pub(super) use cache::*;
pub(super) use dtype::*;
pub(super) use math::*;
pub(super) use parallel::*;
pub(crate) use parallel::{help_open_forks, roomy_stack};
pub(super) use scratch::*;
pub(super) use simd::*;

use crate::error::{Error, Result};
use crate::ops::{KernelCall, TensorRef};
use crate::tensor::{DType, Layout};

/// A raw pointer that may be shared with rayon's workers: kernels write disjoint parts.
#[derive(Clone, Copy)]
pub(super) struct Ptr<T>(pub *mut T);

// SAFETY: a Ptr is only dereferenced inside a kernel whose ranges were checked at launch, by
// tasks that touch disjoint elements of the outputs (and only read the inputs).
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Ptr<T> {}

impl<T> Ptr<T> {
    pub fn of(t: &TensorRef) -> Self {
        Ptr(t.ptr() as usize as *mut T)
    }

    /// The pointer `n` elements further.
    ///
    /// # Safety
    /// The result must stay inside the tensor's checked range.
    pub unsafe fn at(self, n: usize) -> *mut T {
        // SAFETY: the caller's promise.
        unsafe { self.0.add(n) }
    }
}

/// Elements per block when f16/bf16 go through f32 buffers.
pub(super) const BLOCK: usize = 512;

/// Registers `$f::<T>` for f32, f16 and bf16 under `$op`.
macro_rules! floats {
    ($reg:expr, $op:expr, $f:ident $(:: <$($g:ty),*>)?) => {{
        use crate::device::DeviceKind;
        use crate::ops::KernelImpl;
        use crate::tensor::DType;
        $reg.builtin($op, DeviceKind::Cpu, DType::F32, KernelImpl::Host($f::<f32 $($(, $g)*)?>));
        $reg.builtin($op, DeviceKind::Cpu, DType::F16, KernelImpl::Host($f::<half::f16 $($(, $g)*)?>));
        $reg.builtin($op, DeviceKind::Cpu, DType::BF16, KernelImpl::Host($f::<half::bf16 $($(, $g)*)?>));
    }};
}
pub(super) use floats;

/// `t`'s layout broadcast to `shape` (the plan checked that it broadcasts).
pub(super) fn bcast(t: &TensorRef, shape: &[usize]) -> Result<Layout> {
    t.layout.broadcast_to(shape)
}

/// Merges dimensions that are contiguous with each other in every operand and drops
/// dimensions of size 1 ([`merge_dims`](crate::tensor::merge_dims)), so a dense walk becomes
/// one long row.
pub(super) fn coalesce<const N: usize>(
    shape: &[usize],
    strides: [&[usize]; N],
) -> (Vec<usize>, Vec<[usize; N]>) {
    crate::tensor::merge_dims(shape, |o, i| {
        strides.iter().all(|s| s[o] == s[i] * shape[i])
    })
    .into_iter()
    .map(|(n, d)| (n, std::array::from_fn(|k| strides[k][d])))
    .unzip()
}

/// The scalar parameter of a plan, or an internal error (the plan always sets it).
pub(super) fn scalar_param(call: &KernelCall<'_>) -> Result<f64> {
    match call.params {
        crate::ops::Params::Scalar(s) => Ok(*s),
        p => Err(Error::Internal(format!(
            "{}: unexpected parameters {p:?}",
            call.op
        ))),
    }
}

/// Offsets (in elements, from the view's first element) of every index of `shape` with
/// `strides`, in row-major order: the small gathers of reductions over several axes.
pub(super) fn offsets(shape: &[usize], strides: &[usize]) -> Vec<usize> {
    let mut out = vec![0usize];
    for (&n, &s) in shape.iter().zip(strides) {
        let prev = std::mem::take(&mut out);
        out.reserve(prev.len() * n);
        for p in prev {
            for i in 0..n {
                out.push(p + i * s);
            }
        }
    }
    out
}

/// The lanes of operands along one axis: every index of the other dimensions, with the
/// element offset of the lane start in each operand (relative to its first element).
pub(super) struct Lanes<const N: usize> {
    shape: Vec<usize>,
    strides: Vec<[usize; N]>,
    /// Elements per lane.
    pub len: usize,
    /// Each operand's stride along the axis.
    pub stride: [usize; N],
}

impl<const N: usize> Lanes<N> {
    /// Lanes along `axis` of same-shaped layouts.
    pub fn new(layouts: [&Layout; N], axis: usize) -> Self {
        let shape = layouts[0].shape();
        let mut other_shape = Vec::with_capacity(shape.len());
        let mut other_strides = Vec::with_capacity(shape.len());
        for d in (0..shape.len()).filter(|&d| d != axis) {
            other_shape.push(shape[d]);
            other_strides.push(std::array::from_fn(|k| layouts[k].strides()[d]));
        }
        Lanes {
            shape: other_shape,
            strides: other_strides,
            len: shape[axis],
            stride: std::array::from_fn(|k| layouts[k].strides()[axis]),
        }
    }

    /// How many lanes.
    pub fn count(&self) -> usize {
        self.shape.iter().product()
    }

    /// The offsets of lane `i` (row-major over the other dimensions).
    pub fn offsets(&self, i: usize) -> [usize; N] {
        let mut offs = [0usize; N];
        let mut rem = i;
        for d in (0..self.shape.len()).rev() {
            let j = rem % self.shape[d];
            rem /= self.shape[d];
            for (o, s) in offs.iter_mut().zip(&self.strides[d]) {
                *o += j * s;
            }
        }
        offs
    }

    /// [`Self::offsets`] of lane `i`, also writing the lane's index per dimension to `index`
    /// (where [`Self::walk`] starts counting).
    fn decompose(&self, i: usize, index: &mut [usize]) -> [usize; N] {
        let mut rem = i;
        for (d, j) in index.iter_mut().enumerate().rev() {
            *j = rem % self.shape[d];
            rem /= self.shape[d];
        }
        let mut offs = [0usize; N];
        for (j, strides) in index.iter().zip(&self.strides) {
            for (o, s) in offs.iter_mut().zip(strides) {
                *o += j * s;
            }
        }
        offs
    }

    /// Lanes `range` in order, each with its offsets and those of the next lane in `range`
    /// (for [`prefetch_l2`]). Only the first lane's offsets are computed from its index; the
    /// others advance from the previous lane's like an odometer, because [`Self::offsets`]
    /// costs two integer divisions per dimension, which on short lanes (rope's rows of 128
    /// elements) took several per cent of the kernel's samples under `perf`.
    pub fn walk(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (usize, [usize; N], Option<[usize; N]>)> + '_ {
        let end = range.end;
        // The index, per dimension, of the lane whose offsets are in `next`.
        let mut index = vec![0usize; self.shape.len()];
        let mut next = (range.start < end).then(|| self.decompose(range.start, &mut index));
        range.map(move |i| {
            let cur = next.unwrap_or_else(|| self.offsets(i));
            next = (i + 1 < end).then(|| self.advance(&mut index, cur));
            (i, cur, next)
        })
    }

    /// The offsets of the lane after the one at `index` (whose offsets are `offs`), moving
    /// `index` to it: the last dimension steps by its stride, and a dimension that wraps
    /// steps back over its extent and carries into the one before.
    #[inline]
    fn advance(&self, index: &mut [usize], mut offs: [usize; N]) -> [usize; N] {
        for d in (0..self.shape.len()).rev() {
            index[d] += 1;
            if index[d] < self.shape[d] {
                for (o, s) in offs.iter_mut().zip(&self.strides[d]) {
                    *o += s;
                }
                return offs;
            }
            index[d] = 0;
            for (o, s) in offs.iter_mut().zip(&self.strides[d]) {
                *o -= (self.shape[d] - 1) * s;
            }
        }
        offs
    }
}

/// Reads `dst.len()` elements at `stride` from `src` into f32s.
///
/// # Safety
/// `src` must be valid for reading those elements.
#[inline(always)]
pub(super) unsafe fn gather<T: Float>(src: *const T, stride: usize, dst: &mut [f32]) {
    if dst.is_empty() {
        // An empty tensor may have no storage at all (a null address).
    } else if stride == 1 {
        // SAFETY: the caller's promise, contiguous.
        T::load(unsafe { std::slice::from_raw_parts(src, dst.len()) }, dst);
    } else {
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: the caller's promise.
            *d = unsafe { *src.add(i * stride) }.to_f32();
        }
    }
}

/// Writes f32s to `dst.len()` elements at `stride`.
///
/// # Safety
/// `dst` must be valid for writing those elements.
#[inline(always)]
pub(super) unsafe fn scatter<T: Float>(src: &[f32], dst: *mut T, stride: usize) {
    if src.is_empty() {
        // Nothing to write, and possibly no storage.
    } else if stride == 1 {
        // SAFETY: the caller's promise, contiguous.
        T::store(src, unsafe {
            std::slice::from_raw_parts_mut(dst, src.len())
        });
    } else {
        for (i, s) in src.iter().enumerate() {
            // SAFETY: the caller's promise.
            unsafe { *dst.add(i * stride) = T::from_f32(*s) };
        }
    }
}

/// Reads an i32/i64 index tensor's element `i` (contiguous offset `off`) as i64.
///
/// # Safety
/// `t`'s element at `off` must be readable.
pub(super) unsafe fn read_index(t: &TensorRef, off: usize) -> i64 {
    // SAFETY: the caller's promise; the dtype picks the width.
    unsafe {
        match t.dtype {
            DType::I32 => *(t.ptr() as usize as *const i32).add(off) as i64,
            _ => *(t.ptr() as usize as *const i64).add(off),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Lanes;
    use crate::tensor::Layout;

    /// `walk` advances each lane's offsets from the previous lane's; they must be those that
    /// `offsets` computes from the lane's index, for every start (strided, broadcast and
    /// one-long dimensions included).
    #[test]
    fn walk_matches_offsets() -> crate::Result<()> {
        for shape in [vec![3, 4, 5, 6], vec![1, 4, 1, 6], vec![7]] {
            let a = Layout::contiguous(&shape);
            // Strides out of order, one of them 0 (a broadcast dimension).
            let strides: Vec<usize> = [1, 0, 18, 3][..shape.len()].to_vec();
            let b = Layout::new(shape.clone(), strides, 2)?;
            for axis in 0..shape.len() {
                let lanes = Lanes::new([&a, &b], axis);
                let n = lanes.count();
                for start in [0, 1, n / 3, n.saturating_sub(1), n] {
                    let start = start.min(n);
                    let walked: Vec<_> = lanes.walk(start..n).collect();
                    assert_eq!(walked.len(), n - start);
                    for (k, &(i, cur, next)) in walked.iter().enumerate() {
                        assert_eq!(i, start + k);
                        assert_eq!(cur, lanes.offsets(i), "{shape:?} axis {axis} lane {i}");
                        assert_eq!(next, (i + 1 < n).then(|| lanes.offsets(i + 1)));
                    }
                }
            }
        }
        Ok(())
    }
}
