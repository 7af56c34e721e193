//! [`Tensor`]: storage from a device's caching allocator, a [`Layout`] and a [`DType`].
//!
//! Views (narrow, permute, transpose, reshape, broadcast, squeeze, unsqueeze) share the
//! storage and copy nothing; [`Tensor::contiguous`] and [`Tensor::to`] copy. Work on tensors
//! runs on the calling thread's stream of the tensor's device (see [`crate::context`]), so
//! eager operations queue up asynchronously and [`Tensor::to_vec`] waits for them.
//!
//! **Tensors cross threads safely.** Each storage remembers the stream that last used it;
//! work from another thread (another stream) on the same storage first waits, on the device,
//! for what that stream has queued, and the allocator does not reuse the memory before the
//! newer stream is done with it. So a tensor computed on one thread and read, used or dropped
//! on another sees the finished values — without a synchronisation by the producer. Uses of
//! one storage from two threads *at the same moment* are still the caller's race, as with any
//! shared mutable data; and a stream capture does not wait for work outside it (a capture is
//! isolated, CUDA's rule).
//!
//! ```
//! use unirt::{tensor::{DType, Tensor}, Device};
//! let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32, Device::CPU)?.reshape(&[2, 3])?;
//! let t = x.transpose(0, 1)?;                       // a view: shape [3, 2], no copy
//! assert_eq!(t.shape(), [3, 2]);
//! assert_eq!(t.to_vec::<f32>()?, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
//! let y = x.mul(&x)?.sum(&[1], false)?;             // [0+1+4, 9+16+25]
//! assert_eq!(y.to_vec::<f32>()?, [5.0, 50.0]);
//! # Ok::<(), unirt::Error>(())
//! ```

mod create;
mod display;
mod dtype;
mod layout;
mod random;
mod transfer;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use dtype::{decode, encode, DType, Element};
pub use layout::{
    broadcast_shapes, checked_numel, contiguous_strides, merge_dims, normalize_axis, shape_fits,
    Layout,
};
pub use random::SplitMix64;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::hal::{Backend, EventFlags, StreamId};
use crate::memory::Memory;
use crate::ops::TensorDesc;
use crate::runtime::Runtime;

struct Storage {
    mem: Memory,
    rt: Arc<Runtime>,
    /// The raw id of the stream that last used the memory ([`NO_STREAM`] for none); see the
    /// module docs and [`Tensor::order_on`].
    last_stream: AtomicU64,
}

/// No stream has used a storage yet.
const NO_STREAM: u64 = u64::MAX;

impl Storage {
    /// [`Tensor::order_on`] when the stream changes: `stream` waits for the work the last
    /// stream queued, and the allocator learns that `stream` uses the memory.
    #[cold]
    fn order_changed(&self, last: u64, stream: StreamId) -> Result<()> {
        // A capture takes no dependency on work outside it (CUDA refuses one); the capturing
        // thread made or synchronised what it captures over.
        if self.rt.capturing_on(stream) {
            return Ok(());
        }
        if last != NO_STREAM {
            wait_for_stream(&self.rt, StreamId(last), stream)?;
        }
        self.mem.record_stream(stream)?;
        self.last_stream.store(stream.0, Ordering::Release);
        Ok(())
    }
}

/// Makes future work on `stream` wait for the work queued on `prev` so far, through an event
/// (no host wait). The host waits for the device instead when `prev` no longer exists (its
/// thread exited; its queued work still runs) or is capturing (an event recorded there would
/// go into the capture; the device wait covers the work it queued before the capture).
fn wait_for_stream(rt: &Runtime, prev: StreamId, stream: StreamId) -> Result<()> {
    let backend = &**rt.backend();
    let ev = backend.event_create(EventFlags::DISABLE_TIMING)?;
    let waited = match rt.record_outside_capture(ev, prev) {
        Ok(true) => backend.stream_wait_event(stream, ev),
        Ok(false) => backend.synchronize(),
        Err(Error::InvalidHandle { kind, .. }) if kind == StreamId::KIND => backend.synchronize(),
        Err(e) => Err(e),
    };
    // A wait already enqueued keeps what the event recorded.
    let destroyed = backend.event_destroy(ev);
    waited.and(destroyed)
}

/// An n-dimensional array on a device. Cloning shares the storage.
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    layout: Layout,
    dtype: DType,
}

impl Tensor {
    /// An uninitialised contiguous tensor (memory from the device's caching allocator).
    pub fn empty(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        // Every partial product fits (so the element count and byte size do too).
        if !shape_fits(shape, dtype.size()) {
            return Err(Error::TooLarge {
                device: device.to_string(),
                requested: u64::MAX,
                limit: isize::MAX as u64,
            });
        }
        let bytes = shape.iter().product::<usize>() * dtype.size();
        let rt = Runtime::get(device)?;
        let stream = rt.stream()?;
        let mem = rt.allocate_memory(bytes)?;
        Ok(Tensor {
            storage: Arc::new(Storage {
                mem,
                rt,
                last_stream: AtomicU64::new(stream.0),
            }),
            layout: Layout::contiguous(shape),
            dtype,
        })
    }

    /// A contiguous tensor holding little-endian `bytes` of `dtype`.
    pub fn from_bytes(
        bytes: &[u8],
        shape: &[usize],
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let n = checked_numel(shape).unwrap_or(usize::MAX);
        if n.checked_mul(dtype.size()) != Some(bytes.len()) {
            return Err(Error::ShapeMismatch {
                op: "from_bytes (element count)".into(),
                expected: shape.to_vec(),
                got: vec![bytes.len() / dtype.size()],
            });
        }
        let t = Tensor::empty(shape, dtype, device)?;
        t.upload(bytes)?;
        Ok(t)
    }

    /// A contiguous tensor holding `data` (`shape` must have `data.len()` elements).
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: Device) -> Result<Tensor> {
        if checked_numel(shape) != Some(data.len()) {
            return Err(Error::ShapeMismatch {
                op: "from_slice (element count)".into(),
                expected: shape.to_vec(),
                got: vec![data.len()],
            });
        }
        Tensor::from_bytes(bytemuck::cast_slice(data), shape, T::DTYPE, device)
    }

    // ---- accessors ----

    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> Device {
        self.storage.mem.device()
    }

    pub fn ndim(&self) -> usize {
        self.layout.ndim()
    }

    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// Bytes the elements take when contiguous.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// The plan-time description of this tensor.
    pub fn desc(&self) -> TensorDesc {
        TensorDesc::new(self.device(), self.dtype, self.layout.clone())
    }

    /// The device address of the storage (element offset 0, not the view's first element).
    pub fn base_addr(&self) -> u64 {
        self.storage.mem.addr()
    }

    /// The runtime of the tensor's device.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.storage.rt
    }

    /// Whether two tensors share storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// Bytes of the storage this tensor views (all views of one storage share it).
    pub fn storage_bytes(&self) -> usize {
        self.storage.mem.size()
    }

    /// Another view of this tensor's storage with `layout` (offset in elements of `dtype`) and
    /// `dtype`: how a planned graph places its tensors in one arena. [`Error::BadTensorShape`]
    /// when the view reaches past the storage.
    pub fn view_storage(&self, layout: Layout, dtype: DType) -> Result<Tensor> {
        let end = layout.span_end().unwrap_or(layout.offset());
        let fits = end
            .checked_mul(dtype.size())
            .is_some_and(|b| layout.numel() == 0 || b <= self.storage_bytes());
        if !fits {
            return Err(Error::BadTensorShape(format!(
                "a {dtype} view {layout:?} reaches past a storage of {} bytes",
                self.storage_bytes()
            )));
        }
        Ok(Tensor {
            storage: self.storage.clone(),
            layout,
            dtype,
        })
    }

    /// Marks the storage as used by work on `stream` (see [`Memory::record_stream`]).
    pub fn record_stream(&self, stream: StreamId) -> Result<()> {
        self.storage.mem.record_stream(stream)
    }

    /// Orders work about to be enqueued on `stream` after the work the storage's last stream
    /// queued on it, when that is another stream (see the module docs), and makes `stream`
    /// its last. One atomic load when the stream is the same: every operator launch calls it
    /// for each operand.
    pub fn order_on(&self, stream: StreamId) -> Result<()> {
        let last = self.storage.last_stream.load(Ordering::Acquire);
        if last == stream.0 {
            return Ok(());
        }
        self.storage.order_changed(last, stream)
    }

    // ---- views ----

    fn view(&self, layout: Layout) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            layout,
            dtype: self.dtype,
        }
    }

    /// Indices `start..start + len` along `axis`.
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        Ok(self.view(self.layout.narrow(axis, start, len)?))
    }

    pub fn permute(&self, order: &[usize]) -> Result<Tensor> {
        Ok(self.view(self.layout.permute(order)?))
    }

    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        Ok(self.view(self.layout.transpose(a, b)?))
    }

    /// A view with another shape; [`Error::NotAView`] when the strides need a copy (call
    /// [`contiguous`](Self::contiguous) first).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        Ok(self.view(self.layout.reshape(shape)?))
    }

    /// A broadcast view (NumPy rules).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        Ok(self.view(self.layout.broadcast_to(shape)?))
    }

    /// Same as [`broadcast_to`](Self::broadcast_to).
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        self.broadcast_to(shape)
    }

    pub fn squeeze(&self, axis: isize) -> Result<Tensor> {
        Ok(self.view(self.layout.squeeze(axis)?))
    }

    pub fn unsqueeze(&self, axis: isize) -> Result<Tensor> {
        Ok(self.view(self.layout.unsqueeze(axis)?))
    }

    /// The backend's stream for this thread (where eager operations run).
    pub fn stream(&self) -> Result<StreamId> {
        self.storage.rt.stream()
    }

    /// Waits for the work queued on this thread's stream of the tensor's device, and for the
    /// work another thread's stream queued on this tensor's storage.
    pub fn synchronize(&self) -> Result<()> {
        let rt = &self.storage.rt;
        let stream = rt.stream()?;
        self.order_on(stream)?;
        rt.backend().stream_synchronize(stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_share_storage_and_copy_on_contiguous() -> Result<()> {
        let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32, Device::CPU)?.reshape(&[2, 3, 4])?;
        let v = x.permute(&[2, 0, 1])?.narrow(0, 1, 2)?;
        assert!(v.shares_storage(&x));
        let want: Vec<f32> = (1..3)
            .flat_map(|k| {
                (0..2).flat_map(move |i| (0..3).map(move |j| (i * 12 + j * 4 + k) as f32))
            })
            .collect();
        assert_eq!(v.to_vec::<f32>()?, want);
        let c = v.contiguous()?;
        assert!(!c.shares_storage(&x) && c.is_contiguous());
        assert!(matches!(v.reshape(&[12]), Err(Error::NotAView { .. })));
        assert!(matches!(
            x.to_vec::<i32>(),
            Err(Error::DTypeMismatch { .. })
        ));
        let s = format!(
            "{}",
            Tensor::arange(0.0, 10.0, 1.0, DType::I32, Device::CPU)?
        );
        assert!(s.contains("[0, 1, 2, ..., 7, 8, 9]"), "{s}");
        let e = Tensor::zeros(&[0, 3], DType::BF16, Device::CPU)?;
        assert_eq!(e.to_vec::<half::bf16>()?, []);
        Ok(())
    }

    #[test]
    fn random_is_seeded() -> Result<()> {
        let a =
            Tensor::rand_normal(&[100], 0.0, 1.0, 7, DType::F32, Device::CPU)?.to_vec::<f32>()?;
        let b =
            Tensor::rand_normal(&[100], 0.0, 1.0, 7, DType::F32, Device::CPU)?.to_vec::<f32>()?;
        let c =
            Tensor::rand_normal(&[100], 0.0, 1.0, 8, DType::F32, Device::CPU)?.to_vec::<f32>()?;
        assert_eq!(a, b);
        assert_ne!(a, c);
        Ok(())
    }
}
