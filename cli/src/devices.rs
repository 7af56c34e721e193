//! `unirt devices [--json]`.

use std::process::ExitCode;

use unirt::Discovery;

use crate::CliResult;

pub fn run(json: bool) -> CliResult<ExitCode> {
    let d = unirt::discover();
    if json {
        println!("{}", serde_json::to_string_pretty(d)?);
    } else {
        print_table(d);
    }
    Ok(ExitCode::SUCCESS)
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The human table: one block per vendor, one line per device, then one line per device found
/// that could not be opened (not numbered: it is not a device), with the driver's reason.
pub fn print_table(d: &Discovery) {
    for b in &d.backends {
        print_backend(b);
        for u in &b.unusable {
            println!(
                "  unusable  {:<44} {:<8} {}: {}",
                u.name, u.api, u.driver, u.reason
            );
        }
    }
}

fn print_backend(b: &unirt::BackendReport) {
    {
        match &b.reason {
            Some(reason) => {
                println!("{:<5} unavailable: {reason}", b.kind.as_str());
                if b.kind == unirt::DeviceKind::Cuda {
                    println!("      blas: {}", unirt::vendors::cuda::blas_summary());
                }
            }
            None => {
                println!(
                    "{:<5} available, {} device(s)",
                    b.kind.as_str(),
                    b.devices.len()
                );
                for dev in &b.devices {
                    println!(
                        "  {}:{:<3} {:<44} {:<8} {:>10}  {}",
                        b.kind.as_str(),
                        dev.index,
                        dev.name,
                        dev.api,
                        gib(dev.memory_total),
                        dev.driver
                    );
                    if let Some((_, blas)) = dev.details.iter().find(|(k, _)| k == "blas") {
                        println!("        blas: {blas}");
                    }
                }
            }
        }
    }
}
