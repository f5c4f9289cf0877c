/*
 * ctxswitch: runs the operations named on its command line, one line of
 * output each, so that tests can script a program that mixes the runtime
 * with contexts it creates or pushes with the driver API. It starts with
 * device 0's primary context current, as the runtime makes it.
 *
 *   C DEV        cuCtxCreate_v2 on device DEV (pushed) -> "C RC CTX"
 *   N FORM DEV   the same with another form: v3 (cuCtxCreate_v3, no affinity),
 *                v4 (cuCtxCreate_v4, parameters of neither kind), or proc
 *                (cuGetProcAddress's cuCtxCreate for CUDA 12.4, which is
 *                cuCtxCreate_v3)                     -> "C RC CTX"
 *   X CTX        cuCtxDestroy_v2                     -> "X RC"
 *   U WHO        cuCtxPushCurrent_v2 of WHO: cN, created context N; pN,
 *                device N's primary context          -> "U RC"
 *   O            cuCtxPopCurrent_v2                  -> "O RC"
 *   c            cuCtxGetCurrent                     -> "c RC WHO" (WHO as for U;
 *                none; unknown)
 *   R SIZE       cudaMalloc                          -> "R RC SLOT ADDRESS"
 *   F SLOT       cudaFree                            -> "F RC"
 *   Z SLOT       cudaFreeAsync on the legacy stream  -> "Z RC"
 *   b DEV        cuDevicePrimaryCtxReset_v2 of DEV   -> "b RC"
 *   y            cudaDeviceSynchronize               -> "y RC"
 *   k            cuCtxSynchronize                    -> "k RC"
 *   B            a non-blocking stream of the current context, blocked by a
 *                host function until H               -> "B RC STREAM"
 *   W SLOT STREAM BYTE  cudaMemsetAsync of the slot's first 4 KiB to BYTE on
 *                stream STREAM (queued behind its block) -> "W RC"
 *   H            lets every blocked stream go        -> "H RC"
 *   P SLOT BYTE  cudaMemcpy of 4 KiB of BYTE into the slot -> "P RC"
 *   V SLOT BYTE  cudaMemcpy of the slot's first 4 KiB back -> "V RC WRONG"
 *                (WRONG: bytes that are not BYTE)
 *   I            cudaMemGetInfo                      -> "I RC FREE TOTAL"
 *   G            cudaGetDevice                       -> "G RC DEVICE"
 * SIZE takes K, M, G suffixes (binary).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#include "gate.h"
#include "sizearg.h"

#define MAX 256
#define CHUNK 4096

static CUcontext ctxs[MAX], primaries[MAX];
static int nctx, ndev;
static void *slot[MAX];
static int nslots;
static cudaStream_t streams[MAX];
static int nstreams, blocked;

static CUcontext context_arg(const char *who)
{
    int n = atoi(who + 1);
    if (n < 0 || n >= MAX)
        return NULL;
    return who[0] == 'p' ? primaries[n] : ctxs[n];
}

static void print_context(CUcontext ctx)
{
    if (ctx == NULL) {
        printf(" none\n");
        return;
    }
    for (int i = 0; i < nctx; i++)
        if (ctxs[i] == ctx) {
            printf(" c%d\n", i);
            return;
        }
    for (int i = 0; i < ndev; i++)
        if (primaries[i] == ctx) {
            printf(" p%d\n", i);
            return;
        }
    printf(" unknown\n");
}

int main(int argc, char **argv)
{
    if (make_gate() != 0 || cudaSetDevice(0) != cudaSuccess || cudaFree(NULL) != cudaSuccess ||
        cuDeviceGetCount(&ndev) != CUDA_SUCCESS || ndev > MAX) {
        fprintf(stderr, "ctxswitch: cannot start the runtime on device 0\n");
        return 2;
    }
    for (int i = 0; i < ndev; i++) {
        if (cuDevicePrimaryCtxRetain(&primaries[i], i) != CUDA_SUCCESS) {
            fprintf(stderr, "ctxswitch: cannot retain device %d's primary context\n", i);
            return 2;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        const char *a = i + 1 < argc ? argv[i + 1] : "0";
        const char *b = i + 2 < argc ? argv[i + 2] : "0";
        const char *c = i + 3 < argc ? argv[i + 3] : "0";
        switch (op[0]) {
        case 'C': {
            CUresult rc = cuCtxCreate_v2(&ctxs[nctx], 0, atoi(a));
            printf("C %d %d\n", rc, nctx);
            nctx += rc == CUDA_SUCCESS;
            i++;
            break;
        }
        case 'N': {
            CUresult rc = CUDA_ERROR_INVALID_VALUE;
            CUctxCreateParams params = {NULL, 0, NULL};
            __typeof__(cuCtxCreate_v3) *create = NULL;
            CUdriverProcAddressQueryResult status;
            if (strcmp(a, "v3") == 0)
                rc = cuCtxCreate_v3(&ctxs[nctx], NULL, 0, 0, atoi(b));
            else if (strcmp(a, "v4") == 0)
                rc = cuCtxCreate_v4(&ctxs[nctx], &params, 0, atoi(b));
            else if (strcmp(a, "proc") == 0 &&
                     cuGetProcAddress_v2("cuCtxCreate", (void **)&create, 12040, 0, &status) ==
                         CUDA_SUCCESS &&
                     create)
                rc = create(&ctxs[nctx], NULL, 0, 0, atoi(b));
            printf("C %d %d\n", rc, nctx);
            nctx += rc == CUDA_SUCCESS;
            i += 2;
            break;
        }
        case 'X':
            printf("X %d\n", cuCtxDestroy_v2(ctxs[atoi(a)]));
            i++;
            break;
        case 'U':
            printf("U %d\n", cuCtxPushCurrent_v2(context_arg(a)));
            i++;
            break;
        case 'O': {
            CUcontext ctx;
            printf("O %d\n", cuCtxPopCurrent_v2(&ctx));
            break;
        }
        case 'c': {
            CUcontext ctx = NULL;
            printf("c %d", cuCtxGetCurrent(&ctx));
            print_context(ctx);
            break;
        }
        case 'R': {
            void *p = NULL;
            cudaError_t rc = cudaMalloc(&p, size_arg(a));
            slot[nslots] = p;
            printf("R %d %d %lu\n", rc, nslots, (unsigned long)(uintptr_t)p);
            nslots += rc == cudaSuccess;
            i++;
            break;
        }
        case 'F':
            printf("F %d\n", cudaFree(slot[atoi(a)]));
            i++;
            break;
        case 'Z':
            printf("Z %d\n", cudaFreeAsync(slot[atoi(a)], 0));
            i++;
            break;
        case 'b':
            printf("b %d\n", cuDevicePrimaryCtxReset_v2(atoi(a)));
            i++;
            break;
        case 'y':
            printf("y %d\n", cudaDeviceSynchronize());
            break;
        case 'k':
            printf("k %d\n", cuCtxSynchronize());
            break;
        case 'B': {
            cudaError_t rc = cudaStreamCreateWithFlags(&streams[nstreams], cudaStreamNonBlocking);
            if (rc == cudaSuccess)
                rc = cudaLaunchHostFunc(streams[nstreams], wait_gate, NULL);
            printf("B %d %d\n", rc, nstreams);
            if (rc == cudaSuccess) {
                nstreams++;
                blocked++;
            }
            break;
        }
        case 'W':
            printf("W %d\n", cudaMemsetAsync(slot[atoi(a)], atoi(c), CHUNK, streams[atoi(b)]));
            i += 3;
            break;
        case 'H': {
            int rc = 0;
            for (; blocked > 0; blocked--)
                if (open_gate() != 0)
                    rc = 1;
            printf("H %d\n", rc);
            break;
        }
        case 'P': {
            unsigned char buf[CHUNK];
            memset(buf, atoi(b), sizeof buf);
            printf("P %d\n", cudaMemcpy(slot[atoi(a)], buf, sizeof buf, cudaMemcpyHostToDevice));
            i += 2;
            break;
        }
        case 'V': {
            unsigned char buf[CHUNK];
            cudaError_t rc = cudaMemcpy(buf, slot[atoi(a)], sizeof buf, cudaMemcpyDeviceToHost);
            int wrong = 0;
            for (size_t k = 0; k < sizeof buf; k++)
                wrong += buf[k] != (unsigned char)atoi(b);
            printf("V %d %d\n", rc, wrong);
            i += 2;
            break;
        }
        case 'I': {
            size_t free = 0, total = 0;
            cudaError_t rc = cudaMemGetInfo(&free, &total);
            printf("I %d %zu %zu\n", rc, free, total);
            break;
        }
        case 'G': {
            int dev = -1;
            cudaError_t rc = cudaGetDevice(&dev);
            printf("G %d %d\n", rc, dev);
            break;
        }
        default:
            fprintf(stderr, "ctxswitch: unknown operation %s\n", op);
            return 2;
        }
    }
    return 0;
}
