//! Tests of the wgpu backend beyond the conformance suite: ranges larger than one storage
//! binding (the windowed binding and the chunked byte kernels), interior pointers deep inside
//! a large buffer, and same-buffer copies. Each runs on every wgpu device discovery lists and
//! says so when there is none.

use crate::hal::{Backend, DevicePtr, KernelArg};
use crate::stream::BackendExt;
use crate::{discover, open, Device, DeviceKind};

/// Deterministic bytes (xorshift), as the conformance suite's `pattern`.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12_345) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

fn devices() -> Vec<Device> {
    let d: Vec<Device> = discover()
        .devices()
        .into_iter()
        .filter(|d| d.kind == DeviceKind::Wgpu)
        .collect();
    if d.is_empty() {
        eprintln!("no wgpu device on this machine: nothing to test");
    }
    d
}

/// An allocation larger than the storage-binding limit: kernels and byte-granular sets and
/// copies near its end go through windowed bindings and pieces.
#[test]
fn beyond_one_binding() {
    for dev in devices() {
        let b = open(dev).unwrap();
        let limit: u64 = b
            .info()
            .details
            .iter()
            .find(|(k, _)| k == "max_storage_buffer_binding_size")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap();
        let size = (limit + (24 << 20)) as usize;
        if size as u64 > b.info().max_allocation {
            continue;
        }
        let p = b.malloc(size).unwrap();
        let s = b.default_stream();
        // An unaligned set longer than one binding, crossing piece boundaries.
        b.memset(p, 0, size).unwrap();
        b.memset(p.offset(3), 0x5a, size - 5).unwrap();
        let head = b.read_vec(p, 8).unwrap();
        assert_eq!(head, [0, 0, 0, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a], "{dev}");
        let tail = b.read_vec(p.offset(size as u64 - 8), 8).unwrap();
        assert_eq!(tail, [0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0, 0], "{dev}");
        // A kernel on an interior pointer beyond the first binding's reach.
        let at = p.offset(limit + (8 << 20) + 4);
        b.launch(
            "fill",
            &[at.into(), KernelArg::U32(0xdead_beef), 1024u32.into()],
            s,
        )
        .unwrap();
        b.stream_synchronize(s).unwrap();
        let w = b.read_vec(at.offset(4 * 1023), 8).unwrap();
        assert_eq!(&w[..4], &0xdead_beefu32.to_le_bytes(), "{dev}");
        assert_eq!(&w[4..], &[0x5a; 4], "{dev}");
        // A phase-shifting copy longer than one piece, from another allocation.
        let n = (limit as usize) + 4097;
        let src_data = pattern(n, 7);
        let q = b.malloc(n + 8).unwrap();
        b.copy_to_device(q.offset(1), &src_data).unwrap();
        b.copy_device(p.offset(6), q.offset(1), n).unwrap();
        let got = b.read_vec(p.offset(6), n).unwrap();
        assert!(got == src_data, "{dev}: long unaligned device copy differs");
        let before = b.read_vec(p.offset(2), 4).unwrap();
        assert_eq!(
            before,
            [0, 0x5a, 0x5a, 0x5a],
            "{dev}: bytes before the copy changed"
        );
        b.free(q).unwrap();
        b.free(p).unwrap();
    }
}

/// Copies inside one allocation (overlapping both ways) behave as memmove.
#[test]
fn same_buffer_copies() {
    for dev in devices() {
        let b = open(dev).unwrap();
        let n = 10_001;
        let data = pattern(n, 3);
        let p = b.malloc(n).unwrap();
        for (dst, src, len) in [(1usize, 0usize, 5000usize), (0, 7, 4000), (4096, 1, 4097)] {
            b.copy_to_device(p, &data).unwrap();
            b.copy_device(p.offset(dst as u64), p.offset(src as u64), len)
                .unwrap();
            let mut want = data.clone();
            want.copy_within(src..src + len, dst);
            assert!(
                b.read_vec(p, n).unwrap() == want,
                "{dev}: {dst} <- {src} +{len}"
            );
        }
        b.free(p).unwrap();
    }
}

/// Addresses never alias across allocations and stay 256-byte aligned.
#[test]
fn addresses() {
    for dev in devices() {
        let b = open(dev).unwrap();
        let ptrs: Vec<DevicePtr> = (1..20).map(|i| b.malloc(i * 37).unwrap()).collect();
        for (i, p) in ptrs.iter().enumerate() {
            assert_eq!(p.0 % 256, 0, "{dev}");
            if let Some(q) = ptrs.get(i + 1) {
                assert!(q.0 >= p.0 + (i as u64 + 1) * 37, "{dev}");
            }
        }
        for p in ptrs {
            b.free(p).unwrap();
        }
    }
}

/// Kernels on interior pointers, both bound exactly at the pointer (aligned) and through an
/// element offset (unaligned to the binding alignment), with aliasing arguments.
#[test]
fn kernels_at_interior_pointers() {
    for dev in devices() {
        let b = open(dev).unwrap();
        let s = b.default_stream();
        let n = 1000u32;
        let base = b.malloc(4 * 4096).unwrap();
        let vals: Vec<f32> = (0..4096).map(|i| i as f32 * 0.25).collect();
        b.copy_to_device(base, bytemuck::cast_slice(&vals)).unwrap();
        // (a, b, out) element offsets: aligned (the kernel without immediates, `out` bound to
        // its n elements: the rest of the buffer is checked untouched), aligned with out
        // aliasing a, unaligned, and unaligned with out aliasing a.
        for (ea, eb, eo) in [
            (0u64, 1024, 2048),
            (0, 1024, 0),
            (1, 1029, 2051),
            (3, 1500, 3),
        ] {
            let mut want: Vec<f32> = b
                .read_vec(base, 4 * 4096)
                .unwrap()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let args = [
                base.offset(4 * ea).into(),
                base.offset(4 * eb).into(),
                base.offset(4 * eo).into(),
                KernelArg::U32(n),
            ];
            b.launch("add_f32", &args, s).unwrap();
            b.stream_synchronize(s).unwrap();
            let src = want.clone();
            for i in 0..n as usize {
                want[eo as usize + i] = src[ea as usize + i] + src[eb as usize + i];
            }
            let got = b.read_vec(base, 4 * 4096).unwrap();
            assert!(
                got == bytemuck::cast_slice::<f32, u8>(&want),
                "{dev}: add_f32 at element offsets ({ea}, {eb}, {eo})"
            );
        }
        b.free(base).unwrap();
    }
}

/// An operator launch on a capturing stream is recorded, not run, and runs on each replay.
#[test]
fn op_launches_are_captured_and_replayed() {
    use crate::ops::{elementwise, BinaryOp};
    use crate::tensor::{DType, Tensor};
    use crate::CaptureMode;
    for dev in devices() {
        let a = Tensor::from_slice(&[1f32, 2., 3.], &[3], dev).unwrap();
        let b = Tensor::from_slice(&[10f32, 20., 30.], &[3], dev).unwrap();
        let out = Tensor::zeros(&[3], DType::F32, dev).unwrap();
        let plan = elementwise::binary(BinaryOp::Add, &a.desc(), &b.desc()).unwrap();
        let rt = a.runtime().clone();
        let s = rt.backend().stream_create().unwrap();
        rt.begin_capture(s, CaptureMode::Global).unwrap();
        plan.launch(&[&a, &b], &[&out], None, s).unwrap();
        // In place, so each replay adds b again: replays are seen to run.
        plan.launch(&[&out, &b], &[&out], None, s).unwrap();
        let graph = rt.end_capture().unwrap();
        assert_eq!(
            out.to_vec::<f32>().unwrap(),
            [0.0; 3],
            "{dev}: ran while capturing"
        );
        let exec = graph.instantiate().unwrap();
        exec.launch(s).unwrap();
        rt.backend().stream_synchronize(s).unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap(), [21.0, 42.0, 63.0], "{dev}");
        exec.launch(s).unwrap();
        rt.backend().stream_synchronize(s).unwrap();
        assert_eq!(
            out.to_vec::<f32>().unwrap(),
            [21.0, 42.0, 63.0],
            "{dev}: replay"
        );
        drop(exec);
        rt.backend().stream_destroy(s).unwrap();
    }
}

/// An embedding launched with a bad id on a stream destroyed before it synchronised: the
/// device's next synchronisation reports it (once), as on CUDA.
#[test]
fn destroyed_streams_report_faults_at_device_synchronize() {
    use crate::tensor::{DType, Tensor};
    for dev in devices() {
        let rt = crate::Runtime::get(dev).unwrap();
        let be = rt.backend();
        let table = Tensor::from_f64(&[0.5; 12], &[4, 3], DType::F32, dev).unwrap();
        let ids = Tensor::from_f64(&[1.0, 7.0], &[2], DType::I32, dev).unwrap();
        let out = Tensor::zeros(&[2, 3], DType::F32, dev).unwrap();
        let plan = crate::ops::embedding::embedding(&ids.desc(), &table.desc()).unwrap();
        be.synchronize().unwrap();
        let s = be.stream_create().unwrap();
        plan.launch(&[&ids, &table], &[&out], None, s).unwrap();
        be.stream_destroy(s).unwrap();
        match be.synchronize() {
            Err(crate::Error::IndexOutOfRange {
                index: 7, limit: 4, ..
            }) => {}
            other => panic!("{dev}: expected IndexOutOfRange of 7, got {other:?}"),
        }
        be.synchronize().unwrap();
    }
}

/// An adapter with `SHADER_F16` (lavapipe has it) is opened with it, and f16 kernels are
/// generated for it with native 16-bit storage; without it (llvmpipe's GL), packed in words.
/// (Whether the subgroup reductions run is checked by the GPU-form conformance on lavapipe,
/// which has `SUBGROUP`.)
#[test]
fn f16_is_native_where_the_adapter_has_it() {
    use super::kernels::wgsl_prelude_for_test as prelude;
    use crate::vendors::AnyBackend;
    for dev in devices() {
        let rt = crate::Runtime::get(dev).unwrap();
        let AnyBackend::Wgpu(b) = &**rt.backend() else {
            unreachable!()
        };
        let native = b.has_feature(wgpu::Features::SHADER_F16);
        let src = prelude(native);
        assert_eq!(src.starts_with("enable f16;"), native, "{dev}");
        assert_eq!(src.contains("array<f16>"), native, "{dev}");
        assert_eq!(src.contains("atomic<u32>"), !native, "{dev}");
        let subgroups = b.has_feature(wgpu::Features::SUBGROUP);
        eprintln!("{dev}: native f16 {native}, subgroups {subgroups}");
    }
}
