//! Small statistics for benchmarks: medians of repeated timings.

use std::time::Duration;

/// The median of `samples` (sorted in place).
pub fn median(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let m = samples.len() / 2;
    if samples.len() % 2 == 1 {
        samples[m]
    } else {
        (samples[m - 1] + samples[m]) / 2.0
    }
}

/// How many repetitions fit in about `budget` given one run took `one`.
pub fn reps_for(one: Duration, budget: Duration, min: usize, max: usize) -> usize {
    let n = budget.as_secs_f64() / one.as_secs_f64().max(1e-9);
    (n as usize).clamp(min, max)
}

/// Writes `{"rows": rows}` as pretty JSON when a path was given (every bench's `--json`).
pub fn write_rows<R: serde::Serialize>(
    path: Option<&std::path::Path>,
    rows: &[R],
) -> crate::CliResult<()> {
    if let Some(p) = path {
        std::fs::write(
            p,
            serde_json::to_string_pretty(&serde_json::json!({ "rows": rows }))?,
        )?;
    }
    Ok(())
}
