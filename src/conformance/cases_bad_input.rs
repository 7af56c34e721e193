//! Conformance cases.

#[allow(unused_imports)]
use super::*;

pub(super) const CASES: &[Case] = &[];
