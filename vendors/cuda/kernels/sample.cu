// The sample op family: random_sample over the last dimension, one block per row, the same
// rule as the CPU (ops::sample): greedy when temperature is 0 or top_k is 1; otherwise the
// top_k logits in descending order (ties by index), softmax weights exp((x − max) / T) in
// f64, cut at the first cumulative weight ≥ top_p · total, and the first cumulative weight
// above random · (the kept total) wins.
//
// Without a workspace the sorted order is walked rank by rank (each rank one block-wide
// search for the next element in the order): O(k · vocab / threads) per row. Correct for
// every k; fast for the small top_k of LLM decoding, slow for top_k = 0 over a large vocabulary.

struct Smp {
    Space rows;
    Strides si;
    i64 n, st;
    double random, temperature, top_p;
    i64 top_k;
};

#define SAMPLE_THREADS 256

// Whether (v, i) comes before (bv, bi) in the order: larger value first, then smaller index.
__device__ __forceinline__ bool before(float v, i64 i, float bv, i64 bi)
{
    return v > bv || (v == bv && i < bi);
}

// The first element of the order that comes after (pv, pi) (every element when `first`);
// every thread of the block gets it.
__device__ void next_in_order(const T *x, const Smp &p, bool first, float pv, i64 pi,
                              float *out_v, i64 *out_i, float *sv, i64 *si)
{
    float bv = UNIRT_NEG_INF;
    i64 bi = 0x7fffffffffffffffLL;
    for (i64 j = threadIdx.x; j < p.n; j += blockDim.x) {
        float v = to_f32(x[j * p.st]);
        if (v != v) continue;
        if (!first && !before(pv, pi, v, j)) continue;
        if (before(v, j, bv, bi)) { bv = v; bi = j; }
    }
    for (int s = 16; s > 0; s >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, s);
        i64 oi = __shfl_xor_sync(0xffffffffu, bi, s);
        if (before(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    bv = sv[0];
    bi = si[0];
    for (int w = 1; w < nw; ++w)
        if (before(sv[w], si[w], bv, bi)) { bv = sv[w]; bi = si[w]; }
    *out_v = bv;
    *out_i = bi;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) op_random_sample(i64 *out, const T *in, Smp p)
{
    __shared__ float sv[32];
    __shared__ i64 si[32];
    __shared__ double sd[32];
    for (i64 r = blockIdx.x; r < p.rows.n; r += gridDim.x) {
        const T *x = in + offset_of(p.rows, p.si, r);
        float mv;
        i64 mi;
        next_in_order(x, p, true, 0.0f, 0, &mv, &mi, sv, si);
        if (mi >= p.n) mi = 0; // every logit NaN
        if (p.temperature == 0.0 || p.top_k == 1) {
            if (threadIdx.x == 0) out[r] = mi;
            __syncthreads();
            continue;
        }
        i64 k = (p.top_k == 0 || p.top_k > p.n) ? p.n : p.top_k;
        double max = (double)mv;
        // Pass 1: the total weight of the top k.
        double total = 0.0;
        if (k == p.n) {
            double s = 0.0;
            for (i64 j = threadIdx.x; j < p.n; j += blockDim.x) {
                float v = to_f32(x[j * p.st]);
                if (v == v) s += exp(((double)v - max) / p.temperature);
            }
            total = block_sum_f64(s, sd);
        } else {
            float v = mv;
            i64 i = mi;
            for (i64 rank = 0; rank < k; ++rank) {
                if (rank > 0) next_in_order(x, p, false, v, i, &v, &i, sv, si);
                if (i >= p.n) break;
                total += exp(((double)v - max) / p.temperature);
            }
        }
        // Pass 2: the kept prefix and its weight.
        double cut = p.top_p * total, kept = 0.0, cum = 0.0;
        {
            float v = mv;
            i64 i = mi;
            for (i64 rank = 0; rank < k; ++rank) {
                if (rank > 0) next_in_order(x, p, false, v, i, &v, &i, sv, si);
                if (i >= p.n) break;
                cum += exp(((double)v - max) / p.temperature);
                kept = cum;
                if (cum >= cut) break;
            }
        }
        // Pass 3: the first of the kept prefix whose cumulative weight passes the threshold.
        double threshold = p.random * kept;
        i64 pick = mi;
        {
            float v = mv;
            i64 i = mi;
            cum = 0.0;
            for (i64 rank = 0; rank < k; ++rank) {
                if (rank > 0) next_in_order(x, p, false, v, i, &v, &i, sv, si);
                if (i >= p.n) break;
                pick = i;
                cum += exp(((double)v - max) / p.temperature);
                if (cum > threshold || cum >= kept) break;
            }
        }
        if (threadIdx.x == 0) out[r] = pick;
        __syncthreads();
    }
}
