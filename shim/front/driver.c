/*
 * driver.c: the driver's memory API (cuMemAlloc and its kinds, cuMemFree,
 * cuMemGetInfo, the device's total and reset, cuCtxSynchronize), routed as
 * the runtime's calls are, with CUresult codes; the address range of a
 * pointer (cuMemGetAddressRange_v2, cuPointerGetAttribute[s]); and the IPC
 * handle of a pointer (cuIpcGetMemHandle).
 */
#define _GNU_SOURCE

#include "front.h"

/* The device of the calling thread's current context. */
CUresult context_device(int32_t *device)
{
    __typeof__(real.cu_ctx_get_device) get =
        (__typeof__(real.cu_ctx_get_device))resolve(R_cu_ctx_get_device);
    CUdevice d = 0;
    CUresult rc = get ? get(&d) : CUDA_ERROR_NOT_FOUND;
    *device = d;
    return rc;
}

/*
 * The driver's calls reach the core like the runtime's, as CUresult codes
 * and without the runtime's last error. In a device's primary context the
 * core serves them from that device's pool; in a context the application
 * created (contexts.c), the core counts them and the front passes them through.
 * A call the core cannot place (no current context, a null pointer, zero
 * bytes, managed flags CUDA refuses) gets the real driver's own answer.
 */

/* Records a driver allocation passed through on the early route; undoes it if it cannot. */
static CUresult driver_early(CUresult rc, const CUdeviceptr *dptr, uint64_t size)
{
    int32_t device = 0;
    if (rc != CUDA_SUCCESS)
        return rc;
    CUdeviceptr p = *dptr;
    if (context_device(&device) != CUDA_SUCCESS ||
        early_record((void *)(uintptr_t)p, size, device) != cudaSuccess) {
        __typeof__(real.cu_mem_free) release = (__typeof__(real.cu_mem_free))resolve(R_cu_mem_free);
        if (release)
            release(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/*
 * The route of a driver allocation into dptr of size bytes: the core's only
 * when it can place it (sets *device), the real driver's otherwise; in a
 * context the application created, ROUTE_CONTEXT (sets *ctx).
 */
enum route driver_alloc_route(CUdeviceptr *dptr, uint64_t size, int32_t *device, CUcontext *ctx)
{
    enum route r = route();
    if (r == ROUTE_CORE && (!dptr || size == 0 || context_device(device) != CUDA_SUCCESS))
        return ROUTE_REAL;
    if (r == ROUTE_CORE && (*ctx = current_created()) != NULL)
        return ROUTE_CONTEXT;
    return r;
}

/* The stream as the core sees it; in the _ptsz forms, stream 0 is the per-thread stream. */
static uint64_t driver_stream(CUstream stream, int per_thread)
{
    if (per_thread && stream == NULL)
        return stream_id(cudaStreamPerThread);
    return stream_id((cudaStream_t)stream);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    REAL(real_alloc, cu_mem_alloc);
    CUresult rc;
    int32_t device = 0;
    uint64_t p = 0;
    CUcontext ctx = NULL;
    enum route r = driver_alloc_route(dptr, bytesize, &device, &ctx);
    depth++;
    switch (r) {
    case ROUTE_CORE:
        if ((rc = (CUresult)core.cu_malloc(device, bytesize, &p)) == CUDA_SUCCESS)
            *dptr = (CUdeviceptr)p;
        break;
    case ROUTE_CONTEXT:
        if ((rc = context_take(device, bytesize)) == CUDA_SUCCESS) {
            rc = real_alloc(dptr, bytesize);
            context_took(rc, ctx, device, *dptr, bytesize);
        }
        break;
    case ROUTE_EARLY:
        rc = driver_early(real_alloc(dptr, bytesize), dptr, bytesize);
        break;
    case ROUTE_REFUSE:
        rc = CUDA_ERROR_NOT_INITIALIZED;
        break;
    default:
        rc = real_alloc(dptr, bytesize);
    }
    depth--;
    return rc;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    REAL(real_alloc, cu_mem_alloc_managed);
    CUresult rc;
    int32_t device = 0;
    uint64_t p = 0;
    CUcontext ctx = NULL;
    enum route r = driver_alloc_route(valid_attach_flags(flags) ? dptr : NULL, bytesize, &device, &ctx);
    depth++;
    switch (r) {
    case ROUTE_CORE:
        if ((rc = (CUresult)core.cu_malloc_managed(device, bytesize, flags, &p)) == CUDA_SUCCESS)
            *dptr = (CUdeviceptr)p;
        break;
    case ROUTE_CONTEXT:
        if ((rc = context_take(device, bytesize)) == CUDA_SUCCESS) {
            rc = real_alloc(dptr, bytesize, flags);
            context_took(rc, ctx, device, *dptr, bytesize);
        }
        break;
    case ROUTE_EARLY:
        rc = driver_early(real_alloc(dptr, bytesize, flags), dptr, bytesize);
        break;
    case ROUTE_REFUSE:
        rc = CUDA_ERROR_NOT_INITIALIZED;
        break;
    default:
        rc = real_alloc(dptr, bytesize, flags);
    }
    depth--;
    return rc;
}

/* The element sizes cuMemAllocPitch accepts; others get the driver's own answer. */
static int valid_element_size(unsigned int size)
{
    return size == 4 || size == 8 || size == 16;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                   size_t Height, unsigned int ElementSizeBytes)
{
    REAL(real_alloc, cu_mem_alloc_pitch);
    CUresult rc;
    int32_t device = 0;
    uint64_t p = 0, pitch = 0;
    CUcontext ctx = NULL;
    uint64_t bound = pitch_bound(WidthInBytes, Height);
    enum route r = driver_alloc_route(dptr, (uint64_t)WidthInBytes * Height, &device, &ctx);
    if ((r == ROUTE_CORE || r == ROUTE_CONTEXT) &&
        (!pPitch || !valid_element_size(ElementSizeBytes) || bound == 0))
        r = ROUTE_REAL;
    depth++;
    switch (r) {
    case ROUTE_CORE:
        rc = (CUresult)core.cu_malloc_pitch(device, WidthInBytes, Height, &p, &pitch);
        if (rc == CUDA_SUCCESS) {
            *dptr = (CUdeviceptr)p;
            *pPitch = (size_t)pitch;
        }
        break;
    case ROUTE_CONTEXT: /* taken at the widest pitch the driver may choose */
        if ((rc = context_take(device, bound)) == CUDA_SUCCESS) {
            rc = real_alloc(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
            context_took(rc, ctx, device, *dptr, bound);
        }
        break;
    case ROUTE_EARLY:
        rc = real_alloc(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
        rc = driver_early(rc, dptr, rc == CUDA_SUCCESS ? (uint64_t)*pPitch * Height : 0);
        break;
    case ROUTE_REFUSE:
        rc = CUDA_ERROR_NOT_INITIALIZED;
        break;
    default:
        rc = real_alloc(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    }
    depth--;
    return rc;
}

static CUresult mem_alloc_async(CUdeviceptr *dptr, size_t bytesize, CUstream stream,
                                int per_thread)
{
    __typeof__(real.cu_mem_alloc_async) real_alloc =
        (__typeof__(real.cu_mem_alloc_async))resolve(per_thread ? R_cu_mem_alloc_async_ptsz
                                                                : R_cu_mem_alloc_async);
    if (!real_alloc)
        return missing_real(per_thread ? R_cu_mem_alloc_async_ptsz : R_cu_mem_alloc_async);
    CUresult rc;
    int32_t device = 0;
    uint64_t p = 0;
    CUcontext ctx = NULL;
    enum route r = driver_alloc_route(dptr, bytesize, &device, &ctx);
    depth++;
    switch (stream_route(r, stream, bytesize, &device, &ctx)) {
    case ROUTE_CORE:
        rc = (CUresult)core.cu_malloc_async(device, bytesize, driver_stream(stream, per_thread), &p);
        if (rc == CUDA_SUCCESS)
            *dptr = (CUdeviceptr)p;
        break;
    case ROUTE_CONTEXT:
        if ((rc = context_take(device, bytesize)) == CUDA_SUCCESS) {
            rc = real_alloc(dptr, bytesize, stream);
            context_took_from_pool(rc, ctx, device, *dptr, bytesize);
        }
        break;
    case ROUTE_EARLY:
        rc = driver_early(real_alloc(dptr, bytesize, stream), dptr, bytesize);
        break;
    case ROUTE_REFUSE:
        rc = CUDA_ERROR_NOT_INITIALIZED;
        break;
    default:
        rc = real_alloc(dptr, bytesize, stream);
    }
    depth--;
    return rc;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return mem_alloc_async(dptr, bytesize, hStream, 0);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return mem_alloc_async(dptr, bytesize, hStream, 1);
}

static CUresult mem_free_async(CUdeviceptr dptr, CUstream stream, int per_thread)
{
    __typeof__(real.cu_mem_free_async) real_free =
        (__typeof__(real.cu_mem_free_async))resolve(per_thread ? R_cu_mem_free_async_ptsz
                                                               : R_cu_mem_free_async);
    if (!real_free)
        return missing_real(per_thread ? R_cu_mem_free_async_ptsz : R_cu_mem_free_async);
    CUresult rc;
    struct context_block b;
    enum route r = route();
    depth++;
    enum route fr = free_route(r, (uint64_t)dptr, &b);
    rc = fr == ROUTE_CORE
             ? (CUresult)core.cu_free_async((uint64_t)dptr, driver_stream(stream, per_thread),
                                            free_context(stream))
             : real_free(dptr, stream);
    if (fr == ROUTE_CONTEXT)
        context_freed_async(rc, (uint64_t)dptr, &b,
                            per_thread && !stream ? CU_STREAM_PER_THREAD : stream);
    depth--;
    return rc;
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return mem_free_async(dptr, hStream, 0);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return mem_free_async(dptr, hStream, 1);
}

/* The device's real total, or with a quota the quota, as cuMemGetInfo's total. */
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    REAL(real_total_mem, cu_device_total_mem);
    enum route r = route();
    depth++;
    CUresult rc = real_total_mem(bytes, dev);
    if (rc == CUDA_SUCCESS && r == ROUTE_CORE) {
        uint64_t total = *bytes;
        if ((rc = (CUresult)core.cu_device_total_mem(dev, &total)) == CUDA_SUCCESS)
            *bytes = (size_t)total;
    }
    depth--;
    return rc;
}

/*
 * Resetting the primary context destroys every allocation on the device:
 * the core drops the device's pool first. cuCtxSynchronize, like
 * cudaDeviceSynchronize, tells the pool its stream-ordered frees are done
 * (not in a created context, whose synchronization does not cover them).
 * Both reach the core only once it runs and never load it.
 */
static CUresult primary_ctx_reset(CUresult (*real_reset)(CUdevice), CUdevice dev)
{
    if (!core_listens())
        return real_reset(dev);
    /* The core drops dev's pool and resets dev, through the runtime where the
     * process has one and through the driver where it has none. */
    depth++;
    /* never between an allocation's real call and its record (reset_lock, contexts.c) */
    front_write_lock(&reset_lock);
    CUresult rc = (CUresult)core.cu_device_reset(dev);
    pthread_rwlock_unlock(&reset_lock);
    depth--;
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    REAL(real_reset, cu_primary_ctx_reset);
    return primary_ctx_reset(real_reset, dev);
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    REAL(real_reset, cu_primary_ctx_reset_v1);
    return primary_ctx_reset(real_reset, dev);
}

EXPORT CUresult cuCtxSynchronize(void)
{
    REAL(real_synchronize, cu_ctx_synchronize);
    CUresult rc;
    int32_t device;
    if (core_listens() && !current_created() && context_device(&device) == CUDA_SUCCESS) {
        depth++;
        rc = (CUresult)core.cu_device_synchronize(device);
        depth--;
        return rc;
    }
    return real_synchronize();
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    REAL(real_free, cu_mem_free);
    CUresult rc;
    struct context_block b;
    enum route r = route();
    depth++;
    enum route fr = free_route(r, (uint64_t)dptr, &b);
    rc = fr == ROUTE_CORE ? (CUresult)core.cu_free((uint64_t)dptr) : real_free(dptr);
    if (fr == ROUTE_CONTEXT)
        context_freed(rc, (uint64_t)dptr, &b);
    depth--;
    return rc;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    REAL(real_mem_get_info, cu_mem_get_info);
    CUresult rc;
    int32_t device;
    enum route r = route();
    depth++;
    if (r == ROUTE_CORE && free && total && context_device(&device) == CUDA_SUCCESS) {
        uint64_t f = 0, t = 0;
        rc = (CUresult)core.cu_mem_get_info(device, &f, &t);
        if (rc == CUDA_SUCCESS) {
            *free = (size_t)f;
            *total = (size_t)t;
        }
    } else { /* null outputs or no context: CUDA's own answer */
        rc = real_mem_get_info(free, total);
        if (rc == CUDA_SUCCESS && r == ROUTE_REFUSE && free)
            *free = 0; /* allocations are refused: none of it is the process's */
    }
    depth--;
    return rc;
}

/* ---- address ranges ---- */

/*
 * A block the pool serves is cut from bigger memory (a segment, or the
 * virtual-memory granules behind it), which is all CUDA sees: the front
 * answers the range of a pointer into a pooled block with the block, as
 * CUDA answers a cuMemAlloc's, and a pointer into pool memory no live block
 * holds as CUDA answers memory that is not allocated. Pool memory is not
 * capable of legacy CUDA IPC, since cuIpcGetMemHandle refuses it (below).
 * Every other pointer, and every other attribute, is CUDA's to describe.
 */

int32_t pool_holds(CUdeviceptr ptr, uint64_t *base, uint64_t *size)
{
    int32_t held = SPILLWAY_HELD_NOT;
    if (!core_listens() || core.address_range((uint64_t)ptr, &held, base, size) != CUDA_SUCCESS)
        return SPILLWAY_HELD_NOT;
    return held;
}

static int is_range_attribute(CUpointer_attribute attribute)
{
    return attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR ||
           attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE;
}

/* Whether the front answers attribute of a pointer the pools hold. */
static int is_pool_attribute(CUpointer_attribute attribute)
{
    return is_range_attribute(attribute) || attribute == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE;
}

/*
 * Writes into data the front's answer to attribute of a pointer the pools
 * hold (held): 0 for legacy IPC capability, a live block's range, and for
 * the range of pool memory no live block holds CUDA's default for memory it
 * does not know (0). Returns 0, writing nothing, for a pointer the pools do
 * not hold: CUDA answers.
 */
static int put_pool_attribute(CUpointer_attribute attribute, void *data, int32_t held, uint64_t base,
                              uint64_t size)
{
    if (held == SPILLWAY_HELD_NOT)
        return 0;
    if (held == SPILLWAY_HELD_FREE)
        base = size = 0;
    if (attribute == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE)
        *(int *)data = 0;
    else if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
        *(CUdeviceptr *)data = (CUdeviceptr)base;
    else
        *(size_t *)data = (size_t)size;
    return 1;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    REAL(real_range, cu_mem_get_address_range);
    uint64_t base = 0, size = 0;
    switch (pool_holds(dptr, &base, &size)) {
    case SPILLWAY_HELD_BLOCK:
        if (pbase)
            *pbase = (CUdeviceptr)base;
        if (psize)
            *psize = (size_t)size;
        return CUDA_SUCCESS;
    case SPILLWAY_HELD_FREE:
        return CUDA_ERROR_NOT_FOUND; /* CUDA's answer for memory not allocated */
    }
    return real_range(pbase, psize, dptr);
}

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    REAL(real_attribute, cu_pointer_get_attribute);
    uint64_t base = 0, size = 0;
    if (data && is_pool_attribute(attribute)) {
        int32_t held = pool_holds(ptr, &base, &size);
        if (held == SPILLWAY_HELD_FREE && is_range_attribute(attribute))
            return CUDA_ERROR_INVALID_VALUE; /* as for a pointer CUDA does not know */
        if (put_pool_attribute(attribute, data, held, base, size))
            return CUDA_SUCCESS;
    }
    return real_attribute(data, attribute, ptr);
}

EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
                                       void **data, CUdeviceptr ptr)
{
    REAL(real_attributes, cu_pointer_get_attributes);
    CUresult rc = real_attributes(numAttributes, attributes, data, ptr);
    uint64_t base = 0, size = 0;
    int32_t held = -1; /* not asked yet: only the attributes above need the pools */
    for (unsigned int i = 0; rc == CUDA_SUCCESS && i < numAttributes; i++) {
        if (!data[i] || !is_pool_attribute(attributes[i]))
            continue;
        if (held < 0)
            held = pool_holds(ptr, &base, &size);
        put_pool_attribute(attributes[i], data[i], held, base, size);
    }
    return rc;
}

/* ---- IPC handles ---- */

/*
 * CUDA's IPC handle of a pointer names the whole allocation behind it and
 * opens at that allocation's start, which for a pooled block is the pool's
 * segment: the importer would read another block's bytes at the offset the
 * exporter sends (and, with virtual memory, CUDA refuses the pool's memory
 * anyway). So a pointer into pool memory is refused as CUDA refuses memory
 * it cannot share. A block that starts its segment is refused too, though
 * CUDA's handle would open at it: whether a block starts a segment is the
 * pool's placement, which the program cannot see or choose, so sharing would
 * work for some blocks and not others from run to run; and the handle would
 * also reach the segment's other blocks and stay valid after the block is
 * freed. Every other pointer is CUDA's to answer.
 */
EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    REAL(real_get_handle, cu_ipc_get_mem_handle);
    static atomic_int told;
    uint64_t base = 0, size = 0;
    switch (pool_holds(dptr, &base, &size)) {
    case SPILLWAY_HELD_BLOCK:
        if (!atomic_exchange(&told, 1))
            log_line("cuIpcGetMemHandle: pooled memory cannot be shared by CUDA IPC (the handle "
                     "would open at the pool's memory, not the block); run the program with "
                     "SPILLWAY_POOL=0 to share device memory between processes");
        return CUDA_ERROR_INVALID_VALUE;
    case SPILLWAY_HELD_FREE:
        return CUDA_ERROR_INVALID_VALUE; /* CUDA's answer for memory not allocated */
    }
    return real_get_handle(pHandle, dptr);
}
