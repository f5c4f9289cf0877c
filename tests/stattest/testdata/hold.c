/*
 * hold: allocates on device DEV, frees the first FREED blocks, says
 * "ready", then holds the rest until its standard input closes. A size
 * written vSIZE is physical memory the program creates itself
 * (cuMemCreate, on device DEV), never freed; one written ?SIZE may be
 * refused: the refusal is said on standard error ("hold: cudaMalloc of SIZE
 * refused: RC") and hold goes on.
 *
 *   hold DEV FREED SIZE...   -> "ready" once allocated
 *
 * Exit status 1 when an allocation fails, 2 for a bad command line.
 */
#include <stdio.h>
#include <stdlib.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

/* create makes size bytes of physical memory on device dev. */
static int create(int dev, size_t size)
{
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CUmemGenericAllocationHandle h;
    return cuMemCreate(&h, size, &prop, 0) == CUDA_SUCCESS;
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    int dev = atoi(argv[1]), freed = atoi(argv[2]);
    if (cudaSetDevice(dev) != cudaSuccess || cudaFree(0) != cudaSuccess)
        return 1;
    void *p[64];
    int n = 0;
    for (int i = 3; i < argc && n < 64; i++) {
        if (argv[i][0] == 'v') {
            if (!create(dev, strtoull(argv[i] + 1, NULL, 10))) {
                fprintf(stderr, "hold: cuMemCreate of %s failed\n", argv[i] + 1);
                return 1;
            }
            continue;
        }
        int may_fail = argv[i][0] == '?';
        const char *size = argv[i] + may_fail;
        cudaError_t rc = cudaMalloc(&p[n], strtoull(size, NULL, 10));
        if (rc != cudaSuccess && may_fail) {
            fprintf(stderr, "hold: cudaMalloc of %s refused: %d\n", size, (int)rc);
            continue;
        }
        if (rc != cudaSuccess) {
            fprintf(stderr, "hold: cudaMalloc of %s failed\n", size);
            return 1;
        }
        n++;
    }
    for (int i = 0; i < freed && i < n; i++)
        if (cudaFree(p[i]) != cudaSuccess)
            return 1;
    printf("ready\n");
    fflush(stdout);
    while (getchar() != EOF)
        ;
    return 0;
}
