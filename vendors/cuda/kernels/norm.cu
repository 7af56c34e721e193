// The norm op family: rms_norm and layer_norm over the last dimension, one block per row
// (grid-stride over rows; the block sized to the row), statistics in f32.

struct Nm {
    Space rows;
    Strides so, si;
    i64 d, x_st, o_st, w_st, b_st;
    double eps;
};

// rms_norm holds its row raw: RAW_PACKS 16-byte packs a thread (16 f32 or 32 16-bit values),
// converted to f32 on use. In 16-bit types that is twice the elements a thread of the f32
// `RowCache` holds, in the same registers, so a block reads twice the bytes per thread: with
// a 16-element cache a bf16 row of 4096 took 256 threads, four rows were in flight per
// multiprocessor (the 64-register cap), and the kernel ran at 0.86× PyTorch on an H100. The
// planner sizes the block for this (norm.rs). Rows that are not whole aligned packs walk the
// uncached path below.
#define RAW_PACKS 4
#define RAW_V (16 / (int)sizeof(T))
typedef Pack<T, RAW_V> RawPack;

// The row index of element 0 of the thread's pack `k`.
__device__ __forceinline__ i64 raw_at(int k) { return ((i64)threadIdx.x + (i64)k * blockDim.x) * RAW_V; }

extern "C" __global__ void __launch_bounds__(1024) op_rms_norm(T *out, const T *in, const T *w, const T *b, Nm p)
{
    __shared__ float scratch[32];
    for (i64 r = blockIdx.x; r < p.rows.n; r += gridDim.x) {
        const T *x = in + offset_of(p.rows, p.si, r);
        T *y = out + offset_of(p.rows, p.so, r);
        if (p.x_st == 1 && p.o_st == 1 && p.w_st == 1 && p.d % RAW_V == 0 &&
            p.d <= (i64)blockDim.x * RAW_PACKS * RAW_V && aligned_to(x, 16) && aligned_to(y, 16) && aligned_to(w, 16)) {
            // The row read once, into registers (whole packs: d is a multiple of one).
            RawPack c[RAW_PACKS];
            float ss = 0.0f;
#pragma unroll
            for (int k = 0; k < RAW_PACKS; ++k) {
                i64 j = raw_at(k);
                if (j < p.d) {
                    c[k] = *(const RawPack *)(x + j);
#pragma unroll
                    for (int l = 0; l < RAW_V; ++l) {
                        float v = to_f32(c[k].v[l]);
                        ss += v * v;
                    }
                }
            }
            ss = block_sum(ss, scratch);
            float inv = (float)(1.0 / sqrt((double)ss / (double)p.d + p.eps));
#pragma unroll
            for (int k = 0; k < RAW_PACKS; ++k) {
                i64 j = raw_at(k);
                if (j < p.d) {
                    RawPack g = *(const RawPack *)(w + j), o;
#pragma unroll
                    for (int l = 0; l < RAW_V; ++l) o.v[l] = from_f32<T>(to_f32(c[k].v[l]) * inv * to_f32(g.v[l]));
                    *(RawPack *)(y + j) = o;
                }
            }
            __syncthreads();
            continue;
        }
        float ss = 0.0f;
        for (i64 j = threadIdx.x; j < p.d; j += blockDim.x) {
            float v = to_f32(x[j * p.x_st]);
            ss += v * v;
        }
        ss = block_sum(ss, scratch);
        float inv = (float)(1.0 / sqrt((double)ss / (double)p.d + p.eps));
        __syncthreads();
        for (i64 j = threadIdx.x; j < p.d; j += blockDim.x) {
            y[j * p.o_st] = from_f32<T>(to_f32(x[j * p.x_st]) * inv * to_f32(w[j * p.w_st]));
        }
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(1024) op_layer_norm(T *out, const T *in, const T *w, const T *b, Nm p)
{
    __shared__ float scratch[32];
    for (i64 r = blockIdx.x; r < p.rows.n; r += gridDim.x) {
        const T *x = in + offset_of(p.rows, p.si, r);
        T *y = out + offset_of(p.rows, p.so, r);
        float s = 0.0f;
        for (i64 j = threadIdx.x; j < p.d; j += blockDim.x) s += to_f32(x[j * p.x_st]);
        float mean = block_sum(s, scratch) / (float)p.d;
        float v2 = 0.0f;
        for (i64 j = threadIdx.x; j < p.d; j += blockDim.x) {
            float c = to_f32(x[j * p.x_st]) - mean;
            v2 += c * c;
        }
        v2 = block_sum(v2, scratch);
        float inv = (float)(1.0 / sqrt((double)v2 / (double)p.d + p.eps));
        __syncthreads();
        for (i64 j = threadIdx.x; j < p.d; j += blockDim.x) {
            float c = to_f32(x[j * p.x_st]) - mean;
            y[j * p.o_st] = from_f32<T>(c * inv * to_f32(w[j * p.w_st]) + to_f32(b[j * p.b_st]));
        }
        __syncthreads();
    }
}
