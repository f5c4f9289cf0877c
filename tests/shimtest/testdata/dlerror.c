/*
 * dlerror LIB NAME: opens LIB, clears dlerror, looks NAME up with dlsym on
 * its handle and prints "found 1" when it has an answer, then "error" and
 * what dlerror says afterwards ("none" when nothing), as a program that
 * checks a lookup the way POSIX describes would see it.
 */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 2;
    }
    dlerror();
    void *f = dlsym(h, argv[2]);
    const char *e = dlerror();
    printf("found %d\n", f != NULL);
    printf("error %s\n", e ? e : "none");
    return 0;
}
