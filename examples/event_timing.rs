//! Timing work with events: how long do 64 MiB memsets take on each device?
//!
//! `cargo run --release --example event_timing`

use unirt::{Backend, Event, Stream};

fn main() -> Result<(), unirt::Error> {
    let bytes = 64 << 20;
    for device in unirt::discover().devices() {
        let dev = unirt::open(device)?;
        let buf = dev.malloc(bytes)?;
        let s = Stream::new(&dev)?;
        let (start, end) = (Event::new(&dev)?, Event::new(&dev)?);
        start.record(&s)?;
        for v in 0..10u8 {
            s.memset(buf, v, bytes)?;
        }
        end.record(&s)?;
        // Recorded work is still running: the query says so.
        println!("{device}: right after enqueue: {:?}", end.query()?);
        end.synchronize()?;
        let ms = start.elapsed_ms(&end)?;
        println!(
            "{device}: 10 × 64 MiB memset in {ms:.3} ms ({:.1} GB/s)",
            10.0 * bytes as f64 / (ms as f64 * 1e6)
        );
        dev.free(buf)?;
    }
    Ok(())
}
