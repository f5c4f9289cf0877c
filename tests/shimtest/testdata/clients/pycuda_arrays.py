"""pycuda's CUDA arrays and pitched allocations under a quota, as NVML sees them.

In a context of its own (make_context): arrays of 16 MiB (pycuda.driver.Array
of an ArrayDescriptor, cuArrayCreate_v2, and of an ArrayDescriptor3D,
cuArray3DCreate_v2) until one is refused, one freed and another made; an
array in a second context, detached; mem_alloc_pitch (cuMemAllocPitch_v2).
Then in the primary context (retain_primary_context, as numba and the
runtime use it): an array made after a free. Prints one JSON object; the Go
test judges it.
"""
import json
import os

import pycuda.driver as cuda
import pynvml as N

MIB = 1 << 20


def descriptor_2d():
    d = cuda.ArrayDescriptor()
    d.width, d.height = 2048, 2048  # floats: 16 MiB
    d.format, d.num_channels = cuda.array_format.FLOAT, 1
    return d


def descriptor_3d(depth):
    d = cuda.ArrayDescriptor3D()
    d.width, d.height, d.depth = 256, 256, depth  # floats: depth / 4 MiB
    d.format, d.num_channels = cuda.array_format.FLOAT, 1
    return d


N.nvmlInit()
nvml_device = N.nvmlDeviceGetHandleByIndex(0)


def view():
    """What cuMemGetInfo and NVML (the device, this process's entry) say."""
    free, total = cuda.mem_get_info()
    used = N.nvmlDeviceGetMemoryInfo(nvml_device).used
    procs = N.nvmlDeviceGetComputeRunningProcesses(nvml_device)
    own = {p.pid: p.usedGpuMemory for p in procs}.get(os.getpid(), 0)
    return {"free": free, "total": total, "nvml_used": used, "nvml_process": own}


cuda.init()
ctx = cuda.Device(0).make_context()
seen = {"before": view(), "made": []}
arrays = []
while len(arrays) < 8:
    try:
        arrays.append(cuda.Array(descriptor_2d() if len(arrays) % 2 == 0 else descriptor_3d(64)))
    except cuda.MemoryError as e:
        seen["refused"] = str(e)
        break
    seen["made"].append(view())
arrays.pop(0).free()
seen["freed_one"] = view()
arrays.append(cuda.Array(descriptor_3d(64)))  # fits again
seen["made_again"] = view()
try:
    arrays.append(cuda.Array(descriptor_3d(64)))
    seen["refused_3d"] = "allocated"
except cuda.MemoryError as e:
    seen["refused_3d"] = str(e)
for a in arrays:
    a.free()
arrays = []

# A second context's array counts against the same quota and goes with it.
other = cuda.Device(0).make_context()
in_other = cuda.Array(descriptor_2d())
seen["in_other"] = view()
other.pop()
other.detach()
seen["other_detached"] = view()
del in_other  # its context is gone: pycuda does not destroy it again

# Pitched rows are charged at the pitch CUDA returns, not the width asked.
ptr, pitch = cuda.mem_alloc_pitch(1000, 100, 4)
seen["pitch"] = pitch
seen["pitched"] = view()
ptr.free()
rows = 64 * MIB // 512  # rows of 1 byte, each padded to a 512-byte pitch: the whole quota
try:
    cuda.mem_alloc_pitch(1, rows + 1, 4)
    seen["one_row_over"] = "allocated"
except cuda.MemoryError as e:
    seen["one_row_over"] = "refused: " + str(e)
whole, whole_pitch = cuda.mem_alloc_pitch(1, rows, 4)
seen["whole_pitch"] = whole_pitch
seen["whole"] = view()
whole.free()
ctx.pop()
ctx.detach()

# The primary context, the pool's: memory freed there is free for an array.
primary = cuda.Device(0).retain_primary_context()
primary.push()
first = cuda.mem_alloc(48 * MIB)
first.free()
seen["primary_freed"] = view()
try:
    big = cuda.Array(descriptor_3d(128))  # 32 MiB
    seen["primary_array"] = "allocated"
    seen["primary_with_array"] = view()
    big.free()
except cuda.MemoryError as e:
    seen["primary_array"] = "refused: " + str(e)
primary.pop()
primary.detach()
print(json.dumps(seen))
