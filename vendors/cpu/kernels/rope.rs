//! Rotary embedding: the angles `pos · theta^(−2i/d)` are computed in f64 and rounded to f32
//! cos/sin, then every (position, head) row rotates in f32; contiguous f32 rows are read and
//! written in place, others go through a buffer.
//!
//! The cos/sin of positions `0..P` are kept in a process-wide table per `(theta, d)`, grown
//! on demand and shared by every launch, as inference engines keep a rotary cache: computing
//! them (two libm calls per pair) cost more than the rotation itself. Positions outside the
//! table's bound are computed per launch, one position at a time, with the same arithmetic,
//! so both ways give the same bits.

use std::sync::{Arc, Mutex};

use super::util::{
    floats, gather, par_chunks, read_index, scatter, simd, stream_fence, streams, try_par_chunks,
    write_streaming_unfenced, Float, Lanes, Ptr, Scratch,
};
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelRegistry, Params};
use crate::tensor::DType;

/// Rotates the pairs of one row by the angles whose cosines and sines are `c` and `sn`.
#[inline(always)]
fn rotate(buf: &mut [f32], c: &[f32], sn: &[f32], interleaved: bool) {
    if interleaved {
        for ((p, &c), &sn) in buf.chunks_exact_mut(2).zip(c).zip(sn) {
            let (x0, x1) = (p[0], p[1]);
            p[0] = x0 * c - x1 * sn;
            p[1] = x0 * sn + x1 * c;
        }
    } else {
        let (lo, hi) = buf.split_at_mut(c.len());
        for (((x0, x1), &c), &sn) in lo.iter_mut().zip(hi.iter_mut()).zip(c).zip(sn) {
            let (a, b) = (*x0, *x1);
            *x0 = a * c - b * sn;
            *x1 = a * sn + b * c;
        }
    }
}

/// As [`rotate`], reading the row from `x` and writing it to `o` (distinct, same length).
#[inline(always)]
fn rotate_to(x: &[f32], o: &mut [f32], c: &[f32], sn: &[f32], interleaved: bool) {
    let h = c.len();
    if interleaved {
        for (((p, q), &c), &sn) in x.chunks_exact(2).zip(o.chunks_exact_mut(2)).zip(c).zip(sn) {
            let (x0, x1) = (p[0], p[1]);
            q[0] = x0 * c - x1 * sn;
            q[1] = x0 * sn + x1 * c;
        }
    } else {
        let ((xl, xh), (ol, oh)) = (x.split_at(h), o.split_at_mut(h));
        for ((((a, b), (y0, y1)), &c), &sn) in
            xl.iter().zip(xh).zip(ol.iter_mut().zip(oh)).zip(c).zip(sn)
        {
            *y0 = a * c - b * sn;
            *y1 = a * sn + b * c;
        }
    }
    // An odd last element has no partner and stays as it is. (Checked first: a copy of
    // nothing is still a call to memmove, once per row.)
    if x.len() > 2 * h {
        o[2 * h..].copy_from_slice(&x[2 * h..]);
    }
}

/// Most bytes one angle table may hold (cos and sin): 16 Ki positions at head dim 128.
const TABLE_BYTES: usize = 8 << 20;
/// Most `(theta, d)` tables kept; the oldest goes first.
const TABLES_KEPT: usize = 4;

/// cos and sin of `p · inv_freq[i]` for positions `p < positions`, row-major by position.
struct AngleTable {
    positions: usize,
    cos: Scratch,
    sin: Scratch,
}

/// A table's key: theta's bits and the head dim.
type TableKey = (u64, usize);

/// The tables kept, oldest first.
static TABLES: Mutex<Vec<(TableKey, Arc<AngleTable>)>> = Mutex::new(Vec::new());

/// The f32 cos and sin of position `p` (one row of a table; the on-the-fly path too).
#[inline]
fn angles(p: f64, inv_freq: &[f64], c: &mut [f32], sn: &mut [f32]) {
    for ((c, sn), &f) in c.iter_mut().zip(sn.iter_mut()).zip(inv_freq) {
        let (si, co) = (p * f).sin_cos();
        (*c, *sn) = (co as f32, si as f32);
    }
}

/// A table covering positions `0..needed` for `(theta, d)`, built (in parallel, outside the
/// lock) when none is large enough; `None` when it would exceed [`TABLE_BYTES`].
fn angle_table(theta: f64, d: usize, inv_freq: &[f64], needed: usize) -> Option<Arc<AngleTable>> {
    let half = inv_freq.len();
    let max_positions = TABLE_BYTES / (half * 8).max(1);
    if half == 0 || needed > max_positions {
        return None;
    }
    let key = (theta.to_bits(), d);
    // A poisoned lock only means a panic elsewhere while it was held; the list stays valid.
    let lock = || TABLES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, t)) = lock().iter().find(|(k, _)| *k == key) {
        if t.positions >= needed {
            return Some(t.clone());
        }
    }
    let positions = needed.next_power_of_two().clamp(256, max_positions);
    let (mut cos, mut sin) = (
        Scratch::zeroed(positions * half).ok()?,
        Scratch::zeroed(positions * half).ok()?,
    );
    let (c, sn) = (Ptr(cos.as_mut_ptr()), Ptr(sin.as_mut_ptr()));
    par_chunks(positions, half * 8, |rows| {
        for p in rows {
            // SAFETY: rows of `half` values below `positions`, inside both tables; each task
            // writes its own rows.
            let (c, sn) = unsafe {
                (
                    std::slice::from_raw_parts_mut(c.at(p * half), half),
                    std::slice::from_raw_parts_mut(sn.at(p * half), half),
                )
            };
            angles(p as f64, inv_freq, c, sn);
        }
    });
    let table = Arc::new(AngleTable {
        positions,
        cos,
        sin,
    });
    let mut tables = lock();
    tables.retain(|(k, t)| *k != key || t.positions > positions);
    if let Some((_, t)) = tables.iter().find(|(k, _)| *k == key) {
        return Some(t.clone()); // another launch built a larger one meanwhile
    }
    if tables.len() >= TABLES_KEPT {
        tables.remove(0);
    }
    tables.push((key, table.clone()));
    Some(table)
}

fn rope<T: Float>(call: &KernelCall<'_>) -> Result<()> {
    let Params::Rope { interleaved, theta } = *call.params else {
        return Err(Error::Internal(format!(
            "rope: parameters {:?}",
            call.params
        )));
    };
    let (x, pos, out) = (&call.inputs[0], &call.inputs[1], &call.outputs[0]);
    let nd = x.layout.ndim();
    let (seq, heads, d) = (
        x.layout.shape()[nd - 3],
        x.layout.shape()[nd - 2],
        x.layout.shape()[nd - 1],
    );
    let half = d / 2;
    // theta^(-2i/d) once per launch; each task computes a position's cos/sin (in f64) when
    // its rows reach that position, so the angles are computed in parallel and the heads of
    // one position share them.
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| theta.powf(-2.0 * i as f64 / d as f64))
        .collect();
    let pos_stride = pos.layout.strides().first().copied().unwrap_or(0);
    // SAFETY: elements 0..seq of the checked position view.
    let ids: Vec<i64> = (0..seq)
        .map(|s| unsafe { read_index(pos, s * pos_stride) })
        .collect();
    // A single row computes its one position itself: a table (≥ 256 positions) would cost
    // more than it saves.
    let table = match ids.iter().min().zip(ids.iter().max()) {
        Some((&lo, &hi)) if lo >= 0 && seq * heads > 1 => {
            angle_table(theta, d, &inv_freq, hi as usize + 1)
        }
        _ => None,
    };
    let lanes = Lanes::new([&out.layout, &x.layout], nd - 1);
    let in_place_f32 = T::DTYPE == DType::F32 && lanes.stride == [1, 1] && d > 0;
    // A large output (past the last-level cache's share) is written with non-temporal
    // stores, row by row from a buffer in L1: a plain store first reads each line it writes.
    let stream = in_place_f32 && streams(out.layout.numel() * 4);
    let (po, px) = (Ptr::<T>::of(out), Ptr::<T>::of(x));
    // One vector-compiled body per task: a row (64 pairs at head dim 128) is too short to
    // pay for entering the vector code once per row.
    try_par_chunks(lanes.count(), d, |range| {
        let mut own = (Scratch::zeroed(half)?, Scratch::zeroed(half)?);
        let mut buf = Scratch::zeroed(if in_place_f32 && !stream { 0 } else { d })?;
        simd!({
            let mut angles_of = usize::MAX;
            // The next row's head and sequence index, counted along rather than divided out
            // of the row's index (as `walk` counts the offsets).
            let (heads, seq) = (heads.max(1), seq.max(1)); // empty tensors have no rows
            let (mut head, mut next_s) = (range.start % heads, (range.start / heads) % seq);
            for (_, [oo, ox], _) in lanes.walk(range) {
                let s = next_s;
                head += 1;
                if head == heads {
                    head = 0;
                    next_s = if s + 1 == seq { 0 } else { s + 1 };
                }
                let (c, sn): (&[f32], &[f32]) = match &table {
                    Some(t) => {
                        let at = ids[s] as usize * half;
                        (&t.cos[at..at + half], &t.sin[at..at + half])
                    }
                    None => {
                        if s != angles_of {
                            angles(ids[s] as f64, &inv_freq, &mut own.0, &mut own.1);
                            angles_of = s;
                        }
                        (&own.0, &own.1)
                    }
                };
                if in_place_f32 {
                    // SAFETY: T is f32 (checked above); row l of both checked views is a
                    // contiguous run of d elements; the plan lets the output overlap the input
                    // only as the very same view, so the rows are identical (one slice) or
                    // disjoint (two).
                    unsafe {
                        let (o, xr) = (po.at(oo) as *mut f32, px.at(ox) as *const f32);
                        let orow = std::slice::from_raw_parts_mut(o, d);
                        if std::ptr::eq(o, xr) {
                            rotate(orow, c, sn, interleaved);
                        } else if stream {
                            let xrow = std::slice::from_raw_parts(xr, d);
                            rotate_to(xrow, &mut buf, c, sn, interleaved);
                            write_streaming_unfenced(
                                orow,
                                true,
                                #[inline(always)]
                                |s, dst| dst.copy_from_slice(&buf[s..s + dst.len()]),
                            );
                        } else {
                            let xrow = std::slice::from_raw_parts(xr, d);
                            rotate_to(xrow, orow, c, sn, interleaved);
                        }
                    }
                    continue;
                }
                // SAFETY: row l of both checked views; read whole before writing.
                unsafe { gather(px.at(ox), lanes.stride[1], &mut buf) };
                rotate(&mut buf, c, sn, interleaved);
                // SAFETY: as above.
                unsafe { scatter(&buf, po.at(oo), lanes.stride[0]) };
            }
            if stream {
                stream_fence();
            }
        });
        Ok(())
    })?;
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, "rope", rope);
}

#[cfg(test)]
mod tests {
    use crate::tensor::{DType, Tensor};

    /// A position past the table's bound (16 Ki at head dim 128) is computed per launch; a
    /// negative one too. Both must give the bits the table gives for the same position.
    #[test]
    fn table_and_per_launch_angles_agree() -> crate::Result<()> {
        let cpu = "cpu:0".parse()?;
        for interleaved in [false, true] {
            let x = Tensor::rand_uniform(&[3, 2, 128], -1.0, 1.0, 9, DType::F32, cpu)?;
            let far = Tensor::from_slice(&[1000i64, 1 << 20, -3], &[3], cpu)?;
            let near = Tensor::from_slice(&[1000i64, 1001, 1002], &[3], cpu)?;
            let a = x.rope(&far, 1e4, interleaved)?.to_vec::<f32>()?;
            let b = x.rope(&near, 1e4, interleaved)?.to_vec::<f32>()?;
            // Row 0 is position 1000 both ways: per launch in `a`, from the table in `b`.
            assert_eq!(a[..256], b[..256]);
            assert_ne!(a[256..512], b[256..512]);
        }
        Ok(())
    }
}
