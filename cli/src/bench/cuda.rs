//! `unirt bench cuda --device cuda:N`: unirt's CUDA backend beside a plain cudarc program in
//! the same run.
//!
//! - H2D and D2H from pinned host memory: unirt (`malloc_host`, `memcpy_async` + stream sync)
//!   vs cudarc (`alloc_pinned_with_flags(.., 0)` — cached pinned memory like unirt's; cudarc's
//!   own default is write-combined — with `memcpy_htod`/`memcpy_dtoh` + stream sync).
//! - The same from pageable `Vec`s on both sides.
//! - 100 tiny `fill` kernels: launched one by one vs one replay of a captured CUDA graph.
//!
//! Without a CUDA device it fails at once with the discovery reason (exit status 2).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use serde::Serialize;
use unirt::{Backend, CaptureMode, Device, DeviceKind, MemcpyKind, StreamId};

use super::stats::{median, reps_for};
use crate::CliResult;

#[derive(Serialize)]
struct CopyRow {
    kind: &'static str,
    host: &'static str,
    bytes: usize,
    unirt_gbps: f64,
    cudarc_gbps: f64,
}

#[derive(Serialize)]
struct LaunchRow {
    kernels: usize,
    eager_us_per_kernel: f64,
    graph_us_per_kernel: f64,
}

/// Times `f` with enough repetitions for a stable median (after one warm-up run); the first
/// error stops the measurement.
fn time(mut f: impl FnMut() -> CliResult<()>) -> CliResult<f64> {
    let t = Instant::now();
    f()?;
    let reps = reps_for(t.elapsed(), Duration::from_millis(300), 5, 1000);
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    Ok(median(&mut samples))
}

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// The cudarc baseline: its own context handle on the same device, one non-blocking stream.
pub(super) struct Baseline {
    stream: Arc<CudaStream>,
    pub(super) ctx: Arc<CudaContext>,
}

pub(super) fn baseline(index: usize) -> CliResult<Baseline> {
    // cudarc loads libcuda by name and panics when that fails: check first, and catch any
    // panic from a symbol it lacks as an error rather than a crash of the benchmark.
    // SAFETY: is_culib_present only tries to dlopen cudarc's candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("cudarc cannot load libcuda by name (baseline unavailable)".into());
    }
    catch_unwind(|| -> CliResult<Baseline> {
        let ctx = CudaContext::new(index)?;
        let stream = ctx.new_stream()?;
        Ok(Baseline { stream, ctx })
    })
    .unwrap_or_else(|_| Err("cudarc panicked while opening the device".into()))
}

pub fn run(device: &str, json: Option<&Path>, max_mib: usize) -> CliResult<ExitCode> {
    let device: Device = device.parse()?;
    if device.kind != DeviceKind::Cuda {
        return Err(format!("bench cuda needs a cuda device, got {device}").into());
    }
    let dev = unirt::open(device)?;
    let base = baseline(device.index)?;
    println!(
        "cuda bench on {device} ({}), baseline: plain cudarc in the same process",
        dev.info().name
    );
    let s = dev.stream_create()?;
    let copies = catch_unwind(AssertUnwindSafe(|| copy_rows(&dev, s, &base, max_mib)))
        .unwrap_or_else(|_| Err("cudarc panicked during the copy baseline".into()))?;
    let launches = launch_rows(&dev, s)?;
    dev.stream_destroy(s)?;
    if let Some(p) = json {
        std::fs::write(
            p,
            serde_json::to_string_pretty(&serde_json::json!({
                "device": device.to_string(),
                "name": dev.info().name,
                "copies": copies,
                "launches": launches,
            }))?,
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

fn copy_rows(
    dev: &unirt::AnyBackend,
    s: StreamId,
    base: &Baseline,
    max_mib: usize,
) -> CliResult<Vec<CopyRow>> {
    println!(
        "{:<4} {:<8} {:>11} {:>11} {:>12} {:>7}",
        "kind", "host", "bytes", "unirt GB/s", "cudarc GB/s", "ratio"
    );
    let sizes: Vec<usize> = std::iter::successors(Some(64usize << 10), |n| Some(n * 4))
        .take_while(|&n| n <= max_mib << 20)
        .collect();
    let mut rows = Vec::new();
    for &n in &sizes {
        let d = dev.malloc(n)?;
        let h = dev.malloc_host(n)?;
        let mut pageable = vec![1u8; n];
        // SAFETY: h is a live pinned allocation of n bytes.
        unsafe { std::ptr::write_bytes(h.as_mut_ptr(), 1, n) };
        let mut bd: CudaSlice<u8> = base.stream.alloc_zeros(n)?;
        // SAFETY: the pinned buffer is written (memcpy_htod) before it is read back.
        let mut bh = unsafe { base.ctx.alloc_pinned_with_flags::<u8>(n, 0)? };
        let mut bpage = vec![1u8; n];
        base.stream.memcpy_htod(&bpage, &mut bd)?;
        base.stream.synchronize()?;
        for (host, kind) in [
            ("pinned", MemcpyKind::H2D),
            ("pinned", MemcpyKind::D2H),
            ("pageable", MemcpyKind::H2D),
            ("pageable", MemcpyKind::D2H),
        ] {
            let hp = if host == "pinned" {
                h.0
            } else {
                pageable.as_mut_ptr() as u64
            };
            let (dst, src) = match kind {
                MemcpyKind::H2D => (d.0, hp),
                _ => (hp, d.0),
            };
            let unirt_s = time(|| {
                // SAFETY: dst and src are live buffers of n bytes (pinned, pageable or device),
                // and the stream is synchronised before the next use.
                unsafe { dev.memcpy_async(dst, src, n, kind, s)? };
                dev.stream_synchronize(s)?;
                Ok(())
            })?;
            let cudarc_s = time(|| {
                match (host, kind) {
                    ("pinned", MemcpyKind::H2D) => base.stream.memcpy_htod(&bh, &mut bd)?,
                    ("pinned", _) => base.stream.memcpy_dtoh(&bd, &mut bh)?,
                    (_, MemcpyKind::H2D) => base.stream.memcpy_htod(&bpage, &mut bd)?,
                    _ => base.stream.memcpy_dtoh(&bd, &mut bpage)?,
                }
                base.stream.synchronize()?;
                Ok(())
            })?;
            let row = CopyRow {
                kind: kind.as_str(),
                host,
                bytes: n,
                unirt_gbps: gbps(n, unirt_s),
                cudarc_gbps: gbps(n, cudarc_s),
            };
            println!(
                "{:<4} {:<8} {:>11} {:>11.2} {:>12.2} {:>7.2}",
                row.kind,
                row.host,
                n,
                row.unirt_gbps,
                row.cudarc_gbps,
                row.unirt_gbps / row.cudarc_gbps
            );
            rows.push(row);
        }
        dev.free(d)?;
        dev.free_host(h)?;
    }
    Ok(rows)
}

fn launch_rows(dev: &unirt::AnyBackend, s: StreamId) -> CliResult<Vec<LaunchRow>> {
    const KERNELS: usize = 100;
    const WORDS: u32 = 256;
    let buf = dev.malloc(4 * WORDS as usize)?;
    let launch_all = || -> unirt::Result<()> {
        for i in 0..KERNELS {
            dev.launch("fill", &[buf.into(), (i as u32).into(), WORDS.into()], s)?;
        }
        Ok(())
    };
    // Compile and load the kernel before timing anything.
    launch_all()?;
    dev.stream_synchronize(s)?;
    let eager = time(|| {
        launch_all()?;
        dev.stream_synchronize(s)?;
        Ok(())
    })?;
    dev.begin_capture(s, CaptureMode::ThreadLocal)?;
    let captured = launch_all();
    let graph = dev.end_capture(s)?;
    captured?;
    let exec = dev.graph_instantiate(graph)?;
    let replay = time(|| {
        dev.graph_launch(exec, s)?;
        dev.stream_synchronize(s)?;
        Ok(())
    })?;
    // The last kernel wrote KERNELS - 1 everywhere: check the replay really ran.
    let mut out = vec![0u8; 4 * WORDS as usize];
    // SAFETY: out is a live vector of the copied size; buf is a live allocation of it.
    unsafe { dev.memcpy(out.as_mut_ptr() as u64, buf.0, out.len(), MemcpyKind::D2H)? };
    let want = (KERNELS as u32 - 1).to_le_bytes();
    if out.chunks(4).any(|w| w != want) {
        return Err("graph replay left wrong values in the buffer".into());
    }
    dev.graph_exec_destroy(exec)?;
    dev.graph_destroy(graph)?;
    dev.free(buf)?;
    let row = LaunchRow {
        kernels: KERNELS,
        eager_us_per_kernel: eager * 1e6 / KERNELS as f64,
        graph_us_per_kernel: replay * 1e6 / KERNELS as f64,
    };
    println!(
        "{KERNELS} × fill({WORDS} words): one by one {:.2} µs/kernel, graph replay {:.2} µs/kernel ({:.1}× faster)",
        row.eager_us_per_kernel,
        row.graph_us_per_kernel,
        row.eager_us_per_kernel / row.graph_us_per_kernel
    );
    Ok(vec![row])
}
