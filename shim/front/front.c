/*
 * front.c: libspillway.so, the object users put in LD_PRELOAD.
 *
 * It defines the interposed CUDA runtime, driver and NVML functions (the
 * list is interpose/calls.h), dlsym and dlclose (dlsym.c), the probe points
 * and their semaphore, and nothing else (everything else is hidden). It has
 * no constructor: a process that never calls one of these functions pays
 * for mapping the object and nothing more, and never starts a Go runtime.
 *
 * At the first interposed call it loads the Go core (libspillway-core.so,
 * beside this object or at $SPILLWAY_CORE) with RTLD_LOCAL, hands it the
 * table of real functions and the probe points, and routes calls through it
 * from then on. It never enters Go:
 *   - in a forked child of a process that loaded the core (a Go runtime does
 *     not survive fork): the child passes straight through to the real
 *     runtime and gets CUDA's own answer;
 *   - re-entrantly (the real runtime calling an interposed name);
 *   - while the core is starting: another thread waits a bounded time, then,
 *     so that a call from a library constructor cannot deadlock, fails
 *     closed with a quota configured, or without one is served here (passed
 *     through, remembered in a small ledger that the core adopts);
 *   - when SPILLWAY_DISABLE=1 (pure pass-through).
 * If the core cannot be loaded, or comes from another build (its ABI version,
 * abi.h, differs), one line says why and how to fix it; with a quota
 * configured, allocations then fail instead of running unlimited.
 * cudaDeviceSynchronize, cudaStreamDestroy, cuStreamDestroy_v2 and the memory-pool calls
 * (attributes, trimming) are interposed for the pool's sake only: they
 * reach the core once it runs and never load it. The
 * per-thread default stream crosses as a per-thread identity (abi.h). Once
 * the core runs, an atexit handler lets it print SPILLWAY_REPORT's lines,
 * except in a forked child.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "abi.h"
#include "dlsym.h"

#define EXPORT __attribute__((visibility("default")))
#define PROBE __attribute__((noinline, noipa, used, visibility("default")))

/*
 * ---- probe points: no-ops that uprobes attach to ----
 *
 * The core calls them (through the table below) at the pool's and the
 * tiers' events, in the order the events happen, under the lock that orders
 * them, and only while a tracer is attached:
 *
 *   spillway_probe_alloc(ptr, size, device, tier, source)
 *       source: 0 = served from the pool's cache; 1 = new reservation (a
 *       device segment, or host memory when tier != 0); 2 = not pooled (pool
 *       off, or the application's own cudaMallocManaged memory)
 *   spillway_probe_free(ptr, size, device, tier)
 *       fired before the memory is released, so that no other thread can be
 *       handed the same address (and report it) first
 *   spillway_probe_sync(device, freed_bytes_made_reusable)
 *   spillway_probe_spill(ptr, size, device, tier)     to host memory
 *   spillway_probe_promote(ptr, size, device, tier)   back to the device
 *   spillway_probe_refuse(size, device, used, quota)
 *
 * tier: 0 = device, 1 = host managed, 2 = host pinned. Sizes are the bytes
 * the pool accounts (aligned).
 *
 * Each starts with a 5-byte NOP, which the kernel emulates when a uprobe
 * sits on it, instead of single-stepping an instruction out of line (tens
 * of times dearer). spillway_probe_semaphore is a USDT-style semaphore: a
 * tracer attaches its uprobes with this counter's file offset as their
 * reference counter (ref_ctr_offset), and the kernel keeps it non-zero in
 * every process mapping this file while any of them is attached, processes
 * that map it later included. The core reads it once per event and builds
 * and fires nothing while it is zero. It must stay in a writable
 * file-backed section (.probes, as for USDT), where the kernel finds it.
 */
__attribute__((used, visibility("default"), section(".probes"))) volatile uint16_t
    spillway_probe_semaphore;

#define PROBE_NOP ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00" /* nopl 0x0(%rax,%rax,1) */

PROBE void spillway_probe_alloc(uint64_t ptr, uint64_t size, int32_t device, int32_t tier,
                                int32_t source)
{
    __asm__ volatile(PROBE_NOP : : "r"(ptr), "r"(size), "r"(device), "r"(tier), "r"(source)
                     : "memory");
}

PROBE void spillway_probe_free(uint64_t ptr, uint64_t size, int32_t device, int32_t tier)
{
    __asm__ volatile(PROBE_NOP : : "r"(ptr), "r"(size), "r"(device), "r"(tier) : "memory");
}

PROBE void spillway_probe_sync(int32_t device, uint64_t freed_bytes_made_reusable)
{
    __asm__ volatile(PROBE_NOP : : "r"(device), "r"(freed_bytes_made_reusable) : "memory");
}

PROBE void spillway_probe_spill(uint64_t ptr, uint64_t size, int32_t device, int32_t tier)
{
    __asm__ volatile(PROBE_NOP : : "r"(ptr), "r"(size), "r"(device), "r"(tier) : "memory");
}

PROBE void spillway_probe_promote(uint64_t ptr, uint64_t size, int32_t device, int32_t tier)
{
    __asm__ volatile(PROBE_NOP : : "r"(ptr), "r"(size), "r"(device), "r"(tier) : "memory");
}

PROBE void spillway_probe_refuse(uint64_t size, int32_t device, uint64_t used, uint64_t quota)
{
    __asm__ volatile(PROBE_NOP : : "r"(size), "r"(device), "r"(used), "r"(quota) : "memory");
}

static struct spillway_probes probes = {
    .size = sizeof(struct spillway_probes),
    .alloc = spillway_probe_alloc,
    .free = spillway_probe_free,
    .sync = spillway_probe_sync,
    .spill = spillway_probe_spill,
    .promote = spillway_probe_promote,
    .refuse = spillway_probe_refuse,
    .semaphore = &spillway_probe_semaphore,
};

/* ---- logging: one line to SPILLWAY_LOG_FILE or stderr ---- */

static void log_line(const char *fmt, ...)
{
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "spillway: ");
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    const char *file = getenv("SPILLWAY_LOG_FILE");
    int fd = 2;
    /* Never wait: a FIFO nobody reads (ENXIO) means stderr, a full one drops the line. */
    if (file && *file)
        fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd < 0)
        fd = 2;
    ssize_t unused = write(fd, buf, (size_t)n);
    (void)unused;
    if (fd != 2)
        close(fd);
}

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
static void *find_real(const char *name)
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

static struct spillway_real real = {.size = sizeof(struct spillway_real)};

/* The CUDA names of the table's entries, in field order. */
static const char *const real_names[] = {
#define SPILLWAY_REAL(ret, field, name, params) #name,
#define SPILLWAY_INTERPOSED SPILLWAY_REAL
#include "calls.h"
};

/* R_<field>: a real function's index in the table. */
enum {
#define SPILLWAY_REAL(ret, field, name, params) R_##field,
#define SPILLWAY_INTERPOSED SPILLWAY_REAL
#include "calls.h"
    R_COUNT
};

/* The table's function pointers, as an array indexed in field order. */
static void **real_slot(int i)
{
    return (void **)((char *)&real + offsetof(struct spillway_real, malloc)) + i;
}

_Static_assert(R_COUNT == (sizeof(struct spillway_real) - offsetof(struct spillway_real, malloc)) /
                              sizeof(void *),
               "every field of spillway_real needs a row in calls.h");

/*
 * After a CUDA library was closed, every real function is found anew: one
 * loaded again lies elsewhere, and the core calls through the same table.
 */
__attribute__((noinline, cold)) static void refresh_real(unsigned int unloads)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static unsigned int seen;
    pthread_mutex_lock(&lock);
    if (seen != unloads) {
        for (int i = 0; i < R_COUNT; i++)
            if (__atomic_load_n(real_slot(i), __ATOMIC_ACQUIRE))
                __atomic_store_n(real_slot(i), find_real(real_names[i]), __ATOMIC_RELEASE);
        seen = unloads;
    }
    pthread_mutex_unlock(&lock);
}

/* The real function with index i; NULL if the process has none. */
static inline void *resolve(int i)
{
    static unsigned int refreshed;
    unsigned int unloads = __atomic_load_n(&front_unloads, __ATOMIC_ACQUIRE);
    if (__builtin_expect(unloads != __atomic_load_n(&refreshed, __ATOMIC_RELAXED), 0)) {
        refresh_real(unloads);
        __atomic_store_n(&refreshed, unloads, __ATOMIC_RELAXED);
    }
    void **slot = real_slot(i);
    void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (!f) {
        f = find_real(real_names[i]);
        if (f)
            __atomic_store_n(slot, f, __ATOMIC_RELEASE);
    }
    return f;
}

/* Yields a typed pointer to the real function, or returns an error from the caller. */
#define REAL(var, field)                                                                       \
    __typeof__(real.field) var = (__typeof__(real.field))resolve(R_##field);                   \
    if (!var)                                                                                  \
        return missing_real(R_##field);

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

static int missing_real(int i)
{
    static atomic_int told;
    if (!atomic_exchange(&told, 1))
        log_line("cannot find the real %s: no %s is loaded in this process; the call fails with "
                 "error %d (cudaErrorSymbolNotFound, CUDA_ERROR_NOT_FOUND)",
                 real_names[i], library_description(real_names[i]), NOT_FOUND);
    return NOT_FOUND;
}

/* ---- the core ---- */

enum state { UNLOADED, LOADING, READY, FAILED, PASSTHROUGH };
static atomic_int state = UNLOADED;

/* The core's entry points, once loaded. */
static struct {
#define SPILLWAY_ENTRY(name, params) spillway_core_##name##_fn name;
#include "calls.h"
} core;

/* Calls this thread is inside; a nested call goes straight to the real runtime. */
static __thread int depth __attribute__((tls_model("initial-exec")));
static __thread int loading_thread __attribute__((tls_model("initial-exec")));

/* Whether the core hears of this call: it runs, and the call is not one of
 * its own (or of the real runtime's, below an interposed call). */
static int core_listens(void)
{
    return depth == 0 && atomic_load_explicit(&state, memory_order_acquire) == READY;
}

/*
 * The ledger: allocations passed through while the core was starting, handed
 * to the core when it is ready so that they count against the quota.
 */
#define LEDGER_SIZE 256
static pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ledger_ready = PTHREAD_COND_INITIALIZER;
static struct {
    uint64_t ptr, size;
    int32_t device;
} ledger[LEDGER_SIZE];
static int ledger_len;

/* Set by the first capture; read by load_core after it sets READY, so that
 * the core hears of a capture whichever of the two comes first. */
static atomic_int captures_begun;

/* Locks defined with what they guard, below; a forked child starts them afresh. */
static pthread_mutex_t created_lock, vmm_lock, arrays_lock;

static void atfork_child(void)
{
    /* The child has one thread and a Go runtime that believes it has many;
     * a lock another thread held at the fork would stay held for good. */
    int s = atomic_load(&state);
    if (s == LOADING || s == READY)
        atomic_store(&state, PASSTHROUGH);
    pthread_mutex_init(&ledger_lock, NULL);
    pthread_cond_init(&ledger_ready, NULL);
    pthread_mutex_init(&created_lock, NULL);
    pthread_mutex_init(&vmm_lock, NULL);
    pthread_mutex_init(&arrays_lock, NULL);
}

static int quota_configured(void)
{
    extern char **environ;
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, "SPILLWAY_MEMORY_LIMIT", 21) == 0)
            return 1;
    return 0;
}

/* What interposed calls do while there is no core (slow_route's FAILED case), for the log. */
static const char *without_core(void)
{
    return quota_configured() ? "interposed allocations fail (a quota is configured)"
                              : "calls pass through to CUDA unaccounted";
}

/* This object's path, or NULL. */
static const char *front_path(void)
{
    Dl_info self;
    return dladdr((const void *)front_path, &self) ? self.dli_fname : NULL;
}

static int core_path(char *out, size_t n)
{
    const char *env = getenv("SPILLWAY_CORE");
    if (env && *env)
        return snprintf(out, n, "%s", env) < (int)n ? 0 : -1;
    const char *self = front_path();
    if (!self)
        return -1;
    const char *slash = strrchr(self, '/');
    int dir = slash ? (int)(slash - self) : 1;
    return snprintf(out, n, "%.*s/libspillway-core.so", dir, slash ? self : ".") < (int)n ? 0
                                                                                           : -1;
}

/* Checks the core's ABI version before anything else is looked up or called in it. */
static int same_abi(void *h, const char *path)
{
    spillway_core_abi_fn abi = (spillway_core_abi_fn)dlsym(h, "spillway_core_abi");
    int32_t version = abi ? abi() : 0;
    if (abi && version == SPILLWAY_CORE_ABI)
        return 1;
    char core_abi[32] = "no ABI version";
    if (abi)
        snprintf(core_abi, sizeof core_abi, "ABI version %d", version);
    const char *self = front_path();
    log_line("the core %s has %s and the front %s has ABI version %d: libspillway.so and "
             "libspillway-core.so must come from the same build; until then %s",
             path, core_abi, self ? self : "libspillway.so", SPILLWAY_CORE_ABI, without_core());
    return 0;
}

static void *entry(void *h, const char *name, int *missing)
{
    void *f = dlsym(h, name);
    if (!f)
        *missing = 1;
    return f;
}

static int open_core(void)
{
    char path[PATH_MAX];
    if (core_path(path, sizeof path) != 0) {
        log_line("cannot locate libspillway-core.so; set SPILLWAY_CORE to its path");
        return -1;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        log_line("cannot load the core %s: %s; if the error is 'cannot allocate memory in static "
                 "TLS block', set GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384 (spillway "
                 "run does); until then %s",
                 path, dlerror(), without_core());
        return -1;
    }
    if (!same_abi(h, path))
        return -1;
    int missing = 0;
#define SPILLWAY_ENTRY(name, params)                                                           \
    core.name = (spillway_core_##name##_fn)entry(h, "spillway_core_" #name, &missing);
#include "calls.h"
    if (missing) {
        log_line("the core %s lacks an entry point (a front and a core from different builds?)",
                 path);
        return -1;
    }
    /* A runtime opens the driver only at its own first call, which comes
     * after this one: open the same libcuda.so.1 now (the runtime's dlopen
     * then finds it loaded), so that the core has the driver's functions it
     * serves virtual memory with. A process without a driver keeps none. */
    if (resolve(R_malloc) && !resolve(R_cu_init))
        dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL); /* kept, as the runtime keeps it */
    for (size_t i = 0; i < sizeof real_names / sizeof real_names[0]; i++)
        resolve((int)i); /* optional ones may stay NULL; the core checks */
    depth++; /* the core's own calls into CUDA reach the real functions */
    int32_t rc = core.init(SPILLWAY_CORE_ABI, &real, &probes);
    depth--;
    if (rc != 0) {
        log_line("the core %s refused to start (error %d)", path, rc);
        return -1;
    }
    return 0;
}

/* At exit, the core prints SPILLWAY_REPORT's lines, unless this is a forked child. */
static void report_at_exit(void)
{
    if (atomic_load(&state) == READY && depth == 0) {
        depth++;
        core.report();
        depth--;
    }
}

static void load_core(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
    loading_thread = 1;
    int ok = open_core() == 0;
    loading_thread = 0;
    if (ok)
        atexit(report_at_exit);
    pthread_mutex_lock(&ledger_lock);
    /* Adopting asks CUDA about each block: with depth raised, as in any call
     * into the core, so that those calls never wait for this lock. */
    depth++;
    if (ok)
        for (int i = 0; i < ledger_len; i++)
            core.adopt(ledger[i].ptr, ledger[i].size, ledger[i].device);
    depth--;
    ledger_len = 0;
    atomic_store(&state, ok ? READY : FAILED);
    pthread_cond_broadcast(&ledger_ready);
    pthread_mutex_unlock(&ledger_lock);
    /* A capture begun while the core started (see tell_capture_begun). */
    if (ok && atomic_load(&captures_begun)) {
        depth++;
        core.capture_begun();
        depth--;
    }
}

/* How long a thread waits for the core to start, with a quota, before failing closed. */
#define EARLY_WAIT_QUOTA_S 5

enum route {
    ROUTE_REAL,   /* straight to the real runtime */
    ROUTE_CORE,   /* through the Go core */
    ROUTE_EARLY,  /* the core is starting: pass through and keep a ledger */
    ROUTE_REFUSE, /* no core (failed, or still starting) and a quota is configured */
    ROUTE_CONTEXT, /* counted by the core, passed through: a context the application created */
    ROUTE_FAILED,  /* answered already: the device of a call for the core could not be found */
};

/* SPILLWAY_DISABLE is 1, blanks around it allowed: the core's configuration trims the
 * same blanks (shim/config's blanks), and a value it takes for 1 must never leave the
 * shim running. */
static int disabled(void)
{
    static const char blanks[] = " \t\n\v\f\r";
    const char *v = getenv("SPILLWAY_DISABLE");
    if (!v)
        return 0;
    v += strspn(v, blanks);
    return v[0] == '1' && v[1 + strspn(v + 1, blanks)] == '\0';
}

static enum route slow_route(int s)
{
    if (s == UNLOADED) {
        if (disabled()) {
            int expect = UNLOADED;
            atomic_compare_exchange_strong(&state, &expect, PASSTHROUGH);
            return ROUTE_REAL;
        }
        int expect = UNLOADED;
        if (atomic_compare_exchange_strong(&state, &expect, LOADING))
            load_core();
        s = atomic_load(&state);
    }
    if (s == LOADING) {
        if (loading_thread)
            return ROUTE_EARLY;
        /* Wait for the loading thread, but never unboundedly: it may be waiting for a lock
         * this thread holds (the dynamic loader's, in a library constructor). With a quota,
         * wait longer and then fail closed; without one, pass through into the ledger. */
        int quota = quota_configured();
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        if (quota)
            until.tv_sec += EARLY_WAIT_QUOTA_S;
        else
            until.tv_nsec += 500 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&ledger_lock);
        while ((s = atomic_load(&state)) == LOADING)
            if (pthread_cond_timedwait(&ledger_ready, &ledger_lock, &until) == ETIMEDOUT)
                break;
        pthread_mutex_unlock(&ledger_lock);
        s = atomic_load(&state);
        if (s == LOADING)
            return quota ? ROUTE_REFUSE : ROUTE_EARLY;
    }
    switch (s) {
    case READY:
        return ROUTE_CORE;
    case FAILED:
        return quota_configured() ? ROUTE_REFUSE : ROUTE_REAL;
    default:
        return ROUTE_REAL;
    }
}

static inline enum route route(void)
{
    if (depth > 0)
        return ROUTE_REAL;
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (s == READY)
        return ROUTE_CORE;
    if (s == PASSTHROUGH)
        return ROUTE_REAL;
    return slow_route(s);
}

/* Records an allocation made on the early route; adopts it if the core became ready since. */
static cudaError_t early_record(void *ptr, uint64_t size, int32_t device)
{
    cudaError_t rc = cudaSuccess;
    pthread_mutex_lock(&ledger_lock);
    if (atomic_load(&state) == READY) {
        core.adopt((uint64_t)(uintptr_t)ptr, size, device);
    } else if (ledger_len < LEDGER_SIZE) {
        ledger[ledger_len].ptr = (uint64_t)(uintptr_t)ptr;
        ledger[ledger_len].size = size;
        ledger[ledger_len].device = device;
        ledger_len++;
    } else {
        rc = cudaErrorMemoryAllocation;
    }
    pthread_mutex_unlock(&ledger_lock);
    return rc;
}

/*
 * Forgets a ledger entry about to be freed on the early route. Returns 0
 * when the core became ready meanwhile (it adopted the ledger): the free
 * must then go through the core.
 */
static int early_forget(void *ptr)
{
    pthread_mutex_lock(&ledger_lock);
    int early = atomic_load(&state) != READY;
    for (int i = 0; early && i < ledger_len; i++)
        if (ledger[i].ptr == (uint64_t)(uintptr_t)ptr) {
            ledger[i] = ledger[--ledger_len];
            break;
        }
    pthread_mutex_unlock(&ledger_lock);
    return early;
}

/*
 * A thread's per-thread identity is retired when the thread exits (a
 * pthread key's destructor): the core's pools forget it, so threads that
 * come and go leave nothing behind.
 */
static pthread_key_t identity_key;
static pthread_once_t identity_once = PTHREAD_ONCE_INIT;
static int identity_key_ok;

static void retire_identity(void *id)
{
    if (core_listens()) {
        depth++;
        core.stream_destroy((uint64_t)(uintptr_t)id);
        depth--;
    }
}

static void make_identity_key(void)
{
    identity_key_ok = pthread_key_create(&identity_key, retire_identity) == 0;
}

/*
 * The stream as the core sees it: the per-thread default stream is a
 * different stream in every thread, so it crosses as a per-thread identity.
 */
static uint64_t stream_id(cudaStream_t stream)
{
    static atomic_uint_fast64_t next_thread;
    static __thread uint64_t self __attribute__((tls_model("initial-exec")));
    if (stream != cudaStreamPerThread)
        return (uint64_t)(uintptr_t)stream;
    if (!self) {
        self = SPILLWAY_PER_THREAD_BIT | (atomic_fetch_add(&next_thread, 1) + 1);
        pthread_once(&identity_once, make_identity_key);
        if (identity_key_ok)
            pthread_setspecific(identity_key, (void *)(uintptr_t)self);
    }
    return self;
}

static cudaError_t current_device(int32_t *device)
{
    *device = 0;
    REAL(get_device, get_device);
    int d = 0;
    cudaError_t rc = get_device(&d);
    *device = d;
    return rc;
}

/*
 * Records an allocation passed through on the early route, rc the real
 * call's answer and *devPtr, read only after a success, its block; undoes
 * it if it cannot be recorded.
 */
static cudaError_t early_alloc(cudaError_t rc, void *const *devPtr, uint64_t size)
{
    if (rc != cudaSuccess)
        return rc;
    void *ptr = *devPtr;
    int32_t device = 0;
    if (current_device(&device) != cudaSuccess || early_record(ptr, size, device) != cudaSuccess) {
        __typeof__(real.free) release = (__typeof__(real.free))resolve(R_free);
        if (release)
            release(ptr);
        return cudaErrorMemoryAllocation;
    }
    return cudaSuccess;
}

/* ---- contexts the application created ---- */

/*
 * Contexts the application created with cuCtxCreate, and their usage
 * counts (cuCtxAttach adds one, cuCtxDetach drops one, the last destroys
 * the context, as cuCtxDestroy does). Kept here, so that contexts created
 * before the core runs are known; created_live spares every allocation the
 * look-up while there are none.
 */
static pthread_mutex_t created_lock = PTHREAD_MUTEX_INITIALIZER;
static struct created {
    CUcontext ctx;
    unsigned int usage;
} *created;
static size_t created_len, created_cap;
static atomic_size_t created_live;
/* Allocations the core recorded as made in a created context. */
static atomic_long context_blocks;

static void created_add(CUcontext ctx)
{
    pthread_mutex_lock(&created_lock);
    if (created_len == created_cap) {
        size_t cap = created_cap ? 2 * created_cap : 8;
        struct created *grown = realloc(created, cap * sizeof *created);
        if (!grown) {
            pthread_mutex_unlock(&created_lock);
            log_line("cannot record a created context (out of host memory): its allocations are "
                     "served as the primary context's");
            return;
        }
        created = grown;
        created_cap = cap;
    }
    created[created_len++] = (struct created){ctx, 1};
    atomic_store(&created_live, created_len);
    pthread_mutex_unlock(&created_lock);
}

/*
 * Changes ctx's usage count by delta (0: looks it up); returns -1 if ctx
 * is not a created context, else its new count. A count of 0 forgets it.
 */
static long created_usage(CUcontext ctx, int delta)
{
    long usage = -1;
    pthread_mutex_lock(&created_lock);
    for (size_t i = 0; i < created_len; i++) {
        if (created[i].ctx != ctx)
            continue;
        created[i].usage += delta;
        usage = created[i].usage;
        if (usage == 0) {
            created[i] = created[--created_len];
            atomic_store(&created_live, created_len);
        }
        break;
    }
    pthread_mutex_unlock(&created_lock);
    return usage;
}

/* Forgets ctx, destroyed; returns whether it was a created context. */
static int created_remove(CUcontext ctx)
{
    int found = 0;
    pthread_mutex_lock(&created_lock);
    for (size_t i = 0; i < created_len && !found; i++)
        if ((found = created[i].ctx == ctx)) {
            created[i] = created[--created_len];
            atomic_store(&created_live, created_len);
        }
    pthread_mutex_unlock(&created_lock);
    return found;
}

/* The calling thread's current context if the application created it, else NULL. */
static CUcontext current_created(void)
{
    if (atomic_load_explicit(&created_live, memory_order_acquire) == 0)
        return NULL;
    __typeof__(real.cu_ctx_get_current) get =
        (__typeof__(real.cu_ctx_get_current))resolve(R_cu_ctx_get_current);
    CUcontext ctx = NULL;
    if (!get || get(&ctx) != CUDA_SUCCESS || !ctx)
        return NULL;
    return created_usage(ctx, 0) > 0 ? ctx : NULL;
}

/* The widest pitch CUDA pads rows of width bytes to (its pitch alignment is at most 512). */
static uint64_t pitch_bound(uint64_t width)
{
    return width > UINT64_MAX - 511 ? UINT64_MAX : (width + 511) / 512 * 512;
}

/* Admits a driver allocation of size bytes in a created context on device; a CUresult. */
static CUresult context_take(int32_t device, uint64_t size)
{
    return (CUresult)core.take(device, size, SPILLWAY_TAKE_CONTEXT);
}

/* The same for the runtime: a cudaError_t, and a refusal is the thread's last error. */
static cudaError_t runtime_context_take(int32_t device, uint64_t size)
{
    return (cudaError_t)core.take(device, size, SPILLWAY_TAKE_RUNTIME);
}

/* After the real allocation: records it in the core, or gives its bytes back. */
static void context_took(CUresult rc, CUcontext ctx, int32_t device, CUdeviceptr p, uint64_t size)
{
    if (rc != CUDA_SUCCESS) {
        core.give(device, size, SPILLWAY_TAKE_CONTEXT);
        return;
    }
    core.ctx_record((uint64_t)(uintptr_t)ctx, device, (uint64_t)p, size);
    atomic_fetch_add(&context_blocks, 1);
}

/* An allocation of a created context being freed. */
struct context_block {
    uint64_t ctx, size;
    int32_t device;
};

/* Whether p was allocated in a created context (the core forgets it; see context_freed). */
static int context_owns(uint64_t p, struct context_block *b)
{
    return atomic_load_explicit(&context_blocks, memory_order_acquire) != 0 &&
           core.ctx_forget(p, &b->ctx, &b->device, &b->size);
}

/* After the real free of b at p: its bytes go back, or it is recorded again. */
static void context_freed(int rc, uint64_t p, const struct context_block *b)
{
    if (rc == 0) {
        core.give(b->device, b->size, SPILLWAY_TAKE_CONTEXT);
        atomic_fetch_sub(&context_blocks, 1);
    } else {
        core.ctx_record(b->ctx, b->device, p, b->size);
    }
}

static CUgraph stream_graph(CUstream stream);

/*
 * After the real stream-ordered free of b at p on stream: freed during a
 * capture, the memory is the graph's until the graph is destroyed, and its
 * bytes stay taken until then (the core gives them back).
 */
static void context_freed_async(int rc, uint64_t p, const struct context_block *b, CUstream stream)
{
    CUgraph graph = rc == 0 ? stream_graph(stream) : NULL;
    if (!graph) {
        context_freed(rc, p, b);
        return;
    }
    core.graph_keep((uint64_t)(uintptr_t)graph, b->device, b->size);
    atomic_fetch_sub(&context_blocks, 1);
}

/*
 * The route of a runtime allocation of size bytes into devPtr, given r, the
 * route() taken before depth was raised: this runs after, so that the
 * runtime's own driver calls while it finds the device pass through. The
 * core's route needs the current device (sets *device; where it cannot be
 * found, that error is the answer, *rc, and ROUTE_FAILED); in a context the
 * application created it is ROUTE_CONTEXT (sets *ctx); a null devPtr, and
 * zero bytes in a created context, get CUDA's own answer (which also sets
 * the thread's last error).
 */
static enum route runtime_alloc_route(enum route r, void **devPtr, uint64_t size,
                                      int32_t *device, CUcontext *ctx, cudaError_t *rc)
{
    if (r != ROUTE_CORE)
        return r;
    if ((*rc = current_device(device)) != cudaSuccess)
        return ROUTE_FAILED;
    if (!devPtr)
        return ROUTE_REAL;
    if ((*ctx = current_created()) != NULL)
        return size > 0 ? ROUTE_CONTEXT : ROUTE_REAL;
    return ROUTE_CORE;
}

/*
 * The route of a free of p, given r, the route() taken before depth was
 * raised: the core's, also where p was allocated on the early route and
 * the core has adopted the ledger since; ROUTE_CONTEXT for an allocation
 * of a created context (fills *b, for context_freed after the real free);
 * the real function's otherwise.
 */
static enum route free_route(enum route r, uint64_t p, struct context_block *b)
{
    if (r == ROUTE_EARLY && !early_forget((void *)(uintptr_t)p))
        r = ROUTE_CORE;
    if (r != ROUTE_CORE)
        return ROUTE_REAL;
    return context_owns(p, b) ? ROUTE_CONTEXT : ROUTE_CORE;
}

/* ---- the device a stream-ordered allocation is made on ---- */

/*
 * CUDA serves cudaMallocAsync and cuMemAllocAsync from the memory pool of
 * the stream's device, which need not be the current one, and an explicit
 * pool's allocation from that pool's device.
 *
 * stream_place moves *device (and *ctx: the stream's context when the
 * application created it, else NULL) to the stream's. The default streams
 * (0, the legacy and per-thread handles) are the current context's and
 * change nothing, at no cost. Another stream costs a cuStreamGetCtx and a
 * cuCtxGetCurrent, reads of the handles without device work (and accepted
 * during a stream capture, which cuStreamGetDevice is not on every driver);
 * only a stream of another context than the current one adds a push, a
 * cuCtxGetDevice and a pop of that context. A stream the driver does not
 * know changes nothing: the allocation answers CUDA's error for it.
 */
static void stream_place(CUstream stream, int32_t *device, CUcontext *ctx)
{
    if (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
        return;
    __typeof__(real.cu_stream_get_ctx) stream_ctx =
        (__typeof__(real.cu_stream_get_ctx))resolve(R_cu_stream_get_ctx);
    __typeof__(real.cu_ctx_get_current) get_current =
        (__typeof__(real.cu_ctx_get_current))resolve(R_cu_ctx_get_current);
    __typeof__(real.cu_ctx_push_current) push =
        (__typeof__(real.cu_ctx_push_current))resolve(R_cu_ctx_push_current);
    __typeof__(real.cu_ctx_pop_current) pop =
        (__typeof__(real.cu_ctx_pop_current))resolve(R_cu_ctx_pop_current);
    __typeof__(real.cu_ctx_get_device) get_device =
        (__typeof__(real.cu_ctx_get_device))resolve(R_cu_ctx_get_device);
    CUcontext own = NULL, current = NULL, popped = NULL;
    if (!stream_ctx || !get_current || !push || !pop || !get_device ||
        stream_ctx(stream, &own) != CUDA_SUCCESS || !own ||
        get_current(&current) != CUDA_SUCCESS || own == current || push(own) != CUDA_SUCCESS)
        return;
    CUdevice d = 0;
    CUresult rc = get_device(&d);
    pop(&popped);
    if (rc != CUDA_SUCCESS)
        return;
    int created = atomic_load_explicit(&created_live, memory_order_acquire) != 0 &&
                  created_usage(own, 0) > 0;
    *device = d;
    *ctx = created ? own : NULL;
}

/*
 * The route of a stream-ordered allocation of size bytes on stream, given
 * the route for the current context: the core's for a stream of a primary
 * context, ROUTE_CONTEXT for one of a context the application created (zero
 * bytes there get CUDA's own answer), on the stream's device.
 */
static enum route stream_route(enum route r, CUstream stream, uint64_t size, int32_t *device,
                               CUcontext *ctx)
{
    if (r != ROUTE_CORE && r != ROUTE_CONTEXT)
        return r;
    stream_place(stream, device, ctx);
    if (*ctx)
        return size > 0 ? ROUTE_CONTEXT : ROUTE_REAL;
    return ROUTE_CORE;
}

/*
 * The device of each memory pool the application created, remembered as
 * cuMemPoolCreate or cudaMemPoolCreate made it, since CUDA answers no query
 * for a pool's location. Host-located pools are not kept. Few pools live at
 * once: a look-up scans them.
 */
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pool_place {
    CUmemoryPool pool;
    int32_t device;
} *pools;
static size_t pools_len, pools_cap;

static void pool_created(CUmemoryPool pool, int location_type, int location_id)
{
    if (location_type != CU_MEM_LOCATION_TYPE_DEVICE)
        return;
    pthread_mutex_lock(&pools_lock);
    size_t i = 0;
    while (i < pools_len && pools[i].pool != pool)
        i++;
    if (i == pools_len && pools_len == pools_cap) {
        size_t cap = pools_cap ? 2 * pools_cap : 8;
        struct pool_place *grown = realloc(pools, cap * sizeof *pools);
        if (!grown) {
            pthread_mutex_unlock(&pools_lock);
            log_line("cannot record a memory pool's device (out of host memory): its allocations "
                     "count on their stream's device");
            return;
        }
        pools = grown;
        pools_cap = cap;
    }
    pools[i] = (struct pool_place){pool, location_id};
    if (i == pools_len)
        pools_len++;
    pthread_mutex_unlock(&pools_lock);
}

static void pool_destroyed(CUmemoryPool pool)
{
    pthread_mutex_lock(&pools_lock);
    for (size_t i = 0; i < pools_len; i++)
        if (pools[i].pool == pool) {
            pools[i] = pools[--pools_len];
            break;
        }
    pthread_mutex_unlock(&pools_lock);
}

/* The ordinal of the device whose default memory pool is pool, or -1. */
static int default_pool_device(CUmemoryPool pool)
{
    __typeof__(real.cu_device_get_count) count_devices =
        (__typeof__(real.cu_device_get_count))resolve(R_cu_device_get_count);
    __typeof__(real.cu_device_get) get = (__typeof__(real.cu_device_get))resolve(R_cu_device_get);
    __typeof__(real.cu_device_get_default_mem_pool) default_pool =
        (__typeof__(real.cu_device_get_default_mem_pool))resolve(R_cu_device_get_default_mem_pool);
    int n = 0;
    if (!pool || !count_devices || !get || !default_pool || count_devices(&n) != CUDA_SUCCESS)
        return -1;
    for (int i = 0; i < n; i++) {
        CUdevice dev;
        CUmemoryPool p = NULL;
        if (get(&dev, i) == CUDA_SUCCESS && default_pool(&p, dev) == CUDA_SUCCESS && p == pool)
            return i;
    }
    return -1;
}

/*
 * The device an allocation from pool on stream counts on: the pool's
 * device, for a pool whose creation the shim saw or a device's default
 * pool; else (a host-located pool, or one made where the shim could not
 * see it) the stream's. *device is the current device on entry.
 */
static void pool_place(CUmemoryPool pool, CUstream stream, int32_t *device)
{
    int found = 0;
    pthread_mutex_lock(&pools_lock);
    for (size_t i = 0; i < pools_len && !found; i++)
        if ((found = pools[i].pool == pool))
            *device = pools[i].device;
    pthread_mutex_unlock(&pools_lock);
    if (found)
        return;
    int d = default_pool_device(pool);
    CUcontext ctx = NULL;
    if (d >= 0)
        *device = d;
    else
        stream_place(stream, device, &ctx);
}

/* ---- the interposed functions ---- */

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    REAL(real_malloc, malloc);
    cudaError_t rc = cudaSuccess;
    int32_t device = 0;
    uint64_t p = 0;
    CUcontext ctx = NULL;
    enum route r = route();
    depth++;
    switch (runtime_alloc_route(r, devPtr, size, &device, &ctx, &rc)) {
    case ROUTE_CORE:
        if ((rc = core.malloc(device, size, &p)) == cudaSuccess)
            *devPtr = (void *)(uintptr_t)p;
        break;
    case ROUTE_CONTEXT:
        if ((rc = runtime_context_take(device, size)) == cudaSuccess) {
            rc = real_malloc(devPtr, size);
            context_took((CUresult)rc, ctx, device, (CUdeviceptr)(uintptr_t)*devPtr, size);
        }
        break;
    case ROUTE_EARLY:
        rc = early_alloc(real_malloc(devPtr, size), devPtr, size);
        break;
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    case ROUTE_FAILED:
        break;
    default:
        rc = real_malloc(devPtr, size);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    REAL(real_malloc_managed, malloc_managed);
    cudaError_t rc = cudaSuccess;
    int32_t device = 0;
    uint64_t p = 0;
    CUcontext ctx = NULL;
    enum route r = route();
    depth++;
    switch (runtime_alloc_route(r, devPtr, size, &device, &ctx, &rc)) {
    case ROUTE_CORE:
        if ((rc = core.malloc_managed(device, size, flags, &p)) == cudaSuccess)
            *devPtr = (void *)(uintptr_t)p;
        break;
    case ROUTE_CONTEXT:
        if ((rc = runtime_context_take(device, size)) == cudaSuccess) {
            rc = real_malloc_managed(devPtr, size, flags);
            context_took((CUresult)rc, ctx, device, (CUdeviceptr)(uintptr_t)*devPtr, size);
        }
        break;
    case ROUTE_EARLY:
        rc = early_alloc(real_malloc_managed(devPtr, size, flags), devPtr, size);
        break;
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    case ROUTE_FAILED:
        break;
    default:
        rc = real_malloc_managed(devPtr, size, flags);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    REAL(real_malloc_pitch, malloc_pitch);
    cudaError_t rc = cudaSuccess;
    int32_t device = 0;
    uint64_t p = 0, pt = 0;
    CUcontext ctx = NULL;
    /* A created context's allocation is taken at the widest pitch CUDA may choose; zero
     * (CUDA's own answer) where that overflows. */
    uint64_t bound = width == 0 || height > UINT64_MAX / pitch_bound(width)
                         ? 0
                         : pitch_bound(width) * height;
    enum route r = route();
    depth++;
    switch (runtime_alloc_route(r, pitch ? devPtr : NULL, bound, &device, &ctx, &rc)) {
    case ROUTE_CORE:
        if ((rc = core.malloc_pitch(device, width, height, &p, &pt)) == cudaSuccess) {
            *devPtr = (void *)(uintptr_t)p;
            *pitch = (size_t)pt;
        }
        break;
    case ROUTE_CONTEXT:
        if ((rc = runtime_context_take(device, bound)) == cudaSuccess) {
            rc = real_malloc_pitch(devPtr, pitch, width, height);
            context_took((CUresult)rc, ctx, device, (CUdeviceptr)(uintptr_t)*devPtr, bound);
        }
        break;
    case ROUTE_EARLY:
        rc = real_malloc_pitch(devPtr, pitch, width, height);
        rc = early_alloc(rc, devPtr, rc == cudaSuccess ? (uint64_t)*pitch * height : 0);
        break;
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    case ROUTE_FAILED:
        break;
    default:
        rc = real_malloc_pitch(devPtr, pitch, width, height);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
    REAL(real_malloc_async, malloc_async);
    cudaError_t rc = cudaSuccess;
    int32_t device = 0;
    uint64_t p = 0;
    CUcontext ctx = NULL;
    enum route r = route();
    depth++;
    enum route ar = runtime_alloc_route(r, devPtr, size, &device, &ctx, &rc);
    switch (stream_route(ar, (CUstream)stream, size, &device, &ctx)) {
    case ROUTE_CORE:
        if ((rc = core.malloc_async(device, size, stream_id(stream), &p)) == cudaSuccess)
            *devPtr = (void *)(uintptr_t)p;
        break;
    case ROUTE_CONTEXT:
        if ((rc = runtime_context_take(device, size)) == cudaSuccess) {
            rc = real_malloc_async(devPtr, size, stream);
            context_took((CUresult)rc, ctx, device, (CUdeviceptr)(uintptr_t)*devPtr, size);
        }
        break;
    case ROUTE_EARLY:
        rc = early_alloc(real_malloc_async(devPtr, size, stream), devPtr, size);
        break;
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    case ROUTE_FAILED:
        break;
    default:
        rc = real_malloc_async(devPtr, size, stream);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaFree(void *devPtr)
{
    REAL(real_free, free);
    cudaError_t rc;
    uint64_t p = (uint64_t)(uintptr_t)devPtr;
    struct context_block b;
    enum route r = route();
    depth++;
    enum route fr = free_route(r, p, &b);
    rc = fr == ROUTE_CORE ? (cudaError_t)core.free(p) : real_free(devPtr);
    if (fr == ROUTE_CONTEXT)
        context_freed(rc, p, &b);
    depth--;
    return rc;
}

/*
 * The context a stream-ordered free on stream is ordered in, for the core:
 * the current one for a default stream (CUDA takes 0, the legacy and the
 * per-thread handles as the current context's, which need not be the
 * memory's device's), at the cost of a cuCtxGetCurrent; 0 for another
 * stream, whose own context the core finds.
 */
static uint64_t free_context(CUstream stream)
{
    if (stream && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD)
        return 0;
    __typeof__(real.cu_ctx_get_current) get_current =
        (__typeof__(real.cu_ctx_get_current))resolve(R_cu_ctx_get_current);
    CUcontext ctx = NULL;
    if (!get_current || get_current(&ctx) != CUDA_SUCCESS)
        return 0;
    return (uint64_t)(uintptr_t)ctx;
}

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
    REAL(real_free_async, free_async);
    cudaError_t rc;
    uint64_t p = (uint64_t)(uintptr_t)devPtr;
    struct context_block b;
    enum route r = route();
    depth++;
    enum route fr = free_route(r, p, &b);
    rc = fr == ROUTE_CORE
             ? (cudaError_t)core.free_async(p, stream_id(stream), free_context((CUstream)stream))
             : real_free_async(devPtr, stream);
    if (fr == ROUTE_CONTEXT)
        context_freed_async(rc, p, &b, (CUstream)stream);
    depth--;
    return rc;
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
    REAL(real_mem_get_info, mem_get_info);
    cudaError_t rc;
    enum route r = route();
    depth++;
    if (r == ROUTE_CORE && (!free || !total)) {
        rc = real_mem_get_info(free, total); /* CUDA's own answer, which also sets the last error */
    } else if (r == ROUTE_CORE) {
        int32_t device;
        uint64_t f = 0, t = 0;
        if ((rc = current_device(&device)) == cudaSuccess) {
            rc = core.mem_get_info(device, &f, &t);
            if (rc == cudaSuccess) {
                if (free)
                    *free = (size_t)f;
                if (total)
                    *total = (size_t)t;
            }
        }
    } else {
        rc = real_mem_get_info(free, total);
        if (rc == cudaSuccess && r == ROUTE_REFUSE && free)
            *free = 0; /* allocations are refused: none of it is the process's */
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaDeviceReset(void)
{
    REAL(real_device_reset, device_reset);
    cudaError_t rc;
    enum route r = route();
    depth++;
    if (r == ROUTE_CORE) {
        int32_t device;
        if ((rc = current_device(&device)) == cudaSuccess)
            rc = core.device_reset(device);
    } else {
        rc = real_device_reset();
    }
    depth--;
    return rc;
}

/*
 * cudaDeviceSynchronize and cudaStreamDestroy matter to the pool only once
 * the core runs: they never load it. In a context the application created,
 * a synchronization waits for that context's work only, not the primary
 * context's, where the pool's blocks are used: the core is not told.
 */
EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    REAL(real_device_synchronize, device_synchronize);
    cudaError_t rc;
    if (core_listens() && !current_created()) {
        depth++;
        int32_t device;
        if ((rc = current_device(&device)) == cudaSuccess)
            rc = core.device_synchronize(device);
        depth--;
        return rc;
    }
    return real_device_synchronize();
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    REAL(real_stream_destroy, stream_destroy);
    cudaError_t rc;
    if (core_listens() && stream != cudaStreamPerThread && stream != cudaStreamLegacy && stream != NULL) {
        depth++;
        rc = core.stream_destroy((uint64_t)(uintptr_t)stream);
        depth--;
        return rc;
    }
    return real_stream_destroy(stream);
}

/* The driver's form: the pools forget the stream, as for cudaStreamDestroy,
 * then the real call destroys it; so a new stream given the same handle is
 * not taken for the old one, and the blocks freed on a stream of another
 * device or context get their marker while the stream still exists. */
EXPORT CUresult cuStreamDestroy_v2(CUstream hStream)
{
    REAL(real_destroy, cu_stream_destroy);
    if (core_listens() && hStream != CU_STREAM_PER_THREAD && hStream != CU_STREAM_LEGACY && hStream != NULL) {
        depth++;
        core.cu_stream_forget((uint64_t)(uintptr_t)hStream);
        depth--;
    }
    return real_destroy(hStream);
}

/*
 * CUDA graphs: the core keeps a block freed during a stream capture until the
 * graph and every executable graph instantiated from it are destroyed. It
 * hears of a graph call once the real call has run (before, nothing was freed
 * into a graph), never from inside its own calls nor twice for one call: the
 * real call runs quiet (CALL_QUIET), so the runtime's graph calls, which reach
 * the driver's, are reported once, by the runtime's wrapper.
 */
#define CALL_QUIET(rc, call)                                                                   \
    do {                                                                                       \
        depth++;                                                                               \
        rc = (call);                                                                           \
        depth--;                                                                               \
    } while (0)

/* Tells the core that a graph (exec: an executable graph) is gone. */
static void tell_gone(const void *handle, int exec)
{
    if (core_listens()) {
        depth++;
        if (exec)
            core.graph_exec_destroyed((uint64_t)(uintptr_t)handle);
        else
            core.graph_destroyed((uint64_t)(uintptr_t)handle);
        depth--;
    }
}

static void tell_instantiated(const void *exec, const void *graph)
{
    if (core_listens()) {
        depth++;
        core.graph_instantiated((uint64_t)(uintptr_t)exec, (uint64_t)(uintptr_t)graph);
        depth--;
    }
}

static void tell_capture_begun(void)
{
    atomic_store(&captures_begun, 1);
    if (core_listens()) {
        depth++;
        core.capture_begun();
        depth--;
    }
}

/* A graph call the core hears of when it succeeds (both APIs' success is 0). */
_Static_assert(cudaSuccess == 0 && CUDA_SUCCESS == 0, "one code for success");
#define GRAPH_CALL(ret, name, field, params, args, tell)                                       \
    EXPORT ret name params                                                                     \
    {                                                                                          \
        REAL(real_call, field);                                                                \
        ret rc;                                                                                \
        CALL_QUIET(rc, real_call args);                                                        \
        if (rc == 0)                                                                           \
            tell;                                                                              \
        return rc;                                                                             \
    }

GRAPH_CALL(cudaError_t, cudaStreamBeginCapture, stream_begin_capture,
           (cudaStream_t stream, enum cudaStreamCaptureMode mode), (stream, mode),
           tell_capture_begun())
GRAPH_CALL(CUresult, cuStreamBeginCapture_v2, cu_stream_begin_capture,
           (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode), tell_capture_begun())
GRAPH_CALL(CUresult, cuStreamBeginCapture_v2_ptsz, cu_stream_begin_capture_ptsz,
           (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode), tell_capture_begun())
GRAPH_CALL(cudaError_t, cudaGraphInstantiate, graph_instantiate,
           (cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags),
           (pGraphExec, graph, flags), tell_instantiated(*pGraphExec, graph))
GRAPH_CALL(cudaError_t, cudaGraphInstantiateWithFlags, graph_instantiate_with_flags,
           (cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags),
           (pGraphExec, graph, flags), tell_instantiated(*pGraphExec, graph))
GRAPH_CALL(CUresult, cuGraphInstantiateWithFlags, cu_graph_instantiate_with_flags,
           (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags),
           (phGraphExec, hGraph, flags), tell_instantiated(*phGraphExec, hGraph))
GRAPH_CALL(cudaError_t, cudaGraphExecDestroy, graph_exec_destroy, (cudaGraphExec_t graphExec),
           (graphExec), tell_gone(graphExec, 1))
GRAPH_CALL(cudaError_t, cudaGraphDestroy, graph_destroy, (cudaGraph_t graph), (graph),
           tell_gone(graph, 0))
GRAPH_CALL(CUresult, cuGraphExecDestroy, cu_graph_exec_destroy, (CUgraphExec hGraphExec),
           (hGraphExec), tell_gone(hGraphExec, 1))
GRAPH_CALL(CUresult, cuGraphDestroy, cu_graph_destroy, (CUgraph hGraph), (hGraph),
           tell_gone(hGraph, 0))

/* The graph stream's capture builds, or NULL; asked only once a capture has begun. */
static CUgraph stream_graph(CUstream stream)
{
    if (!atomic_load(&captures_begun))
        return NULL;
    __typeof__(real.cu_stream_get_capture_info) info =
        (__typeof__(real.cu_stream_get_capture_info))resolve(R_cu_stream_get_capture_info);
    int status = 0;
    CUgraph graph = NULL;
    if (!info || info(stream, &status, NULL, &graph, NULL, NULL) != CUDA_SUCCESS || status == 0)
        return NULL;
    return graph;
}

/*
 * A capture that fails (invalidated, unjoined) destroys the graph it built:
 * what was freed into it is freed. The graph is asked for before the real
 * call, once a capture has begun.
 */
static CUgraph capture_graph(CUstream stream)
{
    return core_listens() ? stream_graph(stream) : NULL;
}

/* An end of capture; the core hears of the graph the capture built when the
 * call fails (the runtime's cudaStreamEndCapture reaches the driver's quiet). */
#define END_CAPTURE(ret, name, field, params, args, stream)                                    \
    EXPORT ret name params                                                                     \
    {                                                                                          \
        REAL(real_end, field);                                                                 \
        CUgraph building = capture_graph(stream);                                              \
        ret rc;                                                                                \
        CALL_QUIET(rc, real_end args);                                                         \
        if (rc != 0 && building)                                                               \
            tell_gone(building, 0);                                                            \
        return rc;                                                                             \
    }

END_CAPTURE(cudaError_t, cudaStreamEndCapture, stream_end_capture,
            (cudaStream_t stream, cudaGraph_t *pGraph), (stream, pGraph), (CUstream)stream)
END_CAPTURE(CUresult, cuStreamEndCapture, cu_stream_end_capture, (CUstream hStream, CUgraph *phGraph),
            (hStream, phGraph), hStream)
/* The per-thread default stream, as the driver's other names call it. */
END_CAPTURE(CUresult, cuStreamEndCapture_ptsz, cu_stream_end_capture_ptsz,
            (CUstream hStream, CUgraph *phGraph), (hStream, phGraph),
            hStream ? hStream : CU_STREAM_PER_THREAD)

/* ---- the driver's memory API ---- */

/* The device of the calling thread's current context. */
static CUresult context_device(int32_t *device)
{
    __typeof__(real.cu_ctx_get_device) get =
        (__typeof__(real.cu_ctx_get_device))resolve(R_cu_ctx_get_device);
    CUdevice d = 0;
    CUresult rc = get ? get(&d) : CUDA_ERROR_NOT_FOUND;
    *device = d;
    return rc;
}

/*
 * The driver's calls reach the core like the runtime's, as CUresult codes
 * and without the runtime's last error. In a device's primary context the
 * core serves them from that device's pool; in a context the application
 * created (below), the core counts them and the front passes them through.
 * A call the core cannot place (no current context, a null pointer, zero
 * bytes) gets the real driver's own answer.
 */

/* Records a driver allocation passed through on the early route; undoes it if it cannot. */
static CUresult driver_early(CUresult rc, const CUdeviceptr *dptr, uint64_t size)
{
    int32_t device = 0;
    if (rc != CUDA_SUCCESS)
        return rc;
    CUdeviceptr p = *dptr;
    if (context_device(&device) != CUDA_SUCCESS ||
        early_record((void *)(uintptr_t)p, size, device) != cudaSuccess) {
        __typeof__(real.cu_mem_free) release = (__typeof__(real.cu_mem_free))resolve(R_cu_mem_free);
        if (release)
            release(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/*
 * The route of a driver allocation into dptr of size bytes: the core's only
 * when it can place it (sets *device), the real driver's otherwise; in a
 * context the application created, ROUTE_CONTEXT (sets *ctx).
 */
static enum route driver_alloc_route(CUdeviceptr *dptr, uint64_t size, int32_t *device,
                                     CUcontext *ctx)
{
    enum route r = route();
    if (r == ROUTE_CORE && (!dptr || size == 0 || context_device(device) != CUDA_SUCCESS))
        return ROUTE_REAL;
    if (r == ROUTE_CORE && (*ctx = current_created()) != NULL)
        return ROUTE_CONTEXT;
    return r;
}

/* The stream as the core sees it; in the _ptsz forms, stream 0 is the per-thread stream. */
static uint64_t driver_stream(CUstream stream, int per_thread)
{
    if (per_thread && stream == NULL)
        return stream_id(cudaStreamPerThread);
    return stream_id((cudaStream_t)stream);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    REAL(real_alloc, cu_mem_alloc);
    CUresult rc;
    int32_t device = 0;
    uint64_t p = 0;
    CUcontext ctx = NULL;
    enum route r = driver_alloc_route(dptr, bytesize, &device, &ctx);
    depth++;
    switch (r) {
    case ROUTE_CORE:
        if ((rc = (CUresult)core.cu_malloc(device, bytesize, &p)) == CUDA_SUCCESS)
            *dptr = (CUdeviceptr)p;
        break;
    case ROUTE_CONTEXT:
        if ((rc = context_take(device, bytesize)) == CUDA_SUCCESS) {
            rc = real_alloc(dptr, bytesize);
            context_took(rc, ctx, device, *dptr, bytesize);
        }
        break;
    case ROUTE_EARLY:
        rc = driver_early(real_alloc(dptr, bytesize), dptr, bytesize);
        break;
    case ROUTE_REFUSE:
        rc = CUDA_ERROR_NOT_INITIALIZED;
        break;
    default:
        rc = real_alloc(dptr, bytesize);
    }
    depth--;
    return rc;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    REAL(real_alloc, cu_mem_alloc_managed);
    CUresult rc;
    int32_t device = 0;
    uint64_t p = 0;
    CUcontext ctx = NULL;
    enum route r = driver_alloc_route(dptr, bytesize, &device, &ctx);
    depth++;
    switch (r) {
    case ROUTE_CORE:
        if ((rc = (CUresult)core.cu_malloc_managed(device, bytesize, flags, &p)) == CUDA_SUCCESS)
            *dptr = (CUdeviceptr)p;
        break;
    case ROUTE_CONTEXT:
        if ((rc = context_take(device, bytesize)) == CUDA_SUCCESS) {
            rc = real_alloc(dptr, bytesize, flags);
            context_took(rc, ctx, device, *dptr, bytesize);
        }
        break;
    case ROUTE_EARLY:
        rc = driver_early(real_alloc(dptr, bytesize, flags), dptr, bytesize);
        break;
    case ROUTE_REFUSE:
        rc = CUDA_ERROR_NOT_INITIALIZED;
        break;
    default:
        rc = real_alloc(dptr, bytesize, flags);
    }
    depth--;
    return rc;
}

/* The element sizes cuMemAllocPitch accepts; others get the driver's own answer. */
static int valid_element_size(unsigned int size)
{
    return size == 4 || size == 8 || size == 16;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                   size_t Height, unsigned int ElementSizeBytes)
{
    REAL(real_alloc, cu_mem_alloc_pitch);
    CUresult rc;
    int32_t device = 0;
    uint64_t p = 0, pitch = 0;
    CUcontext ctx = NULL;
    enum route r = driver_alloc_route(dptr, (uint64_t)WidthInBytes * Height, &device, &ctx);
    if ((r == ROUTE_CORE || r == ROUTE_CONTEXT) &&
        (!pPitch || !valid_element_size(ElementSizeBytes) ||
         Height > UINT64_MAX / pitch_bound(WidthInBytes)))
        r = ROUTE_REAL;
    depth++;
    switch (r) {
    case ROUTE_CORE:
        rc = (CUresult)core.cu_malloc_pitch(device, WidthInBytes, Height, &p, &pitch);
        if (rc == CUDA_SUCCESS) {
            *dptr = (CUdeviceptr)p;
            *pPitch = (size_t)pitch;
        }
        break;
    case ROUTE_CONTEXT: /* taken at the widest pitch the driver may choose */
        if ((rc = context_take(device, pitch_bound(WidthInBytes) * Height)) == CUDA_SUCCESS) {
            rc = real_alloc(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
            context_took(rc, ctx, device, *dptr, pitch_bound(WidthInBytes) * Height);
        }
        break;
    case ROUTE_EARLY:
        rc = real_alloc(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
        rc = driver_early(rc, dptr, rc == CUDA_SUCCESS ? (uint64_t)*pPitch * Height : 0);
        break;
    case ROUTE_REFUSE:
        rc = CUDA_ERROR_NOT_INITIALIZED;
        break;
    default:
        rc = real_alloc(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    }
    depth--;
    return rc;
}

static CUresult mem_alloc_async(CUdeviceptr *dptr, size_t bytesize, CUstream stream,
                                int per_thread)
{
    __typeof__(real.cu_mem_alloc_async) real_alloc =
        (__typeof__(real.cu_mem_alloc_async))resolve(per_thread ? R_cu_mem_alloc_async_ptsz
                                                                : R_cu_mem_alloc_async);
    if (!real_alloc)
        return missing_real(per_thread ? R_cu_mem_alloc_async_ptsz : R_cu_mem_alloc_async);
    CUresult rc;
    int32_t device = 0;
    uint64_t p = 0;
    CUcontext ctx = NULL;
    enum route r = driver_alloc_route(dptr, bytesize, &device, &ctx);
    depth++;
    switch (stream_route(r, stream, bytesize, &device, &ctx)) {
    case ROUTE_CORE:
        rc = (CUresult)core.cu_malloc_async(device, bytesize, driver_stream(stream, per_thread), &p);
        if (rc == CUDA_SUCCESS)
            *dptr = (CUdeviceptr)p;
        break;
    case ROUTE_CONTEXT:
        if ((rc = context_take(device, bytesize)) == CUDA_SUCCESS) {
            rc = real_alloc(dptr, bytesize, stream);
            context_took(rc, ctx, device, *dptr, bytesize);
        }
        break;
    case ROUTE_EARLY:
        rc = driver_early(real_alloc(dptr, bytesize, stream), dptr, bytesize);
        break;
    case ROUTE_REFUSE:
        rc = CUDA_ERROR_NOT_INITIALIZED;
        break;
    default:
        rc = real_alloc(dptr, bytesize, stream);
    }
    depth--;
    return rc;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return mem_alloc_async(dptr, bytesize, hStream, 0);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return mem_alloc_async(dptr, bytesize, hStream, 1);
}

static CUresult mem_free_async(CUdeviceptr dptr, CUstream stream, int per_thread)
{
    __typeof__(real.cu_mem_free_async) real_free =
        (__typeof__(real.cu_mem_free_async))resolve(per_thread ? R_cu_mem_free_async_ptsz
                                                               : R_cu_mem_free_async);
    if (!real_free)
        return missing_real(per_thread ? R_cu_mem_free_async_ptsz : R_cu_mem_free_async);
    CUresult rc;
    struct context_block b;
    enum route r = route();
    depth++;
    enum route fr = free_route(r, (uint64_t)dptr, &b);
    rc = fr == ROUTE_CORE
             ? (CUresult)core.cu_free_async((uint64_t)dptr, driver_stream(stream, per_thread),
                                            free_context(stream))
             : real_free(dptr, stream);
    if (fr == ROUTE_CONTEXT)
        context_freed_async(rc, (uint64_t)dptr, &b,
                            per_thread && !stream ? CU_STREAM_PER_THREAD : stream);
    depth--;
    return rc;
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return mem_free_async(dptr, hStream, 0);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return mem_free_async(dptr, hStream, 1);
}

/*
 * An allocation from an explicit memory pool: its bytes are taken on the
 * pool's device (pool_place), passed to the real function and recorded
 * like a created context's allocation, so every free path gives them back.
 * Never pooled: the application chose its pool.
 */
static CUresult mem_alloc_from_pool_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                          CUstream stream, int per_thread)
{
    int which =
        per_thread ? R_cu_mem_alloc_from_pool_async_ptsz : R_cu_mem_alloc_from_pool_async;
    __typeof__(real.cu_mem_alloc_from_pool_async) real_alloc =
        (__typeof__(real.cu_mem_alloc_from_pool_async))resolve(which);
    if (!real_alloc)
        return missing_real(which);
    CUresult rc;
    int32_t device = 0;
    CUcontext ctx = NULL;
    enum route r = driver_alloc_route(dptr, bytesize, &device, &ctx);
    depth++;
    switch (r) {
    case ROUTE_CORE:
    case ROUTE_CONTEXT:
        pool_place(pool, per_thread && !stream ? CU_STREAM_PER_THREAD : stream, &device);
        rc = (CUresult)core.take(device, bytesize, SPILLWAY_TAKE_POOL);
        if (rc == CUDA_SUCCESS) {
            rc = real_alloc(dptr, bytesize, pool, stream);
            context_took(rc, ctx, device, *dptr, bytesize);
        }
        break;
    case ROUTE_REFUSE:
        rc = CUDA_ERROR_NOT_INITIALIZED;
        break;
    default:
        rc = real_alloc(dptr, bytesize, pool, stream);
    }
    depth--;
    return rc;
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream hStream)
{
    return mem_alloc_from_pool_async(dptr, bytesize, pool, hStream, 0);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream hStream)
{
    return mem_alloc_from_pool_async(dptr, bytesize, pool, hStream, 1);
}

EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                           cudaStream_t stream)
{
    REAL(real_alloc, malloc_from_pool_async);
    cudaError_t rc;
    int32_t device = 0;
    enum route r = route();
    depth++;
    if (r == ROUTE_REFUSE) {
        rc = cudaErrorInitializationError;
    } else if (r != ROUTE_CORE || !ptr || size == 0) {
        rc = real_alloc(ptr, size, memPool, stream);
    } else if ((rc = current_device(&device)) == cudaSuccess) {
        pool_place(memPool, (CUstream)stream, &device);
        rc = (cudaError_t)core.take(device, size, SPILLWAY_TAKE_RUNTIME_POOL);
        if (rc == cudaSuccess) {
            rc = real_alloc(ptr, size, memPool, stream);
            context_took((CUresult)rc, current_created(), device, (CUdeviceptr)(uintptr_t)*ptr,
                         size);
        }
    }
    depth--;
    return rc;
}

/*
 * A device's default memory pool: the allocations CUDA's default pool would
 * serve (cudaMallocAsync, and cudaMalloc alike) are Spillway's pool's, so
 * that pool answers the usage attributes of the default pool, the reset of
 * their high-water marks and cuMemPoolTrimTo (PyTorch's cudaMallocAsync
 * backend reads its statistics and empties its cache so). The real call is
 * made first, quietly: it checks the arguments and gives CUDA's error (a
 * High set to anything but 0, an unknown pool); the core hears only of a
 * success on a default pool, and only once it runs (never loading it). The
 * application's own pools, and what CUDA stores of the default pool (its
 * release threshold and reuse policies), stay CUDA's.
 */

/* After a real get that succeeded: a usage attribute of a default pool is Spillway's pool's. */
static void pool_usage(CUmemoryPool pool, int attr, void *value)
{
    if (attr < CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT || attr > CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        return;
    int device = default_pool_device(pool);
    uint64_t v = 0;
    if (device >= 0 && core.mempool_usage(device, attr, &v) == 1)
        *(cuuint64_t *)value = v;
}

/* After a real set that succeeded: a High of a default pool was set to 0. */
static void pool_reset_high(CUmemoryPool pool, int attr)
{
    if (attr != CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH && attr != CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        return;
    int device = default_pool_device(pool);
    if (device >= 0)
        core.mempool_reset_high(device, attr);
}

/* After a real trim that succeeded: Spillway's pool of a default pool's device is trimmed. */
static void pool_trim(CUmemoryPool pool, size_t keep)
{
    int device = default_pool_device(pool);
    if (device >= 0)
        core.mempool_trim(device, keep);
}

/* A memory-pool call: the real one, quiet, then tell (depth raised) when
 * it succeeded and the core listened as the call began. */
#define POOL_CALL(ret, name, field, params, args, tell)                                        \
    EXPORT ret name params                                                                     \
    {                                                                                          \
        REAL(real_call, field);                                                                \
        int listens = core_listens();                                                          \
        ret rc;                                                                                \
        CALL_QUIET(rc, real_call args);                                                        \
        if (rc == 0 && listens) {                                                              \
            depth++;                                                                           \
            tell;                                                                              \
            depth--;                                                                           \
        }                                                                                      \
        return rc;                                                                             \
    }

_Static_assert((int)cudaMemPoolAttrReservedMemCurrent == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT &&
                   (int)cudaMemPoolAttrUsedMemHigh == CU_MEMPOOL_ATTR_USED_MEM_HIGH &&
                   (int)cudaMemPoolAttrReservedMemHigh == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
               "the runtime's pool attributes are the driver's");

POOL_CALL(CUresult, cuMemPoolGetAttribute, cu_mem_pool_get_attribute,
          (CUmemoryPool pool, CUmemPool_attribute attr, void *value), (pool, attr, value),
          pool_usage(pool, attr, value))
POOL_CALL(CUresult, cuMemPoolSetAttribute, cu_mem_pool_set_attribute,
          (CUmemoryPool pool, CUmemPool_attribute attr, void *value), (pool, attr, value),
          pool_reset_high(pool, attr))
POOL_CALL(CUresult, cuMemPoolTrimTo, cu_mem_pool_trim_to, (CUmemoryPool pool, size_t minBytesToKeep),
          (pool, minBytesToKeep), pool_trim(pool, minBytesToKeep))
POOL_CALL(cudaError_t, cudaMemPoolGetAttribute, mem_pool_get_attribute,
          (cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value), (memPool, attr, value),
          pool_usage(memPool, attr, value))
POOL_CALL(cudaError_t, cudaMemPoolSetAttribute, mem_pool_set_attribute,
          (cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value), (memPool, attr, value),
          pool_reset_high(memPool, attr))
POOL_CALL(cudaError_t, cudaMemPoolTrimTo, mem_pool_trim_to,
          (cudaMemPool_t memPool, size_t minBytesToKeep), (memPool, minBytesToKeep),
          pool_trim(memPool, minBytesToKeep))

/* The application's pools: each one's device is remembered (pool_place),
 * whatever the route, so that pools made before the core runs are known.
 * The runtime's calls reach the driver's, which record the pool again. */
_Static_assert(sizeof(struct cudaMemPoolProps) == sizeof(CUmemPoolProps) &&
                   offsetof(struct cudaMemPoolProps, location) ==
                       offsetof(CUmemPoolProps, location),
               "the runtime's pool properties are the driver's");

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    REAL(real_create, cu_mem_pool_create);
    CUresult rc;
    CALL_QUIET(rc, real_create(pool, poolProps));
    if (rc == CUDA_SUCCESS)
        pool_created(*pool, poolProps->location.type, poolProps->location.id);
    return rc;
}

EXPORT cudaError_t cudaMemPoolCreate(cudaMemPool_t *memPool,
                                     const struct cudaMemPoolProps *poolProps)
{
    REAL(real_create, mem_pool_create);
    cudaError_t rc;
    CALL_QUIET(rc, real_create(memPool, poolProps));
    if (rc == cudaSuccess)
        pool_created(*memPool, poolProps->location.type, poolProps->location.id);
    return rc;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    REAL(real_destroy, cu_mem_pool_destroy);
    CUresult rc;
    CALL_QUIET(rc, real_destroy(pool));
    if (rc == CUDA_SUCCESS)
        pool_destroyed(pool);
    return rc;
}

EXPORT cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool)
{
    REAL(real_destroy, mem_pool_destroy);
    cudaError_t rc;
    CALL_QUIET(rc, real_destroy(memPool));
    if (rc == cudaSuccess)
        pool_destroyed(memPool);
    return rc;
}

/* The device's real total, or with a quota the quota, as cuMemGetInfo's total. */
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    REAL(real_total_mem, cu_device_total_mem);
    enum route r = route();
    depth++;
    CUresult rc = real_total_mem(bytes, dev);
    if (rc == CUDA_SUCCESS && r == ROUTE_CORE) {
        uint64_t total = *bytes;
        if ((rc = (CUresult)core.cu_device_total_mem(dev, &total)) == CUDA_SUCCESS)
            *bytes = (size_t)total;
    }
    depth--;
    return rc;
}

/*
 * Resetting the primary context destroys every allocation on the device:
 * the core drops the device's pool first. cuCtxSynchronize, like
 * cudaDeviceSynchronize, tells the pool its stream-ordered frees are done
 * (not in a created context, whose synchronization does not cover them).
 * Both reach the core only once it runs and never load it.
 */
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    REAL(real_reset, cu_primary_ctx_reset);
    if (!core_listens())
        return real_reset(dev);
    /* The core drops dev's pool and resets dev, through the runtime where the
     * process has one and through the driver where it has none. */
    depth++;
    CUresult rc = (CUresult)core.cu_device_reset(dev);
    depth--;
    return rc;
}

EXPORT CUresult cuCtxSynchronize(void)
{
    REAL(real_synchronize, cu_ctx_synchronize);
    CUresult rc;
    int32_t device;
    if (core_listens() && !current_created() && context_device(&device) == CUDA_SUCCESS) {
        depth++;
        rc = (CUresult)core.cu_device_synchronize(device);
        depth--;
        return rc;
    }
    return real_synchronize();
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    REAL(real_free, cu_mem_free);
    CUresult rc;
    struct context_block b;
    enum route r = route();
    depth++;
    enum route fr = free_route(r, (uint64_t)dptr, &b);
    rc = fr == ROUTE_CORE ? (CUresult)core.cu_free((uint64_t)dptr) : real_free(dptr);
    if (fr == ROUTE_CONTEXT)
        context_freed(rc, (uint64_t)dptr, &b);
    depth--;
    return rc;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    REAL(real_mem_get_info, cu_mem_get_info);
    CUresult rc;
    int32_t device;
    enum route r = route();
    depth++;
    if (r == ROUTE_CORE && context_device(&device) == CUDA_SUCCESS) {
        uint64_t f = 0, t = 0;
        rc = (CUresult)core.cu_mem_get_info(device, &f, &t);
        if (rc == CUDA_SUCCESS) {
            if (free)
                *free = (size_t)f;
            if (total)
                *total = (size_t)t;
        }
    } else {
        rc = real_mem_get_info(free, total);
        if (rc == CUDA_SUCCESS && r == ROUTE_REFUSE && free)
            *free = 0; /* allocations are refused: none of it is the process's */
    }
    depth--;
    return rc;
}

/* ---- NVML ---- */

/*
 * NVML numbers devices its own way (all of them, by PCI order); CUDA by
 * CUDA_VISIBLE_DEVICES and its ordering. A device is matched to its CUDA
 * ordinal by its UUID, through the driver, which the front loads (and
 * initialises) for the purpose when the process has not. -1: no match.
 */
static int cuda_ordinal(nvmlDevice_t device)
{
    char want[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    __typeof__(real.nvml_device_uuid) uuid_of =
        (__typeof__(real.nvml_device_uuid))resolve(R_nvml_device_uuid);
    if (!uuid_of || uuid_of(device, want, sizeof want) != NVML_SUCCESS)
        return -1;
    if (!resolve(R_cu_init))
        dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); /* kept: the mapping needs it again */
    __typeof__(real.cu_init) init = (__typeof__(real.cu_init))resolve(R_cu_init);
    __typeof__(real.cu_device_get_count) count_devices =
        (__typeof__(real.cu_device_get_count))resolve(R_cu_device_get_count);
    __typeof__(real.cu_device_get) get = (__typeof__(real.cu_device_get))resolve(R_cu_device_get);
    __typeof__(real.cu_device_get_uuid) uuid =
        (__typeof__(real.cu_device_get_uuid))resolve(R_cu_device_get_uuid);
    int n = 0;
    if (!init || !count_devices || !get || !uuid || init(0) != CUDA_SUCCESS ||
        count_devices(&n) != CUDA_SUCCESS)
        return -1;
    for (int i = 0; i < n; i++) {
        CUdevice dev;
        CUuuid u;
        char have[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        if (get(&dev, i) != CUDA_SUCCESS || uuid(&u, dev) != CUDA_SUCCESS)
            continue;
        const unsigned char *b = (const unsigned char *)u.bytes;
        snprintf(have, sizeof have,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                 b[14], b[15]);
        if (strcmp(have, want) == 0)
            return i;
    }
    return -1;
}

/*
 * NVML's memory figures as this process may see them: with a quota on the
 * device, total = the quota and used = what Spillway counts against it.
 * Returns 0 when the figures stand as NVML gave them, and NVML_NONE_FREE
 * when every allocation is refused (an invalid configuration, or a quota
 * and no core): none of the device's memory is the process's, as
 * cudaMemGetInfo then says.
 * Without a quota configured, NVML never loads the core (a monitoring tool
 * that uses only NVML starts no Go runtime).
 */
#define NVML_NONE_FREE (-1)
static int nvml_as_limited(nvmlDevice_t device, unsigned long long *total,
                           unsigned long long *used)
{
    int ordinal;
    if (atomic_load_explicit(&state, memory_order_acquire) != READY && !quota_configured())
        return 0;
    /* The ordinal first: it loads the driver, which the core starts on in a
     * process that has used only NVML so far. */
    ordinal = cuda_ordinal(device);
    enum route r = route();
    if (r == ROUTE_REFUSE)
        return NVML_NONE_FREE;
    if (r != ROUTE_CORE || ordinal < 0)
        return 0;
    uint64_t t = *total, u = *used;
    depth++;
    int32_t rc = core.nvml_memory(ordinal, &t, &u);
    depth--;
    if (rc == cudaErrorInitializationError)
        return NVML_NONE_FREE;
    if (rc != cudaSuccess || (t == *total && u == *used))
        return 0;
    *total = t;
    *used = u < t ? u : t;
    return 1;
}

/*
 * Free under a quota: what is left of it, never more than the device
 * really has free (the GPU's other processes hold the rest), as
 * cudaMemGetInfo reports. nvml_as_limited keeps used within total.
 */
static unsigned long long quota_free(unsigned long long total, unsigned long long used,
                                     unsigned long long device_free)
{
    unsigned long long left = total - used;
    return left < device_free ? left : device_free;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    REAL(real_memory_info, nvml_memory_info);
    nvmlReturn_t rc = real_memory_info(device, memory);
    if (rc != NVML_SUCCESS || depth > 0)
        return rc;
    int limited = nvml_as_limited(device, &memory->total, &memory->used);
    if (limited == NVML_NONE_FREE)
        memory->used = memory->total;
    if (limited)
        memory->free = quota_free(memory->total, memory->used, memory->free);
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    REAL(real_memory_info, nvml_memory_info_v2);
    nvmlReturn_t rc = real_memory_info(device, memory);
    if (rc != NVML_SUCCESS || depth > 0)
        return rc;
    int limited = nvml_as_limited(device, &memory->total, &memory->used);
    if (limited == NVML_NONE_FREE)
        memory->used = memory->total;
    if (limited) {
        memory->reserved = 0;
        memory->free = quota_free(memory->total, memory->used, memory->free);
    }
    return rc;
}

/* This process's entry in a process list: what Spillway counts, when it has a quota. */
static void own_process_usage(nvmlDevice_t device, unsigned int count, nvmlProcessInfo_t *infos)
{
    unsigned int self = (unsigned int)getpid();
    for (unsigned int i = 0; infos && i < count; i++)
        if (infos[i].pid == self) {
            unsigned long long total = ~0ull, used = infos[i].usedGpuMemory;
            if (nvml_as_limited(device, &total, &used) > 0)
                infos[i].usedGpuMemory = used;
            return;
        }
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    REAL(real_processes, nvml_processes_v2);
    nvmlReturn_t rc = real_processes(device, infoCount, infos);
    if (rc == NVML_SUCCESS && depth == 0)
        own_process_usage(device, *infoCount, infos);
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    REAL(real_processes, nvml_processes_v3);
    nvmlReturn_t rc = real_processes(device, infoCount, infos);
    if (rc == NVML_SUCCESS && depth == 0)
        own_process_usage(device, *infoCount, infos);
    return rc;
}

/* ---- the driver's lookup ---- */

/* Every interposed function, declared (some are defined below). */
#define SPILLWAY_INTERPOSED(ret, field, name, params) EXPORT ret name params;
#include "calls.h"

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

/* ---- contexts: creation and destruction ---- */

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    REAL(real_create, cu_ctx_create);
    CUresult rc = real_create(pctx, flags, dev);
    if (rc == CUDA_SUCCESS && depth == 0)
        created_add(*pctx);
    return rc;
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                               unsigned int flags, CUdevice dev)
{
    REAL(real_create, cu_ctx_create_v3);
    CUresult rc = real_create(pctx, paramsArray, numParams, flags, dev);
    if (rc == CUDA_SUCCESS && depth == 0)
        created_add(*pctx);
    return rc;
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                               unsigned int flags, CUdevice dev)
{
    REAL(real_create, cu_ctx_create_v4);
    CUresult rc = real_create(pctx, ctxCreateParams, flags, dev);
    if (rc == CUDA_SUCCESS && depth == 0)
        created_add(*pctx);
    return rc;
}

/* ctx is gone: the core gives back what was allocated in it. */
static void context_gone(CUcontext ctx)
{
    if (depth > 0 || atomic_load_explicit(&state, memory_order_acquire) != READY)
        return;
    uint64_t n = 0;
    depth++;
    core.ctx_destroyed((uint64_t)(uintptr_t)ctx, &n);
    depth--;
    atomic_fetch_sub(&context_blocks, (long)n);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    REAL(real_destroy, cu_ctx_destroy);
    CUresult rc = real_destroy(ctx);
    if (rc == CUDA_SUCCESS && created_remove(ctx))
        context_gone(ctx);
    return rc;
}

EXPORT CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags)
{
    REAL(real_attach, cu_ctx_attach);
    CUresult rc = real_attach(pctx, flags);
    if (rc == CUDA_SUCCESS && pctx)
        created_usage(*pctx, 1);
    return rc;
}

EXPORT CUresult cuCtxDetach(CUcontext ctx)
{
    REAL(real_detach, cu_ctx_detach);
    CUresult rc = real_detach(ctx);
    if (rc == CUDA_SUCCESS && created_usage(ctx, -1) == 0)
        context_gone(ctx);
    return rc;
}

/* ---- the virtual-memory API ---- */

/*
 * Whether a cuMemCreate the quota refused may be placed on the host
 * instead: nothing in prop asks what host-located memory may not give (a
 * shareable handle, compression, GPUDirect RDMA, a special usage).
 */
static int host_placeable(const CUmemAllocationProp *prop)
{
    return prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE &&
           prop->allocFlags.compressionType == CU_MEM_ALLOCATION_COMP_NONE &&
           prop->allocFlags.gpuDirectRDMACapable == 0 && prop->allocFlags.usage == 0;
}

/*
 * Each virtual-memory call and the core's record of it happen under one
 * lock, so that the core hears them in the order CUDA did them: a handle or
 * an address another thread reuses in between (unmapped here, mapped there)
 * is never recorded out of turn.
 */
static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;

/* The real cuMemCreate of memory whose bytes were taken on device for
 * kind: the core records the handle, or the bytes are given back. */
static CUresult create_taken(__typeof__(real.cu_mem_create) real_create, CUmemGenericAllocationHandle *handle,
                             size_t size, const CUmemAllocationProp *prop, unsigned long long flags,
                             int32_t device, int32_t kind)
{
    pthread_mutex_lock(&vmm_lock);
    CUresult rc = real_create(handle, size, prop, flags);
    if (rc == CUDA_SUCCESS)
        core.vmm_created(*handle, device, size, kind);
    pthread_mutex_unlock(&vmm_lock);
    if (rc != CUDA_SUCCESS)
        core.give(device, size, kind);
    return rc;
}

/*
 * cuMemCreate's device-located physical memory is taken from the quota
 * before the real call (refused with CUDA_ERROR_OUT_OF_MEMORY when it does
 * not fit); the core follows each handle's releases and mappings and gives
 * the bytes back when CUDA frees them. When the quota refuses a placeable
 * request (quietly: the host may take it) and the device oversubscribes
 * (SPILLWAY_TAKE_VMM_HOST is admitted within the host limit, or refused and
 * reported), it is made host-located on NUMA node 0, as the pool's own
 * spilled granules are: the application maps it and sets the device's
 * access as it would for device memory. Host-located memory the
 * application asks for, and calls while the core is not running, pass
 * through uncounted; the others reach the core only once it runs and never
 * load it.
 */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    REAL(real_create, cu_mem_create);
    enum route r = route();
    if (r == ROUTE_REFUSE)
        return CUDA_ERROR_NOT_INITIALIZED;
    __typeof__(real.cu_device_get_count) count_devices =
        (__typeof__(real.cu_device_get_count))resolve(R_cu_device_get_count);
    int n = 0;
    if (r != ROUTE_CORE || !handle || !prop || size == 0 ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !count_devices ||
        count_devices(&n) != CUDA_SUCCESS || prop->location.id < 0 || prop->location.id >= n)
        return real_create(handle, size, prop, flags); /* CUDA's own answer */
    int32_t device = prop->location.id;
    depth++;
    int placeable = host_placeable(prop);
    CUresult rc = (CUresult)core.take(device, size, placeable ? SPILLWAY_TAKE_VMM | SPILLWAY_TAKE_QUIET : SPILLWAY_TAKE_VMM);
    if (rc == CUDA_SUCCESS) {
        rc = create_taken(real_create, handle, size, prop, flags, device, SPILLWAY_TAKE_VMM);
    } else if (rc == CUDA_ERROR_OUT_OF_MEMORY && placeable &&
               core.take(device, size, SPILLWAY_TAKE_VMM_HOST) == CUDA_SUCCESS) {
        CUmemAllocationProp host = *prop;
        host.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        host.location.id = 0;
        rc = create_taken(real_create, handle, size, &host, flags, device, SPILLWAY_TAKE_VMM_HOST);
        /* Where the driver cannot place it on the host, the quota answers
         * again, and reports a refusal (or has room by now). */
        if (rc != CUDA_SUCCESS) {
            rc = (CUresult)core.take(device, size, SPILLWAY_TAKE_VMM);
            if (rc == CUDA_SUCCESS)
                rc = create_taken(real_create, handle, size, prop, flags, device, SPILLWAY_TAKE_VMM);
        }
    }
    depth--;
    return rc;
}

/* Whether a virtual-memory call that succeeded is the core's to hear of. */
static int vmm_heard(CUresult rc)
{
    return rc == CUDA_SUCCESS && core_listens();
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    REAL(real_release, cu_mem_release);
    pthread_mutex_lock(&vmm_lock);
    CUresult rc = real_release(handle);
    if (vmm_heard(rc))
        core.vmm_released(handle);
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    REAL(real_retain, cu_mem_retain_allocation_handle);
    pthread_mutex_lock(&vmm_lock);
    CUresult rc = real_retain(handle, addr);
    if (vmm_heard(rc))
        core.vmm_retained(*handle);
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

/*
 * An import of a handle this process exported may give back that handle,
 * one more reference to its memory (which cuMemRelease then ends); one the
 * core does not know (another process's, or a new handle to the same
 * memory: CUDA promises neither) is not counted here.
 */
EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                               void *osHandle,
                                               CUmemAllocationHandleType shHandleType)
{
    REAL(real_import, cu_mem_import_from_shareable_handle);
    pthread_mutex_lock(&vmm_lock);
    CUresult rc = real_import(handle, osHandle, shHandleType);
    if (vmm_heard(rc))
        core.vmm_retained(*handle);
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    REAL(real_map, cu_mem_map);
    pthread_mutex_lock(&vmm_lock);
    CUresult rc = real_map(ptr, size, offset, handle, flags);
    if (vmm_heard(rc))
        core.vmm_mapped((uint64_t)ptr, size, handle);
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    REAL(real_unmap, cu_mem_unmap);
    pthread_mutex_lock(&vmm_lock);
    CUresult rc = real_unmap(ptr, size);
    if (vmm_heard(rc))
        core.vmm_unmapped((uint64_t)ptr, size);
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

/* ---- CUDA arrays ---- */

/*
 * An array's memory is charged its footprint, estimated from its
 * descriptor: CUDA tells an array's size only for one made with
 * CUDA_ARRAY3D_DEFERRED_MAPPING (cuArrayGetMemoryRequirements refuses the
 * others), and a GPU lays arrays out in tiles, so this is the least one
 * takes. An array_unit is how its elements pack: bytes for each block of
 * width x height elements (1 x 1 but for NV12 and the block-compressed
 * formats).
 */
struct array_unit {
    uint64_t bytes, width, height;
};

static struct array_unit format_unit(CUarray_format format, unsigned int channels)
{
    /* The plain formats pack 1, 2 or 4 channels: CUDA refuses others, so nothing is counted. */
    uint64_t packed = channels == 1 || channels == 2 || channels == 4 ? channels : 0;
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return (struct array_unit){packed, 1, 1};
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return (struct array_unit){2 * packed, 1, 1};
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return (struct array_unit){4 * packed, 1, 1};
    case CU_AD_FORMAT_NV12: /* a byte of luma per element, chroma at half resolution */
        return (struct array_unit){3, 2, 1};
    case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1:
        return (struct array_unit){1, 1, 1};
    case CU_AD_FORMAT_UNORM_INT8X2:
    case CU_AD_FORMAT_SNORM_INT8X2:
    case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1:
        return (struct array_unit){2, 1, 1};
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4:
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2:
        return (struct array_unit){4, 1, 1};
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4:
        return (struct array_unit){8, 1, 1};
    case CU_AD_FORMAT_BC1_UNORM:
    case CU_AD_FORMAT_BC1_UNORM_SRGB:
    case CU_AD_FORMAT_BC4_UNORM:
    case CU_AD_FORMAT_BC4_SNORM:
        return (struct array_unit){8, 4, 4};
    default:
        if (format >= CU_AD_FORMAT_BC2_UNORM && format <= CU_AD_FORMAT_BC7_UNORM_SRGB)
            return (struct array_unit){16, 4, 4};
        /* A format of a later CUDA: the widest element an array has. */
        return (struct array_unit){16, 1, 1};
    }
}

/* The runtime's channel descriptor: its components' bits; NV12 and the
 * block-compressed kinds, whose components are a decoded texel's, as the
 * driver's formats. */
static struct array_unit channel_unit(const struct cudaChannelFormatDesc *desc)
{
    switch (desc->f) {
    case cudaChannelFormatKindNV12:
        return format_unit(CU_AD_FORMAT_NV12, 1);
    case cudaChannelFormatKindUnsignedBlockCompressed1:
    case cudaChannelFormatKindUnsignedBlockCompressed1SRGB:
    case cudaChannelFormatKindUnsignedBlockCompressed4:
    case cudaChannelFormatKindSignedBlockCompressed4:
        return format_unit(CU_AD_FORMAT_BC1_UNORM, 4); /* 8 bytes a block */
    case cudaChannelFormatKindUnsignedBlockCompressed2:
    case cudaChannelFormatKindUnsignedBlockCompressed2SRGB:
    case cudaChannelFormatKindUnsignedBlockCompressed3:
    case cudaChannelFormatKindUnsignedBlockCompressed3SRGB:
    case cudaChannelFormatKindUnsignedBlockCompressed5:
    case cudaChannelFormatKindSignedBlockCompressed5:
    case cudaChannelFormatKindUnsignedBlockCompressed6H:
    case cudaChannelFormatKindSignedBlockCompressed6H:
    case cudaChannelFormatKindUnsignedBlockCompressed7:
    case cudaChannelFormatKindUnsignedBlockCompressed7SRGB:
        return format_unit(CU_AD_FORMAT_BC2_UNORM, 4); /* 16 bytes a block */
    default:
        break;
    }
    if (desc->x < 0 || desc->y < 0 || desc->z < 0 || desc->w < 0)
        return (struct array_unit){0, 1, 1}; /* refused by CUDA */
    /* The plain kinds have 1, 2 or 4 components from x on, all of x's size:
     * CUDA refuses others (float3 the usual one), so nothing is counted. */
    if (desc->f == cudaChannelFormatKindSigned || desc->f == cudaChannelFormatKindUnsigned ||
        desc->f == cudaChannelFormatKindFloat) {
        int n = desc->y == 0 ? 1 : desc->z == 0 ? 2 : 4;
        if (desc->y != (n > 1 ? desc->x : 0) || desc->z != (n > 2 ? desc->x : 0) ||
            desc->w != (n > 2 ? desc->x : 0))
            return (struct array_unit){0, 1, 1};
    }
    uint64_t bits = (uint64_t)desc->x + (uint64_t)desc->y + (uint64_t)desc->z + (uint64_t)desc->w;
    return (struct array_unit){(bits + 7) / 8, 1, 1};
}

/*
 * The bytes an array of width x height x depth (0 counts as 1, but for the
 * width) units of u takes; 0 when it takes none of its own (a sparse or
 * deferred-mapping array, mapped onto cuMemCreate memory, which is counted)
 * or when CUDA refuses it anyway (a zero width or unit, extents whose
 * product overflows).
 */
static uint64_t array_footprint(struct array_unit u, uint64_t width, uint64_t height, uint64_t depth,
                                unsigned int flags)
{
    if (flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING))
        return 0;
    uint64_t extents[3] = {(width + u.width - 1) / u.width,
                           ((height ? height : 1) + u.height - 1) / u.height, depth ? depth : 1};
    uint64_t n = u.bytes;
    for (int i = 0; i < 3; i++) {
        if (extents[i] == 0 || (n && extents[i] > UINT64_MAX / n))
            return 0;
        n *= extents[i];
    }
    return n;
}

/*
 * Creating and destroying an array and the core's record of it happen
 * under one lock, so that a handle CUDA reuses for a new array in another
 * thread is never recorded before the old one is forgotten.
 */
static pthread_mutex_t arrays_lock = PTHREAD_MUTEX_INITIALIZER;

/* After the real creation of an array of bytes taken on device in ctx
 * (NULL: the primary context): the core records it, or the bytes go back. */
static void array_made(int made, CUarray handle, CUcontext ctx, int32_t device, uint64_t bytes,
                       int32_t kind)
{
    if (made)
        core.array_created((uint64_t)(uintptr_t)handle, (uint64_t)(uintptr_t)ctx, device, bytes);
    else
        core.give(device, bytes, kind);
}

/*
 * A driver array of bytes is taken from the quota of its context's device
 * before the real call (refused with CUDA_ERROR_OUT_OF_MEMORY when it does
 * not fit: an array cannot live on the host, so oversubscription does not
 * take it either). Calls the core cannot place (no current context, a null
 * argument, nothing to count) get the real driver's own answer; those while
 * the core is not running pass through uncounted and never load it.
 */
#define DRIVER_ARRAY_CREATE(name, field, desc_type, footprint)                                      \
    EXPORT CUresult name(CUarray *pHandle, const desc_type *pAllocateArray)                         \
    {                                                                                               \
        REAL(real_create, field);                                                                   \
        enum route r = route();                                                                     \
        if (r == ROUTE_REFUSE)                                                                      \
            return CUDA_ERROR_NOT_INITIALIZED;                                                      \
        const desc_type *d = pAllocateArray;                                                        \
        uint64_t bytes = pHandle && d ? (footprint) : 0;                                            \
        int32_t device = 0;                                                                         \
        if (r != ROUTE_CORE || bytes == 0 || context_device(&device) != CUDA_SUCCESS)               \
            return real_create(pHandle, pAllocateArray);                                            \
        CUcontext ctx = current_created();                                                          \
        depth++;                                                                                    \
        CUresult rc = (CUresult)core.take(device, bytes, SPILLWAY_TAKE_ARRAY);                      \
        if (rc == CUDA_SUCCESS) {                                                                   \
            pthread_mutex_lock(&arrays_lock);                                                       \
            rc = real_create(pHandle, pAllocateArray);                                              \
            array_made(rc == CUDA_SUCCESS, rc == CUDA_SUCCESS ? *pHandle : NULL, ctx, device,       \
                       bytes, SPILLWAY_TAKE_ARRAY);                                                 \
            pthread_mutex_unlock(&arrays_lock);                                                     \
        }                                                                                           \
        depth--;                                                                                    \
        return rc;                                                                                  \
    }

DRIVER_ARRAY_CREATE(cuArrayCreate_v2, cu_array_create, CUDA_ARRAY_DESCRIPTOR,
                    array_footprint(format_unit(d->Format, d->NumChannels), d->Width, d->Height, 0, 0))
DRIVER_ARRAY_CREATE(cuArray3DCreate_v2, cu_array_3d_create, CUDA_ARRAY3D_DESCRIPTOR,
                    array_footprint(format_unit(d->Format, d->NumChannels), d->Width, d->Height,
                                    d->Depth, d->Flags))

/*
 * The runtime's arrays are counted here, and the driver's calls the runtime
 * makes for them pass through (depth), so that each is counted once.
 */
static cudaError_t runtime_array(cudaError_t (*make)(cudaArray_t *, const struct cudaChannelFormatDesc *,
                                                     struct cudaExtent, unsigned int),
                                 cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                                 struct cudaExtent extent, unsigned int flags)
{
    cudaError_t rc = cudaSuccess;
    int32_t device = 0;
    CUcontext ctx = NULL;
    uint64_t bytes =
        desc ? array_footprint(channel_unit(desc), extent.width, extent.height, extent.depth, flags) : 0;
    enum route r = route();
    depth++;
    switch (runtime_alloc_route(r, (void **)array, bytes, &device, &ctx, &rc)) {
    case ROUTE_CORE:
    case ROUTE_CONTEXT:
        if (bytes == 0) {
            rc = make(array, desc, extent, flags);
            break;
        }
        if ((rc = (cudaError_t)core.take(device, bytes, SPILLWAY_TAKE_RUNTIME_ARRAY)) != cudaSuccess)
            break;
        pthread_mutex_lock(&arrays_lock);
        rc = make(array, desc, extent, flags);
        array_made(rc == cudaSuccess, rc == cudaSuccess ? (CUarray)*array : NULL, ctx, device, bytes,
                   SPILLWAY_TAKE_RUNTIME_ARRAY);
        pthread_mutex_unlock(&arrays_lock);
        break;
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    case ROUTE_FAILED:
        break;
    default:
        rc = make(array, desc, extent, flags);
    }
    depth--;
    return rc;
}

/* The real cudaMallocArray, in cudaMalloc3DArray's shape. */
static cudaError_t malloc_array_3d(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                                   struct cudaExtent extent, unsigned int flags)
{
    REAL(real_malloc_array, malloc_array);
    return real_malloc_array(array, desc, extent.width, extent.height, flags);
}

EXPORT cudaError_t cudaMallocArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                                   size_t width, size_t height, unsigned int flags)
{
    return runtime_array(malloc_array_3d, array, desc, (struct cudaExtent){width, height, 0}, flags);
}

EXPORT cudaError_t cudaMalloc3DArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                                     struct cudaExtent extent, unsigned int flags)
{
    REAL(real_malloc_3d_array, malloc_3d_array);
    return runtime_array(real_malloc_3d_array, array, desc, extent, flags);
}

EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    REAL(real_destroy, cu_array_destroy);
    if (!core_listens())
        return real_destroy(hArray);
    pthread_mutex_lock(&arrays_lock);
    CUresult rc = real_destroy(hArray);
    if (rc == CUDA_SUCCESS)
        core.array_destroyed((uint64_t)(uintptr_t)hArray);
    pthread_mutex_unlock(&arrays_lock);
    return rc;
}

EXPORT cudaError_t cudaFreeArray(cudaArray_t array)
{
    REAL(real_free_array, free_array);
    if (!core_listens())
        return real_free_array(array);
    depth++;
    pthread_mutex_lock(&arrays_lock);
    cudaError_t rc = real_free_array(array);
    if (rc == cudaSuccess && array)
        core.array_destroyed((uint64_t)(uintptr_t)array);
    pthread_mutex_unlock(&arrays_lock);
    depth--;
    return rc;
}

/* ---- NVML's other memory reports ---- */

/*
 * BAR1, the window through which the host maps device memory: a process
 * with a quota sees no more of it than its quota (what it could map at
 * most), used as NVML reports it within that.
 */
EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory)
{
    REAL(real_bar1, nvml_bar1_memory_info);
    nvmlReturn_t rc = real_bar1(device, bar1Memory);
    unsigned long long quota = ~0ull, held = 0;
    if (rc == NVML_SUCCESS && depth == 0 && nvml_as_limited(device, &quota, &held) > 0 &&
        quota < bar1Memory->bar1Total) {
        bar1Memory->bar1Total = quota;
        if (bar1Memory->bar1Used > quota)
            bar1Memory->bar1Used = quota;
        bar1Memory->bar1Free = quota - bar1Memory->bar1Used;
    }
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                         unsigned int *infoCount,
                                                         nvmlProcessInfo_v1_t *infos)
{
    REAL(real_processes, nvml_processes_v1);
    nvmlReturn_t rc = real_processes(device, infoCount, infos);
    unsigned int self = (unsigned int)getpid();
    for (unsigned int i = 0; rc == NVML_SUCCESS && depth == 0 && infos && i < *infoCount; i++)
        if (infos[i].pid == self) {
            unsigned long long total = ~0ull, used = infos[i].usedGpuMemory;
            if (nvml_as_limited(device, &total, &used) > 0)
                infos[i].usedGpuMemory = used;
            break;
        }
    return rc;
}

/* Every interposed function has exactly the type of its row in calls.h. */
#define SPILLWAY_INTERPOSED(ret, field, name, params)                                          \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), __typeof__(real.field)),     \
                   #name " differs from its row in calls.h");
#include "calls.h"
