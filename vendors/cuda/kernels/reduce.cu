// The reduce op family: sum, mean, max, min and argmax over any set of axes. One block per
// output element (grid-stride over outputs); the kept dimensions form `outer`, the reduced
// ones `inner`. Sums accumulate in f32 per thread and combine across the block; max / min
// propagate NaN; argmax returns the first index of the largest value (NaN counts as largest),
// as the CPU does.

struct Red {
    Space outer, inner;
    Strides so, si_outer, si_inner;
};

#define RED_THREADS 256

template <int KIND> // 0 sum, 1 mean, 2 max, 3 min
__device__ __forceinline__ void reduce_block(T *out, const T *in, const Red &r)
{
    __shared__ float scratch[32];
    for (i64 o = blockIdx.x; o < r.outer.n; o += gridDim.x) {
        const T *x = in + offset_of(r.outer, r.si_outer, o);
        float acc = KIND == 2 ? UNIRT_NEG_INF : (KIND == 3 ? UNIRT_POS_INF : 0.0f);
        bool nan = false;
        for (i64 j = threadIdx.x; j < r.inner.n; j += blockDim.x) {
            float v = to_f32(x[offset_of(r.inner, r.si_inner, j)]);
            if (KIND <= 1) acc += v;
            else if (v != v) nan = true;
            else acc = KIND == 2 ? fmaxf(acc, v) : fminf(acc, v);
        }
        float res;
        if (KIND <= 1) {
            res = block_sum(acc, scratch);
            if (KIND == 1) res = res / (float)r.inner.n;
        } else {
            float anynan = block_sum(nan ? 1.0f : 0.0f, scratch);
            res = KIND == 2 ? block_max(acc, scratch) : -block_max(-acc, scratch);
            if (anynan > 0.0f) res = __int_as_float(0x7fffffff);
        }
        if (threadIdx.x == 0) out[offset_of(r.outer, r.so, o)] = from_f32<T>(res);
        __syncthreads();
    }
}

extern "C" __global__ void op_sum(T *out, const T *in, Red r) { reduce_block<0>(out, in, r); }
extern "C" __global__ void op_mean(T *out, const T *in, Red r) { reduce_block<1>(out, in, r); }
extern "C" __global__ void op_max(T *out, const T *in, Red r) { reduce_block<2>(out, in, r); }
extern "C" __global__ void op_min(T *out, const T *in, Red r) { reduce_block<3>(out, in, r); }

// (value, index) of the better of two candidates: larger value, NaN largest, ties to the
// smaller index.
__device__ __forceinline__ bool better(float v, i64 i, float bv, i64 bi)
{
    bool vn = v != v, bn = bv != bv;
    if (vn || bn) return vn && (!bn || i < bi);
    return v > bv || (v == bv && i < bi);
}

extern "C" __global__ void op_argmax(i64 *out, const T *in, Red r)
{
    __shared__ float sv[32];
    __shared__ i64 si[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (i64 o = blockIdx.x; o < r.outer.n; o += gridDim.x) {
        const T *x = in + offset_of(r.outer, r.si_outer, o);
        float bv = UNIRT_NEG_INF;
        i64 bi = 0x7fffffffffffffffLL;
        for (i64 j = threadIdx.x; j < r.inner.n; j += blockDim.x) {
            float v = to_f32(x[offset_of(r.inner, r.si_inner, j)]);
            if (better(v, j, bv, bi)) { bv = v; bi = j; }
        }
        for (int s = 16; s > 0; s >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, s);
            i64 oi = __shfl_xor_sync(0xffffffffu, bi, s);
            if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < nw; ++w) {
                if (better(sv[w], si[w], bv, bi)) { bv = sv[w]; bi = si[w]; }
            }
            out[offset_of(r.outer, r.so, o)] = bi;
        }
        __syncthreads();
    }
}
