/*
 * infinirt.h — the infinirt runtime C ABI, as implemented by unirt's libinfinirt.
 *
 * Link with -linfinirt (target/<profile>/libinfinirt.so or .a, built by `cargo build`).
 * Functions, types and values match InfiniCore's infinirt.h; behaviour:
 *
 *  - The current device is per thread and starts as CPU 0. Calls without a device argument act
 *    on the calling thread's current device. A NULL stream is that device's default stream.
 *  - Stream, event and graph handles belong to the device that created them; they are checked
 *    on every call. A destroyed, never-created or other device's handle gives
 *    INFINI_STATUS_BAD_PARAM (never a crash); a NULL event/graph handle gives NULL_POINTER.
 *    On NVIDIA devices stream and event handles are the native CUstream / CUevent values.
 *  - Device pointers are addresses of the current device's memory. Every device range is
 *    bounds-checked: an out-of-bounds copy, an unknown pointer or a double free is BAD_PARAM.
 *  - A NULL output pointer is INFINI_STATUS_NULL_POINTER. A vendor without devices reports a
 *    count of 0; other calls on it give DEVICE_TYPE_NOT_SUPPORTED; an id past the last device
 *    of an available vendor gives DEVICE_NOT_FOUND.
 *  - The library never unwinds into the caller; an internal failure is INTERNAL_ERROR, and
 *    unirtGetLastErrorMessage() says what went wrong on this thread.
 */
#ifndef UNIRT_INFINIRT_H
#define UNIRT_INFINIRT_H

#include "infinicore.h"

#define UNIRT_API UNIRT_EXTERN_C UNIRT_EXPORT

typedef void *infinirtStream_t;
typedef void *infinirtEvent_t;
typedef void *infinirtGraph_t;
typedef void *infinirtGraphNode_t;
typedef void *infinirtGraphExec_t;

/* Which fields of infinirtDeviceResourceSnapshot_t hold values (bit flags). */
typedef enum {
    INFINIRT_RESOURCE_FIELD_NONE = 0,
    INFINIRT_RESOURCE_FIELD_MEMORY_CAPACITY = 1 << 0,
    INFINIRT_RESOURCE_FIELD_COMPUTE_UTILIZATION = 1 << 1,
    INFINIRT_RESOURCE_FIELD_MEMORY_BANDWIDTH_UTILIZATION = 1 << 2,
    INFINIRT_RESOURCE_FIELD_KERNEL_TIME_RATIO = 1 << 3,
    INFINIRT_RESOURCE_FIELD_COMMUNICATION = 1 << 4
} infinirtResourceField_t;

/* A device's resource usage. unirt fills the memory fields (free, total, used) and sets
 * INFINIRT_RESOURCE_FIELD_MEMORY_CAPACITY; the rest are 0. */
typedef struct {
    infiniDevice_t device_type;
    int device_id;
    uint64_t valid_fields;
    uint64_t estimated_fields;
    size_t free_bytes;
    size_t total_bytes;
    size_t used_bytes;
    size_t reserved_bytes;
    float compute_utilization;
    float memory_bandwidth_utilization;
    float kernel_time_ratio;
    float communication_time_ratio;
    uint64_t communication_bytes;
} infinirtDeviceResourceSnapshot_t;

/* Probes every vendor once; optional (every call discovers on first use). */
UNIRT_API infiniStatus_t infinirtInit(void);

/* ---- Devices ---- */
/* Fills count_array[0 .. INFINI_DEVICE_TYPE_COUNT) with each type's device count. */
UNIRT_API infiniStatus_t infinirtGetAllDeviceCount(int *count_array);
UNIRT_API infiniStatus_t infinirtGetDeviceCount(infiniDevice_t device, int *count);
UNIRT_API infiniStatus_t infinirtSetDevice(infiniDevice_t device, int device_id);
/* Either pointer may be NULL, not both. */
UNIRT_API infiniStatus_t infinirtGetDevice(infiniDevice_t *device_ptr, int *device_id_ptr);
UNIRT_API infiniStatus_t infinirtGetMemInfo(infiniDevice_t device, int device_id,
                                            size_t *free_bytes, size_t *total_bytes);
UNIRT_API infiniStatus_t infinirtGetDeviceResourceSnapshot(infiniDevice_t device, int device_id,
                                                           infinirtDeviceResourceSnapshot_t *snapshot);
/* Waits for all work on every stream of the current device. */
UNIRT_API infiniStatus_t infinirtDeviceSynchronize(void);

/* ---- Streams ---- */
UNIRT_API infiniStatus_t infinirtStreamCreate(infinirtStream_t *stream_ptr);
/* The default (NULL) stream cannot be destroyed: BAD_PARAM. */
UNIRT_API infiniStatus_t infinirtStreamDestroy(infinirtStream_t stream);
UNIRT_API infiniStatus_t infinirtStreamSynchronize(infinirtStream_t stream);
UNIRT_API infiniStatus_t infinirtStreamWaitEvent(infinirtStream_t stream, infinirtEvent_t event);

/* ---- Events ---- */
typedef enum {
    INFINIRT_EVENT_COMPLETE = 0,
    INFINIRT_EVENT_NOT_READY = 1
} infinirtEventStatus_t;

typedef enum {
    INFINIRT_EVENT_DEFAULT = 0x0,
    INFINIRT_EVENT_DISABLE_TIMING = 0x1, /* no elapsed time for this event */
    INFINIRT_EVENT_BLOCKING_SYNC = 0x2   /* synchronize blocks instead of spinning */
} infinirtEventFlags_t;

UNIRT_API infiniStatus_t infinirtEventCreate(infinirtEvent_t *event_ptr);
/* Unknown flag bits are BAD_PARAM. */
UNIRT_API infiniStatus_t infinirtEventCreateWithFlags(infinirtEvent_t *event_ptr, uint32_t flags);
UNIRT_API infiniStatus_t infinirtEventRecord(infinirtEvent_t event, infinirtStream_t stream);
/* NOT_READY until the recorded work has completed; COMPLETE for a never-recorded event. */
UNIRT_API infiniStatus_t infinirtEventQuery(infinirtEvent_t event, infinirtEventStatus_t *status_ptr);
UNIRT_API infiniStatus_t infinirtEventSynchronize(infinirtEvent_t event);
UNIRT_API infiniStatus_t infinirtEventDestroy(infinirtEvent_t event);
/* Milliseconds from start to end; both must be completed timing events (else BAD_PARAM). */
UNIRT_API infiniStatus_t infinirtEventElapsedTime(float *ms_ptr, infinirtEvent_t start, infinirtEvent_t end);

/* ---- Memory ---- */
typedef enum {
    INFINIRT_MEMCPY_H2H = 0,
    INFINIRT_MEMCPY_H2D = 1,
    INFINIRT_MEMCPY_D2H = 2,
    INFINIRT_MEMCPY_D2D = 3
} infinirtMemcpyKind_t;

/* Device memory; size 0 gives NULL. */
UNIRT_API infiniStatus_t infinirtMalloc(void **p_ptr, size_t size);
/* Page-locked host memory. */
UNIRT_API infiniStatus_t infinirtMallocHost(void **p_ptr, size_t size);
/* NULL is a no-op; an unknown, interior or already freed pointer is BAD_PARAM. */
UNIRT_API infiniStatus_t infinirtFree(void *ptr);
UNIRT_API infiniStatus_t infinirtFreeHost(void *ptr);

UNIRT_API infiniStatus_t infinirtMemcpy(void *dst, const void *src, size_t size, infinirtMemcpyKind_t kind);
/* CUDA's rules for pageable host memory (any host memory not from infinirtMallocHost), on every
 * device: a copy from it has read it when the call returns, a copy into it (or H2H) has
 * completed — the buffer may be reused or freed at once. Memory from infinirtMallocHost is
 * copied asynchronously and must hold its data until the copy has run. */
UNIRT_API infiniStatus_t infinirtMemcpyAsync(void *dst, const void *src, size_t size,
                                             infinirtMemcpyKind_t kind, infinirtStream_t stream);

/* Stream-ordered memory. */
UNIRT_API infiniStatus_t infinirtMallocAsync(void **p_ptr, size_t size, infinirtStream_t stream);
UNIRT_API infiniStatus_t infinirtFreeAsync(void *ptr, infinirtStream_t stream);

/* Sets count bytes to (unsigned char)value. */
UNIRT_API infiniStatus_t infinirtMemset(void *ptr, int value, size_t count);
UNIRT_API infiniStatus_t infinirtMemsetAsync(void *ptr, int value, size_t count, infinirtStream_t stream);

/* ---- Stream capture and graphs ---- */
typedef enum {
    INFINIRT_STREAM_CAPTURE_MODE_GLOBAL = 0,
    INFINIRT_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    INFINIRT_STREAM_CAPTURE_MODE_RELAXED = 2
} infinirtStreamCaptureMode_t;

UNIRT_API infiniStatus_t infinirtStreamBeginCapture(infinirtStream_t stream, infinirtStreamCaptureMode_t mode);
UNIRT_API infiniStatus_t infinirtStreamEndCapture(infinirtStream_t stream, infinirtGraph_t *graph_ptr);
UNIRT_API infiniStatus_t infinirtGraphDestroy(infinirtGraph_t graph);
/* On failure the reason is written to log_buffer (if non-NULL, NUL-terminated); *node_ptr (if
 * non-NULL) is set to NULL. */
UNIRT_API infiniStatus_t infinirtGraphInstantiate(infinirtGraphExec_t *graph_exec_ptr, infinirtGraph_t graph,
                                                  infinirtGraphNode_t *node_ptr, char *log_buffer,
                                                  size_t buffer_size);
UNIRT_API infiniStatus_t infinirtGraphExecDestroy(infinirtGraphExec_t graph_exec);
/* Upstream's spelling (sic), kept for binary and source compatibility. */
UNIRT_API infiniStatus_t infinirtGraphLuanch(infinirtGraphExec_t graph_exec, infinirtStream_t stream);

/* ---- unirt extensions ---- */
/* The correctly spelled infinirtGraphLuanch. */
UNIRT_API infiniStatus_t infinirtGraphLaunch(infinirtGraphExec_t graph_exec, infinirtStream_t stream);
/* Copies the message of this thread's last failed call into buf (NUL-terminated, at most size
 * bytes). NULL buf is NULL_POINTER. */
UNIRT_API infiniStatus_t unirtGetLastErrorMessage(char *buf, size_t size);

#endif /* UNIRT_INFINIRT_H */
