//! Exact mode: every block a raw allocation of exactly the requested size, so that an access
//! past the end of a tensor leaves the allocation, where a memory checker sees it.
//!
//! By default a request is rounded to 512 bytes and carved out of a larger segment, so a
//! kernel that reads or writes a few bytes past its tensor lands in the rounding or in a
//! neighbouring block: no tool notices, and the same bug crashes only when a block happens to
//! end at an unmapped page. With `UNIRT_ALLOC_EXACT=1` (read when a device's allocator is
//! created, or [`CachingAllocator::set_exact`]) each request that misses the cache gets a
//! segment of its own of exactly the requested bytes, and a cached block is reused only by a
//! request of the same size on the same stream. Past the end of a block is then past the end
//! of a host allocation (CPU: AddressSanitizer's or valgrind's red zone), of a `cuMemAlloc`
//! (CUDA: compute-sanitizer's memcheck) or of a wgpu buffer (the backend's own bounds).
//! PyTorch's `PYTORCH_NO_CUDA_MEMORY_CACHING` serves the same purpose; here the cache stays
//! (stream ordering, graph-private pools and strict mode work as usual), only sizes change.
//!
//! The cost: one raw allocation per distinct size, so more device memory and more driver
//! calls; meant for debugging, as `docs/RELIABILITY.md` describes. Blocks cached before the
//! mode was turned on keep their rounded sizes: turn it on before allocating, or call
//! [`CachingAllocator::empty_cache`] first.

use std::sync::atomic::Ordering;

use super::CachingAllocator;

/// Turns exact mode on for allocators created afterwards (any value but `0`, `off`, `false`,
/// `no` or empty, as [`STRICT_ENV`](super::strict::STRICT_ENV)).
pub const EXACT_ENV: &str = "UNIRT_ALLOC_EXACT";

/// Whether the environment asks for exact mode.
pub fn from_env() -> bool {
    super::switch_on(std::env::var(EXACT_ENV).ok().as_deref())
}

impl CachingAllocator {
    /// Turns exact mode on or off for requests from now on. See the [module](self)
    /// documentation.
    ///
    /// ```
    /// # fn main() -> unirt::Result<()> {
    /// let rt = unirt::Runtime::get(unirt::Device::CPU)?;
    /// let alloc = rt.allocator();
    /// alloc.set_exact(true);
    /// let before = alloc.stats().reserved_bytes.current;
    /// let m = rt.allocate_memory(1000)?; // a segment of exactly 1000 bytes
    /// assert_eq!(alloc.stats().reserved_bytes.current - before, 1000);
    /// # drop(m);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_exact(&self, on: bool) {
        self.exact.store(on, Ordering::Relaxed);
    }

    /// Whether exact mode is on.
    pub fn exact(&self) -> bool {
        self.exact.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::switch_on as on;

    #[test]
    fn env_values() {
        for v in ["1", "on", "TRUE", " yes ", "exact"] {
            assert!(on(Some(v)), "{v}");
        }
        for v in [
            None,
            Some(""),
            Some("0"),
            Some(" OFF"),
            Some("false"),
            Some("no"),
        ] {
            assert!(!on(v), "{v:?}");
        }
    }
}
