/* nvmltotal: prints NVML's total for device 0, as a monitoring tool sees it ("t TOTAL"). */
#include <stdio.h>

#include <spillway/nvml.h>

int main(void)
{
    nvmlDevice_t dev;
    nvmlMemory_t m;
    if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetHandleByIndex_v2(0, &dev) != NVML_SUCCESS ||
        nvmlDeviceGetMemoryInfo(dev, &m) != NVML_SUCCESS)
        return 2;
    printf("t %llu\n", m.total);
    return 0;
}
