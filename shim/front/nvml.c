/*
 * nvml.c: NVML's memory reports (memory info, running processes, BAR1) as
 * this process may see them: with a quota, the quota stands for the
 * device's memory and what Spillway counts for the process's use.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "front.h"

/*
 * NVML numbers devices its own way (all of them, by PCI order); CUDA by
 * CUDA_VISIBLE_DEVICES and its ordering. A device is matched to its CUDA
 * ordinal by its UUID, through the driver, which the front loads (and
 * initialises) for the purpose when the process has not. Also gives the
 * device's total as CUDA reports it (cuDeviceTotalMem, which needs no
 * context), the total a percentage quota is a share of: NVML's is larger,
 * by the memory the driver reserves. -1: no match.
 */
static int cuda_device(nvmlDevice_t device, uint64_t *cuda_total)
{
    char want[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    __typeof__(real.nvml_device_uuid) uuid_of =
        (__typeof__(real.nvml_device_uuid))resolve(R_nvml_device_uuid);
    if (!uuid_of || uuid_of(device, want, sizeof want) != NVML_SUCCESS)
        return -1;
    if (!resolve(R_cu_init))
        dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); /* kept: the mapping needs it again */
    __typeof__(real.cu_init) init = (__typeof__(real.cu_init))resolve(R_cu_init);
    __typeof__(real.cu_device_get_count) count_devices =
        (__typeof__(real.cu_device_get_count))resolve(R_cu_device_get_count);
    __typeof__(real.cu_device_get) get = (__typeof__(real.cu_device_get))resolve(R_cu_device_get);
    __typeof__(real.cu_device_get_uuid) uuid =
        (__typeof__(real.cu_device_get_uuid))resolve(R_cu_device_get_uuid);
    __typeof__(real.cu_device_total_mem) total_mem =
        (__typeof__(real.cu_device_total_mem))resolve(R_cu_device_total_mem);
    int n = 0;
    if (!init || !count_devices || !get || !uuid || !total_mem || init(0) != CUDA_SUCCESS ||
        count_devices(&n) != CUDA_SUCCESS)
        return -1;
    for (int i = 0; i < n; i++) {
        CUdevice dev;
        CUuuid u;
        char have[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        if (get(&dev, i) != CUDA_SUCCESS || uuid(&u, dev) != CUDA_SUCCESS)
            continue;
        const unsigned char *b = (const unsigned char *)u.bytes;
        snprintf(have, sizeof have,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                 b[14], b[15]);
        if (strcmp(have, want) != 0)
            continue;
        size_t bytes = 0;
        if (total_mem(&bytes, dev) != CUDA_SUCCESS)
            return -1;
        *cuda_total = bytes;
        return i;
    }
    return -1;
}

/*
 * The process's share of a device as NVML should show it: with a quota on
 * the device, returns 1 with *quota = the quota (the one every allocation is
 * held to, and cudaMemGetInfo and cuDeviceTotalMem report) and *used = what
 * Spillway counts against it, never above the quota. Returns 0 when NVML's
 * own figures stand, and NVML_NONE_FREE when every allocation is refused
 * (an invalid configuration, or a quota and no core): none of the device's
 * memory is the process's, as cudaMemGetInfo then says.
 * Without a quota configured, NVML never loads the core (a monitoring tool
 * that uses only NVML starts no Go runtime).
 */
#define NVML_NONE_FREE (-1)
static int nvml_as_limited(nvmlDevice_t device, unsigned long long *quota,
                           unsigned long long *used)
{
    int ordinal;
    uint64_t cuda_total = 0;
    if (atomic_load_explicit(&state, memory_order_acquire) != READY && !quota_configured())
        return 0;
    /* The device first: it loads the driver, which the core starts on in a
     * process that has used only NVML so far. */
    ordinal = cuda_device(device, &cuda_total);
    enum route r = route();
    if (r == ROUTE_REFUSE)
        return NVML_NONE_FREE;
    if (r != ROUTE_CORE || ordinal < 0)
        return 0;
    uint64_t q = 0, u = 0;
    depth++;
    int32_t rc = core.nvml_memory(ordinal, cuda_total, &q, &u);
    depth--;
    if (rc == cudaErrorInitializationError)
        return NVML_NONE_FREE;
    if (rc != cudaSuccess || q == 0)
        return 0;
    *quota = q;
    *used = u < q ? u : q;
    return 1;
}

/*
 * NVML's memory figures of device as this process may see them, in place:
 * with a quota, the quota as total, what Spillway counts as used, and as
 * free what is left of the quota, never more than the device really has
 * free (the GPU's other processes hold the rest), as cudaMemGetInfo
 * reports; none free when every allocation is refused. Returns whether the
 * figures were changed.
 */
static int limit_memory(nvmlDevice_t device, unsigned long long *total, unsigned long long *used,
                        unsigned long long *free)
{
    unsigned long long quota = 0, counted = 0;
    int limited = nvml_as_limited(device, &quota, &counted);
    if (limited == NVML_NONE_FREE) {
        *used = *total;
        *free = 0;
        return 1;
    }
    if (limited == 0)
        return 0;
    unsigned long long left = quota - counted; /* nvml_as_limited keeps used within the quota */
    *total = quota;
    *used = counted;
    *free = left < *free ? left : *free;
    return 1;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    REAL(real_memory_info, nvml_memory_info);
    nvmlReturn_t rc = real_memory_info(device, memory);
    if (rc == NVML_SUCCESS && depth == 0)
        limit_memory(device, &memory->total, &memory->used, &memory->free);
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    REAL(real_memory_info, nvml_memory_info_v2);
    nvmlReturn_t rc = real_memory_info(device, memory);
    if (rc == NVML_SUCCESS && depth == 0 &&
        limit_memory(device, &memory->total, &memory->used, &memory->free))
        memory->reserved = 0; /* the driver's reserve is in no quota */
    return rc;
}

/*
 * Whether a process list's entry of pid is this process's, whose used
 * memory is then what Spillway counts, when it has a quota. Each version of
 * the list has its own entry type.
 */
static int own_process_entry(nvmlDevice_t device, unsigned int pid, unsigned long long *usedGpuMemory)
{
    if (pid != (unsigned int)getpid())
        return 0;
    unsigned long long quota = 0, used = 0;
    if (nvml_as_limited(device, &quota, &used) > 0)
        *usedGpuMemory = used;
    return 1;
}

static void own_process_usage(nvmlDevice_t device, unsigned int count, nvmlProcessInfo_t *infos)
{
    for (unsigned int i = 0; infos && i < count; i++)
        if (own_process_entry(device, infos[i].pid, &infos[i].usedGpuMemory))
            return;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    REAL(real_processes, nvml_processes_v2);
    nvmlReturn_t rc = real_processes(device, infoCount, infos);
    if (rc == NVML_SUCCESS && depth == 0)
        own_process_usage(device, *infoCount, infos);
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    REAL(real_processes, nvml_processes_v3);
    nvmlReturn_t rc = real_processes(device, infoCount, infos);
    if (rc == NVML_SUCCESS && depth == 0)
        own_process_usage(device, *infoCount, infos);
    return rc;
}

/* ---- NVML's other memory reports ---- */

/*
 * BAR1, the window through which the host maps device memory: a process
 * with a quota sees no more of it than its quota (what it could map at
 * most), used as NVML reports it within that.
 */
EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory)
{
    REAL(real_bar1, nvml_bar1_memory_info);
    nvmlReturn_t rc = real_bar1(device, bar1Memory);
    unsigned long long quota = 0, held = 0;
    if (rc == NVML_SUCCESS && depth == 0 && nvml_as_limited(device, &quota, &held) > 0 &&
        quota < bar1Memory->bar1Total) {
        bar1Memory->bar1Total = quota;
        if (bar1Memory->bar1Used > quota)
            bar1Memory->bar1Used = quota;
        bar1Memory->bar1Free = quota - bar1Memory->bar1Used;
    }
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                         unsigned int *infoCount,
                                                         nvmlProcessInfo_v1_t *infos)
{
    REAL(real_processes, nvml_processes_v1);
    nvmlReturn_t rc = real_processes(device, infoCount, infos);
    for (unsigned int i = 0; rc == NVML_SUCCESS && depth == 0 && infos && i < *infoCount; i++)
        if (own_process_entry(device, infos[i].pid, &infos[i].usedGpuMemory))
            break;
    return rc;
}
