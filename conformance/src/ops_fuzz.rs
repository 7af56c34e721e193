//! The operator fuzzer: seeded random calls of the eager Tensor API — every operator family,
//! on random shapes (empty, scalar, odd, broadcast, absurdly large), random dtypes, random
//! views (transposed, narrowed, broadcast, unsqueezed), random axes in and out of range,
//! mixed devices, and ids outside their table — where every call must return `Ok` or a typed
//! error and never panic; afterwards the device must still compute right. The HAL fuzzer
//! ([`crate::random_sequence`]) covers the runtime calls; this covers the operators' plan and
//! launch paths (validation, layouts, workspace, device faults).

use unirt::tensor::{DType, SplitMix64, Tensor};
use unirt::Device;

use crate::{Ctx, Failure};

/// Draws from a seeded stream.
struct Draw(SplitMix64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0.below(n.max(1))
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }

    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }

    /// An extent: mostly small and odd, sometimes empty, now and then absurd.
    fn extent(&mut self) -> usize {
        match self.below(40) {
            0 => 0,
            1 => 1 << 40,
            2..=5 => 1,
            _ => self.pick(&[2, 3, 4, 7, 8, 17, 33]),
        }
    }

    fn shape(&mut self) -> Vec<usize> {
        let rank = self.below(5) as usize;
        (0..rank).map(|_| self.extent()).collect()
    }

    fn pick_ref(&mut self, pool: &[Tensor]) -> Tensor {
        pool[self.below(pool.len() as u64) as usize].clone()
    }

    fn dtype(&mut self) -> DType {
        self.pick(&DType::ALL)
    }

    /// An axis, sometimes out of range.
    fn axis(&mut self, ndim: usize) -> isize {
        let n = ndim as isize;
        match self.below(8) {
            0 => n + self.below(3) as isize,
            1 => -n - 1 - self.below(3) as isize,
            _ if n == 0 => 0,
            _ => self.below(2 * ndim as u64) as isize - n,
        }
    }
}

/// A tensor of random values (or of a random shape that may not be allocatable).
fn tensor(d: &mut Draw, device: Device) -> Option<Tensor> {
    let shape = d.shape();
    let dtype = d.dtype();
    let n: usize = shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b))?;
    if n > 1 << 16 {
        // Too large to fill from the host: the allocation (or its refusal) is the test.
        return Tensor::empty(&shape, dtype, device).ok();
    }
    let values: Vec<f64> = (0..n)
        .map(|_| (d.0.next_f64() - 0.5) * 8.0)
        .map(|v| if dtype.is_float() { v } else { v.round() })
        .collect();
    Tensor::from_f64(&values, &shape, dtype, device).ok()
}

/// A random view of `t` (or `t` itself).
fn view(d: &mut Draw, t: &Tensor) -> Tensor {
    let nd = t.ndim();
    let r = match d.below(6) {
        0 if nd >= 2 => t.transpose(d.axis(nd), d.axis(nd)),
        1 if nd >= 1 => {
            let len = t.shape()[0];
            let start = d.below(len as u64 + 2) as usize;
            t.narrow(d.axis(nd), start, d.below(len as u64 + 2) as usize)
        }
        2 => t.unsqueeze(d.axis(nd + 1)),
        3 => {
            let mut shape = t.shape().to_vec();
            shape.insert(0, d.pick(&[0, 1, 3]));
            t.broadcast_to(&shape)
        }
        4 => t.reshape(&d.shape()),
        _ => Ok(t.clone()),
    };
    r.unwrap_or_else(|_| t.clone())
}

/// Runs `steps` random operator calls on `ctx`'s device (and the CPU beside it); `Ok` when
/// none panicked and the device still computes a small sum right afterwards.
/// `copy_from_slice` into `t` (any view) with host values of its dtype — or of another one,
/// one element too many or too few, or a bool value of 2 — each refused with a typed error.
fn write_host(d: &mut Draw, t: &Tensor) -> unirt::Result<()> {
    let n = t.numel();
    if n > 1 << 16 {
        return Ok(());
    }
    let len = match d.below(8) {
        0 => n + 1,
        1 => n.saturating_sub(1),
        _ => n,
    };
    let dtype = if d.chance(8) { d.dtype() } else { t.dtype() };
    match dtype {
        DType::F32 => t.copy_from_slice(&vec![0.5f32; len]),
        DType::F16 => t.copy_from_slice(&vec![half::f16::from_f32(-2.0); len]),
        DType::BF16 => t.copy_from_slice(&vec![half::bf16::from_f32(3.0); len]),
        DType::I32 => t.copy_from_slice(&vec![7i32; len]),
        DType::I64 => t.copy_from_slice(&vec![-1i64; len]),
        DType::U8 | DType::Bool => t.copy_from_slice(&vec![d.below(3) as u8; len]),
    }
}

pub fn random_op_calls(ctx: &Ctx, seed: u64, steps: usize) -> Result<(), Failure> {
    let dev = ctx.device;
    let mut d = Draw(SplitMix64::new(seed));
    let mut pool: Vec<Tensor> = Vec::new();
    // UNIRT_FUZZ_VERBOSE=1 prints each call before it runs (for replaying a seed).
    let verbose = std::env::var_os("UNIRT_FUZZ_VERBOSE").is_some_and(|v| v == "1");
    for _ in 0..steps {
        if pool.len() < 4 || d.chance(4) {
            let on = if d.chance(16) { Device::CPU } else { dev };
            if let Some(t) = tensor(&mut d, on) {
                pool.push(t);
            }
            if pool.len() > 24 {
                pool.remove(0);
            }
            continue;
        }
        let a = {
            let t = d.pick_ref(&pool);
            view(&mut d, &t)
        };
        let b = {
            let t = d.pick_ref(&pool);
            view(&mut d, &t)
        };
        let c = d.pick_ref(&pool);
        let nd = a.ndim();
        let which = d.below(25);
        if verbose {
            eprintln!(
                "ops-fuzz: call {which} on {:?} {} {} / {:?} {} / {:?} {}",
                a.shape(),
                a.dtype(),
                a.device(),
                b.shape(),
                b.dtype(),
                c.shape(),
                c.dtype()
            );
        }
        let out = match which {
            0 => a.add(&b),
            1 => a.mul(&b),
            2 => a.div_scalar(d.pick(&[0.0, 2.0, -1.0])),
            3 => a.pow(&b),
            4 => a.exp(),
            5 => a.silu(),
            6 => a.gelu(),
            7 => a.matmul(&b),
            8 => a.sum(&[d.axis(nd)], d.chance(2)),
            9 => a.max(&[d.axis(nd), d.axis(nd)], d.chance(2)),
            10 => a.argmax(d.axis(nd), d.chance(2)),
            11 => a.softmax(d.axis(nd)),
            12 => a.causal_softmax(d.chance(2).then(|| d.below(4) as usize)),
            13 => a.rms_norm(&b, 1e-5),
            14 => a.layer_norm(&b, &c, 1e-5),
            15 => a.to_dtype(d.dtype()),
            16 => a.embedding(&b),
            17 => Tensor::concat(&[&a, &b, &c], d.axis(nd)),
            18 => a.rope(&b, 10000.0, d.chance(2)),
            19 => a.attention(&b, &c, d.chance(2)),
            20 => a.swiglu(&b),
            21 => a.random_sample(d.0.next_f64(), d.pick(&[0.0, 0.7, 1.0]), 3, 0.9),
            22 => a.contiguous(),
            23 => write_host(&mut d, &a).map(|()| a.clone()),
            _ => a.to(if d.chance(2) { Device::CPU } else { dev }),
        };
        if let Ok(t) = out {
            // Reading back waits for the launch; a device fault is a typed error here.
            if t.numel() <= 1 << 16 && d.chance(3) {
                let _ = t.to_f64_vec();
            }
            if t.numel() <= 1 << 16 {
                pool.push(t);
            }
            if pool.len() > 24 {
                pool.remove(0);
            }
        }
    }
    drop(pool);
    // A device fault (an id outside its table that nobody read back) stays on the stream that
    // ran the kernel until that stream's own synchronisation reports it — a device-wide one
    // only peeks. Collect every report: the thread's streams on the device and on the CPU
    // (where some of the calls ran). Then the device must still be usable: memory
    // round-trips (no operator kernel, which the fake CUDA driver cannot run), and an
    // operator where the device runs them.
    for on in [dev, Device::CPU] {
        if let Ok(rt) = unirt::Runtime::get(on) {
            let _ = rt.sync_device();
            // One report per failed launch batch; a bounded number of takes clears them.
            for _ in 0..4 {
                if rt.sync_stream().is_ok() {
                    break;
                }
            }
        }
    }
    let unusable = |e: unirt::Error| Failure::Failed(format!("the device is unusable: {e}"));
    let x = Tensor::from_f64(&[1.0, 2.0, 3.0], &[3], DType::F32, dev).map_err(unusable)?;
    let back = x.to_f64_vec().map_err(unusable)?;
    if back != [1.0, 2.0, 3.0] {
        return Err(Failure::Failed(format!(
            "[1, 2, 3] reads back as {back:?} afterwards"
        )));
    }
    match x.add(&x).and_then(|y| y.to_f64_vec()) {
        Ok(y) if y != [2.0, 4.0, 6.0] => Err(Failure::Failed(format!(
            "the device computes 2·[1, 2, 3] as {y:?} afterwards"
        ))),
        Ok(_) => Ok(()),
        // The fake CUDA driver loads operator kernels but refuses to hand them out.
        Err(e)
            if e.to_string()
                .contains("cuModuleGetFunction failed: CUDA_ERROR_NOT_SUPPORTED") =>
        {
            Ok(())
        }
        Err(e) => Err(unusable(e)),
    }
}
