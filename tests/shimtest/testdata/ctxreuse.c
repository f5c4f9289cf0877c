/* ctxreuse: another thread creates a context while cuCtxDestroy_v2 of a
 * created context is under way, once the driver has destroyed it (linked
 * with ctxhook, whose after_ctx_destroy runs then), and is handed the
 * destroyed context's handle: the context to destroy is the oldest of 65
 * destroyed ones, which simcuda reuses first. That thread allocates 2 MiB
 * in the new context and keeps them; the destroying thread waits for it up
 * to half a second (the shim may hold its creation off until the
 * destruction is over). Prints
 *   destroy RC
 *   create RC REUSED      (REUSED: 1 if the new context got the old handle)
 *   alloc RC
 *   info RC FREE TOTAL    (cuMemGetInfo_v2 with the 2 MiB held)
 *   last RC               (cuCtxDestroy_v2 of the new context)
 *   info RC FREE TOTAL    (with nothing held) */
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>

#include <spillway/cuda.h>

#include "racer.h"

extern void (*after_ctx_destroy)(void); /* ctxhook's */

static CUcontext first, second;
static pthread_t creator;
static int started, create_rc = -1, alloc_rc = -1;
static sem_t created;

static void *create(void *arg)
{
    (void)arg;
    CUdeviceptr p;
    create_rc = cuCtxCreate_v2(&second, 0, 0);
    if (create_rc == CUDA_SUCCESS)
        alloc_rc = cuMemAlloc_v2(&p, 2 << 20);
    sem_post(&created);
    return NULL;
}

/* Once the driver destroyed the context: another thread creates one. */
static void create_now(void)
{
    after_ctx_destroy = NULL;
    started = race(&creator, create, &created);
}

static void info(void)
{
    size_t free = 0, total = 0;
    CUresult rc = cuMemGetInfo_v2(&free, &total);
    printf("info %d %zu %zu\n", rc, free, total);
}

int main(void)
{
    CUcontext primary, c, popped;
    CUdeviceptr p;
    if (sem_init(&created, 0, 0) != 0 || cuInit(0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&primary, 0) != CUDA_SUCCESS || cuCtxSetCurrent(primary) != CUDA_SUCCESS ||
        cuCtxCreate_v2(&first, 0, 0) != CUDA_SUCCESS || cuMemAlloc_v2(&p, 1 << 20) != CUDA_SUCCESS ||
        cuCtxPopCurrent_v2(&popped) != CUDA_SUCCESS) {
        printf("setup failed\n");
        return 1;
    }
    for (int i = 0; i < 64; i++)
        if (cuCtxCreate_v2(&c, 0, 0) != CUDA_SUCCESS || cuCtxDestroy_v2(c) != CUDA_SUCCESS) {
            printf("setup failed\n");
            return 1;
        }
    after_ctx_destroy = create_now;
    printf("destroy %d\n", cuCtxDestroy_v2(first));
    if (started)
        pthread_join(creator, NULL);
    printf("create %d %d\nalloc %d\n", create_rc, create_rc == CUDA_SUCCESS && second == first, alloc_rc);
    info();
    printf("last %d\n", create_rc == CUDA_SUCCESS ? cuCtxDestroy_v2(second) : -1);
    info();
    return 0;
}
