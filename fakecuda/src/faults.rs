//! Failing on command.
//!
//! A fault list is a comma-separated list of `function:calls:code[:after]`:
//! - `function` is an exported name (`cuMemAlloc_v2`), or `*` for every function;
//! - `calls` is `N` (only the Nth call, counting from 1 since the list was set), `N+` (the Nth
//!   and every later call) or `N-M` (calls N to M);
//! - `code` is a `CUresult` by name (`CUDA_ERROR_OUT_OF_MEMORY` or `OUT_OF_MEMORY`) or number;
//! - `after` (optional) lets the call do its work and succeed, then applies the code — the way
//!   a kernel fault surfaces on a GPU: the launch succeeds, the context is poisoned, and the
//!   next call reports it.
//!
//! A sticky code (ILLEGAL_ADDRESS, LAUNCH_FAILED, …) also poisons the calling thread's current
//! context; STREAM_CAPTURE_INVALIDATED / _UNSUPPORTED also invalidate the calling thread's
//! captures. The list comes from `UNIRT_FAKECUDA_FAULTS` at the first call, or from
//! `unirt_fakecuda_set_faults` at any time (which also resets the call counters).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::result::{parse_code, CUresult};

/// One rule of the fault list.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub function: String,
    pub first: u64,
    pub last: u64,
    pub code: CUresult,
    pub after: bool,
}

/// What to do with one call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action {
    /// Return the code without doing anything.
    Fail(CUresult),
    /// Do the call, then apply the code (sticky: poison the context).
    After(CUresult),
}

#[derive(Default)]
struct Faults {
    rules: Vec<Rule>,
    calls: HashMap<&'static str, u64>,
    fired: u64,
}

fn faults() -> MutexGuard<'static, Faults> {
    static F: OnceLock<Mutex<Faults>> = OnceLock::new();
    F.get_or_init(|| {
        let rules = std::env::var("UNIRT_FAKECUDA_FAULTS")
            .ok()
            .map(|s| match parse(&s) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("unirt-fakecuda: UNIRT_FAKECUDA_FAULTS ignored: {e}");
                    Vec::new()
                }
            })
            .unwrap_or_default();
        Mutex::new(Faults {
            rules,
            ..Faults::default()
        })
    })
    .lock()
    .unwrap_or_else(|e| e.into_inner())
}

/// Parses a fault list (see the module documentation).
pub fn parse(spec: &str) -> Result<Vec<Rule>, String> {
    let mut rules = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let parts: Vec<&str> = item.split(':').collect();
        let (function, calls, code, after) = match parts.as_slice() {
            [f, n, c] => (*f, *n, *c, false),
            [f, n, c, "after"] => (*f, *n, *c, true),
            _ => return Err(format!("{item:?} is not function:calls:code[:after]")),
        };
        let num = |s: &str| {
            s.parse::<u64>()
                .ok()
                .filter(|&v| v >= 1)
                .ok_or_else(|| format!("{item:?}: {s:?} is not a call number (1, 2, …)"))
        };
        let (first, last) = if let Some(n) = calls.strip_suffix('+') {
            (num(n)?, u64::MAX)
        } else if let Some((a, b)) = calls.split_once('-') {
            (num(a)?, num(b)?)
        } else {
            let n = num(calls)?;
            (n, n)
        };
        let code =
            parse_code(code).ok_or_else(|| format!("{item:?}: unknown CUresult {code:?}"))?;
        rules.push(Rule {
            function: function.to_string(),
            first,
            last,
            code,
            after,
        });
    }
    Ok(rules)
}

/// Replaces the fault list and resets the call counters.
pub fn set(rules: Vec<Rule>) {
    let mut f = faults();
    f.rules = rules;
    f.calls.clear();
    f.fired = 0;
}

/// Counts one call of `name` and says whether it fails.
pub fn on_call(name: &'static str) -> Option<Action> {
    let mut f = faults();
    let n = {
        let c = f.calls.entry(name).or_insert(0);
        *c += 1;
        *c
    };
    let hit = f
        .rules
        .iter()
        .find(|r| (r.function == name || r.function == "*") && n >= r.first && n <= r.last)
        .map(|r| {
            if r.after {
                Action::After(r.code)
            } else {
                Action::Fail(r.code)
            }
        });
    if hit.is_some() {
        f.fired += 1;
    }
    hit
}

/// Calls of `name` since the list was last set.
pub fn calls(name: &str) -> u64 {
    faults()
        .calls
        .iter()
        .find(|(k, _)| **k == name)
        .map_or(0, |(_, v)| *v)
}

/// Faults injected since the list was last set.
pub fn fired() -> u64 {
    faults().fired
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        let r = parse("cuMemAlloc_v2:3:CUDA_ERROR_OUT_OF_MEMORY, *:2+:700, cuLaunchKernel:1-2:LAUNCH_FAILED:after")
            .unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(
            (r[0].first, r[0].last, r[0].code, r[0].after),
            (3, 3, 2, false)
        );
        assert_eq!((r[1].first, r[1].last, r[1].code), (2, u64::MAX, 700));
        assert_eq!(
            (r[2].first, r[2].last, r[2].code, r[2].after),
            (1, 2, 719, true)
        );
        assert!(parse("cuInit:0:1").is_err());
        assert!(parse("cuInit:1:NO_SUCH_ERROR").is_err());
        assert!(parse("cuInit:1").is_err());
    }
}
