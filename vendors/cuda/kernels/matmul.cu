// The matmul op family: C = alpha·A·B + beta·C over broadcast batches, any strides. 64×64
// output tiles per block of 256 threads (grid x: columns, y: rows, z: batches).
// - f32 (and f16 / bf16 below sm_80): a tiled SIMT GEMM, 16-deep K tiles in shared memory,
//   4×4 outputs per thread.
// - f16 / bf16 on sm_80+: tensor cores through PTX `mma.sync.m16n8k16` (f32 accumulate),
//   8 warps each computing 32×16 of the tile.
// beta == 0 never reads C (it may hold NaN).

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

#if (defined(UNIRT_DTYPE_F16) || defined(UNIRT_DTYPE_BF16)) && __CUDA_ARCH__ >= 800
#define UNIRT_MMA 1
#endif

#ifdef UNIRT_MMA

extern "C" __global__ void __launch_bounds__(256) op_matmul(const T *A, const T *B, T *C, Mm p)
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
    }
}

#else // SIMT

extern "C" __global__ void __launch_bounds__(256) op_matmul(const T *A, const T *B, T *C, Mm p)
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
    }
}

#endif
