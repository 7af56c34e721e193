//! Per-call overhead of the C ABI over the Rust HAL, in one process and one run.
//!
//! For each operation, every sample times `BATCH` calls through the Rust API (`unirt::Backend`
//! on the opened device) and `BATCH` calls through the exported `extern "C"` entry point on
//! the same device, stream, event and buffers, alternating which goes first. The figure is the
//! median per-call time of each side and the difference (the C ABI's extra cost: the panic
//! guard, the thread-local current device, handle and status conversion).
//!
//! ```text
//! cargo bench -p unirt-capi --bench overhead            # cpu:0
//! UNIRT_BENCH_SAMPLES=501 cargo bench -p unirt-capi --bench overhead
//! ```

use std::ffi::c_void;
use std::hint::black_box;
use std::time::Instant;

use infinirt::*;
use unirt::{Backend, Device, DevicePtr, EventFlags, EventId, MemcpyKind};

const BATCH: usize = 1000;

struct Stats {
    rust_ns: f64,
    c_ns: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Times `rust` and `c` (each called BATCH times per sample), alternating their order;
/// `between` runs after each batch, untimed (to drain queues).
fn measure(
    samples: usize,
    mut rust: impl FnMut(),
    mut c: impl FnMut(),
    mut between: impl FnMut(),
) -> Stats {
    let (mut r, mut k) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    let time = |f: &mut dyn FnMut(), between: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..BATCH {
            f();
        }
        let ns = t.elapsed().as_nanos() as f64 / BATCH as f64;
        between();
        ns
    };
    // Warm up both paths (thread-local init, caches, lazily created state).
    time(&mut rust, &mut between);
    time(&mut c, &mut between);
    for i in 0..samples {
        if i % 2 == 0 {
            r.push(time(&mut rust, &mut between));
            k.push(time(&mut c, &mut between));
        } else {
            k.push(time(&mut c, &mut between));
            r.push(time(&mut rust, &mut between));
        }
    }
    Stats {
        rust_ns: median(r),
        c_ns: median(k),
    }
}

fn ok(status: Status) {
    assert_eq!(status, SUCCESS, "a C ABI call failed");
}

fn main() {
    let samples: usize = std::env::var("UNIRT_BENCH_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(201);
    let dev = unirt::open(Device::CPU).expect("open cpu:0");
    // The C side's current device is CPU 0 (the default), the same opened backend.
    ok(infinirtSetDevice(DEVICE_CPU, 0));

    let dst = dev.malloc(64).expect("malloc");
    let src = [7u8; 64];
    let src_addr = src.as_ptr() as usize as u64;
    let stream = dev.stream_create().expect("stream");
    let event = dev.event_create(EventFlags::DEFAULT).expect("event");
    let (s_c, e_c) = (
        stream.0 as usize as *mut c_void,
        event.0 as usize as *mut c_void,
    );
    let dst_c = dst.0 as usize as *mut c_void;

    let mut rows: Vec<(&str, Stats)> = Vec::new();

    rows.push((
        "memcpy 64 B H2D (sync)",
        measure(
            samples,
            || {
                // SAFETY: src is a live 64-byte array; dst a 64-byte device allocation.
                let r = unsafe { dev.memcpy(dst.0, src_addr, 64, MemcpyKind::H2D) };
                black_box(r).expect("memcpy");
            },
            || {
                // SAFETY: as above.
                let s = unsafe { infinirtMemcpy(dst_c, src.as_ptr().cast(), 64, 1) };
                ok(black_box(s));
            },
            || {},
        ),
    ));

    rows.push((
        "event record",
        measure(
            samples,
            || black_box(dev.event_record(event, stream)).expect("record"),
            || ok(black_box(infinirtEventRecord(e_c, s_c))),
            || dev.stream_synchronize(stream).expect("sync"),
        ),
    ));

    rows.push((
        "stream synchronize (idle)",
        measure(
            samples,
            || black_box(dev.stream_synchronize(stream)).expect("sync"),
            || ok(black_box(infinirtStreamSynchronize(s_c))),
            || {},
        ),
    ));

    println!(
        "C ABI overhead on {} ({} samples x {} calls, median ns per call)",
        Device::CPU,
        samples,
        BATCH
    );
    println!(
        "{:<28} {:>10} {:>10} {:>10}",
        "operation", "rust ns", "C ABI ns", "extra ns"
    );
    for (name, s) in &rows {
        println!(
            "{:<28} {:>10.1} {:>10.1} {:>10.1}",
            name,
            s.rust_ns,
            s.c_ns,
            s.c_ns - s.rust_ns
        );
    }

    dev.event_destroy(EventId(event.0)).expect("event destroy");
    dev.stream_destroy(stream).expect("stream destroy");
    dev.free(DevicePtr(dst.0)).expect("free");
}
