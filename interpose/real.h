/*
 * real.h: the table of the real CUDA runtime functions, filled by the shim's
 * C front (which resolves them) and read by the Go side through interpose.
 * Only interpose calls through it. Append new fields at the end and never
 * reorder: the front and the core are separate objects and check `size`.
 */
#ifndef SPILLWAY_REAL_H
#define SPILLWAY_REAL_H

#include <stdint.h>
#include <spillway/cuda_runtime.h>

struct spillway_real {
    uint32_t size; /* sizeof(struct spillway_real) as the front built it */
    cudaError_t (*malloc)(void **devPtr, size_t size);
    cudaError_t (*free)(void *devPtr);
    cudaError_t (*malloc_managed)(void **devPtr, size_t size, unsigned int flags);
    cudaError_t (*malloc_pitch)(void **devPtr, size_t *pitch, size_t width, size_t height);
    cudaError_t (*malloc_async)(void **devPtr, size_t size, cudaStream_t stream);
    cudaError_t (*free_async)(void *devPtr, cudaStream_t stream);
    cudaError_t (*mem_get_info)(size_t *free, size_t *total);
    cudaError_t (*device_reset)(void);
    cudaError_t (*get_device)(int *device);
    cudaError_t (*set_device)(int device);
    cudaError_t (*get_device_count)(int *count);
    cudaError_t (*device_synchronize)(void);
    cudaError_t (*stream_synchronize)(cudaStream_t stream);
    cudaError_t (*event_create_with_flags)(cudaEvent_t *event, unsigned int flags);
    cudaError_t (*event_record)(cudaEvent_t event, cudaStream_t stream);
    cudaError_t (*event_query)(cudaEvent_t event);
    cudaError_t (*event_synchronize)(cudaEvent_t event);
    cudaError_t (*event_destroy)(cudaEvent_t event);
    /* Added for the pool and spilling. */
    cudaError_t (*stream_destroy)(cudaStream_t stream);
    cudaError_t (*device_get_attribute)(int *value, enum cudaDeviceAttr attr, int device);
    cudaError_t (*host_alloc)(void **pHost, size_t size, unsigned int flags);
    cudaError_t (*free_host)(void *ptr);
    cudaError_t (*host_get_device_pointer)(void **pDevice, void *pHost, unsigned int flags);
    /* CUDA 12 runtime signatures (an int device), not the cudaMemLocation forms. */
    cudaError_t (*mem_advise)(const void *devPtr, size_t count, enum cudaMemoryAdvise advice,
                              int device);
    cudaError_t (*mem_prefetch_async)(const void *devPtr, size_t count, int dstDevice,
                                      cudaStream_t stream);
    /* Added to keep the application's last error as CUDA would leave it. */
    cudaError_t (*peek_at_last_error)(void);
    cudaError_t (*get_last_error)(void);
    /* Added to check streams and stream capture (enum arguments as int). */
    cudaError_t (*stream_query)(cudaStream_t stream);
    cudaError_t (*stream_is_capturing)(cudaStream_t stream, int *status);
    cudaError_t (*thread_exchange_stream_capture_mode)(int *mode);
};

/* The CUDA names of the table's entries, in field order after `size`. */
#define SPILLWAY_REAL_NAMES                                                              \
    "cudaMalloc", "cudaFree", "cudaMallocManaged", "cudaMallocPitch", "cudaMallocAsync",   \
        "cudaFreeAsync", "cudaMemGetInfo", "cudaDeviceReset", "cudaGetDevice",             \
        "cudaSetDevice", "cudaGetDeviceCount", "cudaDeviceSynchronize",                    \
        "cudaStreamSynchronize", "cudaEventCreateWithFlags", "cudaEventRecord",            \
        "cudaEventQuery", "cudaEventSynchronize", "cudaEventDestroy", "cudaStreamDestroy",      \
        "cudaDeviceGetAttribute", "cudaHostAlloc", "cudaFreeHost", "cudaHostGetDevicePointer", \
        "cudaMemAdvise", "cudaMemPrefetchAsync", "cudaPeekAtLastError", "cudaGetLastError",          \
        "cudaStreamQuery", "cudaStreamIsCapturing", "cudaThreadExchangeStreamCaptureMode"

#endif /* SPILLWAY_REAL_H */
