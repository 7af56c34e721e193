// The softmax op family: softmax, log_softmax and causal_softmax along one axis, one block
// per lane (grid-stride over lanes; the block sized to the lane). A causal lane `o` sees keys [0, o % q_len + offset + 1);
// the rest become 0 (−∞ for log_softmax), as on the CPU. Arithmetic in f32; log_softmax is
// (x − max) − ln Σ, so a large max does not swallow ln Σ.

struct Sm {
    Space outer;
    Strides so, si;
    i64 len, lane_so, lane_si;
    i64 causal, q_len, offset, log;
};

extern "C" __global__ void __launch_bounds__(1024) op_softmax(T *out, const T *in, Sm p)
{
    __shared__ float scratch[32];
    for (i64 o = blockIdx.x; o < p.outer.n; o += gridDim.x) {
        const T *x = in + offset_of(p.outer, p.si, o);
        T *y = out + offset_of(p.outer, p.so, o);
        i64 visible = p.len;
        if (p.causal) {
            visible = o % p.q_len + p.offset + 1;
            if (visible > p.len) visible = p.len;
        }
        if (p.lane_si == 1 && p.lane_so == 1 && row_fits(p.len)) {
            // The row read once, into registers.
            RowCache c;
            row_load(c, x, visible);
            float m = UNIRT_NEG_INF;
#pragma unroll
            for (int k = 0; k < ROW_PACKS; ++k)
#pragma unroll
                for (int l = 0; l < 4; ++l)
                    if (row_at(k, l) < visible) m = fmaxf(m, c[k][l]);
            m = block_max(m, scratch);
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < ROW_PACKS; ++k)
#pragma unroll
                for (int l = 0; l < 4; ++l)
                    if (row_at(k, l) < visible) {
                        float e = expf(c[k][l] - m);
                        s += e;
                        if (!p.log) c[k][l] = e;
                    }
            s = block_sum(s, scratch);
            float ln_s = logf(s), inv = 1.0f / s;
#pragma unroll
            for (int k = 0; k < ROW_PACKS; ++k)
#pragma unroll
                for (int l = 0; l < 4; ++l) {
                    float v = c[k][l];
                    if (row_at(k, l) >= visible) c[k][l] = p.log ? UNIRT_NEG_INF : 0.0f;
                    else c[k][l] = p.log ? (v - m) - ln_s : v * inv;
                }
            // Every thread writes only what it read itself, so in place (y == x) is safe.
            row_store(y, c, p.len);
            __syncthreads();
            continue;
        }
        float m = UNIRT_NEG_INF;
        for (i64 j = threadIdx.x; j < visible; j += blockDim.x) m = fmaxf(m, to_f32(x[j * p.lane_si]));
        m = block_max(m, scratch);
        float s = 0.0f;
        for (i64 j = threadIdx.x; j < visible; j += blockDim.x) s += expf(to_f32(x[j * p.lane_si]) - m);
        s = block_sum(s, scratch);
        float ln_s = logf(s), inv = 1.0f / s;
        // Reads above finished in every thread before any write (in place: y may be x).
        __syncthreads();
        for (i64 j = threadIdx.x; j < p.len; j += blockDim.x) {
            float v;
            if (j >= visible) v = p.log ? UNIRT_NEG_INF : 0.0f;
            else {
                float a = to_f32(x[j * p.lane_si]);
                v = p.log ? (a - m) - ln_s : expf(a - m) * inv;
            }
            y[j * p.lane_so] = from_f32<T>(v);
        }
        __syncthreads();
    }
}
