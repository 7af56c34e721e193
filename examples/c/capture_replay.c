/*
 * A C program written against InfiniCore's infinirt.h, running on unirt's libinfinirt:
 * lists devices, copies data through device memory, times async work with events, and
 * captures a stream into a graph that it replays. Uses only upstream's API.
 *
 * Build (from the repository root, after `cargo build --release`):
 *   cc -std=c11 -Wall -I capi/include examples/c/capture_replay.c \
 *      -L target/release -linfinirt -Wl,-rpath,"$PWD/target/release" -o capture_replay
 *   ./capture_replay
 */
#include <stdio.h>
#include <string.h>

#include <infinirt.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        infiniStatus_t s_ = (call);                                                  \
        if (s_ != INFINI_STATUS_SUCCESS) {                                           \
            fprintf(stderr, "%s:%d: %s failed with status %d\n", __FILE__, __LINE__, \
                    #call, (int)s_);                                                 \
            return 1;                                                                \
        }                                                                            \
    } while (0)

#define LEN 1024

int main(void) {
    int counts[INFINI_DEVICE_TYPE_COUNT];
    CHECK(infinirtInit());
    int wgpu = 0;
    CHECK(infinirtGetAllDeviceCount(counts));
    /* wgpu adapters are unirt's extension type, outside upstream's array. */
    CHECK(infinirtGetDeviceCount(INFINI_DEVICE_UNIRT_WGPU, &wgpu));
    printf("devices: cpu %d, nvidia %d, wgpu %d\n", counts[INFINI_DEVICE_CPU],
           counts[INFINI_DEVICE_NVIDIA], wgpu);

    /* Run on the first NVIDIA device when there is one, else on the CPU. */
    infiniDevice_t device = counts[INFINI_DEVICE_NVIDIA] > 0 ? INFINI_DEVICE_NVIDIA : INFINI_DEVICE_CPU;
    CHECK(infinirtSetDevice(device, 0));

    float host[LEN], result[LEN];
    for (int i = 0; i < LEN; i++) host[i] = (float)i * 0.5f;

    void *a = NULL, *b = NULL;
    infinirtStream_t stream = NULL;
    infinirtEvent_t start = NULL, end = NULL;
    CHECK(infinirtMalloc(&a, sizeof host));
    CHECK(infinirtMalloc(&b, sizeof host));
    CHECK(infinirtStreamCreate(&stream));
    CHECK(infinirtEventCreate(&start));
    CHECK(infinirtEventCreate(&end));

    /* Record: upload, clear the first 16 floats, copy a -> b. Nothing runs yet. */
    infinirtGraph_t graph = NULL;
    infinirtGraphExec_t exec = NULL;
    char log[256] = "";
    CHECK(infinirtStreamBeginCapture(stream, INFINIRT_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(infinirtMemcpyAsync(a, host, sizeof host, INFINIRT_MEMCPY_H2D, stream));
    CHECK(infinirtMemsetAsync(a, 0, 16 * sizeof(float), stream));
    CHECK(infinirtMemcpyAsync(b, a, sizeof host, INFINIRT_MEMCPY_D2D, stream));
    CHECK(infinirtStreamEndCapture(stream, &graph));
    CHECK(infinirtGraphInstantiate(&exec, graph, NULL, log, sizeof log));

    /* Replay three times, timing the replays with events. */
    CHECK(infinirtEventRecord(start, stream));
    for (int i = 0; i < 3; i++) CHECK(infinirtGraphLuanch(exec, stream));
    CHECK(infinirtEventRecord(end, stream));
    CHECK(infinirtEventSynchronize(end));
    float ms = 0.0f;
    CHECK(infinirtEventElapsedTime(&ms, start, end));

    CHECK(infinirtMemcpy(result, b, sizeof result, INFINIRT_MEMCPY_D2H));
    int ok = 1;
    for (int i = 0; i < LEN; i++) ok &= result[i] == (i < 16 ? 0.0f : host[i]);
    printf("device %d: 3 replays in %.3f ms, data %s\n", (int)device, ms, ok ? "correct" : "WRONG");

    CHECK(infinirtGraphExecDestroy(exec));
    CHECK(infinirtGraphDestroy(graph));
    CHECK(infinirtEventDestroy(start));
    CHECK(infinirtEventDestroy(end));
    CHECK(infinirtStreamDestroy(stream));
    CHECK(infinirtFree(a));
    CHECK(infinirtFree(b));
    return ok ? 0 : 1;
}
