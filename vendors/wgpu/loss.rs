//! Losing the device on purpose, for the failure-path tests: what a GPU reset, a driver crash
//! or an unplugged eGPU does to a wgpu device, made to happen now.

use super::WgpuBackend;

impl WgpuBackend {
    /// Destroys the wgpu device under this backend (`wgpu::Device::destroy`), as a GPU reset
    /// would: wgpu reports the device lost, and every later call of this backend must return
    /// a typed error — never panic, never hang — while frees and destroys still release
    /// unirt's bookkeeping. For tests: open the device with [`crate::discovery::open_private`] so the
    /// process's shared backend stays usable.
    #[doc(hidden)]
    pub fn simulate_device_loss(&self) {
        self.gpu.device.destroy();
    }
}

#[cfg(test)]
mod tests {
    use crate::hal::Backend;
    use crate::vendors::AnyBackend;
    use crate::{discover, DeviceKind};

    /// The first call after a loss that waits for the device reports it: a synchronous
    /// memset whose submission wgpu completes without running it is not a success.
    #[test]
    fn a_wait_after_the_loss_reports_it() {
        for d in discover()
            .devices()
            .into_iter()
            .filter(|d| d.kind == DeviceKind::Wgpu)
        {
            let b = crate::discovery::open_private(d).unwrap();
            let a = b.malloc(4096).unwrap();
            let AnyBackend::Wgpu(w) = &*b else {
                unreachable!("a wgpu device opens a wgpu backend")
            };
            w.simulate_device_loss();
            let set = b.memset(a, 1, 4096);
            assert!(
                matches!(set, Err(crate::Error::DeviceNotInitialized(ref m)) if m.contains("lost")),
                "{d}: memset on a lost device: {set:?}"
            );
            assert!(b.malloc(4096).is_err(), "{d}: malloc after the loss");
        }
    }
}
