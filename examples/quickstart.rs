//! Quickstart: list the devices, then add two vectors on each available one.
//!
//! `cargo run --example quickstart`

use unirt::{Backend, BackendExt, KernelArg, Stream};

fn main() -> Result<(), unirt::Error> {
    let n = 1000u32;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
    for device in unirt::discover().devices() {
        let dev = unirt::open(device)?;
        let bytes = 4 * n as usize;
        let (da, db, dc) = (dev.malloc(bytes)?, dev.malloc(bytes)?, dev.malloc(bytes)?);
        dev.copy_to_device(da, bytemuck::cast_slice(&a))?;
        dev.copy_to_device(db, bytemuck::cast_slice(&b))?;
        let s = Stream::new(&dev)?;
        s.launch(
            "add_f32",
            &[da.into(), db.into(), dc.into(), KernelArg::U32(n)],
        )?;
        s.synchronize()?;
        let out = dev.read_vec(dc, bytes)?;
        let c: &[f32] = bytemuck::cast_slice(&out);
        println!("{device} ({}): c[999] = {}", dev.info().name, c[999]);
        for p in [da, db, dc] {
            dev.free(p)?;
        }
    }
    Ok(())
}
