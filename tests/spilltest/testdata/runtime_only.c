/*
 * runtime_only.c: a program that links the CUDA runtime and nothing else,
 * as most do: the runtime opens the driver itself, at its first call. It
 * allocates and frees a few blocks and exits 0 when every call succeeded.
 */
#include <stdio.h>
#include <spillway/cuda_runtime.h>

int main(void)
{
    void *p[4];
    for (int i = 0; i < 4; i++)
        if (cudaMalloc(&p[i], 4 << 20) != cudaSuccess) {
            fprintf(stderr, "cudaMalloc %d failed\n", i);
            return 1;
        }
    for (int i = 0; i < 4; i++)
        if (cudaFree(p[i]) != cudaSuccess) {
            fprintf(stderr, "cudaFree %d failed\n", i);
            return 1;
        }
    return 0;
}
