//! `unirt bench memcpy` and `unirt bench latency`.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;
use unirt::{Backend, Device, EventFlags, MemcpyKind};

use super::stats::{median, reps_for, write_rows};
use crate::CliResult;

#[derive(Serialize)]
struct Row {
    kind: &'static str,
    bytes: usize,
    unirt_gbps: f64,
    baseline_gbps: f64,
}

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// Median seconds of `a` and of `b`, sampled alternately (a, b, a, b, …) so that load from
/// elsewhere on the machine hits both sides alike.
fn time_pair(mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    let t = Instant::now();
    a();
    b();
    let reps = reps_for(t.elapsed(), Duration::from_millis(400), 5, 2000);
    let (mut sa, mut sb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        let t = Instant::now();
        a();
        sa.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        b();
        sb.push(t.elapsed().as_secs_f64());
    }
    (median(&mut sa), median(&mut sb))
}

pub fn run(device: &str, json: Option<&Path>, max_mib: usize) -> CliResult<ExitCode> {
    let device: Device = device.parse()?;
    let dev = unirt::open(device)?;
    println!(
        "memcpy on {device} ({}) beside libc memcpy between host buffers",
        dev.info().name
    );
    println!(
        "{:<4} {:>11} {:>11} {:>13} {:>7}",
        "kind", "bytes", "unirt GB/s", "libc GB/s", "ratio"
    );
    let max = max_mib << 20;
    let sizes: Vec<usize> = std::iter::successors(Some(4096usize), |s| Some(s * 4))
        .take_while(|&s| s <= max)
        .collect();
    let mut rows = Vec::new();
    for &n in &sizes {
        // Pinned host buffers on the unirt side, ordinary vectors for the baseline; every page
        // touched before timing so neither side pays first-touch faults.
        let h_src = dev.malloc_host(n)?;
        let h_dst = dev.malloc_host(n)?;
        let (d_a, d_b) = (dev.malloc(n)?, dev.malloc(n)?);
        // SAFETY: both host buffers are live allocations of n bytes.
        unsafe {
            std::ptr::write_bytes(h_src.as_mut_ptr(), 1, n);
            std::ptr::write_bytes(h_dst.as_mut_ptr(), 2, n);
        }
        dev.memset(d_a, 3, n)?;
        dev.memset(d_b, 4, n)?;
        let b_src = vec![5u8; n];
        let mut b_dst = vec![6u8; n];
        for kind in [MemcpyKind::H2D, MemcpyKind::D2H, MemcpyKind::D2D] {
            let (dst, src) = match kind {
                MemcpyKind::H2D => (d_a.0, h_src.0),
                MemcpyKind::D2H => (h_dst.0, d_a.0),
                _ => (d_b.0, d_a.0),
            };
            let mut err = None;
            // SAFETY: every range is a live allocation of n bytes.
            let (unirt_s, base_s) = time_pair(
                || {
                    if let Err(e) = unsafe { dev.memcpy(dst, src, n, kind) } {
                        err.get_or_insert(e);
                    }
                },
                || {
                    // SAFETY: two distinct vectors of n bytes.
                    unsafe { std::ptr::copy_nonoverlapping(b_src.as_ptr(), b_dst.as_mut_ptr(), n) };
                    std::hint::black_box(&mut b_dst);
                },
            );
            if let Some(e) = err {
                return Err(e.into());
            }
            let row = Row {
                kind: kind.as_str(),
                bytes: n,
                unirt_gbps: gbps(n, unirt_s),
                baseline_gbps: gbps(n, base_s),
            };
            println!(
                "{:<4} {:>11} {:>11.2} {:>13.2} {:>7.2}",
                row.kind,
                n,
                row.unirt_gbps,
                row.baseline_gbps,
                row.unirt_gbps / row.baseline_gbps
            );
            rows.push(row);
        }
        dev.free(d_a)?;
        dev.free(d_b)?;
        dev.free_host(h_src)?;
        dev.free_host(h_dst)?;
    }
    write_rows(json, &rows)?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct LatencyRow {
    what: &'static str,
    median_ns: f64,
    p90_ns: f64,
    samples: usize,
    /// The far-ahead producer's row: the most the process's resident memory grew while it
    /// queued (the queue's memory), and the whole run with its final synchronisation.
    #[serde(skip_serializing_if = "Option::is_none")]
    peak_growth_mib: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    total_ms: Option<f64>,
}

/// Resident memory of this process in KiB (Linux; 0 elsewhere).
fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4)
}

/// A producer far ahead of its stream: 100 000 memsets of 64 KiB queued without a
/// synchronisation (work the device takes far longer to run than the host to queue). Each
/// enqueue is timed — the slow ones are the waits for room once the stream's queue is full —
/// and the process's resident memory is sampled every 256 enqueues.
fn far_ahead(dev: &std::sync::Arc<unirt::AnyBackend>) -> CliResult<LatencyRow> {
    const N: usize = 100_000;
    const BYTES: usize = 64 << 10;
    let s = dev.stream_create()?;
    let buf = dev.malloc(BYTES)?;
    dev.memset_async(buf, 0, BYTES, s)?;
    dev.stream_synchronize(s)?;
    let base = resident_kib();
    let mut peak = base;
    let mut v = Vec::with_capacity(N);
    let start = Instant::now();
    for i in 0..N {
        let t = Instant::now();
        dev.memset_async(buf, i as u8, BYTES, s)?;
        v.push(t.elapsed().as_nanos() as f64);
        if i % 256 == 0 {
            peak = peak.max(resident_kib());
        }
    }
    dev.stream_synchronize(s)?;
    let total_ms = start.elapsed().as_secs_f64() * 1e3;
    dev.free(buf)?;
    dev.stream_destroy(s)?;
    let what = "far ahead: 100 000 memset_async (64 KiB), one sync";
    let med = median(&mut v);
    let p90 = v[(v.len() * 9) / 10];
    let growth = (peak - base) as f64 / 1024.0;
    println!(
        "{what:<40} median {med:>8.0} ns   p90 {p90:>8.0} ns   memory grew {growth:.1} MiB, \
         {total_ms:.0} ms in all"
    );
    Ok(LatencyRow {
        what,
        median_ns: med,
        p90_ns: p90,
        samples: N,
        peak_growth_mib: Some(growth),
        total_ms: Some(total_ms),
    })
}

pub fn latency(device: &str, json: Option<&Path>) -> CliResult<ExitCode> {
    let device: Device = device.parse()?;
    let dev = unirt::open(device)?;
    let s = dev.stream_create()?;
    let buf = dev.malloc(64)?;
    let ev = dev.event_create(EventFlags::DEFAULT)?;
    const N: usize = 2000;
    let mut rows = Vec::new();
    let mut measure =
        |what: &'static str, f: &mut dyn FnMut() -> unirt::Result<()>| -> CliResult<()> {
            let mut v = Vec::with_capacity(N);
            for i in 0..N + 50 {
                dev.stream_synchronize(s)?;
                let t = Instant::now();
                f()?;
                let ns = t.elapsed().as_nanos() as f64;
                if i >= 50 {
                    v.push(ns);
                }
            }
            let med = median(&mut v);
            let p90 = v[(v.len() * 9) / 10];
            println!("{what:<40} median {med:>8.0} ns   p90 {p90:>8.0} ns");
            rows.push(LatencyRow {
                what,
                median_ns: med,
                p90_ns: p90,
                samples: v.len(),
                peak_growth_mib: None,
                total_ms: None,
            });
            Ok(())
        };
    println!("latency on {device} ({})", dev.info().name);
    measure("enqueue memset_async (64 B) on idle stream", &mut || {
        dev.memset_async(buf, 0, 64, s)
    })?;
    measure("launch fill (16 words) on idle stream", &mut || {
        dev.launch("fill", &[buf.into(), 7u32.into(), 16u32.into()], s)
    })?;
    measure("event record + query", &mut || {
        dev.event_record(ev, s)?;
        dev.event_query(ev).map(|_| ())
    })?;
    // Copies from and into pageable memory follow CUDA's rules (done with the buffer on
    // return): on an idle stream, and behind queued work (a small source is staged).
    let mut host = [7u8; 8];
    let busy = dev.malloc(1 << 20)?;
    let h = host.as_mut_ptr() as u64;
    // SAFETY: `host` (8 bytes) outlives every call, and a pageable buffer is done with when
    // each returns.
    measure(
        "memcpy_async H2D 8 B pageable, idle stream",
        &mut || unsafe { dev.memcpy_async(buf.0, h, 8, MemcpyKind::H2D, s) },
    )?;
    // SAFETY: as above.
    measure(
        "memcpy_async D2H 8 B pageable, idle stream",
        &mut || unsafe { dev.memcpy_async(h, buf.0, 8, MemcpyKind::D2H, s) },
    )?;
    measure("memset_async 1 MiB", &mut || {
        dev.memset_async(busy, 1, 1 << 20, s)
    })?;
    // SAFETY: as above.
    measure("memset_async 1 MiB + H2D 8 B pageable", &mut || unsafe {
        dev.memset_async(busy, 1, 1 << 20, s)?;
        dev.memcpy_async(buf.0, h, 8, MemcpyKind::H2D, s)
    })?;
    dev.stream_synchronize(s)?;
    dev.free(busy)?;
    dev.event_destroy(ev)?;
    dev.free(buf)?;
    dev.stream_destroy(s)?;
    rows.push(far_ahead(&dev)?);
    write_rows(json, &rows)?;
    Ok(ExitCode::SUCCESS)
}
