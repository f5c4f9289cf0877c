/*
 * handles: allocates through functions found with dlsym on the program's
 * own RTLD_LOCAL handles of the runtime and the driver, as a static runtime,
 * Python's ctypes or a driver loader do.
 *
 *   r SIZE   cudaMalloc from dlsym(libcudart)                 -> "r RC"
 *   m SIZE   cuMemAlloc_v2 from dlsym(libcuda)                -> "m RC"
 *   g SIZE   cuMemAlloc from cuGetProcAddress from dlsym(libcuda) -> "g RC"
 *   W PATH   dlopen (RTLD_LOCAL) of a library that links libcuda -> "W 0"
 *   w SIZE   cuMemAlloc_v2 from dlsym on that library's handle, which finds
 *            the driver's among its dependencies -> "w RC"
 * SIZE is in MiB. Nothing is freed.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <spillway/cuda.h>

static void *need(void *h, const char *name)
{
    void *f = dlsym(h, name);
    if (!f) {
        fprintf(stderr, "handles: no %s: %s\n", name, dlerror());
        exit(2);
    }
    return f;
}

int main(int argc, char **argv)
{
    void *rt = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!rt || !drv) {
        fprintf(stderr, "handles: %s\n", dlerror());
        return 2;
    }
    int (*cuda_malloc)(void **, size_t) = (int (*)(void **, size_t))need(rt, "cudaMalloc");
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))need(drv, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))need(drv, "cuDevicePrimaryCtxRetain");
    CUresult (*set_current)(CUcontext) = (CUresult(*)(CUcontext))need(drv, "cuCtxSetCurrent");
    CUresult (*mem_alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))need(drv, "cuMemAlloc_v2");
    CUresult (*get_proc)(const char *, void **, int, cuuint64_t) =
        (CUresult(*)(const char *, void **, int, cuuint64_t))need(drv, "cuGetProcAddress");
    CUcontext ctx;
    if (init(0) != CUDA_SUCCESS || retain(&ctx, 0) != CUDA_SUCCESS || set_current(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "handles: no primary context\n");
        return 2;
    }
    void *looked_up = NULL;
    if (get_proc("cuMemAlloc", &looked_up, 12000, CU_GET_PROC_ADDRESS_DEFAULT) != CUDA_SUCCESS) {
        fprintf(stderr, "handles: no cuMemAlloc from cuGetProcAddress\n");
        return 2;
    }
    void *dependent = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        size_t size = (size_t)atol(argv[i + 1]) << 20;
        void *p = NULL;
        CUdeviceptr d = 0;
        switch (argv[i][0]) {
        case 'r':
            printf("r %d\n", cuda_malloc(&p, size));
            break;
        case 'm':
            printf("m %d\n", mem_alloc(&d, size));
            break;
        case 'g':
            printf("g %d\n", ((CUresult(*)(CUdeviceptr *, size_t))looked_up)(&d, size));
            break;
        case 'W':
            if (!(dependent = dlopen(argv[i + 1], RTLD_NOW | RTLD_LOCAL))) {
                fprintf(stderr, "handles: %s\n", dlerror());
                return 2;
            }
            printf("W 0\n");
            break;
        case 'w':
            printf("w %d\n", ((CUresult(*)(CUdeviceptr *, size_t))need(dependent, "cuMemAlloc_v2"))(&d, size));
            break;
        default:
            return 2;
        }
    }
    return 0;
}
