/*
 * The checks of InfiniCore's own `infinirt-test`, in C: for every device, SetDevice, then for
 * 1 Ki, 4 Ki and 2 Mi floats (and 1 Gi floats when UNIRT_BIG_TESTS=1): two Mallocs, Memcpy
 * H2D -> D2D -> D2H, memcmp, Free. Uses only upstream's API. Exit status 0 on success.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infinirt.h>

static int test_memcpy(infiniDevice_t device, int id, size_t count) {
    size_t bytes = count * sizeof(float);
    float *host = malloc(bytes), *copy = malloc(bytes);
    void *src = NULL, *dst = NULL;
    int ok = 0;
    if (!host || !copy) {
        fprintf(stderr, "[%d:%d] host allocation of %zu bytes failed\n", (int)device, id, bytes);
        goto out;
    }
    for (size_t i = 0; i < count; i++) host[i] = 1.23f + (float)(i % 1000);
    memset(copy, 0, bytes);
    if (infinirtMalloc(&src, bytes) != INFINI_STATUS_SUCCESS ||
        infinirtMalloc(&dst, bytes) != INFINI_STATUS_SUCCESS) {
        fprintf(stderr, "[%d:%d] infinirtMalloc(%zu) failed\n", (int)device, id, bytes);
        goto out;
    }
    if (infinirtMemcpy(src, host, bytes, INFINIRT_MEMCPY_H2D) != INFINI_STATUS_SUCCESS ||
        infinirtMemcpy(dst, src, bytes, INFINIRT_MEMCPY_D2D) != INFINI_STATUS_SUCCESS ||
        infinirtMemcpy(copy, dst, bytes, INFINIRT_MEMCPY_D2H) != INFINI_STATUS_SUCCESS) {
        fprintf(stderr, "[%d:%d] infinirtMemcpy of %zu bytes failed\n", (int)device, id, bytes);
        goto out;
    }
    if (memcmp(host, copy, bytes) != 0) {
        fprintf(stderr, "[%d:%d] data mismatch after %zu-byte round trip\n", (int)device, id, bytes);
        goto out;
    }
    ok = 1;
    printf("[%d:%d] memcpy of %zu floats PASSED\n", (int)device, id, count);
out:
    if (src && infinirtFree(src) != INFINI_STATUS_SUCCESS) ok = 0;
    if (dst && infinirtFree(dst) != INFINI_STATUS_SUCCESS) ok = 0;
    free(host);
    free(copy);
    return ok;
}

int main(void) {
    const infiniDevice_t types[] = {INFINI_DEVICE_CPU, INFINI_DEVICE_NVIDIA, INFINI_DEVICE_UNIRT_WGPU};
    const char *big = getenv("UNIRT_BIG_TESTS");
    size_t sizes[] = {1u << 10, 4u << 10, 2u << 20, (size_t)1 << 30};
    size_t nsizes = big && strcmp(big, "1") == 0 ? 4 : 3;
    int counts[INFINI_DEVICE_TYPE_COUNT];
    int tested = 0;

    if (infinirtGetAllDeviceCount(counts) != INFINI_STATUS_SUCCESS) {
        fprintf(stderr, "infinirtGetAllDeviceCount failed\n");
        return 1;
    }
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int n = 0;
        if (infinirtGetDeviceCount(types[t], &n) != INFINI_STATUS_SUCCESS) {
            fprintf(stderr, "infinirtGetDeviceCount(%d) failed\n", (int)types[t]);
            return 1;
        }
        if (types[t] < INFINI_DEVICE_TYPE_COUNT && n != counts[types[t]]) {
            fprintf(stderr, "device counts disagree for type %d\n", (int)types[t]);
            return 1;
        }
        for (int id = 0; id < n; id++) {
            if (infinirtSetDevice(types[t], id) != INFINI_STATUS_SUCCESS) {
                fprintf(stderr, "infinirtSetDevice(%d, %d) failed\n", (int)types[t], id);
                return 1;
            }
            for (size_t s = 0; s < nsizes; s++)
                if (!test_memcpy(types[t], id, sizes[s])) return 1;
            tested++;
        }
    }
    printf("infinirt_test: %d device(s) PASSED\n", tested);
    return tested > 0 ? 0 : 1;
}
