//! `unirt devices [--json]`.

use std::process::ExitCode;

use unirt::Discovery;

use crate::CliResult;

pub fn run(json: bool, verbose: bool) -> CliResult<ExitCode> {
    let d = unirt::discover();
    let searches = verbose.then(unirt::discovery::library_searches);
    if json {
        let mut v = serde_json::to_value(d)?;
        if let (Some(s), Some(obj)) = (&searches, v.as_object_mut()) {
            obj.insert("library_searches".into(), serde_json::to_value(s)?);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_table(d);
        for s in searches.iter().flatten() {
            print_search(s);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Where one library was looked for, and what was found.
fn print_search(s: &unirt::discovery::LibrarySearch) {
    println!(
        "{} {}: {} place(s) searched ({} overrides them all)",
        s.kind.as_str(),
        s.library,
        s.searched.len(),
        s.env
    );
    for place in &s.searched {
        println!("  searched  {place}");
    }
    if s.found.is_empty() {
        println!("  found     nothing");
    }
    for f in &s.found {
        println!("  found     {f}");
    }
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
                    if let Some((_, m)) = dev.details.iter().find(|(k, _)| k == "matrix_units") {
                        println!("        matrix units: {m}");
                    }
                }
            }
        }
    }
}
