/* ctorhook.c: a library whose constructor calls the program's during_dlopen, if it has one. */
#include <dlfcn.h>

__attribute__((constructor)) static void hook(void)
{
    void (*f)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "during_dlopen");
    if (f)
        f();
}
