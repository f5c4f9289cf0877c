"""pynvml and gpustat inside a process that holds HOLD_MIB through the driver.

Prints one JSON object, then, with argument "hold", keeps the memory until
its standard input closes (so that a tool outside can look at it).
"""
import ctypes
import json
import os
import sys

MIB = 1 << 20

cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(os.environ["HOLD_MIB"]) * MIB)) == 0

import gpustat  # noqa: E402
import pynvml as N  # noqa: E402

N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
mem = N.nvmlDeviceGetMemoryInfo(h)
bar1 = N.nvmlDeviceGetBAR1MemoryInfo(h)
me = str(os.getpid())
seen = {
    "pid": os.getpid(),
    "total": mem.total,
    "used": mem.used,
    "free": mem.free,
    "bar1_total": bar1.bar1Total,
    "process_used": {str(p.pid): p.usedGpuMemory for p in N.nvmlDeviceGetComputeRunningProcesses(h)}.get(me),
}
g = gpustat.new_query().gpus[0]
seen["gpustat_total_mib"] = g.memory_total
seen["gpustat_used_mib"] = g.memory_used
seen["gpustat_process_mib"] = {str(p["pid"]): p["gpu_memory_usage"] for p in g.processes}.get(me)
print(json.dumps(seen), flush=True)
if sys.argv[1:] == ["hold"]:
    sys.stdin.read()
