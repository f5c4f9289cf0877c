/*
 * ipcshare: shares a device allocation with another process by CUDA IPC, as
 * torch.multiprocessing does: the handle of the allocation, and the
 * pointer's offset from the start of its address range.
 *
 *   ipcshare export  allocates two blocks of 4 KiB with cuMemAlloc_v2 in
 *                    device 0's primary context, fills each with its own
 *                    pattern, asks cuIpcGetMemHandle for the first and for
 *                    the second (also as cuGetProcAddress and dlsym hand it
 *                    out), and prints "export RC_FIRST RC RC_PROC RC_DLSYM
 *                    CAPABLE CAPABLES OFFSET HANDLE RETAIN", CAPABLE and CAPABLES
 *                    the second's CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
 *                    from cuPointerGetAttribute and cuPointerGetAttributes
 *                    (-1 where the call failed), OFFSET the second's
 *                    address less its range's start
 *                    (cuMemGetAddressRange_v2), HANDLE the second's in hex,
 *                    RETAIN what cuMemRetainAllocationHandle answers for
 *                    the second; then frees both at the end of its input.
 *   ipcshare import OFFSET HANDLE
 *                    opens the handle and reads 4 KiB at OFFSET into it:
 *                    "import RC SECOND FIRST", how many bytes match the
 *                    second block's pattern and the first's.
 *   ipcshare rtexport
 *                    the same through the runtime, as PyTorch shares a
 *                    tensor: two blocks from cudaMalloc, then
 *                    cudaIpcGetMemHandle of the second: "rtexport RC LAST
 *                    OFFSET HANDLE", LAST what cudaGetLastError says after
 *                    it; then frees both at the end of its input.
 *   ipcshare rtimport OFFSET HANDLE
 *                    cudaIpcOpenMemHandle, 4 KiB read at OFFSET into it and
 *                    cudaIpcCloseMemHandle: "rtimport RC SECOND FIRST CLOSE".
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#define BLOCK 4096

typedef CUresult (*ipc_get_fn)(CUipcMemHandle *, CUdeviceptr);

static unsigned char pattern(size_t i, int second)
{
    return (unsigned char)(second ? i * 13 + 5 : i * 7 + 1);
}

static void primary_context(void)
{
    CUcontext ctx;
    CUresult rc;
    if ((rc = cuInit(0)) != CUDA_SUCCESS || (rc = cuDevicePrimaryCtxRetain(&ctx, 0)) != CUDA_SUCCESS ||
        (rc = cuCtxSetCurrent(ctx)) != CUDA_SUCCESS) {
        fprintf(stderr, "ipcshare: no primary context on device 0: %d\n", rc);
        exit(2);
    }
}

static CUdeviceptr filled_block(int second)
{
    unsigned char buf[BLOCK];
    CUdeviceptr p = 0;
    for (size_t i = 0; i < BLOCK; i++)
        buf[i] = pattern(i, second);
    if (cuMemAlloc_v2(&p, BLOCK) != CUDA_SUCCESS || cuMemcpyHtoD_v2(p, buf, BLOCK) != CUDA_SUCCESS) {
        fprintf(stderr, "ipcshare: cannot allocate and fill a block\n");
        exit(2);
    }
    return p;
}

/* cuIpcGetMemHandle as cuGetProcAddress (lookup 0) or dlsym (lookup 1) hands it out. */
static ipc_get_fn looked_up(int lookup)
{
    void *fn = NULL;
    if (lookup == 0) {
        if (cuGetProcAddress("cuIpcGetMemHandle", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT) != CUDA_SUCCESS)
            fn = NULL;
    } else {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        fn = lib ? dlsym(lib, "cuIpcGetMemHandle") : NULL;
    }
    if (!fn) {
        fprintf(stderr, "ipcshare: no cuIpcGetMemHandle from %s\n", lookup ? "dlsym" : "cuGetProcAddress");
        exit(2);
    }
    return (ipc_get_fn)fn;
}

/* The pointer's CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE as
 * cuPointerGetAttribute (attributes 0) or cuPointerGetAttributes reports
 * it; -1 where the call fails. */
static int ipc_capable(CUdeviceptr p, int attributes)
{
    CUpointer_attribute which = CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE;
    int capable = -1;
    void *data = &capable;
    CUresult rc = attributes ? cuPointerGetAttributes(1, &which, &data, p)
                             : cuPointerGetAttribute(&capable, which, p);
    return rc == CUDA_SUCCESS ? capable : -1;
}

static void print_handle(const char *handle)
{
    for (size_t i = 0; i < CU_IPC_HANDLE_SIZE; i++)
        printf("%02x", (unsigned char)handle[i]);
}

/* Fills handle (CU_IPC_HANDLE_SIZE bytes) from hex; exits on a malformed one. */
static void parse_handle(const char *hex, char *handle)
{
    if (strlen(hex) != 2 * CU_IPC_HANDLE_SIZE) {
        fprintf(stderr, "ipcshare: a handle is %d hex digits, not %zu\n", 2 * CU_IPC_HANDLE_SIZE,
                strlen(hex));
        exit(2);
    }
    for (size_t i = 0; i < CU_IPC_HANDLE_SIZE; i++) {
        unsigned int byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1) {
            fprintf(stderr, "ipcshare: %s is not a handle in hex\n", hex);
            exit(2);
        }
        handle[i] = (char)byte;
    }
}

static void wait_for_end_of_input(void)
{
    char line[64];
    while (fgets(line, sizeof line, stdin) != NULL)
        ;
}

static int export(void)
{
    CUipcMemHandle first_handle, handle, again;
    CUdeviceptr start = 0;
    size_t size = 0;

    primary_context();
    CUdeviceptr first = filled_block(0), second = filled_block(1);
    CUresult rc_first = cuIpcGetMemHandle(&first_handle, first);
    memset(&handle, 0, sizeof handle);
    CUresult rc = cuIpcGetMemHandle(&handle, second);
    CUresult rc_proc = looked_up(0)(&again, second);
    CUresult rc_dlsym = looked_up(1)(&again, second);
    if (cuMemGetAddressRange_v2(&start, &size, second) != CUDA_SUCCESS) {
        fprintf(stderr, "ipcshare: no address range for the second block\n");
        return 2;
    }
    printf("export %d %d %d %d %d %d %llu ", rc_first, rc, rc_proc, rc_dlsym, ipc_capable(second, 0),
           ipc_capable(second, 1), (unsigned long long)(second - start));
    print_handle(handle.reserved);
    CUmemGenericAllocationHandle retained;
    CUresult rc_retain = cuMemRetainAllocationHandle(&retained, (void *)(uintptr_t)second);
    if (rc_retain == CUDA_SUCCESS)
        cuMemRelease(retained);
    printf(" %d\n", rc_retain);
    fflush(stdout);
    wait_for_end_of_input();
    return cuMemFree_v2(second) == CUDA_SUCCESS && cuMemFree_v2(first) == CUDA_SUCCESS ? 0 : 1;
}

static int import(const char *offset, const char *hex)
{
    CUipcMemHandle handle;
    CUdeviceptr opened = 0;
    unsigned char buf[BLOCK];
    size_t second = 0, first = 0;

    primary_context();
    parse_handle(hex, handle.reserved);
    CUresult rc = cuIpcOpenMemHandle_v2(&opened, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (rc == CUDA_SUCCESS)
        rc = cuMemcpyDtoH_v2(buf, opened + strtoull(offset, NULL, 10), BLOCK);
    for (size_t i = 0; rc == CUDA_SUCCESS && i < BLOCK; i++) {
        second += buf[i] == pattern(i, 1);
        first += buf[i] == pattern(i, 0);
    }
    printf("import %d %zu %zu\n", rc, second, first);
    if (opened)
        cuIpcCloseMemHandle(opened);
    return 0;
}

/* A block from cudaMalloc holding its pattern. */
static char *runtime_block(int second)
{
    unsigned char buf[BLOCK];
    void *p = NULL;
    for (size_t i = 0; i < BLOCK; i++)
        buf[i] = pattern(i, second);
    if (cudaMalloc(&p, BLOCK) != cudaSuccess ||
        cudaMemcpy(p, buf, BLOCK, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "ipcshare: cannot allocate and fill a block with the runtime\n");
        exit(2);
    }
    return p;
}

static int runtime_export(void)
{
    cudaIpcMemHandle_t handle;
    CUdeviceptr start = 0;
    size_t size = 0;

    char *first = runtime_block(0), *second = runtime_block(1);
    memset(&handle, 0, sizeof handle);
    cudaError_t rc = cudaIpcGetMemHandle(&handle, second);
    cudaError_t last = cudaGetLastError();
    if (cuMemGetAddressRange_v2(&start, &size, (CUdeviceptr)second) != CUDA_SUCCESS) {
        fprintf(stderr, "ipcshare: no address range for the second block\n");
        return 2;
    }
    printf("rtexport %d %d %llu ", rc, last, (unsigned long long)((CUdeviceptr)second - start));
    print_handle(handle.reserved);
    printf("\n");
    fflush(stdout);
    wait_for_end_of_input();
    return cudaFree(second) == cudaSuccess && cudaFree(first) == cudaSuccess ? 0 : 1;
}

static int runtime_import(const char *offset, const char *hex)
{
    cudaIpcMemHandle_t handle;
    char *opened = NULL;
    unsigned char buf[BLOCK];
    size_t second = 0, first = 0;

    parse_handle(hex, handle.reserved);
    cudaError_t rc = cudaIpcOpenMemHandle((void **)&opened, handle, cudaIpcMemLazyEnablePeerAccess);
    if (rc == cudaSuccess)
        rc = cudaMemcpy(buf, opened + strtoull(offset, NULL, 10), BLOCK, cudaMemcpyDeviceToHost);
    for (size_t i = 0; rc == cudaSuccess && i < BLOCK; i++) {
        second += buf[i] == pattern(i, 1);
        first += buf[i] == pattern(i, 0);
    }
    cudaError_t closed = opened ? cudaIpcCloseMemHandle(opened) : cudaErrorInvalidValue;
    printf("rtimport %d %zu %zu %d\n", rc, second, first, closed);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "export") == 0)
        return export();
    if (argc == 4 && strcmp(argv[1], "import") == 0)
        return import(argv[2], argv[3]);
    if (argc == 2 && strcmp(argv[1], "rtexport") == 0)
        return runtime_export();
    if (argc == 4 && strcmp(argv[1], "rtimport") == 0)
        return runtime_import(argv[2], argv[3]);
    fprintf(stderr, "usage: %s export | import OFFSET HANDLE | rtexport | rtimport OFFSET HANDLE\n",
            argv[0]);
    return 2;
}
