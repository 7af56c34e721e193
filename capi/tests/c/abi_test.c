/*
 * Calls every function of infinirt.h, with good and bad input, on every device unirt finds
 * (CPU always; NVIDIA and the wgpu extension type when present), and checks statuses and data.
 * Exit status 0 when every check passed.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"

#define N 4096

/* A pointer value no allocation or handle ever has. */
#define BOGUS ((void *)(uintptr_t)0xdead0)

_Static_assert(sizeof(infinirtDeviceResourceSnapshot_t) == 80, "snapshot layout");
_Static_assert(INFINI_DEVICE_TYPE_COUNT == 11, "device type count");

static const infiniDevice_t ALL_TYPES[] = {INFINI_DEVICE_CPU, INFINI_DEVICE_NVIDIA, INFINI_DEVICE_UNIRT_WGPU};

static void test_discovery(void) {
    g_where = "discovery";
    infiniDevice_t d = (infiniDevice_t)-1;
    int id = -1;
    /* Before any SetDevice the thread is on CPU 0. */
    OK(infinirtGetDevice(&d, &id));
    CHECK(d == INFINI_DEVICE_CPU && id == 0);
    OK(infinirtInit());

    int counts[INFINI_DEVICE_TYPE_COUNT];
    memset(counts, 0xff, sizeof counts);
    EXPECT(infinirtGetAllDeviceCount(NULL), INFINI_STATUS_NULL_POINTER);
    OK(infinirtGetAllDeviceCount(counts));
    CHECK(counts[INFINI_DEVICE_CPU] == 1);
    for (int t = INFINI_DEVICE_CAMBRICON; t < INFINI_DEVICE_TYPE_COUNT; t++) CHECK(counts[t] == 0);
    CHECK(counts[INFINI_DEVICE_NVIDIA] >= 0);

    int n = -1;
    EXPECT(infinirtGetDeviceCount(INFINI_DEVICE_CPU, NULL), INFINI_STATUS_NULL_POINTER);
    OK(infinirtGetDeviceCount(INFINI_DEVICE_CPU, &n));
    CHECK(n == 1);
    OK(infinirtGetDeviceCount(INFINI_DEVICE_NVIDIA, &n));
    CHECK(n == counts[INFINI_DEVICE_NVIDIA]);
    OK(infinirtGetDeviceCount(INFINI_DEVICE_ASCEND, &n));
    CHECK(n == 0);
    OK(infinirtGetDeviceCount(INFINI_DEVICE_UNIRT_WGPU, &n));
    CHECK(n >= 0);
    EXPECT(infinirtGetDeviceCount((infiniDevice_t)42, &n), INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);
    EXPECT(infinirtGetDeviceCount(INFINI_DEVICE_TYPE_COUNT, &n), INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);

    /* GetDevice: one NULL is fine, two is not. */
    EXPECT(infinirtGetDevice(NULL, NULL), INFINI_STATUS_NULL_POINTER);
    d = (infiniDevice_t)-1;
    OK(infinirtGetDevice(&d, NULL));
    CHECK(d == INFINI_DEVICE_CPU);
    id = -1;
    OK(infinirtGetDevice(NULL, &id));
    CHECK(id == 0);

    /* SetDevice failures leave the current device alone. */
    EXPECT(infinirtSetDevice(INFINI_DEVICE_CAMBRICON, 0), INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);
    EXPECT(infinirtSetDevice((infiniDevice_t)42, 0), INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);
    EXPECT(infinirtSetDevice(INFINI_DEVICE_CPU, 1), INFINI_STATUS_DEVICE_NOT_FOUND);
    EXPECT(infinirtSetDevice(INFINI_DEVICE_CPU, -1), INFINI_STATUS_DEVICE_NOT_FOUND);
    for (size_t i = 0; i < sizeof ALL_TYPES / sizeof ALL_TYPES[0]; i++) {
        int c = 0;
        OK(infinirtGetDeviceCount(ALL_TYPES[i], &c));
        if (c == 0) {
            EXPECT(infinirtSetDevice(ALL_TYPES[i], 0), INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);
            EXPECT(infinirtSetDevice(ALL_TYPES[i], -1), INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);
            size_t f0 = 0, t0 = 0;
            EXPECT(infinirtGetMemInfo(ALL_TYPES[i], 0, &f0, &t0), INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);
        } else
            EXPECT(infinirtSetDevice(ALL_TYPES[i], c), INFINI_STATUS_DEVICE_NOT_FOUND);
    }
    OK(infinirtGetDevice(&d, &id));
    CHECK(d == INFINI_DEVICE_CPU && id == 0);

    /* Memory info and snapshots. */
    size_t fr = 0, tot = 0;
    EXPECT(infinirtGetMemInfo(INFINI_DEVICE_CPU, 0, NULL, &tot), INFINI_STATUS_NULL_POINTER);
    EXPECT(infinirtGetMemInfo(INFINI_DEVICE_CPU, 0, &fr, NULL), INFINI_STATUS_NULL_POINTER);
    OK(infinirtGetMemInfo(INFINI_DEVICE_CPU, 0, &fr, &tot));
    CHECK(tot > 0 && fr <= tot);
    EXPECT(infinirtGetMemInfo(INFINI_DEVICE_CPU, 3, &fr, &tot), INFINI_STATUS_DEVICE_NOT_FOUND);
    EXPECT(infinirtGetMemInfo(INFINI_DEVICE_KUNLUN, 0, &fr, &tot), INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);
    infinirtDeviceResourceSnapshot_t snap;
    memset(&snap, 0xff, sizeof snap);
    EXPECT(infinirtGetDeviceResourceSnapshot(INFINI_DEVICE_CPU, 0, NULL), INFINI_STATUS_NULL_POINTER);
    OK(infinirtGetDeviceResourceSnapshot(INFINI_DEVICE_CPU, 0, &snap));
    CHECK(snap.device_type == INFINI_DEVICE_CPU && snap.device_id == 0);
    CHECK(snap.valid_fields & INFINIRT_RESOURCE_FIELD_MEMORY_CAPACITY);
    CHECK(snap.total_bytes > 0 && snap.free_bytes + snap.used_bytes == snap.total_bytes);
    CHECK(snap.communication_bytes == 0 && snap.compute_utilization == 0.0f);
    EXPECT(infinirtGetDeviceResourceSnapshot(INFINI_DEVICE_HYGON, 0, &snap),
           INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED);

    /* The last-error extension. */
    char msg[64];
    EXPECT(unirtGetLastErrorMessage(NULL, 8), INFINI_STATUS_NULL_POINTER);
    EXPECT(infinirtSetDevice(INFINI_DEVICE_CPU, 7), INFINI_STATUS_DEVICE_NOT_FOUND);
    OK(unirtGetLastErrorMessage(msg, sizeof msg));
    CHECK(strstr(msg, "cpu:7") != NULL);
    OK(unirtGetLastErrorMessage(msg, 4));
    CHECK(strlen(msg) == 3);
}

static void test_memory(void) {
    unsigned char host[N], back[N];
    void *a = NULL, *b = NULL, *z = BOGUS;
    fill_pattern(host, N, 1);

    EXPECT(infinirtMalloc(NULL, 16), INFINI_STATUS_NULL_POINTER);
    OK(infinirtMalloc(&z, 0));
    CHECK(z == NULL);
    OK(infinirtMalloc(&a, N));
    OK(infinirtMalloc(&b, N));
    CHECK(a != NULL && b != NULL && a != b);

    /* H2D -> D2D -> D2H round trip. */
    OK(infinirtMemcpy(a, host, N, INFINIRT_MEMCPY_H2D));
    OK(infinirtMemcpy(b, a, N, INFINIRT_MEMCPY_D2D));
    memset(back, 0, N);
    OK(infinirtMemcpy(back, b, N, INFINIRT_MEMCPY_D2H));
    CHECK(memcmp(host, back, N) == 0);
    /* H2H between host buffers. */
    memset(back, 0, N);
    OK(infinirtMemcpy(back, host, N, INFINIRT_MEMCPY_H2H));
    CHECK(memcmp(host, back, N) == 0);
    /* Interior pointers are valid device addresses. */
    OK(infinirtMemcpy((char *)b + 8, (char *)a + 16, 64, INFINIRT_MEMCPY_D2D));
    OK(infinirtMemcpy(back, (char *)b + 8, 64, INFINIRT_MEMCPY_D2H));
    CHECK(memcmp(back, host + 16, 64) == 0);

    /* Bad kinds, out of bounds, NULL, zero bytes. */
    EXPECT(infinirtMemcpy(a, host, 16, (infinirtMemcpyKind_t)7), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMemcpy(a, host, 16, (infinirtMemcpyKind_t)-1), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMemcpy((char *)a + N - 8, host, 16, INFINIRT_MEMCPY_H2D), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMemcpy(back, a, N + 1, INFINIRT_MEMCPY_D2H), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMemcpy(b, (char *)a + 1, N, INFINIRT_MEMCPY_D2D), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMemcpy(BOGUS, host, 16, INFINIRT_MEMCPY_H2D), INFINI_STATUS_BAD_PARAM);
    EXPECT2(infinirtMemcpy(NULL, host, 16, INFINIRT_MEMCPY_H2D), INFINI_STATUS_NULL_POINTER,
            INFINI_STATUS_BAD_PARAM);
    EXPECT2(infinirtMemcpy(back, NULL, 16, INFINIRT_MEMCPY_D2H), INFINI_STATUS_NULL_POINTER,
            INFINI_STATUS_BAD_PARAM);
    OK(infinirtMemcpy(NULL, NULL, 0, INFINIRT_MEMCPY_D2D));
    /* The failed copies changed nothing. */
    OK(infinirtMemcpy(back, a, N, INFINIRT_MEMCPY_D2H));
    CHECK(memcmp(host, back, N) == 0);

    /* Memset: the low byte of value, bounds-checked. */
    OK(infinirtMemset(a, 0x15A, N));
    OK(infinirtMemcpy(back, a, N, INFINIRT_MEMCPY_D2H));
    CHECK(all_bytes(back, N, 0x5A));
    OK(infinirtMemset((char *)a + 100, 0, 10));
    OK(infinirtMemcpy(back, a, N, INFINIRT_MEMCPY_D2H));
    CHECK(all_bytes(back + 100, 10, 0) && back[99] == 0x5A && back[110] == 0x5A);
    EXPECT(infinirtMemset(a, 0, N + 1), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMemset(BOGUS, 0, 1), INFINI_STATUS_BAD_PARAM);
    OK(infinirtMemset(a, 0, 0));

    /* Free: NULL is a no-op; interior, bogus and double frees are errors; use after free too. */
    OK(infinirtFree(NULL));
    EXPECT(infinirtFree((char *)a + 8), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtFree(BOGUS), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtFree(host), INFINI_STATUS_BAD_PARAM);
    OK(infinirtFree(a));
    EXPECT(infinirtFree(a), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMemcpy(a, host, 16, INFINIRT_MEMCPY_H2D), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMemcpy(back, a, 16, INFINIRT_MEMCPY_D2H), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMemset(a, 0, 16), INFINI_STATUS_BAD_PARAM);
    OK(infinirtFree(b));

    /* Pinned host memory. */
    void *h = NULL;
    EXPECT(infinirtMallocHost(NULL, 16), INFINI_STATUS_NULL_POINTER);
    OK(infinirtMallocHost(&h, N));
    CHECK(h != NULL);
    if (h) {
        memcpy(h, host, N);
        OK(infinirtMalloc(&a, N));
        OK(infinirtMemcpy(a, h, N, INFINIRT_MEMCPY_H2D));
        memset(h, 0, N);
        OK(infinirtMemcpy(h, a, N, INFINIRT_MEMCPY_D2H));
        CHECK(memcmp(h, host, N) == 0);
        OK(infinirtFree(a));
        OK(infinirtFreeHost(h));
        EXPECT(infinirtFreeHost(h), INFINI_STATUS_BAD_PARAM);
    }
    OK(infinirtFreeHost(NULL));
    EXPECT(infinirtFreeHost(BOGUS), INFINI_STATUS_BAD_PARAM);
}

static void test_streams_events(void) {
    unsigned char host[N], back[N];
    void *a = NULL;
    infinirtStream_t s = NULL, s2 = NULL;
    infinirtEvent_t e0 = NULL, e1 = NULL, nt = NULL;
    fill_pattern(host, N, 2);
    OK(infinirtMalloc(&a, N));

    EXPECT(infinirtStreamCreate(NULL), INFINI_STATUS_NULL_POINTER);
    OK(infinirtStreamCreate(&s));
    OK(infinirtStreamCreate(&s2));
    CHECK(s != NULL && s2 != NULL && s != s2);

    /* Async copies and sets, on a stream and on the default (NULL) stream. */
    OK(infinirtMemsetAsync(a, 0, N, s));
    OK(infinirtMemcpyAsync(a, host, N / 2, INFINIRT_MEMCPY_H2D, s));
    OK(infinirtStreamSynchronize(s));
    OK(infinirtMemcpyAsync(back, a, N, INFINIRT_MEMCPY_D2H, NULL));
    OK(infinirtStreamSynchronize(NULL));
    CHECK(memcmp(back, host, N / 2) == 0 && all_bytes(back + N / 2, N / 2, 0));
    EXPECT(infinirtMemcpyAsync(a, host, 16, (infinirtMemcpyKind_t)9, s), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMemcpyAsync(a, host, N + 16, INFINIRT_MEMCPY_H2D, s), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMemsetAsync((char *)a + N, 0, 1, s), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMemsetAsync(a, 0, 16, BOGUS), INFINI_STATUS_BAD_PARAM);

    /* Events. */
    infinirtEventStatus_t st = (infinirtEventStatus_t)-1;
    EXPECT(infinirtEventCreate(NULL), INFINI_STATUS_NULL_POINTER);
    EXPECT(infinirtEventCreateWithFlags(NULL, 0), INFINI_STATUS_NULL_POINTER);
    EXPECT(infinirtEventCreateWithFlags(&nt, 0x8), INFINI_STATUS_BAD_PARAM);
    OK(infinirtEventCreate(&e0));
    OK(infinirtEventCreateWithFlags(&e1, INFINIRT_EVENT_BLOCKING_SYNC));
    OK(infinirtEventCreateWithFlags(&nt, INFINIRT_EVENT_DISABLE_TIMING));
    OK(infinirtEventQuery(e0, &st));
    CHECK(st == INFINIRT_EVENT_COMPLETE); /* never recorded */
    EXPECT(infinirtEventQuery(e0, NULL), INFINI_STATUS_NULL_POINTER);
    EXPECT(infinirtEventQuery(NULL, &st), INFINI_STATUS_NULL_POINTER);
    float ms = -1.0f;
    EXPECT(infinirtEventElapsedTime(&ms, e0, e1), INFINI_STATUS_BAD_PARAM); /* never recorded */

    OK(infinirtEventRecord(e0, s));
    OK(infinirtMemsetAsync(a, 7, N, s));
    OK(infinirtEventRecord(e1, s));
    OK(infinirtEventRecord(nt, s));
    OK(infinirtEventSynchronize(e1));
    OK(infinirtEventQuery(e1, &st));
    CHECK(st == INFINIRT_EVENT_COMPLETE);
    OK(infinirtEventElapsedTime(&ms, e0, e1));
    CHECK(ms >= 0.0f);
    EXPECT(infinirtEventElapsedTime(NULL, e0, e1), INFINI_STATUS_NULL_POINTER);
    EXPECT(infinirtEventElapsedTime(&ms, NULL, e1), INFINI_STATUS_NULL_POINTER);
    OK(infinirtEventSynchronize(nt));
    EXPECT(infinirtEventElapsedTime(&ms, e0, nt), INFINI_STATUS_BAD_PARAM); /* DISABLE_TIMING */
    EXPECT(infinirtEventElapsedTime(&ms, e0, BOGUS), INFINI_STATUS_BAD_PARAM);

    /* NOT_READY while recorded work is pending: a large set, then a record, then a query. */
    void *big = NULL;
    size_t big_n = 8u << 20;
    int not_ready = 0;
    OK(infinirtMalloc(&big, big_n));
    for (int i = 0; i < 8 && !not_ready; i++) {
        OK(infinirtMemsetAsync(big, i, big_n, s));
        OK(infinirtMemsetAsync(big, i + 1, big_n, s));
        OK(infinirtEventRecord(e1, s));
        OK(infinirtEventQuery(e1, &st));
        CHECK(st == INFINIRT_EVENT_COMPLETE || st == INFINIRT_EVENT_NOT_READY);
        not_ready |= st == INFINIRT_EVENT_NOT_READY;
        /* A second stream ordered after the event sees the finished set. */
        OK(infinirtStreamWaitEvent(s2, e1));
        OK(infinirtMemcpyAsync(back, (char *)big + big_n - N, N, INFINIRT_MEMCPY_D2H, s2));
        OK(infinirtStreamSynchronize(s2));
        CHECK(all_bytes(back, N, (unsigned char)(i + 1)));
        OK(infinirtEventQuery(e1, &st));
        CHECK(st == INFINIRT_EVENT_COMPLETE);
    }
    CHECK(not_ready);
    OK(infinirtFree(big));
    EXPECT(infinirtStreamWaitEvent(s2, NULL), INFINI_STATUS_NULL_POINTER);
    EXPECT(infinirtStreamWaitEvent(s2, BOGUS), INFINI_STATUS_BAD_PARAM);
    OK(infinirtStreamWaitEvent(NULL, e0));

    /* Stream-ordered memory. */
    void *m = NULL;
    EXPECT(infinirtMallocAsync(NULL, 64, s), INFINI_STATUS_NULL_POINTER);
    OK(infinirtMallocAsync(&m, 256, s));
    CHECK(m != NULL);
    OK(infinirtMemsetAsync(m, 0x33, 256, s));
    OK(infinirtMemcpyAsync(back, m, 256, INFINIRT_MEMCPY_D2H, s));
    OK(infinirtFreeAsync(m, s));
    OK(infinirtStreamSynchronize(s));
    CHECK(all_bytes(back, 256, 0x33));
    EXPECT(infinirtFreeAsync(m, s), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMallocAsync(&m, 64, BOGUS), INFINI_STATUS_BAD_PARAM);

    OK(infinirtDeviceSynchronize());

    /* Destroyed and never-created handles. */
    EXPECT(infinirtStreamDestroy(NULL), INFINI_STATUS_BAD_PARAM); /* the default stream */
    EXPECT(infinirtStreamDestroy(BOGUS), INFINI_STATUS_BAD_PARAM);
    OK(infinirtStreamDestroy(s2));
    EXPECT(infinirtStreamDestroy(s2), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtStreamSynchronize(s2), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtMemcpyAsync(a, host, 16, INFINIRT_MEMCPY_H2D, s2), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtEventRecord(e0, s2), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtStreamWaitEvent(s2, e0), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtStreamSynchronize(BOGUS), INFINI_STATUS_BAD_PARAM);
    OK(infinirtEventDestroy(e0));
    EXPECT(infinirtEventDestroy(e0), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtEventRecord(e0, s), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtEventQuery(e0, &st), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtEventSynchronize(e0), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtEventElapsedTime(&ms, e0, e1), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtEventDestroy(NULL), INFINI_STATUS_NULL_POINTER);
    EXPECT(infinirtEventSynchronize(NULL), INFINI_STATUS_NULL_POINTER);
    EXPECT(infinirtEventRecord(NULL, s), INFINI_STATUS_NULL_POINTER);
    OK(infinirtEventDestroy(e1));
    OK(infinirtEventDestroy(nt));
    OK(infinirtStreamDestroy(s));
    OK(infinirtFree(a));
}

static void test_capture(void) {
    unsigned char host[N], back[N];
    void *a = NULL, *b = NULL, *tmp = NULL;
    infinirtStream_t s = NULL;
    infinirtGraph_t g = NULL, g2 = NULL;
    infinirtGraphExec_t x = NULL, x2 = NULL;
    infinirtGraphNode_t node = BOGUS;
    char log[256];
    fill_pattern(host, N, 3);
    OK(infinirtMalloc(&a, N));
    OK(infinirtMalloc(&b, N));
    OK(infinirtMemset(b, 0, N));
    OK(infinirtStreamCreate(&s));

    EXPECT(infinirtStreamBeginCapture(s, (infinirtStreamCaptureMode_t)7), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtStreamEndCapture(s, &g), INFINI_STATUS_BAD_PARAM); /* not capturing */
    OK(infinirtStreamBeginCapture(s, INFINIRT_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(infinirtStreamBeginCapture(s, INFINIRT_STREAM_CAPTURE_MODE_GLOBAL), INFINI_STATUS_BAD_PARAM);
    OK(infinirtMemcpyAsync(a, host, N, INFINIRT_MEMCPY_H2D, s));
    OK(infinirtMemsetAsync(a, 0x11, 32, s));
    OK(infinirtMemcpyAsync(b, a, N, INFINIRT_MEMCPY_D2D, s));
    EXPECT(infinirtStreamEndCapture(s, NULL), INFINI_STATUS_NULL_POINTER); /* still capturing */
    OK(infinirtStreamEndCapture(s, &g));
    CHECK(g != NULL);
    EXPECT(infinirtStreamEndCapture(s, &g2), INFINI_STATUS_BAD_PARAM);
    /* Captured work has not run. */
    OK(infinirtMemcpy(back, b, N, INFINIRT_MEMCPY_D2H));
    CHECK(all_bytes(back, N, 0));

    /* The log and *node_ptr are written on every failure, bad arguments included. */
    log[0] = 0;
    node = BOGUS;
    EXPECT(infinirtGraphInstantiate(NULL, g, &node, log, sizeof log), INFINI_STATUS_NULL_POINTER);
    CHECK(node == NULL && strlen(log) > 0);
    log[0] = 0;
    node = BOGUS;
    EXPECT(infinirtGraphInstantiate(&x, NULL, &node, log, sizeof log), INFINI_STATUS_NULL_POINTER);
    CHECK(node == NULL && strlen(log) > 0);
    OK(infinirtGraphInstantiate(&x, g, &node, log, sizeof log));
    CHECK(x != NULL && node == NULL);
    OK(infinirtGraphLuanch(x, s));
    OK(infinirtStreamSynchronize(s));
    OK(infinirtMemcpy(back, b, N, INFINIRT_MEMCPY_D2H));
    CHECK(all_bytes(back, 32, 0x11) && memcmp(back + 32, host + 32, N - 32) == 0);

    /* Replay again, on the default stream, through the correctly spelled alias. */
    OK(infinirtMemset(b, 0, N));
    OK(infinirtMemset(a, 0, N));
    OK(infinirtGraphLaunch(x, NULL));
    OK(infinirtStreamSynchronize(NULL));
    OK(infinirtMemcpy(back, b, N, INFINIRT_MEMCPY_D2H));
    CHECK(all_bytes(back, 32, 0x11) && memcmp(back + 32, host + 32, N - 32) == 0);

    /* The graph can go; its executable stays. */
    OK(infinirtGraphDestroy(g));
    EXPECT(infinirtGraphDestroy(g), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtGraphDestroy(NULL), INFINI_STATUS_NULL_POINTER);
    log[0] = 0;
    EXPECT(infinirtGraphInstantiate(&x2, g, NULL, log, sizeof log), INFINI_STATUS_BAD_PARAM);
    CHECK(strlen(log) > 0);
    EXPECT(infinirtGraphInstantiate(&x2, g, NULL, log, 1), INFINI_STATUS_BAD_PARAM);
    CHECK(log[0] == 0);
    OK(infinirtGraphLuanch(x, s));
    OK(infinirtStreamSynchronize(s));

    /* A replay that would touch freed memory is refused. */
    OK(infinirtMalloc(&tmp, 64));
    OK(infinirtStreamBeginCapture(s, INFINIRT_STREAM_CAPTURE_MODE_RELAXED));
    OK(infinirtMemsetAsync(tmp, 1, 64, s));
    OK(infinirtStreamEndCapture(s, &g2));
    OK(infinirtGraphInstantiate(&x2, g2, NULL, NULL, 0));
    OK(infinirtFree(tmp));
    EXPECT(infinirtGraphLuanch(x2, s), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtGraphInstantiate(&x, g2, NULL, log, sizeof log), INFINI_STATUS_BAD_PARAM);
    OK(infinirtGraphExecDestroy(x2));
    OK(infinirtGraphDestroy(g2));

    OK(infinirtGraphExecDestroy(x));
    EXPECT(infinirtGraphExecDestroy(x), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtGraphLuanch(x, s), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtGraphLuanch(NULL, s), INFINI_STATUS_NULL_POINTER);
    EXPECT(infinirtGraphExecDestroy(NULL), INFINI_STATUS_NULL_POINTER);
    EXPECT(infinirtGraphLuanch(BOGUS, NULL), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtStreamBeginCapture(BOGUS, INFINIRT_STREAM_CAPTURE_MODE_GLOBAL), INFINI_STATUS_BAD_PARAM);

    OK(infinirtStreamDestroy(s));
    OK(infinirtFree(a));
    OK(infinirtFree(b));
}

/* A new thread starts on CPU 0 whatever the creating thread selected. */
static void *thread_body(void *arg) {
    int *ok = (int *)arg;
    infiniDevice_t d = (infiniDevice_t)-1;
    int id = -1;
    *ok = infinirtGetDevice(&d, &id) == INFINI_STATUS_SUCCESS && d == INFINI_DEVICE_CPU && id == 0;
    void *p = NULL;
    *ok = *ok && infinirtMalloc(&p, 64) == INFINI_STATUS_SUCCESS && p != NULL &&
          infinirtFree(p) == INFINI_STATUS_SUCCESS;
    return NULL;
}

static void test_thread_local(infiniDevice_t type, int id) {
    g_where = "thread-local";
    OK(infinirtSetDevice(type, id));
    pthread_t t;
    int ok = 0;
    CHECK(pthread_create(&t, NULL, thread_body, &ok) == 0);
    pthread_join(t, NULL);
    CHECK(ok);
    infiniDevice_t d;
    int i;
    OK(infinirtGetDevice(&d, &i));
    CHECK(d == type && i == id);
    OK(infinirtSetDevice(INFINI_DEVICE_CPU, 0));
}

/* Several threads on one device at once: each with its own stream and buffers, all also
 * enqueueing on one shared stream created by the main thread. */
#define THREADS 4
#define TN 65536
struct worker {
    infiniDevice_t type;
    int id, index, ok;
    infinirtStream_t shared;
    void *shared_buf;
};

static void *worker_body(void *arg) {
    struct worker *w = (struct worker *)arg;
    static unsigned char in[THREADS][TN], out[THREADS][TN];
    infinirtStream_t s = NULL;
    void *d = NULL;
    int ok = infinirtSetDevice(w->type, w->id) == INFINI_STATUS_SUCCESS;
    fill_pattern(in[w->index], TN, 100 + (unsigned)w->index);
    ok = ok && infinirtStreamCreate(&s) == INFINI_STATUS_SUCCESS;
    ok = ok && infinirtMalloc(&d, TN) == INFINI_STATUS_SUCCESS;
    for (int round = 0; ok && round < 4; round++) {
        ok = infinirtMemcpyAsync(d, in[w->index], TN, INFINIRT_MEMCPY_H2D, s) == INFINI_STATUS_SUCCESS &&
             infinirtMemcpyAsync(out[w->index], d, TN, INFINIRT_MEMCPY_D2H, s) == INFINI_STATUS_SUCCESS &&
             infinirtStreamSynchronize(s) == INFINI_STATUS_SUCCESS &&
             memcmp(in[w->index], out[w->index], TN) == 0;
        memset(out[w->index], 0, TN);
    }
    /* This thread's slice of the shared buffer, on the shared stream. */
    ok = ok && infinirtMemsetAsync((char *)w->shared_buf + w->index * 256, 0x40 + w->index, 256,
                                   w->shared) == INFINI_STATUS_SUCCESS;
    ok = ok && infinirtFree(d) == INFINI_STATUS_SUCCESS;
    ok = ok && infinirtStreamDestroy(s) == INFINI_STATUS_SUCCESS;
    w->ok = ok;
    return NULL;
}

static void test_threads(infiniDevice_t type, int id) {
    g_where = "threads";
    struct worker w[THREADS];
    pthread_t t[THREADS];
    infinirtStream_t shared = NULL;
    void *buf = NULL;
    unsigned char back[THREADS * 256];
    OK(infinirtStreamCreate(&shared));
    OK(infinirtMalloc(&buf, sizeof back));
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){type, id, i, 0, shared, buf};
        CHECK(pthread_create(&t[i], NULL, worker_body, &w[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK(w[i].ok);
    }
    OK(infinirtStreamSynchronize(shared));
    OK(infinirtMemcpy(back, buf, sizeof back, INFINIRT_MEMCPY_D2H));
    for (int i = 0; i < THREADS; i++) CHECK(all_bytes(back + i * 256, 256, (unsigned char)(0x40 + i)));
    OK(infinirtFree(buf));
    OK(infinirtStreamDestroy(shared));
}

/* An event of one device is refused on another. */
static void test_cross_device(infiniDevice_t t1, int i1, infiniDevice_t t2, int i2) {
    g_where = "cross-device";
    infinirtEvent_t e = NULL;
    infinirtStream_t s = NULL;
    void *p = NULL;
    OK(infinirtSetDevice(t1, i1));
    OK(infinirtEventCreate(&e));
    OK(infinirtStreamCreate(&s));
    OK(infinirtMalloc(&p, 64));
    OK(infinirtSetDevice(t2, i2));
    EXPECT(infinirtEventRecord(e, NULL), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtEventDestroy(e), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtStreamSynchronize(s), INFINI_STATUS_BAD_PARAM);
    EXPECT(infinirtFree(p), INFINI_STATUS_BAD_PARAM);
    /* t2's memory as the host side of copies on t1: memory the host cannot touch (a wgpu
     * virtual address, CUDA device memory) is a status — it was dereferenced as host memory, a
     * crash; the CPU's device memory is host memory. */
    void *q = NULL;
    unsigned char h[64] = {0};
    OK(infinirtMalloc(&q, 64));
    OK(infinirtSetDevice(t1, i1));
    if (t2 != INFINI_DEVICE_CPU) {
        EXPECT(infinirtMemcpy(p, q, 64, INFINIRT_MEMCPY_H2D), INFINI_STATUS_BAD_PARAM);
        EXPECT(infinirtMemcpy(q, p, 64, INFINIRT_MEMCPY_D2H), INFINI_STATUS_BAD_PARAM);
        EXPECT(infinirtMemcpy(h, q, 64, INFINIRT_MEMCPY_H2H), INFINI_STATUS_BAD_PARAM);
        EXPECT(infinirtMemcpyAsync(p, q, 64, INFINIRT_MEMCPY_H2D, s), INFINI_STATUS_BAD_PARAM);
    }
    OK(infinirtEventDestroy(e));
    OK(infinirtStreamDestroy(s));
    OK(infinirtFree(p));
    OK(infinirtSetDevice(t2, i2));
    OK(infinirtFree(q));
    OK(infinirtSetDevice(t1, i1));
}

int main(void) {
    test_discovery();

    infiniDevice_t first_t = INFINI_DEVICE_CPU;
    int devices = 0;
    for (size_t i = 0; i < sizeof ALL_TYPES / sizeof ALL_TYPES[0]; i++) {
        int count = 0;
        OK(infinirtGetDeviceCount(ALL_TYPES[i], &count));
        for (int id = 0; id < count; id++) {
            static char where[64];
            snprintf(where, sizeof where, "device type %d id %d", (int)ALL_TYPES[i], id);
            g_where = where;
            printf("abi_test: %s\n", where);
            OK(infinirtSetDevice(ALL_TYPES[i], id));
            infiniDevice_t d;
            int got;
            OK(infinirtGetDevice(&d, &got));
            CHECK(d == ALL_TYPES[i] && got == id);
            test_memory();
            test_streams_events();
            test_capture();
            test_thread_local(ALL_TYPES[i], id);
            OK(infinirtSetDevice(ALL_TYPES[i], id));
            test_threads(ALL_TYPES[i], id);
            OK(infinirtSetDevice(INFINI_DEVICE_CPU, 0));
            if (devices > 0) test_cross_device(first_t, 0, ALL_TYPES[i], id);
            else first_t = ALL_TYPES[i];
            devices++;
        }
    }
    CHECK(devices >= 1);
    return finish("abi_test");
}
