# ctypes_cudart.py SIZE...: allocates each SIZE (bytes) with cudaMalloc
# found on Python's own handle of the runtime: "m RC" per allocation.
import ctypes
import sys

rt = ctypes.CDLL("libcudart.so.12")
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
for size in sys.argv[1:]:
    p = ctypes.c_void_p()
    print("m", rt.cudaMalloc(ctypes.byref(p), int(size)), flush=True)
