// The cast op family: the source element type `T` (the generator's dtype) to every dtype,
// through f64 (exact for every source value except i64 beyond 2^53), rounding once into the
// destination as the CPU does. Entry points are `op_cast_to_<dtype>`.

struct Map {
    Space s;
    Strides so, si;
};

// Elements a thread converts per access on dense launches.
#define CAST_VEC 4

// Contiguous, one dimension, both sides aligned for CAST_VEC-element accesses.
template <typename D> __device__ __forceinline__ bool dense(const Map &m, const D *out, const T *in)
{
    return m.s.nd == 1 && m.so.st[0] == 1 && m.si.st[0] == 1 &&
           aligned_to(out, sizeof(D) * CAST_VEC) && aligned_to(in, sizeof(T) * CAST_VEC);
}

#define CAST_TO(name, D, conv)                                                               \
    __device__ __forceinline__ D conv_to_##name(double v) { return conv; }                   \
    extern "C" __global__ void op_cast_to_##name(D *out, const T *in, Map m)                 \
    {                                                                                        \
        if (dense(m, out, in)) {                                                             \
            i64 packs = m.s.n / CAST_VEC;                                                    \
            const Pack<T, CAST_VEC> *src = (const Pack<T, CAST_VEC> *)in;                    \
            Pack<D, CAST_VEC> *dst = (Pack<D, CAST_VEC> *)out;                               \
            GRID_LOOP(p, packs)                                                              \
            {                                                                                \
                Pack<T, CAST_VEC> x = src[p];                                                \
                Pack<D, CAST_VEC> y;                                                         \
                _Pragma("unroll") for (int j = 0; j < CAST_VEC; ++j)                         \
                    y.v[j] = conv_to_##name(to_f64(x.v[j]));                                 \
                dst[p] = y;                                                                  \
            }                                                                                \
            i64 t = packs * CAST_VEC + (i64)blockIdx.x * blockDim.x + threadIdx.x;           \
            if (t < m.s.n) out[t] = conv_to_##name(to_f64(in[t]));                           \
            return;                                                                          \
        }                                                                                    \
        GRID_LOOP(i, m.s.n)                                                                  \
        {                                                                                    \
            i64 oo, oi;                                                                      \
            offsets_of2(m.s, m.so, m.si, i, &oo, &oi);                                       \
            out[oo] = conv_to_##name(to_f64(in[oi]));                                        \
        }                                                                                    \
    }

CAST_TO(f32, float, from_f64<float>(v))
CAST_TO(f16, uhalf, from_f64<uhalf>(v))
CAST_TO(bf16, ubf16, from_f64<ubf16>(v))
CAST_TO(i32, int, from_f64<int>(v))
CAST_TO(i64, i64, from_f64<i64>(v))
CAST_TO(u8, u8, from_f64<u8>(v))
CAST_TO(bool, u8, (u8)(v != 0.0))
