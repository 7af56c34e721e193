//! NVIDIA CUDA through libcuda and NVRTC loaded at run time (being built: see issue 3).

use crate::discovery::Probe;
use crate::error::{Error, Result};
use crate::hal::AnyBackend;

pub fn probe() -> Probe {
    Probe::Unavailable("this build of unirt has no CUDA backend yet".into())
}

pub fn open(index: usize) -> Result<AnyBackend> {
    Err(Error::DeviceNotFound(format!("cuda:{index}")))
}
