/* Calls from the places a program reaches while it ends: a pthread key destructor (run after
 * the thread's own Rust thread-locals are torn down) and an atexit handler (after the main
 * thread's). Each must work on the thread's device and return SUCCESS, never crash or report
 * a lost current device. Exit code 0 means every call returned SUCCESS. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "infinirt.h"

static pthread_key_t key;
static volatile int destructor_failures = -1;

static int run_calls(const char *where) {
    int failures = 0;
    void *p = NULL;
    infinirtStream_t s = NULL;
    unsigned char back[256];
#define TRY(call)                                                                    \
    do {                                                                             \
        infiniStatus_t st_ = (call);                                                 \
        if (st_ != INFINI_STATUS_SUCCESS) {                                          \
            fprintf(stderr, "%s: %s returned %d\n", where, #call, (int)st_);         \
            failures++;                                                              \
        }                                                                            \
    } while (0)
    infiniDevice_t dev = INFINI_DEVICE_NVIDIA;
    int id = -1;
    TRY(infinirtGetDevice(&dev, &id));
    if (dev != INFINI_DEVICE_CPU || id != 0) {
        fprintf(stderr, "%s: current device is %d:%d, expected the CPU\n", where, (int)dev, id);
        failures++;
    }
    TRY(infinirtMalloc(&p, sizeof back));
    TRY(infinirtStreamCreate(&s));
    TRY(infinirtMemsetAsync(p, 0x5a, sizeof back, s));
    TRY(infinirtStreamSynchronize(s));
    TRY(infinirtMemcpy(back, p, sizeof back, INFINIRT_MEMCPY_D2H));
    if (p != NULL && back[0] != 0x5a) {
        fprintf(stderr, "%s: memset did not arrive\n", where);
        failures++;
    }
    TRY(infinirtStreamDestroy(s));
    TRY(infinirtFree(p));
    TRY(infinirtDeviceSynchronize());
    return failures;
#undef TRY
}

static void key_destructor(void *value) {
    (void)value;
    destructor_failures = run_calls("thread-exit destructor");
}

static void *thread_main(void *arg) {
    (void)arg;
    /* Use the runtime first, so the thread's cached device exists and is torn down at exit. */
    void *p = NULL;
    if (infinirtMalloc(&p, 64) != INFINI_STATUS_SUCCESS || infinirtFree(p) != INFINI_STATUS_SUCCESS)
        return (void *)1;
    pthread_setspecific(key, (void *)1);
    return NULL;
}

static void at_exit_handler(void) {
    int failures = run_calls("atexit handler");
    if (failures != 0) _exit(3);
    printf("exit_paths: atexit handler calls succeeded\n");
    fflush(stdout);
}

int main(void) {
    if (infinirtInit() != INFINI_STATUS_SUCCESS) return 1;
    if (infinirtSetDevice(INFINI_DEVICE_CPU, 0) != INFINI_STATUS_SUCCESS) return 1;
    if (pthread_key_create(&key, key_destructor) != 0) return 1;
    pthread_t t;
    void *ret = NULL;
    if (pthread_create(&t, NULL, thread_main, NULL) != 0) return 1;
    pthread_join(t, &ret);
    if (ret != NULL || destructor_failures != 0) {
        fprintf(stderr, "exit_paths: thread-exit destructor failures: %d\n", destructor_failures);
        return 2;
    }
    printf("exit_paths: thread-exit destructor calls succeeded\n");
    atexit(at_exit_handler);
    return 0;
}
