//! `fused_elementwise`: a chain of elementwise steps in one pass over memory. Blocks of
//! [`CHAIN_BLOCK`] elements are loaded once, every step runs over the block with the same f32
//! function as its unfused kernel (and is rounded to the dtype as the unfused kernel stores
//! it), and only the last step is stored — bitwise the unfused chain, one memory pass.
//! f32 operands are read and written where they are (no block copies); a large f32 output
//! is written with non-temporal stores where its last step's unfused operator uses them.

use super::elementwise::{self as ew, Bin, Un};
use super::util::{
    floats, par_rows, simd, stream_fence, streams, write_streaming_unfenced, AlignedBlock, Float,
    Ptr, BLOCK,
};
use crate::error::{Error, Result};
use crate::ops::fused::{FusedProgram, FusedSrc, FusedStep, MAX_FUSED_INPUTS};
use crate::ops::{BinaryOp, KernelCall, KernelRegistry, Params, UnaryOp};

#[inline(always)]
fn un<O: Un>(a: &[f32], o: &mut [f32]) {
    o.iter_mut().zip(a).for_each(|(x, y)| *x = O::f(*y));
}

#[inline(always)]
fn bin<O: Bin>(a: &[f32], b: &[f32], o: &mut [f32]) {
    for ((x, y), z) in o.iter_mut().zip(a).zip(b) {
        *x = O::f(*y, *z);
    }
}

#[inline(always)]
fn bin_scalar<O: Bin>(a: &[f32], s: f32, o: &mut [f32]) {
    o.iter_mut().zip(a).for_each(|(x, y)| *x = O::f(*y, s));
}

/// What is done with an operator's kernel type (its f32 function, its `STREAM`): with
/// [`with_unary`] and [`with_binary`], the one place that maps each `UnaryOp` and `BinaryOp`
/// to `elementwise`'s types.
trait OnUn {
    type Out;
    fn on<O: Un>(self) -> Self::Out;
}

/// As [`OnUn`], for binary operators.
trait OnBin {
    type Out;
    fn on<O: Bin>(self) -> Self::Out;
}

#[inline(always)]
fn with_unary<V: OnUn>(op: UnaryOp, v: V) -> V::Out {
    match op {
        UnaryOp::Neg => v.on::<ew::Neg>(),
        UnaryOp::Abs => v.on::<ew::Abs>(),
        UnaryOp::Exp => v.on::<ew::Exp>(),
        UnaryOp::Log => v.on::<ew::Log>(),
        UnaryOp::Sqrt => v.on::<ew::Sqrt>(),
        UnaryOp::Rsqrt => v.on::<ew::Rsqrt>(),
        UnaryOp::Sin => v.on::<ew::Sin>(),
        UnaryOp::Cos => v.on::<ew::Cos>(),
        UnaryOp::Tanh => v.on::<ew::Tanh>(),
        UnaryOp::Sigmoid => v.on::<ew::Sigmoid>(),
        UnaryOp::Relu => v.on::<ew::Relu>(),
        UnaryOp::Gelu => v.on::<ew::Gelu>(),
        UnaryOp::GeluTanh => v.on::<ew::GeluTanh>(),
        UnaryOp::Silu => v.on::<ew::Silu>(),
    }
}

#[inline(always)]
fn with_binary<V: OnBin>(op: BinaryOp, v: V) -> V::Out {
    match op {
        BinaryOp::Add => v.on::<ew::Add>(),
        BinaryOp::Sub => v.on::<ew::Sub>(),
        BinaryOp::Mul => v.on::<ew::Mul>(),
        BinaryOp::Div => v.on::<ew::Div>(),
        BinaryOp::Maximum => v.on::<ew::Maximum>(),
        BinaryOp::Minimum => v.on::<ew::Minimum>(),
        BinaryOp::Pow => v.on::<ew::Pow>(),
    }
}

/// `o = f(a)`.
struct Unary<'a>(&'a [f32], &'a mut [f32]);

impl OnUn for Unary<'_> {
    type Out = ();
    #[inline(always)]
    fn on<O: Un>(self) {
        un::<O>(self.0, self.1)
    }
}

/// `o = f(a, b)`.
struct Binary<'a>(&'a [f32], &'a [f32], &'a mut [f32]);

impl OnBin for Binary<'_> {
    type Out = ();
    #[inline(always)]
    fn on<O: Bin>(self) {
        bin::<O>(self.0, self.1, self.2)
    }
}

/// `o = f(a, s)` (the `*_scalar` operators).
struct Scalar<'a>(&'a [f32], f32, &'a mut [f32]);

impl OnBin for Scalar<'_> {
    type Out = ();
    #[inline(always)]
    fn on<O: Bin>(self) {
        bin_scalar::<O>(self.0, self.1, self.2)
    }
}

/// Whether the operator's unfused kernel writes large outputs with non-temporal stores.
struct Streams;

impl OnUn for Streams {
    type Out = bool;
    fn on<O: Un>(self) -> bool {
        O::STREAM
    }
}

impl OnBin for Streams {
    type Out = bool;
    fn on<O: Bin>(self) -> bool {
        O::STREAM
    }
}

/// Elements per block of a fused chain: every step makes a pass over the block in L1. Smaller
/// than the unfused kernels' [`BLOCK`]: in cache (1 MiB) 256 and 512 ran alike, 64 and 128
/// 1.2–1.8× slower (the per-block cost of dispatching every step); over 16 MiB of f32
/// operands (4 steps, read from and written to memory) 256 ran 1.2–1.3× faster than 512.
const CHAIN_BLOCK: usize = 256;

/// [`CHAIN_BLOCK`] for a chain whose output is streamed past the cache (operands in memory):
/// the memory accesses of consecutive blocks come closer together. 4-step chain over 16 MiB,
/// blocks switched per replay in one process (line-aligned blocks): 128 ran 1.05× faster than
/// 256, 64 1.2× slower; in cache 128 ran 1.13–1.15× slower than 256, hence the two sizes.
const STREAM_CHAIN_BLOCK: usize = 128;

/// Whether a large output whose last step is `step` is written with non-temporal stores:
/// as the unfused operator of that step would write it (`Un::STREAM`, `Bin::STREAM`).
fn streams_last(step: &FusedStep) -> bool {
    match *step {
        FusedStep::Unary(op, _) => with_unary(op, Streams),
        FusedStep::Binary(op, ..) | FusedStep::Scalar(op, ..) => with_binary(op, Streams),
        FusedStep::Swiglu(..) => <ew::Swiglu as Bin>::STREAM,
    }
}

/// One step over `n` elements into `o`: its operands are the loaded inputs `srcs` and the
/// earlier steps' results `done`.
#[inline(always)]
fn run_step<const B: usize>(
    step: &FusedStep,
    srcs: &[&[f32]],
    done: &[AlignedBlock<B>],
    at: usize,
    o: &mut [f32],
) {
    let n = o.len();
    let read = |src: FusedSrc| -> &[f32] {
        match src {
            FusedSrc::Input(k) => &srcs[k][at..at + n],
            FusedSrc::Step(k) => &done[k][at..at + n],
        }
    };
    match *step {
        FusedStep::Unary(op, a) => with_unary(op, Unary(read(a), o)),
        FusedStep::Binary(op, a, b) => with_binary(op, Binary(read(a), read(b), o)),
        FusedStep::Scalar(op, a, c) => with_binary(op, Scalar(read(a), c as f32, o)),
        FusedStep::Swiglu(a, b) => bin::<ew::Swiglu>(read(a), read(b), o),
    }
}

/// Runs the program over `len` elements starting `off` elements into every operand. f32
/// operands are read and the last step written in place; other dtypes go through f32 blocks.
///
/// # Safety
/// Every input pointer and the output are valid for `off + len` contiguous elements, and the
/// output is disjoint from the inputs (the plan refuses in-place use).
#[inline(always)]
unsafe fn run_rows<T: Float, const B: usize>(
    prog: &FusedProgram,
    ins: &[Ptr<T>],
    out: Ptr<T>,
    off: usize,
    len: usize,
    bufs: &mut [AlignedBlock<B>],
    stream: bool,
) {
    let (loaded, steps) = bufs.split_at_mut(ins.len());
    let direct = T::DTYPE == crate::tensor::DType::F32;
    let last = prog.steps.len() - 1;
    let mut i = 0;
    while i < len {
        let n = B.min(len - i);
        let mut srcs: [&[f32]; MAX_FUSED_INPUTS] = [&[]; MAX_FUSED_INPUTS];
        for (k, (p, buf)) in ins.iter().zip(loaded.iter_mut()).enumerate() {
            srcs[k] = if direct {
                // SAFETY: T is f32; [off + i, off + i + n) is inside the input.
                unsafe { std::slice::from_raw_parts(p.at(off + i) as *const f32, n) }
            } else {
                // SAFETY: as above.
                let src = unsafe { std::slice::from_raw_parts(p.at(off + i), n) };
                T::load(src, &mut buf[..n]);
                &buf[..n]
            };
        }
        for (s, step) in prog.steps.iter().enumerate() {
            let (done, rest) = steps.split_at_mut(s);
            if direct && s == last {
                // SAFETY: T is f32; the output range is inside the output and disjoint from
                // every input and buffer.
                let o = unsafe { std::slice::from_raw_parts_mut(out.at(off + i) as *mut f32, n) };
                // The closure inlined by force, as in the elementwise kernels: out of line it
                // would be compiled without the SIMD tier's features.
                write_streaming_unfenced(
                    o,
                    stream,
                    #[inline(always)]
                    |at, o| run_step(step, &srcs, done, at, o),
                );
                break;
            }
            let o = &mut rest[0][..n];
            run_step(step, &srcs, done, 0, o);
            if !direct {
                // The unfused operator stores each result in the dtype.
                o.iter_mut().for_each(|x| *x = T::from_f32(*x).to_f32());
            }
        }
        if !direct {
            // SAFETY: [off + i, off + i + n) is inside the output.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.at(off + i), n) };
            T::store(&steps[last][..n], dst);
        }
        i += n;
    }
}

/// Runs `prog` over one block of `n` loaded operands (`srcs`, in f32), every step into its
/// own buffer of `steps` and rounded to T as the unfused operator stores it; the result is
/// `steps[prog.steps.len() - 1][..n]`. (The GEMM epilogue's evaluation: strided operands
/// that [`run_rows`] does not take.)
#[inline(always)]
pub(super) fn eval_block<T: Float>(
    prog: &FusedProgram,
    srcs: &[&[f32]],
    steps: &mut [AlignedBlock<BLOCK>],
    n: usize,
) {
    for (s, step) in prog.steps.iter().enumerate() {
        let (done, rest) = steps.split_at_mut(s);
        let o = &mut rest[0][..n];
        run_step(step, srcs, done, 0, o);
        if T::DTYPE != crate::tensor::DType::F32 {
            o.iter_mut().for_each(|x| *x = T::from_f32(*x).to_f32());
        }
    }
}

fn fused<T: Float>(call: &KernelCall<'_>) -> Result<()> {
    let Params::Fused(prog) = call.params else {
        return Err(Error::Internal(format!(
            "{}: unexpected parameters {:?}",
            call.op, call.params
        )));
    };
    let out = &call.outputs[0];
    if call.inputs.len() > MAX_FUSED_INPUTS || prog.steps.is_empty() {
        return Err(Error::Internal(format!("{}: unchecked program", call.op)));
    }
    let total = out.layout.numel();
    let ins: Vec<Ptr<T>> = call.inputs.iter().map(Ptr::of).collect();
    let po = Ptr::<T>::of(out);
    // f32 outputs too large to stay cached are written past the cache, as the unfused
    // operator writes them (its last step's rule): 1.2× on a 4-step chain over 16 MiB.
    let stream = T::DTYPE == crate::tensor::DType::F32
        && streams_last(&prog.steps[prog.steps.len() - 1])
        && streams(total * T::DTYPE.size());
    let nbufs = ins.len() + prog.steps.len();
    par_rows(&[total], &[[1usize; 1]], |off, len, _| {
        // On cache lines: blocks 16 or 48 bytes off one made a 4-step chain over 16 MiB
        // 1.4–1.7× slower (every full-width access split across two lines).
        if stream {
            let mut bufs = vec![AlignedBlock::<STREAM_CHAIN_BLOCK>::ZERO; nbufs];
            // SAFETY: the plan made every operand contiguous of the output's shape and the
            // launch checked their ranges; par_rows hands out disjoint element ranges.
            simd!(unsafe { run_rows(prog, &ins, po, off[0], len, &mut bufs, true) });
            stream_fence();
        } else {
            let mut bufs = vec![AlignedBlock::<CHAIN_BLOCK>::ZERO; nbufs];
            // SAFETY: as above.
            simd!(unsafe { run_rows(prog, &ins, po, off[0], len, &mut bufs, false) });
        }
    });
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, crate::ops::fused::FUSED_ELEMENTWISE, fused);
}
