//! [`Layout`]: shape, strides (in elements) and offset — the part of a tensor that views
//! change without touching memory — and NumPy broadcasting.

use smallvec::SmallVec;

use crate::error::{Error, Result};

/// A shape or strides: inline up to six dimensions, so making, cloning and dropping a
/// layout allocates nothing (a launch clones the layouts of its operands, and each one was
/// two heap allocations, freed on the stream's worker thread).
type Dims = SmallVec<[usize; 6]>;

/// Where the elements of a tensor lie in its storage: element `[i0, i1, …]` is at
/// `offset + Σ ik·strides[k]` (in elements). Strides are never negative; a stride of 0 on a
/// dimension larger than 1 is a broadcast (every index reads the same element).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Dims,
    strides: Dims,
    offset: usize,
}

/// Row-major strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    row_major(shape).to_vec()
}

/// Row-major strides of `shape`, inline.
fn row_major(shape: &[usize]) -> Dims {
    let mut strides = Dims::from_elem(0, shape.len());
    let mut acc = 1usize;
    for (s, &n) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(n.max(1));
    }
    strides
}

/// The number of elements of `shape`, or `None` when it overflows `usize`.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &n| a.checked_mul(n))
}

/// Whether every partial product of `shape`'s extents fits `usize` with `elem` bytes an
/// element (empty dimensions counted as 1, so an empty tensor's other extents are checked
/// too): what a tensor, a view or an operator's output must satisfy so that no element count,
/// row count or byte size computed from it overflows.
pub fn shape_fits(shape: &[usize], elem: usize) -> bool {
    shape
        .iter()
        .try_fold(elem.max(1), |a, &n| a.checked_mul(n.max(1)))
        .is_some_and(|b| b <= isize::MAX as usize)
}

/// NumPy broadcasting of two shapes: aligned at the right, each pair of dims equal or one of
/// them 1.
pub fn broadcast_shapes(op: &str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (i, o) in out.iter_mut().enumerate() {
        let da = (i + a.len()).checked_sub(n).map_or(1, |j| a[j]);
        let db = (i + b.len()).checked_sub(n).map_or(1, |j| b[j]);
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::NotBroadcastable {
                    op: op.into(),
                    lhs: a.to_vec(),
                    rhs: b.to_vec(),
                })
            }
        };
    }
    Ok(out)
}

/// Normalises a possibly negative axis against `ndim`.
pub fn normalize_axis(op: &str, axis: isize, ndim: usize) -> Result<usize> {
    let a = if axis < 0 { axis + ndim as isize } else { axis };
    if a < 0 || a as usize >= ndim {
        return Err(Error::AxisOutOfRange {
            op: op.into(),
            axis,
            ndim,
        });
    }
    Ok(a as usize)
}

impl Layout {
    /// A row-major layout of `shape` at offset 0.
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout {
            strides: row_major(shape),
            shape: Dims::from_slice(shape),
            offset: 0,
        }
    }

    /// A layout from its parts; shape and strides must have the same length.
    pub fn new(shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Result<Layout> {
        if shape.len() != strides.len() {
            return Err(Error::BadTensorStrides(format!(
                "{} strides for {} dimensions",
                strides.len(),
                shape.len()
            )));
        }
        if !shape_fits(&shape, 1) {
            return Err(Error::BadTensorShape(format!(
                "shape {shape:?}: more elements than an address space holds"
            )));
        }
        let l = Layout {
            shape: Dims::from_vec(shape),
            strides: Dims::from_vec(strides),
            offset,
        };
        l.span_end().ok_or_else(|| {
            Error::BadTensorShape(format!("layout {l:?} addresses past usize::MAX"))
        })?;
        Ok(l)
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The element offset of element `[0, 0, …]`.
    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The element count (saturating at `usize::MAX`: tensors and plans refuse shapes that
    /// reach it, see [`shape_fits`]).
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |a, &n| a.saturating_mul(n))
    }

    /// One past the last element addressed (relative to the storage start), or `Some(offset)`
    /// for an empty tensor; `None` on overflow.
    pub fn span_end(&self) -> Option<usize> {
        if self.shape.contains(&0) {
            return Some(self.offset);
        }
        let mut last = self.offset;
        for (&n, &s) in self.shape.iter().zip(&self.strides) {
            last = last.checked_add((n - 1).checked_mul(s)?)?;
        }
        last.checked_add(1)
    }

    /// Row-major and dense (dimensions of size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 && s != expected {
                return false;
            }
            expected *= n;
        }
        true
    }

    /// Whether two different indices can address one element (a broadcast dimension), which
    /// an operator's output must not have.
    pub fn has_internal_overlap(&self) -> bool {
        if self.numel() <= 1 {
            return false;
        }
        let mut dims: Vec<(usize, usize)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(&n, _)| n > 1)
            .map(|(&n, &s)| (s, n))
            .collect();
        dims.sort_unstable();
        let mut reach = 1usize;
        for (s, n) in dims {
            if s < reach {
                return true;
            }
            reach += s * (n - 1);
        }
        false
    }

    /// A view of `len` indices from `start` along `axis`.
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Layout> {
        let a = normalize_axis("narrow", axis, self.ndim())?;
        let end = start.checked_add(len);
        if end.is_none_or(|e| e > self.shape[a]) {
            return Err(Error::BadTensorShape(format!(
                "narrow: [{start}, {start}+{len}) is outside 0..{} on axis {a}",
                self.shape[a]
            )));
        }
        let mut l = self.clone();
        if len > 0 {
            l.offset += start * self.strides[a];
        }
        l.shape[a] = len;
        Ok(l)
    }

    /// Reorders the dimensions: dimension `k` of the view is dimension `order[k]` of `self`.
    pub fn permute(&self, order: &[usize]) -> Result<Layout> {
        let mut seen = vec![false; self.ndim()];
        if order.len() != self.ndim() {
            return Err(Error::BadParam(format!(
                "permute: {} axes for {} dimensions",
                order.len(),
                self.ndim()
            )));
        }
        for &o in order {
            if o >= self.ndim() || std::mem::replace(&mut seen[o], true) {
                return Err(Error::BadParam(format!(
                    "permute: {order:?} is not a permutation of 0..{}",
                    self.ndim()
                )));
            }
        }
        Ok(Layout {
            shape: order.iter().map(|&o| self.shape[o]).collect(),
            strides: order.iter().map(|&o| self.strides[o]).collect(),
            offset: self.offset,
        })
    }

    /// Swaps two dimensions.
    pub fn transpose(&self, a: isize, b: isize) -> Result<Layout> {
        let a = normalize_axis("transpose", a, self.ndim())?;
        let b = normalize_axis("transpose", b, self.ndim())?;
        let mut l = self.clone();
        l.shape.swap(a, b);
        l.strides.swap(a, b);
        Ok(l)
    }

    /// The same elements with another shape, when the strides allow it without a copy
    /// ([`Error::NotAView`] otherwise; [`Error::ShapeMismatch`] if the counts differ).
    pub fn reshape(&self, shape: &[usize]) -> Result<Layout> {
        if checked_numel(shape) != Some(self.numel()) {
            return Err(Error::ShapeMismatch {
                op: "reshape (element count)".into(),
                expected: self.shape.to_vec(),
                got: shape.to_vec(),
            });
        }
        let strides =
            view_strides(&self.shape, &self.strides, shape).ok_or_else(|| Error::NotAView {
                shape: self.shape.to_vec(),
                strides: self.strides.to_vec(),
                target: shape.to_vec(),
            })?;
        Ok(Layout {
            shape: Dims::from_slice(shape),
            strides: Dims::from_vec(strides),
            offset: self.offset,
        })
    }

    /// A broadcast view with `shape` (NumPy rules: new dimensions at the left, size-1
    /// dimensions stretched with stride 0).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Layout> {
        let err = || Error::NotBroadcastable {
            op: "broadcast_to".into(),
            lhs: self.shape.to_vec(),
            rhs: shape.to_vec(),
        };
        if shape.len() < self.ndim() {
            return Err(err());
        }
        if !shape_fits(shape, 1) {
            return Err(Error::BadTensorShape(format!(
                "broadcast_to {shape:?}: more elements than an address space holds"
            )));
        }
        let lead = shape.len() - self.ndim();
        let mut strides = Dims::from_elem(0, shape.len());
        for (i, &n) in shape.iter().enumerate().skip(lead) {
            let (m, s) = (self.shape[i - lead], self.strides[i - lead]);
            strides[i] = match m {
                _ if m == n => s,
                1 => 0,
                _ => return Err(err()),
            };
        }
        Ok(Layout {
            shape: Dims::from_slice(shape),
            strides,
            offset: self.offset,
        })
    }

    /// Removes dimension `axis`, which must have size 1.
    pub fn squeeze(&self, axis: isize) -> Result<Layout> {
        let a = normalize_axis("squeeze", axis, self.ndim())?;
        if self.shape[a] != 1 {
            return Err(Error::BadTensorShape(format!(
                "squeeze: axis {a} has size {}, not 1",
                self.shape[a]
            )));
        }
        let mut l = self.clone();
        l.shape.remove(a);
        l.strides.remove(a);
        Ok(l)
    }

    /// Inserts a dimension of size 1 before `axis` (`-1` appends).
    pub fn unsqueeze(&self, axis: isize) -> Result<Layout> {
        let a = normalize_axis("unsqueeze", axis, self.ndim() + 1)?;
        let mut l = self.clone();
        let s = self.strides.get(a).map_or(1, |&s| s * self.shape[a].max(1));
        l.shape.insert(a, 1);
        l.strides.insert(a, s);
        Ok(l)
    }

    /// The same layout at another offset.
    pub fn with_offset(&self, offset: usize) -> Layout {
        Layout {
            offset,
            ..self.clone()
        }
    }
}

/// The dimensions of a walk over `shape` (row-major, one or more operands with their own
/// strides) merged where the operands walk memory as one: dimensions of size 1 are dropped,
/// and each dimension joins the one before it when `walks_as_one(outer, inner)` — every
/// operand's stride along `outer` is its stride along `inner` times `shape[inner]`. The
/// merged walk visits the same elements in the same order, so a kernel over it computes
/// bitwise what it computed over the original, with fewer index divisions; a dense walk
/// becomes one long row.
///
/// Each backend asks this with its strides in its own form (the CPU's `usize` arrays, the
/// CUDA kernels' `i64`). Returns, per merged dimension, its size and the innermost original
/// dimension it covers, whose strides are the merged dimension's. A walk of one element
/// has no dimensions left.
///
/// ```
/// use unirt::tensor::merge_dims;
/// // A contiguous [2, 3, 4] beside a view whose outer dimension is strided.
/// let (shape, a, b) = ([2, 3, 4], [12, 4, 1], [100, 4, 1]);
/// let merged = merge_dims(&shape, |o, i| a[o] == a[i] * shape[i] && b[o] == b[i] * shape[i]);
/// assert_eq!(merged, [(2, 0), (12, 2)]);
/// ```
pub fn merge_dims(
    shape: &[usize],
    mut walks_as_one: impl FnMut(usize, usize) -> bool,
) -> Vec<(usize, usize)> {
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(shape.len());
    for (d, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        if let Some((size, inner)) = merged.last_mut() {
            if walks_as_one(*inner, d) {
                *size *= n;
                *inner = d;
                continue;
            }
        }
        merged.push((n, d));
    }
    merged
}

/// Strides that let `new_shape` address the same elements as (`shape`, `strides`) in the
/// same row-major order, if any. Dimensions are grouped into runs that are contiguous with
/// each other; a target dimension may not straddle two runs.
fn view_strides(shape: &[usize], strides: &[usize], new_shape: &[usize]) -> Option<Vec<usize>> {
    if shape.is_empty() || shape.contains(&0) {
        return Some(contiguous_strides(new_shape));
    }
    let mut out = vec![0usize; new_shape.len()];
    let mut view_d = new_shape.len() as isize - 1;
    let mut chunk_stride = *strides.last()?;
    let (mut run_numel, mut view_numel) = (1usize, 1usize);
    for d in (0..shape.len()).rev() {
        run_numel *= shape[d];
        let run_ends = d == 0 || (shape[d - 1] != 1 && strides[d - 1] != run_numel * chunk_stride);
        if run_ends {
            while view_d >= 0 && (view_numel < run_numel || new_shape[view_d as usize] == 1) {
                out[view_d as usize] = view_numel * chunk_stride;
                view_numel *= new_shape[view_d as usize];
                view_d -= 1;
            }
            if view_numel != run_numel {
                return None;
            }
            if d > 0 {
                chunk_stride = strides[d - 1];
                run_numel = 1;
                view_numel = 1;
            }
        }
    }
    (view_d == -1).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(
            broadcast_shapes("t", &[3, 1, 5], &[4, 1]).unwrap(),
            [3, 4, 5]
        );
        assert_eq!(broadcast_shapes("t", &[], &[2]).unwrap(), [2]);
        assert!(matches!(
            broadcast_shapes("t", &[3], &[4]),
            Err(Error::NotBroadcastable { .. })
        ));
        let l = Layout::contiguous(&[3, 1])
            .broadcast_to(&[2, 3, 4])
            .unwrap();
        assert_eq!(l.strides(), [0, 1, 0]);
        assert!(l.has_internal_overlap());
        assert!(!Layout::contiguous(&[2, 3]).has_internal_overlap());
    }

    #[test]
    fn views_and_reshape() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert!(l.is_contiguous());
        let t = l.transpose(0, 2).unwrap();
        assert_eq!((t.shape(), t.strides()), (&[4, 3, 2][..], &[1, 4, 12][..]));
        assert!(!t.is_contiguous());
        assert!(matches!(t.reshape(&[24]), Err(Error::NotAView { .. })));
        assert_eq!(l.reshape(&[6, 4]).unwrap().strides(), [4, 1]);
        let n = l.narrow(2, 1, 2).unwrap();
        assert_eq!((n.offset(), n.shape()), (1, &[2, 3, 2][..]));
        // Merging the two leading dimensions of a narrowed view is still a view.
        assert_eq!(n.reshape(&[6, 2]).unwrap().strides(), [4, 1]);
        assert!(n.reshape(&[12]).is_err());
        assert_eq!(l.unsqueeze(1).unwrap().shape(), [2, 1, 3, 4]);
        assert_eq!(l.unsqueeze(-1).unwrap().shape(), [2, 3, 4, 1]);
        assert_eq!(l.unsqueeze(1).unwrap().squeeze(1).unwrap(), l);
        assert_eq!(l.span_end(), Some(24));
        assert!(l.narrow(0, 1, 2).is_err());
        assert!(l.permute(&[0, 0, 1]).is_err());
    }
}
