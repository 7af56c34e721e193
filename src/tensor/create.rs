//! Tensors made from values: [`Tensor::full`] (and zeros, ones), [`Tensor::from_f64`],
//! [`Tensor::arange`] and the seeded random ones.
//!
//! **Host memory stays bounded.** The device memory is allocated first, so a tensor too large
//! for the device is its typed error before any host work; the values are then written in
//! stages of at most [`STAGE_BYTES`] (or by a memset, for a value whose bytes are all equal:
//! zeros). Building the whole tensor on the host first made a 2⁴⁰-element `zeros` abort the
//! process — Rust aborts when an allocation is refused — and a tensor larger than host memory
//! impossible to create on a device that could hold it.

use super::{encode, DType, SplitMix64, Tensor};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::hal::{Backend, DevicePtr};
use crate::hostmem::host_vec;
use crate::stream::BackendExt;
use crate::tensor::checked_numel;

/// Host bytes a constructor encodes values into at a time (about the size past which one
/// host-to-device copy runs at full speed on every backend).
pub(crate) const STAGE_BYTES: usize = 8 << 20;

impl Tensor {
    /// Every element `value` (converted to `dtype` as [`encode`] does).
    ///
    /// ```
    /// # use unirt::tensor::{DType, Tensor};
    /// let t = Tensor::full(&[2, 3], 1.5, DType::F32, "cpu:0".parse()?)?;
    /// assert_eq!(t.to_vec::<f32>()?, [1.5; 6]);
    /// # Ok::<(), unirt::Error>(())
    /// ```
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        let t = Tensor::empty(shape, dtype, device)?;
        let mut one = Vec::new();
        encode(dtype, value, &mut one);
        if one.iter().all(|&b| b == one[0]) {
            t.memset_fresh(one[0])?;
        } else {
            // One stage's worth of the pattern, copied into each stage.
            let block = one.repeat((STAGE_BYTES / one.len()).min(t.numel()));
            t.write_staged(|buf, count| buf.extend_from_slice(&block[..count * one.len()]))?;
        }
        Ok(t)
    }

    /// Every element zero.
    pub fn zeros(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
    }

    /// Every element one.
    pub fn ones(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// A tensor whose elements are `values` converted to `dtype` (rounding as
    /// [`Element::from_f64`](super::Element::from_f64)).
    pub fn from_f64(
        values: &[f64],
        shape: &[usize],
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        if checked_numel(shape) != Some(values.len()) {
            return Err(Error::ShapeMismatch {
                op: "from_f64 (element count)".into(),
                expected: shape.to_vec(),
                got: vec![values.len()],
            });
        }
        let mut next = values.iter().copied();
        Tensor::from_fn(shape, dtype, device, || next.next().unwrap_or(0.0))
    }

    /// `start, start + step, …` below `end` (above it for a negative step), 1-D.
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType, device: Device) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(Error::BadParam(format!(
                "arange step {step} from {start} to {end}"
            )));
        }
        // Saturates to usize::MAX for a count no tensor holds, which `empty` refuses.
        let n = ((end - start) / step).ceil().max(0.0) as usize;
        let mut i = 0usize;
        Tensor::from_fn(&[n], dtype, device, || {
            let v = start + i as f64 * step;
            i += 1;
            v
        })
    }

    /// Uniform random values in `[low, high)` from `seed`: the same values on every device
    /// (generated on the host with [`SplitMix64`], then uploaded).
    pub fn rand_uniform(
        shape: &[usize],
        low: f64,
        high: f64,
        seed: u64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let mut rng = SplitMix64::new(seed);
        Tensor::from_fn(shape, dtype, device, || low + (high - low) * rng.next_f64())
    }

    /// Normal random values (`mean`, `std`) from `seed`, the same on every device.
    pub fn rand_normal(
        shape: &[usize],
        mean: f64,
        std: f64,
        seed: u64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let mut rng = SplitMix64::new(seed);
        Tensor::from_fn(shape, dtype, device, || mean + std * rng.next_normal())
    }

    /// A contiguous tensor whose elements, in row-major order, are the values `next` returns
    /// one after another, converted to `dtype` as [`encode`] does.
    fn from_fn(
        shape: &[usize],
        dtype: DType,
        device: Device,
        mut next: impl FnMut() -> f64,
    ) -> Result<Tensor> {
        let t = Tensor::empty(shape, dtype, device)?;
        t.write_staged(|buf, count| {
            for _ in 0..count {
                encode(dtype, next(), buf);
            }
        })?;
        Ok(t)
    }

    /// Sets every byte of this fresh contiguous tensor to `byte`, once the work queued on its
    /// memory has finished ([`settle`](Tensor::settle)).
    fn memset_fresh(&self, byte: u8) -> Result<()> {
        if self.nbytes() == 0 {
            return Ok(());
        }
        self.settle()?;
        self.storage
            .rt
            .backend()
            .memset(DevicePtr(self.start_addr()), byte, self.nbytes())
    }

    /// Writes this fresh contiguous tensor's elements in order, [`STAGE_BYTES`] at a time:
    /// `encode_next(buf, count)` appends the next `count` elements' bytes to the (emptied)
    /// buffer, which is then copied to its place, after the work queued on the memory.
    fn write_staged(&self, mut encode_next: impl FnMut(&mut Vec<u8>, usize)) -> Result<()> {
        let (n, size) = (self.numel(), self.dtype.size());
        if n == 0 {
            return Ok(());
        }
        let per_stage = (STAGE_BYTES / size).min(n);
        let mut buf = host_vec(per_stage * size, 0u8, "a tensor's staged values")?;
        self.settle()?;
        let backend = self.storage.rt.backend();
        let mut done = 0;
        while done < n {
            let count = per_stage.min(n - done);
            buf.clear();
            encode_next(&mut buf, count);
            if buf.len() != count * size {
                return Err(Error::Internal(format!(
                    "staged {} bytes for {count} elements of {:?}",
                    buf.len(),
                    self.dtype
                )));
            }
            let at = self.start_addr() + (done * size) as u64;
            backend.copy_to_device(DevicePtr(at), &buf)?;
            done += count;
        }
        Ok(())
    }
}
