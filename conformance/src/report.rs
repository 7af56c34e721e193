//! Reports of a conformance run: a table and per-device summary on stdout, JSON and JUnit
//! files. The embeddable `unirt` library writes no report formats; this crate does.

use std::io;
use std::path::Path;

use crate::{CaseResult, Status};

/// One line per result: device, status, case, message.
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

/// Writes `{"results": [{"device", "case", "status", "message"}, …]}`.
pub fn write_json(path: &Path, results: &[CaseResult]) -> io::Result<()> {
    std::fs::write(path, to_json(results)?)
}

/// The JSON report as a string.
pub fn to_json(results: &[CaseResult]) -> io::Result<String> {
    let v = serde_json::json!({ "results": results });
    serde_json::to_string_pretty(&v).map_err(io::Error::other)
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Writes a JUnit XML report: one `<testsuite>` per device, unsupported and skipped cases as
/// `<skipped>` with the reason.
pub fn write_junit(path: &Path, results: &[CaseResult]) -> io::Result<()> {
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
    std::fs::write(path, x)
}
