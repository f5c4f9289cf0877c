/*
 * streamdev KIND: stream-ordered allocations that CUDA makes on device 1
 * while device 0 is current. cudaMallocAsync, cuMemAllocAsync and its _ptsz
 * form (KIND rt, drv, drvpt) take them from the pool of the stream's
 * device, on a stream of device 1. cudaMallocFromPoolAsync (poolrt, with a
 * pool made by cudaMemPoolCreate), cuMemAllocFromPoolAsync and its _ptsz
 * form (pooldrv, pooldrvpt, with cuMemPoolCreate) take them from the pool
 * named, one of device 1, on the default stream of device 0. Prints, in
 * order:
 *   "base RC"       cudaMalloc of 48 MiB on device 0
 *   "A RC DEVICE"   48 MiB on the stream; DEVICE: the device CUDA put them on
 *   "B RC"          48 MiB more on the stream
 *   "G RC DEVICE"   cudaGetDevice afterwards
 *   "I0 RC FREE"    cudaMemGetInfo on device 0; "I1 RC FREE" on device 1
 *   "F RC"          A freed on the stream (cudaFreeAsync, or cuMemFreeAsync
 *                   for the driver's kinds), the stream synchronized
 *   "C RC"          48 MiB again on the stream
 * RC is the call's error code. Exits 2 if it cannot begin.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#define MIB (1ull << 20)

static const char *kind;
static cudaStream_t stream;
static CUmemoryPool pool;

static int driver_kind(void)
{
    return strncmp(kind, "drv", 3) == 0 || strncmp(kind, "pooldrv", 7) == 0;
}

static int alloc(void **p, size_t size)
{
    CUdeviceptr d = 0;
    int rc;
    if (strcmp(kind, "rt") == 0)
        return cudaMallocAsync(p, size, stream);
    if (strcmp(kind, "poolrt") == 0)
        return cudaMallocFromPoolAsync(p, size, pool, stream);
    if (strcmp(kind, "drv") == 0)
        rc = cuMemAllocAsync(&d, size, (CUstream)stream);
    else if (strcmp(kind, "drvpt") == 0)
        rc = cuMemAllocAsync_ptsz(&d, size, (CUstream)stream);
    else if (strcmp(kind, "pooldrv") == 0)
        rc = cuMemAllocFromPoolAsync(&d, size, pool, (CUstream)stream);
    else
        rc = cuMemAllocFromPoolAsync_ptsz(&d, size, pool, (CUstream)stream);
    *p = (void *)(uintptr_t)d;
    return rc;
}

/* An explicit pool of device 1, made by the runtime or the driver as KIND says. */
static int make_pool(void)
{
    if (strncmp(kind, "pooldrv", 7) == 0) {
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = 1;
        return cuMemPoolCreate(&pool, &props);
    }
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = 1;
    props.location.type = 1;
    props.location.id = 1;
    return cudaMemPoolCreate(&pool, &props);
}

static void mem_info(const char *step, int device)
{
    size_t free = 0, total = 0;
    int rc = cudaSetDevice(device);
    if (rc == cudaSuccess)
        rc = cudaMemGetInfo(&free, &total);
    printf("%s %d %zu\n", step, rc, free);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: streamdev rt|drv|drvpt|poolrt|pooldrv|pooldrvpt\n");
        return 2;
    }
    kind = argv[1];
    int explicit_pool = strncmp(kind, "pool", 4) == 0;
    if (cudaSetDevice(1) != cudaSuccess ||
        (explicit_pool ? make_pool() : cudaStreamCreate(&stream)) != 0 ||
        cudaSetDevice(0) != cudaSuccess) {
        fprintf(stderr, "streamdev: cannot make a stream and a pool on device 1\n");
        return 2;
    }

    void *base = NULL, *a = NULL, *b = NULL, *c = NULL;
    printf("base %d\n", cudaMalloc(&base, 48 * MIB));

    struct cudaPointerAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.device = -1;
    int rc = alloc(&a, 48 * MIB);
    if (rc == 0)
        cudaPointerGetAttributes(&attr, a);
    printf("A %d %d\n", rc, attr.device);
    printf("B %d\n", alloc(&b, 48 * MIB));

    int device = -1;
    rc = cudaGetDevice(&device);
    printf("G %d %d\n", rc, device);
    mem_info("I0", 0);
    mem_info("I1", 1);
    cudaSetDevice(0);

    rc = driver_kind() ? (int)cuMemFreeAsync((CUdeviceptr)(uintptr_t)a, (CUstream)stream)
                       : (int)cudaFreeAsync(a, stream);
    if (rc == 0)
        rc = cudaStreamSynchronize(stream);
    printf("F %d\n", rc);
    printf("C %d\n", alloc(&c, 48 * MIB));
    return 0;
}
