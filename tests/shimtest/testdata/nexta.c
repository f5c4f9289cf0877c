/* nexta: whoami, and the whoami that dlsym(RTLD_NEXT) finds after this library. */
#include <dlfcn.h>

const char *whoami(void)
{
    return "nexta";
}

const char *next_whoami(void)
{
    const char *(*next)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "whoami");
    return next ? next() : "none";
}
