//! Recording an operator graph from the eager Tensor API (InfiniCore's
//! `start_graph_recording` / `stop_graph_recording`).
//!
//! While the calling thread records on a device, every operator launched on that device
//! ([`Plan::launch`](crate::ops::Plan::launch), which the eager Tensor methods call) is
//! checked as usual and then added to the graph instead of running. The tensors the eager
//! methods return are real allocations that hold no values until the graph runs
//! ([`Runtime::run`](crate::Runtime::run) computes into them); reading one back to the host
//! while recording is an error ([`Error::Capturing`]). Tensors the recording did not produce
//! become external buffers (weights, inputs, state). Host work belongs in a host node:
//! [`host_op`].

use std::cell::{Cell, RefCell};

use super::graph::{BufferRole, Graph, GraphBuilder, HostFn};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ops::Plan;
use crate::tensor::Tensor;

thread_local! {
    /// The device being recorded (checked on every launch: one cheap read).
    static DEVICE: Cell<Option<Device>> = const { Cell::new(None) };
    static BUILDER: RefCell<Option<GraphBuilder>> = const { RefCell::new(None) };
    /// Set while `Plan::run` launches into outputs it has just allocated.
    static FRESH_OUTPUTS: Cell<bool> = const { Cell::new(false) };
}

/// Runs `launch` (a launch into freshly allocated outputs, as `Plan::run` makes) so that a
/// recording takes its outputs for intermediates of the graph; outputs of any other launch
/// the recording has not seen are external tensors the graph writes (state, `gemm_into`).
pub(crate) fn with_fresh_outputs<R>(launch: impl FnOnce() -> R) -> R {
    FRESH_OUTPUTS.with(|f| f.set(true));
    let r = launch();
    FRESH_OUTPUTS.with(|f| f.set(false));
    r
}

/// Whether the calling thread records an operator graph on `device`.
pub fn is_recording(device: Device) -> bool {
    DEVICE.with(|d| d.get() == Some(device))
}

/// The device the calling thread records on, if any.
pub fn recording_device() -> Option<Device> {
    DEVICE.with(|d| d.get())
}

/// Starts recording the calling thread's operators on `device`.
/// [`Error::Capturing`] if this thread already records.
pub fn start_recording(device: Device) -> Result<()> {
    if let Some(d) = recording_device() {
        return Err(Error::Capturing(format!(
            "this thread is already recording an operator graph on {d}"
        )));
    }
    BUILDER
        .try_with(|b| *b.borrow_mut() = Some(GraphBuilder::new(device)))
        .map_err(|_| Error::Unsupported {
            what: "recording an operator graph from a thread-local destructor (the exiting \
                   thread's recording state is gone)"
                .into(),
            backend: device.kind,
        })?;
    DEVICE.with(|d| d.set(Some(device)));
    Ok(())
}

/// Runs `f` with the calling thread's recording suspended, so that what it launches runs at
/// once. A host read of an external tensor that is not contiguous copies it first: recorded,
/// that copy joined the graph and the read returned the copy's memory before any run — values
/// the tensor never held.
pub(crate) fn suspended<R>(f: impl FnOnce() -> R) -> R {
    /// Puts the recording device back when `f` returns or unwinds.
    struct Resume(Option<Device>);
    impl Drop for Resume {
        fn drop(&mut self) {
            DEVICE.with(|d| d.set(self.0));
        }
    }
    let _resume = Resume(DEVICE.with(|d| d.take()));
    f()
}

/// Stops recording and returns the graph. [`Error::NotCapturing`] if this thread does not
/// record.
pub fn stop_recording() -> Result<Graph> {
    DEVICE.with(|d| d.set(None));
    let b = BUILDER
        .try_with(|b| b.borrow_mut().take())
        .ok()
        .flatten()
        .ok_or(Error::NotCapturing)?;
    b.build()
}

/// Records what `f` launches on `device` and returns the graph with `f`'s result. The
/// recording stops even when `f` fails (a `?` between [`start_recording`] and
/// [`stop_recording`] would leave the thread recording).
///
/// ```
/// use unirt::{graph, tensor::{DType, Tensor}, Device};
/// let x = Tensor::full(&[3], 2.0, DType::F32, Device::CPU)?;
/// let (g, y) = graph::record(Device::CPU, || x.exp()?.add(&x))?;
/// assert_eq!(g.nodes().len(), 2);
/// unirt::Runtime::get(Device::CPU)?.run(&g)?;
/// assert_eq!(y.to_vec::<f32>()?, [2f32.exp() + 2.0; 3]);
/// # Ok::<(), unirt::Error>(())
/// ```
pub fn record<T>(device: Device, f: impl FnOnce() -> Result<T>) -> Result<(Graph, T)> {
    /// Stops the recording when `f` unwinds: a panic caught further up once left the thread
    /// recording, its later eager operators recorded instead of run.
    struct StopOnUnwind;
    impl Drop for StopOnUnwind {
        fn drop(&mut self) {
            let _ = stop_recording();
        }
    }
    start_recording(device)?;
    let unwinding = StopOnUnwind;
    let r = f();
    // Returned: the recording stops below, with its result.
    std::mem::forget(unwinding);
    let g = stop_recording();
    let v = r?;
    Ok((g?, v))
}

fn with_builder<R>(f: impl FnOnce(&mut GraphBuilder) -> Result<R>) -> Result<R> {
    BUILDER
        .try_with(|b| match b.borrow_mut().as_mut() {
            Some(b) => f(b),
            None => Err(Error::NotCapturing),
        })
        .unwrap_or(Err(Error::NotCapturing))
}

/// Records a checked launch of `plan` (called by `Plan::launch` while recording).
pub(crate) fn record_launch(plan: &Plan, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
    with_builder(|b| {
        let ins = inputs
            .iter()
            .map(|t| b.operand_of(t, BufferRole::External))
            .collect::<Result<Vec<_>>>()?;
        // Outputs the eager methods just allocated are intermediates; any other output the
        // recording has not seen is an external tensor the graph writes.
        let role = if FRESH_OUTPUTS.with(|f| f.get()) {
            BufferRole::Intermediate
        } else {
            BufferRole::External
        };
        let outs = outputs
            .iter()
            .map(|t| b.operand_of(t, role.clone()))
            .collect::<Result<Vec<_>>>()?;
        b.push_op(plan.clone(), ins, outs)
    })
}

/// Refuses a host read of a tensor the current recording produced (it holds no values yet).
pub(crate) fn check_host_read(t: &Tensor) -> Result<()> {
    if !is_recording(t.device()) {
        return Ok(());
    }
    let produced = BUILDER
        .try_with(|b| b.borrow().as_ref().is_some_and(|b| b.is_intermediate(t)))
        .unwrap_or(false);
    if produced {
        return Err(Error::Capturing(
            "reading back a tensor the graph recording has not computed yet (record the host \
             read with graph::host_op)"
                .into(),
        ));
    }
    Ok(())
}

/// A host function over `tensors`: recorded as a host node while the calling thread records
/// on their device (it runs whenever the graph runs, after the device work before it), run
/// at once otherwise (after the thread's stream has drained).
pub fn host_op(name: &str, tensors: &[&Tensor], f: HostFn) -> Result<()> {
    let device = match tensors.first() {
        Some(t) => t.device(),
        None => return Err(Error::BadParam(format!("host op {name:?} needs a tensor"))),
    };
    if is_recording(device) {
        return with_builder(|b| {
            let ops = tensors
                .iter()
                .map(|t| b.operand_of(t, BufferRole::External))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<_> = ops.iter().collect();
            b.host_op(name, &refs, f)
        });
    }
    let rt = crate::Runtime::get(device)?;
    // The host reads what every stream queued on the tensors (see `crate::tensor`).
    let stream = rt.stream()?;
    for t in tensors {
        t.order_on(stream)?;
    }
    rt.sync_stream()?;
    let owned: Vec<Tensor> = tensors.iter().map(|t| (*t).clone()).collect();
    f(&owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    #[test]
    fn a_panic_in_the_recorded_closure_stops_the_recording() {
        let x = Tensor::full(&[4], 1.0, DType::F32, Device::CPU).unwrap();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            record(Device::CPU, || -> Result<()> {
                x.add_scalar(1.0)?;
                panic!("a user's bug inside the recording")
            })
        }));
        assert!(caught.is_err());
        assert_eq!(recording_device(), None);
        // Eager again: computed, not recorded.
        let y = x.add_scalar(1.0).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), [2.0; 4]);
    }
}
