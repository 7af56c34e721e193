//! Context, `Runtime` and `Memory` cases: the thread-local device and stream, the context's
//! copies and events, graph recording through the context, and the RAII memory handle.
//!
//! They use the process-wide runtime of the device under test (that is what the context is),
//! so they check behaviour, not exact allocator statistics; the allocator's arithmetic is
//! checked in `cases_alloc.rs` on private allocators.

use super::cases_alloc::{default_policy, roundtrip};
use super::*;
use crate::ensure;
use unirt::context;
use unirt::device::Device;

use unirt::runtime::Runtime;

/// Host bytes into a host `Memory` (through the context's host copy).
fn host_with(data: &[u8]) -> Result<unirt::Memory, Failure> {
    let m = context::allocate_host_memory(data.len())?;
    // SAFETY: `m` is a live host allocation of data.len() bytes.
    unsafe { context::memcpy_h2h(m.host_ptr(), data.as_ptr(), data.len())? };
    Ok(m)
}

/// The bytes of a host `Memory`.
fn host_bytes(m: &unirt::Memory) -> Result<Vec<u8>, Failure> {
    let mut v = vec![0u8; m.size()];
    // SAFETY: `m` is a live host allocation of m.size() bytes.
    unsafe { context::memcpy_h2h(v.as_mut_ptr(), m.host_ptr(), m.size())? };
    Ok(v)
}

fn events_and_copies(ctx: &Ctx) -> Result<(), Failure> {
    let before = context::get_device();
    context::set_device(ctx.device)?;
    let r = (|| -> Result<(), Failure> {
        let n = context::get_device_count(ctx.device.kind);
        ensure!(
            n > ctx.device.index,
            "{} devices of kind {}",
            n,
            ctx.device.kind
        );
        let rt = Runtime::get(ctx.device)?;
        ensure!(
            rt.device() == ctx.device,
            "the runtime of {} is for {}",
            ctx.device,
            rt.device()
        );
        let (e1, e2) = (
            context::create_event()?,
            context::create_event_with_flags(0x2)?,
        );
        let untimed = context::create_event_with_flags(0x1)?;
        expect_err(
            context::create_event_with_flags(0x80),
            &["bad_param"],
            "unknown event flags",
        )?;
        ensure!(
            context::query_event(e1)?,
            "a never-recorded event is not complete"
        );

        let len = 1 << 20;
        let data = pattern(len, 21);
        let pinned = context::allocate_pinned_host_memory(len)?;
        // SAFETY: `pinned` holds len bytes.
        unsafe { context::memcpy_h2h(pinned.host_ptr(), data.as_ptr(), len)? };
        let (d1, d2) = (
            context::allocate_memory(len)?,
            context::allocate_memory(len)?,
        );
        context::record_event(e1, None)?;
        // SAFETY: the pinned source lives until the stream is synchronised below.
        unsafe { context::memcpy_h2d(d1.device_ptr(), pinned.host_ptr(), len, true)? };
        context::memcpy_d2d(d2.device_ptr(), d1.device_ptr(), len, true)?;
        context::record_event(e2, None)?;
        context::record_event(untimed, None)?;
        context::synchronize_event(e2)?;
        ensure!(
            context::query_event(e2)?,
            "a synchronised event is not complete"
        );
        let ms = context::elapsed_time(e1, e2)?;
        ensure!(ms >= 0.0 && ms.is_finite(), "elapsed time {ms}");
        expect_err(
            context::elapsed_time(e1, untimed),
            &["bad_param"],
            "elapsed time of an untimed event",
        )?;
        let other = ctx.stream_create()?;
        context::stream_wait_event(Some(other), e2)?;
        context::stream_wait_event(None, e1)?;
        context::sync_stream()?;
        context::sync_device()?;
        ctx.stream_destroy(other)?;
        let back = host_with(&vec![0u8; len])?;
        // SAFETY: `back` holds len bytes.
        unsafe { context::memcpy_d2h(back.host_ptr(), d2.device_ptr(), len)? };
        same(
            &host_bytes(&back)?,
            &data,
            "h2d (pinned, async) -> d2d -> d2h through the context",
        )?;
        for e in [e1, e2, untimed] {
            context::destroy_event(e)?;
        }
        expect_err(
            context::query_event(e1),
            &["invalid_handle"],
            "query of a destroyed event",
        )?;
        Ok(())
    })();
    context::set_device(before)?;
    r
}

fn graph_recording(ctx: &Ctx) -> Result<(), Failure> {
    use unirt::ops::{self, BinaryOp};
    use unirt::tensor::{DType, Tensor};
    let before = context::get_device();
    context::set_device(ctx.device)?;
    let r = (|| -> Result<(), Failure> {
        let data: Vec<f32> = (0..1000).map(|i| (i as f32) * 0.25 - 100.0).collect();
        let a = Tensor::from_slice(&data, &[1000], ctx.device)?;
        let out = Tensor::zeros(&[1000], DType::F32, ctx.device)?;
        let add = ops::elementwise::binary(BinaryOp::Add, &a.desc(), &a.desc())?;
        ensure!(!context::is_graph_recording(), "recording before start");
        expect_err(
            context::stop_graph_recording(),
            &["not_capturing"],
            "stop without start",
        )?;
        expect_err(
            context::add_graph_operator(&add, &[&a, &a], &[&out]),
            &["not_capturing"],
            "add_graph_operator without a recording",
        )?;
        context::start_graph_recording()?;
        let recorded = (|| -> Result<(), Failure> {
            ensure!(context::is_graph_recording(), "not recording after start");
            expect_err(
                context::start_graph_recording(),
                &["capturing"],
                "a second start",
            )?;
            // An eager op (recorded, not run) and an explicit operator into the caller's
            // tensor: out = a·a + a.
            let sq = a.mul(&a)?;
            context::add_graph_operator(&add, &[&sq, &a], &[&out])?;
            Ok(())
        })();
        let graph = context::stop_graph_recording()?;
        recorded?;
        ensure!(!context::is_graph_recording(), "still recording after stop");
        ensure!(
            graph.nodes().len() == 2,
            "{} nodes recorded, not 2",
            graph.nodes().len()
        );
        ensure!(
            out.to_vec::<f32>()?.iter().all(|&v| v == 0.0),
            "recording ran an operator"
        );
        let want: Vec<f32> = data.iter().map(|&x| x * x + x).collect();
        let zeros = Tensor::zeros(&[1000], DType::F32, ctx.device)?;
        let exec = graph.instantiate()?;
        out.copy_from(&zeros)?;
        exec.replay()?;
        exec.synchronize()?;
        ensure!(
            out.to_vec::<f32>()? == want,
            "the replay did not write the recorded result"
        );
        // Eager execution of the same graph gives the same bits.
        out.copy_from(&zeros)?;
        unirt::Runtime::get(ctx.device)?.run(&graph)?;
        ensure!(
            out.to_vec::<f32>()? == want,
            "Runtime::run of the recorded graph"
        );
        Ok(())
    })();
    context::set_device(before)?;
    r
}

fn context_thread_locality(ctx: &Ctx) -> Result<(), Failure> {
    use unirt::context;
    let before = context::get_device();
    context::set_device(ctx.device)?;
    let main_stream = context::get_stream()?;
    let bad = context::set_device(Device::new(ctx.device.kind, 999));
    ensure!(bad.is_err(), "setting a nonexistent device succeeded");
    ensure!(
        context::get_device() == ctx.device,
        "a failed set_device changed the device"
    );
    let device = ctx.device;
    let (first, stream, after) = std::thread::spawn(move || -> Result<_, unirt::Error> {
        let first = context::get_device();
        context::set_device(device)?;
        let s = context::get_stream()?;
        let m = context::allocate_memory(1000)?;
        let m2 = context::allocate_memory(1000)?;
        let data = pattern(1000, 11);
        let mut back = vec![0u8; 1000];
        // SAFETY: both host buffers outlive the copies (h2d is synchronous here, d2h always).
        unsafe { context::memcpy_h2d(m.device_ptr(), data.as_ptr(), 1000, false)? };
        context::memcpy_d2d(m2.device_ptr(), m.device_ptr(), 1000, true)?;
        // SAFETY: as above.
        unsafe { context::memcpy_d2h(back.as_mut_ptr(), m2.device_ptr(), 1000)? };
        context::sync_stream()?;
        if back != data {
            return Err(unirt::Error::Internal("context copies lost data".into()));
        }
        Ok((first, s, context::get_device()))
    })
    .join()
    .map_err(|_| Failure::Failed("the thread panicked".into()))??;
    ensure!(
        first == Device::CPU,
        "a new thread started on {first}, not cpu:0"
    );
    ensure!(
        after == ctx.device,
        "set_device in a thread did not stick there"
    );
    ensure!(
        stream != main_stream,
        "two threads share one current stream"
    );
    ensure!(
        context::get_device() == ctx.device,
        "another thread changed this thread's device"
    );
    // The thread's stream died with the thread (a wgpu one a moment later, destroyed by the
    // stream reaper thread: see `thread_state`).
    let waited = std::time::Instant::now();
    let mut gone = ctx.stream_synchronize(stream);
    while gone.is_ok() && waited.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(1));
        gone = ctx.stream_synchronize(stream);
    }
    ensure!(
        gone.is_err(),
        "the stream of a finished thread is still alive"
    );
    let host = context::allocate_host_memory(64)?;
    let pinned = context::allocate_pinned_host_memory(64)?;
    ensure!(
        !host.is_pinned() && pinned.is_pinned(),
        "host / pinned flags are wrong"
    );
    context::set_device(before)?;
    Ok(())
}

fn memory_handle_raii(ctx: &Ctx) -> Result<(), Failure> {
    let rt = Runtime::standalone(ctx.backend.clone());
    // The reuse checked below is the default policy's (strict mode would quarantine the block).
    default_policy(rt.allocator().clone());
    let m = rt.allocate_memory(1000)?;
    let m2 = m.clone();
    ensure!(
        m.is_device() && m.size() == 1000 && m.device() == ctx.device,
        "{m:?}"
    );
    roundtrip(ctx, m.device_ptr(), 1000, 9)?;
    drop(m);
    ensure!(
        rt.memory_stats().allocations.current == 1,
        "the block was freed while a clone lived"
    );
    let addr = m2.device_ptr();
    drop(m2);
    let st = rt.memory_stats();
    ensure!(
        st.allocations.current == 0,
        "dropping the last handle did not free: {st}"
    );
    let again = rt.allocate_memory(1000)?;
    ensure!(
        again.device_ptr() == addr,
        "the dropped block was not reused"
    );
    let pinned = rt.allocate_pinned_host_memory(100)?;
    ensure!(pinned.is_pinned() && pinned.size() == 100, "{pinned:?}");
    Ok(())
}

pub(super) const CASES: &[Case] = &[
    Case {
        name: "alloc::context_thread_locality",
        needs: &[],
        run: context_thread_locality,
    },
    Case {
        name: "alloc::memory_handle_raii",
        needs: &[],
        run: memory_handle_raii,
    },
    Case {
        name: "context::events_and_copies",
        needs: &[],
        run: events_and_copies,
    },
    Case {
        name: "graph::context_recording",
        needs: &[Need::Capture],
        run: graph_recording,
    },
];
