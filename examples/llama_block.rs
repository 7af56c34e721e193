//! A small Llama-style decoder (seeded random weights, hidden 256, 2 layers, grouped-query
//! attention over a KV cache) generating tokens on every available device, eagerly and by
//! replaying a recorded operator graph — checking that eager and replay give bitwise the same
//! logits on each device, and that the devices agree within f32 tolerance.
//!
//! `cargo run --release --example llama_block [steps]`

#[path = "llama/model.rs"]
mod model;

use model::{agree, missing_kernels, run_device, Config};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(16);
    let cfg = Config::TINY;
    println!(
        "llama block: vocab {}, hidden {}, {} layers, {}/{} heads, ffn {}, {steps} tokens",
        cfg.vocab, cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn
    );
    let mut runs = Vec::new();
    let mut failed = false;
    for device in unirt::discover().devices() {
        let missing = missing_kernels(device);
        if !missing.is_empty() {
            println!("{device}: not run, no kernels for {}", missing.join(", "));
            continue;
        }
        let r = run_device(device, cfg, steps, steps)?;
        println!(
            "{device}: tokens {:?}; replay bitwise = eager: {}; {:.1} tok/s eager, {:.1} tok/s replay ({:.2}x); {} captured + {} eager segments; intermediates {} KiB planned vs {} KiB naive",
            r.tokens,
            r.replay_bitwise_equal,
            r.eager_tokens_per_s,
            r.replay_tokens_per_s,
            r.replay_tokens_per_s / r.eager_tokens_per_s,
            r.segments.0,
            r.segments.1,
            r.arena_bytes / 1024,
            r.naive_bytes / 1024
        );
        failed |= !r.replay_bitwise_equal;
        runs.push(r);
    }
    if let Some((first, rest)) = runs.split_first() {
        for r in rest {
            match agree(first, r, 1e-3) {
                Ok(n) => println!("{} agrees with {} on {n} steps", r.device, first.device),
                Err(e) => {
                    println!("DISAGREE: {e}");
                    failed = true;
                }
            }
        }
    }
    if failed {
        return Err("eager and replay (or the devices) disagree".into());
    }
    Ok(())
}
