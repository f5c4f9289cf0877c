/* A program that reaches cudaMalloc by name without any CUDA runtime
 * loaded: the shim must answer with an error, not crash or recurse. */
#include <dlfcn.h>
#include <stdio.h>
#include <stddef.h>

int main(void)
{
    int (*cuda_malloc)(void **, size_t) = (int (*)(void **, size_t))dlsym(RTLD_DEFAULT, "cudaMalloc");
    if (!cuda_malloc) {
        printf("absent\n");
        return 0;
    }
    void *p = NULL;
    printf("m %d\n", cuda_malloc(&p, 4096));
    return 0;
}
