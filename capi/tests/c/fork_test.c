/*
 * Fork safety through the C ABI (issue 10, scenario 7), on every CPU and wgpu device.
 *
 * The parent sets a device, queues memsets on a created stream, records an event and forks
 * while that work is still pending — what Python's multiprocessing does by default. The child
 * must never hang: calls on the parent's stream, event and memory return a status at once, and
 * the child can work on fresh state (SetDevice again, new stream, memory, event, copies). A GL
 * adapter cannot come back in a forked child (Mesa's EGL state is per process); there
 * SetDevice says so and the child checks the CPU instead. The parent kills a child that takes
 * longer than UNIRT_FORK_TIMEOUT seconds (default 20) and fails.
 *
 * Exit status 0 when every check passed.
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define BIG ((size_t)64 << 20)
#define SMALL 4096

/* The child's work on fresh state, on device (type, id). */
static void fresh_state(infiniDevice_t type, int id) {
    infinirtStream_t s = NULL;
    infinirtEvent_t e = NULL;
    void *d = NULL;
    static unsigned char host[SMALL], back[SMALL];
    OK(infinirtSetDevice(type, id));
    OK(infinirtStreamCreate(&s));
    OK(infinirtEventCreate(&e));
    OK(infinirtMalloc(&d, SMALL));
    fill_pattern(host, SMALL, 7);
    OK(infinirtMemcpy(d, host, SMALL, INFINIRT_MEMCPY_H2D));
    OK(infinirtMemsetAsync(d, 0x5a, SMALL / 2, s));
    OK(infinirtEventRecord(e, s));
    OK(infinirtEventSynchronize(e));
    OK(infinirtStreamSynchronize(s));
    OK(infinirtMemcpy(back, d, SMALL, INFINIRT_MEMCPY_D2H));
    CHECK(all_bytes(back, SMALL / 2, 0x5a));
    CHECK(memcmp(back + SMALL / 2, host + SMALL / 2, SMALL / 2) == 0);
    OK(infinirtFree(d));
    OK(infinirtEventDestroy(e));
    OK(infinirtStreamDestroy(s));
    OK(infinirtDeviceSynchronize());
}

/* Everything the child does; returns its exit status. */
static int child(infiniDevice_t type, int id, infinirtStream_t s, infinirtEvent_t e, void *d) {
    g_where = "child: the parent's objects";
    /* The parent's handles: a status at once. The thread's device opens again on first use,
     * which finds the handles were made before the fork (DEVICE_NOT_INITIALIZED), or cannot
     * open at all (a GL adapter: DEVICE_TYPE_NOT_SUPPORTED). */
    EXPECT2(infinirtStreamSynchronize(s), INFINI_STATUS_DEVICE_NOT_INITIALIZED,
            INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);
    EXPECT2(infinirtEventSynchronize(e), INFINI_STATUS_DEVICE_NOT_INITIALIZED,
            INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);
    infinirtEventStatus_t st;
    EXPECT2(infinirtEventQuery(e, &st), INFINI_STATUS_DEVICE_NOT_INITIALIZED,
            INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);
    EXPECT2(infinirtStreamWaitEvent(NULL, e), INFINI_STATUS_DEVICE_NOT_INITIALIZED,
            INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);
    /* A pointer of the parent's device is not one of the child's allocations. */
    EXPECT2(infinirtFree(d), INFINI_STATUS_BAD_PARAM, INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);
    EXPECT2(infinirtEventDestroy(e), INFINI_STATUS_DEVICE_NOT_INITIALIZED,
            INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);
    EXPECT2(infinirtStreamDestroy(s), INFINI_STATUS_DEVICE_NOT_INITIALIZED,
            INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);

    g_where = "child: fresh state";
    infiniStatus_t set = infinirtSetDevice(type, id);
    if (set == INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED) {
        char msg[512] = {0};
        unirtGetLastErrorMessage(msg, sizeof msg);
        /* Only a GL adapter may refuse, and it must say why. */
        CHECK(type == INFINI_DEVICE_UNIRT_WGPU && strstr(msg, "forked") != NULL);
        fresh_state(INFINI_DEVICE_CPU, 0);
    } else {
        EXPECT(set, INFINI_STATUS_SUCCESS);
        fresh_state(type, id);
    }
    return g_failures ? 1 : 0;
}

static int timeout_seconds(void) {
    const char *v = getenv("UNIRT_FORK_TIMEOUT");
    int t = v ? atoi(v) : 0;
    return t > 0 ? t : 20;
}

/* Forks while work is pending on (type, id); checks the child and the parent after it. */
static void fork_on(infiniDevice_t type, int id) {
    static char where[64];
    snprintf(where, sizeof where, "parent %d:%d", (int)type, id);
    g_where = where;
    infinirtStream_t s = NULL;
    infinirtEvent_t e = NULL;
    void *d = NULL;
    OK(infinirtSetDevice(type, id));
    OK(infinirtStreamCreate(&s));
    OK(infinirtEventCreate(&e));
    OK(infinirtMalloc(&d, BIG));
    for (int i = 0; i < 8; i++) OK(infinirtMemsetAsync(d, i, BIG, s));
    OK(infinirtEventRecord(e, s));
    if (type == INFINI_DEVICE_UNIRT_WGPU) {
        /* On wgpu the pending work is what unirt's stream holds: the driver goes idle first
         * (a fork while another thread is inside the driver may leave the child a lock no
         * thread will release, a limit of fork in threaded processes), then more is queued. */
        OK(infinirtEventSynchronize(e));
        for (int i = 0; i < 8; i++) OK(infinirtMemsetAsync(d, i, BIG, s));
    }

    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(child(type, id, s, e, d));
    CHECK(pid > 0);
    if (pid > 0) {
        int status = 0, limit_ms = timeout_seconds() * 1000, waited = 0;
        struct timespec tick = {0, 20 * 1000 * 1000};
        while (waitpid(pid, &status, WNOHANG) == 0) {
            if (waited >= limit_ms) {
                fprintf(stderr, "[%s] the child hung: killed after %d s\n", where, limit_ms / 1000);
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                g_failures++;
                break;
            }
            nanosleep(&tick, NULL);
            waited += 20;
        }
        g_checks++;
        if (WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL) {
            fprintf(stderr, "[%s] the child died of signal %d\n", where, WTERMSIG(status));
            g_failures++;
        } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
            fprintf(stderr, "[%s] the child's checks failed\n", where);
            g_failures++;
        }
    }

    /* The parent is untouched: its work completes and its objects still work. */
    OK(infinirtEventSynchronize(e));
    OK(infinirtStreamSynchronize(s));
    unsigned char back[16];
    OK(infinirtMemcpy(back, d, sizeof back, INFINIRT_MEMCPY_D2H));
    CHECK(all_bytes(back, sizeof back, 7));
    OK(infinirtFree(d));
    OK(infinirtEventDestroy(e));
    OK(infinirtStreamDestroy(s));
    printf("[%s] fork checks done\n", where);
}

int main(void) {
    const infiniDevice_t types[] = {INFINI_DEVICE_CPU, INFINI_DEVICE_UNIRT_WGPU};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int n = 0;
        OK(infinirtGetDeviceCount(types[t], &n));
        for (int id = 0; id < n; id++) fork_on(types[t], id);
    }
    return finish("fork_test");
}
