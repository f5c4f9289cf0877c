/*
 * drvops: runs the driver API operations named on its command line, one
 * line of output each, on device 0's primary context, so that tests can
 * script a driver-API program under the shim. Built with WITH_RUNTIME it
 * also runs the runtime's (the dynamic or the static runtime).
 *
 *   m SIZE   cuMemAlloc_v2        -> "m RC SLOT"
 *   f SLOT   cuMemFree_v2         -> "f RC"
 *   i        cuMemGetInfo_v2      -> "i RC FREE TOTAL"
 *   j        cuMemGetInfo_v2(NULL, NULL) -> "j RC"
 *   g SIZE   cuMemAlloc as cuGetProcAddress hands it out (CUDA 12.0)
 *                                 -> "g RC SLOT"
 *   G SIZE   the same through cuGetProcAddress_v2, asking for the
 *            per-thread default stream -> "G RC SLOT"
 *   h SIZE   cuMemAllocAsync on stream 0 as cuGetProcAddress_v2 hands it
 *            out for the per-thread default stream -> "h RC SLOT NAME", NAME
 *            the function's symbol and its file's base name
 *   M SIZE   cuMemAllocManaged (global) -> "M RC SLOT"
 *   n SIZE FLAGS cuMemAllocManaged with FLAGS -> "n RC SLOT"
 *   p W H    cuMemAllocPitch_v2 (4-byte elements) -> "p RC SLOT PITCH"
 *   P W H E  cuMemAllocPitch_v2 with E-byte elements -> "P RC SLOT PITCH"
 *   a SIZE   cuMemAllocAsync on the legacy stream -> "a RC SLOT"
 *   A SIZE   cuMemAllocAsync_ptsz on stream 0 (the per-thread stream)
 *                                 -> "A RC SLOT"
 *   F SLOT   cuMemFreeAsync on the legacy stream -> "F RC"
 *   z        cuMemFree_v2(0)      -> "z RC"
 *   Z        cuMemFreeAsync(0) on the legacy stream -> "Z RC"
 *   S        a stream created and destroyed at once (later b and B use it)
 *                                 -> "S RC"
 *   b SIZE   cuMemAllocAsync on the destroyed stream -> "b RC SLOT"
 *   B SLOT   cuMemFreeAsync on the destroyed stream -> "B RC"
 *   c        a new stream begins a capture in global mode -> "c RC"
 *   C        that capture ends  -> "C RC"
 *   t        cuDeviceTotalMem_v2 of device 0 -> "t RC BYTES"
 *   s        cuCtxSynchronize     -> "s RC"
 *   x        cuDevicePrimaryCtxReset_v2 of device 0, then the context made
 *            current again -> "x RC"
 *   X        the same with cuDevicePrimaryCtxReset, the entry point of
 *            CUDA 7 to 10 (what cuGetProcAddress answers below 11.0)
 *                                 -> "X RC"
 *   r SIZE   cudaMalloc           -> "r RC SLOT"
 *   R SLOT   cudaFree             -> "R RC"
 *   I        cudaMemGetInfo       -> "I RC FREE TOTAL"
 *   e        cudaGetLastError     -> "e RC"
 *   N SIZE FLAGS cudaMallocManaged with FLAGS -> "N RC SLOT"
 *   d SIZE   cudaMalloc of the dynamic runtime, loaded with dlopen (in a
 *            program built with the static runtime: both in one process)
 *                                 -> "d RC SLOT"
 *   q SLOT OFFSET  cuMemGetAddressRange_v2 of the address OFFSET bytes into
 *            the slot's block -> "q RC BASE SIZE", BASE the range's start
 *            less the slot's address
 *   u SLOT OFFSET  the same range as CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
 *            and RANGE_SIZE, asked of cuPointerGetAttribute (RC, the first
 *            error of the two) and of cuPointerGetAttributes (RCS)
 *                                 -> "u RC BASE SIZE RCS BASE SIZE"
 *   o SLOT OFFSET  the range queries with outputs left NULL, as CUDA allows
 *            some: cuMemGetAddressRange_v2 without a base (RC SIZE), then
 *            without a size (RC BASE, less the slot's address);
 *            cuPointerGetAttribute into NULL of RANGE_START_ADDR and of
 *            IS_LEGACY_CUDA_IPC_CAPABLE (RC RC); cuPointerGetAttributes of
 *            RANGE_START_ADDR, RANGE_SIZE and IS_LEGACY_CUDA_IPC_CAPABLE
 *            with the first and last data NULL (RCS SIZE)
 *                                 -> "o RC SIZE RC BASE RC RC RCS SIZE"
 *   k SLOT OFFSET  cuIpcGetMemHandle (RC), IS_LEGACY_CUDA_IPC_CAPABLE of
 *            cuPointerGetAttribute (RC CAPABLE) and of cuPointerGetAttributes
 *            (RCS CAPABLE), -1 if unwritten, and cuMemRetainAllocationHandle
 *            (RC, the handle released again)
 *                                 -> "k RC RC CAPABLE RCS CAPABLE RC"
 *   w        cuMemGetAddressRange_v2, and cuPointerGetAttribute of RANGE_SIZE
 *            and of IS_LEGACY_CUDA_IPC_CAPABLE, of an address on the stack
 *                                 -> "w RC RC RC"
 * SIZE takes K, M, G suffixes (binary).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include "sizearg.h"

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
#ifdef WITH_RUNTIME
#include <spillway/cuda_runtime.h>
#endif

#define SLOTS 1024
static CUdeviceptr slot[SLOTS];
static int nslots;

typedef CUresult (*mem_alloc_fn)(CUdeviceptr *, size_t);

/* cuMemAlloc as the driver's lookup hands it out, or NULL. */
static mem_alloc_fn looked_up(int v2)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult status;
    CUresult rc = v2 ? cuGetProcAddress_v2("cuMemAlloc", &fn, 12000,
                                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status)
                     : cuGetProcAddress("cuMemAlloc", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT);
    if (rc != CUDA_SUCCESS || !fn) {
        fprintf(stderr, "drvops: no cuMemAlloc from the driver's lookup: %d\n", rc);
        exit(2);
    }
    return (mem_alloc_fn)fn;
}

/* The range of the address offset bytes into slot p, as cuPointerGetAttribute
 * (attributes 0) or cuPointerGetAttributes reports it. */
static CUresult range_attributes(CUdeviceptr p, size_t offset, int attributes, CUdeviceptr *start,
                                 size_t *size)
{
    CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                   CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    void *data[] = {start, size};
    if (attributes)
        return cuPointerGetAttributes(2, which, data, p + offset);
    CUresult rc = cuPointerGetAttribute(start, which[0], p + offset);
    CUresult rc_size = cuPointerGetAttribute(size, which[1], p + offset);
    return rc != CUDA_SUCCESS ? rc : rc_size;
}

/* Op o: the range queries of p with outputs left NULL. */
static void null_outputs(CUdeviceptr p, CUdeviceptr at)
{
    CUdeviceptr base = 0;
    size_t size = 0, sizes = 0;
    CUresult rc_no_base = cuMemGetAddressRange_v2(NULL, &size, p);
    CUresult rc_no_size = cuMemGetAddressRange_v2(&base, NULL, p);
    CUresult rc_start = cuPointerGetAttribute(NULL, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
    CUresult rc_ipc = cuPointerGetAttribute(NULL, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p);
    CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                   CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
    void *data[] = {NULL, &sizes, NULL};
    CUresult rcs = cuPointerGetAttributes(3, which, data, p);
    printf("o %d %zu %d %lld %d %d %d %zu\n", rc_no_base, size, rc_no_size, (long long)(base - at), rc_start,
           rc_ipc, rcs, sizes);
}

/* Op k: what the IPC calls and cuMemRetainAllocationHandle answer for p. */
static void ipc_queries(CUdeviceptr p)
{
    CUipcMemHandle handle;
    CUresult rc_ipc = cuIpcGetMemHandle(&handle, p);
    int capable = -1, capables = -1;
    CUpointer_attribute which = CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE;
    void *data[] = {&capables};
    CUresult rc_capable = cuPointerGetAttribute(&capable, which, p);
    CUresult rcs = cuPointerGetAttributes(1, &which, data, p);
    CUmemGenericAllocationHandle retained = 0;
    CUresult rc_retain = cuMemRetainAllocationHandle(&retained, (void *)(uintptr_t)p);
    if (rc_retain == CUDA_SUCCESS)
        cuMemRelease(retained);
    printf("k %d %d %d %d %d %d\n", rc_ipc, rc_capable, capable, rcs, capables, rc_retain);
}

static int keep(CUdeviceptr p)
{
    if (nslots == SLOTS) {
        fprintf(stderr, "drvops: out of slots\n");
        exit(2);
    }
    slot[nslots] = p;
    return nslots++;
}

static CUdeviceptr slot_arg(const char *s)
{
    int i = atoi(s);
    if (i < 0 || i >= nslots) {
        fprintf(stderr, "drvops: no slot %s\n", s);
        exit(2);
    }
    return slot[i];
}

int main(int argc, char **argv)
{
    CUcontext ctx;
    CUstream gone = NULL, capturing = NULL;
    CUgraph graph;
    CUresult rc;
    if ((rc = cuInit(0)) != CUDA_SUCCESS || (rc = cuDevicePrimaryCtxRetain(&ctx, 0)) != CUDA_SUCCESS ||
        (rc = cuCtxSetCurrent(ctx)) != CUDA_SUCCESS) {
        fprintf(stderr, "drvops: no primary context on device 0: %d\n", rc);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        const char *arg = i + 1 < argc ? argv[i + 1] : "0";
        CUdeviceptr p = 0;
        size_t free = 0, total = 0;
        switch (op[0]) {
        case 'm':
            rc = cuMemAlloc_v2(&p, size_arg(arg));
            printf("m %d %d\n", rc, rc == CUDA_SUCCESS ? keep(p) : -1);
            i++;
            break;
        case 'g':
        case 'G':
            rc = looked_up(op[0] == 'G')(&p, size_arg(arg));
            printf("%c %d %d\n", op[0], rc, rc == CUDA_SUCCESS ? keep(p) : -1);
            i++;
            break;
        case 'h': {
            void *fn = NULL;
            CUdriverProcAddressQueryResult status;
            Dl_info info = {0};
            if (cuGetProcAddress_v2("cuMemAllocAsync", &fn, 12000,
                                    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status) != CUDA_SUCCESS ||
                !fn || !dladdr(fn, &info) || !info.dli_sname) {
                fprintf(stderr, "drvops: no cuMemAllocAsync from cuGetProcAddress_v2\n");
                return 2;
            }
            const char *file = strrchr(info.dli_fname, '/');
            rc = ((CUresult(*)(CUdeviceptr *, size_t, CUstream))fn)(&p, size_arg(arg), NULL);
            printf("h %d %d %s@%s\n", rc, rc == CUDA_SUCCESS ? keep(p) : -1, info.dli_sname,
                   file ? file + 1 : info.dli_fname);
            i++;
            break;
        }
        case 'M':
            rc = cuMemAllocManaged(&p, size_arg(arg), CU_MEM_ATTACH_GLOBAL);
            printf("M %d %d\n", rc, rc == CUDA_SUCCESS ? keep(p) : -1);
            i++;
            break;
        case 'n':
            rc = cuMemAllocManaged(&p, size_arg(arg), (unsigned)atoi(i + 2 < argc ? argv[i + 2] : "0"));
            printf("n %d %d\n", rc, rc == CUDA_SUCCESS ? keep(p) : -1);
            i += 2;
            break;
        case 'p': {
            size_t pitch = 0;
            rc = cuMemAllocPitch_v2(&p, &pitch, size_arg(arg), (size_t)atol(i + 2 < argc ? argv[i + 2] : "0"), 4);
            printf("p %d %d %zu\n", rc, rc == CUDA_SUCCESS ? keep(p) : -1, pitch);
            i += 2;
            break;
        }
        case 'P': {
            size_t pitch = 0;
            rc = cuMemAllocPitch_v2(&p, &pitch, size_arg(arg), (size_t)atol(i + 2 < argc ? argv[i + 2] : "0"),
                                    (unsigned int)atoi(i + 3 < argc ? argv[i + 3] : "0"));
            printf("P %d %d %zu\n", rc, rc == CUDA_SUCCESS ? keep(p) : -1, pitch);
            i += 3;
            break;
        }
        case 'a':
        case 'A':
            rc = op[0] == 'a' ? cuMemAllocAsync(&p, size_arg(arg), NULL)
                              : cuMemAllocAsync_ptsz(&p, size_arg(arg), NULL);
            printf("%c %d %d\n", op[0], rc, rc == CUDA_SUCCESS ? keep(p) : -1);
            i++;
            break;
        case 'F':
            printf("F %d\n", cuMemFreeAsync(slot_arg(arg), NULL));
            i++;
            break;
        case 'z':
            printf("z %d\n", cuMemFree_v2(0));
            break;
        case 'Z':
            printf("Z %d\n", cuMemFreeAsync(0, NULL));
            break;
        case 'S':
            rc = cuStreamCreate(&gone, CU_STREAM_DEFAULT);
            if (rc == CUDA_SUCCESS)
                rc = cuStreamDestroy_v2(gone);
            printf("S %d\n", rc);
            break;
        case 'b':
            rc = cuMemAllocAsync(&p, size_arg(arg), gone);
            printf("b %d %d\n", rc, rc == CUDA_SUCCESS ? keep(p) : -1);
            i++;
            break;
        case 'B':
            printf("B %d\n", cuMemFreeAsync(slot_arg(arg), gone));
            i++;
            break;
        case 'c':
            rc = cuStreamCreate(&capturing, CU_STREAM_NON_BLOCKING);
            if (rc == CUDA_SUCCESS)
                rc = cuStreamBeginCapture_v2(capturing, CU_STREAM_CAPTURE_MODE_GLOBAL);
            printf("c %d\n", rc);
            break;
        case 'C':
            printf("C %d\n", cuStreamEndCapture(capturing, &graph));
            break;
        case 't':
            rc = cuDeviceTotalMem_v2(&total, 0);
            printf("t %d %zu\n", rc, total);
            break;
        case 's':
            printf("s %d\n", cuCtxSynchronize());
            break;
        case 'x':
        case 'X':
            rc = op[0] == 'x' ? cuDevicePrimaryCtxReset_v2(0) : cuDevicePrimaryCtxReset(0);
            if (rc == CUDA_SUCCESS && ((rc = cuDevicePrimaryCtxRetain(&ctx, 0)) != CUDA_SUCCESS ||
                                       (rc = cuCtxSetCurrent(ctx)) != CUDA_SUCCESS))
                fprintf(stderr, "drvops: no context after the reset: %d\n", rc);
            printf("%c %d\n", op[0], rc);
            break;
        case 'f':
            printf("f %d\n", cuMemFree_v2(slot_arg(arg)));
            i++;
            break;
        case 'i':
            rc = cuMemGetInfo_v2(&free, &total);
            printf("i %d %zu %zu\n", rc, free, total);
            break;
        case 'j':
            printf("j %d\n", cuMemGetInfo_v2(NULL, NULL));
            break;
        case 'q': {
            CUdeviceptr at = slot_arg(arg), base = 0;
            size_t offset = size_arg(i + 2 < argc ? argv[i + 2] : "0");
            rc = cuMemGetAddressRange_v2(&base, &total, at + offset);
            printf("q %d %lld %zu\n", rc, (long long)(base - at), total);
            i += 2;
            break;
        }
        case 'u': {
            CUdeviceptr at = slot_arg(arg), start = 0, starts = 0;
            size_t offset = size_arg(i + 2 < argc ? argv[i + 2] : "0"), size = 0, sizes = 0;
            rc = range_attributes(at, offset, 0, &start, &size);
            CUresult rcs = range_attributes(at, offset, 1, &starts, &sizes);
            printf("u %d %lld %zu %d %lld %zu\n", rc, (long long)(start - at), size, rcs,
                   (long long)(starts - at), sizes);
            i += 2;
            break;
        }
        case 'o':
            null_outputs(slot_arg(arg) + size_arg(i + 2 < argc ? argv[i + 2] : "0"), slot_arg(arg));
            i += 2;
            break;
        case 'k':
            ipc_queries(slot_arg(arg) + size_arg(i + 2 < argc ? argv[i + 2] : "0"));
            i += 2;
            break;
        case 'w': {
            CUdeviceptr stack = (CUdeviceptr)(uintptr_t)&free, base = 0;
            size_t size = 0;
            int capable = -1;
            rc = cuMemGetAddressRange_v2(&base, &total, stack);
            printf("w %d %d %d\n", rc, cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, stack),
                   cuPointerGetAttribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, stack));
            break;
        }
#ifdef WITH_RUNTIME
        case 'r': {
            void *q = NULL;
            cudaError_t e = cudaMalloc(&q, size_arg(arg));
            printf("r %d %d\n", e, e == cudaSuccess ? keep((CUdeviceptr)(uintptr_t)q) : -1);
            i++;
            break;
        }
        case 'R':
            printf("R %d\n", cudaFree((void *)(uintptr_t)slot_arg(arg)));
            i++;
            break;
        case 'I': {
            cudaError_t e = cudaMemGetInfo(&free, &total);
            printf("I %d %zu %zu\n", e, free, total);
            break;
        }
        case 'e':
            printf("e %d\n", cudaGetLastError());
            break;
        case 'N': {
            void *q = NULL;
            cudaError_t e = cudaMallocManaged(&q, size_arg(arg), (unsigned)atoi(i + 2 < argc ? argv[i + 2] : "0"));
            printf("N %d %d\n", e, e == cudaSuccess ? keep((CUdeviceptr)(uintptr_t)q) : -1);
            i += 2;
            break;
        }
        case 'd': {
            static cudaError_t (*dynamic_malloc)(void **, size_t);
            void *h = dynamic_malloc ? NULL : dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
            if (h)
                dynamic_malloc = (cudaError_t(*)(void **, size_t))dlsym(h, "cudaMalloc");
            if (!dynamic_malloc) {
                fprintf(stderr, "drvops: no dynamic runtime: %s\n", dlerror());
                return 2;
            }
            void *q = NULL;
            cudaError_t e = dynamic_malloc(&q, size_arg(arg));
            printf("d %d %d\n", e, e == cudaSuccess ? keep((CUdeviceptr)(uintptr_t)q) : -1);
            i++;
            break;
        }
#endif
        default:
            fprintf(stderr, "drvops: unknown operation %s\n", op);
            return 2;
        }
    }
    return 0;
}
