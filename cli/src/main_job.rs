//! `unirt` with no arguments: discover, then prove every available device works.

use std::process::ExitCode;

use unirt_conformance::report::print_summary;
use unirt_conformance::Status;

use crate::{conformance, devices, CliResult};

pub fn run() -> CliResult<ExitCode> {
    let d = unirt::discover();
    println!("== devices");
    devices::print_table(d);
    let devs = d.devices();
    if devs.is_empty() {
        return Err(conformance::no_device_message().into());
    }
    println!();
    println!("== conformance on {} device(s)", devs.len());
    let results = conformance::run_all(&devs, None);
    for r in results.iter().filter(|r| r.status != Status::Passed) {
        println!(
            "{:<8} {:<12} {:<44} {}",
            r.device,
            r.status.as_str(),
            r.case,
            r.message.as_deref().unwrap_or("")
        );
    }
    print_summary(&results);
    let mut failed = results.iter().any(|r| r.status == Status::Failed);
    failed |= !decode_step_on_every_device(&devs);
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The Llama decode step of `examples/llama_block.rs` on every device, briefly: eager vs a
/// replayed operator graph (tokens/s), bitwise eager = replay, devices agreeing with the
/// first. A device lacking kernels is reported, not failed. False when a check failed.
fn decode_step_on_every_device(devs: &[unirt::Device]) -> bool {
    use crate::llama_model::{agree, missing_kernels, run_device, Config};
    println!();
    println!(
        "== llama decode step (graph replay) on {} device(s)",
        devs.len()
    );
    let mut ok = true;
    let mut first = None;
    for &device in devs {
        let missing = missing_kernels(device);
        if !missing.is_empty() {
            println!("{device:<8} not run: no kernels for {}", missing.join(", "));
            continue;
        }
        match run_device(device, Config::TINY, 8, 32) {
            Ok(r) => {
                let agrees = match &first {
                    None => "reference".to_string(),
                    Some(f) => match agree(f, &r, 1e-3) {
                        Ok(n) => format!("agrees with {} on {n} steps", f.device),
                        Err(e) => {
                            ok = false;
                            format!("DISAGREES: {e}")
                        }
                    },
                };
                ok &= r.replay_bitwise_equal;
                println!(
                    "{device:<8} eager {:>8.1} tok/s   replay {:>8.1} tok/s ({:.2}x)   replay bitwise = eager: {}   {agrees}",
                    r.eager_tokens_per_s,
                    r.replay_tokens_per_s,
                    r.replay_tokens_per_s / r.eager_tokens_per_s,
                    if r.replay_bitwise_equal { "yes" } else { "NO" }
                );
                if first.is_none() {
                    first = Some(r);
                }
            }
            Err(e) => {
                ok = false;
                println!("{device:<8} FAILED: {e}");
            }
        }
    }
    ok
}
