/*
 * dlsym.c: the front's dlsym. A program, or a library such as a static CUDA
 * runtime, that finds CUDA's functions with dlsym(handle, "name") on its own
 * handle of libcuda or libcudart, or of any library that depends on them
 * (whose lookup finds them among its dependencies), gets the front's
 * function for every name the front interposes, as a program linked
 * against them does (and for NVML, libnvidia-ml, likewise); every other
 * lookup is the real dlsym's.
 *
 * glibc resolves dlsym(RTLD_NEXT, ...) relative to the object that called
 * dlsym, found from its return address. So dlsym is a trampoline: it asks
 * front_dlsym_answer (C) whether the front answers the lookup; if not, it
 * jumps to the real dlsym with the caller's arguments and return address
 * untouched, so the real one sees the true caller. The real dlsym is looked
 * up by version (dlvsym), never through dlsym itself.
 *
 * dlclose of one of those libraries counts in front_unloads: a library
 * loaded again lands at other addresses, and the front finds its real
 * functions anew (a count, read once per call, instead of walking the
 * loaded objects at every call).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <string.h>

#include "dlsym.h"

/* Elsewhere than on x86-64 there is no trampoline yet: dlsym is the C library's alone. */
#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        ".cfi_startproc\n"
        "    endbr64\n"
        "    pushq %rdi\n"
        ".cfi_adjust_cfa_offset 8\n"
        "    pushq %rsi\n"
        ".cfi_adjust_cfa_offset 8\n"
        "    subq $8, %rsp\n" /* the stack 16-byte aligned for the calls */
        ".cfi_adjust_cfa_offset 8\n"
        "    call front_dlsym_answer\n"
        "    testq %rax, %rax\n"
        "    jnz 1f\n"
        "    call front_real_dlsym\n"
        "    addq $8, %rsp\n"
        ".cfi_adjust_cfa_offset -8\n"
        "    popq %rsi\n"
        ".cfi_adjust_cfa_offset -8\n"
        "    popq %rdi\n"
        ".cfi_adjust_cfa_offset -8\n"
        "    jmp *%rax\n" /* the real dlsym, returning to our caller */
        "1:\n"
        ".cfi_adjust_cfa_offset 24\n"
        "    addq $24, %rsp\n"
        ".cfi_adjust_cfa_offset -24\n"
        "    ret\n"
        ".cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#endif

/* The C library's name, by its versions, newest first; NULL where it has neither. */
static void *libc_function(const char *name)
{
    void *f = dlvsym(RTLD_NEXT, name, "GLIBC_2.34");
    return f ? f : dlvsym(RTLD_NEXT, name, "GLIBC_2.2.5");
}

typedef void *(*dlsym_fn)(void *handle, const char *name);

static void *no_dlsym(void *handle, const char *name)
{
    (void)handle;
    (void)name;
    return NULL;
}

/* The C library's dlsym. */
__attribute__((visibility("hidden"))) void *front_real_dlsym(void)
{
    static dlsym_fn real;
    dlsym_fn f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
    if (f)
        return (void *)f;
    f = (dlsym_fn)libc_function("dlsym");
    if (!f)
        f = no_dlsym;
    __atomic_store_n(&real, f, __ATOMIC_RELEASE);
    return (void *)f;
}

void *front_dlsym_real(void *handle, const char *name)
{
    return ((dlsym_fn)front_real_dlsym())(handle, name);
}

typedef int (*dlclose_fn)(void *handle);

static int no_dlclose(void *handle)
{
    (void)handle;
    return -1;
}

int front_dlclose_real(void *handle)
{
    static dlclose_fn real;
    dlclose_fn f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (dlclose_fn)libc_function("dlclose");
        if (!f)
            f = no_dlclose;
        __atomic_store_n(&real, f, __ATOMIC_RELEASE);
    }
    return f(handle);
}

unsigned int front_unloads;

/* The prefix of the CUDA library whose file is at path, or NULL. */
static const char *cuda_library(const char *path)
{
    static const char *const libraries[] = {"libcuda.", "libcudart", "libnvidia-ml"};
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (size_t i = 0; i < sizeof libraries / sizeof libraries[0]; i++)
        if (strncmp(base, libraries[i], strlen(libraries[i])) == 0)
            return libraries[i];
    return NULL;
}

/* Whether handle is one of dlopen's handles of libcuda, libcudart or libnvidia-ml. */
static int cuda_handle(void *handle)
{
    struct link_map *map = NULL;
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT || dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 ||
        !map || !map->l_name)
        return 0;
    return cuda_library(map->l_name) != NULL;
}

__attribute__((visibility("hidden"))) const char *front_library_holding(void *f)
{
    Dl_info info;
    return f && dladdr(f, &info) && info.dli_fname ? cuda_library(info.dli_fname) : NULL;
}

static __thread int answering __attribute__((tls_model("initial-exec")));

/*
 * The front's function for a lookup of one of its names on a handle, when
 * the real dlsym would return the very function of a CUDA library that
 * the front calls for it; NULL otherwise (the real dlsym answers).
 * RTLD_DEFAULT finds the front's own functions first; RTLD_NEXT must stay
 * the real dlsym's, relative to its caller.
 */
__attribute__((visibility("hidden"))) void *front_dlsym_answer(void *handle, const char *name)
{
    if (answering || !name || !((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0) ||
        handle == RTLD_DEFAULT || handle == RTLD_NEXT)
        return NULL;
    answering = 1;
    void *answer = NULL;
    void *found = front_dlsym_real(handle, name);
    const char *library = front_library_holding(found);
    if (library)
        answer = front_wrapper_of(found, library);
    answering = 0;
    return answer;
}

__attribute__((visibility("default"))) int dlclose(void *handle)
{
    int cuda = cuda_handle(handle);
    int rc = front_dlclose_real(handle);
    if (rc == 0 && cuda)
        __atomic_fetch_add(&front_unloads, 1, __ATOMIC_RELEASE);
    return rc;
}
