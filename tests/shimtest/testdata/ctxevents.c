/*
 * ctxevents KIND: a block of device 0 freed in stream order on a held
 * stream of a context created on device 1 (a stream the device's own
 * synchronization does not cover), then that context destroyed once the
 * stream is let go: the destruction destroys the stream and every event
 * made in the context. The program then makes events until the driver
 * hands out again the handles of destroyed ones, as CUDA reuses their
 * memory, and allocates on device 0 what fits under the quota only with
 * the freed block given back. Its own events must stay valid. KIND: reset
 * (the stream is one of device 1's primary context, which cudaDeviceReset
 * ends) or created. Prints, in order:
 *   "A RC"  cudaMalloc of 40 MiB on device 0
 *   "F RC"  freed with cuMemFreeAsync on the held stream
 *   "D RC"  the stream let go and its context destroyed or reset
 *   "C RC"  cudaMalloc of 40 MiB on device 0
 *   "E RC"  the first of the program's events that is not valid, or 0
 * RC is the call's error code. Exits 2 if it cannot begin.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#include "gate.h"

#define MIB (1ull << 20)
#define EVENTS 200

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "reset") && strcmp(argv[1], "created"))) {
        fprintf(stderr, "usage: ctxevents reset|created\n");
        return 2;
    }
    int created = strcmp(argv[1], "created") == 0;
    CUcontext ctx = NULL, popped = NULL;
    CUstream s1 = NULL;
    int rc = make_gate() == 0 ? cudaSetDevice(1) : cudaErrorUnknown;
    if (rc == cudaSuccess && created)
        rc = cuCtxCreate_v2(&ctx, 0, 1);
    if (rc == cudaSuccess)
        rc = cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING);
    if (rc == cudaSuccess)
        rc = cuLaunchHostFunc(s1, wait_gate, NULL);
    if (rc == cudaSuccess && created)
        rc = cuCtxPopCurrent_v2(&popped);
    if (rc != cudaSuccess || cudaSetDevice(0) != cudaSuccess) {
        fprintf(stderr, "ctxevents: cannot make a held stream on device 1\n");
        return 2;
    }

    void *a = NULL, *c = NULL;
    printf("A %d\n", cudaMalloc(&a, 40 * MIB));

    rc = created ? cuCtxPushCurrent_v2(ctx) : cudaSetDevice(1);
    if (rc == cudaSuccess)
        rc = cuMemFreeAsync((CUdeviceptr)(uintptr_t)a, s1);
    if (rc == cudaSuccess && created)
        rc = cuCtxPopCurrent_v2(&popped);
    printf("F %d\n", rc);

    rc = open_gate() == 0 ? cudaSetDevice(1) : cudaErrorUnknown;
    if (rc == cudaSuccess)
        rc = created ? cuCtxDestroy_v2(ctx) : cudaDeviceReset();
    if (rc == cudaSuccess)
        rc = cudaSetDevice(0);
    printf("D %d\n", rc);

    /* Destroyed events are reused once enough are destroyed: make and
     * destroy some, then keep as many. */
    cudaEvent_t events[EVENTS];
    for (int i = 0; i < EVENTS && rc == cudaSuccess; i++)
        if ((rc = cudaEventCreateWithFlags(&events[i], cudaEventDisableTiming)) == cudaSuccess)
            rc = cudaEventDestroy(events[i]);
    for (int i = 0; i < EVENTS && rc == cudaSuccess; i++)
        rc = cudaEventCreateWithFlags(&events[i], cudaEventDisableTiming);
    if (rc != cudaSuccess) {
        fprintf(stderr, "ctxevents: cannot make events: %d\n", rc);
        return 2;
    }

    printf("C %d\n", cudaMalloc(&c, 40 * MIB));
    rc = cudaSuccess;
    for (int i = 0; i < EVENTS && rc == cudaSuccess; i++)
        rc = cudaEventQuery(events[i]);
    printf("E %d\n", rc);
    return 0;
}
