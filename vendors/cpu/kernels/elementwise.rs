//! Elementwise kernels: binary with broadcasting (tensor–tensor and tensor–scalar), unary,
//! swiglu, where, masked_fill. Contiguous rows of f32 run as plain slice loops the compiler
//! vectorises; f16/bf16 rows convert in blocks through f32; strided rows go element by element.

use super::util::{
    bcast, bf16_bits_to_f32, coalesce, erf_f32, exp_f32, exp_nan_unused_f32, f32_to_bf16_bits,
    floats, par_rows, scalar_param, sigmoid_f32, simd, streams, write_streaming, AlignedBlock,
    Float, Ptr, BLOCK,
};
use crate::error::Result;
use crate::ops::{KernelCall, KernelRegistry};

/// A binary function of f32s, as a type so each kernel is monomorphised.
pub(super) trait Bin: Send + Sync + 'static {
    /// Large outputs are written with non-temporal stores (`write_streaming`): true for the
    /// cheap operators, whose large outputs are memory-bound, and for swiglu (two inputs per
    /// output: 0.82–0.97× the time streamed, 16 and 64 MiB). The other transcendental ones
    /// ran 3–8 % slower streamed (silu, gelu; full-width streaming stores), so they keep
    /// plain stores.
    const STREAM: bool;
    /// Cheap enough that bf16 rows are converted element by element in one pass
    /// ([`row2`]); transcendental operators ran slower that way (measured).
    const CHEAP: bool = Self::STREAM;
    fn f(a: f32, b: f32) -> f32;
}

/// A unary function of f32s.
pub(super) trait Un: Send + Sync + 'static {
    /// As [`Bin::STREAM`]; every streaming unary operator is also cheap ([`Bin::CHEAP`]).
    const STREAM: bool;
    fn f(x: f32) -> f32;
}

macro_rules! bin {
    ($stream:literal; $($name:ident($a:ident, $b:ident) = $e:expr;)*) => {$(
        pub(super) struct $name;
        impl Bin for $name {
            const STREAM: bool = $stream;
            #[inline(always)]
            fn f($a: f32, $b: f32) -> f32 { $e }
        }
    )*};
}

macro_rules! un {
    ($stream:literal; $($name:ident($x:ident) = $e:expr;)*) => {$(
        pub(super) struct $name;
        impl Un for $name {
            const STREAM: bool = $stream;
            #[inline(always)]
            fn f($x: f32) -> f32 { $e }
        }
    )*};
}

bin! { true;
    Add(a, b) = a + b;
    Sub(a, b) = a - b;
    Mul(a, b) = a * b;
    Div(a, b) = a / b;
    Maximum(a, b) = if a.is_nan() || b.is_nan() { f32::NAN } else { a.max(b) };
    Minimum(a, b) = if a.is_nan() || b.is_nan() { f32::NAN } else { a.min(b) };
}

bin! { false;
    Pow(a, b) = a.powf(b);
}

/// `up · silu(gate)`.
pub(super) struct Swiglu;

impl Bin for Swiglu {
    const STREAM: bool = true;
    const CHEAP: bool = false;
    #[inline(always)]
    fn f(up: f32, gate: f32) -> f32 {
        // One division rather than `· sigmoid(gate)` (a division and a multiply): measured
        // on AVX-512, the division and the exponential are what bound these ops' loops.
        up * gate / (1.0 + exp_nan_unused_f32(-gate))
    }
}

/// `x · sigmoid(x)` as one division (one rounding fewer, and 6 % less time per element on
/// AVX-512 than a reciprocal and a multiply).
#[inline(always)]
pub(super) fn silu(x: f32) -> f32 {
    x / (1.0 + exp_nan_unused_f32(-x))
}

un! { true;
    Neg(x) = -x;
    Abs(x) = x.abs();
    // Not `x.max(0.0)`, which gives 0 for NaN: NaN stays NaN, as everywhere else.
    Relu(x) = if x < 0.0 { 0.0 } else { x };
}

un! { false;
    Exp(x) = exp_f32(x);
    Log(x) = x.ln();
    Sqrt(x) = x.sqrt();
    Rsqrt(x) = 1.0 / x.sqrt();
    Sin(x) = x.sin();
    Cos(x) = x.cos();
    Tanh(x) = x.tanh();
    Sigmoid(x) = sigmoid_f32(x);
    Gelu(x) = 0.5 * x * (1.0 + erf_f32(x * std::f32::consts::FRAC_1_SQRT_2));
    // 0.5·(1 + tanh(z)) = sigmoid(2z), with z = sqrt(2/pi)·(x + 0.044715·x³).
    GeluTanh(x) = x / (1.0 + exp_nan_unused_f32(-2.0 * 0.797_884_6 * (x + 0.044715 * x * x * x)));
    Silu(x) = silu(x);
}

/// `o[i] = g(a[i], b[i])` over contiguous rows of `len` words: where `o` is the very same
/// elements as `a` and/or `b`, on one slice (in place); a distinct `o` goes to
/// `distinct(out, a, b)`, which writes it its own way.
///
/// # Safety
/// The rows are valid for `len` words; `o` is disjoint from an input or the same elements.
#[inline(always)]
unsafe fn contiguous2<S: Copy>(
    o: *mut S,
    a: *const S,
    b: *const S,
    len: usize,
    g: impl Fn(S, S) -> S,
    distinct: impl FnOnce(&mut [S], &[S], &[S]),
) {
    // SAFETY: the caller's promise; overlapping slices are only made when the pointers are
    // equal, and then only one of them exists.
    unsafe {
        let out = std::slice::from_raw_parts_mut(o, len);
        if std::ptr::eq(o, a) && std::ptr::eq(a, b) {
            out.iter_mut().for_each(
                #[inline(always)]
                |x| *x = g(*x, *x),
            );
        } else if std::ptr::eq(o, a) {
            let b = std::slice::from_raw_parts(b, len);
            out.iter_mut().zip(b).for_each(
                #[inline(always)]
                |(x, y)| *x = g(*x, *y),
            );
        } else if std::ptr::eq(o, b) {
            let a = std::slice::from_raw_parts(a, len);
            out.iter_mut().zip(a).for_each(
                #[inline(always)]
                |(x, y)| *x = g(*y, *x),
            );
        } else {
            let (a, b) = (
                std::slice::from_raw_parts(a, len),
                std::slice::from_raw_parts(b, len),
            );
            distinct(out, a, b);
        }
    }
}

/// [`contiguous2`] for one input.
///
/// # Safety
/// As [`contiguous2`].
#[inline(always)]
unsafe fn contiguous1<S: Copy>(
    o: *mut S,
    a: *const S,
    len: usize,
    g: impl Fn(S) -> S,
    distinct: impl FnOnce(&mut [S], &[S]),
) {
    // SAFETY: as in contiguous2.
    unsafe {
        let out = std::slice::from_raw_parts_mut(o, len);
        if std::ptr::eq(o, a) {
            out.iter_mut().for_each(
                #[inline(always)]
                |x| *x = g(*x),
            );
        } else {
            distinct(out, std::slice::from_raw_parts(a, len));
        }
    }
}

/// One row of `o[i] = f(a[i], b[i])`; a contiguous f32 output distinct from the inputs is
/// written with non-temporal stores when `stream`, and contiguous bf16 rows of a `cheap` op
/// are converted in the same pass.
///
/// # Safety
/// `o`, `a`, `b` are valid for `len` elements at their strides; `o` is either disjoint from
/// an input or the very same elements (the plan allows only that overlap).
#[inline(always)]
unsafe fn row2<T: Float>(
    o: *mut T,
    a: *const T,
    b: *const T,
    len: usize,
    st: [usize; 3],
    (cheap, stream): (bool, bool),
    f: impl Fn(f32, f32) -> f32,
) {
    if st == [1, 1, 1] && T::DTYPE == crate::tensor::DType::F32 {
        let (o, a, b) = (o as *mut f32, a as *const f32, b as *const f32);
        // SAFETY: T is f32 (checked above); the caller's promise for the rest.
        unsafe {
            contiguous2(
                o,
                a,
                b,
                len,
                &f,
                #[inline(always)]
                |out, a, b| {
                    // Inlined by force: `write_streaming` calls it three times, and a closure
                    // LLVM leaves out of line is compiled without the SIMD tier's features —
                    // every `mul_add` of a transcendental op then becomes a call to libm's
                    // `fmaf` (silu, gelu and swiglu ran at 0.3–1.1 GB/s instead of 25–45).
                    write_streaming(
                        out,
                        stream,
                        #[inline(always)]
                        |s, d| {
                            for ((x, y), z) in d.iter_mut().zip(&a[s..]).zip(&b[s..]) {
                                *x = f(*y, *z);
                            }
                        },
                    );
                },
            )
        };
        return;
    }
    if st == [1, 1, 1] && T::DTYPE == crate::tensor::DType::BF16 && cheap {
        // Cheap ops on bf16 rows in one pass, converting element by element as the blocks
        // below do (transcendental ones ran slower this way: measured).
        let g = |x: u16, y: u16| f32_to_bf16_bits(f(bf16_bits_to_f32(x), bf16_bits_to_f32(y)));
        let (o, a, b) = (o as *mut u16, a as *const u16, b as *const u16);
        // SAFETY: T is bf16 (2-byte words); the caller's promise for the rest.
        unsafe {
            contiguous2(
                o,
                a,
                b,
                len,
                g,
                #[inline(always)]
                |out, a, b| {
                    for ((x, y), z) in out.iter_mut().zip(a).zip(b) {
                        *x = g(*y, *z);
                    }
                },
            )
        };
        return;
    }
    if st == [1, 1, 1] {
        let (mut fa, mut fb) = (AlignedBlock::<BLOCK>::ZERO, AlignedBlock::<BLOCK>::ZERO);
        let mut i = 0;
        while i < len {
            let n = BLOCK.min(len - i);
            // SAFETY: [i, i + n) is inside every row; the inputs are read into buffers before
            // the output is written, so in-place rows are fine.
            unsafe {
                T::load(std::slice::from_raw_parts(a.add(i), n), &mut fa[..n]);
                T::load(std::slice::from_raw_parts(b.add(i), n), &mut fb[..n]);
                for k in 0..n {
                    fa[k] = f(fa[k], fb[k]);
                }
                T::store(&fa[..n], std::slice::from_raw_parts_mut(o.add(i), n));
            }
            i += n;
        }
        return;
    }
    for i in 0..len {
        // SAFETY: element i of each row is in range.
        unsafe {
            let v = f((*a.add(i * st[1])).to_f32(), (*b.add(i * st[2])).to_f32());
            *o.add(i * st[0]) = T::from_f32(v);
        }
    }
}

/// One row of `o[i] = f(a[i])`, streaming as [`row2`].
///
/// # Safety
/// As [`row2`].
#[inline(always)]
unsafe fn row1<T: Float>(
    o: *mut T,
    a: *const T,
    len: usize,
    st: [usize; 2],
    (cheap, stream): (bool, bool),
    f: impl Fn(f32) -> f32,
) {
    if st == [1, 1] && T::DTYPE == crate::tensor::DType::F32 {
        let (o, a) = (o as *mut f32, a as *const f32);
        // SAFETY: T is f32; the caller's promise for the rest.
        unsafe {
            contiguous1(
                o,
                a,
                len,
                &f,
                #[inline(always)]
                |out, a| {
                    // Inlined by force, as in row2.
                    write_streaming(
                        out,
                        stream,
                        #[inline(always)]
                        |s, d| {
                            d.iter_mut().zip(&a[s..]).for_each(
                                #[inline(always)]
                                |(x, y)| *x = f(*y),
                            );
                        },
                    );
                },
            )
        };
        return;
    }
    if st == [1, 1] && T::DTYPE == crate::tensor::DType::BF16 && cheap {
        // Cheap ops on bf16 rows in one pass, as in row2.
        let g = |x: u16| f32_to_bf16_bits(f(bf16_bits_to_f32(x)));
        let (o, a) = (o as *mut u16, a as *const u16);
        // SAFETY: T is bf16; the caller's promise for the rest.
        unsafe {
            contiguous1(
                o,
                a,
                len,
                g,
                #[inline(always)]
                |out, a| {
                    out.iter_mut().zip(a).for_each(
                        #[inline(always)]
                        |(x, y)| *x = g(*y),
                    );
                },
            )
        };
        return;
    }
    if st == [1, 1] {
        let mut fa = AlignedBlock::<BLOCK>::ZERO;
        let mut i = 0;
        while i < len {
            let n = BLOCK.min(len - i);
            // SAFETY: [i, i + n) is inside both rows; read before write.
            unsafe {
                T::load(std::slice::from_raw_parts(a.add(i), n), &mut fa[..n]);
                fa[..n].iter_mut().for_each(
                    #[inline(always)]
                    |x| *x = f(*x),
                );
                T::store(&fa[..n], std::slice::from_raw_parts_mut(o.add(i), n));
            }
            i += n;
        }
        return;
    }
    for i in 0..len {
        // SAFETY: element i of each row is in range.
        unsafe { *o.add(i * st[0]) = T::from_f32(f((*a.add(i * st[1])).to_f32())) };
    }
}

/// `binary_with` and `unary_with`: with `streams_out` a large output is written with
/// non-temporal stores; a `cheap` op converts bf16 rows in one pass.
fn binary_with<T: Float>(
    call: &KernelCall<'_>,
    (cheap, streams_out): (bool, bool),
    f: impl Fn(f32, f32) -> f32 + Sync + Copy,
) -> Result<()> {
    let out = &call.outputs[0];
    let shape = out.layout.shape();
    let (a, b) = (
        bcast(&call.inputs[0], shape)?,
        bcast(&call.inputs[1], shape)?,
    );
    let (shape, strides) = coalesce(shape, [out.layout.strides(), a.strides(), b.strides()]);
    let (po, pa, pb) = (
        Ptr::<T>::of(out),
        Ptr::<T>::of(&call.inputs[0]),
        Ptr::<T>::of(&call.inputs[1]),
    );
    let stream = streams_out && streams(out.layout.numel() * T::DTYPE.size());
    par_rows(&shape, &strides, |off, len, st| {
        // SAFETY: par_rows hands out rows inside the (checked) views; tasks write disjoint
        // output elements.
        simd!(unsafe {
            row2(
                po.at(off[0]),
                pa.at(off[1]),
                pb.at(off[2]),
                len,
                st,
                (cheap, stream),
                f,
            )
        })
    });
    Ok(())
}

fn unary_with<T: Float>(
    call: &KernelCall<'_>,
    (cheap, streams_out): (bool, bool),
    f: impl Fn(f32) -> f32 + Sync + Copy,
) -> Result<()> {
    let out = &call.outputs[0];
    let shape = out.layout.shape();
    let a = bcast(&call.inputs[0], shape)?;
    let (shape, strides) = coalesce(shape, [out.layout.strides(), a.strides()]);
    let (po, pa) = (Ptr::<T>::of(out), Ptr::<T>::of(&call.inputs[0]));
    let stream = streams_out && streams(out.layout.numel() * T::DTYPE.size());
    par_rows(&shape, &strides, |off, len, st| {
        // SAFETY: as in binary_with.
        simd!(unsafe { row1(po.at(off[0]), pa.at(off[1]), len, st, (cheap, stream), f) })
    });
    Ok(())
}

fn binary<T: Float, O: Bin>(call: &KernelCall<'_>) -> Result<()> {
    binary_with::<T>(call, (O::CHEAP, O::STREAM), O::f)
}

fn binary_scalar<T: Float, O: Bin>(call: &KernelCall<'_>) -> Result<()> {
    let s = scalar_param(call)? as f32;
    unary_with::<T>(call, (O::CHEAP, O::STREAM), move |x| O::f(x, s))
}

fn unary<T: Float, O: Un>(call: &KernelCall<'_>) -> Result<()> {
    unary_with::<T>(call, (O::STREAM, O::STREAM), O::f)
}

/// `where(cond, a, b)` and `masked_fill(x, mask)`: a u8 condition selects per element.
fn select<T: Float>(call: &KernelCall<'_>, cond: usize, fill: Option<f32>) -> Result<()> {
    let out = &call.outputs[0];
    let shape = out.layout.shape();
    let c = bcast(&call.inputs[cond], shape)?;
    let (ia, ib) = if fill.is_some() { (0, 0) } else { (1, 2) };
    let (a, b) = (
        bcast(&call.inputs[ia], shape)?,
        bcast(&call.inputs[ib], shape)?,
    );
    let (shape, strides) = coalesce(
        shape,
        [out.layout.strides(), c.strides(), a.strides(), b.strides()],
    );
    let (po, pc, pa, pb) = (
        Ptr::<T>::of(out),
        Ptr::<u8>::of(&call.inputs[cond]),
        Ptr::<T>::of(&call.inputs[ia]),
        Ptr::<T>::of(&call.inputs[ib]),
    );
    par_rows(&shape, &strides, |off, len, st| {
        for i in 0..len {
            // SAFETY: element i of every row is inside its checked view; each input element
            // is read before the (possibly same) output element is written.
            unsafe {
                let set = *pc.at(off[1] + i * st[1]) != 0;
                let v = match fill {
                    Some(v) if set => T::from_f32(v),
                    Some(_) => *pa.at(off[2] + i * st[2]),
                    None if set => *pa.at(off[2] + i * st[2]),
                    None => *pb.at(off[3] + i * st[3]),
                };
                *po.at(off[0] + i * st[0]) = v;
            }
        }
    });
    Ok(())
}

fn where_<T: Float>(call: &KernelCall<'_>) -> Result<()> {
    select::<T>(call, 0, None)
}

fn masked_fill<T: Float>(call: &KernelCall<'_>) -> Result<()> {
    let v = scalar_param(call)? as f32;
    select::<T>(call, 1, Some(v))
}

pub(super) fn register(reg: &mut KernelRegistry) {
    macro_rules! bins {
        ($($name:literal, $sname:literal => $t:ty;)*) => {$(
            floats!(reg, $name, binary::<$t>);
            floats!(reg, $sname, binary_scalar::<$t>);
        )*};
    }
    bins! {
        "add", "add_scalar" => Add;
        "sub", "sub_scalar" => Sub;
        "mul", "mul_scalar" => Mul;
        "div", "div_scalar" => Div;
        "maximum", "maximum_scalar" => Maximum;
        "minimum", "minimum_scalar" => Minimum;
        "pow", "pow_scalar" => Pow;
    }
    floats!(reg, "swiglu", binary::<Swiglu>);
    macro_rules! uns {
        ($($name:literal => $t:ty;)*) => {$( floats!(reg, $name, unary::<$t>); )*};
    }
    uns! {
        "neg" => Neg; "abs" => Abs; "exp" => Exp; "log" => Log; "sqrt" => Sqrt;
        "rsqrt" => Rsqrt; "sin" => Sin; "cos" => Cos; "tanh" => Tanh; "sigmoid" => Sigmoid;
        "relu" => Relu; "gelu" => Gelu; "gelu_tanh" => GeluTanh; "silu" => Silu;
    }
    floats!(reg, "where", where_);
    floats!(reg, "masked_fill", masked_fill);
}

#[cfg(test)]
mod tests {
    use super::{silu, Bin, GeluTanh, Swiglu, Un};

    /// silu, swiglu and gelu's tanh form take `exp_nan_unused_f32`, whose value for a NaN
    /// is not NaN: they stay NaN for NaNs of any payload all the same.
    #[test]
    fn exp_nan_unused_callers_stay_nan() {
        for payload in [
            0x7fc0_0000u32,
            0x7fc0_0001,
            0x7f80_0001,
            0xffc0_01ff,
            0x7fff_ffff,
        ] {
            let nan = f32::from_bits(payload);
            assert!(silu(nan).is_nan(), "{payload:#x}");
            assert!(GeluTanh::f(nan).is_nan(), "{payload:#x}");
            assert!(Swiglu::f(1.0, nan).is_nan(), "{payload:#x}");
            assert!(Swiglu::f(nan, 1.0).is_nan(), "{payload:#x}");
        }
    }
}
