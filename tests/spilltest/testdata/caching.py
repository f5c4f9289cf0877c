# caching.py RUNTIME: a stand-in for PyTorch's caching allocator, run under
# the shim with a quota and oversubscription.
#
# The CUDA runtime RUNTIME is loaded with ctypes (RTLD_LOCAL, as Python loads
# an extension module and its libraries). Memory calls are made through the
# process's global scope, where a library linked with the runtime (PyTorch's
# libc10_cuda.so) finds them, so they reach the preloaded shim; copies and
# memsets go to the runtime directly.
#
# The allocator rounds requests as PyTorch does (to 512 bytes up to 1 MiB, to
# 2 MiB multiples above), keeps freed blocks in its cache for requests of the
# same rounded size, and on cudaErrorMemoryAllocation frees its whole cache
# and retries once.
#
# Workload: activations (held, then cached), weights that no longer fit the
# quota, training steps whose activations have another size than the cached
# ones (so the host limit is reached and the cache must be emptied), then only
# the weights are kept. Every tensor's contents are checked.
# Prints "step N RETRIES" per step and, at the end,
# "done RETRIES WEIGHTBYTES FREE TOTAL" (cudaMemGetInfo).
import ctypes
import os
import sys

MIB = 1 << 20
OUT_OF_MEMORY = 2

rt = ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL)
api = ctypes.CDLL(None)  # the global scope: the shim's entry points

for f in (api.cudaMalloc, rt.cudaMemcpy, rt.cudaMemset):
    f.restype = ctypes.c_int
api.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
api.cudaFree.argtypes = [ctypes.c_void_p]
api.cudaMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
rt.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
H2D, D2H = 1, 2


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} returned {rc}")


def round_size(size):
    if size <= MIB:
        return (size + 511) // 512 * 512
    return (size + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)


class CachingAllocator:
    def __init__(self):
        self.cache = {}  # rounded size -> [pointers]
        self.sizes = {}  # pointer -> rounded size, live and cached
        self.retries = 0

    def malloc(self, size):
        size = round_size(size)
        if self.cache.get(size):
            return self.cache[size].pop()
        p = ctypes.c_void_p()
        rc = api.cudaMalloc(ctypes.byref(p), size)
        if rc == OUT_OF_MEMORY:
            self.empty_cache()
            self.retries += 1
            rc = api.cudaMalloc(ctypes.byref(p), size)
        if rc == OUT_OF_MEMORY:
            raise MemoryError(f"CUDA out of memory allocating {size} bytes")
        check(rc, "cudaMalloc")
        self.sizes[p.value] = size
        return p.value

    def free(self, p):
        self.cache.setdefault(self.sizes[p], []).append(p)

    def empty_cache(self):
        for blocks in self.cache.values():
            for p in blocks:
                check(api.cudaFree(p), "cudaFree")
                del self.sizes[p]
        self.cache = {}


class Tensor:
    def __init__(self, alloc, size, seed):
        self.size, self.seed = size, seed
        self.ptr = alloc.malloc(size)
        data = self.pattern()
        check(rt.cudaMemcpy(self.ptr, data, size, H2D), "cudaMemcpy H2D")

    def pattern(self):
        unit = bytes((self.seed * 31 + i * 7) & 0xFF for i in range(251))
        return (unit * (self.size // len(unit) + 1))[: self.size]

    def intact(self):
        buf = ctypes.create_string_buffer(self.size)
        check(rt.cudaMemcpy(buf, self.ptr, self.size, D2H), "cudaMemcpy D2H")
        return buf.raw == self.pattern()


def main():
    alloc = CachingAllocator()
    seed = iter(range(1, 1 << 30))
    activations = [Tensor(alloc, 4 * MIB, next(seed)) for _ in range(10)]
    weights = [Tensor(alloc, 4 * MIB, next(seed)) for _ in range(12)]
    for t in activations:
        alloc.free(t.ptr)
    for step in range(5):
        acts = [Tensor(alloc, 5 * MIB + 1000 * k, next(seed)) for k in range(8)]
        acts += [Tensor(alloc, 700 * 1024 + k, next(seed)) for k in range(4)]
        bad = [t for t in weights + acts if not t.intact()]
        if bad:
            sys.exit(f"step {step}: {len(bad)} tensors corrupt")
        for t in reversed(acts):
            alloc.free(t.ptr)
        print("step", step, alloc.retries, flush=True)
    alloc.empty_cache()
    api.cudaDeviceSynchronize()
    if not all(t.intact() for t in weights):
        sys.exit("weights corrupt at the end")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(api.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "cudaMemGetInfo")
    print("done", alloc.retries, sum(t.size for t in weights), free.value, total.value, flush=True)


main()
