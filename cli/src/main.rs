//! The `unirt` command: the device table, the conformance suite and the benchmarks.
//!
//! With no arguments it runs the main job: every vendor probed, then the conformance suite on
//! every available device, then a summary per device.

mod bench;
mod conformance;
mod devices;
mod fuzz;
mod kernels;
/// The Llama decode step of `examples/llama_block.rs`, shared with the main job and
/// `bench graph`.
#[path = "../../examples/llama/model.rs"]
mod llama_model;
mod main_job;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "unirt",
    version,
    about = "One runtime for every accelerator on this machine",
    long_about = "One runtime for every accelerator on this machine.\n\n\
        With no command, `unirt` runs the main job: it probes every vendor, lists the devices, \
        runs the conformance suite on every available device and prints a summary per device \
        (exit 1 when a case failed). No subcommand does that; `cargo run --release` at the \
        repository root runs it."
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Lists every vendor probed and its devices.
    Devices {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Also list every place each run-time library (libcuda, NVRTC) was looked for.
        #[arg(long, short)]
        verbose: bool,
    },
    /// Runs the conformance suite.
    Conformance {
        /// A device (`cpu:0`) or a whole vendor (`wgpu`); every available device when omitted.
        #[arg(long)]
        device: Option<String>,
        /// Only cases whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        /// Write the results as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write the results as JUnit XML.
        #[arg(long)]
        junit: Option<PathBuf>,
    },
    /// Lists the operator kernels registered per backend and dtype (`--list`), or compiles
    /// kernels ahead of time (no GPU needed): every CUDA kernel to CUBIN with NVRTC
    /// (`--compile cuda`).
    Kernels {
        /// Print the op × backend × dtype table of the kernel registry.
        #[arg(long, conflicts_with = "compile")]
        list: bool,
        /// The vendor whose kernels to compile (`cuda`).
        #[arg(long)]
        compile: Option<String>,
        /// Comma-separated target architectures.
        #[arg(long, default_value = "sm_70,sm_80,sm_90")]
        arch: String,
        /// Write the results as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Fuzzes the runtime and the operators with seeded random call sequences (live, freed and
    /// bogus handles, captures at random, streams destroyed with work queued): any panic,
    /// crash or unusable device is a failure. Each seed is printed before it runs.
    Fuzz {
        /// A device (`cuda:0`) or a whole vendor (`wgpu`); every available device when omitted.
        #[arg(long)]
        device: Option<String>,
        /// Total time, shared equally by the devices (at least one seed each).
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// The first seed (default: from the clock); seed i is seed + i.
        #[arg(long, value_parser = parse_seed)]
        seed: Option<u64>,
        /// At most this many seeds per device (`--runs 1` with `--seed` replays one).
        #[arg(long)]
        runs: Option<u64>,
        /// Runtime calls per seed.
        #[arg(long, default_value_t = 2000)]
        steps: usize,
        /// Operator calls per seed, after the runtime calls.
        #[arg(long, default_value_t = 60)]
        op_steps: usize,
    },
    /// Benchmarks, each against the baseline named in its row.
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
    },
}

/// A seed in decimal or `0x` hexadecimal (the fuzzer prints them in hex).
fn parse_seed(s: &str) -> Result<u64, String> {
    unirt_conformance::parse_u64(s).ok_or_else(|| format!("bad seed {s:?}"))
}

/// Errors of the command line front end: a unirt error or an I/O failure writing a report.
pub type CliResult<T> = Result<T, Box<dyn std::error::Error>>;

/// A closed pipe ends the command quietly, as it ends `ls | head`: Rust ignores SIGPIPE, so
/// every `println!` into a closed pipe would otherwise panic ("failed printing to stdout").
fn default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: the first thing main does, before any thread exists; SIG_DFL is a valid action
    // for SIGPIPE and no handler of ours is replaced.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    default_sigpipe();
    let args = Args::parse();
    let result = match args.command {
        None => main_job::run(),
        Some(Command::Devices { json, verbose }) => devices::run(json, verbose),
        Some(Command::Conformance {
            device,
            filter,
            json,
            junit,
        }) => conformance::run(
            device.as_deref(),
            filter.as_deref(),
            json.as_deref(),
            junit.as_deref(),
        ),
        Some(Command::Kernels {
            list,
            compile,
            arch,
            json,
        }) => match (list, compile) {
            (true, _) => kernels::list(json.as_deref()),
            (false, Some(compile)) => kernels::run(&compile, &arch, json.as_deref()),
            (false, None) => Err("kernels: give --list or --compile cuda".into()),
        },
        Some(Command::Fuzz {
            device,
            seconds,
            seed,
            runs,
            steps,
            op_steps,
        }) => fuzz::run(device.as_deref(), seconds, seed, runs, steps, op_steps),
        Some(Command::Bench { which }) => bench::run(which),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("unirt: {e}");
            ExitCode::from(2)
        }
    }
}
