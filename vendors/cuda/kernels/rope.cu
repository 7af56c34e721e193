// The rope op family: x [.., seq, heads, d] rotated pair by pair by pos[s] · theta^(−2i/d)
// (half: pairs (i, i + d/2), Llama; interleaved: (2i, 2i + 1), GPT-J), a block per position.
// The angle is formed and reduced in f64, as on the CPU; positions are i32 or i64
// (`op_rope_i32`, `op_rope_i64`).

struct Rp {
    Space rows;       // every dimension but the last
    Strides so, si;
    i64 seq, heads, half, x_st, o_st, pos_st, interleaved;
    double theta;
};

// Half of the rotation table a block keeps in shared memory (d ≤ 2048; longer rows compute
// each angle where it is used).
#define ROPE_TABLE 1024

// cos and sin of position `ps`'s angle for pair `i`, formed and reduced in f64.
__device__ __forceinline__ void rope_angle(double ps, i64 i, const Rp &p, float &c, float &s)
{
    double ang = ps * pow(p.theta, -2.0 * (double)i / (double)(2 * p.half));
    double sn, cs;
    sincos(ang, &sn, &cs);
    c = (float)cs;
    s = (float)sn;
}

// A block per (.., position) group of `heads` rows: the angles depend on the position and
// the pair only, so the block forms them once (f64 pow and sincos are the costly part: one
// per pair, every head repeating them, held the kernel to 390 GB/s in bf16 on an H100), then
// every head's pairs rotate from the table.
template <typename I>
__device__ __forceinline__ void rotate(T *out, const T *in, const I *pos, const Rp &p)
{
    __shared__ float tc[ROPE_TABLE], ts[ROPE_TABLE];
    bool table = p.half <= ROPE_TABLE;
    i64 groups = p.heads > 0 ? p.rows.n / p.heads : 0, per = p.heads * p.half;
    for (i64 gi = blockIdx.x; gi < groups; gi += gridDim.x) {
        double ps = (double)pos[(gi % p.seq) * p.pos_st];
        if (table) {
            __syncthreads(); // the previous group's reads of the table are done
            for (i64 i = threadIdx.x; i < p.half; i += blockDim.x) rope_angle(ps, i, p, tc[i], ts[i]);
            __syncthreads();
        }
        for (i64 k = threadIdx.x; k < per; k += blockDim.x) {
            i64 h = k / p.half, i = k - h * p.half, r = gi * p.heads + h;
            float c, sf;
            if (table) {
                c = tc[i];
                sf = ts[i];
            } else {
                rope_angle(ps, i, p, c, sf);
            }
            i64 a = p.interleaved ? 2 * i : i, b = p.interleaved ? 2 * i + 1 : i + p.half;
            const T *x = in + offset_of(p.rows, p.si, r);
            T *y = out + offset_of(p.rows, p.so, r);
            float x0 = to_f32(x[a * p.x_st]), x1 = to_f32(x[b * p.x_st]);
            y[a * p.o_st] = from_f32<T>(x0 * c - x1 * sf);
            y[b * p.o_st] = from_f32<T>(x0 * sf + x1 * c);
        }
    }
}

extern "C" __global__ void op_rope_i32(T *out, const T *in, const int *pos, Rp p) { rotate<int>(out, in, pos, p); }
extern "C" __global__ void op_rope_i64(T *out, const T *in, const i64 *pos, Rp p) { rotate<i64>(out, in, pos, p); }
