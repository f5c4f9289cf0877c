/*
 * appvmm: the application's own virtual-memory calls on device 0, as a
 * demanding program (an allocator of expandable segments, a sleep mode, a
 * communication library) makes them, scripted on the command line, one line
 * of output each, so that tests can compare what the shim reports with
 * simcuda's ground truth. One address range (reserve) holds every mapping;
 * OFF is an offset in it, SIZE and OFF take K, M, G suffixes (binary).
 *
 *   reserve SIZE          cuMemAddressReserve       -> "reserve RC"
 *   afree                 cuMemAddressFree of the range -> "afree RC"
 *   create SIZE           cuMemCreate on device 0   -> "create RC H"
 *   createx SIZE          the same, exportable as a file descriptor -> "createx RC H"
 *   map H OFF SIZE        cuMemMap of handle H, then cuMemSetAccess read-write
 *                         for device 0              -> "map RC"
 *   unmap OFF SIZE        cuMemUnmap                -> "unmap RC"
 *   release H             cuMemRelease              -> "release RC"
 *   retain OFF            cuMemRetainAllocationHandle of the address -> "retain RC H"
 *   export H              cuMemExportToShareableHandle as a descriptor -> "export RC FD"
 *   import FD             cuMemImportFromShareableHandle -> "import RC H"
 *   reset                 cuDevicePrimaryCtxReset_v2, then the primary context
 *                         made current again     -> "reset RC"
 *   rtreset               cudaDeviceReset, then cudaSetDevice(0) and cudaFree(0)
 *                                                   -> "rtreset RC"
 *   info                  cuMemGetInfo_v2           -> "info RC FREE TOTAL"
 *   rtinfo                cudaMemGetInfo            -> "rtinfo RC FREE TOTAL"
 *   nvml                  NVML's memory of device 0 -> "nvml RC TOTAL USED"
 *   entry                 from here on, the virtual-memory calls are made through
 *                         the pointers cudaGetDriverEntryPoint hands out, as
 *                         PyTorch finds them        -> "entry RC"
 *   threads T N SIZE      T threads, each N times: cuMemCreate of SIZE, cuMemMap
 *                         at its own part of the range, cuMemUnmap and cuMemRelease
 *                         -> "threads FAILED REFUSED" (FAILED: calls that failed
 *                         otherwise than a refused cuMemCreate; REFUSED: those)
 *
 * H is a handle's number: handles are numbered in the order create, createx,
 * retain and import gave them.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>
#include <spillway/nvml.h>

#include "sizearg.h"

#define MAX 4096

static CUcontext primary;
static CUdevice dev;
static CUdeviceptr range;
static size_t range_size;
static CUmemGenericAllocationHandle handles[MAX];
static int nhandles;
static int fds[MAX];
static int nfds;

/* The virtual-memory calls: the driver's as linked, or as entry handed them out. */
static CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long) = cuMemCreate;
static CUresult (*mem_release)(CUmemGenericAllocationHandle) = cuMemRelease;
static CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                           unsigned long long) = cuMemMap;
static CUresult (*mem_unmap)(CUdeviceptr, size_t) = cuMemUnmap;
static CUresult (*mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t) = cuMemSetAccess;
static CUresult (*mem_retain)(CUmemGenericAllocationHandle *, void *) = cuMemRetainAllocationHandle;
static CUresult (*mem_import)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType) =
    cuMemImportFromShareableHandle;

/* Sets *fn to the driver entry point name; 0 or the runtime's error. */
static int entry_point(const char *name, void *fn)
{
    enum cudaDriverEntryPointQueryResult found;
    void *f = NULL;
    cudaError_t err = cudaGetDriverEntryPoint(name, &f, cudaEnableDefault, &found);
    if (err == cudaSuccess && (found != cudaDriverEntryPointSuccess || !f))
        err = cudaErrorSymbolNotFound;
    if (err == cudaSuccess)
        memcpy(fn, &f, sizeof f);
    return err;
}

static CUmemAllocationProp device_prop(int exportable)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    if (exportable)
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
}

static CUresult map_rw(CUdeviceptr at, size_t size, CUmemGenericAllocationHandle h)
{
    CUresult rc = mem_map(at, size, 0, h, 0);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return mem_set_access(at, size, &access, 1);
}

/* One thread of "threads": its part of the range starts at at. */
struct worker {
    CUdeviceptr at;
    size_t size;
    long n;
    long failed, refused;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    CUmemAllocationProp prop = device_prop(0);
    if (cuCtxSetCurrent(primary) != CUDA_SUCCESS) {
        w->failed = w->n;
        return NULL;
    }
    for (long k = 0; k < w->n; k++) {
        CUmemGenericAllocationHandle h;
        CUresult rc = mem_create(&h, w->size, &prop, 0);
        if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
            w->refused++;
            continue;
        }
        if (rc != CUDA_SUCCESS) {
            w->failed++;
            continue;
        }
        /* Every other round releases first, then unmaps. */
        if (map_rw(w->at, w->size, h) != CUDA_SUCCESS)
            w->failed++;
        else if (k % 2 && mem_release(h) == CUDA_SUCCESS && mem_unmap(w->at, w->size) == CUDA_SUCCESS)
            continue;
        else if (k % 2)
            w->failed++;
        else if (mem_unmap(w->at, w->size) != CUDA_SUCCESS)
            w->failed++;
        if (!(k % 2) && mem_release(h) != CUDA_SUCCESS)
            w->failed++;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&primary, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(primary) != CUDA_SUCCESS) {
        fprintf(stderr, "appvmm: cannot make device 0's primary context current\n");
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        const char *a = i + 1 < argc ? argv[i + 1] : "0";
        const char *b = i + 2 < argc ? argv[i + 2] : "0";
        const char *c = i + 3 < argc ? argv[i + 3] : "0";
        CUresult rc;
        if (strcmp(op, "reserve") == 0) {
            range_size = size_arg(a);
            printf("reserve %d\n", cuMemAddressReserve(&range, range_size, 0, 0, 0));
            i++;
        } else if (strcmp(op, "afree") == 0) {
            printf("afree %d\n", cuMemAddressFree(range, range_size));
        } else if (strcmp(op, "create") == 0 || strcmp(op, "createx") == 0) {
            CUmemAllocationProp prop = device_prop(op[6] == 'x');
            rc = mem_create(&handles[nhandles], size_arg(a), &prop, 0);
            printf("%s %d %d\n", op, rc, nhandles);
            nhandles += rc == CUDA_SUCCESS;
            i++;
        } else if (strcmp(op, "map") == 0) {
            printf("map %d\n", map_rw(range + size_arg(b), size_arg(c), handles[atoi(a)]));
            i += 3;
        } else if (strcmp(op, "unmap") == 0) {
            printf("unmap %d\n", mem_unmap(range + size_arg(a), size_arg(b)));
            i += 2;
        } else if (strcmp(op, "release") == 0) {
            printf("release %d\n", mem_release(handles[atoi(a)]));
            i++;
        } else if (strcmp(op, "retain") == 0) {
            rc = mem_retain(&handles[nhandles], (void *)(range + size_arg(a)));
            printf("retain %d %d\n", rc, nhandles);
            nhandles += rc == CUDA_SUCCESS;
            i++;
        } else if (strcmp(op, "export") == 0) {
            int fd = -1;
            rc = cuMemExportToShareableHandle(&fd, handles[atoi(a)], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            fds[nfds] = fd;
            printf("export %d %d\n", rc, nfds);
            nfds += rc == CUDA_SUCCESS;
            i++;
        } else if (strcmp(op, "import") == 0) {
            rc = mem_import(&handles[nhandles], (void *)(intptr_t)fds[atoi(a)],
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
            printf("import %d %d\n", rc, nhandles);
            nhandles += rc == CUDA_SUCCESS;
            i++;
        } else if (strcmp(op, "reset") == 0) {
            rc = cuDevicePrimaryCtxReset_v2(dev);
            if (rc == CUDA_SUCCESS && (rc = cuDevicePrimaryCtxRetain(&primary, dev)) == CUDA_SUCCESS)
                rc = cuCtxSetCurrent(primary);
            printf("reset %d\n", rc);
        } else if (strcmp(op, "rtreset") == 0) {
            cudaError_t err = cudaDeviceReset();
            if (err == cudaSuccess && (err = cudaSetDevice(0)) == cudaSuccess)
                err = cudaFree(NULL);
            if (err == cudaSuccess && cuCtxGetCurrent(&primary) != CUDA_SUCCESS)
                err = cudaErrorUnknown;
            printf("rtreset %d\n", err);
        } else if (strcmp(op, "info") == 0) {
            size_t f = 0, t = 0;
            rc = cuMemGetInfo_v2(&f, &t);
            printf("info %d %zu %zu\n", rc, f, t);
        } else if (strcmp(op, "rtinfo") == 0) {
            size_t f = 0, t = 0;
            cudaError_t err = cudaMemGetInfo(&f, &t);
            printf("rtinfo %d %zu %zu\n", err, f, t);
        } else if (strcmp(op, "nvml") == 0) {
            nvmlDevice_t d;
            nvmlMemory_t m = {0};
            nvmlReturn_t nrc = nvmlInit_v2();
            if (nrc == NVML_SUCCESS && (nrc = nvmlDeviceGetHandleByIndex_v2(0, &d)) == NVML_SUCCESS)
                nrc = nvmlDeviceGetMemoryInfo(d, &m);
            printf("nvml %d %llu %llu\n", nrc, m.total, m.used);
        } else if (strcmp(op, "entry") == 0) {
            int err = entry_point("cuMemCreate", &mem_create);
            err = err ? err : entry_point("cuMemRelease", &mem_release);
            err = err ? err : entry_point("cuMemMap", &mem_map);
            err = err ? err : entry_point("cuMemUnmap", &mem_unmap);
            err = err ? err : entry_point("cuMemSetAccess", &mem_set_access);
            err = err ? err : entry_point("cuMemRetainAllocationHandle", &mem_retain);
            err = err ? err : entry_point("cuMemImportFromShareableHandle", &mem_import);
            printf("entry %d\n", err);
        } else if (strcmp(op, "threads") == 0) {
            int t = atoi(a);
            struct worker w[64];
            pthread_t th[64];
            long failed = 0, refused = 0;
            if (t > 64 || (size_t)t * size_arg(c) > range_size) {
                fprintf(stderr, "appvmm: %d threads of %s do not fit the range\n", t, c);
                return 2;
            }
            for (int k = 0; k < t; k++) {
                w[k] = (struct worker){.at = range + (size_t)k * size_arg(c), .size = size_arg(c), .n = atol(b)};
                pthread_create(&th[k], NULL, work, &w[k]);
            }
            for (int k = 0; k < t; k++) {
                pthread_join(th[k], NULL);
                failed += w[k].failed;
                refused += w[k].refused;
            }
            printf("threads %ld %ld\n", failed, refused);
            i += 3;
        } else {
            fprintf(stderr, "appvmm: unknown operation %s\n", op);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
