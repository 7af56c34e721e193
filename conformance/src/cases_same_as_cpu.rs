//! `ops::data_movement_same_as_cpu`: seeded random programs of views (narrow, transpose,
//! permute, broadcast, squeeze/unsqueeze, reshape), contiguous copies, casts between every
//! dtype, concatenation and round trips through the host, run on the device and on cpu:0;
//! every step's bytes (or the kind of its error) must be the same. These operators are exact,
//! so any difference is a bug: such programs found a wgpu i64 cast a unit off, the host's f16
//! and bf16 rounding that differed by machine, and an empty broadcast copy whose wgpu kernel
//! divided by zero — none of which the per-operator cases drew. (On the old code the default
//! seeds meet the empty copy; the cast needs about 400 programs, and
//! `ops::cast::i64::wide_integers` checks it directly.)
//!
//! `UNIRT_SAME_AS_CPU_SEEDS` (default 150) sets the number of programs,
//! `UNIRT_SAME_AS_CPU_SEED` the first seed.

use unirt::tensor::{DType, SplitMix64, Tensor};
use unirt::{Device, DeviceKind};

use crate::{env_u64, Case, Ctx, Failure};

/// The case's name (declared unsupported on the CPU, the reference).
pub(crate) const SAME_AS_CPU_CASE: &str = "ops::data_movement_same_as_cpu";

/// Why the case does not run on the CPU.
pub(crate) const CPU_IS_THE_REFERENCE: &str =
    "cpu:0 is the reference these programs are compared with";

/// The case of shapes that change every step (declared unsupported on the CPU too).
pub(crate) const CHANGING_SHAPES_CASE: &str = "ops::changing_shapes_same_as_cpu";

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: SAME_AS_CPU_CASE,
            needs: &[],
            run: same_as_cpu,
        },
        Case {
            name: CHANGING_SHAPES_CASE,
            needs: &[],
            run: changing_shapes,
        },
    ]
}

/// A tensor of `shape` holding seeded bytes that are valid values of `dt` (finite floats,
/// 0/1 bools; integers of every magnitude): not only small values.
fn seeded(dt: DType, shape: &[usize], seed: u64, dev: Device) -> unirt::Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut g = SplitMix64::new(seed);
    let mut bytes: Vec<u8> = match dt {
        // Integers of every magnitude (random bits alone are almost all huge).
        DType::I64 => (0..n)
            .flat_map(|_| ((g.next_u64() as i64) >> g.below(64)).to_le_bytes())
            .collect(),
        DType::I32 => (0..n)
            .flat_map(|_| ((g.next_u64() as i32) >> g.below(32)).to_le_bytes())
            .collect(),
        _ => (0..n * dt.size()).map(|_| g.next_u64() as u8).collect(),
    };
    for e in bytes.chunks_mut(dt.size()) {
        let finite = match dt {
            DType::F32 => f32::from_le_bytes([e[0], e[1], e[2], e[3]]).is_finite(),
            DType::F16 => half::f16::from_le_bytes([e[0], e[1]]).is_finite(),
            DType::BF16 => half::bf16::from_le_bytes([e[0], e[1]]).is_finite(),
            DType::Bool => {
                e[0] &= 1;
                true
            }
            _ => true,
        };
        if !finite {
            e.fill(0);
        }
    }
    Tensor::from_bytes(&bytes, shape, dt, dev)
}

/// One step's outcome: the result's bytes, or its error (compared by kind).
type Step = Result<Vec<u8>, unirt::Error>;

/// Program `seed` on `dev`: every step's outcome.
fn program(seed: u64, dev: Device) -> unirt::Result<Vec<Step>> {
    let mut r = SplitMix64::new(seed);
    let dt = DType::ALL[r.below(DType::ALL.len() as u64) as usize];
    let nd = 1 + r.below(4) as usize;
    let shape: Vec<usize> = (0..nd).map(|_| 1 + r.below(9) as usize).collect();
    let mut t = seeded(dt, &shape, seed ^ 0x77, dev)?;
    let mut steps = Vec::new();
    for _ in 0..8 {
        let nd = t.shape().len();
        let pick = |r: &mut SplitMix64, n: usize| r.below(n as u64) as usize;
        let next = match r.below(11) {
            0 if nd > 0 => {
                let a = pick(&mut r, nd);
                let len = t.shape()[a];
                let s = pick(&mut r, len + 1);
                let l = pick(&mut r, len - s + 1);
                t.narrow(a as isize, s, l)
            }
            1 if nd > 1 => t.transpose(pick(&mut r, nd) as isize, pick(&mut r, nd) as isize),
            2 => t.unsqueeze(pick(&mut r, nd + 1) as isize),
            3 => match (0..nd).find(|&i| t.shape()[i] == 1) {
                Some(a) => t.squeeze(a as isize),
                None => continue,
            },
            4 => match (0..nd).find(|&i| t.shape()[i] == 1) {
                Some(a) => {
                    let mut s = t.shape().to_vec();
                    s[a] = 1 + pick(&mut r, 4);
                    t.broadcast_to(&s)
                }
                None => continue,
            },
            5 => t.contiguous(),
            6 => t.reshape(&[t.shape().iter().product()]),
            7 => t.to_dtype(DType::ALL[pick(&mut r, DType::ALL.len())]),
            8 => t.to(Device::CPU).and_then(|h| h.to(dev)),
            9 if nd > 0 => Tensor::concat(&[&t, &t], pick(&mut r, nd) as isize),
            10 if nd > 1 => {
                let mut order: Vec<usize> = (0..nd).collect();
                for i in (1..nd).rev() {
                    order.swap(i, pick(&mut r, i + 1));
                }
                t.permute(&order)
            }
            _ => continue,
        };
        match next {
            Ok(n) => {
                t = n;
                steps.push(Ok(t.to_bytes()?));
            }
            Err(e) => steps.push(Err(e)),
        }
    }
    Ok(steps)
}

fn same_as_cpu(ctx: &Ctx) -> Result<(), Failure> {
    if ctx.device.kind == DeviceKind::Cpu {
        return Err(Failure::Unsupported(CPU_IS_THE_REFERENCE.into()));
    }
    let seeds = env_u64("UNIRT_SAME_AS_CPU_SEEDS").unwrap_or(150);
    let first = env_u64("UNIRT_SAME_AS_CPU_SEED").unwrap_or(0x5eed_0000);
    for seed in first..first + seeds {
        let want = program(seed, Device::CPU)?;
        let got = program(seed, ctx.device)?;
        let same = |a: &Step, b: &Step| match (a, b) {
            (Ok(x), Ok(y)) => x == y,
            (Err(x), Err(y)) => x.kind_name() == y.kind_name(),
            _ => false,
        };
        let Some(i) = (0..want.len().max(got.len()))
            .find(|&i| !matches!((want.get(i), got.get(i)), (Some(a), Some(b)) if same(a, b)))
        else {
            continue;
        };
        // An error here where cpu:0 computed: the error itself is the failure.
        if let (Some(Ok(_)), Some(Err(e))) = (want.get(i), got.get(i)) {
            return Err(Failure::Failed(format!(
                "program {seed:#x}, step {i}: unexpected error: {e}"
            )));
        }
        let show = |s: Option<&Step>| match s {
            Some(Ok(b)) => format!("{} bytes {:?}…", b.len(), &b[..b.len().min(16)]),
            Some(Err(e)) => format!("error {}", e.kind_name()),
            None => "nothing".into(),
        };
        return Err(Failure::Failed(format!(
            "program {seed:#x}, step {i}: {} here, {} on cpu:0",
            show(got.get(i)),
            show(want.get(i))
        )));
    }
    Ok(())
}

/// What an eager loop over a growing view computes at one length: strided views of a
/// preallocated `[heads, capacity, dim]` cache narrowed to `len` keys, through the operators
/// whose kernels take their shapes from the plan (elementwise, cast, reduction, copy of a
/// transposed view, concatenation), each result's bytes.
fn growing_step(cache: &Tensor, len: usize) -> unirt::Result<Vec<Vec<u8>>> {
    let k = cache.narrow(1, 0, len)?;
    let kt = k.transpose(1, 2)?;
    let bias = cache.narrow(1, 0, 1)?.narrow(2, 0, 1)?;
    Ok(vec![
        k.add(&k)?.to_bytes()?,
        k.mul(&bias)?.to_bytes()?,
        k.to_dtype(DType::F16)?.to_bytes()?,
        // Small integers: exact in any order of summation.
        k.sum(&[1], false)?.to_bytes()?,
        kt.sum(&[2], true)?.to_bytes()?,
        kt.contiguous()?.to_bytes()?,
        Tensor::concat(&[&k, &kt.transpose(1, 2)?], 1)?.to_bytes()?,
    ])
}

/// `ops::changing_shapes_same_as_cpu`: a loop whose shapes change every step, as an eager
/// decode loop over a growing KV cache has them. On the software adapters the first few
/// shapes of a kernel's structure get kernels with their extents in the code and the later
/// ones a shape-generic kernel that reads them from the plan's constants (see the wgpu
/// backend's `shapes.rs`); every step's results must be cpu:0's, bytes for bytes, in both
/// forms, at small sizes and past the texture threshold (whose variants twin too).
fn changing_shapes(ctx: &Ctx) -> Result<(), Failure> {
    if ctx.device.kind == DeviceKind::Cpu {
        return Err(Failure::Unsupported(CPU_IS_THE_REFERENCE.into()));
    }
    for (heads, capacity, dim, first) in [(2, 48, 12, 30), (4, 160, 64, 130)] {
        let shape = [heads, capacity, dim];
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|i| ((i * 7919) % 61) as f32 - 30.0).collect();
        let on_cpu = Tensor::from_slice(&values, &shape, Device::CPU)?;
        let here = Tensor::from_slice(&values, &shape, ctx.device)?;
        for len in first..first + 8 {
            let (want, got) = (growing_step(&on_cpu, len)?, growing_step(&here, len)?);
            if let Some(i) = (0..want.len()).find(|&i| want[i] != got[i]) {
                return Err(Failure::Failed(format!(
                    "cache [{heads}, {capacity}, {dim}] narrowed to {len} keys: result {i} \
                     differs from cpu:0's"
                )));
            }
        }
    }
    Ok(())
}
