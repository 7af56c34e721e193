// The sample op family: random_sample over the last dimension, one block per row, the same
// rule as the CPU (ops::sample): greedy when temperature is 0 or top_k is 1; otherwise the
// top_k logits in descending order (ties by index), softmax weights exp((x − max) / T) in
// f64, cut at the first cumulative weight ≥ top_p · total, and the first cumulative weight
// above random · (the kept total) wins.
//
// No sort and no workspace. For a small top_k (≤ SAMPLE_WALK) the sorted order is walked rank
// by rank (each rank one block-wide search for the next element in the order): O(k · vocab /
// threads) per row. For a larger one (top_k = 0: nucleus sampling over the whole vocabulary,
// where the walk took O(vocab² / threads)) every cut of the rule — the top k, the top-p
// prefix, the draw — is the first place in the order where a prefix's count or weight passes
// a target; both grow with the prefix's last element (each thread adds its elements in index
// order, the block combines threads in a fixed tree, and no term is negative), so each cut is
// found by bisection: over a 32-bit key that orders the logits, then over the index among
// equal logits, one sweep of the row and one block sum per step — O((32 + log2 vocab) ·
// vocab / threads), as the WGSL sampler does.

struct Smp {
    Space rows;
    Strides si;
    i64 n, st;
    double random, temperature, top_p;
    i64 top_k;
};

#define SAMPLE_THREADS 256
// The largest top_k whose order is walked rank by rank; above it, bisection.
#define SAMPLE_WALK 48

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

// The weight of logit v in a row of maximum `max` (see `ops::sample`): NaN 0; the maximum 1
// (+inf and -inf included); one infinitely below it 0 at every temperature (-inf / inf would
// be NaN); else exp((v - max) / T).
__device__ __forceinline__ double sample_weight(float v, double max, double t)
{
    if (v != v) return 0.0;
    double d = (double)v - max;
    if ((double)v == max) return 1.0;
    if (d < -1.7976931348623157e308) return 0.0;
    return exp(d / t);
}

// A logit's place in the order as one u32, ties left to the index: a larger logit gives a
// smaller key; -0 and +0 the same key, NaN the last.
__device__ __forceinline__ unsigned order_key(float v)
{
    if (v != v) return 0xffffffffu;
    if (v == 0.0f) v = 0.0f;
    unsigned b = __float_as_uint(v);
    return ~((b & 0x80000000u) ? ~b : (b | 0x80000000u));
}

// The count and the weight (`sample_weight`) of the row's elements at or before key (ku, ki)
// in the order; every thread gets the same values (the block sums combine in one fixed tree,
// the same for every thread). Without `weigh` (the same in every thread: a count's search)
// the weight is left at 0, and no exp is taken.
__device__ void order_prefix(const T *x, const Smp &p, double max, unsigned ku, i64 ki,
                             bool weigh, double *sd, double *count, double *weight)
{
    double c = 0.0, w = 0.0;
    for (i64 j = threadIdx.x; j < p.n; j += blockDim.x) {
        float v = to_f32(x[j * p.st]);
        unsigned u = order_key(v);
        if (u < ku || (u == ku && j <= ki)) {
            c += 1.0;
            if (weigh) w += sample_weight(v, max, p.temperature);
        }
    }
    *count = block_sum_f64(c, sd);
    *weight = weigh ? block_sum_f64(w, sd) : 0.0;
}

// The first key in the order whose prefix passes `mode`'s test (0 count ≥ goal, 1 weight ≥
// goal, 2 weight > goal; the whole row must pass), by bisection over the order key, then over
// the index among elements with that key. The loops' conditions are the same in every thread.
__device__ void order_search(const T *x, const Smp &p, double max, int mode, double goal,
                             double *sd, unsigned *key, i64 *index)
{
    unsigned lo = 0, hi = 0xffffffffu;
    while (lo < hi) {
        unsigned mid = lo + ((hi - lo) >> 1);
        double c, w;
        order_prefix(x, p, max, mid, 0x7fffffffffffffffLL, mode != 0, sd, &c, &w);
        bool ok = mode == 0 ? c >= goal : (mode == 1 ? w >= goal : w > goal);
        if (ok) hi = mid; else lo = mid + 1;
    }
    i64 ilo = 0, ihi = p.n - 1;
    while (ilo < ihi) {
        i64 mid = ilo + ((ihi - ilo) >> 1);
        double c, w;
        order_prefix(x, p, max, lo, mid, mode != 0, sd, &c, &w);
        bool ok = mode == 0 ? c >= goal : (mode == 1 ? w >= goal : w > goal);
        if (ok) ihi = mid; else ilo = mid + 1;
    }
    *key = lo;
    *index = ilo;
}

// Whether key (au, ai) comes after (bu, bi) in the order.
__device__ __forceinline__ bool key_after(unsigned au, i64 ai, unsigned bu, i64 bi)
{
    return au > bu || (au == bu && ai > bi);
}

// The pick of one row for k > SAMPLE_WALK (see the top of the file).
__device__ i64 pick_by_bisection(const T *x, const Smp &p, i64 k, double max, double *sd)
{
    unsigned ku = 0xffffffffu;
    i64 ki = 0x7fffffffffffffffLL;
    if (k < p.n) order_search(x, p, max, 0, (double)k, sd, &ku, &ki);
    double c, total;
    order_prefix(x, p, max, ku, ki, true, sd, &c, &total);
    unsigned lu = ku;
    i64 li = ki;
    if (p.top_p < 1.0) {
        unsigned u;
        i64 i;
        order_search(x, p, max, 1, p.top_p * total, sd, &u, &i);
        if (!key_after(u, i, lu, li)) { lu = u; li = i; }
    }
    double kept;
    order_prefix(x, p, max, lu, li, true, sd, &c, &kept);
    unsigned u;
    i64 i;
    order_search(x, p, max, 2, p.random * kept, sd, &u, &i);
    if (key_after(u, i, lu, li)) i = li;
    return i;
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
        // Every logit NaN: they weigh nothing, and the first is drawn (as greedy picks it).
        bool all_nan = mi >= p.n;
        if (all_nan) mi = 0;
        if (p.temperature == 0.0 || p.top_k == 1 || all_nan) {
            if (threadIdx.x == 0) out[r] = mi;
            __syncthreads();
            continue;
        }
        i64 k = (p.top_k == 0 || p.top_k > p.n) ? p.n : p.top_k;
        double max = (double)mv;
        if (k > SAMPLE_WALK) {
            i64 pick = pick_by_bisection(x, p, k, max, sd);
            if (threadIdx.x == 0) out[r] = pick < p.n ? pick : mi;
            __syncthreads();
            continue;
        }
        // Pass 1: the total weight of the top k.
        double total = 0.0;
        if (k == p.n) {
            double s = 0.0;
            for (i64 j = threadIdx.x; j < p.n; j += blockDim.x) {
                float v = to_f32(x[j * p.st]);
                s += sample_weight(v, max, p.temperature);
            }
            total = block_sum_f64(s, sd);
        } else {
            float v = mv;
            i64 i = mi;
            for (i64 rank = 0; rank < k; ++rank) {
                if (rank > 0) next_in_order(x, p, false, v, i, &v, &i, sv, si);
                if (i >= p.n) break;
                total += sample_weight(v, max, p.temperature);
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
                cum += sample_weight(v, max, p.temperature);
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
                cum += sample_weight(v, max, p.temperature);
                if (cum > threshold || cum >= kept) break;
            }
        }
        if (threadIdx.x == 0) out[r] = pick;
        __syncthreads();
    }
}
