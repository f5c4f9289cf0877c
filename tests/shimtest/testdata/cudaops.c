/*
 * cudaops: runs the CUDA operations named on its command line, one line of
 * output each, so that tests can script a program under the shim.
 *
 *   m SIZE       cudaMalloc          -> "m RC SLOT"
 *   M SIZE       cudaMallocManaged   -> "M RC SLOT"
 *   a SIZE       cudaMallocAsync (default stream) -> "a RC SLOT"
 *   A SIZE       cudaMallocAsync (cudaStreamPerThread) -> "A RC SLOT"
 *   p W H        cudaMallocPitch     -> "p RC SLOT PITCH"
 *   D W H N      cudaMalloc3D of W x H x N bytes -> "D RC SLOT PITCH"
 *   f SLOT       cudaFree            -> "f RC"
 *   F SLOT       cudaFreeAsync       -> "F RC"
 *   G SLOT       cudaFreeAsync (cudaStreamPerThread) -> "G RC"
 *   x SLOT       cudaFree of a slot already freed (double free) -> "x RC"
 *   h SIZE       cudaHostRegister(cudaHostRegisterMapped) of SIZE bytes of new,
 *                untouched host memory -> "h RC SLOT"
 *   u SLOT       cudaHostUnregister  -> "u RC"
 *   n            cudaFree(NULL)      -> "n RC"
 *   N            cudaFreeAsync(NULL) on the legacy stream -> "N RC"
 *   i            cudaMemGetInfo      -> "i RC FREE TOTAL"
 *   I            cudaMemGetInfo(NULL, NULL) -> "I RC"
 *   d DEV        cudaSetDevice       -> "d RC"
 *   r            cudaDeviceReset     -> "r RC"
 *   s            cudaDeviceSynchronize -> "s RC"
 *   R N SIZE     N cudaMalloc of SIZE each, freed again: "R OK REFUSED"
 *   L            whether the Go core is mapped -> "L 0|1"
 *   c            cudaFree of ctor_block, the block ctorlib's constructor allocated -> "c RC"
 *   e            cudaFree of the block at EAGER_BLOCK (eagercore's) -> "e RC"
 *   T            the number of threads in the process -> "T N"
 *   U NAME       unsetenv(NAME), as a program that keeps a variable from its
 *                children does -> "U RC"
 * SIZE takes K, M, G suffixes (binary).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <spillway/cuda_runtime.h>

#include "sizearg.h"

/* Defined when the program is linked with ctorlib. */
extern void *ctor_block __attribute__((weak));

#define SLOTS 1024
static void *slot[SLOTS];
static int nslots;

static int core_loaded(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "libspillway-core.so"))
            found = 1;
    if (f)
        fclose(f);
    return found;
}

static int threads(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    if (f)
        fclose(f);
    return n;
}

static int keep(void *p)
{
    if (nslots == SLOTS) {
        fprintf(stderr, "cudaops: out of slots\n");
        exit(2);
    }
    slot[nslots] = p;
    return nslots++;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        void *p = NULL;
        cudaError_t rc;
        if (!strcmp(op, "m") && i + 1 < argc) {
            rc = cudaMalloc(&p, size_arg(argv[++i]));
            printf("m %d %d\n", rc, rc ? -1 : keep(p));
        } else if (!strcmp(op, "M") && i + 1 < argc) {
            rc = cudaMallocManaged(&p, size_arg(argv[++i]), cudaMemAttachGlobal);
            printf("M %d %d\n", rc, rc ? -1 : keep(p));
        } else if (!strcmp(op, "a") && i + 1 < argc) {
            rc = cudaMallocAsync(&p, size_arg(argv[++i]), 0);
            printf("a %d %d\n", rc, rc ? -1 : keep(p));
        } else if (!strcmp(op, "A") && i + 1 < argc) {
            rc = cudaMallocAsync(&p, size_arg(argv[++i]), cudaStreamPerThread);
            printf("A %d %d\n", rc, rc ? -1 : keep(p));
        } else if (!strcmp(op, "p") && i + 2 < argc) {
            size_t pitch = 0, w = size_arg(argv[i + 1]), h = size_arg(argv[i + 2]);
            i += 2;
            rc = cudaMallocPitch(&p, &pitch, w, h);
            printf("p %d %d %zu\n", rc, rc ? -1 : keep(p), pitch);
        } else if (!strcmp(op, "D") && i + 3 < argc) {
            struct cudaPitchedPtr pp = {0};
            struct cudaExtent e = {size_arg(argv[i + 1]), size_arg(argv[i + 2]), size_arg(argv[i + 3])};
            i += 3;
            rc = cudaMalloc3D(&pp, e);
            printf("D %d %d %zu\n", rc, rc ? -1 : keep(pp.ptr), pp.pitch);
        } else if ((!strcmp(op, "f") || !strcmp(op, "F") || !strcmp(op, "G") || !strcmp(op, "x")) &&
                   i + 1 < argc) {
            int s = atoi(argv[++i]);
            if (s < 0 || s >= nslots) {
                fprintf(stderr, "cudaops: no slot %d\n", s);
                return 2;
            }
            rc = op[0] == 'F'   ? cudaFreeAsync(slot[s], 0)
                 : op[0] == 'G' ? cudaFreeAsync(slot[s], cudaStreamPerThread)
                                : cudaFree(slot[s]);
            printf("%s %d\n", op, rc);
        } else if (!strcmp(op, "h") && i + 1 < argc) {
            size_t size = size_arg(argv[++i]);
            p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) {
                fprintf(stderr, "cudaops: no %zu bytes of host memory\n", size);
                return 2;
            }
            rc = cudaHostRegister(p, size, cudaHostRegisterMapped);
            printf("h %d %d\n", rc, rc ? -1 : keep(p));
        } else if (!strcmp(op, "u") && i + 1 < argc) {
            int s = atoi(argv[++i]);
            if (s < 0 || s >= nslots) {
                fprintf(stderr, "cudaops: no slot %d\n", s);
                return 2;
            }
            printf("u %d\n", cudaHostUnregister(slot[s]));
        } else if (!strcmp(op, "n")) {
            printf("n %d\n", cudaFree(NULL));
        } else if (!strcmp(op, "N")) {
            printf("N %d\n", cudaFreeAsync(NULL, 0));
        } else if (!strcmp(op, "i")) {
            size_t free = 0, total = 0;
            rc = cudaMemGetInfo(&free, &total);
            printf("i %d %zu %zu\n", rc, free, total);
        } else if (!strcmp(op, "I")) {
            printf("I %d\n", cudaMemGetInfo(NULL, NULL));
        } else if (!strcmp(op, "d") && i + 1 < argc) {
            printf("d %d\n", cudaSetDevice(atoi(argv[++i])));
        } else if (!strcmp(op, "r")) {
            printf("r %d\n", cudaDeviceReset());
        } else if (!strcmp(op, "s")) {
            printf("s %d\n", cudaDeviceSynchronize());
        } else if (!strcmp(op, "R") && i + 2 < argc) {
            int n = atoi(argv[i + 1]), ok = 0, refused = 0;
            size_t size = size_arg(argv[i + 2]);
            i += 2;
            for (int k = 0; k < n; k++) {
                if (cudaMalloc(&p, size) == cudaSuccess) {
                    ok++;
                    cudaFree(p);
                } else {
                    refused++;
                }
            }
            printf("R %d %d\n", ok, refused);
        } else if (!strcmp(op, "T")) {
            printf("T %d\n", threads());
        } else if (!strcmp(op, "c")) {
            if (!&ctor_block) {
                fprintf(stderr, "cudaops: not linked with ctorlib\n");
                return 2;
            }
            printf("c %d\n", cudaFree(ctor_block));
        } else if (!strcmp(op, "e")) {
            const char *addr = getenv("EAGER_BLOCK");
            if (!addr) {
                fprintf(stderr, "cudaops: no EAGER_BLOCK (the core is not eagercore)\n");
                return 2;
            }
            printf("e %d\n", cudaFree((void *)(uintptr_t)strtoull(addr, NULL, 16)));
        } else if (!strcmp(op, "L")) {
            printf("L %d\n", core_loaded());
        } else if (!strcmp(op, "U") && i + 1 < argc) {
            printf("U %d\n", unsetenv(argv[++i]));
        } else {
            fprintf(stderr, "cudaops: bad operation %s\n", op);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
