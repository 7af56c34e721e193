// The cast op family: the source element type `T` (the generator's dtype) to every dtype,
// through f64 (exact for every source value except i64 beyond 2^53), rounding once into the
// destination as the CPU does. Entry points are `op_cast_to_<dtype>`.

struct Map {
    Space s;
    Strides so, si;
};

#define CAST_TO(name, D, conv)                                                               \
    extern "C" __global__ void op_cast_to_##name(D *out, const T *in, Map m)                 \
    {                                                                                        \
        GRID_LOOP(i, m.s.n)                                                                  \
        {                                                                                    \
            double v = to_f64(in[offset_of(m.s, m.si, i)]);                                  \
            out[offset_of(m.s, m.so, i)] = conv;                                             \
        }                                                                                    \
    }

CAST_TO(f32, float, from_f64<float>(v))
CAST_TO(f16, uhalf, from_f64<uhalf>(v))
CAST_TO(bf16, ubf16, from_f64<ubf16>(v))
CAST_TO(i32, int, from_f64<int>(v))
CAST_TO(i64, i64, from_f64<i64>(v))
CAST_TO(u8, u8, from_f64<u8>(v))
CAST_TO(bool, u8, (u8)(v != 0.0))
