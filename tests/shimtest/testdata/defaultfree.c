/*
 * defaultfree KIND: memory of device 0 freed in stream order on a default
 * stream while device 1 is current, which CUDA orders on device 1's default
 * stream of that name. That stream is held back by a host function until
 * step H; work queued on it before the free (a memset of the block, through
 * peer access) runs only then. KIND is how the block is freed: rt
 * (cudaFreeAsync on stream 0), legacy (cudaStreamLegacy), perthread
 * (cudaStreamPerThread), drv (cuMemFreeAsync on stream 0) or drvpt
 * (cuMemFreeAsync_ptsz on stream 0, the per-thread stream). Prints, in order:
 *   "A RC ADDR"      cudaMalloc of SIZE on device 0
 *   "F RC"           a memset of A's first 4 KiB to 0xAA queued on device
 *                    1's held default stream, then A freed on that stream
 *   "Y RC"           cudaDeviceSynchronize on device 0
 *   "B RC ADDR SAME" cudaMalloc of 1 MiB on device 0; SAME: 1 if at A's address
 *   "P RC"           B's first 4 KiB written with 0x55
 *   "H RC"           the stream let go, device 1 synchronized
 *   "V RC WRONG"     B's first 4 KiB read back; WRONG: bytes that are not 0x55
 *   "C RC"           cudaMalloc of SIZE on device 0
 * RC is the call's error code. SIZE: the second argument, in MiB. Exits 2
 * if it cannot begin.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#include "heldfree.h"


/* The default stream KIND frees on, as the runtime names it. */
static cudaStream_t kind_stream(const char *kind)
{
    if (strcmp(kind, "legacy") == 0)
        return cudaStreamLegacy;
    if (strcmp(kind, "perthread") == 0 || strcmp(kind, "drvpt") == 0)
        return cudaStreamPerThread;
    return 0;
}

static int free_async(const char *kind, void *p)
{
    if (strcmp(kind, "drv") == 0)
        return cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, 0);
    if (strcmp(kind, "drvpt") == 0)
        return cuMemFreeAsync_ptsz((CUdeviceptr)(uintptr_t)p, 0);
    return cudaFreeAsync(p, kind_stream(kind));
}

int main(int argc, char **argv)
{
    const char *kinds[] = {"rt", "legacy", "perthread", "drv", "drvpt"};
    int known = 0;
    for (size_t k = 0; argc == 3 && k < sizeof kinds / sizeof kinds[0]; k++)
        known |= strcmp(argv[1], kinds[k]) == 0;
    if (!known) {
        fprintf(stderr, "usage: defaultfree rt|legacy|perthread|drv|drvpt SIZE_MIB\n");
        return 2;
    }
    size_t size = strtoull(argv[2], NULL, 10) * MIB;
    cudaStream_t s = kind_stream(argv[1]);
    if (make_gate() != 0 || cudaSetDevice(0) != cudaSuccess) {
        fprintf(stderr, "defaultfree: cannot begin\n");
        return 2;
    }

    void *a = NULL;
    int rc = cudaMalloc(&a, size);
    printf("A %d %lu\n", rc, (unsigned long)(uintptr_t)a);

    rc = cudaSetDevice(1);
    if (rc == cudaSuccess)
        rc = cudaLaunchHostFunc(s, wait_gate, NULL);
    if (rc == cudaSuccess)
        rc = cudaMemsetAsync(a, 0xAA, CHUNK, s);
    if (rc == cudaSuccess)
        rc = free_async(argv[1], a);
    if (rc == cudaSuccess)
        rc = cudaSetDevice(0);
    printf("F %d\n", rc);

    reuse_after_held_free(a, size);
    return 0;
}
