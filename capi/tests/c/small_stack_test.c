/*
 * A C program may call infinirt from a thread it made with a small stack. The first calls —
 * discovery (infinirtInit, the device counts) and each device's first use — start drivers and
 * compile kernels, which recurse deeply (the Vulkan loader's device enumeration overflowed a
 * 32 KiB stack and ended the process); unirt runs them on a thread of its own with a roomy
 * stack where the caller's is small. Here they run on a 32 KiB thread for every device unirt
 * finds (and CPU memory is used there too); the main thread then checks that every device
 * works. Exit status 0 when every check passed.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"

static const infiniDevice_t TYPES[] = {INFINI_DEVICE_CPU, INFINI_DEVICE_NVIDIA,
                                       INFINI_DEVICE_UNIRT_WGPU};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

static void *first_use(void *arg) {
    (void)arg;
    g_where = "small stack";
    OK(infinirtInit());
    int counts[INFINI_DEVICE_TYPE_COUNT] = {0};
    OK(infinirtGetAllDeviceCount(counts));
    CHECK(counts[INFINI_DEVICE_CPU] == 1);
    for (size_t t = 0; t < N_TYPES; t++) {
        int n = 0;
        OK(infinirtGetDeviceCount(TYPES[t], &n));
        for (int id = 0; id < n; id++) OK(infinirtSetDevice(TYPES[t], id));
    }
    /* CPU memory in use on the small stack too. */
    OK(infinirtSetDevice(INFINI_DEVICE_CPU, 0));
    void *d = NULL;
    unsigned char back[64];
    OK(infinirtMalloc(&d, 4096));
    OK(infinirtMemset(d, 0x5a, 4096));
    OK(infinirtMemcpy(back, d, sizeof back, INFINIRT_MEMCPY_D2H));
    CHECK(all_bytes(back, sizeof back, 0x5a));
    OK(infinirtFree(d));
    return NULL;
}

static void works(infiniDevice_t type, int id) {
    static char where[64];
    snprintf(where, sizeof where, "%d:%d after", (int)type, id);
    g_where = where;
    OK(infinirtSetDevice(type, id));
    void *d = NULL;
    unsigned char host[256], back[256];
    fill_pattern(host, sizeof host, (unsigned)id + 7);
    OK(infinirtMalloc(&d, 1 << 16));
    OK(infinirtMemset(d, 0x3c, 1 << 16));
    OK(infinirtMemcpy(back, d, sizeof back, INFINIRT_MEMCPY_D2H));
    CHECK(all_bytes(back, sizeof back, 0x3c));
    OK(infinirtMemcpy(d, host, sizeof host, INFINIRT_MEMCPY_H2D));
    OK(infinirtMemcpy(back, d, sizeof back, INFINIRT_MEMCPY_D2H));
    CHECK(memcmp(back, host, sizeof host) == 0);
    OK(infinirtFree(d));
}

int main(void) {
    size_t stack = 32 << 10;
    long least = sysconf(_SC_THREAD_STACK_MIN);
    if (least > 0 && stack < (size_t)least) stack = (size_t)least;
    pthread_attr_t attr;
    pthread_t t;
    CHECK(pthread_attr_init(&attr) == 0);
    CHECK(pthread_attr_setstacksize(&attr, stack) == 0);
    CHECK(pthread_create(&t, &attr, first_use, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    pthread_attr_destroy(&attr);
    for (size_t i = 0; i < N_TYPES; i++) {
        int n = 0;
        OK(infinirtGetDeviceCount(TYPES[i], &n));
        for (int id = 0; id < n; id++) works(TYPES[i], id);
    }
    return finish("small_stack_test");
}
