/* A library whose constructor allocates device memory, as some CUDA
 * libraries do at load time: it runs before main and before anything else
 * has called CUDA, so it is the shim's first interposed call. */
#include <stdio.h>

#include <spillway/cuda_runtime.h>

void *ctor_block;

__attribute__((constructor)) static void allocate_at_load(void)
{
    cudaError_t rc = cudaMalloc(&ctor_block, 512 << 10);
    printf("ctor %d\n", rc);
    fflush(stdout);
}
