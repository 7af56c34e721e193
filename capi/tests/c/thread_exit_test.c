/*
 * Calls from a thread's exit path: a pthread key destructor (C's way to free per-thread state
 * when a thread exits) that allocates, copies, times, captures and frees through infinirt.h.
 * glibc runs key destructors after the thread-local destructors of the Rust library, so every
 * unirt call here finds its own per-thread state gone: the calling thread's current device,
 * stream and last error. Each call must still work (or answer with a status), on every device
 * unirt finds, and the device set in the thread must be the one used.
 *
 * Exit status 0 when every check passed.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"

#define N 4096

static pthread_key_t g_key;

struct work {
    infiniDevice_t type;
    int id;
    void *kept; /* a buffer the thread allocated, freed by the destructor */
};

static void at_exit(void *arg) {
    struct work *w = arg;
    unsigned char host[N], back[N];
    void *p = NULL;
    infinirtStream_t s = NULL;
    infinirtEvent_t a = NULL, b = NULL;
    infinirtGraph_t g = NULL;
    infinirtGraphExec_t ge = NULL;
    infiniDevice_t type = INFINI_DEVICE_CPU;
    int id = -1;
    float ms = -1;
    g_where = "key destructor";
    OK(infinirtSetDevice(w->type, w->id));
    OK(infinirtGetDevice(&type, &id));
    CHECK(type == w->type && id == w->id);
    fill_pattern(host, N, 7);
    OK(infinirtMalloc(&p, N));
    OK(infinirtStreamCreate(&s));
    OK(infinirtEventCreate(&a));
    OK(infinirtEventCreate(&b));
    OK(infinirtEventRecord(a, s));
    OK(infinirtMemcpyAsync(p, host, N, INFINIRT_MEMCPY_H2D, s));
    OK(infinirtEventRecord(b, s));
    OK(infinirtStreamSynchronize(s));
    OK(infinirtEventElapsedTime(&ms, a, b));
    CHECK(ms >= 0);
    OK(infinirtMemcpy(back, p, N, INFINIRT_MEMCPY_D2H));
    CHECK(memcmp(back, host, N) == 0);
    /* A captured memset, replayed. */
    OK(infinirtStreamBeginCapture(s, INFINIRT_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    OK(infinirtMemsetAsync(p, 0x3c, N, s));
    OK(infinirtStreamEndCapture(s, &g));
    OK(infinirtGraphInstantiate(&ge, g, NULL, NULL, 0));
    OK(infinirtGraphLaunch(ge, s));
    OK(infinirtStreamSynchronize(s));
    OK(infinirtMemcpy(back, p, N, INFINIRT_MEMCPY_D2H));
    CHECK(all_bytes(back, N, 0x3c));
    /* Misuse still answers with a status, and the message is there to read. */
    EXPECT(infinirtFree((void *)(uintptr_t)0x10), INFINI_STATUS_BAD_PARAM);
    char msg[256] = {0};
    OK(unirtGetLastErrorMessage(msg, sizeof msg));
    OK(infinirtGraphExecDestroy(ge));
    OK(infinirtGraphDestroy(g));
    OK(infinirtEventDestroy(a));
    OK(infinirtEventDestroy(b));
    OK(infinirtStreamDestroy(s));
    OK(infinirtFree(p));
    OK(infinirtFree(w->kept));
    OK(infinirtDeviceSynchronize());
}

static void *thread_main(void *arg) {
    struct work *w = arg;
    /* Touch the thread's unirt state first, so that it is destroyed before the key's. */
    OK(infinirtSetDevice(w->type, w->id));
    OK(infinirtMalloc(&w->kept, N));
    OK(infinirtMemset(w->kept, 1, N));
    infinirtStream_t s = NULL;
    OK(infinirtStreamCreate(&s));
    OK(infinirtMemsetAsync(w->kept, 2, N, s));
    OK(infinirtStreamDestroy(s));
    pthread_setspecific(g_key, w);
    return NULL;
}

int main(void) {
    const infiniDevice_t types[] = {INFINI_DEVICE_CPU, INFINI_DEVICE_NVIDIA, INFINI_DEVICE_UNIRT_WGPU};
    pthread_key_create(&g_key, at_exit);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        int n = 0;
        if (infinirtGetDeviceCount(types[k], &n) != INFINI_STATUS_SUCCESS) continue;
        for (int id = 0; id < n; id++) {
            printf("device type %d:%d\n", (int)types[k], id);
            struct work w = {types[k], id, NULL};
            pthread_t t;
            if (pthread_create(&t, NULL, thread_main, &w) != 0) {
                fprintf(stderr, "pthread_create failed\n");
                return 1;
            }
            pthread_join(t, NULL);
        }
    }
    return finish("thread_exit_test");
}
