//! Capture a stream's work once and replay it: the graph runs the same commands each time,
//! re-reading their inputs.
//!
//! `cargo run --example graph_replay`

use unirt::{Backend, BackendExt, CaptureMode, Device, Stream};

fn main() -> Result<(), unirt::Error> {
    let device: Device = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "cpu:0".into())
        .parse()?;
    let dev = unirt::open(device)?;
    let n = 256u32;
    let bytes = 4 * n as usize;
    let (acc, one) = (dev.malloc(bytes)?, dev.malloc(bytes)?);
    dev.memset(acc, 0, bytes)?;
    let s = Stream::new(&dev)?;
    s.launch("fill", &[one.into(), 1.0f32.to_bits().into(), n.into()])?;

    // Record: acc += one, three times.
    dev.begin_capture(s.id(), CaptureMode::Global)?;
    for _ in 0..3 {
        s.launch("add_f32", &[acc.into(), one.into(), acc.into(), n.into()])?;
    }
    let graph = dev.end_capture(s.id())?;
    let exec = dev.graph_instantiate(graph)?;

    for i in 1..=4 {
        dev.graph_launch(exec, s.id())?;
        s.synchronize()?;
        let v = dev.read_vec(acc, 4)?;
        println!(
            "after replay {i}: acc[0] = {}",
            f32::from_le_bytes([v[0], v[1], v[2], v[3]])
        );
    }
    dev.graph_exec_destroy(exec)?;
    dev.graph_destroy(graph)?;
    dev.free(acc)?;
    dev.free(one)?;
    Ok(())
}
