/*
 * reload: allocates through the runtime, unloads it (dlclose), occupies the
 * addresses it had, loads it again (at new addresses) and allocates again.
 * Prints "first RC", "moved 0|1" (whether the runtime's code is now
 * elsewhere) and "second RC". cudaMalloc is the global one when there is
 * one (a preloaded shim's), else the runtime's own.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <sys/mman.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);

static int allocate(void *rt)
{
    void *global = dlsym(RTLD_DEFAULT, "cudaMalloc");
    malloc_fn cuda_malloc = (malloc_fn)(global ? global : dlsym(rt, "cudaMalloc"));
    free_fn cuda_free = (free_fn)(global ? dlsym(RTLD_DEFAULT, "cudaFree") : dlsym(rt, "cudaFree"));
    void *p = NULL;
    if (!cuda_malloc || !cuda_free)
        return -1;
    int rc = cuda_malloc(&p, 1 << 20);
    if (rc == 0)
        rc = cuda_free(p);
    return rc;
}

int main(void)
{
    void *rt = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    if (!rt)
        return 2;
    void *before = dlsym(rt, "cudaGetDevice");
    printf("first %d\n", allocate(rt));
    Dl_info info;
    if (!dladdr(before, &info) || dlclose(rt) != 0)
        return 2;
    /* Take the runtime's old place, page by page, so the next load lands elsewhere. */
    for (size_t i = 0; i < 4096; i++)
        mmap((char *)info.dli_fbase + (i << 12), 4096, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    rt = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    if (!rt)
        return 2;
    printf("moved %d\n", dlsym(rt, "cudaGetDevice") != before);
    fflush(stdout);
    printf("second %d\n", allocate(rt));
    return 0;
}
