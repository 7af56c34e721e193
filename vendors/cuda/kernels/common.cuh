// unirt's CUDA C prelude for the operator kernels, put before every op family's file by the
// source generator (vendors/cuda/kernels/mod.rs). It needs no toolkit header: NVRTC alone
// compiles it. After it the generator defines `T` (the element type of the family's dtype)
// and `UNIRT_DTYPE_<NAME>`.
//
// 16-bit floats are stored as 16 bits and converted to f32 for arithmetic (f16 through PTX
// cvt, bf16 by bit manipulation); every kernel accumulates in f32.

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

// IEEE half, stored.
struct __align__(2) uhalf { u16 bits; };
// bfloat16, stored.
struct __align__(2) ubf16 { u16 bits; };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(uhalf x)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float to_f32(ubf16 x) { return __uint_as_float(((u32)x.bits) << 16); }
__device__ __forceinline__ float to_f32(int x) { return (float)x; }
__device__ __forceinline__ float to_f32(i64 x) { return (float)x; }
__device__ __forceinline__ float to_f32(u8 x) { return (float)x; }

__device__ __forceinline__ double to_f64(float x) { return (double)x; }
__device__ __forceinline__ double to_f64(uhalf x) { return (double)to_f32(x); }
__device__ __forceinline__ double to_f64(ubf16 x) { return (double)to_f32(x); }
__device__ __forceinline__ double to_f64(int x) { return (double)x; }
__device__ __forceinline__ double to_f64(i64 x) { return (double)x; }
__device__ __forceinline__ double to_f64(u8 x) { return (double)x; }

__device__ __forceinline__ uhalf f32_to_half(float f)
{
    uhalf h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}

// Round to nearest even; NaN stays a (quiet) NaN. sm_80+ has the conversion in hardware (one
// instruction instead of six: it matters in bf16 kernels that compute per element).
__device__ __forceinline__ ubf16 f32_to_bf16(float f)
{
    ubf16 b;
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.bits) : "f"(f));
#else
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b.bits = (u16)((u >> 16) | 0x0040u);
    } else {
        b.bits = (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
#endif
    return b;
}

// Conversions from f32 into any element type (integers truncate and saturate, NaN → 0, as
// Rust's `as`).
template <typename D> __device__ __forceinline__ D from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ uhalf from_f32<uhalf>(float v) { return f32_to_half(v); }
template <> __device__ __forceinline__ ubf16 from_f32<ubf16>(float v) { return f32_to_bf16(v); }

// Conversions from f64 (cast rounds once from the exact source value where it can).
template <typename D> __device__ __forceinline__ D from_f64(double v);
template <> __device__ __forceinline__ float from_f64<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ uhalf from_f64<uhalf>(double v)
{
    uhalf h;
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.bits) : "d"(v));
    return h;
}
template <> __device__ __forceinline__ ubf16 from_f64<ubf16>(double v)
{
    // f64 → f32 may round once before the bf16 rounding; round the f32 toward zero so the
    // second rounding sees the exact sticky bits (round-to-odd on the low bit).
    float f = __double2float_rz(v);
    double back = (double)f;
    u32 u = __float_as_uint(f);
    if (back != v && (u & 0x7fffffffu) < 0x7f800000u) {
        u |= 1u;
    }
    return f32_to_bf16(__uint_as_float(u));
}
template <> __device__ __forceinline__ int from_f64<int>(double v)
{
    if (v != v) return 0;
    if (v >= 2147483647.0) return 2147483647;
    if (v <= -2147483648.0) return (-2147483647 - 1);
    return (int)v;
}
template <> __device__ __forceinline__ i64 from_f64<i64>(double v)
{
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return 9223372036854775807LL;
    if (v <= -9223372036854775808.0) return (-9223372036854775807LL - 1);
    return (i64)v;
}
template <> __device__ __forceinline__ u8 from_f64<u8>(double v)
{
    if (v != v || v <= 0.0) return 0;
    if (v >= 255.0) return 255;
    return (u8)v;
}

// ---- layouts ------------------------------------------------------------------------------

// The most dimensions a kernel iterates over after the planner merged contiguous ones.
#define UNIRT_MAX_DIMS 8

// An iteration space: `nd` dimensions of sizes `dim` (outermost first), `n` points in all.
// Every field is 64-bit so the host fills the struct as an array of i64.
struct Space {
    i64 nd;
    i64 n;
    i64 dim[UNIRT_MAX_DIMS];
};

// An operand's strides (in elements) over a Space; 0 where it broadcasts.
struct Strides {
    i64 st[UNIRT_MAX_DIMS];
};

// The element offsets of point `i` of `s` in `N` operands with strides `*a[k]`, one chain of
// divisions for all. One dimension is a multiply; spaces under 2^32 points divide in 32 bits,
// several times cheaper than the 64-bit division a GPU emulates. Dimension sizes are at least
// 1. Always inlined, so a kernel's by-value parameters are read in place (handing their
// address to an out-of-line function makes every thread copy them to local memory first).
template <int N>
__device__ __forceinline__ void offsets_of_n(const Space &s, const Strides *const (&a)[N], i64 i,
                                             i64 (&o)[N])
{
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = 0;
    if (s.nd <= 1) {
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] = i * a[k]->st[0];
        return;
    }
    if (s.n <= 0xffffffffLL) {
        u32 j = (u32)i;
#pragma unroll 1
        for (int d = (int)s.nd - 1; d >= 0; --d) {
            u32 dim = (u32)s.dim[d], q = j / dim;
            i64 r = (i64)(j - q * dim);
#pragma unroll
            for (int k = 0; k < N; ++k) o[k] += r * a[k]->st[d];
            j = q;
        }
        return;
    }
#pragma unroll 1
    for (int d = (int)s.nd - 1; d >= 0; --d) {
        i64 q = i / s.dim[d], r = i - q * s.dim[d];
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] += r * a[k]->st[d];
        i = q;
    }
}

// The element offset of point `i` of `s` in an operand with strides `a`.
__device__ __forceinline__ i64 offset_of(const Space &s, const Strides &a, i64 i)
{
    const Strides *ops[1] = {&a};
    i64 o[1];
    offsets_of_n(s, ops, i, o);
    return o[0];
}

// The offsets of point `i` in two operands at once.
__device__ __forceinline__ void offsets_of2(const Space &s, const Strides &a, const Strides &b,
                                            i64 i, i64 *oa, i64 *ob)
{
    const Strides *ops[2] = {&a, &b};
    i64 o[2];
    offsets_of_n(s, ops, i, o);
    *oa = o[0];
    *ob = o[1];
}

// ---- vector access --------------------------------------------------------------------------

// `N` consecutive elements of type `E`, moved as one aligned load or store (16 bytes at most:
// the widest access a thread makes).
template <typename E, int N> struct alignas(sizeof(E) * N) Pack {
    E v[N];
};

// Whether `p` may be accessed as a Pack of `bytes` bytes.
__device__ __forceinline__ bool aligned_to(const void *p, u64 bytes) { return ((u64)p & (bytes - 1)) == 0; }

#define UNIRT_NEG_INF __int_as_float(0xff800000)
#define UNIRT_POS_INF __int_as_float(0x7f800000)

// ---- tensor cores (sm_80+) -----------------------------------------------------------------

#if __CUDA_ARCH__ >= 800
// D = A·B + D for one m16n8k16 tile of 16-bit inputs (row-major A, column-major B, f32
// accumulators), the input type picked by the tag's type. Fragments (lane = 4·g + t): A holds
// (row g, k 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..); B holds (k 2t..2t+1, n g) and
// (k 2t+8.., n g); D holds (g, n 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
__device__ __forceinline__ void mma_m16n8k16(uhalf, float d[4], const u32 a[4], const u32 b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_m16n8k16(ubf16, float d[4], const u32 a[4], const u32 b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A generic pointer into shared memory as the 32-bit shared-window address PTX takes.
__device__ __forceinline__ u32 shared_address(const void *p)
{
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Four 8×8 16-bit matrices from shared memory (lanes 8i .. 8i + 7 give matrix i's row
// addresses, 16 bytes each); lane 4·g + t receives row g, columns 2t and 2t + 1 of each — a
// B fragment pair when the rows are the n index. `_trans` delivers the transpose (column g,
// rows 2t and 2t + 1): B fragments from a row-major [k][n] tile.
__device__ __forceinline__ void ldmatrix_x4(u32 r[4], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
}

// 16 bytes global → shared without passing through registers; `valid` false writes zeros and
// reads nothing. Completion is by groups: commit after issuing, wait before reading.
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
// The same with the destination as a shared-window address (`shared_address`), for loops
// that compute it once.
__device__ __forceinline__ void cp_async16_to(u32 dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// 16 bytes global → shared, of which the first `bytes` (0 … 16) are read and the rest are
// zero: a row's last, partial chunk.
__device__ __forceinline__ void cp_async_bytes_to(u32 dst, const void *src, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
// ldmatrix with the row address as a shared-window address.
__device__ __forceinline__ void ldmatrix_x4_to(u32 r[4], u32 row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row));
}
__device__ __forceinline__ void ldmatrix_x4_trans_to(u32 r[4], u32 row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N committed groups are still in flight (N a constant).
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
#endif

// Two 16-bit values as one register, `lo` in the low half (fragment order).
__device__ __forceinline__ u32 pack2(u16 lo, u16 hi) { return (u32)lo | ((u32)hi << 16); }

// ---- rows cached in registers -----------------------------------------------------------------

// A block's threads hold one unit-stride row of up to blockDim.x · ROW_PACKS · 4 elements in
// registers (16 a thread: 4096 with 256 threads, 16384 with 1024), so a row kernel reads its
// row from memory once: thread t holds the 4-element packs t, t + blockDim.x, …, each moved
// as one access where aligned. The planners size the block to the row (`row_threads`), and
// the row kernels cap their registers at 64 (`__launch_bounds__(1024)`), so several rows are
// in flight on each multiprocessor: with 8 packs and the block fixed at 256 threads,
// `op_rms_norm` took 159 registers — one block, one row, per multiprocessor — and ran at
// 0.17× PyTorch on an H200 in bf16. (`op_softmax` uses this cache; `op_rms_norm` now holds
// its row raw, norm.cu.)
#define ROW_PACKS 4
typedef float RowCache[ROW_PACKS][4];

// The row index of element `l` of the thread's pack `k`.
__device__ __forceinline__ i64 row_at(int k, int l) { return ((i64)threadIdx.x + (i64)k * blockDim.x) * 4 + l; }

// Whether a unit-stride row of `len` elements fits the cache.
__device__ __forceinline__ bool row_fits(i64 len) { return len <= (i64)blockDim.x * ROW_PACKS * 4; }

// Elements [0, len) of `x` into `c` as f32, 0 beyond.
template <typename E> __device__ __forceinline__ void row_load(RowCache &c, const E *x, i64 len)
{
    bool vec = aligned_to(x, sizeof(E) * 4);
#pragma unroll
    for (int k = 0; k < ROW_PACKS; ++k) {
        i64 j = row_at(k, 0);
        if (vec && j + 4 <= len) {
            Pack<E, 4> p = *(const Pack<E, 4> *)(x + j);
#pragma unroll
            for (int l = 0; l < 4; ++l) c[k][l] = to_f32(p.v[l]);
        } else {
#pragma unroll
            for (int l = 0; l < 4; ++l) c[k][l] = j + l < len ? to_f32(x[j + l]) : 0.0f;
        }
    }
}

// `c` into elements [0, len) of `y`.
template <typename E> __device__ __forceinline__ void row_store(E *y, const RowCache &c, i64 len)
{
    bool vec = aligned_to(y, sizeof(E) * 4);
#pragma unroll
    for (int k = 0; k < ROW_PACKS; ++k) {
        i64 j = row_at(k, 0);
        if (vec && j + 4 <= len) {
            Pack<E, 4> p;
#pragma unroll
            for (int l = 0; l < 4; ++l) p.v[l] = from_f32<E>(c[k][l]);
            *(Pack<E, 4> *)(y + j) = p;
        } else {
#pragma unroll
            for (int l = 0; l < 4; ++l)
                if (j + l < len) y[j + l] = from_f32<E>(c[k][l]);
        }
    }
}

// ---- block reductions (blockDim.x a multiple of 32, at most 1024) ---------------------------

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum_f64(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float *scratch)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float *scratch)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : UNIRT_NEG_INF;
    return warp_max(v);
}

__device__ __forceinline__ double block_sum_f64(double v, double *scratch)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum_f64(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0;
    return warp_sum_f64(v);
}

// Grid-stride loop over [0, n).
#define GRID_LOOP(i, n)                                                                      \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (i64)blockDim.x * gridDim.x)
