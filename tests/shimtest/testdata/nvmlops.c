/*
 * nvmlops SIZE [hold]: allocates SIZE MiB with cudaMalloc on CUDA device 0,
 * then prints what NVML reports for every device (with hold, then holds the
 * memory until its standard input closes):
 *   "v1 INDEX TOTAL USED FREE"   nvmlDeviceGetMemoryInfo
 *   "v2 INDEX TOTAL USED FREE"   nvmlDeviceGetMemoryInfo_v2
 *   "p INDEX BYTES"              this process in nvmlDeviceGetComputeRunningProcesses_v3
 *                                (-1 when it is not listed)
 *   "p2 INDEX BYTES"             the same in nvmlDeviceGetComputeRunningProcesses_v2
 *   "q INDEX BYTES"              the same in the v1 nvmlDeviceGetComputeRunningProcesses
 *   "b INDEX TOTAL USED FREE"    nvmlDeviceGetBAR1MemoryInfo
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <spillway/cuda_runtime.h>
#include <spillway/nvml.h>

/* The v1 and v2 process queries, which the shared header does not declare. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos);

/* own is this process's usedGpuMemory in infos, or -1 when it is not listed. */
static long long own(const nvmlProcessInfo_t *infos, unsigned int count)
{
    for (unsigned int k = 0; k < count; k++)
        if (infos[k].pid == (unsigned int)getpid())
            return (long long)infos[k].usedGpuMemory;
    return -1;
}

int main(int argc, char **argv)
{
    void *p = NULL;
    int hold = argc == 3 && strcmp(argv[2], "hold") == 0;
    if ((argc != 2 && !hold) || cudaMalloc(&p, (size_t)atol(argv[1]) << 20) != cudaSuccess)
        return 2;
    unsigned int n = 0;
    if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetCount_v2(&n) != NVML_SUCCESS)
        return 2;
    for (unsigned int i = 0; i < n; i++) {
        nvmlDevice_t dev;
        nvmlMemory_t m1;
        nvmlMemory_v2_t m2 = {.version = NVML_STRUCT_VERSION(Memory, 2)};
        nvmlProcessInfo_t procs[64];
        unsigned int count = 64;
        if (nvmlDeviceGetHandleByIndex_v2(i, &dev) != NVML_SUCCESS ||
            nvmlDeviceGetMemoryInfo(dev, &m1) != NVML_SUCCESS ||
            nvmlDeviceGetMemoryInfo_v2(dev, &m2) != NVML_SUCCESS ||
            nvmlDeviceGetComputeRunningProcesses_v3(dev, &count, procs) != NVML_SUCCESS)
            return 2;
        printf("v1 %u %llu %llu %llu\n", i, m1.total, m1.used, m1.free);
        printf("v2 %u %llu %llu %llu\n", i, m2.total, m2.used, m2.free);
        printf("p %u %lld\n", i, own(procs, count));
        count = 64;
        if (nvmlDeviceGetComputeRunningProcesses_v2(dev, &count, procs) != NVML_SUCCESS)
            return 2;
        printf("p2 %u %lld\n", i, own(procs, count));
        nvmlProcessInfo_v1_t old[64];
        nvmlBAR1Memory_t bar1;
        count = 64;
        if (nvmlDeviceGetComputeRunningProcesses(dev, &count, old) != NVML_SUCCESS ||
            nvmlDeviceGetBAR1MemoryInfo(dev, &bar1) != NVML_SUCCESS)
            return 2;
        long long own_v1 = -1;
        for (unsigned int k = 0; k < count; k++)
            if (old[k].pid == (unsigned int)getpid())
                own_v1 = (long long)old[k].usedGpuMemory;
        printf("q %u %lld\n", i, own_v1);
        printf("b %u %llu %llu %llu\n", i, bar1.bar1Total, bar1.bar1Used, bar1.bar1Free);
    }
    if (hold) {
        fflush(stdout);
        while (getchar() != EOF)
            ;
    }
    return 0;
}
