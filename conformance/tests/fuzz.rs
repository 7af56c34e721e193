//! The Rust API fuzzer (issue 17): seeded random call sequences
//! ([`unirt_conformance::random_sequence`]: live, freed, interior and bogus pointers and
//! handles, every entry point, captures begun and ended at random, sizes from 0 B to hundreds
//! of MiB, streams destroyed with work queued) on every available device, for a bounded time.
//!
//! - `UNIRT_FUZZ_SECONDS` (default 5): the total time, shared equally by the devices.
//! - `UNIRT_FUZZ_SEED`: the first seed (default: from the clock); seed `i` of a run is
//!   `first + i`. Every seed is printed before it runs, so the last line before a crash names
//!   it. `UNIRT_FUZZ_SEED=0x… UNIRT_FUZZ_RUNS=1` replays exactly that sequence.
//! - `UNIRT_FUZZ_STEPS` (default 2000): calls per seed.
//! - `UNIRT_FUZZ_OP_STEPS` (default 60): operator calls per seed after the runtime calls
//!   ([`unirt_conformance::random_op_calls`]: random shapes, dtypes, views and axes through the
//!   eager Tensor API).
//! - `UNIRT_CONFORMANCE_DEVICES` restricts the devices, as for the suite.
//! - `UNIRT_FUZZ_FAKECUDA=1`: the CUDA backend runs over the fake driver (unirt-fakecuda) as
//!   well, and any call it records as driver misuse fails the seed.
//!
//! A sequence that ends with a failure (the device unusable afterwards, an unexpected error)
//! fails the run with its device and seed; a panic or crash ends the process after the seed
//! line.

use std::time::Duration;

use unirt_conformance::{clock_seed, env_u64, fuzz_device, say, Ctx, FuzzOptions};

mod fakecuda_support;

fn main() {
    // With UNIRT_FUZZ_FAKECUDA=1 the CUDA backend runs over the fake driver too, and a call the
    // fake records as driver misuse (one a real driver may crash on) fails the seed.
    let fake = std::env::var_os("UNIRT_FUZZ_FAKECUDA")
        .is_some_and(|v| v == "1")
        .then(|| fakecuda_support::use_fake_driver(&[]).1);
    let seconds = env_u64("UNIRT_FUZZ_SECONDS").unwrap_or(5);
    let first = env_u64("UNIRT_FUZZ_SEED").unwrap_or_else(clock_seed);
    let devices: Vec<_> = unirt_conformance::devices()
        .into_iter()
        .filter(|(_, unavailable)| unavailable.is_none())
        .map(|(d, _)| d)
        .collect();
    if devices.is_empty() {
        say("fuzz: no available device".into());
        std::process::exit(1);
    }
    let options = FuzzOptions {
        first_seed: first,
        time: Duration::from_secs(seconds) / devices.len() as u32,
        max_runs: env_u64("UNIRT_FUZZ_RUNS"),
        steps: env_u64("UNIRT_FUZZ_STEPS").unwrap_or(2000) as usize,
        op_steps: env_u64("UNIRT_FUZZ_OP_STEPS").unwrap_or(60) as usize,
    };
    say(format!(
        "fuzz: {} s over {} device(s), {} calls per seed, first seed {first:#x} \
         (replay one: UNIRT_FUZZ_SEED=<seed> UNIRT_FUZZ_RUNS=1 UNIRT_CONFORMANCE_DEVICES=<device>)",
        seconds,
        devices.len(),
        options.steps
    ));
    let mut failures = Vec::new();
    for device in devices {
        let backend = match unirt::open(device) {
            Ok(b) => b,
            Err(e) => {
                failures.push(format!("{device}: does not open: {e}"));
                continue;
            }
        };
        let ctx = Ctx { device, backend };
        let mut misused = fake.as_ref().map_or(0, |c| c.misuses());
        let mut after_seed = || {
            let c = fake.as_ref()?;
            let now = c.misuses();
            let new = now > misused;
            misused = now;
            new.then(|| {
                format!(
                    "the fake driver recorded a call a real driver may crash on:\n{}",
                    c.misuse_log()
                )
            })
        };
        failures.extend(fuzz_device(&ctx, &options, &mut say, &mut after_seed).1);
    }
    if !failures.is_empty() {
        say(format!("fuzz: {} failure(s):", failures.len()));
        for f in &failures {
            say(format!("  {f}"));
        }
        std::process::exit(1);
    }
    say("fuzz: ok".into());
}
