/*
 * Sizes no machine can give, through every infinirt call that takes a size (issue 10,
 * scenario 8): a status, never an abort or a crash, and the device works afterwards. On every
 * device unirt finds. Exit status 0 when every check passed.
 */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"

/* 1 TiB, 2^62, SIZE_MAX and the first size past PTRDIFF_MAX. */
static const size_t HUGE_SIZES[] = {(size_t)1 << 40, (size_t)1 << 62, SIZE_MAX,
                                    (size_t)PTRDIFF_MAX + 1};
#define N_HUGE (sizeof HUGE_SIZES / sizeof HUGE_SIZES[0])

/* Out of memory is INTERNAL_ERROR (as infinirt reports cudaErrorMemoryAllocation); a size
 * past a device's buffer limit is BAD_PARAM. */
#define REFUSED(call) EXPECT2(call, INFINI_STATUS_INTERNAL_ERROR, INFINI_STATUS_BAD_PARAM)

static void sizes_on(infiniDevice_t type, int id) {
    static char where[64];
    snprintf(where, sizeof where, "%d:%d", (int)type, id);
    g_where = where;
    OK(infinirtSetDevice(type, id));
    infinirtStream_t s = NULL;
    OK(infinirtStreamCreate(&s));
    void *d = NULL;
    unsigned char host[256], back[256];
    fill_pattern(host, sizeof host, 3);
    OK(infinirtMalloc(&d, sizeof host));
    OK(infinirtMemcpy(d, host, sizeof host, INFINIRT_MEMCPY_H2D));
    for (size_t i = 0; i < N_HUGE; i++) {
        size_t n = HUGE_SIZES[i];
        void *p = NULL;
        REFUSED(infinirtMalloc(&p, n));
        CHECK(p == NULL);
        REFUSED(infinirtMallocHost(&p, n));
        CHECK(p == NULL);
        REFUSED(infinirtMallocAsync(&p, n, s));
        CHECK(p == NULL);
        /* Copies and sets of a huge size are out of bounds of the 256-byte buffer. */
        EXPECT(infinirtMemcpy(back, d, n, INFINIRT_MEMCPY_D2H), INFINI_STATUS_BAD_PARAM);
        EXPECT(infinirtMemcpy(d, host, n, INFINIRT_MEMCPY_H2D), INFINI_STATUS_BAD_PARAM);
        EXPECT(infinirtMemcpyAsync(d, host, n, INFINIRT_MEMCPY_H2D, s), INFINI_STATUS_BAD_PARAM);
        EXPECT(infinirtMemcpy(d, d, n, INFINIRT_MEMCPY_D2D), INFINI_STATUS_BAD_PARAM);
        EXPECT(infinirtMemset(d, 0, n), INFINI_STATUS_BAD_PARAM);
        EXPECT(infinirtMemsetAsync(d, 0, n, s), INFINI_STATUS_BAD_PARAM);
    }
    /* The device still works, and the buffer is untouched. */
    OK(infinirtStreamSynchronize(s));
    OK(infinirtMemcpy(back, d, sizeof back, INFINIRT_MEMCPY_D2H));
    CHECK(memcmp(back, host, sizeof host) == 0);
    void *e = NULL;
    OK(infinirtMalloc(&e, 1 << 20));
    OK(infinirtMemsetAsync(e, 0x11, 1 << 20, s));
    OK(infinirtStreamSynchronize(s));
    OK(infinirtMemcpy(back, e, sizeof back, INFINIRT_MEMCPY_D2H));
    CHECK(all_bytes(back, sizeof back, 0x11));
    OK(infinirtFree(e));
    OK(infinirtFree(d));
    OK(infinirtStreamDestroy(s));
}

int main(void) {
    const infiniDevice_t types[] = {INFINI_DEVICE_CPU, INFINI_DEVICE_NVIDIA, INFINI_DEVICE_UNIRT_WGPU};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int n = 0;
        OK(infinirtGetDeviceCount(types[t], &n));
        for (int id = 0; id < n; id++) sizes_on(types[t], id);
    }
    return finish("sizes_test");
}
