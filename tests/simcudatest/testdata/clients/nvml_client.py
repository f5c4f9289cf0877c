"""pynvml on simcuda's NVML, unmodified: the calls monitoring tools make.

Prints one JSON object per device; the Go test judges them.
"""
import json

import pynvml as N

N.nvmlInit()
devices = []
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    mem = N.nvmlDeviceGetMemoryInfo(h)
    bar1 = N.nvmlDeviceGetBAR1MemoryInfo(h)
    pci = N.nvmlDeviceGetPciInfo(h)
    util = N.nvmlDeviceGetUtilizationRates(h)
    try:
        N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)
        temperature = "supported"
    except N.NVMLError_NotSupported:
        temperature = "not supported"
    devices.append({
        "index": N.nvmlDeviceGetIndex(h),
        "name": N.nvmlDeviceGetName(h),
        "uuid": N.nvmlDeviceGetUUID(h),
        "total": mem.total,
        "used": mem.used,
        "free": mem.free,
        "bar1_total": bar1.bar1Total,
        "bus_id": pci.busId if isinstance(pci.busId, str) else pci.busId.decode(),
        "utilization_gpu": util.gpu,
        "temperature": temperature,
        "processes": {str(p.pid): p.usedGpuMemory for p in N.nvmlDeviceGetComputeRunningProcesses(h)},
        "graphics_processes": len(N.nvmlDeviceGetGraphicsRunningProcesses(h)),
    })
print(json.dumps({"driver": N.nvmlSystemGetDriverVersion(), "devices": devices}))
N.nvmlShutdown()
