/*
 * olddrivercall DRIVER NAME...: loads DRIVER (a libcuda.so.1) into the global
 * scope, as a program linked with -lcuda has it, and calls each NAME found
 * there, a driver function taking no argument that matters here: prints
 * "NAME RC", or "NAME absent" when the process has no such function.
 */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*call_fn)(void *, void *, void *, void *, void *);

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        call_fn f = (call_fn)dlsym(RTLD_DEFAULT, argv[i]);
        if (!f) {
            printf("%s absent\n", argv[i]);
            continue;
        }
        char scratch[256] = {0};
        printf("%s %d\n", argv[i], f(scratch, scratch, scratch, scratch, scratch));
        fflush(stdout);
    }
    return 0;
}
