//! A program that uses the CPU backend alone starts no GPU driver: opening `cpu:0` probes the
//! CPU vendor only (`discovery::vendor_report`), where it used to probe every vendor — with
//! Mesa installed, that created lavapipe's and llvmpipe's devices (their threads, shader
//! compiles: 90–100 ms and about 100 MB before the first CPU tensor operation).
//!
//! Its own test binary: which drivers a process has started is process-wide state.

/// Names of this process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|name| name.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Threads only a wgpu device starts: unirt's submitter and Mesa's rasteriser threads.
fn gpu_threads() -> Vec<String> {
    thread_names()
        .into_iter()
        .filter(|n| n.starts_with("unirt-wgpu") || n.starts_with("llvmpipe"))
        .collect()
}

#[test]
fn cpu_work_starts_no_gpu_driver() {
    use unirt::tensor::{DType, Tensor};
    let dev = unirt::Device::CPU;
    let x = Tensor::arange(0.0, 8.0, 1.0, DType::F32, dev).unwrap();
    let y = x.mul(&x).unwrap().sum(&[0], false).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [140.0]);
    assert!(
        gpu_threads().is_empty(),
        "CPU work started GPU driver threads: {:?}",
        gpu_threads()
    );
    let cpu = unirt::vendor_report(unirt::DeviceKind::Cpu).unwrap();
    assert!(cpu.available() && !cpu.devices.is_empty());

    // Whole-machine discovery probes the rest, once: the same CPU report, and where a
    // software wgpu adapter opened, its threads are there now (so the check above can fail).
    let d = unirt::discover();
    assert_eq!(
        d.backend(unirt::DeviceKind::Cpu).unwrap().devices.len(),
        cpu.devices.len()
    );
    let wgpu = d.backend(unirt::DeviceKind::Wgpu).unwrap();
    let mesa = wgpu.devices.iter().any(|i| i.name.contains("llvmpipe"));
    if mesa && wgpu.available() {
        assert!(
            !gpu_threads().is_empty(),
            "discovery opened llvmpipe, yet no driver thread is seen: {:?}",
            thread_names()
        );
    }
    // A second probe of a vendor is the cached report, not a new probe.
    let again = unirt::vendor_report(unirt::DeviceKind::Wgpu).unwrap();
    assert_eq!(again.devices.len(), wgpu.devices.len());
}
