/*
 * olddriver.c: a driver (built as libcuda.so.1) of an old release, with
 * cuMemFree_v2 and none of the other functions the shim interposes.
 */
typedef unsigned long long CUdeviceptr;

int cuMemFree_v2(CUdeviceptr dptr)
{
    (void)dptr;
    return 0;
}
