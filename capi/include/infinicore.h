/*
 * infinicore.h — the shared types of the infinirt C ABI, as implemented by unirt's
 * libinfinirt (capi/ in the unirt repository).
 *
 * The types and values match InfiniCore's header of the same name, so code written for
 * InfiniCore compiles against this one unchanged. unirt adds one device type of its own,
 * INFINI_DEVICE_UNIRT_WGPU, outside upstream's range.
 */
#ifndef UNIRT_INFINICORE_H
#define UNIRT_INFINICORE_H

/* The C headers (not <cstdint>) so that C++98 code compiles too. */
#include <stddef.h>
#include <stdint.h>

/* Linkage / visibility macros under the names upstream headers (infiniop.h, infiniccl.h, …)
 * expect, for headers that include this one and declare their own functions. */
#ifdef __cplusplus
#define UNIRT_EXTERN_C extern "C"
#else
#define UNIRT_EXTERN_C
#endif
#if defined(_WIN32)
#define UNIRT_EXPORT __declspec(dllexport)
#elif defined(__GNUC__)
#define UNIRT_EXPORT __attribute__((visibility("default")))
#else
#define UNIRT_EXPORT
#endif
#ifndef __C
#define __C UNIRT_EXTERN_C
#endif
#ifndef __INFINI_C
#define __INFINI_C UNIRT_EXTERN_C
#endif
#ifndef __export
#define __export UNIRT_EXPORT
#endif

/* Status of every call. */
typedef enum {
    INFINI_STATUS_SUCCESS = 0,
    INFINI_STATUS_INTERNAL_ERROR = 1, /* also: a caught Rust panic, out of memory */
    INFINI_STATUS_NOT_IMPLEMENTED = 2,
    INFINI_STATUS_BAD_PARAM = 3,      /* also: out-of-bounds ranges, dead handles */
    INFINI_STATUS_NULL_POINTER = 4,
    INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED = 5,
    INFINI_STATUS_DEVICE_NOT_FOUND = 6,
    INFINI_STATUS_DEVICE_NOT_INITIALIZED = 7, /* also: a handle made before fork(), used in the child */
    INFINI_STATUS_DEVICE_ARCHITECTURE_NOT_SUPPORTED = 8,
    INFINI_STATUS_BAD_TENSOR_DTYPE = 10,
    INFINI_STATUS_BAD_TENSOR_SHAPE = 11,
    INFINI_STATUS_BAD_TENSOR_STRIDES = 12,
    INFINI_STATUS_INSUFFICIENT_WORKSPACE = 13
} infiniStatus_t;

/* Device types. unirt drives CPU, NVIDIA (its CUDA devices) and its own wgpu type; the other
 * vendors report 0 devices. */
typedef enum {
    INFINI_DEVICE_CPU = 0,
    INFINI_DEVICE_NVIDIA = 1,
    INFINI_DEVICE_CAMBRICON = 2,
    INFINI_DEVICE_ASCEND = 3,
    INFINI_DEVICE_METAX = 4,
    INFINI_DEVICE_MOORE = 5,
    INFINI_DEVICE_ILUVATAR = 6,
    INFINI_DEVICE_KUNLUN = 7,
    INFINI_DEVICE_HYGON = 8,
    INFINI_DEVICE_QY = 9,
    INFINI_DEVICE_ALI = 10,
    /* Number of upstream device types: the length of infinirtGetAllDeviceCount's array. */
    INFINI_DEVICE_TYPE_COUNT,
    /* unirt extension: any Vulkan / Metal / DX12 / GL adapter, driven through wgpu. Not
     * counted in INFINI_DEVICE_TYPE_COUNT (so upstream-sized arrays stay valid); query it with
     * infinirtGetDeviceCount(INFINI_DEVICE_UNIRT_WGPU, &n) and select it with
     * infinirtSetDevice(INFINI_DEVICE_UNIRT_WGPU, id). */
    INFINI_DEVICE_UNIRT_WGPU = 100
} infiniDevice_t;

/* Element types (used by operator libraries built on infinirt). */
typedef enum {
    INFINI_DTYPE_INVALID = 0,
    INFINI_DTYPE_BYTE = 1,
    INFINI_DTYPE_BOOL = 2,
    INFINI_DTYPE_I8 = 3,
    INFINI_DTYPE_I16 = 4,
    INFINI_DTYPE_I32 = 5,
    INFINI_DTYPE_I64 = 6,
    INFINI_DTYPE_U8 = 7,
    INFINI_DTYPE_U16 = 8,
    INFINI_DTYPE_U32 = 9,
    INFINI_DTYPE_U64 = 10,
    INFINI_DTYPE_F8 = 11,
    INFINI_DTYPE_F16 = 12,
    INFINI_DTYPE_F32 = 13,
    INFINI_DTYPE_F64 = 14,
    INFINI_DTYPE_C16 = 15,
    INFINI_DTYPE_C32 = 16,
    INFINI_DTYPE_C64 = 17,
    INFINI_DTYPE_C128 = 18,
    INFINI_DTYPE_BF16 = 19
} infiniDtype_t;

#endif /* UNIRT_INFINICORE_H */
