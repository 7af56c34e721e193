// The matmul op family: C = alpha·A·B + beta·C over broadcast batches, any strides (where
// cuBLAS is absent, off, or refuses the layout). `op_matmul`: 64×64 output tiles per block of
// 256 threads (grid x: columns, y: rows, z: batches), any strides:
// - f32 (and f16 / bf16 below sm_80): a tiled SIMT GEMM, 16-deep K tiles in shared memory,
//   4×4 outputs per thread.
// - f16 / bf16 on sm_80+: tensor cores through PTX `mma.sync.m16n8k16` (f32 accumulate),
//   8 warps each computing 32×16 of the tile.
// `op_matmul_mma` (below): 128×128 tiles on tensor cores through a cp.async pipeline, for
// f16 / bf16 on sm_80+ where the strides allow 16-byte copies — the planner's choice there.
// beta == 0 never reads C (it may hold NaN).
//
// matmul_epilogue: the source generated for an epilogue program (matmul.rs) puts the
// elementwise functions and the program's `Chain` / `chain` (fused.rs) before this file,
// defines EPI_EXTRAS (the extra operands the program reads, 0 to EPI_MAX) and
// `epilogue_of(c, x)` (the program over x[0], the product, and x[1 ..], the extras), and sets
// UNIRT_EPILOGUE to pick the kernel it holds instead of op_matmul:
// - 1: `op_matmul_epilogue`, the GEMM above with the epilogue in its store: each thread
//   stores its products exactly as op_matmul does, then reads each back (in the dtype, as the
//   unfused operators read a matmul's output) and stores the program's result over it;
// - 2: `op_epilogue`, the program alone over a product already stored (by cuBLAS), in place
//   or from a workspace.
// Either way the result is bitwise op_matmul's (or cuBLAS's) product followed by the unfused
// elementwise kernels.

struct Mm {
    Space batch;
    Strides sa, sb, sc;
    i64 m, n, k, a_sm, a_sk, b_sk, b_sn, c_sm, c_sn;
    double alpha, beta;
};

#define TILE 64
#define KT 16

__device__ __forceinline__ void store_c(T *c, const Mm &p, i64 r, i64 col, float v)
{
    if (r >= p.m || col >= p.n) return;
    T *dst = c + r * p.c_sm + col * p.c_sn;
    float out = (float)p.alpha * v;
    if (p.beta != 0.0) out += (float)p.beta * to_f32(*dst);
    *dst = from_f32<T>(out);
}

// What a GEMM kernel does once a thread has stored its 16 elements of a batch's tile:
// nothing (op_matmul), or the epilogue (op_matmul_epilogue). `batch(p, z)` is called first,
// then `at(c, p, r, col)` for each element (any inside the product; the loop is not unrolled,
// so the epilogue's code appears once).
struct NoEpilogue {
    enum { on = 0 };
    __device__ __forceinline__ void batch(const Mm &, i64) {}
    __device__ __forceinline__ void at(T *, const Mm &, i64, i64) const {}
};

#if (defined(UNIRT_DTYPE_F16) || defined(UNIRT_DTYPE_BF16)) && __CUDA_ARCH__ >= 800
#define UNIRT_MMA 1
#endif

#ifdef UNIRT_MMA

template <class Epi>
__device__ __forceinline__ void matmul_tiles(const T *A, const T *B, T *C, const Mm &p, Epi &epi)
{
    // +8 halves of padding per row keep the fragment reads off one bank.
    __shared__ u16 As[TILE][KT + 8];
    __shared__ u16 Bs[KT][TILE + 8];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, t = lane & 3;
    int wm = warp >> 1, wn = warp & 1; // 4 × 2 warps
    i64 row0 = (i64)blockIdx.y * TILE, col0 = (i64)blockIdx.x * TILE;
    for (i64 z = blockIdx.z; z < p.batch.n; z += gridDim.z) {
        const T *a = A + offset_of(p.batch, p.sa, z);
        const T *b = B + offset_of(p.batch, p.sb, z);
        T *c = C + offset_of(p.batch, p.sc, z);
        // Warp (wm, wn) owns rows wm*16 .. +16 and columns wn*32 .. +32: 4 n8 tiles.
        float acc[4][4];
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
        for (i64 k0 = 0; k0 < p.k; k0 += KT) {
            for (int e = tid; e < TILE * KT; e += blockDim.x) {
                int r = e / KT, kk = e % KT;
                i64 gr = row0 + r, gk = k0 + kk;
                As[r][kk] = (gr < p.m && gk < p.k) ? a[gr * p.a_sm + gk * p.a_sk].bits : (u16)0;
            }
            for (int e = tid; e < TILE * KT; e += blockDim.x) {
                int kk = e / TILE, cidx = e % TILE;
                i64 gk = k0 + kk, gc = col0 + cidx;
                Bs[kk][cidx] = (gk < p.k && gc < p.n) ? b[gk * p.b_sk + gc * p.b_sn].bits : (u16)0;
            }
            __syncthreads();
            int r = wm * 16 + g;
            u32 af[4] = {pack2(As[r][2 * t], As[r][2 * t + 1]),
                         pack2(As[r + 8][2 * t], As[r + 8][2 * t + 1]),
                         pack2(As[r][2 * t + 8], As[r][2 * t + 9]),
                         pack2(As[r + 8][2 * t + 8], As[r + 8][2 * t + 9])};
            for (int ni = 0; ni < 4; ++ni) {
                int cn = wn * 32 + ni * 8 + g;
                u32 bf[2] = {pack2(Bs[2 * t][cn], Bs[2 * t + 1][cn]),
                             pack2(Bs[2 * t + 8][cn], Bs[2 * t + 9][cn])};
                mma_m16n8k16(T{}, acc[ni], af, bf);
            }
            __syncthreads();
        }
        for (int ni = 0; ni < 4; ++ni) {
            i64 r = row0 + wm * 16 + g, cc = col0 + wn * 32 + ni * 8 + 2 * t;
            store_c(c, p, r, cc, acc[ni][0]);
            store_c(c, p, r, cc + 1, acc[ni][1]);
            store_c(c, p, r + 8, cc, acc[ni][2]);
            store_c(c, p, r + 8, cc + 1, acc[ni][3]);
        }
        if (Epi::on) {
            epi.batch(p, z);
            // Element e: fragment e / 4, its value e % 4 (rows g and g + 8, columns 2t, 2t + 1).
#pragma unroll 1
            for (int e = 0; e < 16; ++e)
                epi.at(c, p, row0 + wm * 16 + g + 8 * ((e >> 1) & 1), col0 + wn * 32 + (e >> 2) * 8 + 2 * t + (e & 1));
        }
    }
}

#else // SIMT

template <class Epi>
__device__ __forceinline__ void matmul_tiles(const T *A, const T *B, T *C, const Mm &p, Epi &epi)
{
    __shared__ float As[KT][TILE + 4];
    __shared__ float Bs[KT][TILE + 4];
    int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    i64 row0 = (i64)blockIdx.y * TILE, col0 = (i64)blockIdx.x * TILE;
    for (i64 z = blockIdx.z; z < p.batch.n; z += gridDim.z) {
        const T *a = A + offset_of(p.batch, p.sa, z);
        const T *b = B + offset_of(p.batch, p.sb, z);
        T *c = C + offset_of(p.batch, p.sc, z);
        float acc[4][4];
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
        for (i64 k0 = 0; k0 < p.k; k0 += KT) {
            for (int e = tid; e < TILE * KT; e += blockDim.x) {
                int r = e / KT, kk = e % KT;
                i64 gr = row0 + r, gk = k0 + kk;
                As[kk][r] = (gr < p.m && gk < p.k) ? to_f32(a[gr * p.a_sm + gk * p.a_sk]) : 0.0f;
            }
            for (int e = tid; e < TILE * KT; e += blockDim.x) {
                int kk = e / TILE, cidx = e % TILE;
                i64 gk = k0 + kk, gc = col0 + cidx;
                Bs[kk][cidx] = (gk < p.k && gc < p.n) ? to_f32(b[gk * p.b_sk + gc * p.b_sn]) : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < KT; ++kk) {
                float av[4], bv[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
                for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
            }
            __syncthreads();
        }
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) store_c(c, p, row0 + ty + 16 * i, col0 + tx + 16 * j, acc[i][j]);
        if (Epi::on) {
            epi.batch(p, z);
#pragma unroll 1
            for (int e = 0; e < 16; ++e) epi.at(c, p, row0 + ty + 16 * (e >> 2), col0 + tx + 16 * (e & 3));
        }
    }
}

#endif

#ifndef UNIRT_EPILOGUE

extern "C" __global__ void __launch_bounds__(256) op_matmul(const T *A, const T *B, T *C, Mm p)
{
    NoEpilogue none;
    matmul_tiles(A, B, C, p, none);
}

// ---- op_matmul_mma: 128×128 tiles on tensor cores ------------------------------------------
// The planner launches it for f16 / bf16 on sm_80+ when A has a unit column stride, B a unit
// stride in one of its dimensions, and every other stride of A and B is a multiple of 8
// elements (16 bytes), so that each row of a tile arrives in 16-byte cp.async copies. 4 warps
// (2 × 2) each compute 64×64 of the block's 128×128 tile (128 accumulators a thread; 8
// ldmatrix feed 32 mma per 16-deep step); K goes in 32-deep steps through a three-stage
// pipeline (48 KiB of shared memory: stage t + 2 is in flight while stage t is multiplied);
// fragments come by ldmatrix from tiles whose 16-byte chunks are XOR-swizzled per row, so
// that the eight rows an ldmatrix phase reads fall on distinct banks without padding. Blocks
// run in groups of 8 tile rows, so that the blocks in flight share A's rows and B's columns
// in L2.
// A batch whose operands the pipeline cannot read (a base not 16-byte aligned; strides the
// planner would not have chosen) is computed element by element instead: correct, slow, and
// never chosen by the planner. Builds without tensor cores (f32, sm_70) hold only that path.
// ci/emulate_matmul_mma.py replays this kernel's index arithmetic lane by lane (copies, the
// swizzle, ldmatrix and mma fragments, the stages in flight) against NumPy without a GPU; keep
// it in step with any change here.

#define MMA_BM 128
#define MMA_BN 128
#define MMA_BK 32
#define MMA_THREADS 128
// Halves of one pipeline stage: A [128][32], then B as [32][128] or [128][32].
#define MMA_A_HALVES (MMA_BM * MMA_BK)
#define MMA_STAGE_HALVES (MMA_A_HALVES + MMA_BK * MMA_BN)

// C = alpha·A·B + beta·C over the block's 128×128 tile, one element at a time.
__device__ void matmul_plain(const T *a, const T *b, T *c, const Mm &p, i64 row0, i64 col0)
{
    for (int e = threadIdx.x; e < MMA_BM * MMA_BN; e += blockDim.x) {
        i64 r = row0 + e / MMA_BN, col = col0 + e % MMA_BN;
        if (r >= p.m || col >= p.n) continue;
        float s = 0.0f;
        for (i64 kk = 0; kk < p.k; ++kk) s = fmaf(to_f32(a[r * p.a_sm + kk * p.a_sk]), to_f32(b[kk * p.b_sk + col * p.b_sn]), s);
        store_c(c, p, r, col, s);
    }
}

#ifdef UNIRT_MMA

// Byte offset of 16-byte chunk `ch` of row `r` in a tile of 32-half rows (A, and B stored
// [n][k]): chunk ch ^ ((r >> 1) & 3), so rows r … r + 7 land on eight distinct 16-byte bank
// groups (two rows per 128 bytes, four chunk positions).
__device__ __forceinline__ u32 k_rows_at(int r, int ch) { return (u32)(r * MMA_BK + ((ch ^ ((r >> 1) & 3)) << 3)) * 2; }
// The same in a tile of 128-half rows (B stored [k][n]): chunk ch ^ (r & 7).
__device__ __forceinline__ u32 n_rows_at(int r, int ch) { return (u32)(r * MMA_BN + ((ch ^ (r & 7)) << 3)) * 2; }

// One thread's share of a stage's copies: 4 chunks of A and 4 of B (512 each), their shared
// offsets fixed, their sources stepped along k.
template <bool B_ROWS> struct MmaCopies {
    const T *a[4], *b[4];
    u32 sa[4], sb[4];
    // Per chunk: the row (A) or column (B [n][k]) lies inside the product.
    unsigned in_a, in_b;
    // The k of each chunk's first element at k0 = 0.
    int ka[4], kb[4];

    __device__ __forceinline__ MmaCopies(const T *A, const T *B, const Mm &p, i64 row0, i64 col0)
    {
        in_a = in_b = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int q = threadIdx.x + i * MMA_THREADS;
            int r = q >> 2, ch = q & 3;
            i64 gr = row0 + r;
            in_a |= (gr < p.m ? 1u : 0u) << i;
            a[i] = A + (gr < p.m ? gr : 0) * p.a_sm + ch * 8;
            ka[i] = ch * 8;
            sa[i] = k_rows_at(r, ch);
            if (B_ROWS) {
                // [k][n]: 32 rows of 16 chunks; the row is the chunk's k.
                int kr = q >> 4, nch = q & 15;
                i64 gc = col0 + nch * 8;
                in_b |= (gc < p.n ? 1u : 0u) << i;
                // Columns left inside the product from this chunk's first (for a partial one).
                kb[i] = kr;
                b[i] = B + (i64)kr * p.b_sk + (gc < p.n ? gc : 0);
                sb[i] = n_rows_at(kr, nch);
            } else {
                // [n][k]: 128 rows of 4 chunks.
                i64 gc = col0 + r;
                in_b |= (gc < p.n ? 1u : 0u) << i;
                kb[i] = ch * 8;
                b[i] = B + (gc < p.n ? gc : 0) * p.b_sn + ch * 8;
                sb[i] = k_rows_at(r, ch);
            }
        }
    }

    // Issues the copies of the stage at shared address `stage` for k0 … k0 + 32. Chunks past
    // an edge read what lies inside it and zero the rest.
    __device__ __forceinline__ void issue(u32 stage, const Mm &p, i64 col0, i64 k0) const
    {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            i64 gk = k0 + ka[i];
            int bytes = ((in_a >> i) & 1) && gk < p.k ? (int)min((i64)8, p.k - gk) * 2 : 0;
            cp_async_bytes_to(stage + sa[i], bytes ? a[i] + k0 : a[0], bytes);
        }
        u32 sb0 = stage + MMA_A_HALVES * 2;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            i64 gk = k0 + kb[i];
            int bytes;
            if (B_ROWS) {
                i64 gc = col0 + (((threadIdx.x + i * MMA_THREADS) & 15) * 8);
                bytes = ((in_b >> i) & 1) && gk < p.k ? (int)min((i64)8, p.n - gc) * 2 : 0;
            } else {
                bytes = ((in_b >> i) & 1) && gk < p.k ? (int)min((i64)8, p.k - gk) * 2 : 0;
            }
            cp_async_bytes_to(sb0 + sb[i], bytes ? b[i] + (B_ROWS ? k0 * p.b_sk : k0) : b[0], bytes);
        }
    }
};

// The warp's 64×64 of the tile times one stage: two 16-deep steps, each 4 A fragments (ldmatrix
// x4 of rows 16·i … +16) and 8 B fragments (four ldmatrix x4, transposing for a [k][n] tile),
// 32 mma. `la` and `lb` are the lane's ldmatrix offsets for the first fragments of each step.
template <bool B_ROWS>
__device__ __forceinline__ void mma_multiply_stage(float acc[4][8][4], u32 stage, const u32 la[2], const u32 lb[2][4])
{
    u32 sb = stage + MMA_A_HALVES * 2;
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
        u32 af[4][4], bf[8][2];
#pragma unroll
        for (int mi = 0; mi < 4; ++mi) ldmatrix_x4_to(af[mi], stage + la[ks] + mi * 16 * MMA_BK * 2);
#pragma unroll
        for (int pj = 0; pj < 4; ++pj) {
            u32 t[4];
            if (B_ROWS)
                ldmatrix_x4_trans_to(t, sb + lb[ks][pj]);
            else
                ldmatrix_x4_to(t, sb + lb[ks][pj]);
            bf[2 * pj][0] = t[0];
            bf[2 * pj][1] = t[1];
            bf[2 * pj + 1][0] = t[2];
            bf[2 * pj + 1][1] = t[3];
        }
#pragma unroll
        for (int mi = 0; mi < 4; ++mi)
#pragma unroll
            for (int nj = 0; nj < 8; ++nj) mma_m16n8k16(T{}, acc[mi][nj], af[mi], bf[nj]);
    }
}

// One batch's 128×128 tile through the pipeline, then its stores (two elements at a time where
// C has unit column stride and beta is 0).
template <bool B_ROWS>
__device__ __forceinline__ void mma_tile(u32 smem, const T *a, const T *b, T *c, const Mm &p, i64 row0, i64 col0)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int wm = warp >> 1, wn = warp & 1;
    // The lane's ldmatrix rows: A fragments are (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15),
    // (8-15, 8-15); B's are (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
    // of each 16×16 piece, read transposed from [k][n] or directly from [n][k].
    u32 la[2], lb[2][4];
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
        la[ks] = k_rows_at(wm * 64 + (lane & 15), ks * 2 + (lane >> 4));
#pragma unroll
        for (int pj = 0; pj < 4; ++pj)
            lb[ks][pj] = B_ROWS ? n_rows_at(ks * 16 + (lane & 15), wn * 8 + pj * 2 + (lane >> 4))
                                : k_rows_at(wn * 64 + pj * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1));
    }
    float acc[4][8][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int nj = 0; nj < 8; ++nj)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[mi][nj][v] = 0.0f;
    MmaCopies<B_ROWS> cp(a, b, p, row0, col0);
    const u32 stage = MMA_STAGE_HALVES * 2;
    i64 tiles = (p.k + MMA_BK - 1) / MMA_BK;
    if (tiles > 0) cp.issue(smem, p, col0, 0); // nothing to copy from an empty K
    cp_async_commit();
    if (tiles > 1) cp.issue(smem + stage, p, col0, MMA_BK);
    cp_async_commit();
    int s = 0; // the stage multiplied in this step; stage (s + 2) % 3 is refilled
    for (i64 t = 0; t < tiles; ++t) {
        cp_async_wait<1>(); // stage s has landed (only the newest group may be in flight)
        __syncthreads();    // … for every thread, and every warp is done with stage s - 1
        int fill = s == 0 ? 2 : s - 1;
        if (t + 2 < tiles) cp.issue(smem + fill * stage, p, col0, (t + 2) * MMA_BK);
        cp_async_commit();
        mma_multiply_stage<B_ROWS>(acc, smem + s * stage, la, lb);
        s = s == 2 ? 0 : s + 1;
    }
    cp_async_wait<0>();
    __syncthreads(); // the next batch's copies overwrite the stages
    int g = lane >> 2, tq = lane & 3;
    bool pairs = p.c_sn == 1 && p.beta == 0.0 && (p.c_sm & 1) == 0 && aligned_to(c, 4);
    float alpha = (float)p.alpha;
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int nj = 0; nj < 8; ++nj)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                i64 r = row0 + wm * 64 + mi * 16 + g + 8 * h, col = col0 + wn * 64 + nj * 8 + 2 * tq;
                float v0 = acc[mi][nj][2 * h], v1 = acc[mi][nj][2 * h + 1];
                if (pairs && r < p.m && col + 1 < p.n) {
                    u32 two = (u32)from_f32<T>(alpha * v0).bits | ((u32)from_f32<T>(alpha * v1).bits << 16);
                    *(u32 *)(c + r * p.c_sm + col) = two;
                } else {
                    store_c(c, p, r, col, v0);
                    store_c(c, p, r, col + 1, v1);
                }
            }
}

#endif // UNIRT_MMA

extern "C" __global__ void __launch_bounds__(MMA_THREADS) op_matmul_mma(const T *A, const T *B, T *C, Mm p)
{
    // Block → tile in groups of 8 tile rows: walking down a group before across keeps the
    // blocks in flight on a few bands of A and B.
    i64 gx = gridDim.x, gy = gridDim.y, pid = (i64)blockIdx.y * gx + blockIdx.x;
    i64 first = pid / (8 * gx) * 8, in_group = pid % (8 * gx);
    i64 rows = min(gy - first, (i64)8);
    i64 row0 = (first + in_group % rows) * MMA_BM, col0 = in_group / rows * MMA_BN;
#ifdef UNIRT_MMA
    __shared__ __align__(128) u16 stages[3 * MMA_STAGE_HALVES];
    u32 smem = shared_address(stages);
    bool b_rows = p.b_sn == 1 && (p.b_sk & 7) == 0, b_cols = p.b_sk == 1 && (p.b_sn & 7) == 0;
    bool fits = p.a_sk == 1 && (p.a_sm & 7) == 0 && (b_rows || b_cols);
#endif
    for (i64 z = blockIdx.z; z < p.batch.n; z += gridDim.z) {
        const T *a = A + offset_of(p.batch, p.sa, z);
        const T *b = B + offset_of(p.batch, p.sb, z);
        T *c = C + offset_of(p.batch, p.sc, z);
#ifdef UNIRT_MMA
        if (fits && aligned_to(a, 16) && aligned_to(b, 16)) {
            if (b_rows) mma_tile<true>(smem, a, b, c, p, row0, col0);
            else mma_tile<false>(smem, a, b, c, p, row0, col0);
            continue;
        }
#endif
        matmul_plain(a, b, c, p, row0, col0);
    }
}

#else // the epilogue kernels (generated sources only)

// The most extra operands an epilogue reads (MAX_EPILOGUE_OPERANDS): the kernels take this
// many pointers, the unused ones repeating another operand, never read.
#define EPI_MAX 4

// The program's operands at an element: the product, then each extra operand.
typedef float EpiValues[1 + EPI_EXTRAS];

#if UNIRT_EPILOGUE == 1

// op_matmul_epilogue's parameters: the GEMM's, each extra operand's batch strides (over
// mm.batch) and its row and column strides (0 where it broadcasts), the program's.
struct MmEpi {
    Mm mm;
    Strides eb[EPI_MAX];
    i64 er[EPI_MAX], ec[EPI_MAX];
    Chain c;
};

struct Epilogue {
    enum { on = 1 };
    const MmEpi *q;
    const T *e[EPI_MAX];
    // Each extra operand's offset for the current batch.
    i64 off[EPI_MAX];

    // Once per batch, after the tile's stores (its divisions may call a subroutine; few
    // registers are live there).
    __device__ __forceinline__ void batch(const Mm &p, i64 z)
    {
#pragma unroll
        for (int k = 0; k < EPI_EXTRAS; ++k) off[k] = offset_of(p.batch, q->eb[k], z);
    }

    // The product at (r, col), as op_matmul stored it, through the program.
    __device__ __forceinline__ void at(T *c, const Mm &p, i64 r, i64 col) const
    {
        if (r >= p.m || col >= p.n) return;
        T *dst = c + r * p.c_sm + col * p.c_sn;
        EpiValues x;
        // Read back in the dtype and kept opaque: the compiler may not fold the stored
        // product's multiply into the program's first step.
        x[0] = keep(to_f32(*dst), (int)q->c.mask);
#pragma unroll
        for (int k = 0; k < EPI_EXTRAS; ++k) x[1 + k] = to_f32(e[k][off[k] + r * q->er[k] + col * q->ec[k]]);
        *dst = from_f32<T>(epilogue_of(q->c, x));
    }
};

extern "C" __global__ void __launch_bounds__(256)
    op_matmul_epilogue(const T *A, const T *B, T *C, const T *E0, const T *E1, const T *E2, const T *E3, MmEpi q)
{
    Epilogue epi = {&q, {E0, E1, E2, E3}, {0, 0, 0, 0}};
    matmul_tiles(A, B, C, q.mm, epi);
}

#elif UNIRT_EPILOGUE == 2

// op_epilogue's parameters: the output's space and strides, the product's and each extra
// operand's strides over it (0 where it broadcasts), the program's.
struct EpiPass {
    Space s;
    Strides so, sp, se[EPI_MAX];
    Chain c;
};

// out = program(P, E0, …) over the output's space. P may be the output itself (each element
// is read, then written, by one thread). Dense launches (one dimension, every operand
// contiguous and 16-byte aligned) move 16 bytes per access; the host sizes their grid for
// that.
extern "C" __global__ void op_epilogue(T *out, const T *P, const T *E0, const T *E1, const T *E2, const T *E3, EpiPass q)
{
    const T *e[EPI_MAX] = {E0, E1, E2, E3};
    bool dense = q.s.nd == 1 && q.so.st[0] == 1 && q.sp.st[0] == 1 && aligned_to(out, 16) && aligned_to(P, 16);
#pragma unroll
    for (int k = 0; k < EPI_EXTRAS; ++k) dense = dense && q.se[k].st[0] == 1 && aligned_to(e[k], 16);
    if (dense) {
        i64 packs = q.s.n / VEC;
        GRID_LOOP(p, packs)
        {
            TPack v[1 + EPI_EXTRAS], r;
            v[0] = ((const TPack *)P)[p];
#pragma unroll
            for (int k = 0; k < EPI_EXTRAS; ++k) v[1 + k] = ((const TPack *)e[k])[p];
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                EpiValues x;
#pragma unroll
                for (int k = 0; k <= EPI_EXTRAS; ++k) x[k] = to_f32(v[k].v[j]);
                r.v[j] = from_f32<T>(epilogue_of(q.c, x));
            }
            ((TPack *)out)[p] = r;
        }
        // Fewer than VEC elements are left; the first threads take one each.
        i64 t = packs * VEC + (i64)blockIdx.x * blockDim.x + threadIdx.x;
        if (t < q.s.n) {
            EpiValues x;
            x[0] = to_f32(P[t]);
#pragma unroll
            for (int k = 0; k < EPI_EXTRAS; ++k) x[1 + k] = to_f32(e[k][t]);
            out[t] = from_f32<T>(epilogue_of(q.c, x));
        }
        return;
    }
    GRID_LOOP(i, q.s.n)
    {
        const Strides *ops[2 + EPI_EXTRAS];
        ops[0] = &q.so;
        ops[1] = &q.sp;
#pragma unroll
        for (int k = 0; k < EPI_EXTRAS; ++k) ops[2 + k] = &q.se[k];
        i64 o[2 + EPI_EXTRAS];
        offsets_of_n(q.s, ops, i, o);
        EpiValues x;
        x[0] = to_f32(P[o[1]]);
#pragma unroll
        for (int k = 0; k < EPI_EXTRAS; ++k) x[1 + k] = to_f32(e[k][o[2 + k]]);
        out[o[0]] = from_f32<T>(epilogue_of(q.c, x));
    }
}

#endif // UNIRT_EPILOGUE == 2
#endif // UNIRT_EPILOGUE
