//! Moving a tensor's values: contiguous copies, copies to another device, reads to the host
//! and writes from it.

use super::{decode, DType, Element, Tensor};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::hal::DevicePtr;
use crate::hostmem::host_vec;
use crate::stream::BackendExt;

impl Tensor {
    /// This tensor if it is contiguous, else a contiguous copy.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() && self.layout.offset() == 0 {
            return Ok(self.clone());
        }
        crate::ops::rearrange::copy(&self.desc())?.run1(&[self])
    }

    /// A contiguous copy on `device`: a device-to-device copy on one device, through the
    /// host between two devices.
    pub fn to(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return crate::ops::rearrange::copy(&self.desc())?.run1(&[self]);
        }
        let bytes = self.to_bytes()?;
        Tensor::from_bytes(&bytes, self.shape(), self.dtype, device)
    }

    /// The elements in row-major order as little-endian bytes (waits for pending work).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.read_as("a tensor's bytes")
    }

    /// The elements in row-major order; `T` must be the tensor's dtype
    /// ([`Error::DTypeMismatch`] otherwise). Read straight into the returned vector.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_element::<T>("to_vec")?;
        self.read_as("a tensor's values")
    }

    /// The view's elements in row-major order, read into a vector of `T` (`u8`, or the
    /// dtype's own element type) once pending work has run.
    fn read_as<T: bytemuck::Pod>(&self, why: &str) -> Result<Vec<T>> {
        // A tensor a graph recording produced holds no values yet.
        crate::graph::record::check_host_read(self)?;
        // Copied now even while this thread records: a recorded copy would hold no values.
        let t = crate::graph::record::suspended(|| self.contiguous())?;
        t.settle()?;
        let n = t.nbytes() / std::mem::size_of::<T>();
        let mut out = host_vec(n, T::zeroed(), why)?;
        if !out.is_empty() {
            t.storage.rt.backend().copy_to_host(
                bytemuck::cast_slice_mut(&mut out),
                DevicePtr(t.start_addr()),
            )?;
        }
        Ok(out)
    }

    /// The elements converted to `f64`, in row-major order.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        let bytes = self.to_bytes()?;
        let mut out = host_vec(self.numel(), 0f64, "a tensor's values as f64")?;
        for (v, b) in out.iter_mut().zip(bytes.chunks_exact(self.dtype.size())) {
            *v = decode(self.dtype, b);
        }
        Ok(out)
    }

    /// Writes `data` — the elements in row-major order over this tensor's shape, `T` its
    /// dtype — into this tensor's view, in stream order: after the work this thread's stream
    /// and other threads' streams queued on the tensor, and seen by everything queued after
    /// the call returns. A contiguous view is written in place by one host-to-device copy (no
    /// allocation, no kernel); a strided view through a device copy from a staged contiguous
    /// tensor.
    ///
    /// A broadcast view (an element repeated in memory) is refused with [`Error::Aliasing`],
    /// as a copy into it is. Refused with [`Error::Capturing`] while this thread records a
    /// graph on the tensor's device: a replay cannot repeat a host write made at record time (write it inside a
    /// [`host_op`](crate::graph::host_op), which every run repeats).
    ///
    /// ```
    /// # use unirt::tensor::{DType, Tensor};
    /// let t = Tensor::zeros(&[2, 2], DType::F32, "cpu:0".parse()?)?;
    /// t.copy_from_slice(&[1.0f32, 2.0, 3.0, 4.0])?;
    /// t.narrow(1, 1, 1)?.copy_from_slice(&[20.0f32, 40.0])?; // a strided view: column 1
    /// assert_eq!(t.to_vec::<f32>()?, [1.0, 20.0, 3.0, 40.0]);
    /// # Ok::<(), unirt::Error>(())
    /// ```
    pub fn copy_from_slice<T: Element>(&self, data: &[T]) -> Result<()> {
        self.check_element::<T>("copy_from_slice")?;
        if data.len() != self.numel() {
            return Err(Error::ShapeMismatch {
                op: "copy_from_slice (element count)".into(),
                expected: self.shape().to_vec(),
                got: vec![data.len()],
            });
        }
        if self.dtype == DType::Bool && bytemuck::cast_slice::<T, u8>(data).iter().any(|&b| b > 1) {
            return Err(Error::BadParam(
                "copy_from_slice into a bool tensor: every value must be 0 or 1".into(),
            ));
        }
        if crate::graph::record::is_recording(self.device()) {
            return Err(Error::Capturing(
                "copy_from_slice while recording a graph on this device: a replay cannot \
                 repeat a host write made at record time (write inside graph::host_op)"
                    .into(),
            ));
        }
        if data.is_empty() {
            return Ok(());
        }
        if !self.is_contiguous() {
            // Staged in the tensor's own dtype (bool written as u8 stays bool).
            let staged = Tensor::from_bytes(
                bytemuck::cast_slice(data),
                self.shape(),
                self.dtype,
                self.device(),
            )?;
            return self.copy_from(&staged);
        }
        self.upload(bytemuck::cast_slice(data))
    }

    /// Writes `bytes` at the start of this (contiguous) view, once the work queued on its
    /// memory has finished; the copy has landed when this returns.
    pub(super) fn upload(&self, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.settle()?;
        self.storage
            .rt
            .backend()
            .copy_to_device(DevicePtr(self.start_addr()), bytes)
    }

    /// Waits, on the host, for the work queued on this tensor's memory: the memory may be a
    /// block that earlier work on this thread's stream, or another thread's, still uses.
    pub(super) fn settle(&self) -> Result<()> {
        let rt = &self.storage.rt;
        self.order_on(rt.stream()?)?;
        rt.sync_stream()
    }

    /// The device address of the view's first element.
    pub(super) fn start_addr(&self) -> u64 {
        self.base_addr() + (self.layout.offset() * self.dtype.size()) as u64
    }

    /// Refuses host values of `T` for this tensor unless `T` is its dtype (`u8` stands for
    /// bool).
    fn check_element<T: Element>(&self, op: &str) -> Result<()> {
        if T::DTYPE == self.dtype || (self.dtype == DType::Bool && T::DTYPE == DType::U8) {
            return Ok(());
        }
        Err(Error::DTypeMismatch {
            op: op.into(),
            expected: self.dtype,
            got: T::DTYPE,
        })
    }
}
