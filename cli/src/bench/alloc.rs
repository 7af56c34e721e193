//! `unirt bench alloc`: alloc + free pairs through the caching allocator, beside the backend's
//! raw allocation and the system malloc, per size, in one run. On a CUDA device a fourth
//! column is the driver's own `cuMemAlloc` + `cuMemFree` (through cudarc, in the same process),
//! the floor the raw column is held to (issue 11: ≤ 1.2×). Where `libinfinirt.so` lies beside
//! the executable (or at `UNIRT_CAPI_LIB`), a C ABI column times `infinirtMalloc` +
//! `infinirtFree` through it on the same device, held to the same floor.
//!
//! Each figure is the median over batches of the time per pair, with the batch long enough
//! (≥ 20 µs) that the clock's own cost does not count. The cached figure is a cache hit: one
//! warm-up pair reserves the segment first. A second column alternates two sizes so that
//! every request takes the slow cached path (quick-list flush, best-fit search, split, merge).

use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;
use unirt::alloc::CachingAllocator;
use unirt::{Backend, Device, DeviceKind};

use super::stats::{median, write_rows};
use crate::CliResult;

#[derive(Serialize)]
struct Row {
    bytes: usize,
    cached_ns: f64,
    /// Alternating two sizes, so every request misses the quick list and goes through the
    /// flush, the best-fit search, a split and a merge.
    cached_best_fit_ns: f64,
    raw_ns: f64,
    /// CUDA only: plain `cuMemAlloc` + `cuMemFree` through cudarc.
    #[serde(skip_serializing_if = "Option::is_none")]
    cuda_driver_ns: Option<f64>,
    /// `infinirtMalloc` + `infinirtFree` through libinfinirt.so, where it was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    c_abi_ns: Option<f64>,
    system_malloc_ns: f64,
}

/// Plain `cuMemAlloc_v2` + `cuMemFree_v2` pairs of `n` bytes on cudarc's own handle to the
/// same device: the floor for unirt's raw CUDA allocation.
fn cuda_driver_pair_ns(base: &super::cuda::Baseline, n: usize) -> CliResult<f64> {
    base.ctx.bind_to_thread()?;
    let mut err = None;
    let ns = per_call_ns(Duration::from_millis(300), || {
        // SAFETY: the context is current on this thread (bound above); the pointer is freed
        // once, right after it was allocated, and never used.
        match unsafe { cudarc::driver::result::malloc_sync(n) } {
            Ok(p) => {
                // SAFETY: as above.
                if let Err(e) = unsafe { cudarc::driver::result::free_sync(p) } {
                    err.get_or_insert(e);
                }
            }
            Err(e) => {
                err.get_or_insert(e);
            }
        }
    });
    match err {
        Some(e) => Err(e.into()),
        None => Ok(ns),
    }
}

type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type FreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// libinfinirt.so loaded into this process with the bench's device current on this thread:
/// the C ABI's raw allocation pair, as C code ported from InfiniCore calls it.
struct CAbi {
    malloc: MallocFn,
    free: FreeFn,
    path: PathBuf,
    // Last: the functions above point into it.
    _lib: libloading::Library,
}

impl CAbi {
    fn load(device: Device) -> Result<CAbi, String> {
        let path = match std::env::var_os("UNIRT_CAPI_LIB") {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()
                .map_err(|e| format!("no executable path ({e})"))?
                .with_file_name("libinfinirt.so"),
        };
        if !path.exists() {
            return Err(format!("{} not found", path.display()));
        }
        // SAFETY: libinfinirt.so is unirt's own C ABI library: loading it runs no code beyond
        // the Rust runtime's static initialisation.
        let lib = unsafe { libloading::Library::new(&path) }
            .map_err(|e| format!("{}: {e}", path.display()))?;
        // The ABI's device types: CPU 0, NVIDIA 1, unirt's wgpu extension 100.
        let ty: c_int = match device.kind {
            DeviceKind::Cpu => 0,
            DeviceKind::Cuda => 1,
            _ => 100,
        };
        // SAFETY: each symbol is looked up with the C signature libinfinirt exports
        // (capi/include/infinirt.h); the copies do not outlive `lib`, which the struct holds.
        let (set, malloc, free) = unsafe {
            let set = *lib
                .get::<unsafe extern "C" fn(c_int, c_int) -> c_int>(b"infinirtSetDevice\0")
                .map_err(|e| e.to_string())?;
            let malloc = *lib
                .get::<MallocFn>(b"infinirtMalloc\0")
                .map_err(|e| e.to_string())?;
            let free = *lib
                .get::<FreeFn>(b"infinirtFree\0")
                .map_err(|e| e.to_string())?;
            (set, malloc, free)
        };
        // SAFETY: plain integers in; the current device is the library's thread-local.
        let status = unsafe { set(ty, device.index as c_int) };
        if status != 0 {
            return Err(format!(
                "infinirtSetDevice({ty}, {}) returned {status}",
                device.index
            ));
        }
        Ok(CAbi {
            malloc,
            free,
            path,
            _lib: lib,
        })
    }

    /// Nanoseconds per `infinirtMalloc` + `infinirtFree` pair of `n` bytes.
    fn pair_ns(&self, n: usize) -> Result<f64, String> {
        let mut err = None;
        let ns = per_call_ns(Duration::from_millis(300), || {
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: `p` is a valid out-pointer; the allocation is freed once, right away,
            // and never used.
            let status = unsafe { (self.malloc)(&mut p, n) };
            if status != 0 {
                err.get_or_insert(format!("infinirtMalloc({n}) returned {status}"));
                return;
            }
            // SAFETY: `p` came from infinirtMalloc on this thread's current device.
            let status = unsafe { (self.free)(std::hint::black_box(p)) };
            if status != 0 {
                err.get_or_insert(format!("infinirtFree returned {status}"));
            }
        });
        match err {
            Some(e) => Err(e),
            None => Ok(ns),
        }
    }
}

/// Median nanoseconds per call of `f`, over batches of calls.
fn per_call_ns(budget: Duration, mut f: impl FnMut()) -> f64 {
    let mut batch = 1usize;
    loop {
        let t = Instant::now();
        for _ in 0..batch {
            f();
        }
        if t.elapsed() >= Duration::from_micros(20) || batch >= 1 << 16 {
            break;
        }
        batch *= 2;
    }
    let start = Instant::now();
    let mut samples = Vec::new();
    while samples.len() < 5 || (start.elapsed() < budget && samples.len() < 400) {
        let t = Instant::now();
        for _ in 0..batch {
            f();
        }
        samples.push(t.elapsed().as_nanos() as f64 / batch as f64);
    }
    median(&mut samples)
}

pub fn run(device: &str, json: Option<&Path>, max_mib: usize) -> CliResult<ExitCode> {
    let device: Device = device.parse()?;
    let dev = unirt::open(device)?;
    let alloc = CachingAllocator::new(dev.clone());
    let cuda = if device.kind == DeviceKind::Cuda {
        Some(super::cuda::baseline(device.index)?)
    } else {
        None
    };
    let stream = dev.default_stream();
    let c_abi = match CAbi::load(device) {
        Ok(c) => {
            println!("C ABI column: {}", c.path.display());
            Some(c)
        }
        Err(e) => {
            println!("C ABI column: not measured ({e})");
            None
        }
    };
    println!(
        "alloc + free pairs on {device} ({}): caching allocator (cache hit), raw backend \
         allocation, system malloc",
        dev.info().name
    );
    println!(
        "{:>11} {:>11} {:>13} {:>13} {:>13} {:>10}{}{}",
        "bytes",
        "cached ns",
        "best-fit ns",
        "raw ns",
        "malloc ns",
        "raw/cached",
        if cuda.is_some() {
            "  cuMemAlloc+Free ns  raw/driver"
        } else {
            ""
        },
        match (&c_abi, &cuda) {
            (Some(_), Some(_)) => "    C ABI ns  C ABI/driver",
            (Some(_), None) => "    C ABI ns",
            _ => "",
        }
    );
    let max = max_mib.max(1) << 20;
    let sizes: Vec<usize> = std::iter::successors(Some(512usize), |s| Some(s * 2))
        .take_while(|&s| s <= max)
        .collect();
    let mut rows = Vec::new();
    let mut err: Option<unirt::Error> = None;
    for &n in &sizes {
        // Warm-up: reserves the segment, so every timed pair is a cache hit.
        let p = alloc.malloc(n, stream)?;
        alloc.free(p)?;
        let cached_ns = per_call_ns(Duration::from_millis(150), || {
            match alloc.malloc(n, stream) {
                Ok(p) => {
                    if let Err(e) = alloc.free(std::hint::black_box(p)) {
                        err.get_or_insert(e);
                    }
                }
                Err(e) => {
                    err.get_or_insert(e);
                }
            }
        });
        let mut flip = false;
        let cached_best_fit_ns = per_call_ns(Duration::from_millis(150), || {
            flip = !flip;
            let len = if flip { n } else { n + 512 };
            match alloc.malloc(len, stream) {
                Ok(p) => {
                    if let Err(e) = alloc.free(std::hint::black_box(p)) {
                        err.get_or_insert(e);
                    }
                }
                Err(e) => {
                    err.get_or_insert(e);
                }
            }
        });
        let raw_ns = per_call_ns(Duration::from_millis(300), || match dev.malloc(n) {
            Ok(p) => {
                if let Err(e) = dev.free(std::hint::black_box(p)) {
                    err.get_or_insert(e);
                }
            }
            Err(e) => {
                err.get_or_insert(e);
            }
        });
        if let Some(e) = err.take() {
            return Err(e.into());
        }
        let cuda_driver_ns = match &cuda {
            Some(base) => Some(
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    cuda_driver_pair_ns(base, n)
                }))
                .unwrap_or_else(|_| Err("cudarc panicked during the allocation baseline".into()))?,
            ),
            None => None,
        };
        let c_abi_ns = match &c_abi {
            Some(c) => Some(c.pair_ns(n)?),
            None => None,
        };
        // `Vec::with_capacity` + drop is one malloc and one free through the global
        // allocator (the system malloc); black_box keeps the pair from being optimised out.
        let system_malloc_ns = per_call_ns(Duration::from_millis(100), || {
            let v: Vec<u8> = Vec::with_capacity(n);
            drop(std::hint::black_box(v));
        });
        println!(
            "{n:>11} {cached_ns:>11.1} {cached_best_fit_ns:>13.1} {raw_ns:>13.1} \
             {system_malloc_ns:>13.1} {:>10.1}{}{}",
            raw_ns / cached_ns,
            cuda_driver_ns
                .map(|d| format!(" {d:>19.1} {:>11.2}", raw_ns / d))
                .unwrap_or_default(),
            c_abi_ns
                .map(|c| match cuda_driver_ns {
                    Some(d) => format!(" {c:>12.1} {:>13.2}", c / d),
                    None => format!(" {c:>12.1}"),
                })
                .unwrap_or_default()
        );
        rows.push(Row {
            bytes: n,
            cached_ns,
            cached_best_fit_ns,
            raw_ns,
            cuda_driver_ns,
            c_abi_ns,
            system_malloc_ns,
        });
        // Give each size's segments back so the next size starts from the backend.
        alloc.empty_cache()?;
    }
    let st = alloc.stats();
    println!(
        "allocator: {} cache hits, {} misses (one warm-up per size)",
        st.cache_hits, st.cache_misses
    );
    if let Some(r) = rows.iter().find(|r| r.bytes == 1 << 20) {
        let goal = if r.cached_ns <= 100.0 {
            "met"
        } else {
            "missed"
        };
        let ratio = r.raw_ns / r.cached_ns;
        println!(
            "1 MiB: cache hit {:.1} ns (goal <= 100 ns: {goal}); raw {:.1} ns = {ratio:.1}x the \
             cached pair{}; system malloc {:.1} ns",
            r.cached_ns,
            r.raw_ns,
            if dev.kind() == DeviceKind::Cpu {
                " (the raw CPU backend is itself malloc plus bookkeeping)"
            } else {
                " (goal >= 10x)"
            },
            r.system_malloc_ns
        );
    }
    write_rows(json, &rows)?;
    Ok(ExitCode::SUCCESS)
}
