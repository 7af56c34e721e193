//! What the CPU kernels share: element conversion, raw pointers that cross threads, and the
//! parallel walk over the rows of strided operands.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::ops::{KernelCall, TensorRef};
use crate::tensor::{DType, Layout};

/// A raw pointer that may be shared with rayon's workers: kernels write disjoint parts.
#[derive(Clone, Copy)]
pub(super) struct Ptr<T>(pub *mut T);

// SAFETY: a Ptr is only dereferenced inside a kernel whose ranges were checked at launch, by
// tasks that touch disjoint elements of the outputs (and only read the inputs).
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Ptr<T> {}

impl<T> Ptr<T> {
    pub fn of(t: &TensorRef) -> Self {
        Ptr(t.ptr() as usize as *mut T)
    }

    /// The pointer `n` elements further.
    ///
    /// # Safety
    /// The result must stay inside the tensor's checked range.
    pub unsafe fn at(self, n: usize) -> *mut T {
        // SAFETY: the caller's promise.
        unsafe { self.0.add(n) }
    }
}

/// A floating-point element computed in f32.
pub(super) trait Float: Copy + Send + Sync + Default + 'static {
    const DTYPE: DType;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    /// Converts a block (vectorised where the type allows).
    fn load(src: &[Self], dst: &mut [f32]);
    fn store(src: &[f32], dst: &mut [Self]);
}

impl Float for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    fn load(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn store(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src)
    }
}

impl Float for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn load(src: &[Self], dst: &mut [f32]) {
        f16_load(src, dst)
    }
    fn store(src: &[f32], dst: &mut [Self]) {
        f16_store(src, dst)
    }
}

impl Float for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn load(src: &[Self], dst: &mut [f32]) {
        bf16_load(src, dst)
    }
    fn store(src: &[f32], dst: &mut [Self]) {
        bf16_store(src, dst)
    }
}

/// f16 → f32 for a block: eight at a time with F16C's `vcvtph2ps` where the SIMD tier is on
/// (every AVX2 tier CPU has F16C; the tier requires it). The `half` crate's slice conversion
/// detects F16C per call and converts four elements per out-of-line step, which held f16
/// elementwise operators to a third of bf16's speed. The conversion is exact either way.
fn f16_load(src: &[f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd_tier() >= SimdTier::Avx2 {
        // SAFETY: the tier is Avx2 or above only on a CPU with AVX and F16C.
        unsafe { f16c::widen(src, dst) };
        return;
    }
    src.convert_to_f32_slice(dst)
}

/// f32 → f16 for a block: `vcvtps2ph` with round-to-nearest-even where the SIMD tier is on,
/// bit for bit `f16::from_f32` (which takes the same instruction on such a CPU; its software
/// form rounds the same way and keeps a NaN's high payload bits with the quiet bit set, as
/// the instruction does).
fn f16_store(src: &[f32], dst: &mut [f16]) {
    #[cfg(target_arch = "x86_64")]
    if simd_tier() >= SimdTier::Avx2 {
        // SAFETY: as in f16_load.
        unsafe { f16c::narrow(src, dst) };
        return;
    }
    dst.convert_from_f32_slice(src)
}

#[cfg(target_arch = "x86_64")]
mod f16c {
    use half::f16;
    use std::arch::x86_64::{
        __m128i, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_storeu_ps,
        _mm_loadu_si128, _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
    };

    /// # Safety
    /// The CPU has AVX and F16C.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: elements i..i + 8 are in both slices; unaligned loads and stores.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        for k in i..n {
            dst[k] = src[k].to_f32();
        }
    }

    /// # Safety
    /// The CPU has AVX and F16C.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: as in widen.
            unsafe {
                let v = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            }
            i += 8;
        }
        for k in i..n {
            dst[k] = f16::from_f32(src[k]);
        }
    }
}

/// bf16 → f32 for a block: a shift per element, in a loop the compiler vectorises (the `half`
/// crate's slice conversion converts one element at a time).
#[inline(always)]
fn bf16_widen(src: &[bf16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = bf16_bits_to_f32(s.to_bits());
    }
}

/// One bf16 (as bits) → f32: the conversion of [`bf16_widen`].
#[inline(always)]
pub(super) fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// One f32 → bf16 bits: the conversion of [`bf16_narrow`].
#[inline(always)]
pub(super) fn f32_to_bf16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let rounded = (x.wrapping_add(0x7fff + ((x >> 16) & 1))) >> 16;
    let nan = (x >> 16) | 0x40;
    let bits = if x & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    };
    bits as u16
}

/// f32 → bf16 for a block, branch-free so it vectorises, bit for bit `bf16::from_f32`: round
/// to nearest even, and a NaN keeps its payload's high bits with the quiet bit set.
#[inline(always)]
fn bf16_narrow(src: &[f32], dst: &mut [bf16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = bf16::from_bits(f32_to_bf16_bits(*s));
    }
}

/// The widest vector instruction set the CPU kernels use: detected once, capped by
/// `UNIRT_CPU_SIMD` (`avx512`, `avx2` or `none`) to reproduce a smaller CPU's code path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub(super) enum SimdTier {
    /// Baseline code, as built.
    None = 1,
    /// AVX2, FMA and F16C: 8 f32 lanes.
    Avx2 = 2,
    /// AVX-512 F/BW/DQ/VL with FMA: 16 f32 lanes.
    Avx512 = 3,
}

/// 0 until the first kernel asks; then the tier as a `SimdTier` discriminant.
static SIMD_TIER: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

fn detect_simd_tier() -> SimdTier {
    #[allow(unused_mut)]
    let mut tier = SimdTier::None;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            tier = SimdTier::Avx2;
            if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
                tier = SimdTier::Avx512;
            }
        }
    }
    let cap = match std::env::var("UNIRT_CPU_SIMD").as_deref() {
        Ok("none") => SimdTier::None,
        Ok("avx2") => SimdTier::Avx2,
        _ => SimdTier::Avx512,
    };
    tier.min(cap)
}

/// The tier [`with_simd`] compiles for on this CPU.
#[inline(always)]
pub(super) fn simd_tier() -> SimdTier {
    use std::sync::atomic::Ordering;
    match SIMD_TIER.load(Ordering::Relaxed) {
        3 => SimdTier::Avx512,
        2 => SimdTier::Avx2,
        1 => SimdTier::None,
        _ => {
            let t = detect_simd_tier();
            SIMD_TIER.store(t as u8, Ordering::Relaxed);
            t
        }
    }
}

/// Runs `f` compiled for the widest vector instructions the CPU has ([`simd_tier`]): AVX-512
/// (16-wide f32) or AVX2 with FMA (8-wide), while the build targets baseline x86-64;
/// elsewhere `f` runs as built. The check is one relaxed atomic load. Only code inlined into
/// the wrapper is compiled for its features, and LLVM does not inline a large closure on its
/// own (the kernels then ran 4-wide SSE, issue 13): call it through [`simd!`], which marks the
/// closure `#[inline(always)]`, with a body that calls `#[inline(always)]` code. The tiers
/// compute the same bits: Rust never reassociates or contracts float arithmetic (plain
/// `a * b + c` stays two roundings, so a wider vector only runs more lanes of the same
/// operations, and reductions keep the accumulators the source writes), and explicit
/// `mul_add` (as in [`exp_f32`]) is one rounding everywhere (a libm call on a CPU without
/// FMA), so results do not depend on the CPU.
#[inline(always)]
pub(super) fn with_simd<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        match simd_tier() {
            SimdTier::Avx512 => {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
                unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
                    f()
                }
                // SAFETY: simd_tier() is Avx512 only when the CPU has these features.
                return unsafe { avx512(f) };
            }
            SimdTier::Avx2 => {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
                    f()
                }
                // SAFETY: simd_tier() is Avx2 or above only when the CPU has AVX2 and FMA.
                return unsafe { avx2(f) };
            }
            SimdTier::None => {}
        }
    }
    f()
}

/// `simd!(expr)`: evaluates `expr` through [`with_simd`] in an `#[inline(always)]` closure, so
/// the expression really is compiled for the CPU's vector instructions.
macro_rules! simd {
    ($e:expr) => {
        super::util::with_simd(
            #[inline(always)]
            || $e,
        )
    };
}
pub(super) use simd;

/// [`bf16_widen`] compiled for the CPU's vector instructions.
fn bf16_load(src: &[bf16], dst: &mut [f32]) {
    simd!(bf16_widen(src, dst))
}

/// [`bf16_narrow`] compiled for the CPU's vector instructions.
fn bf16_store(src: &[f32], dst: &mut [bf16]) {
    simd!(bf16_narrow(src, dst))
}

/// Elements per block when f16/bf16 go through f32 buffers.
pub(super) const BLOCK: usize = 512;
/// Below this many elements a kernel runs on the stream's worker alone (a rayon fork costs
/// more than the work).
pub(super) const PAR_MIN: usize = 32 * 1024;

/// Registers `$f::<T>` for f32, f16 and bf16 under `$op`.
macro_rules! floats {
    ($reg:expr, $op:expr, $f:ident $(:: <$($g:ty),*>)?) => {{
        use crate::device::DeviceKind;
        use crate::ops::KernelImpl;
        use crate::tensor::DType;
        $reg.builtin($op, DeviceKind::Cpu, DType::F32, KernelImpl::Host($f::<f32 $($(, $g)*)?>));
        $reg.builtin($op, DeviceKind::Cpu, DType::F16, KernelImpl::Host($f::<half::f16 $($(, $g)*)?>));
        $reg.builtin($op, DeviceKind::Cpu, DType::BF16, KernelImpl::Host($f::<half::bf16 $($(, $g)*)?>));
    }};
}
pub(super) use floats;

/// `t`'s layout broadcast to `shape` (the plan checked that it broadcasts).
pub(super) fn bcast(t: &TensorRef, shape: &[usize]) -> Result<Layout> {
    t.layout.broadcast_to(shape)
}

/// Merges dimensions that are contiguous with each other in every operand and drops
/// dimensions of size 1, so a dense walk becomes one long row.
pub(super) fn coalesce<const N: usize>(
    shape: &[usize],
    strides: [&[usize]; N],
) -> (Vec<usize>, Vec<[usize; N]>) {
    let mut out_shape: Vec<usize> = Vec::with_capacity(shape.len());
    let mut out_strides: Vec<[usize; N]> = Vec::with_capacity(shape.len());
    for (d, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let st: [usize; N] = std::array::from_fn(|k| strides[k][d]);
        if let (Some(last_n), Some(last_st)) = (out_shape.last_mut(), out_strides.last_mut()) {
            if (0..N).all(|k| last_st[k] == st[k] * n) {
                *last_n *= n;
                *last_st = st;
                continue;
            }
        }
        out_shape.push(n);
        out_strides.push(st);
    }
    (out_shape, out_strides)
}

/// Calls `f(offsets, len, inner_strides)` for every row (run along the last dimension) of a
/// walk over `shape`, with each operand's element offset at the row's start, in parallel
/// chunks of about equal work when the walk is large. Rows may be split between tasks.
pub(super) fn par_rows<const N: usize>(
    shape: &[usize],
    strides: &[[usize; N]],
    f: impl Fn([usize; N], usize, [usize; N]) + Sync,
) {
    let nd = shape.len();
    if nd == 0 {
        f([0; N], 1, [0; N]);
        return;
    }
    let inner = shape[nd - 1];
    let inner_st = strides[nd - 1];
    let total: usize = shape.iter().product();
    if total == 0 {
        return;
    }
    let tasks = if total < PAR_MIN {
        1
    } else {
        (total / (PAR_MIN / 2)).clamp(1, rayon::current_num_threads() * 4)
    };
    let per = total.div_ceil(tasks);
    let run = |t: usize| {
        let end = ((t + 1) * per).min(total);
        let mut pos = t * per;
        while pos < end {
            let (r, c) = (pos / inner, pos % inner);
            let len = (inner - c).min(end - pos);
            let mut offs = [0usize; N];
            let mut rem = r;
            for d in (0..nd - 1).rev() {
                let i = rem % shape[d];
                rem /= shape[d];
                for k in 0..N {
                    offs[k] += i * strides[d][k];
                }
            }
            for k in 0..N {
                offs[k] += c * inner_st[k];
            }
            f(offs, len, inner_st);
            pos += len;
        }
    };
    if tasks == 1 {
        run(0);
    } else {
        fork_tasks(tasks, &run);
    }
}

/// One fork of [`fork_tasks`]: its tasks, claimed from one counter by the forking thread, by
/// rayon helpers and by threads waiting for CPU work ([`help_open_forks`]).
struct Fork {
    next: std::sync::atomic::AtomicUsize,
    done: std::sync::atomic::AtomicUsize,
    // The first panic of a task, re-raised on the caller as it was.
    panic: std::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>,
    tasks: usize,
    // The caller's `run`, its lifetime erased: called only for a claimed task, and the caller
    // returns only once every claimed task is done (see `fork_tasks`).
    run: *const (dyn Fn(usize) + Sync),
    // Unparked when the last task is done.
    caller: std::thread::Thread,
}

// SAFETY: `run` is Sync and only called while the caller waits (see `fork_tasks`).
unsafe impl Send for Fork {}
// SAFETY: as above.
unsafe impl Sync for Fork {}

impl Fork {
    /// Claims and runs tasks until none is left; whether it ran any.
    fn work(&self) -> bool {
        use std::sync::atomic::Ordering;
        let mut ran = false;
        loop {
            let t = self.next.fetch_add(1, Ordering::AcqRel);
            if t >= self.tasks {
                return ran;
            }
            ran = true;
            // SAFETY: task t is claimed, so the caller is still waiting for it: `run` lives.
            let f = unsafe { &*self.run };
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(t))) {
                if let Ok(mut first) = self.panic.lock() {
                    first.get_or_insert(p);
                }
            }
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.tasks {
                self.caller.unpark();
            }
        }
    }

    fn open(&self) -> bool {
        self.next.load(std::sync::atomic::Ordering::Acquire) < self.tasks
    }
}

/// Forks whose tasks are not all claimed yet.
static OPEN_FORKS: parking_lot::Mutex<Vec<std::sync::Arc<Fork>>> =
    parking_lot::Mutex::new(Vec::new());
/// How many forks [`OPEN_FORKS`] lists (read without the lock).
static OPEN_FORK_COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Runs unclaimed tasks of CPU kernels' forks in flight on the calling thread; whether it ran
/// any. A thread waiting for a CPU stream calls it instead of sleeping: it is a free core
/// already awake, where a rayon helper may take tens of microseconds to wake on a virtual
/// machine, and having helped it is awake when the work ends (no wake-up of its own either).
/// Tasks are pure computations on memory their launch holds, safe on any thread with a roomy
/// stack ([`roomy_stack`], which the waiter checks before it calls this).
pub(crate) fn help_open_forks() -> bool {
    use std::sync::atomic::Ordering;
    if OPEN_FORK_COUNT.load(Ordering::SeqCst) == 0 {
        return false;
    }
    let fork = OPEN_FORKS.lock().iter().find(|f| f.open()).cloned();
    fork.is_some_and(|f| f.work())
}

/// Stack a waiting thread must have left to run kernel tasks: half of what rayon's threads,
/// which run them otherwise, are given.
const HELP_STACK: usize = 1 << 20;

/// Whether the calling thread has [`HELP_STACK`] of stack left below where it waits (looked up
/// once per thread). A C program may wait on a thread it made with a small stack; such a
/// thread just sleeps, as before.
pub(crate) fn roomy_stack() -> bool {
    thread_local! {
        static ROOMY: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    }
    ROOMY.with(|c| match c.get() {
        Some(r) => r,
        None => {
            let r = stack_left().is_some_and(|left| left >= HELP_STACK);
            c.set(Some(r));
            r
        }
    })
}

/// Bytes of stack below the caller's frame, where the OS says.
#[cfg(target_os = "linux")]
fn stack_left() -> Option<usize> {
    let mut attr = std::mem::MaybeUninit::<libc::pthread_attr_t>::uninit();
    // SAFETY: pthread_getattr_np initialises `attr` for the calling thread when it returns 0,
    // and only then is it read and destroyed.
    unsafe {
        if libc::pthread_getattr_np(libc::pthread_self(), attr.as_mut_ptr()) != 0 {
            return None;
        }
        let mut low: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let got = libc::pthread_attr_getstack(attr.as_ptr(), &mut low, &mut size);
        libc::pthread_attr_destroy(attr.as_mut_ptr());
        if got != 0 {
            return None;
        }
        let here = &size as *const libc::size_t as usize;
        here.checked_sub(low as usize)
    }
}

#[cfg(not(target_os = "linux"))]
fn stack_left() -> Option<usize> {
    None
}

/// Runs `run(t)` for every `t < tasks`, the calling thread taking tasks itself while up to
/// one fewer than rayon's threads help (claiming tasks from one counter), and so do threads
/// waiting for CPU work meanwhile ([`help_open_forks`]). A fork from the stream's worker (not
/// a rayon thread) through rayon's own calls would block the worker and wait for pool threads
/// to wake, which on a virtual machine takes tens of microseconds: here the caller starts at
/// once, and a helper that wakes late finds the tasks taken. Every task has run when it
/// returns; a task that panics is re-raised here.
pub(super) fn fork_tasks(tasks: usize, run: &(dyn Fn(usize) + Sync)) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    if tasks <= 1 {
        (0..tasks).for_each(run);
        return;
    }
    let _busy = crate::progress::AllCoresBusy::enter();
    // SAFETY: only the lifetime is erased; the wait below outlives every use.
    let run: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(run) };
    let fork = Arc::new(Fork {
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panic: std::sync::Mutex::new(None),
        tasks,
        run,
        caller: std::thread::current(),
    });
    // Published before the spinning waiters are counted (both SeqCst): a waiter that stops
    // spinning after the count was read looks once more and finds this fork
    // (`progress::spin_until`).
    {
        let mut open = OPEN_FORKS.lock();
        open.push(fork.clone());
        OPEN_FORK_COUNT.store(open.len(), Ordering::SeqCst);
    }
    // Threads spinning on a wait help at once; rayon's threads are asked for the rest of
    // the cores (one thread per core: more would only take turns on them).
    let helpers = rayon::current_num_threads()
        .saturating_sub(1 + crate::progress::spinning_waiters())
        .min(tasks - 1);
    for _ in 0..helpers {
        let f = fork.clone();
        rayon::spawn(move || {
            f.work();
        });
    }
    fork.work();
    // Every task is claimed now: no new helper needs to find this fork.
    {
        let mut open = OPEN_FORKS.lock();
        open.retain(|f| !Arc::ptr_eq(f, &fork));
        OPEN_FORK_COUNT.store(open.len(), Ordering::Release);
    }
    // Wait for the tasks others run (busy for a few microseconds, the usual case, then
    // parked: with more threads than cores, a spinning caller would hold a core its helper
    // waits for). A helper claiming later finds none left and never calls `run`.
    let finished = || fork.done.load(Ordering::Acquire) >= tasks;
    let start = std::time::Instant::now();
    while !finished() {
        if start.elapsed() < std::time::Duration::from_micros(20) {
            std::hint::spin_loop();
        } else {
            std::thread::park_timeout(std::time::Duration::from_millis(1));
        }
    }
    // A task's panic (a kernel bug) continues on the caller, as rayon's own forks did; the
    // stream's worker turns it into the launch's error.
    let first = fork.panic.lock().ok().and_then(|mut p| p.take());
    if let Some(p) = first {
        std::panic::resume_unwind(p);
    }
}

/// The scalar parameter of a plan, or an internal error (the plan always sets it).
pub(super) fn scalar_param(call: &KernelCall<'_>) -> Result<f64> {
    match call.params {
        crate::ops::Params::Scalar(s) => Ok(*s),
        p => Err(Error::Internal(format!(
            "{}: unexpected parameters {p:?}",
            call.op
        ))),
    }
}

/// Offsets (in elements, from the view's first element) of every index of `shape` with
/// `strides`, in row-major order: the small gathers of reductions over several axes.
pub(super) fn offsets(shape: &[usize], strides: &[usize]) -> Vec<usize> {
    let mut out = vec![0usize];
    for (&n, &s) in shape.iter().zip(strides) {
        let prev = std::mem::take(&mut out);
        out.reserve(prev.len() * n);
        for p in prev {
            for i in 0..n {
                out.push(p + i * s);
            }
        }
    }
    out
}

/// Splits `0..n` into ranges run in parallel (one task when `n · work_per_item` is small),
/// so each task can reuse its buffers across items.
pub(super) fn par_chunks(
    n: usize,
    work_per_item: usize,
    f: impl Fn(std::ops::Range<usize>) + Sync + Send,
) {
    let work = n.saturating_mul(work_per_item.max(1));
    if n < 2 || work < PAR_MIN {
        f(0..n);
        return;
    }
    let tasks = (work / (PAR_MIN / 2))
        .clamp(1, rayon::current_num_threads() * 4)
        .min(n);
    let per = n.div_ceil(tasks);
    fork_tasks(tasks, &|t| f(t * per..((t + 1) * per).min(n)));
}

/// The lanes of operands along one axis: every index of the other dimensions, with the
/// element offset of the lane start in each operand (relative to its first element).
pub(super) struct Lanes<const N: usize> {
    shape: Vec<usize>,
    strides: Vec<[usize; N]>,
    /// Elements per lane.
    pub len: usize,
    /// Each operand's stride along the axis.
    pub stride: [usize; N],
}

impl<const N: usize> Lanes<N> {
    /// Lanes along `axis` of same-shaped layouts.
    pub fn new(layouts: [&Layout; N], axis: usize) -> Self {
        let shape = layouts[0].shape();
        let mut other_shape = Vec::with_capacity(shape.len());
        let mut other_strides = Vec::with_capacity(shape.len());
        for d in (0..shape.len()).filter(|&d| d != axis) {
            other_shape.push(shape[d]);
            other_strides.push(std::array::from_fn(|k| layouts[k].strides()[d]));
        }
        Lanes {
            shape: other_shape,
            strides: other_strides,
            len: shape[axis],
            stride: std::array::from_fn(|k| layouts[k].strides()[axis]),
        }
    }

    /// How many lanes.
    pub fn count(&self) -> usize {
        self.shape.iter().product()
    }

    /// The offsets of lane `i` (row-major over the other dimensions).
    pub fn offsets(&self, i: usize) -> [usize; N] {
        let mut offs = [0usize; N];
        let mut rem = i;
        for d in (0..self.shape.len()).rev() {
            let j = rem % self.shape[d];
            rem /= self.shape[d];
            for (o, s) in offs.iter_mut().zip(&self.strides[d]) {
                *o += j * s;
            }
        }
        offs
    }

    /// Lanes `range` in order, each with its offsets and those of the next lane in `range`
    /// (for [`prefetch_l2`]), every lane's offsets computed once.
    pub fn walk(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (usize, [usize; N], Option<[usize; N]>)> + '_ {
        let end = range.end;
        let mut next = (range.start < end).then(|| self.offsets(range.start));
        range.map(move |i| {
            let cur = next.unwrap_or_else(|| self.offsets(i));
            next = (i + 1 < end).then(|| self.offsets(i + 1));
            (i, cur, next)
        })
    }
}

/// Reads `dst.len()` elements at `stride` from `src` into f32s.
///
/// # Safety
/// `src` must be valid for reading those elements.
#[inline(always)]
pub(super) unsafe fn gather<T: Float>(src: *const T, stride: usize, dst: &mut [f32]) {
    if dst.is_empty() {
        // An empty tensor may have no storage at all (a null address).
    } else if stride == 1 {
        // SAFETY: the caller's promise, contiguous.
        T::load(unsafe { std::slice::from_raw_parts(src, dst.len()) }, dst);
    } else {
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: the caller's promise.
            *d = unsafe { *src.add(i * stride) }.to_f32();
        }
    }
}

/// Writes f32s to `dst.len()` elements at `stride`.
///
/// # Safety
/// `dst` must be valid for writing those elements.
#[inline(always)]
pub(super) unsafe fn scatter<T: Float>(src: &[f32], dst: *mut T, stride: usize) {
    if src.is_empty() {
        // Nothing to write, and possibly no storage.
    } else if stride == 1 {
        // SAFETY: the caller's promise, contiguous.
        T::store(src, unsafe {
            std::slice::from_raw_parts_mut(dst, src.len())
        });
    } else {
        for (i, s) in src.iter().enumerate() {
            // SAFETY: the caller's promise.
            unsafe { *dst.add(i * stride) = T::from_f32(*s) };
        }
    }
}

/// Dot product with 32 accumulators, so the compiler vectorises it into independent chains
/// (eight accumulators were one chain of adds per vector: a 4096-element row took its add
/// latency 512 times, a third of a 16 MiB rms_norm).
#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    let (ca, cb) = (a.chunks_exact(32), b.chunks_exact(32));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..32 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `y += alpha · x`.
#[inline(always)]
pub(super) fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (a, b) in y.iter_mut().zip(x) {
        *a += alpha * b;
    }
}

/// Reads an i32/i64 index tensor's element `i` (contiguous offset `off`) as i64.
///
/// # Safety
/// `t`'s element at `off` must be readable.
pub(super) unsafe fn read_index(t: &TensorRef, off: usize) -> i64 {
    // SAFETY: the caller's promise; the dtype picks the width.
    unsafe {
        match t.dtype {
            DType::I32 => *(t.ptr() as usize as *const i32).add(off) as i64,
            _ => *(t.ptr() as usize as *const i64).add(off),
        }
    }
}

/// `e^x` in f32, branch-free so loops over it vectorise (libm's `expf` is a call per element).
/// Cody–Waite range reduction `x = n·ln2 + r` (|r| ≤ ln2/2) and Cephes' degree-5 minimax
/// polynomial for `e^r`, both as fused multiply-adds (half the vector operations of separate
/// multiplies and adds, and one rounding each): within 2 ulp of the exact value on `[-87.3, 88]`; inputs outside are
/// clamped (`e^-87.3` ≈ 1.2e-38 stands for smaller results), NaN stays NaN.
#[inline(always)]
pub(super) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer without a call.
    const ROUND: f32 = 12_582_912.0;
    // Comparisons rather than f32::clamp, whose form LLVM does not vectorise; NaN passes
    // both and stays NaN.
    let x = if x < -87.3 { -87.3 } else { x };
    let x = if x > 88.0 { 88.0 } else { x };
    let n = x.mul_add(LOG2E, ROUND) - ROUND;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = 1.987_569_1e-4_f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let y = (p * r).mul_add(r, r) + 1.0;
    // 2^n from n's bits: (n + 1.5·2^23) holds n in its low mantissa bits (two's complement
    // for negative n), so integer arithmetic on the bits builds the exponent. A float→int
    // cast would be a saturating conversion, which x86 cannot vectorise.
    let k = (n + ROUND).to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(k.wrapping_add(127) << 23);
    y * scale
}

/// erf in f32, branch-free so loops over it vectorise (libm's `erff` is a call per element,
/// about 60 cycles). Two polynomials fitted for this function (Chebyshev least squares,
/// evaluated with fused multiply-adds): `erf(x) = x·P(x²)` for |x| < 2 and
/// `erf(x) = ±(1 − Q(|x|)·e^(−x²))` for 2 ≤ |x| < 4 (from 3.92 on, erf is 1 in f32); both
/// are computed and one is selected. Within 5·10⁻⁷ (relative) of the exact value; NaN stays
/// NaN, ±∞ gives ±1.
#[inline(always)]
#[allow(clippy::approx_constant)] // P[0] is the fit's own, not 2/√π (which doubles the error)
pub(super) fn erf_f32(x: f32) -> f32 {
    const P: [f32; 10] = [
        1.128_379_1,
        -3.761_261_7e-1,
        1.128_359_7e-1,
        -2.685_947_9e-2,
        5.212_269_3e-3,
        -8.429_45e-4,
        1.130_692_5e-4,
        -1.190_833_5e-5,
        8.590_942_6e-7,
        -3.080_165_5e-8,
    ];
    const Q: [f32; 7] = [
        8.602_373e-1,
        -6.845_696e-1,
        3.332_302_6e-1,
        -1.022_346_5e-1,
        1.930_493_9e-2,
        -2.051_164_9e-3,
        9.392_178_6e-5,
    ];
    let a = x.abs();
    let u = x * x;
    let mut p = P[9];
    for &c in P[..9].iter().rev() {
        p = p.mul_add(u, c);
    }
    let near = x * p;
    // Comparisons rather than f32::min, whose form LLVM does not vectorise; NaN passes.
    let t = if a > 4.0 { 4.0 } else { a };
    let mut q = Q[6];
    for &c in Q[..6].iter().rev() {
        q = q.mul_add(t, c);
    }
    let far = (1.0 - q * exp_f32(-(t * t))).copysign(x);
    if a < 2.0 {
        near
    } else {
        far
    }
}

/// `1 / (1 + e^-x)`, vectorisable.
#[inline(always)]
pub(super) fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

/// Asks the CPU to bring the cache line holding `p` into its L2 cache ahead of use: a row
/// kernel that reads its row from memory once and then computes on it in L1 prefetches the
/// next row meanwhile, so memory and arithmetic overlap. No effect on results; any address
/// may be given (a prefetch never faults).
#[inline(always)]
pub(super) fn prefetch_l2(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch hint reads nothing architecturally and never faults, whatever the
    // address; SSE (which has it) is part of baseline x86-64.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        _mm_prefetch::<_MM_HINT_T1>(p as *const i8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Whether an output of `bytes` is written with non-temporal stores ([`write_streaming`]):
/// when it is at least 3/4 of the last-level cache's share per thread (glibc's threshold
/// for non-temporal `memcpy`, at least 4 MiB), so it would not stay cached for the next
/// operator anyway, and a normal store first reads each line it writes. Smaller outputs
/// stay in cache for whoever reads them next.
pub(super) fn streams(bytes: usize) -> bool {
    static THRESHOLD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    bytes
        >= *THRESHOLD.get_or_init(|| {
            let l3 = last_level_cache().unwrap_or(32 << 20);
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            (l3 / threads / 4 * 3).max(4 << 20)
        })
}

/// The size of the L3 cache the first CPU sits behind, from sysfs ("32768K"), as `lscpu`
/// reads it. (A virtual machine's `sysconf` may report the whole host socket's L3.)
fn last_level_cache() -> Option<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size").ok()?;
    let text = text.trim();
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit())?);
    let n: usize = digits.parse().ok()?;
    match unit {
        "K" => Some(n << 10),
        "M" => Some(n << 20),
        _ => None,
    }
}

/// Writes `out` through `compute(start, dst)`, which fills `dst` with the elements from
/// `start` on. With `stream`, the 64-byte-aligned middle is computed 64 elements at a time
/// into a buffer in L1 and written with non-temporal stores, which skip the read of each output
/// line a normal store makes first (1.3–1.5× on a memory-bound 16–64 MiB add here). The
/// values are the same either way; only where they are stored from differs.
#[inline(always)]
pub(super) fn write_streaming(out: &mut [f32], stream: bool, compute: impl Fn(usize, &mut [f32])) {
    #[cfg(target_arch = "x86_64")]
    if stream {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_sfence, _mm_stream_ps};
        let n = out.len();
        let head = out.as_ptr().align_offset(64).min(n);
        compute(0, &mut out[..head]);
        let mut i = head;
        // Four lines per step: a 64-element loop the compiler vectorises like any other.
        while i + 64 <= n {
            let mut r = [0f32; 64];
            compute(i, &mut r);
            // SAFETY: out[i..i + 64] is in bounds and 64-byte aligned (i ≥ head keeps the
            // alignment in steps of 16 f32s); SSE is baseline x86-64. Each run of four
            // 16-byte streaming stores fills one whole line, which the CPU then writes
            // without reading it.
            unsafe {
                let p = out.as_mut_ptr().add(i);
                for q in (0..64).step_by(4) {
                    _mm_stream_ps(p.add(q), _mm_loadu_ps(r.as_ptr().add(q)));
                }
            }
            i += 64;
        }
        compute(i, &mut out[i..]);
        // SAFETY: a store fence, baseline x86-64: the streaming stores are ordered before
        // whatever tells another thread that the output is ready.
        unsafe { _mm_sfence() };
        return;
    }
    let _ = stream;
    compute(0, out);
}

/// Sum with eight accumulators (vectorisable).
#[inline(always)]
pub(super) fn sum_f32(v: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let c = v.chunks_exact(8);
    let rest: f32 = c.remainder().iter().sum();
    for x in c {
        for l in 0..8 {
            acc[l] += x[l];
        }
    }
    acc.iter().sum::<f32>() + rest
}

/// Maximum with sixteen lanes (vectorisable); NaN if any element is NaN. The NaN test is
/// kept per lane too: one flag for the whole run made every step reduce its lanes to a bool
/// (a third of a 16 MiB softmax went to this pass).
#[inline(always)]
pub(super) fn max_f32(v: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut nan = [0u32; 16];
    let c = v.chunks_exact(16);
    let rest = c.remainder();
    for x in c {
        for l in 0..16 {
            nan[l] |= u32::from(x[l].is_nan());
            acc[l] = if x[l] > acc[l] { x[l] } else { acc[l] };
        }
    }
    let mut any_nan = nan.iter().any(|&n| n != 0);
    let mut m = f32::NEG_INFINITY;
    for &x in acc.iter().chain(rest) {
        any_nan |= x.is_nan();
        m = if x > m { x } else { m };
    }
    if any_nan {
        f32::NAN
    } else {
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every task runs once, with helpers or without, nested forks finish (a task's own fork
    /// runs its tasks itself when no helper is free), and a task's panic reaches the caller.
    #[test]
    fn fork_tasks_runs_each_task_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        for tasks in [0, 1, 2, 3, 17, 64] {
            let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            fork_tasks(tasks, &|t| {
                counts[t].fetch_add(1, Ordering::SeqCst);
            });
            assert!(
                counts.iter().all(|c| c.load(Ordering::SeqCst) == 1),
                "{tasks}"
            );
        }
        let inner = AtomicUsize::new(0);
        fork_tasks(8, &|_| {
            fork_tasks(8, &|_| {
                inner.fetch_add(1, Ordering::SeqCst);
            })
        });
        assert_eq!(inner.load(Ordering::SeqCst), 64);
        let caught = std::panic::catch_unwind(|| {
            fork_tasks(4, &|t| {
                if t == 3 {
                    panic!("task 3");
                }
            })
        });
        assert!(caught.is_err());
    }

    /// A thread with a small stack (a C program's, say) never runs kernel tasks while it
    /// waits; one with a roomy stack does (where the OS reports stacks).
    #[test]
    fn only_roomy_stacks_help() {
        let on = |bytes| {
            std::thread::Builder::new()
                .stack_size(bytes)
                .spawn(roomy_stack)
                .expect("spawn")
                .join()
                .expect("join")
        };
        assert!(!on(256 << 10));
        if cfg!(target_os = "linux") {
            assert!(on(8 << 20));
        }
    }

    /// Threads waiting in `spin_until` take tasks of open forks: with four waiters helping
    /// forks of 64 slow-ish tasks, every task still runs exactly once, and a task's panic is
    /// still re-raised on the forking thread (never on a helper).
    #[test]
    fn waiters_help_forks_and_each_task_runs_once() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let stop = AtomicBool::new(false);
        let helped_by_others = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..4 {
                sc.spawn(|| {
                    while !stop.load(Ordering::SeqCst) {
                        crate::progress::spin_until(|| stop.load(Ordering::SeqCst));
                    }
                });
            }
            let me = std::thread::current().id();
            for round in 0..20 {
                let counts: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
                fork_tasks(64, &|t| {
                    if std::thread::current().id() != me {
                        helped_by_others.fetch_add(1, Ordering::SeqCst);
                    }
                    std::hint::black_box((0..2000u64).sum::<u64>());
                    counts[t].fetch_add(1, Ordering::SeqCst);
                });
                assert!(
                    counts.iter().all(|c| c.load(Ordering::SeqCst) == 1),
                    "round {round}"
                );
            }
            let caught = std::panic::catch_unwind(|| {
                fork_tasks(16, &|t| {
                    if t == 9 {
                        panic!("task 9");
                    }
                })
            });
            assert!(caught.is_err());
            stop.store(true, Ordering::SeqCst);
        });
        // Not asserted (scheduling decides), only shown: how much the others took.
        eprintln!(
            "tasks run by other threads: {}",
            helped_by_others.load(Ordering::SeqCst)
        );
    }

    /// The block conversions of f16 (F16C where the tier is on) against `half`'s software
    /// conversions (`*_const`, which never take the instruction): every f16 widened, and f32s
    /// narrowed across every exponent with halfway cases, subnormals, infinities and NaN
    /// payloads. Odd lengths cover the scalar tails.
    #[test]
    fn f16_blocks_match_software() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut wide = vec![0f32; all.len()];
        f16_load(&all, &mut wide);
        for (h, w) in all.iter().zip(&wide) {
            let want = f16::to_f32_const(*h);
            assert!(
                want.to_bits() == w.to_bits() || (want.is_nan() && w.is_nan()),
                "{:#06x}: {w} against {want}",
                h.to_bits()
            );
        }
        let mut rng = crate::tensor::SplitMix64::new(0x5eed);
        let mut src: Vec<f32> = (0..200_003)
            .map(|i| match i % 4 {
                // Any bit pattern: NaNs with payloads, infinities, subnormals.
                0 => f32::from_bits(rng.next_u64() as u32),
                // Exactly halfway between two f16s, and one ulp either side.
                1 => {
                    let h = (rng.next_u64() as u16) & 0x7bff;
                    let mid = f16::from_bits(h).to_f32_const().to_bits() + (1 << 12);
                    f32::from_bits(
                        mid.wrapping_add((rng.next_u64() % 3) as u32)
                            .wrapping_sub(1),
                    )
                }
                _ => (rng.next_u64() as i32 as f32) * 2f32.powi((rng.next_u64() % 60) as i32 - 50),
            })
            .collect();
        src.extend([
            0.0,
            -0.0,
            65504.0,
            65520.0,
            6e-8,
            3e-8,
            f32::INFINITY,
            f32::NAN,
        ]);
        let mut narrow = vec![f16::ZERO; src.len()];
        f16_store(&src, &mut narrow);
        for (x, h) in src.iter().zip(&narrow) {
            let want = f16::from_f32_const(*x);
            assert_eq!(h.to_bits(), want.to_bits(), "{x:e} ({:#010x})", x.to_bits());
        }
    }

    /// erf_f32 against f64 erf on a fine grid of [−6, 6], and at the special values.
    #[test]
    fn erf_within_tolerance() {
        let mut worst = 0f64;
        for i in -600_000..=600_000 {
            let x = i as f32 * 1e-5;
            let want = libm::erf(x as f64);
            let err = (erf_f32(x) as f64 - want).abs() / want.abs().max(1e-30);
            worst = worst.max(if x == 0.0 {
                erf_f32(x).abs() as f64
            } else {
                err
            });
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert!(erf_f32(f32::NAN).is_nan());
        assert_eq!(erf_f32(-0.0).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn exp_within_two_ulp() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp_f32(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
            x += 0.013;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(-1000.0), exp_f32(-87.3));
        assert!(max_f32(&[1.0, f32::NAN, 3.0]).is_nan());
        assert_eq!(
            max_f32(&[1.0, 9.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 2.0, -1.0]),
            9.0
        );
        // A NaN or the maximum anywhere, in the 16-lane body or the tail.
        for len in [1, 15, 16, 17, 40, 100] {
            for at in 0..len {
                let mut v: Vec<f32> = (0..len).map(|i| (i as f32 * 0.7).sin()).collect();
                v[at] = 5.0;
                assert_eq!(max_f32(&v), 5.0, "{len} {at}");
                v[at] = f32::NAN;
                assert!(max_f32(&v).is_nan(), "{len} {at}");
            }
        }
    }
}

#[cfg(test)]
mod bf16_tests {
    use super::*;

    /// Streaming stores write what plain stores write, for every alignment of the output
    /// and lengths around the 64-element steps.
    #[test]
    fn write_streaming_matches_plain_writes() {
        let src: Vec<f32> = (0..700).map(|i| i as f32 * 0.37 - 11.0).collect();
        let f = |s: usize, d: &mut [f32]| {
            for (x, y) in d.iter_mut().zip(&src[s..]) {
                *x = y * 2.0 + 1.0;
            }
        };
        for skew in 0..17 {
            for len in [0, 1, 15, 63, 64, 65, 127, 128, 129, 500, 640] {
                let mut a = vec![-1f32; len + skew + 16];
                let mut b = a.clone();
                write_streaming(&mut a[skew..skew + len], true, f);
                write_streaming(&mut b[skew..skew + len], false, f);
                assert_eq!(a, b, "skew {skew}, len {len}");
            }
        }
        assert!(streams(1 << 30) && !streams(1 << 20));
    }

    /// The block conversions are bit for bit `half`'s per-element ones: every 2^32 / 7919-th
    /// bit pattern (all exponents, both signs), the rounding ties around them, and the edges.
    #[test]
    fn bf16_blocks_match_half() {
        let mut bits: Vec<u32> = (0..=u32::MAX / 7919).map(|i| i * 7919).collect();
        for b in bits.clone() {
            let base = b & !0xffff;
            bits.extend([base | 0x8000, base | 0x18000, base | 0x7fff, base | 0x8001]);
        }
        bits.extend([
            0,
            0x8000_0000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0x7f80_0001,
            0xffff_ffff,
            0x7f7f_ffff,
            0x0000_0001,
            0x807f_ffff,
        ]);
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let mut got = vec![bf16::ZERO; src.len()];
        bf16_store(&src, &mut got);
        for (i, (&s, g)) in src.iter().zip(&got).enumerate() {
            assert_eq!(
                g.to_bits(),
                bf16::from_f32(s).to_bits(),
                "bits {:#x}",
                bits[i]
            );
        }
        let mut back = vec![0f32; got.len()];
        bf16_load(&got, &mut back);
        for (g, b) in got.iter().zip(&back) {
            assert_eq!(b.to_bits(), g.to_f32().to_bits());
        }
    }
}
