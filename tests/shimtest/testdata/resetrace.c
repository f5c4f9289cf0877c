/* resetrace MODE: a reset of the primary context by another thread falls
 * between a real call on memory from a pool the program created and the
 * shim's record of it. simcuda's hold (export.h) starts the reset there and
 * waits for it, up to half a second (the shim may hold it off until the
 * record is made). MODE:
 *   alloc  between cudaMallocFromPoolAsync's real allocation and its record:
 *          at the allocation's entry a hook arms a second one on the next
 *          cuCtxGetCurrent, which the shim makes after the real call to
 *          find the allocation's context (a created context exists, so it
 *          asks); the reset destroys the allocation, which is freed after
 *   free   at the entry of the real free of cudaFreeAsync
 * Prints
 *   alloc RC
 *   free RC
 *   reset RC
 *   info RC FREE TOTAL   (cudaMemGetInfo once the reset is over) */
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#include "export.h"
#include "racer.h"

static const struct simcuda_export_table *table;
static pthread_t resetter;
static int reset_rc = -1, started;
static sem_t reset_done;

static void *reset(void *arg)
{
    (void)arg;
    reset_rc = cudaDeviceReset();
    sem_post(&reset_done);
    return NULL;
}

/* Another thread resets the device; this one waits for it a while. */
static void reset_now(void)
{
    started = race(&resetter, reset, &reset_done);
}

/* At the real allocation's entry: the next cuCtxGetCurrent follows it. */
static void allocating(void)
{
    table->hold("cuCtxGetCurrent", reset_now);
}

int main(int argc, char **argv)
{
    static const CUuuid table_id = SIMCUDA_EXPORT_TABLE_ID;
    CUcontext mine = NULL, popped = NULL;
    cudaMemPool_t pool;
    struct cudaMemPoolProps props = {0};
    props.allocType = 1;     /* pinned */
    props.location.type = 1; /* device */
    props.location.id = 0;
    if (argc != 2 || sem_init(&reset_done, 0, 0) != 0 || cudaSetDevice(0) != cudaSuccess ||
        cudaFree(0) != cudaSuccess || cuCtxCreate_v2(&mine, 0, 0) != CUDA_SUCCESS ||
        cuCtxPopCurrent_v2(&popped) != CUDA_SUCCESS || cudaMemPoolCreate(&pool, &props) != cudaSuccess ||
        cuGetExportTable((const void **)&table, &table_id) != CUDA_SUCCESS || table->size < sizeof *table) {
        printf("setup failed\n");
        return 1;
    }
    int alloc = strcmp(argv[1], "alloc") == 0;
    void *p = NULL;
    if (alloc)
        table->hold("cuMemAllocFromPoolAsync", allocating);
    int rc = cudaMallocFromPoolAsync(&p, 1 << 20, pool, 0);
    printf("alloc %d\n", rc);
    if (!alloc)
        table->hold("cuMemFreeAsync", reset_now);
    printf("free %d\n", rc == cudaSuccess ? cudaFreeAsync(p, 0) : -1);
    if (started)
        pthread_join(resetter, NULL);
    printf("reset %d\n", reset_rc);
    cudaDeviceSynchronize();
    size_t free = 0, total = 0;
    rc = cudaMemGetInfo(&free, &total);
    printf("info %d %zu %zu\n", rc, free, total);
    return 0;
}
