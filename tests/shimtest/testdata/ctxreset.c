/* ctxreset: another thread resets the primary context (cuDevicePrimaryCtxReset_v2)
 * while cuCtxDestroy_v2 of a created context is under way, once the driver
 * has destroyed it (linked with ctxhook, whose after_ctx_destroy runs then).
 * The created context holds 1 MiB from the device's default memory pool
 * (cuMemAllocAsync), which outlives it and is the primary context's from
 * then on, so the reset destroys it. The destroying thread waits for the
 * reset up to half a second (the shim may hold it off until the destruction
 * is over). Prints
 *   destroy RC
 *   reset RC
 *   info RC FREE TOTAL    (cuMemGetInfo_v2 once both are over) */
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>

#include <spillway/cuda.h>

#include "racer.h"

extern void (*after_ctx_destroy)(void); /* ctxhook's */

static pthread_t resetter;
static int started, reset_rc = -1;
static sem_t reset_done;

static void *reset(void *arg)
{
    (void)arg;
    reset_rc = cuDevicePrimaryCtxReset_v2(0);
    sem_post(&reset_done);
    return NULL;
}

/* Once the driver destroyed the context: another thread resets the primary one. */
static void reset_now(void)
{
    after_ctx_destroy = NULL;
    started = race(&resetter, reset, &reset_done);
}

int main(void)
{
    CUcontext primary, mine;
    CUdeviceptr p;
    size_t free = 0, total = 0;
    if (sem_init(&reset_done, 0, 0) != 0 || cuInit(0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&primary, 0) != CUDA_SUCCESS || cuCtxSetCurrent(primary) != CUDA_SUCCESS ||
        cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS || cuMemFree_v2(p) != CUDA_SUCCESS ||
        cuCtxCreate_v2(&mine, 0, 0) != CUDA_SUCCESS || cuMemAllocAsync(&p, 1 << 20, NULL) != CUDA_SUCCESS ||
        cuStreamSynchronize(NULL) != CUDA_SUCCESS) {
        printf("setup failed\n");
        return 1;
    }
    after_ctx_destroy = reset_now;
    printf("destroy %d\n", cuCtxDestroy_v2(mine));
    if (started)
        pthread_join(resetter, NULL);
    printf("reset %d\n", reset_rc);
    CUresult rc = cuDevicePrimaryCtxRetain(&primary, 0);
    if (rc == CUDA_SUCCESS)
        rc = cuCtxSetCurrent(primary);
    if (rc == CUDA_SUCCESS)
        rc = cuMemGetInfo_v2(&free, &total);
    printf("info %d %zu %zu\n", rc, free, total);
    return 0;
}
