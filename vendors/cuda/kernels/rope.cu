// The rope op family: x [.., seq, heads, d] rotated pair by pair by pos[s] · theta^(−2i/d)
// (half: pairs (i, i + d/2), Llama; interleaved: (2i, 2i + 1), GPT-J), one thread per pair.
// The angle is formed and reduced in f64, as on the CPU; positions are i32 or i64
// (`op_rope_i32`, `op_rope_i64`).

struct Rp {
    Space rows;       // every dimension but the last
    Strides so, si;
    i64 seq, heads, half, x_st, o_st, pos_st, interleaved;
    double theta;
};

template <typename I>
__device__ __forceinline__ void rotate(T *out, const T *in, const I *pos, const Rp &p)
{
    i64 total = p.rows.n * p.half;
    GRID_LOOP(k, total)
    {
        i64 r = k / p.half, i = k - r * p.half;
        i64 s = (r / p.heads) % p.seq;
        double ang = (double)pos[s * p.pos_st] * pow(p.theta, -2.0 * (double)i / (double)(2 * p.half));
        double sn, cs;
        sincos(ang, &sn, &cs);
        float c = (float)cs, sf = (float)sn;
        i64 a = p.interleaved ? 2 * i : i, b = p.interleaved ? 2 * i + 1 : i + p.half;
        const T *x = in + offset_of(p.rows, p.si, r);
        T *y = out + offset_of(p.rows, p.so, r);
        float x0 = to_f32(x[a * p.x_st]), x1 = to_f32(x[b * p.x_st]);
        y[a * p.o_st] = from_f32<T>(x0 * c - x1 * sf);
        y[b * p.o_st] = from_f32<T>(x0 * sf + x1 * c);
    }
}

extern "C" __global__ void op_rope_i32(T *out, const T *in, const int *pos, Rp p) { rotate<int>(out, in, pos, p); }
extern "C" __global__ void op_rope_i64(T *out, const T *in, const i64 *pos, Rp p) { rotate<i64>(out, in, pos, p); }
