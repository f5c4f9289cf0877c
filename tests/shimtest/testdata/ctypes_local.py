# ctypes_local.py LIB SIZE...: loads LIB with RTLD_LOCAL, as Python loads
# extension modules, and allocates each SIZE through it.
import ctypes
import os
import sys

lib = ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL)
lib.user_malloc.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
print("global", int(hasattr(ctypes.CDLL(None), "cudaGetDevice")))
for size in sys.argv[2:]:
    p = ctypes.c_void_p()
    print("m", lib.user_malloc(int(size), ctypes.byref(p)), flush=True)
