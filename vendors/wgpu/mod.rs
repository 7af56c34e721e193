//! Portable compute through wgpu (being built: see issue 4).

use crate::discovery::Probe;
use crate::error::{Error, Result};
use crate::hal::AnyBackend;

pub fn probe() -> Probe {
    Probe::Unavailable("this build of unirt has no wgpu backend yet".into())
}

pub fn open(index: usize) -> Result<AnyBackend> {
    Err(Error::DeviceNotFound(format!("wgpu:{index}")))
}
