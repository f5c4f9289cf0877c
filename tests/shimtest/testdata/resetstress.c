/* resetstress MODE THREADS MS SEED: THREADS threads allocate and free for
 * MS milliseconds while another resets device 0's primary context now and
 * then (MODE contexts: cudaDeviceReset and cuDevicePrimaryCtxReset_v2 in
 * turn; runtime: cudaDeviceReset; driver: cuDevicePrimaryCtxReset_v2).
 *   runtime   cudaMallocArray, cudaMalloc and cudaMallocFromPoolAsync (from
 *             a pool the program created) in the primary context, freed
 *             with cudaFreeArray, cudaFree and cudaFreeAsync
 *   driver    cuArrayCreate_v2 and cuMemAlloc_v2 in the primary context,
 *             freed with cuArrayDestroy and cuMemFree_v2
 *   contexts  each thread in a context of its own: cuMemAlloc_v2 and
 *             cudaMalloc, freed with cuMemFree_v2 and cudaFree; now and
 *             then it destroys its context with what it holds and creates
 *             another (which CUDA may give a handle another thread's
 *             context had)
 * A thread frees only what no reset may have destroyed (freeing that could
 * free another thread's memory at the same address); the rest is left to
 * the resets. At the end, prints
 *   failed N              (calls that should not have failed)
 *   info RC FREE TOTAL    (cudaMemGetInfo) */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#define HOLD 8
#define THREADS_MAX 16

static const char *mode;
static unsigned seed0;
static atomic_int stop;
static atomic_long failed;
static atomic_long resets; /* odd while a reset is under way */
static cudaMemPool_t pool;

static void *resetter(void *arg)
{
    (void)arg;
    unsigned seed = seed0 * 7 + 3;
    for (int n = 0; !atomic_load(&stop); n++) {
        usleep(200 + rand_r(&seed) % 2000);
        int driver = !strcmp(mode, "driver") || (!strcmp(mode, "contexts") && n % 2);
        atomic_fetch_add(&resets, 1);
        if ((driver ? (int)cuDevicePrimaryCtxReset_v2(0) : (int)cudaDeviceReset()) != 0)
            atomic_fetch_add(&failed, 1);
        atomic_fetch_add(&resets, 1);
    }
    return NULL;
}

/* One kept object: its kind (0: none) and what no reset may have touched since. */
struct held {
    int kind;
    long born;
    void *p;
};

/* Keeps the reset count read before making h's object; whether no reset
 * ran or began meanwhile, so that it is safe to free while the count stays. */
static int kept(long before, struct held *h)
{
    h->born = before;
    return before % 2 == 0 && atomic_load(&resets) == before;
}

static void runtime_op(unsigned *seed, struct held *h)
{
    if (h->kind) {
        if (atomic_load(&resets) == h->born) /* else a reset destroyed it */
            h->kind == 1   ? (void)cudaFreeArray((cudaArray_t)h->p)
            : h->kind == 2 ? (void)cudaFree(h->p)
                           : (void)cudaFreeAsync(h->p, 0);
        h->kind = 0;
        return;
    }
    struct cudaChannelFormatDesc desc = {32, 0, 0, 0, cudaChannelFormatKindFloat};
    int kind = 1 + rand_r(seed) % 3;
    size_t size = 1 + rand_r(seed) % (1 << 18);
    long before = atomic_load(&resets);
    cudaError_t rc = kind == 1   ? cudaMallocArray((cudaArray_t *)&h->p, &desc, 256 + size % 256, 64, 0)
                     : kind == 2 ? cudaMalloc(&h->p, size)
                                 : cudaMallocFromPoolAsync(&h->p, size, pool, 0);
    if (rc == cudaSuccess && kept(before, h))
        h->kind = kind;
}

static void driver_op(unsigned *seed, struct held *h)
{
    if (h->kind) {
        if (atomic_load(&resets) == h->born) /* else a reset destroyed it */
            h->kind == 1 ? (void)cuArrayDestroy((CUarray)h->p) : (void)cuMemFree_v2((CUdeviceptr)(uintptr_t)h->p);
        h->kind = 0;
        return;
    }
    int kind = 1 + rand_r(seed) % 2;
    size_t size = 1 + rand_r(seed) % (1 << 18);
    CUDA_ARRAY_DESCRIPTOR desc = {256 + size % 256, 64, CU_AD_FORMAT_FLOAT, 1};
    CUdeviceptr p = 0;
    long before = atomic_load(&resets);
    CUresult rc = kind == 1 ? cuArrayCreate_v2((CUarray *)&h->p, &desc) : cuMemAlloc_v2(&p, size);
    if (kind == 2)
        h->p = (void *)(uintptr_t)p;
    if (rc == CUDA_SUCCESS && kept(before, h))
        h->kind = kind;
}

/* An allocation in the thread's created context, or its free: no reset touches them. */
static void context_op(unsigned *seed, struct held *h)
{
    if (h->kind == 1 && cuMemFree_v2((CUdeviceptr)(uintptr_t)h->p) != CUDA_SUCCESS)
        atomic_fetch_add(&failed, 1);
    else if (h->kind == 2 && cudaFree(h->p) != cudaSuccess)
        atomic_fetch_add(&failed, 1);
    if (h->kind) {
        h->kind = 0;
        return;
    }
    size_t size = 1 + rand_r(seed) % (1 << 18);
    CUdeviceptr p = 0;
    if (rand_r(seed) % 2 && cuMemAlloc_v2(&p, size) == CUDA_SUCCESS)
        h->p = (void *)(uintptr_t)p, h->kind = 1;
    else if (!h->kind && cudaMalloc(&h->p, size) == cudaSuccess)
        h->kind = 2;
}

static void *worker(void *arg)
{
    unsigned seed = seed0 + (unsigned)(size_t)arg * 2654435761u;
    struct held held[HOLD];
    CUcontext ctx = NULL, primary = NULL;
    int contexts = !strcmp(mode, "contexts");
    memset(held, 0, sizeof held);
    if (!strcmp(mode, "driver")) {
        if (cuDevicePrimaryCtxRetain(&primary, 0) != CUDA_SUCCESS || cuCtxSetCurrent(primary) != CUDA_SUCCESS)
            atomic_fetch_add(&failed, 1);
    } else if (cudaSetDevice(0) != cudaSuccess || (contexts && cuCtxCreate_v2(&ctx, 0, 0) != CUDA_SUCCESS)) {
        atomic_fetch_add(&failed, 1);
    }
    while (!atomic_load(&stop)) {
        struct held *h = &held[rand_r(&seed) % HOLD];
        if (!contexts) {
            (primary ? driver_op : runtime_op)(&seed, h);
        } else if (rand_r(&seed) % 64 == 0) {
            /* destroyed with what it holds, which it gives back */
            if (cuCtxDestroy_v2(ctx) != CUDA_SUCCESS || cuCtxCreate_v2(&ctx, 0, 0) != CUDA_SUCCESS)
                atomic_fetch_add(&failed, 1);
            memset(held, 0, sizeof held);
        } else {
            context_op(&seed, h);
        }
    }
    for (int k = 0; k < HOLD; k++)
        if (held[k].kind)
            (contexts ? context_op : primary ? driver_op : runtime_op)(&seed, &held[k]);
    if (contexts && cuCtxDestroy_v2(ctx) != CUDA_SUCCESS)
        atomic_fetch_add(&failed, 1);
    if (primary)
        cuDevicePrimaryCtxRelease_v2(0);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5)
        return 2;
    mode = argv[1];
    int n = atoi(argv[2]), ms = atoi(argv[3]);
    seed0 = (unsigned)atoi(argv[4]);
    struct cudaMemPoolProps props = {0};
    props.allocType = 1;     /* pinned */
    props.location.type = 1; /* device */
    if (n < 1 || n > THREADS_MAX || cudaSetDevice(0) != cudaSuccess || cudaFree(0) != cudaSuccess ||
        cudaMemPoolCreate(&pool, &props) != cudaSuccess)
        return 2;
    pthread_t t[THREADS_MAX + 1];
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, worker, (void *)(size_t)i);
    pthread_create(&t[n], NULL, resetter, NULL);
    usleep(ms * 1000);
    atomic_store(&stop, 1);
    for (int i = 0; i <= n; i++)
        pthread_join(t[i], NULL);
    cudaDeviceSynchronize();
    size_t free = 0, total = 0;
    cudaError_t rc = cudaMemGetInfo(&free, &total);
    printf("failed %ld\ninfo %d %zu %zu\n", atomic_load(&failed), rc, free, total);
    return 0;
}
