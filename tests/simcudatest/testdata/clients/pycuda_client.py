"""Debian's pycuda on simcuda, unmodified: driver init, contexts, memory.

Prints one JSON object of what it observed; the Go test judges it.
"""
import json

import numpy as np
import pycuda.driver as cuda

MIB = 1 << 20

cuda.init()
dev = cuda.Device(0)
seen = {
    "count": cuda.Device.count(),
    "name": dev.name(),
    "compute_capability": list(dev.compute_capability()),
    "total_memory": dev.total_memory(),
    "attributes": len(dev.get_attributes()),
}

ctx = dev.make_context()
free_before, total = cuda.mem_get_info()
host = np.random.default_rng(7).integers(0, 256, size=4 * MIB, dtype=np.uint8)
buf = cuda.mem_alloc(host.nbytes)
free_allocated, _ = cuda.mem_get_info()
cuda.memcpy_htod(buf, host)
back = np.zeros_like(host)
cuda.memcpy_dtoh(back, buf)
seen.update(
    total=total,
    free_before=free_before,
    free_allocated=free_allocated,
    roundtrip=bool((host == back).all()),
)

# Existing host memory page-locked in place (cuMemHostRegister): a copy
# lands in it, its device pointer is its address, and the device's free
# memory does not move.
pinned = cuda.register_host_memory(np.zeros_like(host), flags=cuda.mem_host_register_flags.DEVICEMAP)
cuda.memcpy_dtoh(pinned, buf)
seen.update(
    registered_roundtrip=bool((host == pinned).all()),
    registered_device_pointer=pinned.base.get_device_pointer() == pinned.ctypes.data,
    free_registered=cuda.mem_get_info()[0],
)
pinned.base.unregister()

# A second context is pushed over the first and popped off again.
other = dev.make_context()
seen["other_is_distinct"] = other.handle != ctx.handle
seen["current_is_other"] = cuda.Context.get_current().handle == other.handle
small = cuda.mem_alloc(MIB)
seen["free_in_other"] = cuda.mem_get_info()[0]
cuda.Context.pop()
seen["current_after_pop"] = cuda.Context.get_current().handle == ctx.handle
small.free()
other.push()
other.detach()
seen["current_after_detach"] = cuda.Context.get_current().handle == ctx.handle

buf.free()
seen["free_after"] = cuda.mem_get_info()[0]
ctx.pop()
ctx.detach()
print(json.dumps(seen))
