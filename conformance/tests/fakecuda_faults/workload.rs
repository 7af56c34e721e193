//! The workload each row of the matrix runs: every HAL entry point, what it left behind, and
//! the check that a device works.

use super::*;

/// A release to try again once the fault is cleared.
pub(crate) type Retry = Box<dyn FnOnce(&AnyBackend) -> unirt::Result<()>>;

/// What one workload run left behind.
#[derive(Default)]
pub(crate) struct Run {
    pub(crate) backend: Option<Arc<AnyBackend>>,
    /// The second device (peer copies).
    pub(crate) peer: Option<Arc<AnyBackend>>,
    pub(crate) errors: Vec<(&'static str, unirt::Error)>,
    /// Releases that failed, to retry once the fault is cleared.
    pub(crate) retry: Vec<(&'static str, Retry)>,
    /// The caching allocator the workload used (its cache is emptied again after the fault).
    pub(crate) allocator: Option<Arc<CachingAllocator>>,
}

impl Run {
    fn step<T>(&mut self, name: &'static str, r: unirt::Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.errors.push((name, e));
                None
            }
        }
    }

    fn release(
        &mut self,
        name: &'static str,
        b: &AnyBackend,
        f: impl Fn(&AnyBackend) -> unirt::Result<()> + 'static,
    ) {
        if let Err(e) = f(b) {
            self.errors.push((name, e));
            self.retry.push((name, Box::new(f)));
        }
    }
}

/// Every HAL entry point, in the order an application would use them.
pub(crate) fn workload(run: &mut Run) {
    let b = match open_private(CUDA0) {
        Ok(b) => b,
        Err(e) => {
            run.errors.push(("open", e));
            return;
        }
    };
    run.backend = Some(b.clone());
    let def = b.default_stream();
    // Opening a second device enables peer access between the two.
    let b1 = run.step("open_peer", open_private(CUDA1));
    run.peer = b1.clone();
    run.step("mem_info", b.mem_info());
    let s = run.step("stream_create", b.stream_create());
    let st = s.unwrap_or(def);
    let e1 = run.step("event_create", b.event_create(EventFlags::DEFAULT));
    let e2 = run.step("event_create", b.event_create(EventFlags::DEFAULT));
    let a = run.step("malloc", b.malloc(N));
    let c = run.step("malloc", b.malloc(N));
    let h = run.step("malloc_host", b.malloc_host(N));
    let host = vec![1u8; N];
    let mut out = vec![0u8; N];
    if let Some(a) = a {
        // SAFETY: `host` is N readable bytes.
        let r = unsafe { b.memcpy(a.0, host.as_ptr() as u64, N, MemcpyKind::H2D) };
        run.step("memcpy_h2d", r);
    }
    if let Some(c) = c {
        run.step("memset", b.memset(c, 0, N));
    }
    if let Some(e) = e1 {
        run.step("event_record", b.event_record(e, st));
    }
    if let (Some(a), Some(c), Some(h)) = (a, c, h) {
        // SAFETY: pinned memory of N bytes from malloc_host, freed only at the end.
        let r = unsafe { b.memcpy_async(c.0, h.0, N, MemcpyKind::H2D, st) };
        run.step("memcpy_async_h2d", r);
        let n = KernelArg::U32((N / 4) as u32);
        let fill = [KernelArg::Ptr(a), KernelArg::U32(7), n];
        run.step("launch_fill", b.launch("fill", &fill, st));
        let add = [KernelArg::Ptr(a), KernelArg::Ptr(c), KernelArg::Ptr(c), n];
        run.step("launch_add", b.launch("add_f32", &add, st));
        run.step("memset_async", b.memset_async(a, 3, 64, st));
        // SAFETY: device-only copy.
        let r = unsafe { b.memcpy_async(c.0, a.0, N, MemcpyKind::D2D, st) };
        run.step("memcpy_async_d2d", r);
        // SAFETY: pinned memory, waited for below before it is freed.
        let r = unsafe { b.memcpy_async(h.0, c.0, N, MemcpyKind::D2H, st) };
        run.step("memcpy_async_d2h", r);
        // SAFETY: pinned to pinned within one allocation, non-overlapping halves.
        let r = unsafe { b.memcpy_async(h.0, h.0 + (N / 2) as u64, N / 2, MemcpyKind::H2H, st) };
        run.step("memcpy_async_h2h", r);
    }
    if let Some(e) = e2 {
        run.step("event_record", b.event_record(e, st));
        run.step("stream_wait_event", b.stream_wait_event(def, e));
        run.step("event_query", b.event_query(e));
        run.step("event_synchronize", b.event_synchronize(e));
    }
    if let (Some(x), Some(y)) = (e1, e2) {
        run.step("event_elapsed_ms", b.event_elapsed_ms(x, y));
    }
    run.step("stream_synchronize", b.stream_synchronize(st));
    if let (Some(a), Some(c)) = (a, c) {
        capture(run, &b, st, a, c, e1);
    }
    if let Some(p) = run.step("malloc_async", b.malloc_async(N, st)) {
        if let Err(e) = b.free_async(p, st) {
            run.errors.push(("free_async", e));
            run.retry.push((
                "free_async",
                Box::new(move |b| b.free_async(p, b.default_stream())),
            ));
        }
    }
    let mut peer_buf = None;
    if let (Some(a), Some(b1)) = (a, &b1) {
        if let Some(p1) = run.step("peer_malloc", b1.malloc(N)) {
            // SAFETY: device-only copy between two devices.
            let r = unsafe { b.memcpy(p1.0, a.0, N, MemcpyKind::D2D) };
            run.step("memcpy_peer", r);
            peer_buf = Some((b1.clone(), p1));
        }
    }
    if let Some(a) = a {
        // SAFETY: `out` is N writable bytes.
        let r = unsafe { b.memcpy(out.as_mut_ptr() as u64, a.0, N, MemcpyKind::D2H) };
        run.step("memcpy_d2h", r);
    }
    let ca = CachingAllocator::new(b.clone());
    if let Some(p) = run.step("caching_malloc", ca.malloc(N, def)) {
        run.step("caching_free", ca.free(p));
    }
    run.step("caching_empty_cache", ca.empty_cache());
    run.allocator = Some(ca);
    run.step("synchronize", b.synchronize());
    // Freed only now: a failed synchronous copy may still be queued on cuda:0's stream, and
    // cuda:1's free does not wait for cuda:0's work (see docs/RELIABILITY.md).
    if let Some((b1, p1)) = peer_buf {
        if let Err(e) = b1.free(p1) {
            run.errors.push(("peer_free", e));
            run.retry
                .push(("peer_free", Box::new(move |_| b1.free(p1))));
        }
    }
    for p in [a, c].into_iter().flatten() {
        run.release("free", &b, move |b| b.free(p));
    }
    if let Some(h) = h {
        run.release("free_host", &b, move |b| b.free_host(h));
    }
    for e in [e1, e2].into_iter().flatten() {
        run.release("event_destroy", &b, move |b| b.event_destroy(e));
    }
    if let Some(s) = s {
        run.release("stream_destroy", &b, move |b| b.stream_destroy(s));
    }
}

/// Capture, instantiate, replay, destroy.
pub(crate) fn capture(
    run: &mut Run,
    b: &Arc<AnyBackend>,
    st: unirt::StreamId,
    a: unirt::DevicePtr,
    c: unirt::DevicePtr,
    e: Option<unirt::EventId>,
) {
    if run
        .step("begin_capture", b.begin_capture(st, CaptureMode::Global))
        .is_none()
    {
        return;
    }
    let fill = [KernelArg::Ptr(c), KernelArg::U32(5), KernelArg::U32(16)];
    run.step("launch_in_capture", b.launch("fill", &fill, st));
    // SAFETY: device-only copy.
    let r = unsafe { b.memcpy_async(a.0, c.0, 64, MemcpyKind::D2D, st) };
    run.step("memcpy_async_in_capture", r);
    if let Some(e) = e {
        run.step("event_record_in_capture", b.event_record(e, st));
    }
    let Some(g) = run.step("end_capture", b.end_capture(st)) else {
        return;
    };
    if let Some(x) = run.step("graph_instantiate", b.graph_instantiate(g)) {
        run.step("graph_launch", b.graph_launch(x, st));
        run.step("stream_synchronize", b.stream_synchronize(st));
        run.release("graph_exec_destroy", b, move |b| b.graph_exec_destroy(x));
    }
    run.release("graph_destroy", b, move |b| b.graph_destroy(g));
}

/// A round trip and a kernel on the default stream, checked byte for byte.
pub(crate) fn verify(b: &AnyBackend) -> unirt::Result<()> {
    let data: Vec<u8> = (0..N).map(|i| (i * 7 + 1) as u8).collect();
    let p = b.malloc(N)?;
    let r = (|| {
        // SAFETY: `data` is N readable bytes.
        unsafe { b.memcpy(p.0, data.as_ptr() as u64, N, MemcpyKind::H2D)? };
        let mut back = vec![0u8; N];
        // SAFETY: `back` is N writable bytes.
        unsafe { b.memcpy(back.as_mut_ptr() as u64, p.0, N, MemcpyKind::D2H)? };
        if back != data {
            return Err(unirt::Error::Internal("round trip gave other bytes".into()));
        }
        let s = b.default_stream();
        b.launch(
            "fill",
            &[KernelArg::Ptr(p), KernelArg::U32(9), KernelArg::U32(4)],
            s,
        )?;
        b.stream_synchronize(s)?;
        // SAFETY: as above.
        unsafe { b.memcpy(back.as_mut_ptr() as u64, p.0, 16, MemcpyKind::D2H)? };
        if back[..16].chunks(4).any(|w| w != 9u32.to_le_bytes()) {
            return Err(unirt::Error::Internal("fill gave other bytes".into()));
        }
        Ok(())
    })();
    b.free(p).and(r)
}
