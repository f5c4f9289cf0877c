/*
 * pools.c: CUDA's memory pools. The application's own pools stay CUDA's: the
 * device each one's memory lies on is remembered as it is created, and an
 * allocation from one is counted on that device and passed through. A
 * device's default pool is Spillway's pool: the usage attributes, the reset
 * of their high-water marks and the trimming of a default pool are its.
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "front.h"

/*
 * The device of each memory pool the application created, remembered as
 * cuMemPoolCreate or cudaMemPoolCreate made it, since CUDA answers no query
 * for a pool's location. Host-located pools are not kept. Few pools live at
 * once: a look-up scans them.
 */
pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pool_place {
    CUmemoryPool pool;
    int32_t device;
} *pools;
static size_t pools_len, pools_cap;

static void pool_created(CUmemoryPool pool, int location_type, int location_id)
{
    if (location_type != CU_MEM_LOCATION_TYPE_DEVICE)
        return;
    front_lock(&pools_lock);
    size_t i = 0;
    while (i < pools_len && pools[i].pool != pool)
        i++;
    if (i == pools_len && pools_len == pools_cap) {
        struct pool_place *grown = grow_table(pools, &pools_cap, sizeof *pools);
        if (!grown) {
            pthread_mutex_unlock(&pools_lock);
            log_line("cannot record a memory pool's device (out of host memory): its allocations "
                     "count on their stream's device");
            return;
        }
        pools = grown;
    }
    pools[i] = (struct pool_place){pool, location_id};
    if (i == pools_len)
        pools_len++;
    pthread_mutex_unlock(&pools_lock);
}

static void pool_destroyed(CUmemoryPool pool)
{
    front_lock(&pools_lock);
    for (size_t i = 0; i < pools_len; i++)
        if (pools[i].pool == pool) {
            pools[i] = pools[--pools_len];
            break;
        }
    pthread_mutex_unlock(&pools_lock);
}

/* The ordinal of the device whose default memory pool is pool, or -1. */
static int default_pool_device(CUmemoryPool pool)
{
    __typeof__(real.cu_device_get_count) count_devices =
        (__typeof__(real.cu_device_get_count))resolve(R_cu_device_get_count);
    __typeof__(real.cu_device_get) get = (__typeof__(real.cu_device_get))resolve(R_cu_device_get);
    __typeof__(real.cu_device_get_default_mem_pool) default_pool =
        (__typeof__(real.cu_device_get_default_mem_pool))resolve(R_cu_device_get_default_mem_pool);
    int n = 0;
    if (!pool || !count_devices || !get || !default_pool || count_devices(&n) != CUDA_SUCCESS)
        return -1;
    for (int i = 0; i < n; i++) {
        CUdevice dev;
        CUmemoryPool p = NULL;
        if (get(&dev, i) == CUDA_SUCCESS && default_pool(&p, dev) == CUDA_SUCCESS && p == pool)
            return i;
    }
    return -1;
}

/*
 * The device an allocation from pool on stream counts on: the pool's
 * device, for a pool whose creation the shim saw or a device's default
 * pool; else (a host-located pool, or one made where the shim could not
 * see it) the stream's. *device is the current device on entry.
 */
static void pool_place(CUmemoryPool pool, CUstream stream, int32_t *device)
{
    int found = 0;
    front_lock(&pools_lock);
    for (size_t i = 0; i < pools_len && !found; i++)
        if ((found = pools[i].pool == pool))
            *device = pools[i].device;
    pthread_mutex_unlock(&pools_lock);
    if (found)
        return;
    int d = default_pool_device(pool);
    CUcontext ctx = NULL;
    if (d >= 0)
        *device = d;
    else
        stream_place(stream, device, &ctx);
}

/*
 * An allocation from an explicit memory pool: its bytes are taken on the
 * pool's device (pool_place; in that device's primary context, the pool
 * may synchronize to make room first), passed to the real function and
 * recorded like a created context's allocation, so every free path gives
 * them back. Never pooled: the application chose its pool.
 */
static CUresult mem_alloc_from_pool_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                          CUstream stream, int per_thread)
{
    int which =
        per_thread ? R_cu_mem_alloc_from_pool_async_ptsz : R_cu_mem_alloc_from_pool_async;
    __typeof__(real.cu_mem_alloc_from_pool_async) real_alloc =
        (__typeof__(real.cu_mem_alloc_from_pool_async))resolve(which);
    if (!real_alloc)
        return missing_real(which);
    CUresult rc;
    int32_t device = 0;
    CUcontext ctx = NULL;
    enum route r = driver_alloc_route(dptr, bytesize, &device, &ctx);
    depth++;
    switch (r) {
    case ROUTE_CORE:
    case ROUTE_CONTEXT:
        pool_place(pool, per_thread && !stream ? CU_STREAM_PER_THREAD : stream, &device);
        rc = (CUresult)core.take(device, bytesize, SPILLWAY_TAKE_POOL | take_in_primary(device));
        if (rc == CUDA_SUCCESS) {
            front_read_lock(&reset_lock);
            rc = real_alloc(dptr, bytesize, pool, stream);
            context_took_from_pool(rc, ctx, device, *dptr, bytesize);
            pthread_rwlock_unlock(&reset_lock);
        }
        break;
    case ROUTE_REFUSE:
        rc = CUDA_ERROR_NOT_INITIALIZED;
        break;
    default:
        rc = real_alloc(dptr, bytesize, pool, stream);
    }
    depth--;
    return rc;
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream hStream)
{
    return mem_alloc_from_pool_async(dptr, bytesize, pool, hStream, 0);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream hStream)
{
    return mem_alloc_from_pool_async(dptr, bytesize, pool, hStream, 1);
}

EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                           cudaStream_t stream)
{
    REAL(real_alloc, malloc_from_pool_async);
    cudaError_t rc;
    int32_t device = 0;
    enum route r = route();
    depth++;
    if (r == ROUTE_REFUSE) {
        rc = cudaErrorInitializationError;
    } else if (r != ROUTE_CORE || !ptr || size == 0) {
        rc = real_alloc(ptr, size, memPool, stream);
    } else if ((rc = current_device(&device)) == cudaSuccess) {
        pool_place(memPool, (CUstream)stream, &device);
        rc = (cudaError_t)core.take(device, size, SPILLWAY_TAKE_RUNTIME_POOL | take_in_primary(device));
        if (rc == cudaSuccess) {
            front_read_lock(&reset_lock);
            rc = real_alloc(ptr, size, memPool, stream);
            context_took_from_pool((CUresult)rc, current_created(), device,
                                   (CUdeviceptr)(uintptr_t)*ptr, size);
            pthread_rwlock_unlock(&reset_lock);
        }
    }
    depth--;
    return rc;
}

/*
 * A device's default memory pool: the allocations CUDA's default pool would
 * serve (cudaMallocAsync, and cudaMalloc alike) are Spillway's pool's, so
 * that pool answers the usage attributes of the default pool, the reset of
 * their high-water marks and cuMemPoolTrimTo (PyTorch's cudaMallocAsync
 * backend reads its statistics and empties its cache so). The real call is
 * made first, quietly: it checks the arguments and gives CUDA's error (a
 * High set to anything but 0, an unknown pool); the core hears only of a
 * success on a default pool, and only once it runs (never loading it). The
 * application's own pools, and what CUDA stores of the default pool (its
 * release threshold and reuse policies), stay CUDA's.
 */

/* After a real get that succeeded: a usage attribute of a default pool is Spillway's pool's. */
static void pool_usage(CUmemoryPool pool, int attr, void *value)
{
    if (attr < CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT || attr > CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        return;
    int device = default_pool_device(pool);
    uint64_t v = 0;
    if (device >= 0 && core.mempool_usage(device, attr, &v) == 1)
        *(cuuint64_t *)value = v;
}

/* After a real set that succeeded: a High of a default pool was set to 0. */
static void pool_reset_high(CUmemoryPool pool, int attr)
{
    if (attr != CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH && attr != CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        return;
    int device = default_pool_device(pool);
    if (device >= 0)
        core.mempool_reset_high(device, attr);
}

/* After a real trim that succeeded: Spillway's pool of a default pool's device is trimmed. */
static void pool_trim(CUmemoryPool pool, size_t keep)
{
    int device = default_pool_device(pool);
    if (device >= 0)
        core.mempool_trim(device, keep);
}

/* A memory-pool call: the real one, quiet, then tell (depth raised) when
 * it succeeded and the core listened as the call began. */
#define POOL_CALL(ret, name, field, params, args, tell)                                        \
    EXPORT ret name params                                                                     \
    {                                                                                          \
        REAL(real_call, field);                                                                \
        int listens = core_listens();                                                          \
        ret rc;                                                                                \
        CALL_QUIET(rc, real_call args);                                                        \
        if (rc == 0 && listens) {                                                              \
            depth++;                                                                           \
            tell;                                                                              \
            depth--;                                                                           \
        }                                                                                      \
        return rc;                                                                             \
    }

_Static_assert((int)cudaMemPoolAttrReservedMemCurrent == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT &&
                   (int)cudaMemPoolAttrUsedMemHigh == CU_MEMPOOL_ATTR_USED_MEM_HIGH &&
                   (int)cudaMemPoolAttrReservedMemHigh == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
               "the runtime's pool attributes are the driver's");

POOL_CALL(CUresult, cuMemPoolGetAttribute, cu_mem_pool_get_attribute,
          (CUmemoryPool pool, CUmemPool_attribute attr, void *value), (pool, attr, value),
          pool_usage(pool, attr, value))
POOL_CALL(CUresult, cuMemPoolSetAttribute, cu_mem_pool_set_attribute,
          (CUmemoryPool pool, CUmemPool_attribute attr, void *value), (pool, attr, value),
          pool_reset_high(pool, attr))
POOL_CALL(CUresult, cuMemPoolTrimTo, cu_mem_pool_trim_to, (CUmemoryPool pool, size_t minBytesToKeep),
          (pool, minBytesToKeep), pool_trim(pool, minBytesToKeep))
POOL_CALL(cudaError_t, cudaMemPoolGetAttribute, mem_pool_get_attribute,
          (cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value), (memPool, attr, value),
          pool_usage(memPool, attr, value))
POOL_CALL(cudaError_t, cudaMemPoolSetAttribute, mem_pool_set_attribute,
          (cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value), (memPool, attr, value),
          pool_reset_high(memPool, attr))
POOL_CALL(cudaError_t, cudaMemPoolTrimTo, mem_pool_trim_to,
          (cudaMemPool_t memPool, size_t minBytesToKeep), (memPool, minBytesToKeep),
          pool_trim(memPool, minBytesToKeep))

/* The application's pools: each one's device is remembered (pool_place),
 * whatever the route, so that pools made before the core runs are known.
 * The runtime's calls reach the driver's, which record the pool again. */
_Static_assert(sizeof(struct cudaMemPoolProps) == sizeof(CUmemPoolProps) &&
                   offsetof(struct cudaMemPoolProps, location) ==
                       offsetof(CUmemPoolProps, location),
               "the runtime's pool properties are the driver's");

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    REAL(real_create, cu_mem_pool_create);
    CUresult rc;
    CALL_QUIET(rc, real_create(pool, poolProps));
    if (rc == CUDA_SUCCESS)
        pool_created(*pool, poolProps->location.type, poolProps->location.id);
    return rc;
}

EXPORT cudaError_t cudaMemPoolCreate(cudaMemPool_t *memPool,
                                     const struct cudaMemPoolProps *poolProps)
{
    REAL(real_create, mem_pool_create);
    cudaError_t rc;
    CALL_QUIET(rc, real_create(memPool, poolProps));
    if (rc == cudaSuccess)
        pool_created(*memPool, poolProps->location.type, poolProps->location.id);
    return rc;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    REAL(real_destroy, cu_mem_pool_destroy);
    CUresult rc;
    CALL_QUIET(rc, real_destroy(pool));
    if (rc == CUDA_SUCCESS)
        pool_destroyed(pool);
    return rc;
}

EXPORT cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool)
{
    REAL(real_destroy, mem_pool_destroy);
    cudaError_t rc;
    CALL_QUIET(rc, real_destroy(memPool));
    if (rc == cudaSuccess)
        pool_destroyed(memPool);
    return rc;
}
