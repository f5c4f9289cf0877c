/*
 * arrays: runs the CUDA array operations named on its command line on
 * device 0, one line of output each, so that tests can script arrays under
 * the shim. It starts in device 0's primary context. Arrays and mipmapped
 * arrays are of float4 elements (16 bytes) unless said otherwise; slots
 * number them in order.
 *
 *   a W H D  cuArray3DCreate_v2              -> "a RC SLOT"
 *   k W H    cuArrayCreate_v2                -> "k RC SLOT"
 *   f W H D  cuArray3DCreate_v2 with CUDA_ARRAY3D_DEFERRED_MAPPING -> "f RC SLOT"
 *   g W H D  cuArray3DCreate_v2 as cuGetProcAddress_v2 hands it out -> "g RC SLOT"
 *   n W H D C cuArray3DCreate_v2 of C float channels -> "n RC SLOT"
 *   d SLOT   cuArrayDestroy                  -> "d RC"
 *   A W H    cudaMallocArray                 -> "A RC SLOT"
 *   T W H D  cudaMalloc3DArray               -> "T RC SLOT"
 *   B W H    cudaMalloc3DArray of BC1 texels (as cudaCreateChannelDesc gives them:
 *            8 bits x 4, packed 8 bytes a 4x4 block) -> "B RC SLOT"
 *   E W H    cudaMalloc3DArray of BC7 texels (8 bits x 4, packed 16 bytes a 4x4 block) -> "E RC SLOT"
 *   V W H    cudaMallocArray of float3 (which CUDA arrays do not have) -> "V RC SLOT"
 *   v W H C  cudaMallocArray of C float channels -> "v RC SLOT"
 *   F SLOT   cudaFreeArray                   -> "F RC"
 *   e        cudaGetLastError                -> "e RC"
 *   i        cuMemGetInfo_v2                 -> "i RC FREE TOTAL"
 *   I        cudaMemGetInfo                  -> "I RC FREE TOTAL"
 *   C        cuCtxCreate_v2 (current)        -> "C RC CTX" (CTX: its number)
 *   X CTX    cuCtxDestroy_v2, then the primary context current -> "X RC"
 *   D        cuDevicePrimaryCtxReset_v2 of device 0, then its primary context again -> "D RC"
 *   R        cudaDeviceReset                 -> "R RC"
 *   S N      device N's primary context current (device 0's again after D) -> "S RC"
 *   m W H D L FLAGS cuMipmappedArrayCreate of L levels -> "m RC SLOT"
 *   G W H D L cuMipmappedArrayCreate as cuGetProcAddress_v2 hands it out -> "G RC SLOT"
 *   M SLOT   cuMipmappedArrayDestroy         -> "M RC"
 *   P W H D L cudaMallocMipmappedArray of L levels -> "P RC SLOT"
 *   Q SLOT   cudaFreeMipmappedArray          -> "Q RC"
 *   l SLOT N cuArrayDestroy of level N of a mipmapped array (cuMipmappedArrayGetLevel) -> "l RC"
 *   u MIB    cudaMalloc of MIB MiB           -> "u RC SLOT"
 *   U SLOT   cudaFree                        -> "U RC"
 */
#include <stdio.h>
#include <stdlib.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#define MAX_SLOTS 64

static void *slots[MAX_SLOTS];
static int nslots;
static CUcontext ctxs[8];
static int nctx;

static int keep(void *a)
{
    if (nslots == MAX_SLOTS) {
        fprintf(stderr, "arrays: out of slots\n");
        exit(2);
    }
    slots[nslots] = a;
    return nslots++;
}

static void driver_array(char op, const char *w, const char *h, const char *d, unsigned int channels,
                         unsigned int flags)
{
    CUDA_ARRAY3D_DESCRIPTOR desc = {strtoull(w, NULL, 0), strtoull(h, NULL, 0), strtoull(d, NULL, 0),
                                    CU_AD_FORMAT_FLOAT, channels, flags};
    CUarray a = NULL;
    CUresult rc = cuArray3DCreate_v2(&a, &desc);
    printf("%c %d %d\n", op, rc, rc == CUDA_SUCCESS ? keep(a) : -1);
}

static const struct cudaChannelFormatDesc float4 = {32, 32, 32, 32, cudaChannelFormatKindFloat};
static const struct cudaChannelFormatDesc float3 = {32, 32, 32, 0, cudaChannelFormatKindFloat};
static const struct cudaChannelFormatDesc bc1 = {8, 8, 8, 8, cudaChannelFormatKindUnsignedBlockCompressed1};
static const struct cudaChannelFormatDesc bc7 = {8, 8, 8, 8, cudaChannelFormatKindUnsignedBlockCompressed7};

int main(int argc, char **argv)
{
    CUdevice dev;
    CUcontext primary;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&primary, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(primary) != CUDA_SUCCESS) {
        fprintf(stderr, "arrays: cannot make device 0's primary context current\n");
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        const char *a = i + 1 < argc ? argv[i + 1] : "0";
        const char *b = i + 2 < argc ? argv[i + 2] : "0";
        const char *c = i + 3 < argc ? argv[i + 3] : "0";
        switch (op[0]) {
        case 'a':
            driver_array('a', a, b, c, 4, 0);
            i += 3;
            break;
        case 'f':
            driver_array('f', a, b, c, 4, CUDA_ARRAY3D_DEFERRED_MAPPING);
            i += 3;
            break;
        case 'n':
            driver_array('n', a, b, c, (unsigned int)atoi(i + 4 < argc ? argv[i + 4] : "0"), 0);
            i += 4;
            break;
        case 'g': {
            CUresult (*create)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *) = NULL;
            CUdriverProcAddressQueryResult status;
            CUresult rc = cuGetProcAddress_v2("cuArray3DCreate", (void **)&create, 12040, 0, &status);
            CUDA_ARRAY3D_DESCRIPTOR desc = {strtoull(a, NULL, 0), strtoull(b, NULL, 0), strtoull(c, NULL, 0),
                                            CU_AD_FORMAT_FLOAT, 4, 0};
            CUarray arr = NULL;
            if (rc == CUDA_SUCCESS)
                rc = create ? create(&arr, &desc) : CUDA_ERROR_NOT_FOUND;
            printf("g %d %d\n", rc, rc == CUDA_SUCCESS ? keep(arr) : -1);
            i += 3;
            break;
        }
        case 'k': {
            CUDA_ARRAY_DESCRIPTOR desc = {strtoull(a, NULL, 0), strtoull(b, NULL, 0), CU_AD_FORMAT_FLOAT, 4};
            CUarray arr = NULL;
            CUresult rc = cuArrayCreate_v2(&arr, &desc);
            printf("k %d %d\n", rc, rc == CUDA_SUCCESS ? keep(arr) : -1);
            i += 2;
            break;
        }
        case 'd':
            printf("d %d\n", cuArrayDestroy(slots[atoi(a)]));
            i++;
            break;
        case 'A': {
            cudaArray_t arr = NULL;
            cudaError_t rc = cudaMallocArray(&arr, &float4, strtoull(a, NULL, 0), strtoull(b, NULL, 0), 0);
            printf("A %d %d\n", rc, rc == cudaSuccess ? keep((CUarray)arr) : -1);
            i += 2;
            break;
        }
        case 'T': {
            cudaArray_t arr = NULL;
            struct cudaExtent extent = {strtoull(a, NULL, 0), strtoull(b, NULL, 0), strtoull(c, NULL, 0)};
            cudaError_t rc = cudaMalloc3DArray(&arr, &float4, extent, 0);
            printf("T %d %d\n", rc, rc == cudaSuccess ? keep((CUarray)arr) : -1);
            i += 3;
            break;
        }
        case 'V': {
            cudaArray_t arr = NULL;
            cudaError_t rc = cudaMallocArray(&arr, &float3, strtoull(a, NULL, 0), strtoull(b, NULL, 0), 0);
            printf("V %d %d\n", rc, rc == cudaSuccess ? keep((CUarray)arr) : -1);
            i += 2;
            break;
        }
        case 'B':
        case 'E': {
            cudaArray_t arr = NULL;
            struct cudaExtent extent = {strtoull(a, NULL, 0), strtoull(b, NULL, 0), 0};
            cudaError_t rc = cudaMalloc3DArray(&arr, op[0] == 'B' ? &bc1 : &bc7, extent, 0);
            printf("%c %d %d\n", op[0], rc, rc == cudaSuccess ? keep((CUarray)arr) : -1);
            i += 2;
            break;
        }
        case 'v': {
            int n = atoi(c);
            struct cudaChannelFormatDesc floats = {32, n > 1 ? 32 : 0, n > 2 ? 32 : 0, n > 3 ? 32 : 0,
                                                   cudaChannelFormatKindFloat};
            cudaArray_t arr = NULL;
            cudaError_t rc = cudaMallocArray(&arr, &floats, strtoull(a, NULL, 0), strtoull(b, NULL, 0), 0);
            printf("v %d %d\n", rc, rc == cudaSuccess ? keep((CUarray)arr) : -1);
            i += 3;
            break;
        }
        case 'F':
            printf("F %d\n", cudaFreeArray((cudaArray_t)slots[atoi(a)]));
            i++;
            break;
        case 'e':
            printf("e %d\n", cudaGetLastError());
            break;
        case 'u': {
            void *p = NULL;
            cudaError_t rc = cudaMalloc(&p, strtoull(a, NULL, 0) << 20);
            printf("u %d %d\n", rc, rc == cudaSuccess ? keep(p) : -1);
            i++;
            break;
        }
        case 'U':
            printf("U %d\n", cudaFree(slots[atoi(a)]));
            i++;
            break;
        case 'i': {
            size_t free_bytes = 0, total = 0;
            CUresult rc = cuMemGetInfo_v2(&free_bytes, &total);
            printf("i %d %zu %zu\n", rc, free_bytes, total);
            break;
        }
        case 'I': {
            size_t free_bytes = 0, total = 0;
            cudaError_t rc = cudaMemGetInfo(&free_bytes, &total);
            printf("I %d %zu %zu\n", rc, free_bytes, total);
            break;
        }
        case 'C': {
            CUresult rc = cuCtxCreate_v2(&ctxs[nctx], 0, dev);
            printf("C %d %d\n", rc, nctx);
            if (rc == CUDA_SUCCESS)
                nctx++;
            break;
        }
        case 'X': {
            CUresult rc = cuCtxDestroy_v2(ctxs[atoi(a)]);
            if (rc == CUDA_SUCCESS)
                rc = cuCtxSetCurrent(primary);
            printf("X %d\n", rc);
            i++;
            break;
        }
        case 'D': {
            CUresult rc = cuDevicePrimaryCtxReset_v2(dev);
            if (rc == CUDA_SUCCESS)
                rc = cuDevicePrimaryCtxRetain(&primary, dev);
            if (rc == CUDA_SUCCESS)
                rc = cuCtxSetCurrent(primary);
            printf("D %d\n", rc);
            break;
        }
        case 'R':
            printf("R %d\n", cudaDeviceReset());
            break;
        case 'S': {
            CUdevice other;
            CUcontext ctx;
            CUresult rc = cuDeviceGet(&other, atoi(a));
            if (rc == CUDA_SUCCESS)
                rc = cuDevicePrimaryCtxRetain(&ctx, other);
            if (rc == CUDA_SUCCESS)
                rc = cuCtxSetCurrent(ctx);
            printf("S %d\n", rc);
            i++;
            break;
        }
        case 'm': {
            CUDA_ARRAY3D_DESCRIPTOR desc = {strtoull(a, NULL, 0), strtoull(b, NULL, 0), strtoull(c, NULL, 0),
                                            CU_AD_FORMAT_FLOAT, 4,
                                            (unsigned int)strtoul(i + 5 < argc ? argv[i + 5] : "0", NULL, 0)};
            CUmipmappedArray m = NULL;
            CUresult rc = cuMipmappedArrayCreate(&m, &desc, (unsigned int)atoi(i + 4 < argc ? argv[i + 4] : "0"));
            printf("m %d %d\n", rc, rc == CUDA_SUCCESS ? keep(m) : -1);
            i += 5;
            break;
        }
        case 'G': {
            CUresult (*create)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int) = NULL;
            CUdriverProcAddressQueryResult status;
            CUresult rc = cuGetProcAddress_v2("cuMipmappedArrayCreate", (void **)&create, 12040, 0, &status);
            CUDA_ARRAY3D_DESCRIPTOR desc = {strtoull(a, NULL, 0), strtoull(b, NULL, 0), strtoull(c, NULL, 0),
                                            CU_AD_FORMAT_FLOAT, 4, 0};
            CUmipmappedArray m = NULL;
            if (rc == CUDA_SUCCESS)
                rc = create ? create(&m, &desc, (unsigned int)atoi(i + 4 < argc ? argv[i + 4] : "0"))
                            : CUDA_ERROR_NOT_FOUND;
            printf("G %d %d\n", rc, rc == CUDA_SUCCESS ? keep(m) : -1);
            i += 4;
            break;
        }
        case 'M':
            printf("M %d\n", cuMipmappedArrayDestroy(slots[atoi(a)]));
            i++;
            break;
        case 'P': {
            cudaMipmappedArray_t m = NULL;
            struct cudaExtent extent = {strtoull(a, NULL, 0), strtoull(b, NULL, 0), strtoull(c, NULL, 0)};
            cudaError_t rc = cudaMallocMipmappedArray(&m, &float4, extent,
                                                      (unsigned int)atoi(i + 4 < argc ? argv[i + 4] : "0"), 0);
            printf("P %d %d\n", rc, rc == cudaSuccess ? keep(m) : -1);
            i += 4;
            break;
        }
        case 'Q':
            printf("Q %d\n", cudaFreeMipmappedArray(slots[atoi(a)]));
            i++;
            break;
        case 'l': {
            CUarray level = NULL;
            CUresult rc = cuMipmappedArrayGetLevel(&level, slots[atoi(a)], (unsigned int)atoi(b));
            if (rc == CUDA_SUCCESS)
                rc = cuArrayDestroy(level);
            printf("l %d\n", rc);
            i += 2;
            break;
        }
        default:
            fprintf(stderr, "arrays: unknown operation %s\n", op);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
