// The matmul op family: C = alpha·A·B + beta·C over broadcast batches, any strides. 64×64
// output tiles per block of 256 threads (grid x: columns, y: rows, z: batches).
// - f32 (and f16 / bf16 below sm_80): a tiled SIMT GEMM, 16-deep K tiles in shared memory,
//   4×4 outputs per thread.
// - f16 / bf16 on sm_80+: tensor cores through PTX `mma.sync.m16n8k16` (f32 accumulate),
//   8 warps each computing 32×16 of the tile.
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
