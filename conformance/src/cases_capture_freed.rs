//! Stream capture and replay when captured memory is freed: replay and instantiate are refused
//! once an allocation the graph uses is gone, even when the same addresses are allocated again
//! (device and pinned host memory), and an instantiate racing a free either wins (its replays
//! are then refused) or is refused — the driver never builds an exec on released memory.

use super::*;
use crate::ensure;
use unirt::hal::{CaptureMode, DevicePtr, MemcpyKind};
use unirt::{Backend, Stream};

const CAP: &[Need] = &[Need::Capture];

pub(super) const CASES: &[Case] = &[
    Case {
        name: "capture::replay_after_free_is_refused",
        needs: CAP,
        run: replay_after_free,
    },
    Case {
        name: "capture::memory_freed_and_allocated_again_is_refused",
        needs: CAP,
        run: freed_and_allocated_again,
    },
    Case {
        name: "capture::instantiate_racing_a_free",
        needs: CAP,
        run: instantiate_racing_free,
    },
];

fn replay_after_free(ctx: &Ctx) -> Result<(), Failure> {
    let s = Stream::new(&ctx.backend)?;
    let p = ctx.malloc(4096)?;
    ctx.begin_capture(s.id(), CaptureMode::Global)?;
    ctx.memset_async(p, 1, 4096, s.id())?;
    let g = ctx.end_capture(s.id())?;
    let x = ctx.graph_instantiate(g)?;
    ctx.graph_launch(x, s.id())?;
    s.synchronize()?;
    ctx.free(p)?;
    let r = ctx.graph_launch(x, s.id());
    s.synchronize()?;
    ctx.graph_exec_destroy(x)?;
    ctx.graph_destroy(g)?;
    expect_err(
        r,
        &["out_of_bounds", "invalid_handle"],
        "replaying a graph whose buffer was freed",
    )
}

/// One thread instantiates a graph while another frees the memory it captured: the instantiate
/// either comes first (its exec's replays are then refused) or is refused with a typed error —
/// the driver never builds an exec on memory released meanwhile. The C ABI fuzzer's four
/// threads found the gap between unirt's check and the driver's instantiate on CUDA; over the
/// fake driver this case records the misuse if the gap opens again.
fn instantiate_racing_free(ctx: &Ctx) -> Result<(), Failure> {
    let n = 1024usize;
    let s = Stream::new(&ctx.backend)?;
    for round in 0..1000u32 {
        let p = ctx.malloc(n)?;
        ctx.begin_capture(s.id(), CaptureMode::Global)?;
        ctx.memset_async(p, 7, n, s.id())?;
        let g = ctx.end_capture(s.id())?;
        // Both start together; the free comes a little later each round (0 to 6 µs), so some
        // round lands it inside the instantiate.
        let start = std::sync::Barrier::new(2);
        let (instantiated, freed) = std::thread::scope(|sc| {
            let t = sc.spawn(|| {
                start.wait();
                ctx.graph_instantiate(g)
            });
            start.wait();
            let until = std::time::Instant::now()
                + std::time::Duration::from_nanos(u64::from(round % 32) * 200);
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
            let freed = ctx.free(p);
            (t.join(), freed)
        });
        freed?;
        match instantiated {
            Ok(Ok(x)) => {
                let r = ctx.graph_launch(x, s.id());
                s.synchronize()?;
                ctx.graph_exec_destroy(x)?;
                expect_err(
                    r,
                    &["out_of_bounds", "invalid_handle"],
                    "replaying an exec whose memory was freed after its instantiate",
                )?;
            }
            Ok(Err(e)) => expect_err::<()>(
                Err(e),
                &["out_of_bounds", "invalid_handle"],
                "instantiating a graph whose memory is being freed",
            )?,
            Err(_) => return Err(Failure::Failed("the instantiating thread panicked".into())),
        }
        ctx.graph_destroy(g)?;
    }
    Ok(())
}

/// Memory a graph uses, freed after the capture and allocated again — at the same address
/// where the allocator hands it out anew, as CUDA's does — is not the memory the graph
/// captured. Instantiating the graph and replaying an exec of it must both be refused with a
/// typed error (a real CUDA driver's nodes refer to the freed allocation: instantiating them
/// was the suspected SIGSEGV inside `cuGraphInstantiateWithFlags`), and the new allocation must
/// keep its bytes. Device memory (a memset node) and pinned host memory (a copy node) alike.
fn freed_and_allocated_again(ctx: &Ctx) -> Result<(), Failure> {
    let n = 4096;
    let s = Stream::new(&ctx.backend)?;
    // Device memory.
    let p = ctx.malloc(n)?;
    ctx.begin_capture(s.id(), CaptureMode::Global)?;
    ctx.memset_async(p, 1, n, s.id())?;
    let g = ctx.end_capture(s.id())?;
    let x = ctx.graph_instantiate(g)?;
    ctx.free(p)?;
    let held = allocate_until(n, p.0, |n| ctx.malloc(n).map(|q| q.0))?;
    for &q in &held {
        ctx.memset(DevicePtr(q), 7, n)?;
    }
    let checked = refused_after_free(ctx, g, x, &s, "device memory");
    for &q in &held {
        let mut back = vec![0u8; n];
        // SAFETY: `back` holds n bytes; q is a live device allocation of n bytes.
        unsafe { ctx.memcpy(back.as_mut_ptr() as u64, q, n, MemcpyKind::D2H)? };
        ensure!(
            back.iter().all(|&b| b == 7),
            "a refused replay wrote into memory allocated after the capture's was freed"
        );
        ctx.free(DevicePtr(q))?;
    }
    checked?;
    // Pinned host memory: a captured upload from it.
    let d = Buf::new(&ctx.backend, n)?;
    let h = ctx.malloc_host(n)?;
    ctx.begin_capture(s.id(), CaptureMode::Global)?;
    // SAFETY: h is a live pinned allocation of n bytes, d a device buffer of n bytes; the copy
    // runs only at replay, and every replay after h is freed must be refused.
    unsafe { ctx.memcpy_async(d.ptr.0, h.0, n, MemcpyKind::H2D, s.id())? };
    let g = ctx.end_capture(s.id())?;
    let x = ctx.graph_instantiate(g)?;
    ctx.free_host(h)?;
    let held = allocate_until(n, h.0, |n| ctx.malloc_host(n).map(|q| q.0))?;
    let checked = refused_after_free(ctx, g, x, &s, "pinned host memory");
    for q in held {
        ctx.free_host(unirt::hal::HostPtr(q))?;
    }
    checked
}

/// Allocates `n` bytes until `addr` comes back (at most 16 tries; the others stay allocated
/// meanwhile, so each try gets a new address); returns everything allocated.
fn allocate_until(
    n: usize,
    addr: u64,
    mut alloc: impl FnMut(usize) -> Result<u64, unirt::Error>,
) -> Result<Vec<u64>, Failure> {
    let mut held = Vec::new();
    for _ in 0..16 {
        let q = alloc(n)?;
        held.push(q);
        if q == addr {
            break;
        }
    }
    Ok(held)
}

/// Instantiating graph `g` is refused, or its exec's replay is; replaying exec `x` is refused;
/// then both are destroyed.
fn refused_after_free(
    ctx: &Ctx,
    g: unirt::hal::GraphId,
    x: unirt::hal::GraphExecId,
    s: &Stream,
    what: &str,
) -> Result<(), Failure> {
    let kinds = ["out_of_bounds", "invalid_handle"];
    let relaunched = ctx.graph_launch(x, s.id());
    let (instantiated, fresh) = match ctx.graph_instantiate(g) {
        Ok(x2) => (Ok(()), Some(ctx.graph_launch(x2, s.id()).map(|()| x2))),
        Err(e) => (Err(e), None),
    };
    s.synchronize()?;
    ctx.graph_exec_destroy(x)?;
    ctx.graph_destroy(g)?;
    expect_err(
        relaunched,
        &kinds,
        &format!("replaying an exec whose {what} was freed and allocated again"),
    )?;
    match fresh {
        None => expect_err(
            instantiated,
            &kinds,
            &format!("instantiating a graph whose {what} was freed and allocated again"),
        ),
        Some(Ok(x2)) => {
            ctx.graph_exec_destroy(x2)?;
            Err(Failure::Failed(format!(
                "a graph whose {what} was freed and allocated again was instantiated and replayed"
            )))
        }
        Some(Err(e)) => expect_err(
            Err::<(), _>(e),
            &kinds,
            &format!("replaying a new exec of a graph whose {what} was freed and allocated again"),
        ),
    }
}
