"""numba.cuda on simcuda through NUMBA_CUDA_DRIVER, unmodified: memory API.

Prints one JSON object of what it observed; the Go test judges it.
"""
import json

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import driver

MIB = 1 << 20

seen = {"driver_available": driver.driver.is_available}
ctx = cuda.current_context()
info = ctx.get_memory_info()
seen.update(total=info.total, free_before=info.free)

host = np.arange(MIB, dtype=np.float64)  # 8 MiB
on_device = cuda.to_device(host)
scratch = cuda.device_array(MIB // 2, dtype=np.float32)  # 2 MiB
seen["free_allocated"] = ctx.get_memory_info().free
back = on_device.copy_to_host()
seen["roundtrip"] = bool((host == back).all())
scratch.copy_to_device(host[: MIB // 2].astype(np.float32))
seen["scratch_roundtrip"] = bool((scratch.copy_to_host() == host[: MIB // 2].astype(np.float32)).all())

del on_device, scratch
ctx.memory_manager.deallocations.clear()  # run the pending cuMemFree calls now
seen["free_after"] = ctx.get_memory_info().free
print(json.dumps(seen))
