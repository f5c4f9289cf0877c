/*
 * mempool MODE [DEVICE]: reads the default memory pool of DEVICE (default 0,
 * made current) as PyTorch's cudaMallocAsync backend does, through the
 * runtime's calls and through the driver's (found with cuGetProcAddress_v2).
 * Prints, in order:
 *   "pools RC SAME"        cudaDeviceGetDefaultMemPool and cudaDeviceGetMemPool,
 *                          SAME 1 when they name one pool
 *   "explicit RC R U T"    a pool made with cudaMemPoolCreate, holding 4 MiB from
 *                          cudaMallocFromPoolAsync: its reserved and used bytes
 *                          and its release threshold, set to 12345 and read back
 *   "alloc RC"             8 MiB (A) and 24 MiB with cudaMallocAsync on a stream,
 *                          4 MiB with cudaMalloc
 *   "full RC R RH U UH"    the four usage attributes through the runtime
 *                          (ReservedMemCurrent, ReservedMemHigh, UsedMemCurrent,
 *                          UsedMemHigh); "full-drv" through the driver
 *   "freed ..."            once the 24 MiB (cudaFreeAsync) and the 4 MiB
 *                          (cudaFree) are freed
 *   "badhigh RC"           UsedMemHigh set to 5 through the runtime (CUDA refuses it)
 *   "after-badhigh ..."    the attributes after that
 *   "reset RC"             both Highs set to 0 through the runtime
 *   "after-reset ..."      the attributes after that
 *   "drvreset RC"          16 MiB allocated and freed, then UsedMemHigh set to 0
 *                          through the driver; "after-drvreset ..." the attributes after
 *   "threshold RC V"       ReleaseThreshold set to UINT64_MAX through the runtime,
 *                          read back through the driver
 * then, unless MODE is "keep" (the process ends holding its cache):
 *   "trimkeep RC"          MODE "trimkeep" only: cudaDeviceSynchronize,
 *                          cudaMemPoolTrimTo(pool, 256 MiB), and a pool made
 *                          with cudaMemPoolCreate trimmed to 0 and destroyed;
 *                          "kept ..." the attributes after that
 *   "trim RC"              cudaDeviceSynchronize, cudaMemPoolTrimTo(pool, 0)
 *   "trimmed ..."          the attributes after that; A is still live.
 * RC is the first call's error that failed, else 0. Exits 2 if it cannot begin.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#define MIB (1ull << 20)

typedef CUresult (*pool_get_fn)(CUmemoryPool, CUmemPool_attribute, void *);

static pool_get_fn driver_get;

/* Prints the four usage attributes of pool, through the runtime or the driver. */
static void usage(const char *step, cudaMemPool_t pool, int driver)
{
    static const int attrs[] = {cudaMemPoolAttrReservedMemCurrent, cudaMemPoolAttrReservedMemHigh,
                                cudaMemPoolAttrUsedMemCurrent, cudaMemPoolAttrUsedMemHigh};
    uint64_t v[4] = {0};
    int rc = 0;
    for (int i = 0; i < 4 && rc == 0; i++)
        rc = driver ? (int)driver_get(pool, (CUmemPool_attribute)attrs[i], &v[i])
                    : (int)cudaMemPoolGetAttribute(pool, (enum cudaMemPoolAttr)attrs[i], &v[i]);
    printf("%s%s %d %llu %llu %llu %llu\n", step, driver ? "-drv" : "", rc,
           (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[2],
           (unsigned long long)v[3]);
}

/* An explicit pool passes through: its figures are CUDA's. */
static void explicit_pool(cudaStream_t s, int device)
{
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = 1;
    props.location.type = 1;
    props.location.id = device;
    cudaMemPool_t mine;
    void *p = NULL;
    uint64_t reserved = 0, used = 0, threshold = 12345, back = 0;
    cudaError_t rc = cudaMemPoolCreate(&mine, &props);
    if (rc == cudaSuccess && (rc = cudaMallocFromPoolAsync(&p, 4 * MIB, mine, s)) == cudaSuccess &&
        (rc = cudaStreamSynchronize(s)) == cudaSuccess &&
        (rc = cudaMemPoolGetAttribute(mine, cudaMemPoolAttrReservedMemCurrent, &reserved)) ==
            cudaSuccess &&
        (rc = cudaMemPoolGetAttribute(mine, cudaMemPoolAttrUsedMemCurrent, &used)) == cudaSuccess &&
        (rc = cudaMemPoolSetAttribute(mine, cudaMemPoolAttrReleaseThreshold, &threshold)) ==
            cudaSuccess)
        rc = cudaMemPoolGetAttribute(mine, cudaMemPoolAttrReleaseThreshold, &back);
    if (p && rc == cudaSuccess && (rc = cudaFreeAsync(p, s)) == cudaSuccess &&
        (rc = cudaStreamSynchronize(s)) == cudaSuccess)
        rc = cudaMemPoolDestroy(mine);
    printf("explicit %d %llu %llu %llu\n", rc, (unsigned long long)reserved,
           (unsigned long long)used, (unsigned long long)back);
}

int main(int argc, char **argv)
{
    cudaStream_t s;
    cudaMemPool_t pool, current;
    CUdriverProcAddressQueryResult found;
    if (argc < 2)
        return 2;
    int device = argc > 2 ? atoi(argv[2]) : 0;
    if (cudaSetDevice(device) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess ||
        cuGetProcAddress_v2("cuMemPoolGetAttribute", (void **)&driver_get, 12000,
                            CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS ||
        !driver_get)
        return 2;
    cudaError_t rc = cudaDeviceGetDefaultMemPool(&pool, device);
    if (rc == cudaSuccess)
        rc = cudaDeviceGetMemPool(&current, device);
    printf("pools %d %d\n", rc, rc == cudaSuccess && pool == current);
    if (rc != cudaSuccess)
        return 2;

    explicit_pool(s, device);

    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    rc = cudaMallocAsync(&a, 8 * MIB, s);
    if (rc == cudaSuccess)
        rc = cudaMallocAsync(&b, 24 * MIB, s);
    if (rc == cudaSuccess)
        rc = cudaMalloc(&c, 4 * MIB);
    printf("alloc %d\n", rc);
    usage("full", pool, 0);
    usage("full", pool, 1);

    rc = cudaFreeAsync(b, s);
    if (rc == cudaSuccess)
        rc = cudaFree(c);
    usage("freed", pool, 0);

    uint64_t zero = 0, five = 5;
    printf("badhigh %d\n", cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &five));
    cudaGetLastError();
    usage("after-badhigh", pool, 0);
    rc = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero);
    if (rc == cudaSuccess)
        rc = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
    printf("reset %d\n", rc);
    usage("after-reset", pool, 0);

    rc = cudaMallocAsync(&d, 16 * MIB, s);
    if (rc == cudaSuccess)
        rc = cudaFreeAsync(d, s);
    if (rc == cudaSuccess)
        rc = (cudaError_t)cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero);
    printf("drvreset %d\n", rc);
    usage("after-drvreset", pool, 0);

    uint64_t most = UINT64_MAX, back = 0;
    rc = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &most);
    if (rc == cudaSuccess)
        rc = (cudaError_t)cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &back);
    printf("threshold %d %llu\n", rc, (unsigned long long)back);
    if (strcmp(argv[1], "keep") == 0)
        return 0;

    if (strcmp(argv[1], "trimkeep") == 0) {
        rc = cudaDeviceSynchronize();
        if (rc == cudaSuccess)
            rc = cudaMemPoolTrimTo(pool, 256 * MIB);
        struct cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = 1;
        props.location.type = 1;
        props.location.id = device;
        cudaMemPool_t mine;
        if (rc == cudaSuccess && (rc = cudaMemPoolCreate(&mine, &props)) == cudaSuccess &&
            (rc = cudaMemPoolTrimTo(mine, 0)) == cudaSuccess)
            rc = cudaMemPoolDestroy(mine);
        printf("trimkeep %d\n", rc);
        usage("kept", pool, 0);
    }
    rc = cudaDeviceSynchronize();
    if (rc == cudaSuccess)
        rc = cudaMemPoolTrimTo(pool, 0);
    printf("trim %d\n", rc);
    usage("trimmed", pool, 0);
    return 0;
}
