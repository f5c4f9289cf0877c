/*
 * nvmlfirstuse: what each report says of device 0's memory before the
 * process first uses it (NVML first, as a monitoring tool would, then the
 * driver and the runtime) and after a cudaMalloc of 16 MiB there:
 *   "v1 TOTAL USED FREE"            nvmlDeviceGetMemoryInfo
 *   "v2 TOTAL RESERVED USED FREE"   nvmlDeviceGetMemoryInfo_v2
 *   "b TOTAL"                       nvmlDeviceGetBAR1MemoryInfo
 *   "d TOTAL"                       cuDeviceTotalMem_v2
 *   "r FREE TOTAL"                  cudaMemGetInfo
 * each printed twice, before and after.
 */
#include <stdio.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>
#include <spillway/nvml.h>

static int report(nvmlDevice_t dev)
{
    nvmlMemory_t m1;
    nvmlMemory_v2_t m2 = {.version = NVML_STRUCT_VERSION(Memory, 2)};
    nvmlBAR1Memory_t bar1;
    size_t total = 0, free_bytes = 0;
    if (nvmlDeviceGetMemoryInfo(dev, &m1) != NVML_SUCCESS ||
        nvmlDeviceGetMemoryInfo_v2(dev, &m2) != NVML_SUCCESS ||
        nvmlDeviceGetBAR1MemoryInfo(dev, &bar1) != NVML_SUCCESS)
        return 0;
    printf("v1 %llu %llu %llu\n", m1.total, m1.used, m1.free);
    printf("v2 %llu %llu %llu %llu\n", m2.total, m2.reserved, m2.used, m2.free);
    printf("b %llu\n", bar1.bar1Total);
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceTotalMem_v2(&total, 0) != CUDA_SUCCESS)
        return 0;
    printf("d %zu\n", total);
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess)
        return 0;
    printf("r %zu %zu\n", free_bytes, total);
    return 1;
}

int main(void)
{
    nvmlDevice_t dev;
    void *p;
    if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetHandleByIndex_v2(0, &dev) != NVML_SUCCESS ||
        !report(dev) || cudaMalloc(&p, 16 << 20) != cudaSuccess || !report(dev))
        return 2;
    return 0;
}
