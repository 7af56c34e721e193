//! `unirt bench …`: each benchmark measures unirt and its baseline in the same run.

mod alloc;
mod cuda;
mod dispatch;
mod graph;
mod memcpy;
mod ops;
mod ops_floor;
mod ops_growing;
pub mod stats;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use crate::CliResult;

/// `unirt bench <what>`: which benchmark to run.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// H2D, D2H and D2D copies from 4 KiB to 256 MiB beside libc memcpy between host buffers.
    Memcpy {
        #[arg(long, default_value = "cpu:0")]
        device: String,
        #[arg(long)]
        json: Option<PathBuf>,
        /// Largest size in MiB (256 by default).
        #[arg(long, default_value_t = 256)]
        max_mib: usize,
    },
    /// Alloc + free pairs from 512 B to 64 MiB: the caching allocator (cache hits) beside the
    /// backend's raw allocation and the system malloc.
    Alloc {
        #[arg(long, default_value = "cpu:0")]
        device: String,
        #[arg(long)]
        json: Option<PathBuf>,
        /// Largest size in MiB (64 by default).
        #[arg(long, default_value_t = 64)]
        max_mib: usize,
    },
    /// CUDA only: pinned and pageable H2D/D2H beside plain cudarc, and 100 tiny kernels
    /// launched one by one vs one captured-graph replay.
    Cuda {
        #[arg(long, default_value = "cuda:0")]
        device: String,
        #[arg(long)]
        json: Option<PathBuf>,
        /// Largest copy in MiB (256 by default).
        #[arg(long, default_value_t = 256)]
        max_mib: usize,
    },
    /// Kernel launches: 100 × add_f32 on 1 Mi floats beside a plain-wgpu program, and 100 ×
    /// add_f32 on 256 floats issued eagerly beside the same replayed from a capture.
    Dispatch {
        #[arg(long, default_value = "wgpu:0")]
        device: String,
        #[arg(long)]
        json: Option<PathBuf>,
        /// Timed samples of each side (medians are reported).
        #[arg(long, default_value_t = 15)]
        reps: usize,
    },
    /// Operators through plans: GEMM GFLOP/s (256–2048 square, LLM shapes), GB/s of
    /// memory-bound operators on 16 and 64 MiB, attention decode, per-launch overhead.
    Ops {
        #[arg(long, default_value = "cpu:0")]
        device: String,
        #[arg(long)]
        json: Option<PathBuf>,
        /// A short run (small sizes only), for smoke tests.
        #[arg(long)]
        quick: bool,
    },
    /// bf16 attention alone (32 heads × 128): decode over a 4k cache and causal prefill over
    /// each `--seq` (PyTorch's SDPA beside it: `ci/bench_ops_torch.py --attention`).
    Attention {
        #[arg(long, default_value = "cuda:0")]
        device: String,
        #[arg(long)]
        json: Option<PathBuf>,
        /// Prefill lengths in tokens.
        #[arg(long, value_delimiter = ',', default_values_t = [512, 2048, 4096])]
        seq: Vec<usize>,
    },
    /// Operator graphs: 100 tiny operators, a Llama decode step and a 4-operator elementwise
    /// chain over 16 MiB, eager vs replayed (fused vs unfused; planned vs naive memory).
    Graph {
        #[arg(long, default_value = "cpu:0")]
        device: String,
        #[arg(long)]
        json: Option<PathBuf>,
        /// A few rounds per workload only (for smoke tests; figures are not meaningful).
        #[arg(long)]
        quick: bool,
    },
    /// Enqueue latency of an async command on an idle stream, and event record + query.
    Latency {
        #[arg(long, default_value = "cpu:0")]
        device: String,
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

pub fn run(which: BenchCommand) -> CliResult<ExitCode> {
    match which {
        BenchCommand::Memcpy {
            device,
            json,
            max_mib,
        } => memcpy::run(&device, json.as_deref(), max_mib),
        BenchCommand::Alloc {
            device,
            json,
            max_mib,
        } => alloc::run(&device, json.as_deref(), max_mib),
        BenchCommand::Cuda {
            device,
            json,
            max_mib,
        } => cuda::run(&device, json.as_deref(), max_mib),
        BenchCommand::Dispatch { device, json, reps } => {
            dispatch::run(&device, json.as_deref(), reps)
        }
        BenchCommand::Graph {
            device,
            json,
            quick,
        } => graph::run(&device, json.as_deref(), quick),
        BenchCommand::Attention { device, json, seq } => {
            ops::attention(&device, json.as_deref(), &seq)
        }
        BenchCommand::Latency { device, json } => memcpy::latency(&device, json.as_deref()),
        BenchCommand::Ops {
            device,
            json,
            quick,
        } => ops::run(&device, json.as_deref(), quick),
    }
}
