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
///
/// Naming a device or vendor that this machine does not have is an error with the vendor's
/// reason, never an empty run that passes: a GPU CI job that silently finds no GPU must fail.
pub fn select_devices(arg: Option<&str>) -> CliResult<Vec<Device>> {
    let d = unirt::discover();
    let Some(s) = arg else {
        return Ok(d.devices());
    };
    let (kind, index) = if s.contains(':') {
        let dev = s.parse::<Device>()?;
        (dev.kind, Some(dev.index))
    } else {
        (s.parse::<DeviceKind>()?, None)
    };
    let not_here = |why: String| -> CliResult<Vec<Device>> {
        Err(unirt::Error::DeviceNotFound(format!("{s}: {why}")).into())
    };
    let Some(b) = d.backend(kind) else {
        return not_here(format!("vendor {kind} was not probed (UNIRT_BACKENDS)"));
    };
    if let Some(reason) = &b.reason {
        return not_here(format!("{kind} is unavailable on this machine: {reason}"));
    }
    match index {
        Some(i) if i >= b.devices.len() => {
            not_here(format!("{kind} has {} device(s)", b.devices.len()))
        }
        Some(i) => Ok(vec![Device::new(kind, i)]),
        None if b.devices.is_empty() => not_here(format!("{kind} lists no device")),
        None => Ok(b
            .devices
            .iter()
            .map(|i| Device::new(kind, i.index))
            .collect()),
    }
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
    // A filter that matches nothing is a typo, not a green run.
    conformance::filtered_cases(filter)?;
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
