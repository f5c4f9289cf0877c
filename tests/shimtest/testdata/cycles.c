/*
 * cycles: repeats one cycle of CUDA calls that leaves nothing behind, N
 * times, so that tests can check a long-running program's state stays
 * bounded. Usage: cycles MODE N. At the end it prints "end FAILURES" (calls
 * that failed; the first is also printed, "fail CALL RC").
 * Every cycle is followed by an event created, recorded, waited for and
 * destroyed (after the cycle, which may reset the device).
 *
 *   stream     cudaStreamCreate, cudaMallocAsync and cudaFreeAsync on it,
 *              cudaStreamDestroy
 *   perthread  a thread allocates and frees on cudaStreamPerThread and exits
 *   ctx        cuCtxCreate_v2, cuMemAlloc_v2/cuMemFree_v2, cuMemAllocAsync/
 *              cuMemFreeAsync on the legacy stream, and one cuMemAlloc_v2
 *              left for cuCtxDestroy_v2 to free; a stream made in the
 *              context, left for cuCtxDestroy_v2 too, on which a block the
 *              primary context allocated is freed (cudaFreeAsync)
 *   foreign    in a context created once: a stream made, a block the primary
 *              context allocated (cudaMalloc) freed on it (cudaFreeAsync),
 *              the stream synchronized and destroyed
 *   otherdev   the same with a stream of device 1 (two devices)
 * foreign and otherdev first allocate 64 MiB and free it, so that the pool
 * serves their blocks from its cache.
 *   reset      cudaMalloc and cudaMallocAsync left allocated, a stream made,
 *              allocated from and freed on (cudaMallocAsync, cudaFreeAsync),
 *              cudaDeviceReset
 *   mempool    cudaMemPoolCreate, cudaMallocFromPoolAsync and cudaFreeAsync,
 *              cudaMemPoolDestroy
 *   vmm        cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess,
 *              cuMemUnmap, cuMemAddressFree, cuMemRelease
 *   host       cudaMallocHost, cudaFreeHost
 *   graph      on a stream made once: a block allocated (cudaMallocAsync), a
 *              capture begun, in which the block is freed and another
 *              allocated and freed, the graph instantiated, launched, waited
 *              for and destroyed with its executable graph
 *   nvml       nvmlInit_v2, the memory and running processes of device 0,
 *              nvmlShutdown
 *   churn      of 64 blocks kept live (sizes from 512 bytes to 24 MiB, drawn
 *              by a fixed generator), one is freed and another allocated,
 *              with cudaFree/cudaMalloc or cudaFreeAsync/cudaMallocAsync on
 *              the legacy stream, as the generator draws
 *   spill      cudaMalloc of 3 MiB twice (more than a quota of 4 MiB holds:
 *              the second spills when oversubscribing), cudaFree of both
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>
#include <spillway/nvml.h>

static int failures;

/* check counts a failed call, printing the first. */
static int check(const char *call, int rc)
{
    if (rc != 0 && failures++ == 0)
        printf("fail %s %d\n", call, rc);
    return rc == 0;
}

static void *perthread_worker(void *arg)
{
    (void)arg;
    void *p = NULL;
    if (check("cudaMallocAsync", cudaMallocAsync(&p, 4096, cudaStreamPerThread)))
        check("cudaFreeAsync", cudaFreeAsync(p, cudaStreamPerThread));
    return NULL;
}

static void cycle_stream(void)
{
    cudaStream_t s;
    void *p = NULL;
    if (!check("cudaStreamCreate", cudaStreamCreate(&s)))
        return;
    if (check("cudaMallocAsync", cudaMallocAsync(&p, 4096, s)))
        check("cudaFreeAsync", cudaFreeAsync(p, s));
    check("cudaStreamDestroy", cudaStreamDestroy(s));
}

static void cycle_perthread(void)
{
    pthread_t t;
    if (check("pthread_create", pthread_create(&t, NULL, perthread_worker, NULL)))
        pthread_join(t, NULL);
}

static void cycle_ctx(void)
{
    CUcontext ctx, popped;
    CUstream s;
    CUdeviceptr a, b, c;
    void *p = NULL;
    if (!check("cuCtxCreate_v2", cuCtxCreate_v2(&ctx, 0, 0)))
        return;
    if (check("cuStreamCreate", cuStreamCreate(&s, CU_STREAM_NON_BLOCKING))) {
        check("cuCtxPopCurrent_v2", cuCtxPopCurrent_v2(&popped));
        if (check("cudaMalloc", cudaMalloc(&p, 4096)))
            check("cudaFreeAsync", cudaFreeAsync(p, (cudaStream_t)s));
        check("cuCtxPushCurrent_v2", cuCtxPushCurrent_v2(ctx));
    }
    if (check("cuMemAlloc_v2", cuMemAlloc_v2(&a, 4096)))
        check("cuMemFree_v2", cuMemFree_v2(a));
    if (check("cuMemAllocAsync", cuMemAllocAsync(&b, 4096, 0)))
        check("cuMemFreeAsync", cuMemFreeAsync(b, 0));
    check("cuMemAlloc_v2", cuMemAlloc_v2(&c, 4096));
    check("cuCtxDestroy_v2", cuCtxDestroy_v2(ctx));
}

/* Leaves 64 MiB in the pool's cache, once. */
static void warm_cache(void)
{
    static int warm;
    void *p = NULL;
    if (warm++ == 0 && check("cudaMalloc", cudaMalloc(&p, 64 << 20))) {
        check("cudaFree", cudaFree(p));
        check("cudaDeviceSynchronize", cudaDeviceSynchronize());
    }
}

static void cycle_foreign(void)
{
    static CUcontext ctx;
    CUcontext popped;
    CUstream s;
    void *p = NULL;
    warm_cache();
    if (!ctx && (!check("cuCtxCreate_v2", cuCtxCreate_v2(&ctx, 0, 0)) ||
                 !check("cuCtxPopCurrent_v2", cuCtxPopCurrent_v2(&popped))))
        return;
    check("cuCtxPushCurrent_v2", cuCtxPushCurrent_v2(ctx));
    int made = check("cuStreamCreate", cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    check("cuCtxPopCurrent_v2", cuCtxPopCurrent_v2(&popped));
    if (!made)
        return;
    if (check("cudaMalloc", cudaMalloc(&p, 4096)))
        check("cudaFreeAsync", cudaFreeAsync(p, (cudaStream_t)s));
    check("cuCtxPushCurrent_v2", cuCtxPushCurrent_v2(ctx));
    /* Its work done, the pool's marker is complete when it next looks: what
     * the pool keeps of destroyed streams is then bounded by the cycles
     * between two looks, not by how far a loaded machine's stream threads
     * lag behind. */
    check("cuStreamSynchronize", cuStreamSynchronize(s));
    check("cuStreamDestroy_v2", cuStreamDestroy_v2(s));
    check("cuCtxPopCurrent_v2", cuCtxPopCurrent_v2(&popped));
}

static void cycle_otherdev(void)
{
    cudaStream_t s;
    void *p = NULL;
    warm_cache();
    check("cudaSetDevice", cudaSetDevice(1));
    int made = check("cudaStreamCreate", cudaStreamCreate(&s));
    check("cudaSetDevice", cudaSetDevice(0));
    if (!made)
        return;
    if (check("cudaMalloc", cudaMalloc(&p, 4096)))
        check("cudaFreeAsync", cudaFreeAsync(p, s));
    check("cudaSetDevice", cudaSetDevice(1));
    check("cudaStreamSynchronize", cudaStreamSynchronize(s)); /* as in cycle_foreign */
    check("cudaStreamDestroy", cudaStreamDestroy(s));
    check("cudaSetDevice", cudaSetDevice(0));
}

static void cycle_reset(void)
{
    void *p = NULL, *q = NULL, *r = NULL;
    cudaStream_t s;
    check("cudaMalloc", cudaMalloc(&p, 1 << 20));
    check("cudaMallocAsync", cudaMallocAsync(&q, 4096, 0));
    if (check("cudaStreamCreate", cudaStreamCreate(&s)) &&
        check("cudaMallocAsync", cudaMallocAsync(&r, 4096, s)))
        check("cudaFreeAsync", cudaFreeAsync(r, s));
    check("cudaDeviceReset", cudaDeviceReset());
}

static void cycle_mempool(void)
{
    struct cudaMemPoolProps props;
    cudaMemPool_t pool;
    void *p = NULL;
    memset(&props, 0, sizeof props);
    props.allocType = 1;
    props.location.type = 1;
    props.location.id = 0;
    if (!check("cudaMemPoolCreate", cudaMemPoolCreate(&pool, &props)))
        return;
    if (check("cudaMallocFromPoolAsync", cudaMallocFromPoolAsync(&p, 4096, pool, 0)))
        check("cudaFreeAsync", cudaFreeAsync(p, 0));
    check("cudaStreamSynchronize", cudaStreamSynchronize(0));
    check("cudaMemPoolDestroy", cudaMemPoolDestroy(pool));
}

static void cycle_vmm(void)
{
    CUmemAllocationProp prop;
    CUmemAccessDesc access;
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    size_t size = 2 << 20;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    memset(&access, 0, sizeof access);
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (!check("cuMemCreate", cuMemCreate(&h, size, &prop, 0)))
        return;
    if (check("cuMemAddressReserve", cuMemAddressReserve(&va, size, 0, 0, 0))) {
        if (check("cuMemMap", cuMemMap(va, size, 0, h, 0))) {
            check("cuMemSetAccess", cuMemSetAccess(va, size, &access, 1));
            check("cuMemUnmap", cuMemUnmap(va, size));
        }
        check("cuMemAddressFree", cuMemAddressFree(va, size));
    }
    check("cuMemRelease", cuMemRelease(h));
}

static void cycle_host(void)
{
    void *p = NULL;
    if (check("cudaMallocHost", cudaMallocHost(&p, 4096)))
        check("cudaFreeHost", cudaFreeHost(p));
}

static void cycle_graph(void)
{
    static cudaStream_t s;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    void *before = NULL, *inside = NULL;
    if (!s && !check("cudaStreamCreate", cudaStreamCreate(&s)))
        return;
    if (!check("cudaMallocAsync", cudaMallocAsync(&before, 1 << 20, s)) ||
        !check("cudaStreamBeginCapture", cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal)))
        return;
    check("cudaFreeAsync", cudaFreeAsync(before, s));
    if (check("cudaMallocAsync", cudaMallocAsync(&inside, 4096, s)))
        check("cudaFreeAsync", cudaFreeAsync(inside, s));
    if (!check("cudaStreamEndCapture", cudaStreamEndCapture(s, &graph)))
        return;
    if (check("cudaGraphInstantiate", cudaGraphInstantiate(&exec, graph, 0))) {
        check("cudaGraphLaunch", cudaGraphLaunch(exec, s));
        check("cudaStreamSynchronize", cudaStreamSynchronize(s));
        check("cudaGraphExecDestroy", cudaGraphExecDestroy(exec));
    }
    check("cudaGraphDestroy", cudaGraphDestroy(graph));
}

static void cycle_nvml(void)
{
    nvmlDevice_t dev;
    nvmlMemory_v2_t mem = {.version = nvmlMemory_v2};
    nvmlProcessInfo_t procs[8];
    unsigned int n = 8;
    if (!check("nvmlInit_v2", nvmlInit_v2()))
        return;
    if (check("nvmlDeviceGetHandleByIndex_v2", nvmlDeviceGetHandleByIndex_v2(0, &dev))) {
        check("nvmlDeviceGetMemoryInfo_v2", nvmlDeviceGetMemoryInfo_v2(dev, &mem));
        check("nvmlDeviceGetComputeRunningProcesses_v3",
              nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, procs));
    }
    check("nvmlShutdown", nvmlShutdown());
}

#define CHURN_LIVE 64
static void *churn_live[CHURN_LIVE];
static int churn_async[CHURN_LIVE];
static unsigned long long churn_state = 88172645463325252ull;

static unsigned long long churn_next(void)
{
    churn_state ^= churn_state << 13;
    churn_state ^= churn_state >> 7;
    churn_state ^= churn_state << 17;
    return churn_state;
}

static void cycle_churn(void)
{
    int i = (int)(churn_next() % CHURN_LIVE);
    if (churn_live[i])
        check(churn_async[i] ? "cudaFreeAsync" : "cudaFree",
              churn_async[i] ? cudaFreeAsync(churn_live[i], 0) : cudaFree(churn_live[i]));
    churn_live[i] = NULL;
    /* Mostly small blocks, some medium, a few huge: sizes spread over 2^9..2^24.5. */
    size_t size = (size_t)1 << (9 + churn_next() % 15);
    size += churn_next() % size;
    churn_async[i] = (int)(churn_next() & 1);
    check(churn_async[i] ? "cudaMallocAsync" : "cudaMalloc",
          churn_async[i] ? cudaMallocAsync(&churn_live[i], size, 0) : cudaMalloc(&churn_live[i], size));
}

static void cycle_spill(void)
{
    void *p = NULL, *q = NULL;
    if (!check("cudaMalloc", cudaMalloc(&p, 3 << 20)))
        return;
    if (check("cudaMalloc", cudaMalloc(&q, 3 << 20)))
        check("cudaFree", cudaFree(q));
    check("cudaFree", cudaFree(p));
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*cycle)(void);
    } modes[] = {
        {"stream", cycle_stream}, {"perthread", cycle_perthread}, {"ctx", cycle_ctx},       {"foreign", cycle_foreign},
        {"otherdev", cycle_otherdev},
        {"reset", cycle_reset},   {"mempool", cycle_mempool},     {"vmm", cycle_vmm},
        {"host", cycle_host},     {"spill", cycle_spill},         {"churn", cycle_churn},
        {"graph", cycle_graph},   {"nvml", cycle_nvml},
    };
    void (*cycle)(void) = NULL;
    if (argc != 3) {
        fprintf(stderr, "usage: cycles MODE N\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (!strcmp(argv[1], modes[i].name))
            cycle = modes[i].cycle;
    int n = atoi(argv[2]);
    if (!cycle || n <= 0) {
        fprintf(stderr, "cycles: unknown mode %s or count %s\n", argv[1], argv[2]);
        return 2;
    }
    void *p = NULL;
    check("cudaMalloc", cudaMalloc(&p, 4096)); /* starts the core */
    check("cudaFree", cudaFree(p));
    for (int i = 0; i < n; i++) {
        cudaEvent_t e;
        cycle();
        if (!check("cudaEventCreate", cudaEventCreate(&e)))
            break;
        check("cudaEventRecord", cudaEventRecord(e, 0));
        check("cudaEventSynchronize", cudaEventSynchronize(e));
        check("cudaEventDestroy", cudaEventDestroy(e));
    }
    check("cudaDeviceSynchronize", cudaDeviceSynchronize());
    printf("end %d\n", failures);
    return 0;
}
