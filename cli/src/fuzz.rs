//! `unirt fuzz [--device D] [--seconds N] [--seed S] [--runs N] [--steps N] [--op-steps N]`:
//! the random-sequence fuzzer of the conformance crate (every entry point with live, freed and
//! bogus handles and pointers, captures begun and ended at random, streams destroyed with work
//! queued, then random operator calls) on real devices — the crash hunt `ci/gpu.sh` runs on a
//! GPU machine, where there is no cargo to build the test binary.

use std::process::ExitCode;
use std::time::Duration;

use unirt_conformance::{clock_seed, fuzz_device, say, Ctx, FuzzOptions};

use crate::conformance::select_devices;
use crate::CliResult;

/// Fuzzes every selected device for `seconds` in all (shared equally).
pub fn run(
    device: Option<&str>,
    seconds: u64,
    seed: Option<u64>,
    runs: Option<u64>,
    steps: usize,
    op_steps: usize,
) -> CliResult<ExitCode> {
    let devices = select_devices(device)?;
    if devices.is_empty() {
        return Err("fuzz: no available device".into());
    }
    let first = seed.unwrap_or_else(clock_seed);
    let options = FuzzOptions {
        first_seed: first,
        time: Duration::from_secs(seconds) / devices.len() as u32,
        max_runs: runs,
        steps,
        op_steps,
    };
    say(format!(
        "fuzz: {seconds} s over {} device(s), {steps} runtime + {op_steps} operator calls per \
         seed, first seed {first:#x} (replay one: unirt fuzz --device <device> --seed <seed> \
         --runs 1)",
        devices.len()
    ));
    let mut failures = Vec::new();
    for device in devices {
        match unirt::open(device) {
            Ok(backend) => {
                let ctx = Ctx { device, backend };
                failures.extend(fuzz_device(&ctx, &options, &mut say, &mut || None).1);
            }
            Err(e) => failures.push(format!("{device}: does not open: {e}")),
        }
    }
    if failures.is_empty() {
        say("fuzz: ok".into());
        return Ok(ExitCode::SUCCESS);
    }
    say(format!("fuzz: {} failure(s):", failures.len()));
    for f in &failures {
        say(format!("  {f}"));
    }
    Ok(ExitCode::FAILURE)
}
