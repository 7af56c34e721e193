// The HAL's built-in kernels in CUDA C (unirt::kernel::KERNELS): one `extern "C" __global__`
// function each, compiled from this file by NVRTC. (The elementwise operators are in elementwise.cu.)

// fill(dst: *u32, value: u32, n: u32): dst[i] = value for i < n.
// The signature is unirt::kernel::FILL; arguments arrive in that order.
extern "C" __global__ void fill(unsigned int *dst, unsigned int value, unsigned int n)
{
    // Grid-stride loop: correct for any grid the host picks, including one capped below n.
    unsigned int stride = blockDim.x * gridDim.x;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = value;
        if (stride > n - i) {
            break; // i + stride would wrap past 2^32 - 1 only when it is already >= n
        }
    }
}

// add_f32(a: *f32, b: *f32, out: *f32, n: u32): out[i] = a[i] + b[i] for i < n.
// The signature is unirt::kernel::ADD_F32. `out` may alias `a` or `b` (in-place add): each
// element is read before it is written by the same thread, so no restrict qualifiers.
extern "C" __global__ void add_f32(const float *a, const float *b, float *out, unsigned int n)
{
    unsigned int stride = blockDim.x * gridDim.x;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = a[i] + b[i];
        if (stride > n - i) {
            break; // avoid unsigned wrap-around of i + stride near 2^32
        }
    }
}
