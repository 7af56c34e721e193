// The elementwise op family: binary (tensor–tensor and tensor–scalar), unary, swiglu, where
// and masked_fill, for the element type `T` the generator defines; arithmetic in f32.
//
// Every operator has one signature, (out, in0, in1, in2, Ew): the inputs in the plan's order
// (unused ones null), the iteration space of the output and each operand's strides over it
// (0 where it broadcasts). Entry points are `op_<registry name>`.
//
// The HAL's built-in kernels `fill` and `add_f32` live in builtin.cu.

struct Ew {
    Space s;
    Strides so, s0, s1, s2;
    double scalar;
};

// The offsets of point `i` in the output and the three inputs. One dimension (contiguous or
// evenly strided operands, the common case) is a multiply; the general walk is one shared,
// out-of-line function instead of a copy inlined into every entry.
__device__ __noinline__ void offsets_nd(const Ew &e, i64 i, i64 *o)
{
    o[0] = offset_of(e.s, e.so, i);
    o[1] = offset_of(e.s, e.s0, i);
    o[2] = offset_of(e.s, e.s1, i);
    o[3] = offset_of(e.s, e.s2, i);
}

__device__ __forceinline__ void offsets(const Ew &e, i64 i, i64 *o)
{
    if (e.s.nd <= 1) {
        o[0] = i * e.so.st[0];
        o[1] = i * e.s0.st[0];
        o[2] = i * e.s1.st[0];
        o[3] = i * e.s2.st[0];
    } else {
        offsets_nd(e, i, o);
    }
}

__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float gelu_tanh(float x)
{
    const float c = 0.79788456080286536f; // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

#define BINARY(name, expr)                                                                   \
    extern "C" __global__ void op_##name(T *out, const T *in0, const T *in1, const T *in2,   \
                                         Ew e)                                               \
    {                                                                                        \
        GRID_LOOP(i, e.s.n)                                                                  \
        {                                                                                    \
            i64 o[4];                                                                        \
            offsets(e, i, o);                                                                \
            float a = to_f32(in0[o[1]]), b = to_f32(in1[o[2]]);                              \
            out[o[0]] = from_f32<T>(expr);                                                   \
        }                                                                                    \
    }                                                                                        \
    extern "C" __global__ void op_##name##_scalar(T *out, const T *in0, const T *in1,        \
                                                  const T *in2, Ew e)                        \
    {                                                                                        \
        float b = (float)e.scalar;                                                           \
        GRID_LOOP(i, e.s.n)                                                                  \
        {                                                                                    \
            i64 o[4];                                                                        \
            offsets(e, i, o);                                                                \
            float a = to_f32(in0[o[1]]);                                                     \
            out[o[0]] = from_f32<T>(expr);                                                   \
        }                                                                                    \
    }

BINARY(add, a + b)
BINARY(sub, a - b)
BINARY(mul, a * b)
BINARY(div, a / b)
BINARY(maximum, fmaxf(a, b))
BINARY(minimum, fminf(a, b))
BINARY(pow, powf(a, b))

#define UNARY(name, expr)                                                                    \
    extern "C" __global__ void op_##name(T *out, const T *in0, const T *in1, const T *in2,   \
                                         Ew e)                                               \
    {                                                                                        \
        GRID_LOOP(i, e.s.n)                                                                  \
        {                                                                                    \
            i64 o[4];                                                                        \
            offsets(e, i, o);                                                                \
            float x = to_f32(in0[o[1]]);                                                     \
            out[o[0]] = from_f32<T>(expr);                                                   \
        }                                                                                    \
    }

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
UNARY(relu, fmaxf(x, 0.0f))
UNARY(gelu, gelu_erf(x))
UNARY(gelu_tanh, gelu_tanh(x))
UNARY(silu, x * sigmoid(x))

// up · silu(gate).
extern "C" __global__ void op_swiglu(T *out, const T *in0, const T *in1, const T *in2, Ew e)
{
    GRID_LOOP(i, e.s.n)
    {
        i64 o[4];
        offsets(e, i, o);
        float up = to_f32(in0[o[1]]), g = to_f32(in1[o[2]]);
        out[o[0]] = from_f32<T>(up * g * sigmoid(g));
    }
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
