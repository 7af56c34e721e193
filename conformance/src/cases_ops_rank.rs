//! Operators over tensors of 100 000 dimensions, all but two or three of size 1: each result
//! must be bitwise the result over the same values without the size-1 dimensions, on the
//! same device. On Mesa's adapters the kernels' view walk looped once per dimension, which
//! used up the loop limiter's 65 535 iterations per invocation: the loops stopped early and
//! a softmax wrote wrong values with no error. Planning a reduction over every axis was
//! quadratic in the rank (0.9 s on the CPU).

use unirt::tensor::{DType, Layout, Tensor};

use super::*;
use crate::ensure;

pub(super) const CASES: &[Case] = &[Case {
    name: "ops::many_dimensions",
    needs: &[],
    run: many_dimensions,
}];

/// Size-1 dimensions added inside each tensor (100 000 dimensions in all for a matrix).
const ONES: usize = 99_998;

/// `t` with [`ONES`] dimensions of size 1 inserted before its last `keep_last` dimensions.
fn padded(t: &Tensor, keep_last: usize) -> Result<Tensor, Failure> {
    let s = t.shape();
    let split = s.len() - keep_last;
    let shape: Vec<usize> = s[..split]
        .iter()
        .copied()
        .chain(std::iter::repeat_n(1, ONES))
        .chain(s[split..].iter().copied())
        .collect();
    Ok(t.reshape(&shape)?)
}

/// Fails unless `got`, reshaped to `want`'s shape, holds bitwise `want`'s values.
fn same(what: &str, got: Tensor, want: Tensor) -> Result<(), Failure> {
    ensure!(
        got.numel() == want.numel() && got.dtype() == want.dtype(),
        "{what}: {} elements of {} over {} dimensions, want {} of {}",
        got.numel(),
        got.dtype(),
        got.ndim(),
        want.numel(),
        want.dtype()
    );
    let (g, w) = (got.reshape(want.shape())?.to_bytes()?, want.to_bytes()?);
    ensure!(
        g == w,
        "{what}: over {} dimensions {:?}, without the size-1 ones {:?}",
        got.ndim(),
        got.to_f64_vec()?,
        want.to_f64_vec()?
    );
    Ok(())
}

fn many_dimensions(ctx: &Ctx) -> Result<(), Failure> {
    let dev = ctx.device;
    let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.37 - 1.9).collect();
    let x = Tensor::from_slice(&values, &[3, 4], dev)?;
    let px = padded(&x, 1)?;
    ensure!(px.ndim() == ONES + 2, "padded to {} dimensions", px.ndim());
    same("exp", px.exp()?, x.exp()?)?;
    let row = Tensor::from_slice(&[0.5f32, -1.0, 2.0, 0.25], &[4], dev)?;
    same("add of a broadcast row", px.add(&row)?, x.add(&row)?)?;
    same(
        "softmax over the last axis",
        px.softmax(-1)?,
        x.softmax(-1)?,
    )?;
    same("softmax over the first axis", px.softmax(0)?, x.softmax(0)?)?;
    same("log_softmax", px.log_softmax(-1)?, x.log_softmax(-1)?)?;
    same(
        "sum over every axis",
        px.sum(&[], false)?,
        x.sum(&[], false)?,
    )?;
    same(
        "sum over the first axis",
        px.sum(&[0], false)?,
        x.sum(&[0], false)?,
    )?;
    same("max, kept dims", px.max(&[-1], true)?, x.max(&[-1], true)?)?;
    same("argmax", px.argmax(-1, false)?, x.argmax(-1, false)?)?;
    let gamma = Tensor::from_slice(&[1.0f32, 0.5, -2.0, 3.0], &[4], dev)?;
    same(
        "rms_norm",
        px.rms_norm(&gamma, 1e-5)?,
        x.rms_norm(&gamma, 1e-5)?,
    )?;
    same(
        "layer_norm",
        px.layer_norm(&gamma, &row, 1e-5)?,
        x.layer_norm(&gamma, &row, 1e-5)?,
    )?;
    same(
        "cast to f16",
        px.to_dtype(DType::F16)?,
        x.to_dtype(DType::F16)?,
    )?;
    let reversed: Vec<usize> = (0..px.ndim()).rev().collect();
    same(
        "a reversed permutation made contiguous",
        px.permute(&reversed)?.contiguous()?,
        x.transpose(0, 1)?.contiguous()?,
    )?;
    same(
        "concat along the first axis",
        Tensor::concat(&[&px, &px], 0)?,
        Tensor::concat(&[&x, &x], 0)?,
    )?;
    let flags = Tensor::from_slice(&[1u8, 0, 0, 1], &[4], dev)?
        .view_storage(Layout::contiguous(&[4]), DType::Bool)?;
    same(
        "masked_fill",
        px.masked_fill(&flags, 7.5)?,
        x.masked_fill(&flags, 7.5)?,
    )?;
    // Batch dimensions of size 1.
    let w = Tensor::from_slice(
        &[1.0f32, -1.0, 0.5, 2.0, -0.25, 1.5, 3.0, 0.0],
        &[4, 2],
        dev,
    )?;
    same("matmul", padded(&x, 2)?.matmul(&w)?, x.matmul(&w)?)?;
    let table = Tensor::from_slice(&values[..8], &[2, 4], dev)?;
    let ids = Tensor::from_slice(&[1i64, 0, 1], &[3], dev)?;
    same(
        "embedding",
        table.embedding(&padded(&ids, 1)?)?,
        table.embedding(&ids)?,
    )?;
    Ok(())
}
