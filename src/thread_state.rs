//! The per-thread state under [`context`](crate::context) and [`Runtime`](crate::Runtime):
//! the calling thread's current device and its own stream per device.
//!
//! It sits below both so that neither imports the other for it: `context` reads and sets the
//! current device, a `Runtime` hands out the thread's stream on its device, and both come here.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

use crate::device::Device;
use crate::error::Result;
use crate::hal::StreamId;
use crate::stream::Stream;
use crate::vendors::AnyBackend;

thread_local! {
    static CURRENT: Cell<Device> = const { Cell::new(Device::CPU) };
    /// Destroyed (each stream with its device) when the thread exits.
    static STREAMS: RefCell<HashMap<Device, Stream>> = RefCell::new(HashMap::new());
}

/// The calling thread's current device (`cpu:0` until set).
pub(crate) fn current_device() -> Device {
    CURRENT.with(|c| c.get())
}

/// Makes `device` the calling thread's current device (no check: callers open it first).
pub(crate) fn set_current_device(device: Device) {
    CURRENT.with(|c| c.set(device));
}

/// The calling thread's stream on `device`, created on `backend` on first use — and again
/// when the device was opened anew (in a forked child, whose thread keeps the parent's stream
/// in its thread-local map; dropping that one is a harmless `Error::Forked`).
pub(crate) fn thread_stream(device: Device, backend: &Arc<AnyBackend>) -> Result<StreamId> {
    STREAMS.with(|s| {
        let mut map = s.borrow_mut();
        if let Some(st) = map.get(&device) {
            if Arc::ptr_eq(st.backend(), backend) {
                return Ok(st.id());
            }
        }
        let st = Stream::new(backend)?;
        let id = st.id();
        map.insert(device, st);
        Ok(id)
    })
}
