//! `unirt conformance [--device D] [--filter S] [--json FILE] [--junit FILE]`.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};
use unirt::{Device, DeviceKind};
use unirt_conformance::report::{print_summary, print_table, write_json, write_junit};
use unirt_conformance::{self as conformance, CaseResult, Status};

use crate::CliResult;

/// The devices a `--device` argument names: `cpu:0` one device, `wgpu` every wgpu device,
/// nothing every available device.
pub fn select_devices(arg: Option<&str>) -> CliResult<Vec<Device>> {
    let d = unirt::discover();
    Ok(match arg {
        None => d.devices(),
        Some(s) if s.contains(':') => {
            let dev = s.parse::<Device>()?;
            // A vendor that is available but has no such index is a typo, not a skip.
            if let Some(b) = d.backend(dev.kind) {
                if b.available() && dev.index >= b.devices.len() {
                    return Err(unirt::Error::DeviceNotFound(format!(
                        "{dev} ({} has {} device(s))",
                        dev.kind,
                        b.devices.len()
                    ))
                    .into());
                }
            }
            vec![dev]
        }
        Some(s) => {
            let kind: DeviceKind = s.parse()?;
            let all: Vec<Device> = d.devices().into_iter().filter(|x| x.kind == kind).collect();
            if all.is_empty() {
                // Keep one entry so the report says why the vendor was skipped.
                vec![Device::new(kind, 0)]
            } else {
                all
            }
        }
    })
}

/// Runs every case on every device, with a progress bar on a terminal.
pub fn run_all(devices: &[Device], filter: Option<&str>) -> Vec<CaseResult> {
    let bar = if std::io::stderr().is_terminal() {
        let b = ProgressBar::new(0);
        if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}") {
            b.set_style(style);
        }
        b
    } else {
        ProgressBar::hidden()
    };
    let out = conformance::run_all(devices, filter, |key, total| {
        bar.set_length(total as u64);
        bar.set_message(format!("{} {}", key.device, key.case));
        bar.inc(1);
    });
    bar.finish_and_clear();
    out
}

pub fn run(
    device: Option<&str>,
    filter: Option<&str>,
    json: Option<&Path>,
    junit: Option<&Path>,
) -> CliResult<ExitCode> {
    let devices = select_devices(device)?;
    let results = run_all(&devices, filter);
    print_table(&results);
    print_summary(&results);
    if let Some(p) = json {
        write_json(p, &results)?;
    }
    if let Some(p) = junit {
        write_junit(p, &results)?;
    }
    let failed = results.iter().any(|r| r.status == Status::Failed);
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
