/* dlapp LIB SIZE...: dlopens LIB (which links the CUDA runtime) with
 * RTLD_LOCAL and allocates each SIZE through it, keeping the blocks. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlapp: %s\n", dlerror());
        return 2;
    }
    /* The runtime must be invisible from the global scope. */
    printf("global %d\n", dlsym(RTLD_DEFAULT, "cudaGetDevice") != NULL);
    int (*user_malloc)(size_t, void **) = (int (*)(size_t, void **))dlsym(h, "user_malloc");
    for (int i = 2; i < argc; i++) {
        void *p = NULL;
        printf("m %d\n", user_malloc((size_t)strtoull(argv[i], NULL, 10), &p));
    }
    return 0;
}
