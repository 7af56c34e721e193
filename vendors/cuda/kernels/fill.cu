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
