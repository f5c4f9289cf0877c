"""numba.cuda under a quota (the primary context): what it sees and is refused.

Allocates ALLOC_MIB twice; prints one JSON object; the Go test judges it.
"""
import json
import os

from numba import cuda
from numba.cuda.cudadrv.driver import CudaAPIError

MIB = 1 << 20
size = int(os.environ["ALLOC_MIB"]) * MIB

ctx = cuda.current_context()
info = ctx.get_memory_info()
seen = {"total": info.total, "free_before": info.free}
first = cuda.device_array(size, dtype="u1")
seen["free_allocated"] = ctx.get_memory_info().free
try:
    second = cuda.device_array(size, dtype="u1")
    seen["second"] = "allocated"
except CudaAPIError as e:
    seen["second"] = "refused"
    seen["second_code"] = e.code
    seen["second_error"] = str(e)
del first
ctx.memory_manager.deallocations.clear()
third = cuda.device_array(size, dtype="u1")  # fits again once the first is freed
seen["third"] = "allocated"
print(json.dumps(seen))
