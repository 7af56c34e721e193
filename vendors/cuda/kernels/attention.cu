// The attention op family: softmax(scale · Q·Kᵀ [causal]) · V with grouped-query heads
// (query head h reads kv head h / (hq / hkv)), online softmax in f32, no score matrix in
// memory.
// - `op_attention_prefill`: flash-style; a block of 4 warps takes 4 consecutive queries of
//   one (batch, head), each warp one query row (lane l holds elements l, l + 32, … of q and
//   of its accumulator); K and V stream through shared memory 16 keys at a time.
// - `op_attention_decode` + `op_attention_combine` (one query): split-K over the cache — a
//   block per (key chunk, batch × head) runs the online softmax over its chunk (its 4 warps
//   taking every 4th key, merged through shared memory) and writes a partial (max, sum,
//   accumulators) to the plan's workspace; the combine pass merges a row's partials.
// d ≤ 256 (checked by the planner).

struct At {
    i64 b, hq, hkv, lq, lkv, d;
    i64 q_st[4], k_st[4], v_st[4], o_st[4];
    i64 causal;
    double scale;
    i64 splits; // key chunks of the split-K decode
};

#define MAX_PER_LANE 8
#define KEYS 16
#define PREFILL_WARPS 4
#define DECODE_WARPS 4

extern "C" __global__ void __launch_bounds__(128) op_attention_prefill(T *out, const T *Q, const T *K, const T *V, At p)
{
    __shared__ float ks[KEYS][256];
    __shared__ float vs[KEYS][256];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    i64 bh = blockIdx.y, bi = bh / p.hq, h = bh % p.hq, kh = h / (p.hq / p.hkv);
    i64 qi = (i64)blockIdx.x * PREFILL_WARPS + warp;
    bool active = qi < p.lq;
    float scale = (float)p.scale;
    float q[MAX_PER_LANE], acc[MAX_PER_LANE];
    const T *qrow = Q + bi * p.q_st[0] + h * p.q_st[1] + (active ? qi : 0) * p.q_st[2];
    for (int e = 0; e < MAX_PER_LANE; ++e) {
        i64 c = lane + 32 * e;
        q[e] = (active && c < p.d) ? to_f32(qrow[c * p.q_st[3]]) * scale : 0.0f;
        acc[e] = 0.0f;
    }
    // Keys this query sees, and the most any query of the block sees.
    i64 visible = p.causal ? qi + p.lkv - p.lq + 1 : p.lkv;
    if (visible > p.lkv) visible = p.lkv;
    i64 last_q = (i64)blockIdx.x * PREFILL_WARPS + PREFILL_WARPS - 1;
    if (last_q >= p.lq) last_q = p.lq - 1;
    i64 block_visible = p.causal ? last_q + p.lkv - p.lq + 1 : p.lkv;
    if (block_visible > p.lkv) block_visible = p.lkv;
    float m = UNIRT_NEG_INF, l = 0.0f;
    const T *kbase = K + bi * p.k_st[0] + kh * p.k_st[1];
    const T *vbase = V + bi * p.v_st[0] + kh * p.v_st[1];
    for (i64 j0 = 0; j0 < block_visible; j0 += KEYS) {
        __syncthreads();
        for (i64 e = threadIdx.x; e < KEYS * p.d; e += blockDim.x) {
            i64 j = e / p.d, c = e % p.d;
            bool in = j0 + j < p.lkv;
            ks[j][c] = in ? to_f32(kbase[(j0 + j) * p.k_st[2] + c * p.k_st[3]]) : 0.0f;
            vs[j][c] = in ? to_f32(vbase[(j0 + j) * p.v_st[2] + c * p.v_st[3]]) : 0.0f;
        }
        __syncthreads();
        if (!active) continue;
        for (int j = 0; j < KEYS && j0 + j < visible; ++j) {
            float s = 0.0f;
            for (int e = 0; e < MAX_PER_LANE; ++e) {
                i64 c = lane + 32 * e;
                if (c < p.d) s += q[e] * ks[j][c];
            }
            s = warp_sum(s);
            float mn = fmaxf(m, s);
            float corr = expf(m - mn), w = expf(s - mn);
            l = l * corr + w;
            for (int e = 0; e < MAX_PER_LANE; ++e) {
                i64 c = lane + 32 * e;
                if (c < p.d) acc[e] = acc[e] * corr + w * vs[j][c];
            }
            m = mn;
        }
    }
    if (!active) return;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    T *orow = out + bi * p.o_st[0] + h * p.o_st[1] + qi * p.o_st[2];
    for (int e = 0; e < MAX_PER_LANE; ++e) {
        i64 c = lane + 32 * e;
        if (c < p.d) orow[c * p.o_st[3]] = from_f32<T>(acc[e] * inv);
    }
}

// Split-K decode, pass 1: block (split, bh) runs the online softmax of its 4 warps over keys
// [split·chunk, (split+1)·chunk) and writes the merged partial (max, sum, d accumulators) to
// `ws` at [(bh · splits + split) · (d + 2)].
extern "C" __global__ void __launch_bounds__(128) op_attention_decode(float *ws, const T *Q, const T *K, const T *V, At p)
{
    __shared__ float part_acc[DECODE_WARPS][256];
    __shared__ float part_m[DECODE_WARPS], part_l[DECODE_WARPS];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    i64 split = blockIdx.x, splits = p.splits;
    i64 bh = blockIdx.y, bi = bh / p.hq, h = bh % p.hq, kh = h / (p.hq / p.hkv);
    float scale = (float)p.scale;
    float q[MAX_PER_LANE], acc[MAX_PER_LANE];
    const T *qrow = Q + bi * p.q_st[0] + h * p.q_st[1];
    for (int e = 0; e < MAX_PER_LANE; ++e) {
        i64 c = lane + 32 * e;
        q[e] = c < p.d ? to_f32(qrow[c * p.q_st[3]]) * scale : 0.0f;
        acc[e] = 0.0f;
    }
    // One query over lkv keys: causal or not, every key is visible.
    const T *kbase = K + bi * p.k_st[0] + kh * p.k_st[1];
    const T *vbase = V + bi * p.v_st[0] + kh * p.v_st[1];
    i64 chunk = (p.lkv + splits - 1) / splits;
    i64 j0 = split * chunk, j1 = j0 + chunk < p.lkv ? j0 + chunk : p.lkv;
    float m = UNIRT_NEG_INF, l = 0.0f;
    for (i64 j = j0 + warp; j < j1; j += DECODE_WARPS) {
        const T *krow = kbase + j * p.k_st[2];
        const T *vrow = vbase + j * p.v_st[2];
        float s = 0.0f;
        for (int e = 0; e < MAX_PER_LANE; ++e) {
            i64 c = lane + 32 * e;
            if (c < p.d) s += q[e] * to_f32(krow[c * p.k_st[3]]);
        }
        s = warp_sum(s);
        float mn = fmaxf(m, s);
        float corr = expf(m - mn), w = expf(s - mn);
        l = l * corr + w;
        for (int e = 0; e < MAX_PER_LANE; ++e) {
            i64 c = lane + 32 * e;
            if (c < p.d) acc[e] = acc[e] * corr + w * to_f32(vrow[c * p.v_st[3]]);
        }
        m = mn;
    }
    for (int e = 0; e < MAX_PER_LANE; ++e) {
        i64 c = lane + 32 * e;
        if (c < p.d) part_acc[warp][c] = acc[e];
    }
    if (lane == 0) { part_m[warp] = m; part_l[warp] = l; }
    __syncthreads();
    float mg = UNIRT_NEG_INF;
    for (int w = 0; w < DECODE_WARPS; ++w) mg = fmaxf(mg, part_m[w]);
    float *out = ws + (bh * splits + split) * (p.d + 2);
    if (threadIdx.x == 0) {
        float lg = 0.0f;
        for (int w = 0; w < DECODE_WARPS; ++w) lg += part_l[w] > 0.0f ? part_l[w] * expf(part_m[w] - mg) : 0.0f;
        out[0] = mg;
        out[1] = lg;
    }
    for (i64 c = threadIdx.x; c < p.d; c += blockDim.x) {
        float s = 0.0f;
        for (int w = 0; w < DECODE_WARPS; ++w)
            if (part_l[w] > 0.0f) s += part_acc[w][c] * expf(part_m[w] - mg);
        out[2 + c] = s;
    }
}

// Split-K decode, pass 2: block bh merges its `splits` partials from `ws` into the output row.
extern "C" __global__ void __launch_bounds__(128) op_attention_combine(T *out, const float *ws, const T *unused_k, const T *unused_v, At p)
{
    i64 splits = p.splits;
    i64 bh = blockIdx.x, bi = bh / p.hq, h = bh % p.hq;
    const float *part = ws + bh * splits * (p.d + 2);
    float mg = UNIRT_NEG_INF;
    for (i64 s = 0; s < splits; ++s)
        if (part[s * (p.d + 2) + 1] > 0.0f) mg = fmaxf(mg, part[s * (p.d + 2)]);
    float lg = 0.0f;
    for (i64 s = 0; s < splits; ++s) {
        float l = part[s * (p.d + 2) + 1];
        if (l > 0.0f) lg += l * expf(part[s * (p.d + 2)] - mg);
    }
    float inv = lg > 0.0f ? 1.0f / lg : 0.0f;
    T *orow = out + bi * p.o_st[0] + h * p.o_st[1];
    for (i64 c = threadIdx.x; c < p.d; c += blockDim.x) {
        float acc = 0.0f;
        for (i64 s = 0; s < splits; ++s) {
            const float *ps = part + s * (p.d + 2);
            if (ps[1] > 0.0f) acc += ps[2 + c] * expf(ps[0] - mg);
        }
        orow[c * p.o_st[3]] = from_f32<T>(acc * inv);
    }
}
