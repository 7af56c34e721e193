//! The random-sequence fuzzer's driver: seeds of [`random_sequence`] (runtime calls) then
//! [`random_op_calls`] (operators) on one device, for a bounded time. Shared by the test
//! binary (`tests/fuzz.rs`, CI) and `unirt fuzz` (a real GPU, where cargo is absent).

use std::time::{Duration, Instant};

use crate::{random_op_calls, random_sequence, Ctx, Failure};

/// What one device's fuzz run does.
#[derive(Debug, Clone, Copy)]
pub struct FuzzOptions {
    /// Seed `i` of the run is `first_seed + i`.
    pub first_seed: u64,
    /// Seeds keep starting until this much time has passed (at least one runs).
    pub time: Duration,
    /// At most this many seeds (`Some(1)` replays one).
    pub max_runs: Option<u64>,
    /// Runtime calls per seed.
    pub steps: usize,
    /// Operator calls per seed, after the runtime calls.
    pub op_steps: usize,
}

/// Runs seeds on `ctx`'s device. `say` gets a line before each seed (so the last line before a
/// crash names it) and one per failure; `after_seed` may fail a seed that passed (the fake
/// driver's misuse log). Returns the seeds run and the failures, as `"<device> seed <seed>:
/// <why>"`.
pub fn fuzz_device(
    ctx: &Ctx,
    o: &FuzzOptions,
    say: &mut dyn FnMut(String),
    after_seed: &mut dyn FnMut() -> Option<String>,
) -> (u64, Vec<String>) {
    let device = ctx.device;
    let start = Instant::now();
    let (mut runs, mut failures) = (0u64, Vec::new());
    while runs == 0 || (start.elapsed() < o.time && o.max_runs.is_none_or(|m| runs < m)) {
        let seed = o.first_seed.wrapping_add(runs);
        say(format!("fuzz: {device} seed {seed:#x}"));
        let outcome = match random_sequence(ctx, seed, o.steps)
            .and_then(|()| random_op_calls(ctx, seed, o.op_steps))
        {
            Ok(()) | Err(Failure::Unsupported(_)) => None,
            Err(Failure::Failed(m)) => Some(m),
        };
        if let Some(m) = outcome.or_else(&mut *after_seed) {
            say(format!("fuzz: FAILED {device} seed {seed:#x}: {m}"));
            failures.push(format!("{device} seed {seed:#x}: {m}"));
        }
        runs += 1;
    }
    say(format!(
        "fuzz: {device}: {runs} seed(s) in {:.1} s",
        start.elapsed().as_secs_f64()
    ));
    (runs, failures)
}

/// One line to stderr, flushed at once, so a seed line is in the log before any crash.
pub fn say(line: String) {
    use std::io::Write;
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{line}");
    let _ = e.flush();
}

/// A first seed from the clock.
pub fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}
