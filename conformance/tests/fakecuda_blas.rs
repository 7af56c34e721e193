//! The CUDA matmul through a run-time-loaded cuBLAS, over the fake driver: the fake library
//! also exports the few `cublas*` entry points unirt uses (its GEMM runs on the CPU in stream
//! order), and `UNIRT_CUBLAS_LIBRARY` points unirt at it. On the fake driver the NVRTC kernels
//! cannot execute, so a correct result proves the GEMM went through cuBLAS; a layout cuBLAS
//! cannot take falls back to the NVRTC kernel (stopping at the fake driver's refused fetch).
//! The absent path (no cuBLAS: NVRTC kernels, reported by `unirt devices`) is checked in
//! `fakecuda_conformance`. The same run drives one NVRTC operator kernel end to end through the
//! fake driver's CPU twin of `op_add` (f32).

mod fakecuda_support;

use unirt::tensor::{DType, Tensor};
use unirt::{Device, DeviceKind};

fn reference(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
        }
    }
    c
}

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: [{i}] {g} vs {w}"
        );
    }
}

#[test]
fn matmul_runs_through_the_loaded_cublas() {
    let (lib, _ctl) = fakecuda_support::use_fake_driver(&[
        ("UNIRT_BACKENDS", "cpu,cuda"),
        ("UNIRT_FAKECUDA_OP_TWINS", "1"),
    ]);
    std::env::set_var("UNIRT_CUBLAS_LIBRARY", &lib);
    let summary = unirt::vendors::cuda::blas_summary();
    assert!(summary.starts_with("cuBLAS at "), "{summary}");
    let dev = Device::new(DeviceKind::Cuda, 0);
    let (m, k, n) = (5, 7, 3);
    let a: Vec<f64> = (0..m * k)
        .map(|i| ((i * 7 % 11) as f64 - 5.0) / 4.0)
        .collect();
    let b: Vec<f64> = (0..k * n)
        .map(|i| ((i * 5 % 13) as f64 - 6.0) / 8.0)
        .collect();
    let want = reference(&a, &b, m, k, n);
    for (dt, tol) in [(DType::F32, 1e-5), (DType::F16, 1e-2), (DType::BF16, 5e-2)] {
        let ta = Tensor::from_f64(&a, &[m, k], dt, dev).unwrap();
        let tb = Tensor::from_f64(&b, &[k, n], dt, dev).unwrap();
        let c = ta.matmul(&tb).unwrap().to_f64_vec().unwrap();
        close(&c, &want, tol, &format!("{dt} row-major"));
        // A transposed view (column-major storage) maps to a transposed operand.
        let at = Tensor::from_f64(&transpose(&a, m, k), &[k, m], dt, dev)
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        let c = at.matmul(&tb).unwrap().to_f64_vec().unwrap();
        close(&c, &want, tol, &format!("{dt} transposed A"));
    }
    // A batch of 2 with B broadcast (stride 0).
    let a2: Vec<f64> = a
        .iter()
        .chain(a.iter().map(|x| -x).collect::<Vec<_>>().iter())
        .copied()
        .collect();
    let ta = Tensor::from_f64(&a2, &[2, m, k], DType::F32, dev).unwrap();
    let tb = Tensor::from_f64(&b, &[k, n], DType::F32, dev).unwrap();
    let c = ta.matmul(&tb).unwrap().to_f64_vec().unwrap();
    let mut want2 = want.clone();
    want2.extend(want.iter().map(|x| -x));
    close(&c, &want2, 1e-5, "batched, B broadcast");
    capture_and_replay(dev, &a, &b, &want, (m, k, n));
    op_kernel_end_to_end(dev);
    embedding_faults_end_to_end(dev);
    // Strides cuBLAS cannot take (no unit stride in A): the NVRTC kernel is planned instead,
    // which the fake driver compiles and loads but refuses to fetch.
    let odd = Tensor::from_f64(&vec![1.0; m * k * 2], &[m, k, 2], DType::F32, dev)
        .and_then(|t| t.narrow(2, 0, 1))
        .and_then(|t| t.squeeze(2))
        .unwrap();
    assert_eq!(odd.layout().strides(), [2 * k, 2]);
    let r = unirt::ops::matmul::matmul(&odd.desc(), &tb.desc(), 1.0);
    match r {
        Err(e) => assert!(
            e.to_string().contains("cuModuleGetFunction")
                && e.to_string().contains("NOT_SUPPORTED"),
            "{e}"
        ),
        Ok(_) => panic!("a layout without unit strides was planned for cuBLAS"),
    }
}

/// A matmul launch through cuBLAS is recorded by a stream capture and replayed from the graph
/// (the operator-graph path captures op launches this way).
fn capture_and_replay(
    dev: Device,
    a: &[f64],
    b: &[f64],
    want: &[f64],
    (m, k, n): (usize, usize, usize),
) {
    use unirt::hal::CaptureMode;
    use unirt::Backend;
    let rt = unirt::Runtime::get(dev).unwrap();
    let s = rt.backend().stream_create().unwrap();
    let ta = Tensor::from_f64(a, &[m, k], DType::F32, dev).unwrap();
    let tb = Tensor::from_f64(b, &[k, n], DType::F32, dev).unwrap();
    let c = Tensor::zeros(&[m, n], DType::F32, dev).unwrap();
    let plan = unirt::ops::matmul::matmul(&ta.desc(), &tb.desc(), 1.0).unwrap();
    rt.backend().synchronize().unwrap();
    rt.begin_capture(s, CaptureMode::Global).unwrap();
    let launched = plan.launch(&[&ta, &tb], &[&c], None, s);
    let graph = rt.end_capture().unwrap();
    launched.unwrap();
    // Nothing ran while capturing.
    assert!(c.to_f64_vec().unwrap().iter().all(|&x| x == 0.0));
    let exec = graph.instantiate().unwrap();
    exec.launch(s).unwrap();
    rt.backend().stream_synchronize(s).unwrap();
    close(&c.to_f64_vec().unwrap(), want, 1e-5, "replayed capture");
    drop(exec);
    drop(graph);
    rt.backend().stream_destroy(s).unwrap();
}

/// The host side of an NVRTC operator kernel end to end on the fake driver, which runs a CPU
/// twin of the f32 `op_add` entry (UNIRT_FAKECUDA_OP_TWINS=1): compiled source, module and
/// function, the by-value layout struct, range checks, broadcast and strided views, in place,
/// and a captured launch replayed from its graph.
fn op_kernel_end_to_end(dev: Device) {
    use unirt::hal::CaptureMode;
    use unirt::Backend;
    let cpu = Device::CPU;
    let av: Vec<f64> = (0..15).map(|i| i as f64 * 0.5 - 3.0).collect();
    let bv: Vec<f64> = (0..4).map(|i| i as f64 * 10.0).collect();
    let on = |d: Device| {
        let a = Tensor::from_f64(&av, &[3, 1, 5], DType::F32, d).unwrap();
        let b = Tensor::from_f64(&bv, &[4, 1], DType::F32, d).unwrap();
        a.add(&b).unwrap().to_f64_vec().unwrap()
    };
    close(&on(dev), &on(cpu), 0.0, "broadcast add");
    // A transposed (strided) operand.
    let tr = |d: Device| {
        let a = Tensor::from_f64(&av, &[3, 5], DType::F32, d).unwrap();
        let t = a.transpose(0, 1).unwrap();
        let u = Tensor::from_f64(&av, &[5, 3], DType::F32, d).unwrap();
        t.add(&u).unwrap().to_f64_vec().unwrap()
    };
    close(&tr(dev), &tr(cpu), 0.0, "transposed add");
    // In place, then captured and replayed twice.
    let x = Tensor::from_f64(&av, &[15], DType::F32, dev).unwrap();
    let y = Tensor::from_f64(&av, &[15], DType::F32, dev).unwrap();
    let plan =
        unirt::ops::elementwise::binary(unirt::ops::BinaryOp::Add, &x.desc(), &y.desc()).unwrap();
    let rt = unirt::Runtime::get(dev).unwrap();
    let s = rt.backend().stream_create().unwrap();
    rt.backend().synchronize().unwrap();
    rt.begin_capture(s, CaptureMode::Global).unwrap();
    let launched = plan.launch(&[&x, &y], &[&x], None, s);
    let graph = rt.end_capture().unwrap();
    launched.unwrap();
    let exec = graph.instantiate().unwrap();
    exec.launch(s).unwrap();
    exec.launch(s).unwrap();
    rt.backend().stream_synchronize(s).unwrap();
    let want: Vec<f64> = av.iter().map(|v| 3.0 * v).collect();
    close(
        &x.to_f64_vec().unwrap(),
        &want,
        0.0,
        "in place, replayed twice",
    );
    drop(exec);
    drop(graph);
    rt.backend().stream_destroy(s).unwrap();
}

/// The device-fault path of the CUDA backend end to end on the fake driver, which runs a CPU
/// twin of the f32 embedding kernels (claiming the plan's fault word as the CUDA kernel does):
/// the conformance cases that gather and that expect IndexOutOfRange, a captured launch whose
/// every replay reports at its stream's synchronisation, a good launch after a bad one running
/// clean, and a stream destroyed before it synchronised reporting at the device's.
fn embedding_faults_end_to_end(dev: Device) {
    use unirt::hal::CaptureMode;
    use unirt::Backend;
    for name in [
        "ops::embedding::f32::gather",
        "ops::embedding::f32::bad_input",
    ] {
        let case = unirt_conformance::cases()
            .into_iter()
            .find(|c| c.name == name)
            .unwrap();
        let r = unirt_conformance::run_case(&case, dev);
        assert_eq!(
            r.status,
            unirt_conformance::Status::Passed,
            "{name}: {:?}",
            r.message
        );
    }
    let table: Vec<f64> = (0..40).map(|i| i as f64 * 0.25).collect();
    let table = Tensor::from_f64(&table, &[10, 4], DType::F32, dev).unwrap();
    let ids = |v: &[f64]| Tensor::from_f64(v, &[2], DType::I64, dev).unwrap();
    let (good, bad) = (ids(&[1.0, 9.0]), ids(&[1.0, -5.0]));
    let out = Tensor::zeros(&[2, 4], DType::F32, dev).unwrap();
    let plan = unirt::ops::embedding::embedding(&good.desc(), &table.desc()).unwrap();
    let rt = unirt::Runtime::get(dev).unwrap();
    let be = rt.backend();
    let s = be.stream_create().unwrap();
    be.synchronize().unwrap();
    rt.begin_capture(s, CaptureMode::Global).unwrap();
    let launched = plan.launch(&[&bad, &table], &[&out], None, s);
    let graph = rt.end_capture().unwrap();
    launched.unwrap();
    let exec = graph.instantiate().unwrap();
    for replay in 0..2 {
        exec.launch(s).unwrap();
        match be.stream_synchronize(s) {
            Err(unirt::Error::IndexOutOfRange {
                index: -5,
                limit: 10,
                ..
            }) => {}
            other => panic!("replay {replay}: expected IndexOutOfRange of -5, got {other:?}"),
        }
        // Reported once: the word was cleared.
        be.stream_synchronize(s).unwrap();
    }
    // A wait that is not a synchronisation (freeing pinned memory) leaves the fault for the
    // stream's synchronisation, and frees.
    let pinned = be.malloc_host(64).unwrap();
    plan.launch(&[&bad, &table], &[&out], None, s).unwrap();
    be.free_host(pinned).unwrap();
    assert!(matches!(
        be.stream_synchronize(s),
        Err(unirt::Error::IndexOutOfRange { index: -5, .. })
    ));
    plan.launch(&[&good, &table], &[&out], None, s).unwrap();
    be.stream_synchronize(s).unwrap();
    let want: Vec<f64> = [1.0, 9.0]
        .iter()
        .flat_map(|&r| (0..4).map(move |j| (r * 4.0 + j as f64) * 0.25))
        .collect();
    close(
        &out.to_f64_vec().unwrap(),
        &want,
        0.0,
        "good ids after bad ones",
    );
    // Destroyed before it synchronised: the device-wide synchronisation reports it.
    plan.launch(&[&bad, &table], &[&out], None, s).unwrap();
    drop(exec);
    drop(graph);
    be.stream_destroy(s).unwrap();
    assert!(matches!(
        be.synchronize(),
        Err(unirt::Error::IndexOutOfRange { index: -5, .. })
    ));
    be.synchronize().unwrap();
}

fn transpose(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; x.len()];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = x[i * cols + j];
        }
    }
    t
}
