use std::time::Instant;
use unirt::{
    tensor::{DType, Tensor},
    Device,
};
fn rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap()
        .to_string()
}
fn main() -> unirt::Result<()> {
    let dev: Device = std::env::args().nth(1).unwrap().parse().unwrap();
    let which = std::env::args().nth(2).unwrap();
    let q = Tensor::rand_uniform(&[1, 4, 1, 32], -1.0, 1.0, 1, DType::F32, dev)?;
    let t0 = Instant::now();
    let lo: usize = std::env::args()
        .nth(3)
        .map(|s| s.parse().unwrap())
        .unwrap_or(1);
    for l in lo..lo + 120 {
        let k = Tensor::rand_uniform(&[1, 4, l, 32], -1.0, 1.0, 2, DType::F32, dev)?;
        let s = Tensor::rand_uniform(&[4, l], -1.0, 1.0, 3, DType::F32, dev)?;
        let r = match which.as_str() {
            "attention" => q.attention(&k, &k, true)?,
            "softmax" => s.softmax(-1)?,
            "rms_norm" => s.rms_norm(&Tensor::ones(&[l], DType::F32, dev)?, 1e-5)?,
            "add" => s.add(&s)?,
            "addbig" => {
                let b = Tensor::rand_uniform(&[l, 64], -1.0, 1.0, 3, DType::F32, dev)?;
                b.add(&b)?
            }
            "softmaxbig" => {
                let b = Tensor::rand_uniform(&[l, 64], -1.0, 1.0, 3, DType::F32, dev)?;
                b.softmax(-1)?
            }
            "silubig" => {
                let b = Tensor::rand_uniform(&[l, 64], -1.0, 1.0, 3, DType::F32, dev)?;
                b.silu()?
            }
            "sumbig" => {
                let b = Tensor::rand_uniform(&[l, 64], -1.0, 1.0, 3, DType::F32, dev)?;
                b.sum(&[-1], false)?
            }
            "rmsbig" => {
                let b = Tensor::rand_uniform(&[l, 64], -1.0, 1.0, 3, DType::F32, dev)?;
                b.rms_norm(&Tensor::ones(&[64], DType::F32, dev)?, 1e-5)?
            }
            "mmbig" => {
                let b = Tensor::rand_uniform(&[l, 64], -1.0, 1.0, 3, DType::F32, dev)?;
                b.matmul(&Tensor::ones(&[64, 64], DType::F32, dev)?)?
            }
            "catbig" => {
                let b = Tensor::rand_uniform(&[l, 64], -1.0, 1.0, 3, DType::F32, dev)?;
                Tensor::concat(&[&b, &b], 0)?
            }
            "sum" => s.sum(&[-1], false)?,
            "matmul" => s.matmul(&Tensor::ones(&[l, 8], DType::F32, dev)?)?,
            "matmul_t" => q.reshape(&[4, 32])?.matmul(
                &k.reshape(&[4, l, 32])?
                    .transpose(1, 2)?
                    .contiguous()?
                    .narrow(0, 0, 1)?
                    .reshape(&[32, l])?,
            )?,
            "rand" => s.clone(),
            "rope" => k.rope(
                &Tensor::arange(0.0, l as f64, 1.0, DType::I64, dev)?,
                10000.0,
                false,
            )?,
            _ => panic!(),
        };
        let _ = r.to_vec::<f32>()?;
        if l % 20 == 0 {
            println!("{which} l={l} t={:?} {}", t0.elapsed(), rss());
        }
    }
    Ok(())
}
