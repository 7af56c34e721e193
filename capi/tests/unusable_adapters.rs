//! The C ABI skips adapters that cannot be opened: with `UNIRT_WGPU_FAIL_OPEN` naming the API
//! of `wgpu:0`, a child of this test binary sees the wgpu device count drop by the refused
//! adapters, indices `0..count` usable (set, malloc, copy round trip), and `count` itself
//! `DEVICE_NOT_FOUND`-class refused.

use std::ffi::{c_int, c_void};
use std::process::Command;

use infinirt::*;

const PARENT_COUNT: &str = "UNIRT_TEST_PARENT_WGPU_COUNT";

fn wgpu_count() -> c_int {
    let mut n: c_int = -1;
    // SAFETY: `n` is a valid int to write.
    let s = unsafe { infinirtGetDeviceCount(DEVICE_UNIRT_WGPU, &mut n) };
    assert_eq!(s, SUCCESS);
    n
}

#[test]
fn device_counts_and_indices_skip_an_adapter_that_fails_to_open() {
    let d = unirt::discover();
    let wgpu = d.backend(unirt::DeviceKind::Wgpu).unwrap();
    let api = wgpu
        .devices
        .first()
        .map(|i| i.api.clone())
        .unwrap_or_else(|| "vulkan".into());
    let refused = wgpu.devices.iter().filter(|i| i.api == api).count();
    let expected = wgpu.devices.len() - refused;
    assert_eq!(wgpu_count() as usize, wgpu.devices.len());
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args(["--ignored", "--exact", "injected_child", "--nocapture"])
        .env("UNIRT_WGPU_FAIL_OPEN", &api)
        .env(PARENT_COUNT, expected.to_string())
        .output()
        .expect("the test binary runs again");
    assert!(
        out.status.success(),
        "child: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run by the test above with the injection set (ignored on its own).
#[test]
#[ignore = "run by device_counts_and_indices_skip_an_adapter_that_fails_to_open"]
fn injected_child() {
    let expected: c_int = std::env::var(PARENT_COUNT)
        .expect("started by the parent test")
        .parse()
        .unwrap();
    assert_eq!(wgpu_count(), expected);
    assert_ne!(infinirtSetDevice(DEVICE_UNIRT_WGPU, expected), SUCCESS);
    for id in 0..expected {
        assert_eq!(
            infinirtSetDevice(DEVICE_UNIRT_WGPU, id),
            SUCCESS,
            "wgpu:{id}"
        );
        let src: Vec<u8> = (0..1024u32).map(|i| (i * 13 + id as u32) as u8).collect();
        let mut back = vec![0u8; src.len()];
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is writable; the copies name `len` bytes of live host buffers and of
        // the allocation just made.
        unsafe {
            assert_eq!(infinirtMalloc(&mut p, src.len()), SUCCESS);
            assert_eq!(
                infinirtMemcpy(p, src.as_ptr().cast(), src.len(), 1),
                SUCCESS
            );
            assert_eq!(
                infinirtMemcpy(back.as_mut_ptr().cast(), p, src.len(), 2),
                SUCCESS
            );
            assert_eq!(infinirtFree(p), SUCCESS);
        }
        assert_eq!(back, src, "wgpu:{id}");
    }
}
