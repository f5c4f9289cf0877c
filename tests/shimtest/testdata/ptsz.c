/*
 * ptsz: a program built as with --default-stream per-thread, so that
 * its stream-ordered calls are the runtime's _ptsz/_ptds entry points and
 * stream 0 is the calling thread's default stream. One line each:
 *
 *   A RC              cudaMallocAsync of 16 MiB on stream 0 (the quota is 64 MiB)
 *   B RC              cudaMallocAsync of 32 MiB on stream 0
 *   I RC FREE         cudaMemGetInfo
 *   R RC              the first block filled with 0x5a, freed on stream 0, and
 *                     16 MiB allocated again there and filled with 0x11
 *   V RC WRONG        4 KiB of that block read back with cudaMemcpy: bytes not 0x11
 *   T RC              cudaMallocAsync of 16 MiB in another thread
 *   F RC              every block freed on stream 0, then cudaStreamSynchronize
 *   E RC FREE         cudaMemGetInfo at the end
 */
#define CUDA_API_PER_THREAD_DEFAULT_STREAM
#include <pthread.h>
#include <stdio.h>

#include <spillway/cuda_runtime.h>

#define MiB ((size_t)1 << 20)

static void *other_thread(void *arg)
{
    void *p = NULL;
    cudaError_t rc = cudaMallocAsync(&p, 16 * MiB, 0);
    printf("T %d\n", rc);
    if (rc == cudaSuccess) {
        cudaFreeAsync(p, 0);
        cudaStreamSynchronize(0);
    }
    (void)arg;
    return NULL;
}

int main(void)
{
    void *blocks[4] = {NULL};
    size_t free_, total;
    for (int i = 0; i < 3; i++)
        printf("A %d\n", cudaMallocAsync(&blocks[i], 16 * MiB, 0));
    void *big = NULL;
    printf("B %d\n", cudaMallocAsync(&big, 32 * MiB, 0));
    cudaError_t rc = cudaMemGetInfo(&free_, &total);
    printf("I %d %zu\n", rc, free_);

    rc = cudaMemsetAsync(blocks[0], 0x5a, 16 * MiB, 0);
    if (rc == cudaSuccess)
        rc = cudaFreeAsync(blocks[0], 0);
    if (rc == cudaSuccess)
        rc = cudaMallocAsync(&blocks[0], 16 * MiB, 0);
    if (rc == cudaSuccess)
        rc = cudaMemsetAsync(blocks[0], 0x11, 16 * MiB, 0);
    printf("R %d\n", rc);
    static unsigned char host[4096];
    rc = cudaMemcpy(host, blocks[0], sizeof host, cudaMemcpyDeviceToHost);
    int wrong = 0;
    for (size_t i = 0; i < sizeof host; i++)
        wrong += host[i] != 0x11;
    printf("V %d %d\n", rc, wrong);

    printf("A %d\n", cudaMallocAsync(&blocks[3], 16 * MiB, 0));
    pthread_t t;
    if (pthread_create(&t, NULL, other_thread, NULL) != 0 || pthread_join(t, NULL) != 0)
        return 1;

    rc = cudaSuccess;
    for (int i = 0; i < 4; i++)
        if (blocks[i] && rc == cudaSuccess)
            rc = cudaFreeAsync(blocks[i], 0);
    if (rc == cudaSuccess)
        rc = cudaStreamSynchronize(0);
    printf("F %d\n", rc);
    rc = cudaMemGetInfo(&free_, &total);
    printf("E %d %zu\n", rc, free_);
    return 0;
}
