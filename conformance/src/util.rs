//! Helpers for writing cases: checks that return [`Failure`]s, patterned data, device buffers
//! that free themselves.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use super::Failure;
use unirt::error::Error;
use unirt::hal::{Backend, DevicePtr};
use unirt::AnyBackend;

/// Fails the case with a message unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        let holds: bool = $cond;
        if !holds {
            return Err($crate::Failure::Failed(format!($($fmt)+)));
        }
    };
}

/// Joins scoped worker threads: `Ok` when every one returned `Ok`, else the first failure in
/// spawn order (a panic is a failure too).
pub fn join_workers(
    workers: Vec<std::thread::ScopedJoinHandle<'_, Result<(), Failure>>>,
) -> Result<(), Failure> {
    workers.into_iter().try_for_each(|w| {
        w.join()
            .unwrap_or_else(|_| Err(Failure::Failed("a worker thread panicked".into())))
    })
}

/// Checks that `r` is an error of the expected kind (by [`Error::kind_name`]).
pub fn expect_err<T: std::fmt::Debug>(
    r: Result<T, Error>,
    kinds: &[&str],
    what: &str,
) -> Result<(), Failure> {
    match r {
        Err(e) if kinds.contains(&e.kind_name()) => Ok(()),
        Err(e) => Err(Failure::Failed(format!(
            "{what}: expected {kinds:?}, got {} ({e})",
            e.kind_name()
        ))),
        Ok(v) => Err(Failure::Failed(format!(
            "{what}: expected {kinds:?}, got Ok({v:?})"
        ))),
    }
}

/// A deterministic byte pattern (differs per `seed`).
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12_345) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

/// Device memory freed on drop (errors on drop are ignored: the case already reported).
pub struct Buf {
    backend: Arc<AnyBackend>,
    pub ptr: DevicePtr,
    pub len: usize,
}

impl Buf {
    pub fn new(backend: &Arc<AnyBackend>, len: usize) -> Result<Self, Failure> {
        let ptr = backend.malloc(len)?;
        Ok(Buf {
            backend: backend.clone(),
            ptr,
            len,
        })
    }

    /// Allocates and fills with `data`.
    pub fn with(backend: &Arc<AnyBackend>, data: &[u8]) -> Result<Self, Failure> {
        let b = Self::new(backend, data.len())?;
        unirt::BackendExt::copy_to_device(&**backend, b.ptr, data)?;
        Ok(b)
    }

    pub fn read(&self) -> Result<Vec<u8>, Failure> {
        Ok(unirt::BackendExt::read_vec(
            &*self.backend,
            self.ptr,
            self.len,
        )?)
    }

    pub fn at(&self, offset: usize) -> DevicePtr {
        self.ptr.offset(offset as u64)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let _ = self.backend.free(self.ptr);
    }
}

/// Compares two byte slices and names the first difference.
pub fn same(got: &[u8], want: &[u8], what: &str) -> Result<(), Failure> {
    if got.len() != want.len() {
        return Err(Failure::Failed(format!(
            "{what}: length {} != {}",
            got.len(),
            want.len()
        )));
    }
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        return Err(Failure::Failed(format!(
            "{what}: first difference at byte {i} of {}: got {:#04x}, want {:#04x}",
            got.len(),
            got[i],
            want[i]
        )));
    }
    Ok(())
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Little-endian bytes as f32 values.
pub fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A number from the environment, decimal or `0x` hexadecimal (seeds, durations); `None` when
/// unset or unparsable.
pub fn env_u64(name: &str) -> Option<u64> {
    parse_u64(std::env::var(name).ok()?.trim())
}

/// A number in decimal or `0x` hexadecimal (seeds are printed in hex).
pub fn parse_u64(v: &str) -> Option<u64> {
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// Runs `f` on a thread of its own and waits at most `limit` for it, so a hang fails the case
/// (naming `what`) instead of the test run; the hung thread is left behind. A panic in `f`
/// fails the case too.
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("watched".into())
        .spawn(move || {
            // The receiver is gone only if the case already reported a hang.
            let _ = tx.send(f());
        })
        .map_err(|e| Failure::Failed(format!("cannot start a thread for {what}: {e}")))?;
    match rx.recv_timeout(limit) {
        Ok(r) => r,
        Err(RecvTimeoutError::Timeout) => Err(Failure::Failed(format!(
            "{what} did not finish within {limit:?} (hang)"
        ))),
        Err(RecvTimeoutError::Disconnected) => Err(Failure::Failed(format!("{what} panicked"))),
    }
}
