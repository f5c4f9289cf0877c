/*
 * eagercore: a core that allocates while it loads. It is libspillway-core.so
 * (a dependency: the front finds the core's entry points through this
 * object) plus a constructor that calls cudaMalloc on the loading thread,
 * as a library pulled in with the core might. The front passes that call
 * through and keeps it in its early ledger, which the core adopts when it
 * starts. The block's address goes to EAGER_BLOCK, for cudaops's "e".
 */
#include <stdio.h>
#include <stdlib.h>

#include <spillway/cuda_runtime.h>

__attribute__((constructor)) static void allocate_while_loading(void)
{
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, 512 << 10);
    char addr[32];
    snprintf(addr, sizeof addr, "%p", p);
    setenv("EAGER_BLOCK", addr, 1);
    printf("eager %d\n", rc);
    fflush(stdout);
}
