"""pycuda under a quota: make_context creates a context of its own.

Allocates ALLOC_MIB twice in it, then a second context; prints one JSON
object; the Go test judges it.
"""
import json
import os

import pycuda.driver as cuda

MIB = 1 << 20
size = int(os.environ["ALLOC_MIB"]) * MIB

cuda.init()
ctx = cuda.Device(0).make_context()
free_before, total = cuda.mem_get_info()
seen = {"total": total, "free_before": free_before}
first = cuda.mem_alloc(size)
seen["free_allocated"] = cuda.mem_get_info()[0]
try:
    second = cuda.mem_alloc(size)
    seen["second"] = "allocated"
except cuda.MemoryError as e:
    seen["second"] = "refused"
    seen["second_error"] = str(e)

# A second context: its memory counts against the same quota, and is given
# back when it is detached (destroyed).
other = cuda.Device(0).make_context()
try:
    cuda.mem_alloc(size)
    seen["in_other"] = "allocated"
except cuda.MemoryError:
    seen["in_other"] = "refused"
small = cuda.mem_alloc(MIB)
other.pop()
other.detach()
first.free()
third = cuda.mem_alloc(size)  # fits again: the first is freed, the other context gone
seen["third"] = "allocated"
seen["free_end"] = cuda.mem_get_info()[0]
third.free()
ctx.pop()
ctx.detach()
print(json.dumps(seen))
