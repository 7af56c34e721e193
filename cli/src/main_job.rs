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
    let failed = results.iter().any(|r| r.status == Status::Failed);
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
