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
    // Report files are checked before the suite runs, so a bad path costs nothing.
    for path in [json, junit].into_iter().flatten() {
        check_writable(path)?;
    }
    let devices = select_devices(device)?;
    if devices.is_empty() {
        return Err(no_device_message().into());
    }
    // A filter that matches nothing is a typo, not a green run.
    conformance::filtered_cases(filter)?;
    let results = run_all(&devices, filter);
    print_table(&results);
    print_summary(&results);
    // Write every report even when one fails; a failed report is reported, and the exit code
    // still says whether the suite passed (1) before it says a report is missing (2).
    let report_errors = write_reports(json, junit, &results);
    for e in &report_errors {
        eprintln!("unirt: {e}");
    }
    let failed = results.iter().any(|r| r.status == Status::Failed);
    Ok(if failed {
        ExitCode::from(1)
    } else if !report_errors.is_empty() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// Writes each report asked for; one that fails does not stop the other. Returns the errors,
/// each naming its file.
fn write_reports(json: Option<&Path>, junit: Option<&Path>, results: &[CaseResult]) -> Vec<String> {
    let mut report_errors = Vec::new();
    if let Some(p) = json {
        if let Err(e) = write_json(p, results) {
            report_errors.push(format!("cannot write the JSON report {}: {e}", p.display()));
        }
    }
    if let Some(p) = junit {
        if let Err(e) = write_junit(p, results) {
            report_errors.push(format!(
                "cannot write the JUnit report {}: {e}",
                p.display()
            ));
        }
    }
    report_errors
}

/// Fails, naming the file, when `path` cannot be written: its folder is missing, it is a
/// folder, opening it for writing fails, or a write of nothing to it fails (`/dev/full`, a
/// full or read-only file system). An existing file is left as it is.
fn check_writable(path: &Path) -> CliResult<()> {
    let bad = |why: String| -> CliResult<()> {
        Err(format!("cannot write the report {}: {why}", path.display()).into())
    };
    if path.is_dir() {
        return bad("it is a folder".into());
    }
    let existed = path.exists();
    match std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        Ok(mut f) => {
            // A zero-length write reaches the file's driver (unlike `write_all(&[])`), which
            // is where /dev/full says ENOSPC; on a regular file or a terminal it changes nothing.
            if let Err(e) = std::io::Write::write(&mut f, &[]) {
                drop(f);
                if !existed {
                    let _ = std::fs::remove_file(path);
                }
                return bad(e.to_string());
            }
            if !existed {
                let _ = std::fs::remove_file(path);
            }
            Ok(())
        }
        Err(e) => bad(e.to_string()),
    }
}

/// Why there is nothing to run on: every vendor's reason.
pub fn no_device_message() -> String {
    let reasons: Vec<String> = unirt::discover()
        .backends
        .iter()
        .map(|b| format!("{}: {}", b.kind, b.reason.as_deref().unwrap_or("no device")))
        .collect();
    format!("no available device to run on ({})", reasons.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report that fails while being written does not stop the other (the CLI checks both
    /// files first, so this path is reached only when a disk fills during the run).
    #[test]
    fn one_failed_report_spares_the_other() {
        let junit = std::env::temp_dir().join(format!("unirt-unit-{}.xml", std::process::id()));
        let errors = write_reports(Some(Path::new("/dev/full")), Some(&junit), &[]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("/dev/full"), "{errors:?}");
        assert!(std::fs::read_to_string(&junit)
            .unwrap()
            .contains("<testsuites"));
        std::fs::remove_file(&junit).ok();
    }

    #[test]
    fn unwritable_report_files_are_caught_first() {
        for bad in ["/dev/full", "/proc/x", "/tmp", "/nonexistent-dir/r.json"] {
            let e = check_writable(Path::new(bad)).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
        let fresh = std::env::temp_dir().join(format!("unirt-check-{}.json", std::process::id()));
        check_writable(&fresh).unwrap();
        assert!(!fresh.exists(), "the check left a file behind");
        check_writable(Path::new("/dev/null")).unwrap();
    }
}
