"""numba.cuda asks the driver for the extents of its arrays' memory
(cuMemGetAddressRange, numba's device_extents): under the pool each array
is an allocation of its own, as without it.

Prints one JSON object; the Go test judges it.
"""
import json

from numba import cuda
from numba.cuda.cudadrv import driver

seen = {}
for name in ("a", "b"):
    array = cuda.device_array(1000, dtype="u1")
    begin, end = driver.device_extents(array)
    view_begin, view_end = driver.device_extents(array[100:])
    seen[name] = {
        "ptr": int(array.device_ctypes_pointer.value),
        "begin": int(begin), "end": int(end),
        "view_begin": int(view_begin), "view_end": int(view_end),
    }
    seen.setdefault("arrays", []).append(array)  # both live while the other is asked
seen.pop("arrays")
print(json.dumps(seen))
