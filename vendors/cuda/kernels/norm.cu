// The norm op family: rms_norm and layer_norm over the last dimension, one block per row
// (grid-stride over rows; the block sized to the row), statistics in f32.

struct Nm {
    Space rows;
    Strides so, si;
    i64 d, x_st, o_st, w_st, b_st;
    double eps;
};

extern "C" __global__ void __launch_bounds__(1024) op_rms_norm(T *out, const T *in, const T *w, const T *b, Nm p)
{
    __shared__ float scratch[32];
    for (i64 r = blockIdx.x; r < p.rows.n; r += gridDim.x) {
        const T *x = in + offset_of(p.rows, p.si, r);
        T *y = out + offset_of(p.rows, p.so, r);
        if (p.x_st == 1 && p.o_st == 1 && p.w_st == 1 && row_fits(p.d)) {
            // The row read once, into registers.
            RowCache c;
            row_load(c, x, p.d);
            float ss = 0.0f;
#pragma unroll
            for (int k = 0; k < ROW_PACKS; ++k)
#pragma unroll
                for (int l = 0; l < 4; ++l) ss += c[k][l] * c[k][l];
            ss = block_sum(ss, scratch);
            float inv = (float)(1.0 / sqrt((double)ss / (double)p.d + p.eps));
            row_store_scaled(y, c, inv, w, p.d);
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
