/*
 * crossdestroy KIND: two blocks of device 0 freed in stream order on a
 * stream of device 1 held by a host function, the stream destroyed right
 * after the second free (its work still runs): with cudaStreamDestroy (rt)
 * or cuStreamDestroy_v2 (drv); reset: not destroyed, but gone with device
 * 1's reset once let go; default: freed on stream 0 while device 1 is
 * current (so on device 1's held default stream), which its reset ends;
 * created: freed on stream 0 while a context created on device 1 is
 * current (so on that context's held default stream), which is then
 * destroyed. Prints, in order:
 *   "A RC"  two cudaMalloc of 30 MiB on device 0
 *   "F RC"  both freed with cuMemFreeAsync on the held stream, then the
 *           stream destroyed
 *   "H RC"  the stream let go, device 1 synchronized (reset, default:
 *           reset; created: the context destroyed)
 *   "C RC"  cudaMalloc of 60 MiB on device 0
 * RC is the call's error code. Exits 2 if it cannot begin.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#include "gate.h"

#define MIB (1ull << 20)


int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "rt") && strcmp(argv[1], "drv") && strcmp(argv[1], "reset") &&
                      strcmp(argv[1], "default") && strcmp(argv[1], "created"))) {
        fprintf(stderr, "usage: crossdestroy rt|drv|reset|default|created\n");
        return 2;
    }
    int on_default = strcmp(argv[1], "default") == 0, created = strcmp(argv[1], "created") == 0;
    cudaStream_t s1 = 0; /* default, created: the default stream */
    CUcontext ctx = NULL, popped = NULL;
    int rc = make_gate() == 0 ? cudaSetDevice(1) : cudaErrorUnknown;
    if (rc == cudaSuccess && created) {
        if ((rc = cuCtxCreate_v2(&ctx, 0, 1)) == CUDA_SUCCESS &&
            (rc = cuLaunchHostFunc(NULL, wait_gate, NULL)) == CUDA_SUCCESS)
            rc = cuCtxPopCurrent_v2(&popped);
    } else if (rc == cudaSuccess) {
        if (on_default || (rc = cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking)) == cudaSuccess)
            rc = cudaLaunchHostFunc(s1, wait_gate, NULL);
    }
    if (rc != cudaSuccess || cudaSetDevice(0) != cudaSuccess) {
        fprintf(stderr, "crossdestroy: cannot make a held stream on device 1\n");
        return 2;
    }

    void *a = NULL, *b = NULL, *c = NULL;
    rc = cudaMalloc(&a, 30 * MIB);
    if (rc == cudaSuccess)
        rc = cudaMalloc(&b, 30 * MIB);
    printf("A %d\n", rc);

    rc = created ? cuCtxPushCurrent_v2(ctx) : cudaSetDevice(1);
    if (rc == cudaSuccess)
        rc = cuMemFreeAsync((CUdeviceptr)(uintptr_t)a, (CUstream)s1);
    if (rc == cudaSuccess)
        rc = cuMemFreeAsync((CUdeviceptr)(uintptr_t)b, (CUstream)s1);
    if (rc == cudaSuccess && strcmp(argv[1], "drv") == 0)
        rc = cuStreamDestroy_v2((CUstream)s1);
    else if (rc == cudaSuccess && strcmp(argv[1], "rt") == 0)
        rc = cudaStreamDestroy(s1);
    if (rc == cudaSuccess && created)
        rc = cuCtxPopCurrent_v2(&popped);
    if (rc == cudaSuccess)
        rc = cudaSetDevice(0);
    printf("F %d\n", rc);

    rc = open_gate() == 0 ? cudaSetDevice(1) : cudaErrorUnknown;
    if (rc == cudaSuccess && created)
        rc = cuCtxDestroy_v2(ctx);
    else if (rc == cudaSuccess)
        rc = strcmp(argv[1], "rt") && strcmp(argv[1], "drv") ? cudaDeviceReset() : cudaDeviceSynchronize();
    if (rc == cudaSuccess)
        rc = cudaSetDevice(0);
    printf("H %d\n", rc);

    printf("C %d\n", cudaMalloc(&c, 60 * MIB));
    return 0;
}
