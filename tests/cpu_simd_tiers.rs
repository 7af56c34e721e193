//! The CPU kernels compute the same bits whatever vector instructions the CPU has: the same
//! operators run in child processes capped by `UNIRT_CPU_SIMD` (`none`, `avx2`, and the
//! widest the machine has) and every output's bytes must match. A tier the machine lacks
//! falls back to the next one down, so on a CPU without AVX-512 two runs share a path.
//! (GEMM's bits are the same on every CPU with FMA; see `every_simd_tier_computes_the_same_bits`.)

use std::process::Command;

use unirt::ops::elementwise::UnaryOp;
use unirt::tensor::{DType, Tensor};
use unirt::Device;

/// Set in a child: the file its digests go to.
const CHILD_OUT: &str = "UNIRT_SIMD_TIER_CHILD_OUT";

fn cpu() -> Device {
    "cpu:0".parse().expect("cpu:0 parses")
}

/// FNV-1a of a tensor's bytes, with its shape.
fn digest(t: &Tensor) -> unirt::Result<String> {
    let bytes = t.contiguous()?.to_bytes()?;
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    Ok(format!("{:?} {h:016x}", t.shape()))
}

/// Every operator family whose CPU kernel depends on the tier, in every float dtype, on odd
/// sizes (vector remainders) and a size past the parallel threshold.
fn digests() -> unirt::Result<Vec<String>> {
    let mut out = Vec::new();
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let x = Tensor::rand_uniform(&[67, 509], -6.0, 6.0, 1, dt, cpu())?;
        let y = Tensor::rand_uniform(&[67, 509], -3.0, 3.0, 2, dt, cpu())?;
        let row = Tensor::rand_uniform(&[509], 0.5, 1.5, 3, dt, cpu())?;
        let mut push = |name: &str, t: Tensor| -> unirt::Result<()> {
            out.push(format!("{dt} {name} {}", digest(&t)?));
            Ok(())
        };
        for op in [
            UnaryOp::Exp,
            UnaryOp::Sigmoid,
            UnaryOp::Silu,
            UnaryOp::Gelu,
            UnaryOp::GeluTanh,
            UnaryOp::Tanh,
            UnaryOp::Rsqrt,
        ] {
            let plan = unirt::ops::elementwise::unary(op, &x.desc())?;
            push(&format!("{op:?}"), plan.run1(&[&x])?)?;
        }
        push("add_bcast", x.add(&row)?)?;
        push(
            "mul_transposed",
            x.transpose(0, 1)?.mul(&y.transpose(0, 1)?)?,
        )?;
        push("transposed_copy", x.transpose(0, 1)?.contiguous()?)?;
        push("swiglu", x.swiglu(&y)?)?;
        push("rms_norm", x.rms_norm(&row, 1e-5)?)?;
        push("layer_norm", x.layer_norm(&row, &row, 1e-5)?)?;
        push("softmax", x.softmax(-1)?)?;
        push("log_softmax", x.log_softmax(-1)?)?;
        push("softmax_axis0", x.softmax(0)?)?;
        push("sum", x.sum(&[-1], false)?)?;
        let q = Tensor::rand_uniform(&[3, 4, 5, 64], -1.0, 1.0, 4, dt, cpu())?;
        let pos = Tensor::from_slice(&[0i64, 7, 4096], &[3], cpu())?;
        let qr = q.reshape(&[12, 5, 64])?.transpose(0, 1)?.contiguous()?;
        push(
            "rope",
            qr.reshape(&[5, 12, 64])?
                .narrow(0, 0, 3)?
                .rope(&pos, 1e4, false)?,
        )?;
        push(
            "rope_interleaved",
            qr.reshape(&[5, 12, 64])?
                .narrow(0, 2, 3)?
                .rope(&pos, 5e5, true)?,
        )?;
        let k = Tensor::rand_uniform(&[3, 2, 37, 64], -1.0, 1.0, 5, dt, cpu())?;
        let v = Tensor::rand_uniform(&[3, 2, 37, 64], -1.0, 1.0, 6, dt, cpu())?;
        push("attention", q.attention(&k, &v, true)?)?;
        let w = Tensor::rand_uniform(&[509, 131], -1.0, 1.0, 7, dt, cpu())?;
        push("gemv", x.narrow(0, 5, 1)?.matmul(&w)?)?;
        push("matmul", x.matmul(&w)?)?;
    }
    Ok(out)
}

/// In a child process: writes the digests. Elsewhere: nothing.
#[test]
fn tier_child() -> unirt::Result<()> {
    if let Ok(path) = std::env::var(CHILD_OUT) {
        let text = digests()?.join("\n");
        std::fs::write(path, text).map_err(|e| unirt::Error::Internal(e.to_string()))?;
    }
    Ok(())
}

#[test]
fn every_simd_tier_computes_the_same_bits() {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = std::env::temp_dir();
    let mut runs = Vec::new();
    for tier in ["none", "avx2", "avx512"] {
        let path = dir.join(format!("unirt-simd-tier-{}-{tier}.txt", std::process::id()));
        let child = Command::new(&exe)
            .args(["--exact", "tier_child", "--test-threads=1"])
            .env(CHILD_OUT, &path)
            .env("UNIRT_CPU_SIMD", tier)
            .output()
            .expect("child test runs");
        assert!(
            child.status.success(),
            "child with UNIRT_CPU_SIMD={tier} failed:\n{}",
            String::from_utf8_lossy(&child.stdout)
        );
        let text = std::fs::read_to_string(&path).expect("child wrote its digests");
        let _ = std::fs::remove_file(&path);
        runs.push((tier, text));
    }
    let (base_tier, base) = &runs[0];
    assert!(base.lines().count() > 60, "too few digests:\n{base}");
    // GEMM (m > 1) is unirt's own FMA kernel on the tiers with FMA, the same bits on both;
    // without FMA it is the `matrixmultiply` crate's (a software FMA per step would be far
    // too slow), whose sums round differently. So it is compared between the FMA tiers only.
    let gemm = |line: &str| line.split(' ').nth(1) == Some("matmul");
    for (tier, text) in &runs[1..] {
        for (a, b) in base.lines().zip(text.lines()) {
            if !gemm(a) {
                assert_eq!(a, b, "UNIRT_CPU_SIMD={tier} differs from {base_tier}");
            }
        }
        assert_eq!(base.lines().count(), text.lines().count());
    }
    let ((t1, avx2), (t2, avx512)) = (&runs[1], &runs[2]);
    assert!(avx2.lines().any(gemm), "no GEMM digests:\n{avx2}");
    for (a, b) in avx2.lines().zip(avx512.lines()) {
        assert_eq!(a, b, "UNIRT_CPU_SIMD={t2} differs from {t1}");
    }
}
