//! Tensors that cross threads (`ops::tensors_across_threads`): eager operators run
//! asynchronously on the calling thread's stream, so a tensor one thread computes and hands to
//! another is still being written when it arrives. Read, used, overwritten or dropped there, it
//! must behave as if the producer had waited: see `unirt::tensor`'s module docs.

use std::sync::mpsc;

use unirt::tensor::{DType, Tensor};
use unirt::Backend;

use crate::{ensure, Case, Ctx, Failure};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "ops::tensors_across_threads",
            needs: &[],
            run: across_threads,
        },
        Case {
            name: "ops::tensors_shared_by_threads_at_random",
            needs: &[],
            run: shared_at_random,
        },
    ]
}

/// Elements per tensor: large enough that a producer's operators are still queued when the
/// tensor reaches the other thread (on every backend here they were, without the ordering).
const N: usize = 1 << 21;

fn full(ctx: &Ctx, v: f64) -> Result<Tensor, Failure> {
    Ok(Tensor::full(&[N], v, DType::F32, ctx.device)?)
}

fn all_equal(t: &Tensor, want: f32, what: &str) -> Result<(), Failure> {
    let v = t.to_vec::<f32>()?;
    let wrong = v.iter().filter(|&&x| x != want).count();
    ensure!(
        wrong == 0,
        "{what}: {wrong} of {} elements differ from {want} (first {:?})",
        v.len(),
        &v[..2]
    );
    Ok(())
}

const CLOSED: &str = "the other thread left the channel";

fn closed() -> Failure {
    Failure::Failed(CLOSED.into())
}

fn is_closed(f: &Failure) -> bool {
    matches!(f, Failure::Failed(m) if m == CLOSED)
}

fn across_threads(ctx: &Ctx) -> Result<(), Failure> {
    let (a, b) = (full(ctx, 1.0)?, full(ctx, 2.0)?);
    // Finished before the threads start: what follows is about the threads' own work.
    a.synchronize()?;
    b.synchronize()?;
    for round in 0..3 {
        std::thread::scope(|s| -> Result<(), Failure> {
            let (tx, rx) = mpsc::channel::<Tensor>();
            let (back_tx, back_rx) = mpsc::channel::<Tensor>();
            let (a, b) = (&a, &b);
            let producer = s.spawn(move || -> Result<(), Failure> {
                // 1. Computed here, read there.
                tx.send(a.add(b)?.mul_scalar(2.0)?).map_err(|_| closed())?;
                // 2. Computed here, used by an operator there.
                tx.send(a.add(b)?).map_err(|_| closed())?;
                // 3. Read here (a sum still queued), overwritten there: the sum must see the
                // old values.
                let x = full(ctx, 3.0)?;
                x.synchronize()?;
                let sum = x.mul_scalar(1.0)?.add(&x)?.sum(&[0], false)?;
                tx.send(x).map_err(|_| closed())?;
                let overwritten = back_rx.recv().map_err(|_| closed())?;
                all_equal(&overwritten, 0.0, "the tensor the other thread overwrote")?;
                let got = sum.to_vec::<f32>()?[0];
                ensure!(
                    got == 6.0 * N as f32,
                    "a sum queued before another thread overwrote its input gave {got}"
                );
                // 4. Computed here, dropped there at once.
                tx.send(a.add(b)?.add(a)?).map_err(|_| closed())?;
                Ok(())
            });
            // The consumer owns its channel ends, so a failure here drops them and the
            // producer's next receive ends instead of waiting for ever.
            let consumer = (move || -> Result<(), Failure> {
                let recv = || {
                    rx.recv()
                        .map_err(|_| Failure::Failed("the producer stopped early".into()))
                };
                all_equal(&recv()?, 6.0, "read on another thread")?;
                let z = recv()?.add_scalar(1.0)?;
                all_equal(&z, 4.0, "an operator on another thread")?;
                let x = recv()?;
                x.copy_from(&full(ctx, 0.0)?)?;
                back_tx.send(x).map_err(|_| closed())?;
                drop(recv()?);
                // Memory allocated now must not receive the dropped tensor's pending writes.
                let fresh = full(ctx, 5.0)?;
                ctx.backend.synchronize()?;
                all_equal(
                    &fresh,
                    5.0,
                    "memory allocated after a pending tensor was dropped",
                )
            })();
            let produced = producer
                .join()
                .unwrap_or_else(|_| Err(Failure::Failed("the producer panicked".into())));
            // The root cause: the producer's failure unless it only saw the consumer leave.
            let first = match (consumer, produced) {
                (Err(c), Err(p)) if is_closed(&p) => Err(c),
                (c, p) => p.and(c),
            };
            first.map_err(|e| match e {
                Failure::Failed(m) => Failure::Failed(format!("round {round}: {m}")),
                other => other,
            })
        })?;
    }
    Ok(())
}

/// Generations of four short-lived threads (so streams die with work queued on tensors others
/// still use) run random operators, reads, copies and drops over one pool of tensors they
/// replace as they go. Values race by design; what must hold: no panic, no hang, no error but
/// the aliasing refusal (a tensor copied into itself), and every tensor readable at the end.
fn shared_at_random(ctx: &Ctx) -> Result<(), Failure> {
    use std::sync::Mutex;
    use unirt::tensor::SplitMix64;
    let pool: Mutex<Vec<Tensor>> = Mutex::new(
        (0..8)
            .map(|i| Tensor::full(&[4096], i as f64, DType::F32, ctx.device))
            .collect::<unirt::Result<_>>()?,
    );
    let pool = &pool;
    let take = |rng: &mut SplitMix64| -> Tensor {
        let p = pool.lock().unwrap_or_else(|e| e.into_inner());
        p[rng.below(p.len() as u64) as usize].clone()
    };
    for generation in 0..12u64 {
        std::thread::scope(|s| {
            let workers = (0..4u64)
                .map(|w| {
                    s.spawn(move || -> Result<(), Failure> {
                        let mut rng = SplitMix64::new(generation * 131 + w);
                        for _ in 0..40 {
                            let (a, b) = (take(&mut rng), take(&mut rng));
                            let r = match rng.below(7) {
                                0 => a.add(&b).map(Some),
                                1 => a.mul_scalar(0.5).map(Some),
                                2 => a.to_vec::<f32>().map(|_| None),
                                3 => a.copy_from(&b).map(|_| None),
                                4 => a.sum(&[0], true).map(|_| None),
                                5 => a.tanh().map(Some),
                                _ => {
                                    drop(a);
                                    Ok(None)
                                }
                            };
                            match r {
                                Ok(Some(t)) => {
                                    let i = rng.below(8) as usize;
                                    pool.lock().unwrap_or_else(|e| e.into_inner())[i] = t;
                                }
                                Ok(None) => {}
                                Err(e) if e.kind_name() == "aliasing" => {}
                                Err(e) => {
                                    return Err(Failure::Failed(format!(
                                        "generation {generation}, thread {w}: {e}"
                                    )))
                                }
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            crate::join_workers(workers)
        })?;
    }
    for t in pool.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        t.to_vec::<f32>()?;
    }
    Ok(())
}
