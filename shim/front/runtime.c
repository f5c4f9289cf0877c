/*
 * runtime.c: the runtime's interposed memory calls (cudaMalloc and its
 * kinds, cudaFree, cudaMemGetInfo, the device's reset and synchronization),
 * routed to the core, to a created context's accounting, to the early
 * route's ledger or straight to CUDA. The route of an allocation is here,
 * beside the calls that take it on every allocation (arrays.c takes it too),
 * with the current device it needs (pools.c asks for it too).
 */
#define _GNU_SOURCE

#include "front.h"

/* The calling thread's current device, as the runtime has it (cudaGetDevice). */
cudaError_t current_device(int32_t *device)
{
    *device = 0;
    REAL(get_device, get_device);
    int d = 0;
    cudaError_t rc = get_device(&d);
    *device = d;
    return rc;
}

/*
 * Records an allocation passed through on the early route, rc the real
 * call's answer and *devPtr, read only after a success, its block; undoes
 * it if it cannot be recorded.
 */
static cudaError_t early_alloc(cudaError_t rc, void *const *devPtr, uint64_t size)
{
    if (rc != cudaSuccess)
        return rc;
    void *ptr = *devPtr;
    int32_t device = 0;
    if (current_device(&device) != cudaSuccess || early_record(ptr, size, device) != cudaSuccess) {
        __typeof__(real.free) release = (__typeof__(real.free))resolve(R_free);
        if (release)
            release(ptr);
        return cudaErrorMemoryAllocation;
    }
    return cudaSuccess;
}

/*
 * The route of a runtime allocation of size bytes into devPtr, given r, the
 * route() taken before depth was raised: this runs after, so that the
 * runtime's own driver calls while it finds the device pass through. The
 * core's route needs the current device (sets *device; where it cannot be
 * found, that error is the answer, *rc, and ROUTE_FAILED); in a context the
 * application created it is ROUTE_CONTEXT (sets *ctx); a null devPtr (the
 * callers pass NULL for arguments CUDA refuses, such as managed flags), and
 * zero bytes in a created context, get CUDA's own answer (which also sets
 * the thread's last error).
 */
enum route runtime_alloc_route(enum route r, void **devPtr, uint64_t size, int32_t *device,
                               CUcontext *ctx, cudaError_t *rc)
{
    if (r != ROUTE_CORE)
        return r;
    if ((*rc = current_device(device)) != cudaSuccess)
        return ROUTE_FAILED;
    if (!devPtr)
        return ROUTE_REAL;
    if ((*ctx = current_created()) != NULL)
        return size > 0 ? ROUTE_CONTEXT : ROUTE_REAL;
    return ROUTE_CORE;
}

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    REAL(real_malloc, malloc);
    cudaError_t rc = cudaSuccess;
    int32_t device = 0;
    uint64_t p = 0;
    CUcontext ctx = NULL;
    enum route r = route();
    depth++;
    switch (runtime_alloc_route(r, devPtr, size, &device, &ctx, &rc)) {
    case ROUTE_CORE:
        if ((rc = core.malloc(device, size, &p)) == cudaSuccess)
            *devPtr = (void *)(uintptr_t)p;
        break;
    case ROUTE_CONTEXT:
        if ((rc = runtime_context_take(device, size)) == cudaSuccess) {
            rc = real_malloc(devPtr, size);
            context_took((CUresult)rc, ctx, device, (CUdeviceptr)(uintptr_t)*devPtr, size);
        }
        break;
    case ROUTE_EARLY:
        rc = early_alloc(real_malloc(devPtr, size), devPtr, size);
        break;
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    case ROUTE_FAILED:
        break;
    default:
        rc = real_malloc(devPtr, size);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    REAL(real_malloc_managed, malloc_managed);
    cudaError_t rc = cudaSuccess;
    int32_t device = 0;
    uint64_t p = 0;
    CUcontext ctx = NULL;
    enum route r = route();
    depth++;
    switch (runtime_alloc_route(r, valid_attach_flags(flags) ? devPtr : NULL, size, &device, &ctx, &rc)) {
    case ROUTE_CORE:
        if ((rc = core.malloc_managed(device, size, flags, &p)) == cudaSuccess)
            *devPtr = (void *)(uintptr_t)p;
        break;
    case ROUTE_CONTEXT:
        if ((rc = runtime_context_take(device, size)) == cudaSuccess) {
            rc = real_malloc_managed(devPtr, size, flags);
            context_took((CUresult)rc, ctx, device, (CUdeviceptr)(uintptr_t)*devPtr, size);
        }
        break;
    case ROUTE_EARLY:
        rc = early_alloc(real_malloc_managed(devPtr, size, flags), devPtr, size);
        break;
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    case ROUTE_FAILED:
        break;
    default:
        rc = real_malloc_managed(devPtr, size, flags);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    REAL(real_malloc_pitch, malloc_pitch);
    cudaError_t rc = cudaSuccess;
    int32_t device = 0;
    uint64_t p = 0, pt = 0;
    CUcontext ctx = NULL;
    /* A created context's allocation is taken at the widest pitch CUDA may choose; zero
     * (CUDA's own answer) where that overflows. */
    uint64_t bound = pitch_bound(width, height);
    enum route r = route();
    depth++;
    switch (runtime_alloc_route(r, pitch ? devPtr : NULL, bound, &device, &ctx, &rc)) {
    case ROUTE_CORE:
        if ((rc = core.malloc_pitch(device, width, height, &p, &pt)) == cudaSuccess) {
            *devPtr = (void *)(uintptr_t)p;
            *pitch = (size_t)pt;
        }
        break;
    case ROUTE_CONTEXT:
        if ((rc = runtime_context_take(device, bound)) == cudaSuccess) {
            rc = real_malloc_pitch(devPtr, pitch, width, height);
            context_took((CUresult)rc, ctx, device, (CUdeviceptr)(uintptr_t)*devPtr, bound);
        }
        break;
    case ROUTE_EARLY:
        rc = real_malloc_pitch(devPtr, pitch, width, height);
        rc = early_alloc(rc, devPtr, rc == cudaSuccess ? (uint64_t)*pitch * height : 0);
        break;
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    case ROUTE_FAILED:
        break;
    default:
        rc = real_malloc_pitch(devPtr, pitch, width, height);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
    REAL(real_malloc_async, malloc_async);
    cudaError_t rc = cudaSuccess;
    int32_t device = 0;
    uint64_t p = 0;
    CUcontext ctx = NULL;
    enum route r = route();
    depth++;
    enum route ar = runtime_alloc_route(r, devPtr, size, &device, &ctx, &rc);
    switch (stream_route(ar, (CUstream)stream, size, &device, &ctx)) {
    case ROUTE_CORE:
        if ((rc = core.malloc_async(device, size, stream_id(stream), &p)) == cudaSuccess)
            *devPtr = (void *)(uintptr_t)p;
        break;
    case ROUTE_CONTEXT:
        if ((rc = runtime_context_take(device, size)) == cudaSuccess) {
            rc = real_malloc_async(devPtr, size, stream);
            context_took_from_pool((CUresult)rc, ctx, device, (CUdeviceptr)(uintptr_t)*devPtr,
                                   size);
        }
        break;
    case ROUTE_EARLY:
        rc = early_alloc(real_malloc_async(devPtr, size, stream), devPtr, size);
        break;
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    case ROUTE_FAILED:
        break;
    default:
        rc = real_malloc_async(devPtr, size, stream);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaFree(void *devPtr)
{
    REAL(real_free, free);
    cudaError_t rc;
    uint64_t p = (uint64_t)(uintptr_t)devPtr;
    struct context_block b;
    enum route r = route();
    depth++;
    enum route fr = free_route(r, p, &b);
    rc = fr == ROUTE_CORE ? (cudaError_t)core.free(p) : real_free(devPtr);
    if (fr == ROUTE_CONTEXT)
        context_freed(rc, p, &b);
    depth--;
    return rc;
}

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
    REAL(real_free_async, free_async);
    cudaError_t rc;
    uint64_t p = (uint64_t)(uintptr_t)devPtr;
    struct context_block b;
    enum route r = route();
    depth++;
    enum route fr = free_route(r, p, &b);
    rc = fr == ROUTE_CORE
             ? (cudaError_t)core.free_async(p, stream_id(stream), free_context((CUstream)stream))
             : real_free_async(devPtr, stream);
    if (fr == ROUTE_CONTEXT)
        context_freed_async(rc, p, &b, (CUstream)stream);
    depth--;
    return rc;
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
    REAL(real_mem_get_info, mem_get_info);
    cudaError_t rc;
    enum route r = route();
    depth++;
    if (r == ROUTE_CORE && (!free || !total)) {
        rc = real_mem_get_info(free, total); /* CUDA's own answer, which also sets the last error */
    } else if (r == ROUTE_CORE) {
        int32_t device;
        uint64_t f = 0, t = 0;
        if ((rc = current_device(&device)) == cudaSuccess) {
            rc = core.mem_get_info(device, &f, &t);
            if (rc == cudaSuccess) {
                if (free)
                    *free = (size_t)f;
                if (total)
                    *total = (size_t)t;
            }
        }
    } else {
        rc = real_mem_get_info(free, total);
        if (rc == cudaSuccess && r == ROUTE_REFUSE && free)
            *free = 0; /* allocations are refused: none of it is the process's */
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaDeviceReset(void)
{
    REAL(real_device_reset, device_reset);
    cudaError_t rc;
    enum route r = route();
    depth++;
    if (r == ROUTE_CORE) {
        int32_t device;
        if ((rc = current_device(&device)) == cudaSuccess) {
            /* never between an allocation's real call and its record (reset_lock, contexts.c) */
            front_write_lock(&reset_lock);
            rc = core.device_reset(device);
            pthread_rwlock_unlock(&reset_lock);
        }
    } else {
        rc = real_device_reset();
    }
    depth--;
    return rc;
}

/*
 * cudaDeviceSynchronize matters to the pool only once the core runs: it
 * never loads it. In a context the application created, a synchronization
 * waits for that context's work only, not the primary context's, where the
 * pool's blocks are used: the core is not told.
 */
EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    REAL(real_device_synchronize, device_synchronize);
    cudaError_t rc;
    if (core_listens() && !current_created()) {
        depth++;
        int32_t device;
        if ((rc = current_device(&device)) == cudaSuccess)
            rc = core.device_synchronize(device);
        depth--;
        return rc;
    }
    return real_device_synchronize();
}
