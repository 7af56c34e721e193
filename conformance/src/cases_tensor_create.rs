//! Tensors made from values (`Tensor::full`, `zeros`, `ones`, `from_f64`, `arange`,
//! `rand_uniform`, `rand_normal`) and read back (`to_vec`, `to_bytes`, `to_f64_vec`): the
//! values across the constructors' host stages (8 MiB each), in every dtype, and typed errors
//! — never a process abort — for tensors no device or host can hold. No operator kernel runs
//! here (the fake CUDA driver has none to run): memsets, copies and contiguous reads only.

use half::{bf16, f16};
use unirt::tensor::{DType, Element, SplitMix64, Tensor};

use super::*;
use crate::ensure;

pub(super) const CASES: &[Case] = &[
    Case {
        name: "tensor::constructors",
        needs: &[],
        run: constructors,
    },
    Case {
        name: "tensor::constructors::too_large",
        needs: &[],
        run: too_large,
    },
];

/// Elements of f32 past two host stages of 8 MiB, so a stage boundary falls inside each
/// tensor (and an odd tail after the last).
const PAST_TWO_STAGES: usize = 2 * (8 << 20) / 4 + 3;

/// The first element of `got` that is not `want(i)` (compared as the dtype's value).
fn first_wrong(got: &[f64], want: impl Fn(usize) -> f64) -> Option<(usize, f64, f64)> {
    got.iter().enumerate().find_map(|(i, &g)| {
        let w = want(i);
        let same = g == w || (g.is_nan() && w.is_nan());
        (!same).then_some((i, g, w))
    })
}

/// `v` as `dtype` would store it, back as f64.
fn rounded(dtype: DType, v: f64) -> f64 {
    fn via<T: Element>(v: f64) -> f64 {
        <T as Element>::from_f64(v).to_f64()
    }
    match dtype {
        DType::F32 => via::<f32>(v),
        DType::F16 => via::<f16>(v),
        DType::BF16 => via::<bf16>(v),
        DType::I32 => via::<i32>(v),
        DType::I64 => via::<i64>(v),
        DType::U8 => via::<u8>(v),
        DType::Bool => f64::from(u8::from(v != 0.0)),
    }
}

fn constructors(ctx: &Ctx) -> Result<(), Failure> {
    let dev = ctx.device;
    let n = PAST_TWO_STAGES;
    // full: a value whose bytes differ (staged) and ones whose bytes are all equal (memset).
    for (value, dtype) in [
        (1.5, DType::F32),
        (0.0, DType::F32),
        (-2.25, DType::F16),
        (3.0, DType::BF16),
        (-7.0, DType::I64),
        (1.0, DType::Bool),
    ] {
        let elems = n * 4 / dtype.size() / 2 + 1;
        let got = Tensor::full(&[elems], value, dtype, dev)?.to_f64_vec()?;
        ensure!(got.len() == elems, "full {dtype:?}: {} values", got.len());
        let bad = first_wrong(&got, |_| rounded(dtype, value));
        ensure!(
            bad.is_none(),
            "full({value}) {dtype:?}: (index, got, want) {bad:?}"
        );
    }
    // A value whose bytes are all equal but not zero (i32 -1: every byte 0xff).
    let got = Tensor::full(&[n], -1.0, DType::I32, dev)?.to_vec::<i32>()?;
    ensure!(
        got.iter().all(|&v| v == -1),
        "full(-1) i32: a value differs"
    );
    let got = Tensor::zeros(&[3, n], DType::F32, dev)?.to_vec::<f32>()?;
    ensure!(
        got.len() == 3 * n && got.iter().all(|&v| v.to_bits() == 0),
        "zeros f32 [3, {n}]: a value is not +0"
    );
    // arange over the stage boundary, in f32 and f16 (rounded as each stores).
    for dtype in [DType::F32, DType::F16, DType::I64] {
        let got = Tensor::arange(-3.0, n as f64 * 0.5 - 3.0, 0.5, dtype, dev)?.to_f64_vec()?;
        ensure!(got.len() == n, "arange {dtype:?}: {} values", got.len());
        let bad = first_wrong(&got, |i| rounded(dtype, -3.0 + i as f64 * 0.5));
        ensure!(
            bad.is_none(),
            "arange {dtype:?}: (index, got, want) {bad:?}"
        );
    }
    // The seeded random values: the generator's sequence, unbroken by the stages.
    for dtype in [DType::F32, DType::BF16] {
        let got = Tensor::rand_uniform(&[n], -2.0, 3.0, 77, dtype, dev)?.to_f64_vec()?;
        let mut rng = SplitMix64::new(77);
        let want: Vec<f64> = (0..n)
            .map(|_| rounded(dtype, -2.0 + 5.0 * rng.next_f64()))
            .collect();
        let bad = first_wrong(&got, |i| want[i]);
        ensure!(
            bad.is_none(),
            "rand_uniform {dtype:?}: (index, got, want) {bad:?}"
        );
    }
    let got = Tensor::rand_normal(&[n], 1.0, 0.5, 78, DType::F32, dev)?.to_f64_vec()?;
    let mut rng = SplitMix64::new(78);
    let want: Vec<f64> = (0..n)
        .map(|_| rounded(DType::F32, 1.0 + 0.5 * rng.next_normal()))
        .collect();
    let bad = first_wrong(&got, |i| want[i]);
    ensure!(bad.is_none(), "rand_normal f32: (index, got, want) {bad:?}");
    // from_f64, and the three read-backs of one tensor agreeing.
    let values: Vec<f64> = (0..n).map(|i| (i % 977) as f64 * 0.25 - 100.0).collect();
    let t = Tensor::from_f64(&values, &[n], DType::F32, dev)?;
    let (as_f64, as_f32, bytes) = (t.to_f64_vec()?, t.to_vec::<f32>()?, t.to_bytes()?);
    let bad = first_wrong(&as_f64, |i| values[i]);
    ensure!(bad.is_none(), "from_f64 f32: (index, got, want) {bad:?}");
    ensure!(
        as_f32.iter().zip(&values).all(|(&a, &v)| a as f64 == v)
            && bytemuck::cast_slice::<u8, f32>(&bytes) == as_f32.as_slice(),
        "from_f64 f32: to_vec, to_bytes and to_f64_vec disagree"
    );
    // Empty tensors from every constructor.
    ensure!(
        Tensor::full(&[0, 5], 2.0, DType::F32, dev)?
            .to_vec::<f32>()?
            .is_empty()
            && Tensor::arange(1.0, 1.0, 1.0, DType::F32, dev)?.numel() == 0
            && Tensor::rand_uniform(&[4, 0], 0.0, 1.0, 1, DType::F16, dev)?.numel() == 0,
        "an empty constructor made elements"
    );
    Ok(())
}

fn too_large(ctx: &Ctx) -> Result<(), Failure> {
    let dev = ctx.device;
    // 2⁴⁰ f32 elements (4 TiB): a shape a tensor may have, memory no machine here holds.
    // Each constructor used to build the values on the host first, and the refused host
    // allocation aborted the process.
    let huge = 1usize << 40;
    let kinds = &["out_of_memory", "too_large"];
    expect_err(
        Tensor::empty(&[huge], DType::F32, dev),
        kinds,
        "empty [2^40]",
    )?;
    expect_err(
        Tensor::zeros(&[huge], DType::F32, dev),
        kinds,
        "zeros [2^40]",
    )?;
    expect_err(Tensor::ones(&[huge], DType::F32, dev), kinds, "ones [2^40]")?;
    expect_err(
        Tensor::full(&[1 << 20, 1 << 20], 0.5, DType::F16, dev),
        kinds,
        "full [2^20, 2^20] f16",
    )?;
    expect_err(
        Tensor::arange(0.0, huge as f64, 1.0, DType::F32, dev),
        kinds,
        "arange of 2^40 values",
    )?;
    expect_err(
        Tensor::arange(0.0, 1e300, 1e-300, DType::F32, dev),
        kinds,
        "arange of more values than an address space holds",
    )?;
    expect_err(
        Tensor::rand_uniform(&[huge], 0.0, 1.0, 1, DType::F32, dev),
        kinds,
        "rand_uniform [2^40]",
    )?;
    expect_err(
        Tensor::rand_normal(&[1 << 30, 1 << 10], 0.0, 1.0, 1, DType::I64, dev),
        kinds,
        "rand_normal [2^30, 2^10] i64",
    )?;
    // A shape whose byte size overflows: refused before anything is allocated.
    expect_err(
        Tensor::zeros(&[1 << 62, 4], DType::F32, dev),
        &["too_large", "bad_tensor_shape"],
        "zeros [2^62, 4]",
    )?;
    // The device still works.
    let t = Tensor::arange(0.0, 4.0, 1.0, DType::F32, dev)?;
    ensure!(
        t.to_vec::<f32>()? == [0.0, 1.0, 2.0, 3.0],
        "after the refusals: arange(4) reads back wrong"
    );
    Ok(())
}
