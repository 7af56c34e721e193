// The elementwise op family: binary (tensor–tensor and tensor–scalar), unary, swiglu, where
// and masked_fill, for the element type `T` the generator defines; arithmetic in f32.
//
// Every operator has one signature, (out, in0, in1, in2, Ew): the inputs in the plan's order
// (unused ones null), the iteration space of the output and each operand's strides over it
// (0 where it broadcasts). Entry points are `op_<registry name>`.
//
// The HAL's built-in kernels `fill` and `add_f32` live in builtin.cu.
//
// With UNIRT_FUSED defined the file declares only the operators' functions (`<name>_fn`),
// no kernel: a fused chain's generated source (fused.rs) calls the very functions the
// unfused kernels call, which is what makes it bitwise the unfused chain.

#ifdef UNIRT_FUSED
#define UNIRT_KERNEL(...)
#else
#define UNIRT_KERNEL(...) __VA_ARGS__
#endif

struct Ew {
    Space s;
    Strides so, s0, s1, s2;
    double scalar;
};

// The offsets of point `i` in the output and the three inputs (one chain of divisions).
__device__ __forceinline__ void offsets(const Ew &e, i64 i, i64 (&o)[4])
{
    const Strides *ops[4] = {&e.so, &e.s0, &e.s1, &e.s2};
    offsets_of_n(e.s, ops, i, o);
}

// Elements per 16-byte vector access.
#define VEC (16 / (int)sizeof(T))
typedef Pack<T, VEC> TPack;

// Whether a launch can take the vector path: one dimension, the output and the `K` inputs it
// reads contiguous and 16-byte aligned (a view's offset can break the alignment; the launch
// then walks element by element).
template <int K> __device__ __forceinline__ bool dense(const Ew &e, const T *out, const T *a, const T *b)
{
    if (e.s.nd != 1 || e.so.st[0] != 1 || !aligned_to(out, 16)) return false;
    if (K >= 1 && (e.s0.st[0] != 1 || !aligned_to(a, 16))) return false;
    if (K >= 2 && (e.s1.st[0] != 1 || !aligned_to(b, 16))) return false;
    return true;
}

// out = f(in0, in1) over the launch's space, `K` (1 or 2) inputs read, arithmetic in f32.
// Dense launches move 16 bytes per access (the host sizes their grid for that); the rest walk
// each operand's strides.
template <int K, class F>
__device__ __forceinline__ void map(F f, T *out, const T *in0, const T *in1, const Ew &e)
{
    if (dense<K>(e, out, in0, in1)) {
        i64 packs = e.s.n / VEC;
        const TPack *a = (const TPack *)in0, *b = (const TPack *)in1;
        TPack *o = (TPack *)out;
        GRID_LOOP(p, packs)
        {
            TPack x = a[p], y = x, r;
            if (K == 2) y = b[p];
#pragma unroll
            for (int j = 0; j < VEC; ++j) r.v[j] = from_f32<T>(f(to_f32(x.v[j]), to_f32(y.v[j])));
            o[p] = r;
        }
        // Fewer than VEC elements are left; the first threads take one each.
        i64 t = packs * VEC + (i64)blockIdx.x * blockDim.x + threadIdx.x;
        if (t < e.s.n) {
            float x = to_f32(in0[t]);
            out[t] = from_f32<T>(f(x, K == 2 ? to_f32(in1[t]) : x));
        }
        return;
    }
    GRID_LOOP(i, e.s.n)
    {
        i64 o[4];
        offsets(e, i, o);
        float x = to_f32(in0[o[1]]);
        out[o[0]] = from_f32<T>(f(x, K == 2 ? to_f32(in1[o[2]]) : x));
    }
}

// A binary operation with its right operand fixed: a unary map.
template <class F> struct WithScalar {
    F f;
    float b;
    __device__ __forceinline__ float operator()(float a, float) const { return f(a, b); }
};

__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float gelu_tanh(float x)
{
    const float c = 0.79788456080286536f; // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// maximum / minimum / relu give NaN for a NaN operand, as on every backend (fmaxf and
// fminf return the other operand); a + b carries the NaN.
__device__ __forceinline__ float max_nan(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
__device__ __forceinline__ float min_nan(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }

#define BINARY(name, expr)                                                                   \
    struct name##_fn {                                                                       \
        __device__ __forceinline__ float operator()(float a, float b) const { return expr; } \
    };                                                                                       \
    UNIRT_KERNEL(extern "C" __global__ void op_##name(T *out, const T *in0, const T *in1,    \
                                                      const T *in2, Ew e)                    \
                 { map<2>(name##_fn(), out, in0, in1, e); })                                 \
    UNIRT_KERNEL(extern "C" __global__ void op_##name##_scalar(T *out, const T *in0,         \
                                                               const T *in1, const T *in2,   \
                                                               Ew e)                         \
                 {                                                                           \
                     WithScalar<name##_fn> f = {name##_fn(), (float)e.scalar};               \
                     map<1>(f, out, in0, in1, e);                                            \
                 })

BINARY(add, a + b)
BINARY(sub, a - b)
BINARY(mul, a * b)
BINARY(div, a / b)
BINARY(maximum, max_nan(a, b))
BINARY(minimum, min_nan(a, b))
BINARY(pow, powf(a, b))

#define UNARY(name, expr)                                                                    \
    struct name##_fn {                                                                       \
        __device__ __forceinline__ float operator()(float x, float) const { return expr; }   \
    };                                                                                       \
    UNIRT_KERNEL(extern "C" __global__ void op_##name(T *out, const T *in0, const T *in1,    \
                                                      const T *in2, Ew e)                    \
                 { map<1>(name##_fn(), out, in0, in1, e); })

UNARY(neg, -x)
UNARY(abs, fabsf(x))
UNARY(exp, expf(x))
UNARY(log, logf(x))
UNARY(sqrt, sqrtf(x))
UNARY(rsqrt, 1.0f / sqrtf(x))
UNARY(sin, sinf(x))
UNARY(cos, cosf(x))
UNARY(tanh, tanhf(x))
UNARY(sigmoid, sigmoid(x))
UNARY(relu, x != x ? x : fmaxf(x, 0.0f))
UNARY(gelu, gelu_erf(x))
UNARY(gelu_tanh, gelu_tanh(x))
UNARY(silu, x * sigmoid(x))

// up · silu(gate).
struct swiglu_fn {
    __device__ __forceinline__ float operator()(float up, float g) const { return up * g * sigmoid(g); }
};
#ifndef UNIRT_FUSED
extern "C" __global__ void op_swiglu(T *out, const T *in0, const T *in1, const T *in2, Ew e)
{
    map<2>(swiglu_fn(), out, in0, in1, e);
}

// cond ? a : b; cond is bytes (bool or u8), copied bit for bit.
extern "C" __global__ void op_where(T *out, const u8 *in0, const T *in1, const T *in2, Ew e)
{
    GRID_LOOP(i, e.s.n)
    {
        i64 o[4];
        offsets(e, i, o);
        out[o[0]] = in0[o[1]] != 0 ? in1[o[2]] : in2[o[3]];
    }
}

// mask ? scalar : x.
extern "C" __global__ void op_masked_fill(T *out, const T *in0, const u8 *in1, const T *in2, Ew e)
{
    T v = from_f64<T>(e.scalar);
    GRID_LOOP(i, e.s.n)
    {
        i64 o[4];
        offsets(e, i, o);
        out[o[0]] = in1[o[2]] != 0 ? v : in0[o[1]];
    }
}
#endif // UNIRT_FUSED
