/*
 * real.c: the real functions. Each is found at its first use, where RTLD_NEXT
 * finds it or, for a library loaded RTLD_LOCAL, in that library's own scope,
 * and found anew after a CUDA library was closed (dlsym.c counts the closings).
 * The table they fill is the one the core calls through. The driver's lookup
 * (cuGetProcAddress, cudaGetDriverEntryPoint) and dlsym (dlsym.c) hand out the
 * front's function in place of a real one the front interposes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <string.h>

#include "front.h"

/* ---- finding the real functions ---- */

static int in_self(const void *addr)
{
    Dl_info self, other;
    return dladdr((const void *)in_self, &self) && dladdr(addr, &other) &&
           self.dli_fbase == other.dli_fbase;
}

#define MAX_CANDIDATES 4

struct candidates {
    int n;
    char path[MAX_CANDIDATES][PATH_MAX];
};

/* The library a name lives in: libcudart for cuda*, libnvidia-ml for nvml*, libcuda for cu*. */
static const char *library_of(const char *name)
{
    if (strncmp(name, "cuda", 4) == 0)
        return "libcudart";
    return strncmp(name, "nvml", 4) == 0 ? "libnvidia-ml" : "libcuda.";
}

struct search {
    const char *library; /* the file name's prefix */
    struct candidates found;
};

static int collect_library(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct search *s = data;
    struct candidates *c = &s->found;
    const char *base = strrchr(info->dlpi_name, '/');
    base = base ? base + 1 : info->dlpi_name;
    if (strncmp(base, s->library, strlen(s->library)) == 0 && c->n < MAX_CANDIDATES &&
        strlen(info->dlpi_name) < PATH_MAX)
        strcpy(c->path[c->n++], info->dlpi_name);
    return 0;
}

/*
 * RTLD_NEXT finds the runtime (or the driver) in the global scope. One
 * loaded with RTLD_LOCAL (Python extension modules, ctypes) is not there:
 * find it among the loaded objects and look the name up in its own scope.
 */
void *find_real(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (f && !in_self(f))
        return f;
    struct search s = {.library = library_of(name)};
    dl_iterate_phdr(collect_library, &s); /* no dlopen inside the callback */
    for (int i = 0; i < s.found.n; i++) {
        void *h = dlopen(s.found.path[i], RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            continue;
        f = front_dlsym_real(h, name);
        front_dlclose_real(h);
        if (f && !in_self(f))
            return f;
    }
    return NULL;
}

struct spillway_real real = {.size = sizeof(struct spillway_real)};

const char *const real_names[] = {
#define SPILLWAY_REAL(ret, field, name, params) #name,
#define SPILLWAY_INTERPOSED SPILLWAY_REAL
#include "calls.h"
};

/*
 * After a CUDA library was closed, every real function is found anew: one
 * loaded again lies elsewhere, and the core calls through the same table.
 * No lock is held over the look-ups: they take the dynamic loader's lock,
 * which a thread inside dlopen holds while a constructor it runs calls CUDA
 * (and refreshes too), so a lock here would deadlock the two threads.
 * Threads refreshing at once store the same answers; one whose look-ups may
 * predate a later closing sees the count move and looks again, so its
 * answers never outlast a newer refresh's. It returns the count its
 * answers are for.
 */
__attribute__((noinline, cold)) unsigned int refresh_real(unsigned int unloads)
{
    for (;;) {
        for (int i = 0; i < R_COUNT; i++)
            if (__atomic_load_n(real_slot(i), __ATOMIC_ACQUIRE))
                __atomic_store_n(real_slot(i), find_real(real_names[i]), __ATOMIC_RELEASE);
        unsigned int now = __atomic_load_n(&front_unloads, __ATOMIC_ACQUIRE);
        if (now == unloads)
            return now;
        unloads = now;
    }
}

unsigned int real_refreshed;

static const char *library_description(const char *name)
{
    const char *library = library_of(name);
    if (strcmp(library, "libcudart") == 0)
        return "CUDA runtime (libcudart)";
    return strcmp(library, "libcuda.") == 0 ? "CUDA driver (libcuda)" : "NVML (libnvidia-ml)";
}

/* The error both APIs give for a missing function: cudaErrorSymbolNotFound, CUDA_ERROR_NOT_FOUND. */
#define NOT_FOUND 500
_Static_assert(NOT_FOUND == cudaErrorSymbolNotFound && NOT_FOUND == CUDA_ERROR_NOT_FOUND,
               "one code for a missing function");

/* Said once for each function: each is one the program called. Where its library is loaded,
 * the library is older than the function (a driver without cuMemCreate), and is named. */
int missing_real(int i)
{
    static atomic_int told[R_COUNT];
    if (atomic_exchange(&told[i], 1))
        return NOT_FOUND;
    struct search s = {.library = library_of(real_names[i])};
    dl_iterate_phdr(collect_library, &s);
    if (s.found.n > 0)
        log_line("cannot find the real %s: the %s loaded in this process, %s, has no such "
                 "function (older than it?); the call fails with error %d "
                 "(cudaErrorSymbolNotFound, CUDA_ERROR_NOT_FOUND)",
                 real_names[i], library_description(real_names[i]), s.found.path[0], NOT_FOUND);
    else
        log_line("cannot find the real %s: no %s is loaded in this process; the call fails with "
                 "error %d (cudaErrorSymbolNotFound, CUDA_ERROR_NOT_FOUND)",
                 real_names[i], library_description(real_names[i]), NOT_FOUND);
    return NOT_FOUND;
}

/* ---- the driver's lookup ---- */

/* Every interposed function, by its index in the real table. */
static const struct {
    int index;
    void *wrapper;
} interposed[] = {
#define SPILLWAY_INTERPOSED(ret, field, name, params) {R_##field, (void *)name},
#include "calls.h"
};

/*
 * The front's function standing for the real function f, or NULL; driver_only: among the driver's.
 * Where f lies in a CUDA library (library, front_library_holding's answer; NULL: none), only that
 * library's functions are compared: resolving one of a
 * library the process has not loaded searches every loaded object again at each lookup, which
 * cost tens of microseconds per cuGetProcAddress (the runtime makes hundreds as it starts).
 */
static void *wrapper_of(void *f, const char *library, int driver_only)
{
    for (size_t i = 0; f && i < sizeof interposed / sizeof interposed[0]; i++) {
        const char *name = real_names[interposed[i].index];
        if (driver_only && strncmp(name, "cuda", 4) == 0)
            continue;
        if (library && strcmp(library_of(name), library) != 0)
            continue;
        if (resolve(interposed[i].index) == f)
            return interposed[i].wrapper;
    }
    return NULL;
}

void *front_wrapper_of(void *f, const char *library)
{
    return wrapper_of(f, library, 0);
}

/*
 * Exchanges a real function the driver handed out for the front's version
 * of it. The match is by the pointer, so the version and the stream
 * semantics the caller asked for are the ones it gets: a function the front
 * does not interpose (an older version, another variant) stays the
 * driver's.
 */
static void exchange_real(void **pfn)
{
    void *wrapper = pfn && *pfn ? wrapper_of(*pfn, front_library_holding(*pfn), 1) : NULL;
    if (wrapper)
        *pfn = wrapper;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    REAL(real_get_proc_address, cu_get_proc_address);
    CUresult rc = real_get_proc_address(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS)
        exchange_real(pfn);
    return rc;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    REAL(real_get_proc_address, cu_get_proc_address_v2);
    CUresult rc = real_get_proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS)
        exchange_real(pfn);
    return rc;
}

EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
                                           unsigned long long flags,
                                           enum cudaDriverEntryPointQueryResult *driverStatus)
{
    REAL(real_entry_point, get_driver_entry_point);
    cudaError_t rc = real_entry_point(symbol, funcPtr, flags, driverStatus);
    if (rc == cudaSuccess)
        exchange_real(funcPtr);
    return rc;
}

EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                                    unsigned int cudaVersion,
                                                    unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *driverStatus)
{
    REAL(real_entry_point, get_driver_entry_point_by_version);
    cudaError_t rc = real_entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus);
    if (rc == cudaSuccess)
        exchange_real(funcPtr);
    return rc;
}

/* Every interposed function has exactly the type of its row in calls.h. */
#define SPILLWAY_INTERPOSED(ret, field, name, params)                                          \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), __typeof__(real.field)),     \
                   #name " differs from its row in calls.h");
#include "calls.h"
