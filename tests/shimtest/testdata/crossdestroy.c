/*
 * crossdestroy KIND: two blocks of device 0 freed in stream order on a
 * stream of device 1 held by a host function, the stream destroyed right
 * after the second free (its work still runs): with cudaStreamDestroy (rt)
 * or cuStreamDestroy_v2 (drv); reset: not destroyed, but gone with device
 * 1's reset once let go. Prints, in order:
 *   "A RC"  two cudaMalloc of 30 MiB on device 0
 *   "F RC"  both freed with cuMemFreeAsync on the held stream, then the
 *           stream destroyed
 *   "H RC"  the stream let go, device 1 synchronized (reset: reset)
 *   "C RC"  cudaMalloc of 60 MiB on device 0
 * RC is the call's error code. Exits 2 if it cannot begin.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#define MIB (1ull << 20)

static int gate[2]; /* the host function holding the stream waits for a byte here */

static void wait_gate(void *arg)
{
    (void)arg;
    char c;
    if (read(gate[0], &c, 1) != 1)
        abort();
}

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "rt") && strcmp(argv[1], "drv") && strcmp(argv[1], "reset"))) {
        fprintf(stderr, "usage: crossdestroy rt|drv|reset\n");
        return 2;
    }
    cudaStream_t s1;
    if (pipe(gate) != 0 || cudaSetDevice(1) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) != cudaSuccess ||
        cudaLaunchHostFunc(s1, wait_gate, NULL) != cudaSuccess || cudaSetDevice(0) != cudaSuccess) {
        fprintf(stderr, "crossdestroy: cannot make a held stream on device 1\n");
        return 2;
    }

    void *a = NULL, *b = NULL, *c = NULL;
    int rc = cudaMalloc(&a, 30 * MIB);
    if (rc == cudaSuccess)
        rc = cudaMalloc(&b, 30 * MIB);
    printf("A %d\n", rc);

    rc = cudaSetDevice(1);
    if (rc == cudaSuccess)
        rc = cuMemFreeAsync((CUdeviceptr)(uintptr_t)a, (CUstream)s1);
    if (rc == cudaSuccess)
        rc = cuMemFreeAsync((CUdeviceptr)(uintptr_t)b, (CUstream)s1);
    if (rc == cudaSuccess && strcmp(argv[1], "drv") == 0)
        rc = cuStreamDestroy_v2((CUstream)s1);
    else if (rc == cudaSuccess && strcmp(argv[1], "rt") == 0)
        rc = cudaStreamDestroy(s1);
    if (rc == cudaSuccess)
        rc = cudaSetDevice(0);
    printf("F %d\n", rc);

    rc = write(gate[1], "x", 1) == 1 ? cudaSetDevice(1) : cudaErrorUnknown;
    if (rc == cudaSuccess)
        rc = strcmp(argv[1], "reset") == 0 ? cudaDeviceReset() : cudaDeviceSynchronize();
    if (rc == cudaSuccess)
        rc = cudaSetDevice(0);
    printf("H %d\n", rc);

    printf("C %d\n", cudaMalloc(&c, 60 * MIB));
    return 0;
}
