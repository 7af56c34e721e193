//! `unirt bench ops --device D [--json F]`: operator throughput through the descriptor path
//! (plan once, launch many on one stream, wait once per sample; medians of samples). GEMM in
//! GFLOP/s (`2·m·n·k`), memory-bound operators in GB/s (bytes every input and output moves
//! once), attention decode in GB/s of K and V read, and the per-launch cost of a tiny op.
//! The machine's own multi-threaded copy bandwidth is measured in the same run as the
//! memory-bound roofline. Peers (NumPy/OpenBLAS, onnxruntime): `ci/bench-peers.sh`.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use unirt::ops::{self, Plan};
use unirt::tensor::{DType, Tensor};
use unirt::{Backend, Device, Runtime};

use super::stats::{median, reps_for};
use crate::CliResult;

/// One row of the report: `gflops` for compute-bound rows, `gbps` for memory-bound ones,
/// both for a product with one row (a GEMV, bound by reading its matrix).
#[derive(Serialize)]
pub struct Row {
    pub(super) op: String,
    pub(super) dtype: String,
    pub(super) shape: String,
    pub(super) ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) gflops: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) gbps: Option<f64>,
}

#[derive(Serialize)]
struct Report<'a> {
    device: String,
    threads: usize,
    rows: &'a [Row],
}

/// Milliseconds per launch: `inner` launches per sample, samples for about 0.6 s.
fn time_plan(
    plan: &Plan,
    ins: &[&Tensor],
    outs: &[&Tensor],
    ws: Option<&Tensor>,
    inner: usize,
) -> CliResult<f64> {
    let rt = ins[0].runtime().clone();
    let s = rt.stream()?;
    let sample = || -> CliResult<f64> {
        let t = Instant::now();
        for _ in 0..inner {
            plan.launch(ins, outs, ws, s)?;
        }
        rt.sync_stream()?;
        Ok(t.elapsed().as_secs_f64() * 1e3 / inner as f64)
    };
    // Warm-up: page faults and caches, and at least 100 ms of launches, because a virtual
    // machine's idle vCPUs halt and the hypervisor adapts how fast it wakes them only after
    // repeated wake-ups (a 256³ GEMM launched and synchronised one at a time takes 0.4 ms for
    // its first few dozen launches here and 0.2 ms afterwards). The peers' script warms up
    // the same way.
    // The process's first workload warms up for longer: right after start (and after the
    // build that `ci/bench-peers.sh` runs first) the 256³ GEMM, the first row, measured 0.20
    // ms after 100 ms of warm-up where later rows and runs measure 0.10.
    static FIRST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
    let warm_for = if FIRST.swap(false, std::sync::atomic::Ordering::Relaxed) {
        Duration::from_millis(600)
    } else {
        Duration::from_millis(100)
    };
    let warm = Instant::now();
    let mut first = sample()?;
    while warm.elapsed() < warm_for {
        first = sample()?;
    }
    let reps = reps_for(
        Duration::from_secs_f64(first * inner as f64 / 1e3),
        Duration::from_millis(600),
        3,
        50,
    );
    let mut v = (0..reps)
        .map(|_| sample())
        .collect::<CliResult<Vec<f64>>>()?;
    Ok(median(&mut v))
}

fn outputs(plan: &Plan) -> CliResult<(Vec<Tensor>, Option<Tensor>)> {
    let outs = plan
        .outputs()
        .iter()
        .map(|d| Tensor::empty(d.layout.shape(), d.dtype, d.device))
        .collect::<unirt::Result<Vec<_>>>()?;
    let ws = match plan.workspace_size() {
        0 => None,
        n => Some(Tensor::empty(&[n], DType::U8, plan.device())?),
    };
    Ok((outs, ws))
}

fn run_plan(plan: &Plan, ins: &[&Tensor], inner: usize) -> CliResult<f64> {
    let (outs, ws) = outputs(plan)?;
    let o: Vec<&Tensor> = outs.iter().collect();
    time_plan(plan, ins, &o, ws.as_ref(), inner)
}

fn rand(shape: &[usize], dt: DType, dev: Device, seed: u64) -> CliResult<Tensor> {
    Ok(Tensor::rand_uniform(shape, -1.0, 1.0, seed, dt, dev)?)
}

fn gemm_row(dev: Device, dt: DType, m: usize, n: usize, k: usize) -> CliResult<Row> {
    let (a, b) = (rand(&[m, k], dt, dev, 1)?, rand(&[k, n], dt, dev, 2)?);
    let plan = ops::matmul::matmul(&a.desc(), &b.desc(), 1.0)?;
    let ms = run_plan(&plan, &[&a, &b], 1)?;
    let flops = 2.0 * (m * n * k) as f64;
    Ok(Row {
        op: "matmul".into(),
        dtype: dt.name().into(),
        shape: format!("{m}x{n}x{k}"),
        ms,
        gflops: Some(flops / (ms * 1e6)),
        // A product with one row (GEMV) is bound by reading B: its bandwidth too.
        gbps: (m == 1).then(|| ((m * k + k * n + m * n) * dt.size()) as f64 / (ms * 1e6)),
    })
}

/// `gemm_row` with B the transpose of a weight stored `[n, k]` (`x · Wᵀ`, a linear layer's
/// layout: B has unit stride along k).
fn gemm_bt_row(dev: Device, dt: DType, m: usize, n: usize, k: usize) -> CliResult<Row> {
    let (a, w) = (rand(&[m, k], dt, dev, 1)?, rand(&[n, k], dt, dev, 2)?);
    let b = w.transpose(0, 1)?;
    let plan = ops::matmul::matmul(&a.desc(), &b.desc(), 1.0)?;
    let ms = run_plan(&plan, &[&a, &b], 1)?;
    Ok(Row {
        op: "matmul_bt".into(),
        dtype: dt.name().into(),
        shape: format!("{m}x{n}x{k}"),
        ms,
        gflops: Some(2.0 * (m * n * k) as f64 / (ms * 1e6)),
        gbps: (m == 1).then(|| ((m * k + k * n + m * n) * dt.size()) as f64 / (ms * 1e6)),
    })
}

fn bw_row(op: &str, dt: DType, shape: String, ms: f64, bytes: usize) -> Row {
    Row {
        op: op.into(),
        dtype: dt.name().into(),
        shape,
        ms,
        gflops: None,
        gbps: Some(bytes as f64 / (ms * 1e6)),
    }
}

/// Rows of memory-bound operators on tensors of `mib` MiB.
fn memory_rows(dev: Device, dt: DType, mib: usize, rows: &mut Vec<Row>) -> CliResult<()> {
    let n = mib * (1 << 20) / dt.size();
    let width = 4096;
    let shape = [n / width, width];
    let s = format!("{}x{}", shape[0], shape[1]);
    let (a, b) = (rand(&shape, dt, dev, 3)?, rand(&shape, dt, dev, 4)?);
    let bytes = n * dt.size();
    let bin = |op: ops::BinaryOp| ops::elementwise::binary(op, &a.desc(), &b.desc());
    rows.push(bw_row(
        "add",
        dt,
        s.clone(),
        run_plan(&bin(ops::BinaryOp::Add)?, &[&a, &b], 1)?,
        3 * bytes,
    ));
    rows.push(bw_row(
        "mul",
        dt,
        s.clone(),
        run_plan(&bin(ops::BinaryOp::Mul)?, &[&a, &b], 1)?,
        3 * bytes,
    ));
    // A reduction into one output (wgpu splits it among workgroups).
    let sum = ops::reduce::reduce(ops::reduce::ReduceOp::Sum, &a.desc(), &[], false)?;
    rows.push(bw_row(
        "sum_all",
        dt,
        s.clone(),
        run_plan(&sum, &[&a], 1)?,
        bytes,
    ));
    // argmax along the rows (a greedy pick over rows of logits).
    let argmax = ops::reduce::reduce(ops::reduce::ReduceOp::Argmax, &a.desc(), &[1], false)?;
    rows.push(bw_row(
        "argmax_rows",
        dt,
        s.clone(),
        run_plan(&argmax, &[&a], 1)?,
        bytes,
    ));
    // Strided reads: a bias broadcast along rows, and a transposed input made contiguous.
    let bias = rand(&[width], dt, dev, 7)?;
    rows.push(bw_row(
        "add_bias_bcast",
        dt,
        s.clone(),
        run_plan(
            &ops::elementwise::binary(ops::BinaryOp::Add, &a.desc(), &bias.desc())?,
            &[&a, &bias],
            1,
        )?,
        2 * bytes,
    ));
    let t = b.reshape(&[shape[1], shape[0]])?.transpose(0, 1)?;
    rows.push(bw_row(
        "rearrange_transp",
        dt,
        s.clone(),
        run_plan(&ops::rearrange::copy(&t.desc())?, &[&t], 1)?,
        2 * bytes,
    ));
    let silu = ops::elementwise::unary(ops::UnaryOp::Silu, &a.desc())?;
    rows.push(bw_row(
        "silu",
        dt,
        s.clone(),
        run_plan(&silu, &[&a], 1)?,
        2 * bytes,
    ));
    let gelu = ops::elementwise::unary(ops::UnaryOp::Gelu, &a.desc())?;
    rows.push(bw_row(
        "gelu",
        dt,
        s.clone(),
        run_plan(&gelu, &[&a], 1)?,
        2 * bytes,
    ));
    let sw = ops::elementwise::swiglu(&a.desc(), &b.desc())?;
    rows.push(bw_row(
        "swiglu",
        dt,
        s.clone(),
        run_plan(&sw, &[&a, &b], 1)?,
        3 * bytes,
    ));
    let w = rand(&[width], dt, dev, 5)?;
    let rms = ops::norm::rms_norm(&a.desc(), &w.desc(), 1e-6)?;
    rows.push(bw_row(
        "rms_norm",
        dt,
        s.clone(),
        run_plan(&rms, &[&a, &w], 1)?,
        2 * bytes,
    ));
    let sm = ops::softmax::softmax(&a.desc(), -1, false)?;
    rows.push(bw_row(
        "softmax",
        dt,
        s.clone(),
        run_plan(&sm, &[&a], 1)?,
        2 * bytes,
    ));
    // rope on [seq, 32 heads, 128].
    let seq = n / (32 * 128);
    let x = rand(&[seq, 32, 128], dt, dev, 6)?;
    let pos_v: Vec<i64> = (0..seq as i64).collect();
    let pos = Tensor::from_slice(&pos_v, &[seq], dev)?;
    let rp = ops::rope::rope(&x.desc(), &pos.desc(), 10000.0, false)?;
    rows.push(bw_row(
        "rope",
        dt,
        format!("{seq}x32x128"),
        run_plan(&rp, &[&x, &pos], 1)?,
        2 * bytes,
    ));
    Ok(())
}

/// The machine's multi-threaded copy bandwidth (read + write bytes), on host buffers split
/// across rayon's threads: the roofline of the memory-bound rows.
fn machine_copy_row(mib: usize) -> Row {
    use rayon::prelude::*;
    let n = mib << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let chunk = n.div_ceil(rayon::current_num_threads() * 4);
    let ms = host_median_ms(|| {
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s))
    });
    bw_row("machine_copy", DType::U8, format!("{n}"), ms, 2 * n)
}

/// Median milliseconds of 15 runs of `f` on the host, after one untimed run.
fn host_median_ms(mut f: impl FnMut()) -> f64 {
    let mut run = || {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64() * 1e3
    };
    run();
    let mut v: Vec<f64> = (0..15).map(|_| run()).collect();
    median(&mut v)
}

/// The machine's multi-threaded read bandwidth (a sum over host buffers split across rayon's
/// threads): the roofline of rows that only stream their inputs, such as attention decode
/// reading a KV cache.
fn machine_read_row(mib: usize) -> Row {
    use rayon::prelude::*;
    let n = (mib << 20) / 8;
    let src: Vec<u64> = (0..n as u64).collect();
    let chunk = n.div_ceil(rayon::current_num_threads() * 4);
    let ms = host_median_ms(|| {
        let sum = src
            .par_chunks(chunk)
            .map(|c| c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(sum);
    });
    bw_row("machine_read", DType::U8, format!("{}", n * 8), ms, n * 8)
}

fn attention_row(dev: Device, dt: DType, kv: usize) -> CliResult<Row> {
    let (h, d) = (32, 128);
    let q = rand(&[1, h, 1, d], dt, dev, 7)?;
    let k = rand(&[1, h, kv, d], dt, dev, 8)?;
    let v = rand(&[1, h, kv, d], dt, dev, 9)?;
    let plan = ops::attention::attention(&q.desc(), &k.desc(), &v.desc(), true, None)?;
    let ms = run_plan(&plan, &[&q, &k, &v], 1)?;
    let bytes = 2 * h * kv * d * dt.size();
    Ok(bw_row(
        "attention_decode",
        dt,
        format!("1x{h}x{kv}x{d}"),
        ms,
        bytes,
    ))
}

/// `random_sample` over one row of `vocab` logits at temperature 0.8 (time only: a sampler
/// reads its row several times, however it cuts the order).
fn sample_row(dev: Device, vocab: usize, top_k: usize, top_p: f64) -> CliResult<Row> {
    let x = rand(&[1, vocab], DType::F32, dev, 17)?;
    let plan = ops::sample::random_sample(&x.desc(), 0.37, 0.8, top_k, top_p)?;
    Ok(Row {
        op: if top_k == 0 {
            format!("sample_top_p{top_p}")
        } else {
            format!("sample_top_k{top_k}")
        },
        dtype: "f32".into(),
        shape: format!("1x{vocab}"),
        ms: run_plan(&plan, &[&x], 1)?,
        gflops: None,
        gbps: None,
    })
}

/// Causal prefill attention over `seq` tokens (32 heads × 128), in GFLOP/s of the causal half
/// of the two matrix products (`2 · 2 · h · seq² · d / 2`).
fn prefill_row(dev: Device, dt: DType, seq: usize) -> CliResult<Row> {
    let (h, d) = (32, 128);
    let q = rand(&[1, h, seq, d], dt, dev, 12)?;
    let k = rand(&[1, h, seq, d], dt, dev, 13)?;
    let v = rand(&[1, h, seq, d], dt, dev, 14)?;
    let plan = ops::attention::attention(&q.desc(), &k.desc(), &v.desc(), true, None)?;
    let ms = run_plan(&plan, &[&q, &k, &v], 1)?;
    let flops = 2.0 * (h * seq * seq * d) as f64;
    Ok(Row {
        op: "attention_prefill".into(),
        dtype: dt.name().into(),
        shape: format!("{seq}x{h}x{seq}x{d}"),
        ms,
        gflops: Some(flops / (ms * 1e6)),
        gbps: None,
    })
}

/// The GPU-sized workloads (the goals; `scripts/bench_ops_torch.py` runs the same
/// shapes in PyTorch): GEMM at 4096³ and LLM shapes, memory-bound operators on 256 MiB,
/// bf16 attention decode over a 4k cache and prefill over 2k tokens.
fn gpu_rows(dev: Device, quick: bool) -> CliResult<Vec<Row>> {
    let mut rows = Vec::new();
    let big = if quick { 1024 } else { 4096 };
    for dt in [DType::F32, DType::F16, DType::BF16] {
        rows.push(gemm_row(dev, dt, big, big, big)?);
    }
    if !quick {
        for (m, n, k) in [(1, 4096, 4096), (64, 11008, 4096), (2048, 4096, 4096)] {
            rows.push(gemm_row(dev, DType::BF16, m, n, k)?);
        }
        rows.push(gemm_bt_row(dev, DType::BF16, 4096, 4096, 4096)?);
    }
    let mib = if quick { 16 } else { 256 };
    memory_rows(dev, DType::F32, mib, &mut rows)?;
    memory_rows(dev, DType::BF16, mib, &mut rows)?;
    let src = rand(&[mib << 18], DType::F32, dev, 15)?;
    let cast = ops::cast::cast(&src.desc(), DType::BF16)?;
    rows.push(bw_row(
        "cast",
        DType::F32,
        format!("{}", mib << 18),
        run_plan(&cast, &[&src], 1)?,
        6 * (mib << 18),
    ));
    let t = rand(&[mib << 16, 4], DType::F32, dev, 16)?.transpose(0, 1)?;
    let re = ops::rearrange::copy(&t.desc())?;
    rows.push(bw_row(
        "rearrange",
        DType::F32,
        format!("4x{}", mib << 16),
        run_plan(&re, &[&t], 1)?,
        8 * (mib << 18),
    ));
    rows.push(attention_row(dev, DType::BF16, 4096)?);
    rows.push(prefill_row(
        dev,
        DType::BF16,
        if quick { 256 } else { 2048 },
    )?);
    Ok(rows)
}

/// The device of a bench command, its runtime and the host threads, after the header line.
fn open(bench: &str, device: &str) -> CliResult<(Device, Arc<Runtime>, usize)> {
    let dev: Device = device.parse()?;
    let rt = Runtime::get(dev)?;
    let threads = rayon::current_num_threads();
    println!(
        "unirt bench {bench} on {dev} ({}), {threads} threads",
        rt.backend().info().name
    );
    Ok((dev, rt, threads))
}

pub fn run(device: &str, json: Option<&Path>, quick: bool) -> CliResult<ExitCode> {
    let (dev, rt, threads) = open("ops", device)?;
    let gpu = dev.kind == unirt::DeviceKind::Cuda;
    let mut rows = if gpu {
        gpu_rows(dev, quick)?
    } else {
        Vec::new()
    };
    let squares: &[usize] = if gpu {
        &[]
    } else if quick {
        &[256, 512]
    } else {
        &[256, 512, 1024, 2048]
    };
    for &n in squares {
        rows.push(gemm_row(dev, DType::F32, n, n, n)?);
    }
    for dt in [DType::F16, DType::BF16].into_iter().filter(|_| !gpu) {
        rows.push(gemm_row(
            dev,
            dt,
            squares[squares.len() - 1],
            squares[squares.len() - 1],
            squares[squares.len() - 1],
        )?);
    }
    // Issue 14's wgpu GEMM goals are at 4096³ (beside cuBLAS, through ci/bench_ops_torch.py):
    // a GPU adapter runs that size too (a software one would take minutes per product).
    let gpu_adapter = dev.kind == unirt::DeviceKind::Wgpu
        && rt.backend().info().class != unirt::DeviceClass::Software;
    // The quick run takes 2048³ there: enough work for matrix units (`UNIRT_WGPU_COOP`) to
    // show, in a smoke test's time.
    if gpu_adapter {
        let s = if quick { 2048 } else { 4096 };
        for dt in [DType::F32, DType::F16] {
            match gemm_row(dev, dt, s, s, s) {
                Ok(r) => rows.push(r),
                Err(e) => println!("matmul {dt} {s}x{s}x{s}: not run ({e})"),
            }
        }
    }
    // The LLM shapes: GEMVs (the decode step's products: a 4096² weight and the tiny model's
    // 256 × 1024) in both runs, the larger products (four decode steps batched, a prefill
    // chunk) in the full one.
    let llm: &[(DType, usize, usize, usize)] = if gpu {
        &[]
    } else if quick {
        &[(DType::F32, 1, 4096, 4096), (DType::F32, 1, 1024, 256)]
    } else {
        &[
            (DType::F32, 1, 1024, 256),
            (DType::F32, 1, 4096, 4096),
            (DType::F32, 4, 4096, 4096),
            (DType::F32, 64, 11008, 4096),
            (DType::BF16, 1, 4096, 4096),
            (DType::F16, 1, 4096, 4096),
            (DType::BF16, 64, 11008, 4096),
        ]
    };
    for &(dt, m, n, k) in llm {
        // A device may refuse a shape with a typed error (a weight larger than one wgpu
        // storage binding): reported, and the run goes on.
        match gemm_row(dev, dt, m, n, k) {
            Ok(r) => rows.push(r),
            Err(e) => println!("matmul {dt} {m}x{n}x{k}: not run ({e})"),
        }
    }
    // Against a linear layer's weight as stored, `[out, in]` (`x · Wᵀ`): the decode GEMV,
    // and a prefill chunk's MLP up-projection (beside its row-major twin above).
    if !gpu && !quick {
        for (m, n, k) in [(1, 4096, 4096), (64, 11008, 4096)] {
            match gemm_bt_row(dev, DType::F32, m, n, k) {
                Ok(r) => rows.push(r),
                Err(e) => println!("matmul_bt f32 {m}x{n}x{k}: not run ({e})"),
            }
        }
    }
    let sizes: &[usize] = if gpu {
        &[]
    } else if quick {
        &[16]
    } else {
        &[16, 64]
    };
    for &mib in sizes {
        rows.push(machine_copy_row(mib));
        memory_rows(dev, DType::F32, mib, &mut rows)?;
    }
    if !quick && !gpu {
        memory_rows(dev, DType::BF16, 16, &mut rows)?;
        memory_rows(dev, DType::F16, 16, &mut rows)?;
    } else if dev.kind == unirt::DeviceKind::Wgpu {
        // f16 is stored natively or packed in words depending on the adapter (and on
        // UNIRT_WGPU_NO_F16): its rows show which costs what.
        memory_rows(dev, DType::F16, 16, &mut rows)?;
    }
    for kv in if gpu {
        &[][..]
    } else if quick {
        &[1024][..]
    } else {
        &[1024, 2048, 4096][..]
    } {
        // The roofline of each decode row: the host's read bandwidth over as many bytes as
        // its K and V (32 heads × 128 × 2 × 4 bytes per key: 32 MiB per 1024 keys), since a
        // 128 MiB cache and a 32 MiB one sit differently in the caches.
        if dev.kind == unirt::DeviceKind::Cpu {
            rows.push(machine_read_row(*kv / 32));
        }
        rows.push(attention_row(dev, DType::F32, *kv)?);
    }
    // Decode loops whose shapes change every step.
    if !gpu {
        rows.extend(super::ops_growing::rows(dev, if quick { 16 } else { 64 })?);
    }
    // Sampling one token from an LLM-sized vocabulary: nucleus (top-p) and top-k.
    for (top_k, top_p) in [(0, 0.9), (50, 1.0)] {
        rows.push(sample_row(dev, 32_000, top_k, top_p)?);
    }
    // Per-launch cost of a tiny op (16 elements), launches back to back.
    let (a, b) = (
        rand(&[16], DType::F32, dev, 10)?,
        rand(&[16], DType::F32, dev, 11)?,
    );
    let plan = ops::elementwise::binary(ops::BinaryOp::Add, &a.desc(), &b.desc())?;
    let ms = run_plan(&plan, &[&a, &b], 2000)?;
    rows.push(bw_row(
        "add_tiny_per_launch",
        DType::F32,
        "16".into(),
        ms,
        3 * 16 * 4,
    ));
    if dev.kind == unirt::DeviceKind::Wgpu {
        // The plain-wgpu floor, in the same run: one elementwise op and one GEMM.
        let info = rt.backend().info().clone();
        let floor = super::ops_floor::Floor::new(&info.name, &info.api)?;
        let n = sizes[0] * (1 << 20) / 4;
        let ms = floor.add(n)?;
        rows.push(bw_row(
            "plain_wgpu_add",
            DType::F32,
            format!("{}x4096", n / 4096),
            ms,
            3 * 4 * n,
        ));
        let g = 1024;
        let ms = floor.gemm(g)?;
        rows.push(Row {
            op: "plain_wgpu_matmul".into(),
            dtype: "f32".into(),
            shape: format!("{g}x{g}x{g}"),
            ms,
            gflops: Some(2.0 * (g * g * g) as f64 / (ms * 1e6)),
            gbps: None,
        });
    }
    report(dev, threads, &rows, json)
}

/// Prints `rows` as a table and writes them to `json` where asked.
fn report(dev: Device, threads: usize, rows: &[Row], json: Option<&Path>) -> CliResult<ExitCode> {
    println!(
        "{:<20} {:<5} {:>16} {:>10} {:>10} {:>10}",
        "op", "dtype", "shape", "ms", "GFLOP/s", "GB/s"
    );
    for r in rows {
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        println!(
            "{:<20} {:<5} {:>16} {:>10.4} {:>10} {:>10}",
            r.op,
            r.dtype,
            r.shape,
            r.ms,
            f(r.gflops),
            f(r.gbps)
        );
    }
    if let Some(p) = json {
        let report = Report {
            device: dev.to_string(),
            threads,
            rows,
        };
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `unirt bench attention`: bf16 attention alone (32 heads × 128) — causal prefill over
/// `seqs` tokens, decode over a 4k cache — the rows `ci/bench_ops_torch.py --attention`
/// times with PyTorch's SDPA.
pub fn attention(device: &str, json: Option<&Path>, seqs: &[usize]) -> CliResult<ExitCode> {
    let (dev, _, threads) = open("attention", device)?;
    let mut rows = vec![attention_row(dev, DType::BF16, 4096)?];
    for &seq in seqs {
        rows.push(prefill_row(dev, DType::BF16, seq)?);
    }
    report(dev, threads, &rows, json)
}
