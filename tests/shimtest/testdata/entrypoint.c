/*
 * entrypoint: allocates with cuMemAlloc as the runtime's
 * cudaGetDriverEntryPoint ("d") or cudaGetDriverEntryPointByVersion ("v",
 * CUDA 12.0) hands it out, SIZE MiB at a time, for each argument:
 *   "d RC NAME" / "v RC NAME", NAME the function's symbol and its file's base
 *   name, RC cuMemAlloc's answer (or the lookup's, when it fails).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);

int main(int argc, char **argv)
{
    void *p;
    if (argc < 2 || cudaMalloc(&p, 1) != cudaSuccess || cudaFree(p) != cudaSuccess)
        return 2; /* the primary context current */
    size_t size = (size_t)atol(argv[1]) << 20;
    for (int i = 2; i < argc; i++) {
        void *fn = NULL;
        enum cudaDriverEntryPointQueryResult status;
        cudaError_t err = argv[i][0] == 'd'
                              ? cudaGetDriverEntryPoint("cuMemAlloc", &fn, cudaEnableDefault, &status)
                              : cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000,
                                                                 cudaEnableDefault, &status);
        if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || !fn) {
            printf("%c %d none\n", argv[i][0], err);
            continue;
        }
        Dl_info info;
        const char *file = dladdr(fn, &info) && info.dli_fname ? info.dli_fname : "?";
        const char *base = strrchr(file, '/');
        CUdeviceptr d;
        printf("%c %d %s@%s\n", argv[i][0], ((alloc_fn)fn)(&d, size),
               info.dli_sname ? info.dli_sname : "?", base ? base + 1 : file);
    }
    return 0;
}
