/*
 * vmm.c: the virtual-memory API. cuMemCreate's device memory is taken from
 * the quota (or placed on the host when the device oversubscribes); the core
 * follows each handle's references and mappings and gives the bytes back
 * when CUDA frees the memory.
 */
#define _GNU_SOURCE

#include "front.h"

/*
 * Whether a cuMemCreate the quota refused may be placed on the host
 * instead: nothing in prop asks what host-located memory may not give (a
 * shareable handle, compression, GPUDirect RDMA, a special usage).
 */
static int host_placeable(const CUmemAllocationProp *prop)
{
    return prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE &&
           prop->allocFlags.compressionType == CU_MEM_ALLOCATION_COMP_NONE &&
           prop->allocFlags.gpuDirectRDMACapable == 0 && prop->allocFlags.usage == 0;
}

/*
 * Each virtual-memory call and the core's record of it happen under one
 * lock, so that the core hears them in the order CUDA did them: a handle or
 * an address another thread reuses in between (unmapped here, mapped there)
 * is never recorded out of turn.
 */
pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;

/* Set once cuMemCreate placed memory on the host: until then no grant of the
 * program's can cover any, and cuMemSetAccess need not ask the core. */
static atomic_int placed_on_host;

/* The real cuMemCreate of memory whose bytes were taken on device for
 * kind: the core records the handle, or the bytes are given back. */
static CUresult create_taken(__typeof__(real.cu_mem_create) real_create, CUmemGenericAllocationHandle *handle,
                             size_t size, const CUmemAllocationProp *prop, unsigned long long flags,
                             int32_t device, int32_t kind)
{
    front_lock(&vmm_lock);
    CUresult rc = real_create(handle, size, prop, flags);
    if (rc == CUDA_SUCCESS)
        core.vmm_created(*handle, device, size, kind);
    pthread_mutex_unlock(&vmm_lock);
    if (rc != CUDA_SUCCESS)
        core.give(device, size, kind);
    return rc;
}

/* After a quiet refusal, the quota answers again, and reports the refusal
 * (or has room by now: the memory is made on the device). */
static CUresult create_reported(__typeof__(real.cu_mem_create) real_create, CUmemGenericAllocationHandle *handle,
                                size_t size, const CUmemAllocationProp *prop, unsigned long long flags,
                                int32_t device)
{
    CUresult rc = (CUresult)core.take(device, size, SPILLWAY_TAKE_VMM);
    if (rc != CUDA_SUCCESS)
        return rc;
    return create_taken(real_create, handle, size, prop, flags, device, SPILLWAY_TAKE_VMM);
}

/*
 * CUDA's answer to a cuMemCreate the quota cannot hold, where CUDA refuses
 * it whatever the memory: flags other than 0, properties the granularity
 * query refuses (it checks them as cuMemCreate does), or a size that is no
 * multiple of the minimum granularity. CUDA_SUCCESS for a valid request.
 */
static CUresult cuda_refusal(size_t size, const CUmemAllocationProp *prop, unsigned long long flags)
{
    __typeof__(real.cu_mem_get_allocation_granularity) granularity_of =
        (__typeof__(real.cu_mem_get_allocation_granularity))resolve(R_cu_mem_get_allocation_granularity);
    size_t granularity = 0;
    if (!granularity_of)
        return CUDA_SUCCESS; /* nothing to ask: the quota's answer stands */
    CUresult rc = granularity_of(&granularity, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (flags != 0 || granularity == 0 || size % granularity != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/*
 * cuMemCreate's device-located physical memory is taken from the quota
 * before the real call (refused with CUDA_ERROR_OUT_OF_MEMORY when it does
 * not fit; in the device's primary context, the pool's, the pool first
 * synchronizes to give back what it holds freed, as for arrays); the core
 * follows each handle's releases and mappings and gives the bytes back when
 * CUDA frees them. When the quota refuses a placeable
 * request (quietly: the host may take it) and the device oversubscribes
 * (SPILLWAY_TAKE_VMM_HOST is admitted within the host limit, or refused and
 * reported), it is made host-located on NUMA node 0, as the pool's own
 * spilled granules are: the application maps it and sets the device's
 * access as it would for device memory (cuMemSetAccess below adds the
 * CPU's). A request CUDA itself refuses gets
 * CUDA's error, not the quota's, and no refusal is reported. Host-located
 * memory the application asks for, and calls while the core is not running,
 * pass through uncounted; the others reach the core only once it runs and
 * never load it.
 */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    REAL(real_create, cu_mem_create);
    enum route r = route();
    if (r == ROUTE_REFUSE)
        return CUDA_ERROR_NOT_INITIALIZED;
    __typeof__(real.cu_device_get_count) count_devices =
        (__typeof__(real.cu_device_get_count))resolve(R_cu_device_get_count);
    int n = 0;
    if (r != ROUTE_CORE || !handle || !prop || size == 0 ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !count_devices ||
        count_devices(&n) != CUDA_SUCCESS || prop->location.id < 0 || prop->location.id >= n)
        return real_create(handle, size, prop, flags); /* CUDA's own answer */
    int32_t device = prop->location.id;
    depth++;
    CUresult rc =
        (CUresult)core.take(device, size, SPILLWAY_TAKE_VMM | SPILLWAY_TAKE_QUIET | take_in_primary(device));
    CUresult refusal = rc == CUDA_ERROR_OUT_OF_MEMORY ? cuda_refusal(size, prop, flags) : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS) {
        rc = create_taken(real_create, handle, size, prop, flags, device, SPILLWAY_TAKE_VMM);
    } else if (refusal != CUDA_SUCCESS) {
        rc = refusal;
    } else if (rc == CUDA_ERROR_OUT_OF_MEMORY && !host_placeable(prop)) {
        rc = create_reported(real_create, handle, size, prop, flags, device);
    } else if (rc == CUDA_ERROR_OUT_OF_MEMORY &&
               core.take(device, size, SPILLWAY_TAKE_VMM_HOST) == CUDA_SUCCESS) {
        CUmemAllocationProp host = *prop;
        host.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        host.location.id = 0;
        rc = create_taken(real_create, handle, size, &host, flags, device, SPILLWAY_TAKE_VMM_HOST);
        if (rc == CUDA_SUCCESS)
            atomic_store(&placed_on_host, 1);
        if (rc != CUDA_SUCCESS) /* the driver cannot place it on the host */
            rc = create_reported(real_create, handle, size, prop, flags, device);
    }
    depth--;
    return rc;
}

/* Whether a virtual-memory call that succeeded is the core's to hear of. */
static int vmm_heard(CUresult rc)
{
    return rc == CUDA_SUCCESS && core_listens();
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    REAL(real_release, cu_mem_release);
    front_lock(&vmm_lock);
    CUresult rc = real_release(handle);
    if (vmm_heard(rc))
        core.vmm_released(handle);
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

/*
 * To the program, pool memory is cudaMalloc's, which no handle describes:
 * the handle CUDA would give is of the pool's granule, shared with other
 * blocks and not where the block starts (its address range is the block's),
 * so exporting or mapping it would reach other bytes than the block's.
 */
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    REAL(real_retain, cu_mem_retain_allocation_handle);
    uint64_t base = 0, size = 0;
    if (handle && pool_holds((CUdeviceptr)(uintptr_t)addr, &base, &size) != SPILLWAY_HELD_NOT)
        return CUDA_ERROR_INVALID_VALUE; /* CUDA's answer for memory cuMemMap did not map */
    front_lock(&vmm_lock);
    CUresult rc = real_retain(handle, addr);
    if (vmm_heard(rc))
        core.vmm_retained(*handle);
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

/*
 * An import of a handle this process exported may give back that handle,
 * one more reference to its memory (which cuMemRelease then ends); one the
 * core does not know (another process's, or a new handle to the same
 * memory: CUDA promises neither) is not counted here.
 */
EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                               void *osHandle,
                                               CUmemAllocationHandleType shHandleType)
{
    REAL(real_import, cu_mem_import_from_shareable_handle);
    front_lock(&vmm_lock);
    CUresult rc = real_import(handle, osHandle, shHandleType);
    if (vmm_heard(rc))
        core.vmm_retained(*handle);
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    REAL(real_map, cu_mem_map);
    front_lock(&vmm_lock);
    CUresult rc = real_map(ptr, size, offset, handle, flags);
    if (vmm_heard(rc))
        core.vmm_mapped((uint64_t)ptr, size, handle);
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    REAL(real_unmap, cu_mem_unmap);
    front_lock(&vmm_lock);
    CUresult rc = real_unmap(ptr, size);
    if (vmm_heard(rc))
        core.vmm_unmapped((uint64_t)ptr, size);
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

/* Whether desc names devices only, as a grant for device memory does. */
static int devices_only(const CUmemAccessDesc *desc, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            return 0;
    return 1;
}

/*
 * The program's grant is made as it asked. Memory cuMemCreate placed on the
 * host for oversubscription, which CUDA's pointer queries call host memory,
 * is then granted to the CPU too (by the core), as the program may read it
 * with the CPU as host memory, unless the program named the CPU's access
 * itself.
 */
EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count)
{
    REAL(real_set_access, cu_mem_set_access);
    front_lock(&vmm_lock);
    CUresult rc = real_set_access(ptr, size, desc, count);
    if (atomic_load(&placed_on_host) && vmm_heard(rc) && devices_only(desc, count))
        core.vmm_accessed((uint64_t)ptr, size);
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}
