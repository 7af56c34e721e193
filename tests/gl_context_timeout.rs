//! Plans dropped on the GL adapter while another thread's long dispatch holds the GL context.
//!
//! wgpu's GL backend destroys a buffer under the adapter's context lock and panics when it has
//! waited 6 s for it ("Could not lock adapter context"); llvmpipe runs a dispatch inside
//! `queue.submit`, holding that lock for as long as the dispatch takes. A plan's wgpu objects
//! are destroyed wherever the plan is dropped: before `guard::release`, that panic reached the
//! thread dropping the plan, and a plan dropped while that thread was already unwinding
//! aborted the process ("panic in a destructor during cleanup") — seen in a random-graph run
//! on llvmpipe. Its own test binary: the ~12 s dispatch would time out every other test's GL
//! calls.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use unirt::ops::{self, KernelImpl};
use unirt::{discover, open, Backend, DType, DeviceKind, KernelArg, Tensor};

/// Every invocation spins through a fixed chain of multiply-adds: the dispatch's length is
/// proportional to the grid.
const SPIN: &str = "
@compute @workgroup_size(64, 1, 1)
fn spin(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x >= grid().x) { return; }
    var v = ld_t0(g.x);
    for (var i = 0u; i < 60000u; i = i + 1u) { v = v * 1.0000001 + 0.5; }
    st_t1(g.x, v);
}
";

#[test]
fn plans_dropped_while_a_gl_dispatch_holds_the_context() {
    let Some(dev) = discover()
        .devices()
        .into_iter()
        .filter(|d| d.kind == DeviceKind::Wgpu)
        .find(|d| open(*d).is_ok_and(|b| b.info().api == "gl"))
    else {
        eprintln!("no GL adapter on this machine: nothing to test");
        return;
    };
    ops::register_kernel(
        "test_spin",
        DeviceKind::Wgpu,
        DType::F32,
        KernelImpl::Wgsl {
            source: SPIN.into(),
            entry: "spin".into(),
            workgroup: [64, 1, 1],
        },
    )
    .unwrap();
    let spin_over = |n: u32| {
        let x = Tensor::zeros(&[n as usize], DType::F32, dev).unwrap();
        let y = Tensor::zeros(&[n as usize], DType::F32, dev).unwrap();
        let plan = ops::custom(
            "test_spin",
            DType::F32,
            &[x.desc()],
            &[y.desc()],
            &[] as &[KernelArg],
            [n, 1, 1],
        )
        .unwrap();
        (plan, x, y)
    };
    let rt = unirt::Runtime::get(dev).unwrap();
    // Calibrate: the long dispatch should last about 12 s.
    let small = 1u32 << 14;
    let (plan, x, y) = spin_over(small);
    let mut took = Duration::MAX;
    for _ in 0..2 {
        let t = Instant::now();
        plan.launch(&[&x], &[&y], None, x.stream().unwrap())
            .unwrap();
        rt.backend().synchronize().unwrap();
        took = took.min(t.elapsed());
    }
    let scale = (12.0 / took.as_secs_f64().max(1e-4)).clamp(1.0, 4096.0);
    let n = ((small as f64 * scale) as u32).min(1 << 26);
    let (long, x, y) = spin_over(n);

    let t = Tensor::zeros(&[1000], DType::F32, dev).unwrap();
    let plans: Vec<_> = (0..4)
        .map(|i| {
            ops::elementwise::binary_scalar(ops::BinaryOp::Add, &t.desc(), i as f64 + 0.5).unwrap()
        })
        .collect();
    let backend = rt.backend().clone();
    let running = std::thread::spawn(move || {
        long.launch(&[&x], &[&y], None, x.stream().unwrap())
            .unwrap();
        let t = Instant::now();
        let r = backend.synchronize();
        (t.elapsed(), r.err().map(|e| e.to_string()))
    });
    std::thread::sleep(Duration::from_millis(1500));
    // The plans are dropped while this thread unwinds from a panic of its own: a drop that
    // panicked here would abort the test binary.
    let t = Instant::now();
    let r = catch_unwind(AssertUnwindSafe(move || {
        let _held = plans;
        panic!("the caller's own panic");
    }));
    let dropped_in = t.elapsed();
    let payload = r.expect_err("the closure panics");
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert_eq!(msg, "the caller's own panic");
    let (ran, err) = running.join().unwrap();
    eprintln!("dispatch over {n} invocations: {ran:?} ({err:?}); plans dropped in {dropped_in:?}");
    assert!(
        dropped_in > Duration::from_secs(5),
        "the drop did not wait for the GL context ({dropped_in:?}): the dispatch did not hold it, \
         so this run tested nothing"
    );
}
