/*
 * peercopy: allocates 4 MiB on device 0 and fills it, then copies its first
 * 4 KiB to the host while device 1 is current, as a multi-GPU program that
 * forgets to switch back does; prints "malloc RC", "memset RC" and
 * "copy RC BYTE" (BYTE: the copied value, 7 when it arrived).
 */
#include <stdio.h>
#include <string.h>

#include <spillway/cuda_runtime.h>

int main(void)
{
    static unsigned char buf[4096];
    void *p = NULL;
    cudaError_t rc = cudaSetDevice(0);
    if (rc == cudaSuccess)
        rc = cudaMalloc(&p, 4 << 20);
    printf("malloc %d\n", rc);
    if (rc == cudaSuccess && (rc = cudaMemset(p, 7, 4 << 20)) == cudaSuccess)
        rc = cudaDeviceSynchronize(); /* device 1's stream does not wait for device 0's */
    printf("memset %d\n", rc);
    if (cudaSetDevice(1) != cudaSuccess)
        return 2;
    rc = cudaMemcpy(buf, p, sizeof buf, cudaMemcpyDeviceToHost);
    printf("copy %d %d\n", rc, buf[100]);
    return 0;
}
