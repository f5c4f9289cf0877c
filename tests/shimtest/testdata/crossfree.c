/*
 * crossfree KIND: memory of device 0 freed in stream order on a stream of
 * device 1, as CUDA allows: the free happens when that stream reaches it.
 * The stream is held back by a host function until step H; work queued on
 * it before the free (a memset of the block, through peer access) runs only
 * then. KIND is how the block is freed: cudaFreeAsync (rt), cuMemFreeAsync
 * (drv) or cuMemFreeAsync_ptsz (drvpt); rtdestroy: cudaFreeAsync, then the
 * stream destroyed at once (its work still runs). Prints, in order:
 *   "A RC ADDR"      cudaMalloc of SIZE on device 0
 *   "F RC"           a memset of A's first 4 KiB to 0xAA queued on the
 *                    held stream of device 1, then A freed on that stream
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


static int free_async(const char *kind, void *p, cudaStream_t s)
{
    if (strcmp(kind, "drv") == 0)
        return cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, (CUstream)s);
    if (strcmp(kind, "drvpt") == 0)
        return cuMemFreeAsync_ptsz((CUdeviceptr)(uintptr_t)p, (CUstream)s);
    return cudaFreeAsync(p, s);
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "rt") && strcmp(argv[1], "drv") && strcmp(argv[1], "drvpt") &&
                      strcmp(argv[1], "rtdestroy"))) {
        fprintf(stderr, "usage: crossfree rt|drv|drvpt|rtdestroy SIZE_MIB\n");
        return 2;
    }
    size_t size = strtoull(argv[2], NULL, 10) * MIB;
    cudaStream_t s1;
    if (make_gate() != 0 || cudaSetDevice(1) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) != cudaSuccess ||
        cudaLaunchHostFunc(s1, wait_gate, NULL) != cudaSuccess || cudaSetDevice(0) != cudaSuccess) {
        fprintf(stderr, "crossfree: cannot make a held stream on device 1\n");
        return 2;
    }

    void *a = NULL;
    int rc = cudaMalloc(&a, size);
    printf("A %d %lu\n", rc, (unsigned long)(uintptr_t)a);

    rc = cudaSetDevice(1);
    if (rc == cudaSuccess)
        rc = cudaMemsetAsync(a, 0xAA, CHUNK, s1);
    if (rc == cudaSuccess)
        rc = free_async(argv[1], a, s1);
    if (rc == cudaSuccess && strcmp(argv[1], "rtdestroy") == 0)
        rc = cudaStreamDestroy(s1);
    if (rc == cudaSuccess)
        rc = cudaSetDevice(0);
    printf("F %d\n", rc);

    reuse_after_held_free(a, size);
    return 0;
}
