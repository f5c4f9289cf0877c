/* nvmlonly: a monitoring tool's NVML calls; prints "t TOTAL USED FREE" for device 0 and "L 0|1", whether the Go core is mapped. */
#include <stdio.h>
#include <string.h>

#include <spillway/nvml.h>

int main(void)
{
    nvmlDevice_t dev;
    nvmlMemory_t m;
    if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetHandleByIndex_v2(0, &dev) != NVML_SUCCESS ||
        nvmlDeviceGetMemoryInfo(dev, &m) != NVML_SUCCESS)
        return 2;
    printf("t %llu %llu %llu\n", m.total, m.used, m.free);
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int loaded = 0;
    while (f && fgets(line, sizeof line, f))
        loaded |= strstr(line, "libspillway-core.so") != NULL;
    printf("L %d\n", loaded);
    return 0;
}
