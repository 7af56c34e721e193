//! The suite as a cargo test harness: libtest-mimic trials, one per device × case. A vendor
//! that is unavailable on this machine still gets its trials, ignored; the reason is printed once —
//! so a CI log shows what was not tested and why.
//!
//! `UNIRT_CONFORMANCE_DEVICES=cpu:0,wgpu` restricts the devices.

use crate as conformance;
use crate::Status;
use libtest_mimic::{Failed, Trial};
use unirt::{Device, DeviceKind};

/// The devices to test: every available device, plus device 0 of each unavailable vendor (so
/// its ignored trials carry the reason).
pub fn devices() -> Vec<(Device, Option<String>)> {
    let d = unirt::discover();
    let wanted = std::env::var("UNIRT_CONFORMANCE_DEVICES").ok();
    let keep = |dev: Device| match &wanted {
        None => true,
        Some(list) => list.split(',').map(str::trim).any(|w| {
            w == dev.to_string()
                || w.parse::<DeviceKind>()
                    .map(|k| k == dev.kind && !w.contains(':'))
                    .unwrap_or(false)
        }),
    };
    let mut out = Vec::new();
    for b in &d.backends {
        match &b.reason {
            Some(reason) => out.push((Device::new(b.kind, 0), Some(reason.clone()))),
            None => out.extend(
                b.devices
                    .iter()
                    .map(|i| (Device::new(b.kind, i.index), None)),
            ),
        }
    }
    out.retain(|(dev, _)| keep(*dev));
    out
}

/// One trial per device × case. The reason a vendor is unavailable is printed once, here, and
/// its ignored trials say only `unavailable`, so test lines stay short.
pub fn trials() -> Vec<Trial> {
    let mut trials = Vec::new();
    let devices = devices();
    for (device, why) in &devices {
        if let Some(reason) = why {
            eprintln!(
                "unirt-conformance: {} is unavailable, its trials are ignored: {reason}",
                device.kind
            );
        }
    }
    // Each distinct reason a case is declared unsupported is printed once, numbered; the
    // trial says only `unsupported N` (a label libtest pads every line to).
    let mut reasons: Vec<String> = Vec::new();
    for (device, unavailable) in devices {
        for case in conformance::cases() {
            let name = format!("{device}::{}", case.name);
            // Known before the run: the vendor is unavailable, or the case is declared unsupported.
            let skip = match &unavailable {
                Some(_) => Some("unavailable".to_string()),
                None => conformance::declared_unsupported(&case, device).map(|why| {
                    let n = match reasons.iter().position(|r| *r == why) {
                        Some(n) => n,
                        None => {
                            reasons.push(why);
                            reasons.len() - 1
                        }
                    };
                    format!("unsupported {}", n + 1)
                }),
            };
            match skip {
                Some(kind) => trials.push(
                    Trial::test(name, || Ok(()))
                        .with_ignored_flag(true)
                        .with_kind(kind),
                ),
                None => trials.push(Trial::test(name, move || {
                    let r = conformance::run_case(&case, device);
                    match r.status {
                        Status::Passed => Ok(()),
                        Status::Failed => Err(Failed::from(r.message.unwrap_or_default())),
                        // Declared unsupported cases are ignored trials (above); a backend that
                        // answers Unsupported without declaring it fails, so nothing passes
                        // silently.
                        Status::Unsupported | Status::Skipped => Err(Failed::from(format!(
                            "undeclared {}: {}",
                            r.status.as_str(),
                            r.message.unwrap_or_default()
                        ))),
                    }
                })),
            }
        }
    }
    for (n, why) in reasons.iter().enumerate() {
        eprintln!("unirt-conformance: unsupported {}: {why}", n + 1);
    }
    trials
}
