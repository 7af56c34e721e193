//! How a tensor prints. `Display`: shape, dtype, device and a clipped preview of the values —
//! at most [`PREVIEW_EDGE`] entries at each end of every dimension and at most
//! [`PREVIEW_VALUES`] values in all. `Debug`: shape, dtype, device and layout, no values.
//!
//! **A preview reads only what it prints.** The printed entries of a tensor form one strided
//! view of its storage (a clipped dimension of size n becomes two of sizes 2 and
//! `PREVIEW_EDGE`, strides apart by n − `PREVIEW_EDGE` entries), so printing a tensor of
//! billions of elements — or a broadcast view of 2⁴⁰ — copies a few thousand values to the
//! host, not the whole tensor. And the printer walks the dimensions with a loop: printing
//! with one call per dimension overflowed the stack, and aborted the process, for a tensor of
//! 100 000 dimensions.

use std::fmt;

use super::{Layout, Tensor};
use crate::error::Result;

/// Entries printed at each end of a dimension longer than twice this.
const PREVIEW_EDGE: usize = 3;

/// Values printed at most; the rest of the preview shows as `...`.
const PREVIEW_VALUES: usize = 1000;

/// The entries a preview prints, in row-major order over `shape`.
struct Preview {
    /// Each dimension's printed extent (at most `2 * PREVIEW_EDGE`).
    shape: Vec<usize>,
    /// Whether a dimension is clipped (its middle entries print as `...`).
    clipped: Vec<bool>,
    /// The values of the first printed entries (all of them, or the first
    /// [`PREVIEW_VALUES`] and more).
    values: Vec<f64>,
}

impl Tensor {
    /// Reads the entries [`Display`](fmt::Display) prints (waits for pending work).
    fn preview(&self) -> Result<Preview> {
        let shape = self.shape();
        let clipped: Vec<bool> = shape.iter().map(|&n| n > 2 * PREVIEW_EDGE).collect();
        let printed: Vec<usize> = shape.iter().map(|&n| n.min(2 * PREVIEW_EDGE)).collect();
        if self.numel() == 0 {
            return Ok(Preview {
                shape: printed,
                clipped,
                values: Vec::new(),
            });
        }
        // The values past PREVIEW_VALUES are not printed: the dimensions whose trailing block
        // holds more than that many entries show their first entry only, save the innermost
        // of them (at most 2 * PREVIEW_EDGE entries of a block of at most PREVIEW_VALUES).
        let mut whole_from = shape.len();
        let mut block = 1usize;
        while whole_from > 0 && block.saturating_mul(printed[whole_from - 1]) <= PREVIEW_VALUES {
            whole_from -= 1;
            block *= printed[whole_from];
        }
        let first_kept = whole_from.saturating_sub(1);
        let strides = self.layout.strides();
        let (mut view_shape, mut view_strides) = (Vec::new(), Vec::new());
        for (d, (&n, &stride)) in shape.iter().zip(strides).enumerate() {
            if d < first_kept {
                view_shape.push(1);
                view_strides.push(stride);
            } else if clipped[d] {
                // Entries 0..EDGE and n-EDGE..n: two runs of EDGE, n - EDGE entries apart.
                view_shape.extend([2, PREVIEW_EDGE]);
                view_strides.extend([stride * (n - PREVIEW_EDGE), stride]);
            } else {
                view_shape.push(n);
                view_strides.push(stride);
            }
        }
        let layout = Layout::new(view_shape, view_strides, self.layout.offset())?;
        let values = self.view_storage(layout, self.dtype)?.to_f64_vec()?;
        Ok(Preview {
            shape: printed,
            clipped,
            values,
        })
    }
}

impl fmt::Display for Tensor {
    /// `Tensor[2, 3] f32 on cpu:0` and a preview of the values: at most 3 entries at each
    /// end of every dimension, at most 1000 values.
    ///
    /// ```
    /// # use unirt::{tensor::{DType, Tensor}, Device};
    /// let t = Tensor::arange(0.0, 10.0, 1.0, DType::I32, Device::CPU)?;
    /// assert_eq!(t.to_string(), "Tensor[10] i32 on cpu:0\n[0, 1, 2, ..., 7, 8, 9]");
    /// # Ok::<(), unirt::Error>(())
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor{:?} {} on {}",
            self.shape(),
            self.dtype,
            self.device()
        )?;
        match self.preview() {
            Ok(p) => {
                f.write_str("\n")?;
                write_preview(f, &p, self.dtype.is_float())
            }
            Err(e) => write!(f, " <values unavailable: {e}>"),
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({:?}, {}, {}, {:?})",
            self.shape(),
            self.dtype,
            self.device(),
            self.layout
        )
    }
}

/// Writes `s` `count` times.
fn repeat(f: &mut fmt::Formatter<'_>, s: &str, count: usize) -> fmt::Result {
    (0..count).try_for_each(|_| f.write_str(s))
}

/// Writes the preview as nested lists, stepping a multi-index over the printed entries like an
/// odometer: each dimension that wraps closes its list and opens the next.
fn write_preview(f: &mut fmt::Formatter<'_>, p: &Preview, float: bool) -> fmt::Result {
    let value = |f: &mut fmt::Formatter<'_>, i: usize| match p.values.get(i) {
        Some(x) if float => write!(f, "{x:.4}"),
        Some(x) => write!(f, "{x}"),
        None => f.write_str("?"),
    };
    let rank = p.shape.len();
    if rank == 0 {
        return value(f, 0);
    }
    // An empty dimension ends the nesting: the entries before it print as empty lists.
    let depth = p.shape.iter().position(|&n| n == 0).unwrap_or(rank);
    if depth == 0 {
        return f.write_str("[]");
    }
    let mut index = vec![0usize; depth];
    repeat(f, "[", depth)?;
    let mut leaf = 0;
    loop {
        if depth < rank {
            f.write_str("[]")?;
        } else {
            value(f, leaf)?;
        }
        let mut closed = 0;
        let mut d = depth;
        let advanced = loop {
            if d == 0 {
                break None;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < p.shape[d] {
                break Some(d);
            }
            index[d] = 0;
            closed += 1;
        };
        let Some(d) = advanced else {
            return repeat(f, "]", depth);
        };
        repeat(f, "]", closed)?;
        f.write_str(", ")?;
        if leaf + 1 == PREVIEW_VALUES {
            f.write_str("...")?;
            return repeat(f, "]", depth - closed);
        }
        if p.clipped[d] && index[d] == PREVIEW_EDGE {
            f.write_str("..., ")?;
        }
        repeat(f, "[", closed)?;
        leaf += 1;
    }
}
