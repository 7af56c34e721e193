// The attention op family: softmax(scale · Q·Kᵀ [causal]) · V with grouped-query heads
// (query head h reads kv head h / (hq / hkv)), online softmax in f32, no score matrix in
// memory.
// - `op_attention_flash` (f16 / bf16 on sm_80+ with d ≤ 128): flash-style on tensor cores, a
//   block of 4 warps per 64 consecutive queries of one (batch, head). Each warp owns 16 query
//   rows, their Q fragments held in registers; K and V stream through shared memory 64 keys
//   at a time (asynchronous 16-byte copies where rows are contiguous and aligned, V's copy
//   overlapping Q·Kᵀ and the next K's overlapping P·V; fragments read by ldmatrix); S = Q·Kᵀ
//   and O += P·V are `mma.sync.m16n8k16` tiles (P rounded to the input type, as flash
//   attention does; accumulation and the softmax statistics in f32), and the scores never
//   leave registers.
// - `op_attention_prefill` (elsewhere): SIMT, a block of 4 warps per 4 queries (a warp per
//   query row, lane l holding elements l, l + 32, … of q and of its accumulator); K and V
//   stream through shared memory 16 keys at a time.
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

#if (defined(UNIRT_DTYPE_F16) || defined(UNIRT_DTYPE_BF16)) && __CUDA_ARCH__ >= 800
#define UNIRT_FLASH 1
#endif

#define FLASH_WARPS 4 // per block, 16 query rows each (the planner's grid: lq / 64 blocks per head)
#define FLASH_QUERIES (16 * FLASH_WARPS)
#define FLASH_THREADS (32 * FLASH_WARPS)
#define FLASH_KEYS 64 // keys per tile
#define FLASH_D 128   // the largest head dimension of the tensor-core path
// Shared memory of either path of `op_attention_flash`: K and V tiles [64][128 + 8] as 16-bit
// values (the padding keeps ldmatrix reads off one bank), or the SIMT path's f32 K and V
// [16][256].
#define FLASH_SMEM 35840

// The keys row `r` sees: causal aligns the last query with the last key; rows past the
// queries see none.
__device__ __forceinline__ i64 keys_visible(const At &p, i64 r)
{
    if (r >= p.lq) return 0;
    i64 v = p.causal ? r + p.lkv - p.lq + 1 : p.lkv;
    return v > p.lkv ? p.lkv : (v < 0 ? 0 : v);
}

#ifdef UNIRT_FLASH
// Elements (r, c) and (r, c + 1) of a head's Q as one fragment register (0 outside).
__device__ __forceinline__ u32 q_pair(const T *q, const At &p, i64 r, int c)
{
    if (r >= p.lq) return 0;
    const T *row = q + r * p.q_st[2];
    u16 lo = c < p.d ? row[c * p.q_st[3]].bits : (u16)0;
    u16 hi = c + 1 < p.d ? row[(c + 1) * p.q_st[3]].bits : (u16)0;
    return pack2(lo, hi);
}

// Two f32 values rounded to T, as one fragment register: one conversion instruction (sm_80+).
__device__ __forceinline__ u32 packed(float lo, float hi)
{
    u32 r;
#ifdef UNIRT_DTYPE_BF16
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

#define FLASH_ROW (FLASH_D + 8) // 16-bit values per shared row: 272 bytes, so the 8 rows an
                                // ldmatrix phase reads start 4 banks apart (no conflicts)
typedef u16 FlashRow[FLASH_ROW];

// Keys j0 .. j0 + KT − 1 of K or V (rows of `st[2]`, elements of `st[3]`) into `tile` as
// [key][dim], zeros past the keys (and, on the strided path, past d). The direct path — unit
// element stride, rows 16-byte aligned, d = D — issues 16-byte asynchronous copies (the caller
// commits them as a group), each thread's pieces fixed at compile time (at first their
// address arithmetic took ~100 instructions a tile beside 4 copies); the strided path stores
// through registers.
template <int KT, int D>
__device__ __forceinline__ void flash_load(FlashRow *tile, const T *base, const i64 *st, i64 j0, const At &p, bool direct)
{
    if (direct) {
        // A pass of all threads covers ROWS whole rows; thread i's pieces lie in one column c,
        // rows j, j + ROWS, …: one source pointer stepped by ROWS rows, one shared address
        // with constant offsets, one comparison per piece.
        const int CHUNKS = D / 8, ROWS = FLASH_THREADS / CHUNKS; // 16-byte pieces per row
        static_assert(FLASH_THREADS % CHUNKS == 0 && KT % ROWS == 0, "whole rows per pass");
        int j = threadIdx.x / CHUNKS, c = (threadIdx.x % CHUNKS) * 8;
        i64 row = st[2];
        const T *src = base + (j0 + j) * row + c;
        i64 left = p.lkv - j0 - j; // this thread's pieces that exist: ROWS · i < left
        u32 dst = shared_address(&tile[j][c]);
#pragma unroll
        for (int i = 0; i < KT / ROWS; ++i) {
            bool in = ROWS * i < left;
            cp_async16_to(dst + i * ROWS * FLASH_ROW * 2, in ? src : base, in);
            src += ROWS * row;
        }
        return;
    }
    int d = (int)p.d;
    for (int e = threadIdx.x; e < KT * FLASH_D / 2; e += blockDim.x) {
        int j = e / (FLASH_D / 2), c = (e % (FLASH_D / 2)) * 2;
        i64 key = j0 + j;
        u16 lo = 0, hi = 0;
        if (key < p.lkv) {
            const T *row = base + key * st[2];
            if (c < d) lo = row[c * st[3]].bits;
            if (c + 1 < d) hi = row[(c + 1) * st[3]].bits;
        }
        *(u32 *)&tile[j][c] = pack2(lo, hi);
    }
}

// 2^x on the special-function unit, denormal results flushed to 0 (they are below what P's
// 16-bit rounding keeps).
__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// S = Q·Kᵀ for a warp's 16 rows × KT keys: KT / 8 n-tiles of 8 keys, each B fragment pair
// (16 dims × 2) from one ldmatrix of the [key][dim] tile.
template <int D, int KT>
__device__ __forceinline__ void flash_scores(float (&s)[KT / 8][4], const u32 (&qf)[D / 16][4], const FlashRow *ks, int lane)
{
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) {
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kp = 0; kp < D / 32; ++kp) {
            u32 bf[4];
            ldmatrix_x4(bf, &ks[n * 8 + (lane & 7)][kp * 32 + (lane >> 3) * 8]);
            mma_m16n8k16(T{}, s[n], qf[2 * kp], bf);
            mma_m16n8k16(T{}, s[n], qf[2 * kp + 1], bf + 2);
        }
    }
}

// The running softmax of a warp's two fragment rows over one tile of keys j0 .. j0 + KT − 1,
// the maxima `m` in log2 units: new maxima, rescale of the accumulators and sums, and the
// scores turned into the numerators P. A tile that needs no mask, with a positive scale
// (every real one), takes the maxima of the raw scores and one FMA per exponent; the others
// scale first, with −inf where the tile reaches past a row's visible keys.
template <int D, int KT>
__device__ __forceinline__ void flash_softmax(float (&s)[KT / 8][4], float (&o)[D / 8][4], float (&m)[2], float (&l)[2], i64 j0,
                                              bool masked, i64 vis0, i64 vis1, int t, float sl2)
{
    bool raw = !masked && sl2 > 0.0f; // the same for the whole block
    float mx0 = UNIRT_NEG_INF, mx1 = UNIRT_NEG_INF;
    if (!raw) {
#pragma unroll
        for (int n = 0; n < KT / 8; ++n) {
            i64 key = j0 + n * 8 + 2 * t;
            s[n][0] = key < vis0 ? s[n][0] * sl2 : UNIRT_NEG_INF;
            s[n][1] = key + 1 < vis0 ? s[n][1] * sl2 : UNIRT_NEG_INF;
            s[n][2] = key < vis1 ? s[n][2] * sl2 : UNIRT_NEG_INF;
            s[n][3] = key + 1 < vis1 ? s[n][3] * sl2 : UNIRT_NEG_INF;
        }
    }
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) {
        mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
        mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    if (raw) {
        // A positive scale keeps the order: the scaled maximum is the scaled raw one.
        mx0 *= sl2;
        mx1 *= sl2;
    }
    // A row's 4 threads hold its KT scores.
    mx0 = fmaxf(m[0], fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1)));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(m[1], fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1)));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // A row that has seen no key yet keeps max −inf: subtract 0 instead (every term is 0).
    float base0 = mx0 == UNIRT_NEG_INF ? 0.0f : mx0;
    float base1 = mx1 == UNIRT_NEG_INF ? 0.0f : mx1;
    // Where no row of the warp has a new maximum every correction is 1: skip the rescale.
    if (!__all_sync(0xffffffffu, mx0 == m[0] && mx1 == m[1])) {
        float c0 = fast_exp2(m[0] - base0), c1 = fast_exp2(m[1] - base1);
        // l: this thread's share of the row sums (its columns); the 4 shares add up at the end.
        l[0] *= c0;
        l[1] *= c1;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[n][0] *= c0;
            o[n][1] *= c0;
            o[n][2] *= c1;
            o[n][3] *= c1;
        }
    }
    m[0] = mx0;
    m[1] = mx1;
    if (raw) {
#pragma unroll
        for (int n = 0; n < KT / 8; ++n) {
            s[n][0] = fast_exp2(fmaf(s[n][0], sl2, -base0));
            s[n][1] = fast_exp2(fmaf(s[n][1], sl2, -base0));
            s[n][2] = fast_exp2(fmaf(s[n][2], sl2, -base1));
            s[n][3] = fast_exp2(fmaf(s[n][3], sl2, -base1));
        }
    } else {
#pragma unroll
        for (int n = 0; n < KT / 8; ++n) {
            s[n][0] = fast_exp2(s[n][0] - base0);
            s[n][1] = fast_exp2(s[n][1] - base0);
            s[n][2] = fast_exp2(s[n][2] - base1);
            s[n][3] = fast_exp2(s[n][3] - base1);
        }
    }
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) {
        l[0] += s[n][0] + s[n][1];
        l[1] += s[n][2] + s[n][3];
    }
}

// O += P·V: P's accumulator layout is the A fragment of this product (keys 16kk .. 16kk + 15
// are n-tiles 2kk and 2kk + 1); V's B fragments for two 8-dim n-tiles come from one
// transposing ldmatrix of the [key][dim] tile.
template <int D, int KT>
__device__ __forceinline__ void flash_pv(float (&o)[D / 8][4], const float (&s)[KT / 8][4], const FlashRow *vs, int lane)
{
#pragma unroll
    for (int kk = 0; kk < KT / 16; ++kk) {
        u32 pa[4] = {packed(s[2 * kk][0], s[2 * kk][1]), packed(s[2 * kk][2], s[2 * kk][3]),
                     packed(s[2 * kk + 1][0], s[2 * kk + 1][1]), packed(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
            u32 bf[4];
            ldmatrix_x4_trans(bf, &vs[kk * 16 + (lane & 15)][np * 16 + (lane >> 4) * 8]);
            mma_m16n8k16(T{}, o[2 * np], pa, bf);
            mma_m16n8k16(T{}, o[2 * np + 1], pa, bf + 2);
        }
    }
}

// The prefill of one block of 64 queries with the head dimension padded to `D` (64 or 128).
// K and V stream through shared memory 64 keys at a time, one tile of each: tile j's V copies
// while S = Q·Kⱼᵀ and its softmax run, and tile j + 1's K copies while O += P·Vⱼ runs. (Tried
// on an H100 beside it: 128 queries over 8 warps, and two stages of 32-key tiles with one
// barrier a tile, for 4 and 8 warps — each slower, docs/BENCHMARKS.md.) D is fixed at compile
// time, so every fragment loop unrolls into straight-line ldmatrix / mma code that ptxas can
// schedule (with the loops bounded at run time, each ldmatrix waited on its own and the kernel
// ran at 0.15× PyTorch on an H100). A smaller d is zero-padded to D on the strided load path.
template <int D>
__device__ __forceinline__ void flash_prefill(T *out, const T *Q, const T *K, const T *V, const At &p, unsigned char *smem)
{
    const int QUERIES = FLASH_QUERIES, KT = FLASH_KEYS;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    // The grid is (batch × head, query block), launched x first: every head's block of a
    // given length runs before any shorter one. Causal blocks late in the sequence see the
    // most keys, so they start first and the short ones fill the tail of the grid (ordered by
    // query block alone, 0.76 of the ideal balance at 2k tokens on 132 multiprocessors;
    // longest first over the whole grid, 0.97).
    i64 bh = blockIdx.x, bi = bh / p.hq, h = bh % p.hq, kh = h / (p.hq / p.hkv);
    i64 qblock = p.causal ? (i64)gridDim.y - 1 - blockIdx.y : (i64)blockIdx.y;
    i64 q0 = qblock * QUERIES;
    const int d = (int)p.d;
    // This thread's two rows of the warp's 16 (fragment rows g and g + 8).
    i64 r0 = q0 + warp * 16 + g, r1 = r0 + 8;
    i64 vis0 = keys_visible(p, r0), vis1 = keys_visible(p, r1);
    i64 last = q0 + QUERIES - 1 < p.lq ? q0 + QUERIES - 1 : p.lq - 1;
    i64 block_visible = keys_visible(p, last);
    // Tiles wholly below every row's limit need no mask (the first row sees the fewest keys).
    i64 unmasked = q0 + QUERIES <= p.lq ? keys_visible(p, q0) : 0;
    const T *qb = Q + bi * p.q_st[0] + h * p.q_st[1];
    const T *kb = K + bi * p.k_st[0] + kh * p.k_st[1];
    const T *vb = V + bi * p.v_st[0] + kh * p.v_st[1];
    bool direct = d == D && p.k_st[3] == 1 && p.v_st[3] == 1 && p.k_st[2] % 8 == 0 && p.v_st[2] % 8 == 0 &&
                  aligned_to(kb, 16) && aligned_to(vb, 16);
    u32 qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        int c = kk * 16 + 2 * t;
        qf[kk][0] = q_pair(qb, p, r0, c);
        qf[kk][1] = q_pair(qb, p, r1, c);
        qf[kk][2] = q_pair(qb, p, r0, c + 8);
        qf[kk][3] = q_pair(qb, p, r1, c + 8);
    }
    // Scores in log2 units: exp2 of (s − max) is the softmax numerator.
    float sl2 = (float)p.scale * 1.4426950408889634f;
    float m[2] = {UNIRT_NEG_INF, UNIRT_NEG_INF}, l[2] = {0.0f, 0.0f};
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float s[KT / 8][4];
    FlashRow *ks = (FlashRow *)smem, *vs = (FlashRow *)(smem + KT * sizeof(FlashRow));
    if (block_visible > 0) {
        flash_load<KT, D>(ks, kb, p.k_st, 0, p, direct);
        cp_async_commit();
    }
    for (i64 j0 = 0; j0 < block_visible; j0 += KT) {
        flash_load<KT, D>(vs, vb, p.v_st, j0, p, direct);
        cp_async_commit();
        cp_async_wait<1>(); // Kⱼ (every group but Vⱼ's) has landed
        __syncthreads();
        flash_scores<D, KT>(s, qf, ks, lane);
        flash_softmax<D, KT>(s, o, m, l, j0, j0 + KT > unmasked, vis0, vis1, t, sl2);
        cp_async_wait<0>(); // Vⱼ has landed
        __syncthreads();    // every warp is done with Kⱼ and sees Vⱼ
        if (j0 + KT < block_visible) {
            flash_load<KT, D>(ks, kb, p.k_st, j0 + KT, p, direct);
            cp_async_commit();
        }
        flash_pv<D, KT>(o, s, vs, lane);
        __syncthreads(); // every warp is done with Vⱼ before the next tile's copies
    }
    float l0 = l[0], l1 = l[1];
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    // A row with no visible key is 0, as in the reference.
    float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    T *ob = out + bi * p.o_st[0] + h * p.o_st[1];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        int c = n * 8 + 2 * t;
        if (r0 < p.lq) {
            T *row = ob + r0 * p.o_st[2];
            if (c < d) row[c * p.o_st[3]] = from_f32<T>(o[n][0] * inv0);
            if (c + 1 < d) row[(c + 1) * p.o_st[3]] = from_f32<T>(o[n][1] * inv0);
        }
        if (r1 < p.lq) {
            T *row = ob + r1 * p.o_st[2];
            if (c < d) row[c * p.o_st[3]] = from_f32<T>(o[n][2] * inv1);
            if (c + 1 < d) row[(c + 1) * p.o_st[3]] = from_f32<T>(o[n][3] * inv1);
        }
    }
}
#endif

// One key of a warp's online softmax on SIMT cores: lane l holds elements l, l + 32, … of the
// (scaled) query and of the accumulator; the key's row `krow` and value row `vrow` are read
// at element strides `kst` and `vst` (from shared memory or global). Updates the running
// max `m` and sum `l`.
template <typename E>
__device__ __forceinline__ void simt_key_step(const float (&q)[MAX_PER_LANE], float (&acc)[MAX_PER_LANE], float &m, float &l,
                                              const E *krow, i64 kst, const E *vrow, i64 vst, i64 d)
{
    int lane = threadIdx.x & 31;
    float s = 0.0f;
    for (int e = 0; e < MAX_PER_LANE; ++e) {
        i64 c = lane + 32 * e;
        if (c < d) s += q[e] * to_f32(krow[c * kst]);
    }
    s = warp_sum(s);
    float mn = fmaxf(m, s);
    float corr = expf(m - mn), w = expf(s - mn);
    l = l * corr + w;
    for (int e = 0; e < MAX_PER_LANE; ++e) {
        i64 c = lane + 32 * e;
        if (c < d) acc[e] = acc[e] * corr + w * to_f32(vrow[c * vst]);
    }
    m = mn;
}

// The SIMT prefill of queries first .. first + 3 (a warp each) of (batch, head) `bh`.
__device__ __forceinline__ void simt_prefill(T *out, const T *Q, const T *K, const T *V, const At &p, i64 bh, i64 first,
                                             unsigned char *smem)
{
    float (*ks)[256] = (float (*)[256])smem;
    float (*vs)[256] = (float (*)[256])(smem + KEYS * 256 * sizeof(float));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    i64 bi = bh / p.hq, h = bh % p.hq, kh = h / (p.hq / p.hkv);
    i64 qi = first + warp;
    bool active = qi < p.lq;
    float scale = (float)p.scale;
    float q[MAX_PER_LANE], acc[MAX_PER_LANE];
    const T *qrow = Q + bi * p.q_st[0] + h * p.q_st[1] + (active ? qi : 0) * p.q_st[2];
    for (int e = 0; e < MAX_PER_LANE; ++e) {
        i64 c = lane + 32 * e;
        q[e] = (active && c < p.d) ? to_f32(qrow[c * p.q_st[3]]) * scale : 0.0f;
        acc[e] = 0.0f;
    }
    // Keys this query sees, and the most any query of the four sees.
    i64 visible = keys_visible(p, qi);
    i64 last_q = first + PREFILL_WARPS - 1 < p.lq ? first + PREFILL_WARPS - 1 : p.lq - 1;
    i64 block_visible = keys_visible(p, last_q);
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
        for (int j = 0; j < KEYS && j0 + j < visible; ++j) simt_key_step(q, acc, m, l, ks[j], 1, vs[j], 1, p.d);
    }
    if (!active) return;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    T *orow = out + bi * p.o_st[0] + h * p.o_st[1] + qi * p.o_st[2];
    for (int e = 0; e < MAX_PER_LANE; ++e) {
        i64 c = lane + 32 * e;
        if (c < p.d) orow[c * p.o_st[3]] = from_f32<T>(acc[e] * inv);
    }
}

extern "C" __global__ void __launch_bounds__(128) op_attention_prefill(T *out, const T *Q, const T *K, const T *V, At p)
{
    __shared__ __align__(16) unsigned char smem[2 * KEYS * 256 * sizeof(float)];
    simt_prefill(out, Q, K, V, p, blockIdx.y, (i64)blockIdx.x * PREFILL_WARPS, smem);
}

// 64 queries a block on SIMT cores, 4 at a time: the flash entries' path where a build has no
// tensor cores (f32, sm_70). The grid is the flash one: (batch × head, query block).
__device__ __forceinline__ void flash_on_simt(T *out, const T *Q, const T *K, const T *V, const At &p, unsigned char *smem)
{
    for (int i = 0; i < FLASH_QUERIES / PREFILL_WARPS; ++i) {
        i64 first = (i64)blockIdx.y * FLASH_QUERIES + i * PREFILL_WARPS;
        if (first >= p.lq) break; // the same for the whole block
        // The previous group's last reads of the shared tiles are done before this one loads.
        __syncthreads();
        simt_prefill(out, Q, K, V, p, blockIdx.x, first, smem);
    }
}

// 64 queries a block: on tensor cores where this build has them (f16 / bf16, sm_80+) and
// d ≤ 128, else on SIMT cores — correct in every build; the planner picks them where the
// tensor-core path applies. `op_attention_flash` pads d to 128; `op_attention_flash_d64`
// pads d ≤ 64 to 64, at half the cost and registers, and has no SIMT fallback (with one it
// kept arrays in local memory): the planner launches it for d ≤ 64 in tensor-core builds only
// (a larger d would read and write only its first 64 dimensions — never out of bounds).
#ifdef UNIRT_FLASH
#define FLASH_ENTRY(name, D, fits)                                                                                        \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS) name(T *out, const T *Q, const T *K, const T *V, At p) \
    {                                                                                                                     \
        __shared__ __align__(16) unsigned char smem[FLASH_SMEM];                                                          \
        if (fits) flash_prefill<D>(out, Q, K, V, p, smem);                                                                \
        else flash_on_simt(out, Q, K, V, p, smem);                                                         \
    }
#else
#define FLASH_ENTRY(name, D, fits)                                                                                        \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS) name(T *out, const T *Q, const T *K, const T *V, At p) \
    {                                                                                                                     \
        __shared__ __align__(16) unsigned char smem[FLASH_SMEM];                                                          \
        flash_on_simt(out, Q, K, V, p, smem);                                                              \
    }
#endif
FLASH_ENTRY(op_attention_flash, 128, p.d <= FLASH_D)
FLASH_ENTRY(op_attention_flash_d64, 64, true)

// Split-K decode, pass 1, vectorised: unit-stride K and V rows aligned to 16 bytes, d a power
// of two with d / EPL ≤ 32. A key's row is read by d / EPL lanes (a group), 16 bytes each, so
// a warp reads 32 · EPL / d keys per step, and DECODE_UNROLL steps are in flight at once;
// each group runs its own online softmax over its keys, then the groups of a warp merge
// through shuffles. Leaves the warp's (max, sum, accumulators) in `part_*`.
#define DECODE_UNROLL 4
#define EPL (16 / (int)sizeof(T)) // elements per lane: one 16-byte load

__device__ __forceinline__ bool decode_vectorised(const At &p, const T *kb, const T *vb)
{
    return p.k_st[3] == 1 && p.v_st[3] == 1 && p.d >= EPL && p.d <= 32 * EPL && (p.d & (p.d - 1)) == 0 &&
           p.k_st[2] % EPL == 0 && p.v_st[2] % EPL == 0 && aligned_to(kb, 16) && aligned_to(vb, 16);
}

__device__ __forceinline__ void decode_chunk_vectorised(const T *qrow, const T *kb, const T *vb, const At &p, i64 j0, i64 j1,
                                                        float (*part_acc)[256], float *part_m, float *part_l)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int lpk = (int)p.d / EPL, kps = 32 / lpk; // lanes per key, keys per warp step
    int grp = lane / lpk, li = lane % lpk;    // this lane: key kps·step + grp, dims li·EPL ..
    float scale = (float)p.scale;
    float q[EPL], acc[EPL];
#pragma unroll
    for (int e = 0; e < EPL; ++e) {
        q[e] = to_f32(qrow[(i64)(li * EPL + e) * p.q_st[3]]) * scale;
        acc[e] = 0.0f;
    }
    float m = UNIRT_NEG_INF, l = 0.0f;
    i64 step = (i64)DECODE_WARPS * kps; // keys per step of the whole block
    // The loop runs the same rounds in every lane of a warp (shuffles below need all 32).
    for (i64 jw = j0 + (i64)warp * kps; jw < j1; jw += DECODE_UNROLL * step) {
        Pack<T, EPL> kv[DECODE_UNROLL], vv[DECODE_UNROLL];
        float s[DECODE_UNROLL];
#pragma unroll
        for (int u = 0; u < DECODE_UNROLL; ++u) {
            i64 j = jw + u * step + grp;
            bool in = j < j1;
            if (in) {
                kv[u] = *(const Pack<T, EPL> *)(kb + j * p.k_st[2] + li * EPL);
                vv[u] = *(const Pack<T, EPL> *)(vb + j * p.v_st[2] + li * EPL);
            }
            float d = 0.0f;
            if (in) {
#pragma unroll
                for (int e = 0; e < EPL; ++e) d += q[e] * to_f32(kv[u].v[e]);
            }
            s[u] = d;
        }
#pragma unroll
        for (int u = 0; u < DECODE_UNROLL; ++u) {
            for (int o = lpk >> 1; o > 0; o >>= 1) s[u] += __shfl_xor_sync(0xffffffffu, s[u], o);
            if (jw + u * step + grp >= j1) s[u] = UNIRT_NEG_INF;
        }
        float mn = m;
#pragma unroll
        for (int u = 0; u < DECODE_UNROLL; ++u) mn = fmaxf(mn, s[u]);
        // A group past the chunk's end has seen no key: every weight is 0.
        float base = mn == UNIRT_NEG_INF ? 0.0f : mn;
        float corr = expf(m - base);
        l *= corr;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[e] *= corr;
#pragma unroll
        for (int u = 0; u < DECODE_UNROLL; ++u) {
            float w = expf(s[u] - base);
            if (w > 0.0f) {
                l += w;
#pragma unroll
                for (int e = 0; e < EPL; ++e) acc[e] += w * to_f32(vv[u].v[e]);
            }
        }
        m = mn;
    }
    // Merge the warp's groups: lanes li of groups g and g ^ (o / lpk) hold the same dims.
    for (int o = lpk; o < 32; o <<= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
        float mn = fmaxf(m, m2), base = mn == UNIRT_NEG_INF ? 0.0f : mn;
        float c1 = expf(m - base), c2 = expf(m2 - base);
        l = l * c1 + l2 * c2;
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
            float a2 = __shfl_xor_sync(0xffffffffu, acc[e], o);
            acc[e] = acc[e] * c1 + a2 * c2;
        }
        m = mn;
    }
    if (grp == 0) {
#pragma unroll
        for (int e = 0; e < EPL; ++e) part_acc[warp][li * EPL + e] = acc[e];
    }
    if (lane == 0) {
        part_m[warp] = m;
        part_l[warp] = l;
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
    const T *qrow = Q + bi * p.q_st[0] + h * p.q_st[1];
    // One query over lkv keys: causal or not, every key is visible.
    const T *kbase = K + bi * p.k_st[0] + kh * p.k_st[1];
    const T *vbase = V + bi * p.v_st[0] + kh * p.v_st[1];
    i64 chunk = (p.lkv + splits - 1) / splits;
    i64 j0 = split * chunk, j1 = j0 + chunk < p.lkv ? j0 + chunk : p.lkv;
    if (decode_vectorised(p, kbase, vbase)) {
        decode_chunk_vectorised(qrow, kbase, vbase, p, j0, j1, part_acc, part_m, part_l);
    } else {
        float scale = (float)p.scale;
        float q[MAX_PER_LANE], acc[MAX_PER_LANE];
        for (int e = 0; e < MAX_PER_LANE; ++e) {
            i64 c = lane + 32 * e;
            q[e] = c < p.d ? to_f32(qrow[c * p.q_st[3]]) * scale : 0.0f;
            acc[e] = 0.0f;
        }
        float m = UNIRT_NEG_INF, l = 0.0f;
        for (i64 j = j0 + warp; j < j1; j += DECODE_WARPS)
            simt_key_step(q, acc, m, l, kbase + j * p.k_st[2], p.k_st[3], vbase + j * p.v_st[2], p.v_st[3], p.d);
        for (int e = 0; e < MAX_PER_LANE; ++e) {
            i64 c = lane + 32 * e;
            if (c < p.d) part_acc[warp][c] = acc[e];
        }
        if (lane == 0) {
            part_m[warp] = m;
            part_l[warp] = l;
        }
    }
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
