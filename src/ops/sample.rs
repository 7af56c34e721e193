//! random_sample (InfiniCore's): pick a token from logits `[.., vocab]` given a random value
//! in `[0, 1)`. The logits are ranked (ties: lower index first), the `top_k` best kept
//! (0 = all), turned into probabilities `exp((l − max) / temperature)`, cut to the shortest
//! prefix whose mass reaches `top_p` of the kept mass, and the first token whose cumulative
//! mass exceeds `random ×` that prefix's mass is chosen. Temperature 0 or `top_k == 1` is
//! argmax. Output: i64 indices `[..]`.
//!
//! Special values, the same on every backend: NaN logits rank last and weigh nothing (a row
//! of NaN only gives index 0); a logit equal to the maximum weighs 1, so +∞ logits share all
//! the mass (an overflowed f16 logit is drawn, not a NaN sum) and a row of −∞ only is drawn
//! from evenly; a logit infinitely below the maximum weighs 0 at every temperature, ∞
//! included (a −∞ mask holds at `temperature = ∞`, which otherwise weighs every logit 1).

use super::{out_desc, Params, Plan, PlanBuilder, TensorDesc};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

pub fn random_sample(
    logits: &TensorDesc,
    random: f64,
    temperature: f64,
    top_k: usize,
    top_p: f64,
) -> Result<Plan> {
    let nd = logits.layout.ndim();
    if nd == 0 || logits.shape()[nd - 1] == 0 {
        return Err(Error::BadTensorShape(format!(
            "random_sample needs logits [.., vocab > 0], got {:?}",
            logits.shape()
        )));
    }
    if logits.shape()[nd - 1] as u64 > u64::from(u32::MAX) {
        // The kernels rank a candidate by its index in 32 bits.
        return Err(Error::BadTensorShape(format!(
            "random_sample takes at most 2^32 - 1 logits in a row, got {}",
            logits.shape()[nd - 1]
        )));
    }
    let valid = (0.0..1.0).contains(&random) && temperature >= 0.0 && top_p > 0.0 && top_p <= 1.0;
    if !valid {
        return Err(Error::BadParam(format!(
            "random_sample: random {random} (in [0, 1)), temperature {temperature} (≥ 0), top_p {top_p} (in (0, 1])"
        )));
    }
    let mut p = PlanBuilder::new("random_sample", logits.dtype, vec![logits.clone()]);
    p.outputs = vec![out_desc(
        logits.device,
        DType::I64,
        &logits.shape()[..nd - 1],
    )];
    p.params = Params::Sample {
        random,
        temperature,
        top_k,
        top_p,
    };
    p.build()
}

impl Tensor {
    /// See [`random_sample`].
    pub fn random_sample(
        &self,
        random: f64,
        temperature: f64,
        top_k: usize,
        top_p: f64,
    ) -> Result<Tensor> {
        random_sample(&self.desc(), random, temperature, top_k, top_p)?.run1(&[self])
    }
}
