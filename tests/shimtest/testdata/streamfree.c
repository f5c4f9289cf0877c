/*
 * streamfree: allocates 40 MiB with cudaMallocAsync on a stream of its own,
 * frees it with cudaFreeAsync and waits with cudaStreamSynchronize, which
 * the shim does not see; then asks 40 MiB of the device's default memory
 * pool (cudaMallocFromPoolAsync), outside the shim's pool. Prints
 * "async RC" and "frompool RC".
 */
#include <stdio.h>

#include <spillway/cuda_runtime.h>

int main(void)
{
    cudaStream_t s;
    cudaMemPool_t pool;
    void *p = NULL, *q = NULL;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaDeviceGetDefaultMemPool(&pool, 0) != cudaSuccess)
        return 2;
    cudaError_t rc = cudaMallocAsync(&p, 40 << 20, s);
    if (rc == cudaSuccess && (rc = cudaFreeAsync(p, s)) == cudaSuccess)
        rc = cudaStreamSynchronize(s);
    printf("async %d\n", rc);
    rc = cudaMallocFromPoolAsync(&q, 40 << 20, pool, s);
    if (rc == cudaSuccess && (rc = cudaFreeAsync(q, s)) == cudaSuccess)
        rc = cudaStreamSynchronize(s);
    printf("frompool %d\n", rc);
    return 0;
}
