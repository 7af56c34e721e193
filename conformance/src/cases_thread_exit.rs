//! Calls from thread-local destructors: a user's thread-local that holds a tensor, or whose
//! destructor computes (flushes a result, replays a graph) when its thread exits. Rust runs
//! those destructors after unirt's own thread-locals may be gone — the thread's streams, its
//! recording state, the CPU GEMM's packing buffers — and every unirt call that reached one
//! of them once panicked there, which aborts the process ("thread local panicked on drop").
//! Now such calls compute on a stream shared by exiting threads; starting a recording there
//! is a typed error.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use unirt::tensor::{DType, Tensor};
use unirt::{Device, Runtime};

use crate::ops_check::*;
use crate::{ensure, Case, Ctx, Failure};

pub(super) const CASES: &[Case] = &[Case {
    name: "thread_exit::thread_local_destructors_compute",
    needs: &[],
    run: destructors_compute,
}];

/// Runs its closure when the thread's thread-locals are destroyed.
struct AtExit(Option<Box<dyn FnOnce()>>);

impl Drop for AtExit {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f()
        }
    }
}

thread_local! {
    /// First touched before anything of unirt's, so destroyed after all of unirt's.
    static AT_EXIT: RefCell<AtExit> = const { RefCell::new(AtExit(None)) };
    /// A tensor kept by the thread, freed when it exits.
    static KEPT: RefCell<Option<Tensor>> = const { RefCell::new(None) };
}

/// What the destructor saw: its recording attempt's outcome, or what went wrong.
type Outcome = Arc<Mutex<Option<Result<Vec<String>, String>>>>;

/// What the destructor computes, checked by the case after the thread has exited.
fn at_exit(device: Device, exec: unirt::graph::GraphExec) -> Result<Vec<String>, String> {
    let e = |what: &'static str| move |e: unirt::Error| format!("{what}: {e}");
    let mut seen = Vec::new();
    let x = Tensor::full(&[64, 64], 0.5, DType::F32, device).map_err(e("full"))?;
    let w = Tensor::full(&[64, 64], 0.25, DType::F32, device).map_err(e("full"))?;
    let y = x.matmul(&w).and_then(|y| y.silu()).map_err(e("matmul"))?;
    let got = y.to_vec::<f32>().map_err(e("read"))?;
    let want = 8.0 / (1.0 + (-8.0f32).exp());
    if got.iter().any(|v| (v - want).abs() > 1e-3) {
        return Err(format!("silu(x·w) at exit gave {}, want {want}", got[0]));
    }
    exec.replay().map_err(e("replay"))?;
    let out = exec
        .output("y")
        .and_then(|t| t.to_vec::<f32>())
        .map_err(e("exec output"))?;
    if out != [4.0; 16] {
        return Err(format!(
            "the exec replayed at exit gave {}, want 4.0",
            out[0]
        ));
    }
    Runtime::get(device)
        .and_then(|rt| rt.sync_device())
        .map_err(e("sync_device"))?;
    // Recording needs the thread's recording state: refused, or (not yet destroyed) fine.
    match unirt::graph::record(device, || x.add(&w)) {
        Ok(_) => seen.push("recorded".to_string()),
        Err(err) => seen.push(err.kind_name().to_string()),
    }
    Ok(seen)
}

fn destructors_compute(ctx: &Ctx) -> Result<(), Failure> {
    let device = ctx.device;
    let outcome: Outcome = Arc::default();
    let slot = outcome.clone();
    let thread = std::thread::spawn(move || -> unirt::Result<()> {
        AT_EXIT.with(|_| ());
        KEPT.with(|_| ());
        // Touch the thread's unirt state: its stream, a recording, a replay, a GEMM.
        let x = Tensor::full(&[16], 1.0, DType::F32, device)?;
        let (mut g, y) = unirt::graph::record(device, || x.add_scalar(1.0)?.mul_scalar(2.0))?;
        g.mark_input("x", &x)?;
        g.mark_output("y", &y)?;
        let exec = g.instantiate()?;
        exec.replay()?;
        let a = Tensor::full(&[64, 64], 1.0, DType::F32, device)?;
        KEPT.with(|k| -> unirt::Result<()> {
            *k.borrow_mut() = Some(a.matmul(&a)?);
            Ok(())
        })?;
        AT_EXIT.with(|h| {
            h.borrow_mut().0 = Some(Box::new(move || {
                let r = at_exit(device, exec);
                if let Ok(mut s) = slot.lock() {
                    *s = Some(r);
                }
            }))
        });
        Ok(())
    });
    match thread.join() {
        Ok(r) => r.map_err(err("the thread's setup"))?,
        Err(_) => return Err(Failure::Failed("the thread panicked".into())),
    }
    let outcome = outcome
        .lock()
        .map_err(|_| Failure::Failed("poisoned".into()))?
        .take();
    match outcome {
        None => Err(Failure::Failed(
            "the thread-local destructor did not run".into(),
        )),
        Some(Err(e)) => Err(Failure::Failed(format!(
            "in a thread-local destructor: {e}"
        ))),
        Some(Ok(seen)) => {
            ensure!(
                seen == ["unsupported"] || seen == ["recorded"],
                "recording from a thread-local destructor gave {seen:?}, want an unsupported \
                 error (or a recording)"
            );
            Ok(())
        }
    }
}
