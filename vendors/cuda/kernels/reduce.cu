// The reduce op family: sum, mean, max, min and argmax over any set of axes. The kept
// dimensions form `outer`, the reduced ones `inner`. Sums accumulate in f32 per thread and
// combine across the block; max / min propagate NaN; argmax returns the first index of the
// largest value (NaN counts as largest), as the CPU does.
//
// Two plans. Many outputs: one block per output element (grid-stride over outputs). Few
// outputs over many elements (a whole-tensor sum, the argmax of one logit row): one block
// would leave all but one multiprocessor idle, so pass 1 splits each output's elements into
// `splits` chunks of `chunk`, block (chunk, output) reducing one into the plan's workspace
// (an f32 partial each, and an i64 index for argmax), and pass 2 combines an output's
// partials in one block. Both passes are fixed functions of the shapes, so a replay gives
// bitwise the eager result.

struct Red {
    Space outer, inner;
    Strides so, si_outer, si_inner;
    i64 splits, chunk; // the split plan's chunking (1 and inner.n otherwise)
};

#define RED_THREADS 256

// KIND: 0 sum, 1 mean, 2 max, 3 min.
template <int KIND> __device__ __forceinline__ float reduce_init()
{
    return KIND == 2 ? UNIRT_NEG_INF : (KIND == 3 ? UNIRT_POS_INF : 0.0f);
}

template <int KIND> __device__ __forceinline__ void reduce_add(float &acc, bool &nan, float v)
{
    if (KIND <= 1) acc += v;
    else if (v != v) nan = true;
    else acc = KIND == 2 ? fmaxf(acc, v) : fminf(acc, v);
}

// The block's result from every thread's (acc, nan), in every thread; a mean is divided by
// `n`. Every thread of the block must call it.
template <int KIND>
__device__ __forceinline__ float reduce_finish(float acc, bool nan, i64 n, float *scratch)
{
    float res;
    if (KIND <= 1) {
        res = block_sum(acc, scratch);
        if (KIND == 1) res = res / (float)n;
    } else {
        float anynan = block_sum(nan ? 1.0f : 0.0f, scratch);
        res = KIND == 2 ? block_max(acc, scratch) : -block_max(-acc, scratch);
        if (anynan > 0.0f) res = __int_as_float(0x7fffffff);
    }
    return res;
}

template <int KIND>
__device__ __forceinline__ void reduce_block(T *out, const T *in, const Red &r)
{
    __shared__ float scratch[32];
    for (i64 o = blockIdx.x; o < r.outer.n; o += gridDim.x) {
        const T *x = in + offset_of(r.outer, r.si_outer, o);
        float acc = reduce_init<KIND>();
        bool nan = false;
        for (i64 j = threadIdx.x; j < r.inner.n; j += blockDim.x) {
            reduce_add<KIND>(acc, nan, to_f32(x[offset_of(r.inner, r.si_inner, j)]));
        }
        float res = reduce_finish<KIND>(acc, nan, r.inner.n, scratch);
        if (threadIdx.x == 0) out[offset_of(r.outer, r.so, o)] = from_f32<T>(res);
        __syncthreads();
    }
}

// Pass 1 of the split plan: block (c, o) reduces chunk c of output o into partial
// ws[o * splits + c] (a sum for sum and mean).
template <int KIND>
__device__ __forceinline__ void reduce_split_block(float *ws, const T *in, const Red &r)
{
    __shared__ float scratch[32];
    const i64 o = blockIdx.y, c = blockIdx.x;
    const T *x = in + offset_of(r.outer, r.si_outer, o);
    const i64 end = min(c * r.chunk + r.chunk, r.inner.n);
    float acc = reduce_init<KIND>();
    bool nan = false;
    for (i64 j = c * r.chunk + threadIdx.x; j < end; j += blockDim.x) {
        reduce_add<KIND>(acc, nan, to_f32(x[offset_of(r.inner, r.si_inner, j)]));
    }
    float res = reduce_finish<KIND>(acc, nan, 1, scratch);
    if (threadIdx.x == 0) ws[o * r.splits + c] = res;
}

// Pass 2: block o combines output o's partials (a max / min partial is NaN when its chunk
// held one, which the combine propagates).
template <int KIND>
__device__ __forceinline__ void reduce_combine_block(T *out, const float *ws, const Red &r)
{
    __shared__ float scratch[32];
    const i64 o = blockIdx.x;
    const float *p = ws + o * r.splits;
    float acc = reduce_init<KIND>();
    bool nan = false;
    for (i64 c = threadIdx.x; c < r.splits; c += blockDim.x) reduce_add<KIND>(acc, nan, p[c]);
    float res = reduce_finish<KIND>(acc, nan, r.inner.n, scratch);
    if (threadIdx.x == 0) out[offset_of(r.outer, r.so, o)] = from_f32<T>(res);
}

extern "C" __global__ void op_sum(T *out, const T *in, Red r) { reduce_block<0>(out, in, r); }
extern "C" __global__ void op_mean(T *out, const T *in, Red r) { reduce_block<1>(out, in, r); }
extern "C" __global__ void op_max(T *out, const T *in, Red r) { reduce_block<2>(out, in, r); }
extern "C" __global__ void op_min(T *out, const T *in, Red r) { reduce_block<3>(out, in, r); }

// Pass 1 of sum and mean alike.
extern "C" __global__ void op_sum_split(float *ws, const T *in, Red r)
{
    reduce_split_block<0>(ws, in, r);
}
extern "C" __global__ void op_max_split(float *ws, const T *in, Red r)
{
    reduce_split_block<2>(ws, in, r);
}
extern "C" __global__ void op_min_split(float *ws, const T *in, Red r)
{
    reduce_split_block<3>(ws, in, r);
}
extern "C" __global__ void op_sum_combine(T *out, const float *ws, Red r)
{
    reduce_combine_block<0>(out, ws, r);
}
extern "C" __global__ void op_mean_combine(T *out, const float *ws, Red r)
{
    reduce_combine_block<1>(out, ws, r);
}
extern "C" __global__ void op_max_combine(T *out, const float *ws, Red r)
{
    reduce_combine_block<2>(out, ws, r);
}
extern "C" __global__ void op_min_combine(T *out, const float *ws, Red r)
{
    reduce_combine_block<3>(out, ws, r);
}

// (value, index) of the better of two candidates: larger value, NaN largest, ties to the
// smaller index.
__device__ __forceinline__ bool better(float v, i64 i, float bv, i64 bi)
{
    bool vn = v != v, bn = bv != bv;
    if (vn || bn) return vn && (!bn || i < bi);
    return v > bv || (v == bv && i < bi);
}

// The block's best (value, index) from every thread's, in thread 0 (`better` is
// commutative and associative, so the order of combination does not change the result).
// Every thread must call it; the caller synchronises before `sv` / `si` are used again.
__device__ __forceinline__ void block_argmax(float &bv, i64 &bi, float *sv, i64 *si)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
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
    }
}

extern "C" __global__ void op_argmax(i64 *out, const T *in, Red r)
{
    __shared__ float sv[32];
    __shared__ i64 si[32];
    for (i64 o = blockIdx.x; o < r.outer.n; o += gridDim.x) {
        const T *x = in + offset_of(r.outer, r.si_outer, o);
        float bv = UNIRT_NEG_INF;
        i64 bi = 0x7fffffffffffffffLL;
        for (i64 j = threadIdx.x; j < r.inner.n; j += blockDim.x) {
            float v = to_f32(x[offset_of(r.inner, r.si_inner, j)]);
            if (better(v, j, bv, bi)) { bv = v; bi = j; }
        }
        block_argmax(bv, bi, sv, si);
        if (threadIdx.x == 0) out[offset_of(r.outer, r.so, o)] = bi;
        __syncthreads();
    }
}

// The split argmax's indices follow its values in the workspace, from an 8-byte boundary.
__device__ __forceinline__ i64 *argmax_indices(float *ws, const Red &r)
{
    return (i64 *)(ws + ((r.outer.n * r.splits + 1) & ~(i64)1));
}

extern "C" __global__ void op_argmax_split(float *ws, const T *in, Red r)
{
    __shared__ float sv[32];
    __shared__ i64 si[32];
    const i64 o = blockIdx.y, c = blockIdx.x;
    const T *x = in + offset_of(r.outer, r.si_outer, o);
    const i64 end = min(c * r.chunk + r.chunk, r.inner.n);
    float bv = UNIRT_NEG_INF;
    i64 bi = 0x7fffffffffffffffLL;
    for (i64 j = c * r.chunk + threadIdx.x; j < end; j += blockDim.x) {
        float v = to_f32(x[offset_of(r.inner, r.si_inner, j)]);
        if (better(v, j, bv, bi)) { bv = v; bi = j; }
    }
    block_argmax(bv, bi, sv, si);
    if (threadIdx.x == 0) {
        ws[o * r.splits + c] = bv;
        argmax_indices(ws, r)[o * r.splits + c] = bi;
    }
}

extern "C" __global__ void op_argmax_combine(i64 *out, const float *ws, Red r)
{
    __shared__ float sv[32];
    __shared__ i64 si[32];
    const i64 o = blockIdx.x;
    const i64 *idx = argmax_indices((float *)ws, r) + o * r.splits;
    float bv = UNIRT_NEG_INF;
    i64 bi = 0x7fffffffffffffffLL;
    for (i64 c = threadIdx.x; c < r.splits; c += blockDim.x) {
        float v = ws[o * r.splits + c];
        if (better(v, idx[c], bv, bi)) { bv = v; bi = idx[c]; }
    }
    block_argmax(bv, bi, sv, si);
    if (threadIdx.x == 0) out[offset_of(r.outer, r.so, o)] = bi;
}
