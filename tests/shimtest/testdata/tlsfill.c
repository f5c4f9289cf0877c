/*
 * tlsfill DIR N [cudaops arguments...]: dlopens DIR/hog0.so ... DIR/hog<N-1>.so
 * (copies of tlshog.c) until one fails, which means the static TLS surplus
 * is used up, prints "hogs LOADED", then makes one cudaMalloc.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <spillway/cuda_runtime.h>

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    int n = atoi(argv[2]), loaded = 0;
    char path[4096];
    for (; loaded < n; loaded++) {
        snprintf(path, sizeof path, "%s/hog%d.so", argv[1], loaded);
        if (!dlopen(path, RTLD_NOW))
            break;
    }
    printf("hogs %d\n", loaded);
    void *p = NULL;
    printf("m %d\n", cudaMalloc(&p, 4096));
    return 0;
}
