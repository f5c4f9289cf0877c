/*
 * ctxvmm: runs the driver operations named on its command line on device 0,
 * one line of output each, so that tests can script contexts the program
 * creates and the virtual-memory API under the shim. It starts in device
 * 0's primary context.
 *
 *   C        cuCtxCreate_v2 (pushed)          -> "C RC CTX" (CTX: its number)
 *   X CTX    cuCtxDestroy_v2                  -> "X RC"
 *   A        cuCtxAttach                      -> "A RC"
 *   T CTX    cuCtxDetach                      -> "T RC"
 *   U CTX    cuCtxPushCurrent_v2 (CTX p: the primary context) -> "U RC"
 *   O        cuCtxPopCurrent_v2               -> "O RC"
 *   m SIZE   cuMemAlloc_v2                    -> "m RC SLOT"
 *   p W H    cuMemAllocPitch_v2 (4-byte elements) -> "p RC SLOT"
 *   f SLOT   cuMemFree_v2                     -> "f RC"
 *   i        cuMemGetInfo_v2                  -> "i RC FREE TOTAL"
 *   r SIZE   cuMemAddressReserve              -> "r RC"  (one range, used by M)
 *   c SIZE   cuMemCreate on device 0          -> "c RC H"
 *   v SIZE DEV FLAGS  cuMemCreate on device DEV with FLAGS -> "v RC H"
 *   l SIZE   cuMemCreate located on the host (NUMA node 0) -> "l RC H"
 *   M H OFF  cuMemMap of handle H at OFF in the range, read-write for device 0
 *                                             -> "M RC MAP"
 *   N MAP    cuMemUnmap of mapping MAP        -> "N RC"
 *   L H      cuMemRelease of handle H         -> "L RC"
 *   K MAP    cuMemRetainAllocationHandle at mapping MAP -> "K RC H"
 *   g N      grows: cuMemCreate and map 2 MiB granules at the end of the
 *            range until N are mapped or one is refused -> "g RC MAPPED"
 *   j N      grows as g does, mapping each granule without access, then grants
 *            device 0 read-write to every grown granule with one cuMemSetAccess
 *                                             -> "j RC MAPPED"
 *   s N      shrinks: unmaps and releases the last N granules -> "s RC MAPPED"
 *   w        writes a pattern over the grown granules and reads it back
 *                                             -> "w RC WRONG" (bytes read wrong)
 *   h N      where the Nth grown granule's memory lives -> "h RC LOCATION_TYPE"
 *   u N      the Nth grown granule as a CUDA-aware library treats it: its
 *            CU_POINTER_ATTRIBUTE_MEMORY_TYPE, and where that is host memory, a
 *            pattern written with the CPU at its address and read back with
 *            cuMemcpyDtoH_v2 -> "u RC TYPE WRONG" (bytes read wrong)
 *   k N FLAGS  cuMemSetAccess of the Nth grown granule for device 0 read-write
 *            and the CPU (host NUMA node 0) FLAGS, then cuMemGetAccess of the
 *            CPU's -> "k RC FLAGS"
 *   x SIZE   cuMemCreate on device 0 exportable as a file descriptor -> "x RC H"
 *   E H      cuMemExportToShareableHandle of handle H as a descriptor -> "E RC D"
 *   J D      cuMemImportFromShareableHandle of descriptor D -> "J RC H"
 *   D        cuDevicePrimaryCtxReset_v2 of device 0, then its primary context again -> "D RC"
 *   n        NVML's memory of device 0        -> "n RC TOTAL USED"
 *   b DEV    cuDevicePrimaryCtxReset_v2 of device DEV only -> "b RC"
 *   t SLOT   cuMemsetD8_v2 of slot SLOT's first 4 KiB, then cuCtxSynchronize -> "t RC"
 *   q H1 H2 N  two threads, each N times (and on until they raced): cuMemMap of
 *            its handle (H1, H2) at the start of the range, then cuMemUnmap if
 *            that succeeded -> "q MAPPED1 MAPPED2 BUSY" (BUSY: maps refused
 *            because the other thread held the address)
 *   P        cuMemPoolCreate on device 0 (one pool, used by a and Q) -> "P RC"
 *   a SIZE   cuMemAllocFromPoolAsync from it on the legacy stream -> "a RC SLOT"
 *   y SIZE   cuMemAllocAsync on the legacy stream -> "y RC SLOT"
 *   z SLOT   cuMemFreeAsync on the legacy stream, then cuStreamSynchronize -> "z RC"
 *   G SIZE   captures, on a non-blocking stream, cuMemAllocFromPoolAsync from P's
 *            pool and its cuMemFreeAsync into a graph, which is kept
 *            -> "G RC GRAPH" (RC: the allocation's, else the capture's)
 *   H GRAPH  cuGraphDestroy of graph GRAPH    -> "H RC"
 * Built with CTX_HOOK and linked with ctxhook ahead of the driver, also:
 *   S SIZE   starts a thread in the primary context that waits for the next
 *            cuCtxDestroy_v2 or cuCtxDetach; once the driver's call returned,
 *            before the program's does, it allocates SIZE with cuMemAlloc_v2
 *            until it gets back an address a slot had (memory a destroyed
 *            context held), at most 64 times, and frees it with cuMemFree_v2
 *            -> "S RC REUSED FREE_RC" (printed within that X or T)
 * Built with WITH_RUNTIME, also the runtime's calls:
 *   R SIZE   cudaMalloc                       -> "R RC SLOT" (slots shared with m)
 *   V SIZE   cudaMallocManaged                -> "V RC SLOT"
 *   W W H    cudaMallocPitch                  -> "W RC SLOT PITCH"
 *   Y SIZE   cudaMallocAsync on stream 0      -> "Y RC SLOT"
 *   F SLOT   cudaFree                         -> "F RC"
 *   e        cudaGetLastError                 -> "e RC"
 *   Q SIZE   cudaMallocFromPoolAsync from P's pool on stream 0 -> "Q RC SLOT"
 *   Z SLOT   cudaFreeAsync on stream 0, then cudaStreamSynchronize -> "Z RC"
 *   B SIZE   G with the runtime's calls: cudaStreamBeginCapture,
 *            cudaMallocFromPoolAsync, cudaFreeAsync, cudaStreamEndCapture
 *            -> "B RC GRAPH"
 *   I        cudaMemGetInfo                   -> "I RC FREE TOTAL"
 * SIZE takes K, M, G suffixes (binary).
 */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/nvml.h>
#ifdef WITH_RUNTIME
#include <spillway/cuda_runtime.h>
#endif

#include "sizearg.h"
#ifdef CTX_HOOK
#include "gate.h"
#endif

#define MAX 4096
#define GRANULE ((size_t)2 << 20)

static CUcontext ctxs[MAX], primary;
static int nctx;
static CUdeviceptr slot[MAX];
static int nslots;
static CUmemGenericAllocationHandle handles[MAX];
static int nhandles;
static struct {
    CUdeviceptr at;
    size_t size;
} maps[MAX];
static int nmaps;
static CUdeviceptr range;
static size_t range_size;
/* The granules g and s manage, in order. */
static CUmemGenericAllocationHandle grown[MAX];
static int ngrown;
static CUmemoryPool pool;
static CUstream capturing; /* G's and B's stream, made at the first */
static CUgraph graphs[MAX];
static int ngraphs;
static int fds[MAX];
static int nfds;

/*
 * One thread of "q": maps its handle at the start of the range and unmaps
 * it, n times, and on until both threads have mapped and one found the
 * address taken by the other (at most 50 n times), so that a run proves
 * the two raced.
 */
struct racer {
    CUmemGenericAllocationHandle handle;
    long n;
    _Atomic long mapped;
};

static struct racer racers[2];
static _Atomic long race_busy; /* maps refused: the other thread held the address */

static int raced(void)
{
    return race_busy > 0 && racers[0].mapped > 0 && racers[1].mapped > 0;
}

static void *race(void *arg)
{
    struct racer *r = arg;
    if (cuCtxSetCurrent(primary) != CUDA_SUCCESS)
        return NULL;
    for (long k = 0; k < r->n || (k < 50 * r->n && !raced()); k++) {
        if (cuMemMap(range, GRANULE, 0, r->handle, 0) == CUDA_SUCCESS) {
            r->mapped++;
            cuMemUnmap(range, GRANULE);
        } else {
            race_busy++;
        }
        sched_yield();
    }
    return NULL;
}

static CUmemAllocationProp device_prop(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return prop;
}

static CUresult grant_rw(CUdeviceptr at, size_t size)
{
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return cuMemSetAccess(at, size, &access, 1);
}

static CUresult map_rw(CUdeviceptr at, size_t size, CUmemGenericAllocationHandle h)
{
    CUresult rc = cuMemMap(at, size, 0, h, 0);
    return rc == CUDA_SUCCESS ? grant_rw(at, size) : rc;
}

/* Grows the range to want granules, each granted to device 0 as it is mapped
 * (grant_each) or left without access. */
static CUresult grow(int want, int grant_each)
{
    CUmemAllocationProp prop = device_prop();
    while (ngrown < want) {
        CUmemGenericAllocationHandle h;
        CUresult rc = cuMemCreate(&h, GRANULE, &prop, 0);
        if (rc != CUDA_SUCCESS)
            return rc;
        CUdeviceptr at = range + (size_t)ngrown * GRANULE;
        rc = grant_each ? map_rw(at, GRANULE, h) : cuMemMap(at, GRANULE, 0, h, 0);
        if (rc != CUDA_SUCCESS)
            return rc;
        grown[ngrown++] = h;
    }
    return CUDA_SUCCESS;
}

static CUresult shrink(int n)
{
    while (n-- > 0 && ngrown > 0) {
        ngrown--;
        CUresult rc = cuMemUnmap(range + (size_t)ngrown * GRANULE, GRANULE);
        if (rc == CUDA_SUCCESS)
            rc = cuMemRelease(grown[ngrown]);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    return CUDA_SUCCESS;
}

#ifdef CTX_HOOK
extern void (*after_ctx_destroy)(void); /* ctxhook's */
static size_t reuse_size;
static pthread_t reuser;

/* S's thread: see the usage above. */
static void *reuse(void *arg)
{
    (void)arg;
    CUdeviceptr got[64];
    int n = 0, reused = 0;
    CUresult rc = cuCtxSetCurrent(primary), freed = CUDA_ERROR_INVALID_VALUE;
    wait_gate(NULL);
    while (rc == CUDA_SUCCESS && !reused && n < 64) {
        rc = cuMemAlloc_v2(&got[n], reuse_size);
        for (int k = 0; rc == CUDA_SUCCESS && k < nslots; k++)
            reused |= got[n] == slot[k];
        n += rc == CUDA_SUCCESS;
    }
    if (reused)
        freed = cuMemFree_v2(got[--n]);
    while (n > 0)
        cuMemFree_v2(got[--n]);
    printf("S %d %d %d\n", rc, reused, freed);
    return NULL;
}

/* Runs S's thread to its end, once. */
static void reuse_now(void)
{
    after_ctx_destroy = NULL;
    if (open_gate() != 0 || pthread_join(reuser, NULL) != 0)
        abort();
}
#endif

#ifdef WITH_RUNTIME
/* Prints "OP ERR SLOT" (no newline) for a runtime allocation of p, kept in
 * the next slot when it succeeded. */
static void keep_runtime(char op, cudaError_t err, void *p)
{
    slot[nslots] = (CUdeviceptr)p;
    printf("%c %d %d", op, err, nslots);
    nslots += err == cudaSuccess;
}
#endif

int main(int argc, char **argv)
{
    CUdevice dev;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&primary, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(primary) != CUDA_SUCCESS) {
        fprintf(stderr, "ctxvmm: cannot make device 0's primary context current\n");
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        const char *a = i + 1 < argc ? argv[i + 1] : "0";
        const char *b = i + 2 < argc ? argv[i + 2] : "0";
        CUresult rc;
        switch (op[0]) {
        case 'C': {
            /* The last field: the earlier context whose handle it reuses, or -1. */
            int reused = -1;
            rc = cuCtxCreate_v2(&ctxs[nctx], 0, dev);
            for (int j = 0; rc == CUDA_SUCCESS && j < nctx; j++)
                if (ctxs[j] == ctxs[nctx])
                    reused = j;
            printf("C %d %d %d\n", rc, nctx, reused);
            if (rc == CUDA_SUCCESS)
                nctx++;
            break;
        }
        case 'X':
            printf("X %d\n", cuCtxDestroy_v2(ctxs[atoi(a)]));
            i++;
            break;
        case 'A': {
            CUcontext c;
            printf("A %d\n", cuCtxAttach(&c, 0));
            break;
        }
        case 'T':
            printf("T %d\n", cuCtxDetach(ctxs[atoi(a)]));
            i++;
            break;
        case 'U':
            printf("U %d\n", cuCtxPushCurrent_v2(a[0] == 'p' ? primary : ctxs[atoi(a)]));
            i++;
            break;
        case 'O': {
            CUcontext c;
            printf("O %d\n", cuCtxPopCurrent_v2(&c));
            break;
        }
        case 'm':
            rc = cuMemAlloc_v2(&slot[nslots], size_arg(a));
            printf("m %d %d\n", rc, nslots);
            nslots += rc == CUDA_SUCCESS;
            i++;
            break;
        case 'p': {
            size_t pitch;
            rc = cuMemAllocPitch_v2(&slot[nslots], &pitch, size_arg(a), size_arg(b), 4);
            printf("p %d %d\n", rc, nslots);
            nslots += rc == CUDA_SUCCESS;
            i += 2;
            break;
        }
        case 'f':
            printf("f %d\n", cuMemFree_v2(slot[atoi(a)]));
            i++;
            break;
        case 'i': {
            size_t f = 0, t = 0;
            rc = cuMemGetInfo_v2(&f, &t);
            printf("i %d %zu %zu\n", rc, f, t);
            break;
        }
        case 'r':
            range_size = size_arg(a);
            printf("r %d\n", cuMemAddressReserve(&range, range_size, 0, 0, 0));
            i++;
            break;
        case 'c': {
            CUmemAllocationProp prop = device_prop();
            rc = cuMemCreate(&handles[nhandles], size_arg(a), &prop, 0);
            printf("c %d %d\n", rc, nhandles);
            nhandles += rc == CUDA_SUCCESS;
            i++;
            break;
        }
        case 'v': {
            CUmemAllocationProp prop = device_prop();
            prop.location.id = atoi(b);
            rc = cuMemCreate(&handles[nhandles], size_arg(a), &prop,
                             strtoull(i + 3 < argc ? argv[i + 3] : "0", NULL, 10));
            printf("v %d %d\n", rc, nhandles);
            nhandles += rc == CUDA_SUCCESS;
            i += 3;
            break;
        }
        case 'l': {
            CUmemAllocationProp prop = device_prop();
            prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
            rc = cuMemCreate(&handles[nhandles], size_arg(a), &prop, 0);
            printf("l %d %d\n", rc, nhandles);
            nhandles += rc == CUDA_SUCCESS;
            i++;
            break;
        }
        case 'M': {
            CUmemGenericAllocationHandle h = handles[atoi(a)];
            CUmemAllocationProp prop;
            size_t size = 0;
            if (cuMemGetAllocationPropertiesFromHandle(&prop, h) == CUDA_SUCCESS)
                size = GRANULE; /* the tests map whole 2 MiB handles */
            maps[nmaps].at = range + size_arg(b);
            maps[nmaps].size = size;
            rc = map_rw(maps[nmaps].at, size, h);
            printf("M %d %d\n", rc, nmaps);
            nmaps += rc == CUDA_SUCCESS;
            i += 2;
            break;
        }
        case 'N':
            printf("N %d\n", cuMemUnmap(maps[atoi(a)].at, maps[atoi(a)].size));
            i++;
            break;
        case 'L':
            printf("L %d\n", cuMemRelease(handles[atoi(a)]));
            i++;
            break;
        case 'K':
            rc = cuMemRetainAllocationHandle(&handles[nhandles], (void *)maps[atoi(a)].at);
            printf("K %d %d\n", rc, nhandles);
            nhandles += rc == CUDA_SUCCESS;
            i++;
            break;
        case 'g':
            rc = grow(atoi(a), 1);
            printf("g %d %d\n", rc, ngrown);
            i++;
            break;
        case 'j':
            rc = grow(atoi(a), 0);
            if (rc == CUDA_SUCCESS)
                rc = grant_rw(range, (size_t)ngrown * GRANULE);
            printf("j %d %d\n", rc, ngrown);
            i++;
            break;
        case 's':
            rc = shrink(atoi(a));
            printf("s %d %d\n", rc, ngrown);
            i++;
            break;
        case 'w': {
            size_t n = (size_t)ngrown * GRANULE, wrong = 0;
            unsigned char *out = malloc(n), *in = malloc(n);
            if (!out || !in) {
                fprintf(stderr, "ctxvmm: no memory for %zu bytes\n", n);
                return 2;
            }
            for (size_t k = 0; k < n; k++)
                out[k] = (unsigned char)(k * 131 + k / GRANULE);
            rc = cuMemcpyHtoD_v2(range, out, n);
            if (rc == CUDA_SUCCESS)
                rc = cuMemcpyDtoH_v2(in, range, n);
            for (size_t k = 0; rc == CUDA_SUCCESS && k < n; k++)
                wrong += in[k] != out[k];
            printf("w %d %zu\n", rc, wrong);
            free(out);
            free(in);
            break;
        }
        case 'h': {
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            rc = cuMemGetAllocationPropertiesFromHandle(&prop, grown[atoi(a)]);
            printf("h %d %d\n", rc, (int)prop.location.type);
            i++;
            break;
        }
        case 'u': {
            CUdeviceptr at = range + (size_t)atoi(a) * GRANULE;
            unsigned int type = 0;
            size_t wrong = 0;
            rc = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, at);
            if (rc == CUDA_SUCCESS && type == CU_MEMORYTYPE_HOST) {
                unsigned char *cpu = (unsigned char *)(uintptr_t)at, *in = malloc(GRANULE);
                if (!in) {
                    fprintf(stderr, "ctxvmm: no memory for %zu bytes\n", GRANULE);
                    return 2;
                }
                for (size_t k = 0; k < GRANULE; k++)
                    cpu[k] = (unsigned char)(k * 7 + 3);
                rc = cuMemcpyDtoH_v2(in, at, GRANULE);
                for (size_t k = 0; rc == CUDA_SUCCESS && k < GRANULE; k++)
                    wrong += in[k] != (unsigned char)(k * 7 + 3);
                free(in);
            }
            printf("u %d %u %zu\n", rc, type, wrong);
            i++;
            break;
        }
        case 'k': {
            CUdeviceptr at = range + (size_t)atoi(a) * GRANULE;
            CUmemAccessDesc access[2];
            memset(access, 0, sizeof access);
            access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            access[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
            access[1].flags = (CUmemAccess_flags)atoi(b);
            unsigned long long flags = 0;
            rc = cuMemSetAccess(at, GRANULE, access, 2);
            if (rc == CUDA_SUCCESS)
                rc = cuMemGetAccess(&flags, &access[1].location, at);
            printf("k %d %llu\n", rc, flags);
            i += 2;
            break;
        }
        case 'x': {
            CUmemAllocationProp prop = device_prop();
            prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
            rc = cuMemCreate(&handles[nhandles], size_arg(a), &prop, 0);
            printf("x %d %d\n", rc, nhandles);
            nhandles += rc == CUDA_SUCCESS;
            i++;
            break;
        }
        case 'D':
            rc = cuDevicePrimaryCtxReset_v2(dev);
            if (rc == CUDA_SUCCESS && (rc = cuDevicePrimaryCtxRetain(&primary, dev)) == CUDA_SUCCESS)
                rc = cuCtxSetCurrent(primary);
            printf("D %d\n", rc);
            break;
        case 'b':
            printf("b %d\n", cuDevicePrimaryCtxReset_v2(atoi(a)));
            i++;
            break;
        case 't':
            rc = cuMemsetD8_v2(slot[atoi(a)], 1, 4096);
            printf("t %d\n", rc == CUDA_SUCCESS ? cuCtxSynchronize() : rc);
            i++;
            break;
        case 'n': {
            nvmlDevice_t d;
            nvmlMemory_t m = {0};
            nvmlReturn_t nrc = nvmlInit_v2();
            if (nrc == NVML_SUCCESS && (nrc = nvmlDeviceGetHandleByIndex_v2(0, &d)) == NVML_SUCCESS)
                nrc = nvmlDeviceGetMemoryInfo(d, &m);
            printf("n %d %llu %llu\n", nrc, m.total, m.used);
            break;
        }
        case 'E': {
            int fd = -1;
            rc = cuMemExportToShareableHandle(&fd, handles[atoi(a)],
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            fds[nfds] = fd;
            printf("E %d %d\n", rc, nfds);
            nfds += rc == CUDA_SUCCESS;
            i++;
            break;
        }
        case 'J':
            rc = cuMemImportFromShareableHandle(&handles[nhandles], (void *)(intptr_t)fds[atoi(a)],
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
            printf("J %d %d\n", rc, nhandles);
            nhandles += rc == CUDA_SUCCESS;
            i++;
            break;
        case 'q': {
            long n = i + 3 < argc ? atol(argv[i + 3]) : 0;
            racers[0].handle = handles[atoi(a)];
            racers[1].handle = handles[atoi(b)];
            pthread_t t[2];
            for (int k = 0; k < 2; k++) {
                racers[k].n = n;
                pthread_create(&t[k], NULL, race, &racers[k]);
            }
            for (int k = 0; k < 2; k++)
                pthread_join(t[k], NULL);
            printf("q %ld %ld %ld\n", (long)racers[0].mapped, (long)racers[1].mapped,
                   (long)race_busy);
            i += 3;
            break;
        }
        case 'P': {
            CUmemPoolProps props;
            memset(&props, 0, sizeof(props));
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = 0;
            printf("P %d\n", cuMemPoolCreate(&pool, &props));
            break;
        }
        case 'a':
            rc = cuMemAllocFromPoolAsync(&slot[nslots], size_arg(a), pool, CU_STREAM_LEGACY);
            printf("a %d %d\n", rc, nslots);
            nslots += rc == CUDA_SUCCESS;
            i++;
            break;
        case 'y':
            rc = cuMemAllocAsync(&slot[nslots], size_arg(a), CU_STREAM_LEGACY);
            printf("y %d %d\n", rc, nslots);
            nslots += rc == CUDA_SUCCESS;
            i++;
            break;
        case 'z':
            rc = cuMemFreeAsync(slot[atoi(a)], CU_STREAM_LEGACY);
            if (rc == CUDA_SUCCESS)
                rc = cuStreamSynchronize(CU_STREAM_LEGACY);
            printf("z %d\n", rc);
            i++;
            break;
        case 'G': {
            CUdeviceptr p = 0;
            CUgraph graph = NULL;
            rc = capturing ? CUDA_SUCCESS : cuStreamCreate(&capturing, CU_STREAM_NON_BLOCKING);
            if (rc == CUDA_SUCCESS)
                rc = cuStreamBeginCapture_v2(capturing, CU_STREAM_CAPTURE_MODE_GLOBAL);
            if (rc == CUDA_SUCCESS) {
                rc = cuMemAllocFromPoolAsync(&p, size_arg(a), pool, capturing);
                CUresult done = rc == CUDA_SUCCESS ? cuMemFreeAsync(p, capturing) : CUDA_SUCCESS;
                CUresult end = cuStreamEndCapture(capturing, &graph);
                rc = rc != CUDA_SUCCESS ? rc : done != CUDA_SUCCESS ? done : end;
            }
            printf("G %d %d\n", rc, ngraphs);
            graphs[ngraphs++] = graph;
            i++;
            break;
        }
        case 'H':
            printf("H %d\n", cuGraphDestroy(graphs[atoi(a)]));
            i++;
            break;
#ifdef CTX_HOOK
        case 'S':
            reuse_size = size_arg(a);
            if (make_gate() != 0 || pthread_create(&reuser, NULL, reuse, NULL) != 0)
                abort();
            after_ctx_destroy = reuse_now;
            i++;
            break;
#endif
#ifdef WITH_RUNTIME
        case 'B': {
            void *p = NULL;
            cudaGraph_t graph = NULL;
            cudaError_t err = capturing ? cudaSuccess
                                        : (cudaError_t)cuStreamCreate(&capturing, CU_STREAM_NON_BLOCKING);
            cudaStream_t s = (cudaStream_t)capturing;
            if (err == cudaSuccess)
                err = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
            if (err == cudaSuccess) {
                err = cudaMallocFromPoolAsync(&p, size_arg(a), pool, s);
                cudaError_t done = err == cudaSuccess ? cudaFreeAsync(p, s) : cudaSuccess;
                cudaError_t end = cudaStreamEndCapture(s, &graph);
                err = err != cudaSuccess ? err : done != cudaSuccess ? done : end;
            }
            printf("B %d %d\n", err, ngraphs);
            graphs[ngraphs++] = (CUgraph)graph;
            i++;
            break;
        }
        case 'Q': {
            void *p = NULL;
            cudaError_t err = cudaMallocFromPoolAsync(&p, size_arg(a), pool, 0);
            keep_runtime('Q', err, p);
            putchar('\n');
            i++;
            break;
        }
        case 'Z': {
            cudaError_t err = cudaFreeAsync((void *)slot[atoi(a)], 0);
            if (err == cudaSuccess)
                err = cudaStreamSynchronize(0);
            printf("Z %d\n", err);
            i++;
            break;
        }
        case 'I': {
            size_t f = 0, t = 0;
            cudaError_t err = cudaMemGetInfo(&f, &t);
            printf("I %d %zu %zu\n", err, f, t);
            break;
        }
        case 'R': {
            void *p = NULL;
            cudaError_t err = cudaMalloc(&p, size_arg(a));
            keep_runtime('R', err, p);
            putchar('\n');
            i++;
            break;
        }
        case 'V': {
            void *p = NULL;
            cudaError_t err = cudaMallocManaged(&p, size_arg(a), cudaMemAttachGlobal);
            keep_runtime('V', err, p);
            putchar('\n');
            i++;
            break;
        }
        case 'W': {
            void *p = NULL;
            size_t pitch = 0;
            cudaError_t err = cudaMallocPitch(&p, &pitch, size_arg(a), size_arg(b));
            keep_runtime('W', err, p);
            printf(" %zu\n", pitch);
            i += 2;
            break;
        }
        case 'Y': {
            void *p = NULL;
            cudaError_t err = cudaMallocAsync(&p, size_arg(a), 0);
            keep_runtime('Y', err, p);
            putchar('\n');
            i++;
            break;
        }
        case 'F':
            printf("F %d\n", cudaFree((void *)slot[atoi(a)]));
            i++;
            break;
        case 'e':
            printf("e %d\n", cudaGetLastError());
            break;
#endif
        default:
            fprintf(stderr, "ctxvmm: unknown operation %s\n", op);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
