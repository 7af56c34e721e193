//! Scratch memory aligned to a cache line. A kernel's own f32 buffers (blocks that a fused
//! chain passes through, rows converted from f16, rotary angle tables) are read and written
//! with full-width vector instructions; the allocator aligns a `Vec<f32>` to 16 bytes only
//! (glibc puts a large one 16 bytes past a page), so a 64-byte vector access into one
//! crosses two cache lines — every second 32-byte half does. Measured on the 2-vCPU EPYC VM:
//! a 4-step fused chain over 16 MiB ran 1.4–1.7× slower with its blocks 16 or 48 bytes off a
//! line than on one (one process, offsets switched per replay).

use std::ops::{Deref, DerefMut};

use crate::device::DeviceKind;
use crate::error::{Error, Result};

/// Bytes in a cache line on the CPUs unirt's kernels are tuned for (x86-64, AArch64).
pub const LINE: usize = 64;

/// `B` f32 values starting on a cache line: a fixed block on the stack or in a `Vec`.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct AlignedBlock<const B: usize>(pub [f32; B]);

impl<const B: usize> AlignedBlock<B> {
    pub const ZERO: Self = AlignedBlock([0.0; B]);
}

impl<const B: usize> Deref for AlignedBlock<B> {
    type Target = [f32; B];
    #[inline(always)]
    fn deref(&self) -> &[f32; B] {
        &self.0
    }
}

impl<const B: usize> DerefMut for AlignedBlock<B> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [f32; B] {
        &mut self.0
    }
}

/// One cache line of f32s, the unit a [`Scratch`] is allocated in.
type Line = AlignedBlock<{ LINE / 4 }>;

/// A zeroed f32 buffer of run-time length whose first element starts a cache line (a
/// `vec![0f32; n]` that vector code may read and write at full width).
pub struct Scratch {
    lines: Vec<Line>,
    len: usize,
}

impl Scratch {
    /// `len` zeroed f32s, or `OutOfMemory` where the host cannot back them (see `meminfo`):
    /// inside a parallel loop, through [`try_par_chunks`](super::try_par_chunks).
    pub fn zeroed(len: usize) -> Result<Self> {
        let lines = len.div_ceil(LINE / 4);
        let bytes = lines.checked_mul(LINE).map(|b| b as u64);
        let refused = |why: String| Error::OutOfMemory {
            backend: DeviceKind::Cpu,
            device: "host".into(),
            requested: bytes.unwrap_or(u64::MAX),
            detail: format!("a kernel's scratch of {len} f32 values: {why}"),
        };
        let bytes = bytes.ok_or_else(|| refused("more than the address space".into()))?;
        crate::meminfo::check_backable(bytes).map_err(refused)?;
        let mut v = Vec::new();
        v.try_reserve_exact(lines)
            .map_err(|e| refused(e.to_string()))?;
        v.resize(lines, Line::ZERO);
        Ok(Scratch { lines: v, len })
    }
}

/// Refuses, as `OutOfMemory`, `bytes` of scratch for each thread of a kernel's parallel loop
/// where the host cannot back them all: each thread's own check would pass while the host
/// reports the others' buffers as still free, so a kernel whose scratch grows with a dimension
/// that no output holds — attention's keys, the logits of a sampled row, both possibly
/// broadcast views of 2^40 elements — asks for the loop's total before it.
pub fn check_per_thread(op: &str, bytes: usize) -> Result<()> {
    let threads = crate::host_threads::threads() + 1;
    let total = bytes.checked_mul(threads).map(|b| b as u64);
    let why = match total.map(crate::meminfo::check_backable) {
        Some(Ok(())) => return Ok(()),
        Some(Err(why)) => why,
        None => "more than the address space".into(),
    };
    Err(Error::OutOfMemory {
        backend: DeviceKind::Cpu,
        device: "host".into(),
        requested: total.unwrap_or(u64::MAX),
        detail: format!("{op}: scratch of {bytes} bytes for each of {threads} threads ({why})"),
    })
}

impl Deref for Scratch {
    type Target = [f32];
    #[inline(always)]
    fn deref(&self) -> &[f32] {
        // SAFETY: `lines` holds `lines.len() * 16 ≥ len` contiguous f32s (a Line is a
        // repr(C) array of 16 f32s, 64 bytes, no padding), initialised at creation.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }
}

impl DerefMut for Scratch {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`; the borrow of self is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_is_line_aligned_zeroed_and_sized() {
        for len in [0, 1, 15, 16, 17, 1000, 70_000] {
            let mut s = Scratch::zeroed(len).expect("a small scratch");
            assert_eq!(s.len(), len);
            assert!((s.as_ptr() as usize).is_multiple_of(LINE));
            assert!(s.iter().all(|&x| x == 0.0));
            s.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
            assert_eq!(s.last().copied(), len.checked_sub(1).map(|l| l as f32));
        }
        // A length no host can back is an error, not an abort.
        for len in [usize::MAX, 1 << 60] {
            let e = Scratch::zeroed(len).err().expect("refused");
            assert_eq!(e.kind_name(), "out_of_memory");
        }
        assert_eq!(
            check_per_thread("t", 1 << 62).unwrap_err().kind_name(),
            "out_of_memory"
        );
        assert!(check_per_thread("t", 4096).is_ok());
        let blocks = vec![AlignedBlock::<256>::ZERO; 3];
        assert!(blocks
            .iter()
            .all(|b| (b.as_ptr() as usize).is_multiple_of(LINE)));
    }
}
