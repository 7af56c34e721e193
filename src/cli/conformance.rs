//! `unirt conformance [--device D] [--filter S] [--json FILE] [--junit FILE]`.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};
use unirt::conformance::{self, CaseResult, Status};
use unirt::{Device, DeviceKind};

use super::CliResult;

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
    let cases: Vec<_> = conformance::cases()
        .into_iter()
        .filter(|c| filter.is_none_or(|f| c.name.contains(f)))
        .collect();
    let bar = if std::io::stderr().is_terminal() {
        let b = ProgressBar::new((cases.len() * devices.len()) as u64);
        if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}") {
            b.set_style(style);
        }
        b
    } else {
        ProgressBar::hidden()
    };
    let mut out = Vec::new();
    for &device in devices {
        for case in &cases {
            bar.set_message(format!("{device} {}", case.name));
            out.push(conformance::run_case(case, device));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    out
}

pub fn print_table(results: &[CaseResult]) {
    for r in results {
        let msg = r.message.as_deref().unwrap_or("");
        println!(
            "{:<8} {:<12} {:<44} {}",
            r.device,
            r.status.as_str(),
            r.case,
            msg
        );
    }
}

/// Per-device counts.
pub fn print_summary(results: &[CaseResult]) {
    let mut devices: Vec<&str> = results.iter().map(|r| r.device.as_str()).collect();
    devices.dedup();
    println!();
    println!(
        "{:<8} {:>7} {:>7} {:>12} {:>8}",
        "device", "passed", "failed", "unsupported", "skipped"
    );
    for d in devices {
        let count = |s: Status| {
            results
                .iter()
                .filter(|r| r.device == d && r.status == s)
                .count()
        };
        println!(
            "{:<8} {:>7} {:>7} {:>12} {:>8}",
            d,
            count(Status::Passed),
            count(Status::Failed),
            count(Status::Unsupported),
            count(Status::Skipped)
        );
    }
}

pub fn write_json(path: &Path, results: &[CaseResult]) -> CliResult<()> {
    let v = serde_json::json!({ "results": results });
    std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    Ok(())
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub fn write_junit(path: &Path, results: &[CaseResult]) -> CliResult<()> {
    let mut devices: Vec<&str> = results.iter().map(|r| r.device.as_str()).collect();
    devices.dedup();
    let mut x = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"unirt-conformance\">\n",
    );
    for d in devices {
        let rs: Vec<&CaseResult> = results.iter().filter(|r| r.device == d).collect();
        let failures = rs.iter().filter(|r| r.status == Status::Failed).count();
        let skipped = rs
            .iter()
            .filter(|r| matches!(r.status, Status::Skipped | Status::Unsupported))
            .count();
        x += &format!(
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" skipped=\"{skipped}\">\n",
            xml_escape(d),
            rs.len()
        );
        for r in rs {
            let msg = xml_escape(r.message.as_deref().unwrap_or(""));
            x += &format!(
                "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.6}\"",
                xml_escape(d),
                xml_escape(&r.case),
                r.duration.as_secs_f64()
            );
            x += &match r.status {
                Status::Passed => "/>\n".to_string(),
                Status::Failed => format!("><failure message=\"{msg}\"/></testcase>\n"),
                Status::Unsupported | Status::Skipped => {
                    format!(
                        "><skipped message=\"{}: {msg}\"/></testcase>\n",
                        r.status.as_str()
                    )
                }
            };
        }
        x += "  </testsuite>\n";
    }
    x += "</testsuites>\n";
    std::fs::write(path, x)?;
    Ok(())
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
