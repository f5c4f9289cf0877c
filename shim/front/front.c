/*
 * front.c: libspillway.so, the object users put in LD_PRELOAD.
 *
 * It defines the interposed CUDA runtime memory functions, the probe
 * points and their semaphore, and nothing else (everything else is
 * hidden). It has no constructor: a process that never calls one of these
 * functions pays for mapping the object and nothing more, and never starts
 * a Go runtime.
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
 * cudaDeviceSynchronize and cudaStreamDestroy are interposed for the pool's
 * sake only: they reach the core once it runs and never load it. The
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

static const struct spillway_probes probes = {
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

static int collect_cudart(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct candidates *c = data;
    const char *base = strrchr(info->dlpi_name, '/');
    base = base ? base + 1 : info->dlpi_name;
    if (strncmp(base, "libcudart", 9) == 0 && c->n < MAX_CANDIDATES &&
        strlen(info->dlpi_name) < PATH_MAX)
        strcpy(c->path[c->n++], info->dlpi_name);
    return 0;
}

/*
 * RTLD_NEXT finds the runtime in the global scope. A runtime loaded with
 * RTLD_LOCAL (Python extension modules, ctypes) is not there: find it among
 * the loaded objects and look the name up in its own scope.
 */
static void *find_real(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (f && !in_self(f))
        return f;
    struct candidates c = {0};
    dl_iterate_phdr(collect_cudart, &c); /* no dlopen inside the callback */
    for (int i = 0; i < c.n; i++) {
        void *h = dlopen(c.path[i], RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            continue;
        f = dlsym(h, name);
        dlclose(h);
        if (f && !in_self(f))
            return f;
    }
    return NULL;
}

static struct spillway_real real = {.size = sizeof(struct spillway_real)};
static const char *const real_names[] = {SPILLWAY_REAL_NAMES};

/* The table's function pointers, as an array indexed in field order. */
static void **real_slot(int i)
{
    return (void **)((char *)&real + offsetof(struct spillway_real, malloc)) + i;
}

_Static_assert(sizeof(real_names) / sizeof(real_names[0]) ==
                   (sizeof(struct spillway_real) - offsetof(struct spillway_real, malloc)) /
                       sizeof(void *),
               "every field of spillway_real needs a name");

static void *resolve(int i)
{
    void **slot = real_slot(i);
    void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (!f) {
        f = find_real(real_names[i]);
        if (f)
            __atomic_store_n(slot, f, __ATOMIC_RELEASE);
    }
    return f;
}

enum {
    R_MALLOC,
    R_FREE,
    R_MALLOC_MANAGED,
    R_MALLOC_PITCH,
    R_MALLOC_ASYNC,
    R_FREE_ASYNC,
    R_MEM_GET_INFO,
    R_DEVICE_RESET,
    R_GET_DEVICE,
    R_SET_DEVICE,
    R_GET_DEVICE_COUNT,
    R_DEVICE_SYNCHRONIZE,
    R_STREAM_SYNCHRONIZE,
    R_EVENT_CREATE,
    R_EVENT_RECORD,
    R_EVENT_QUERY,
    R_EVENT_SYNCHRONIZE,
    R_EVENT_DESTROY,
    R_STREAM_DESTROY,
};

/* Yields a typed pointer to the real function, or returns an error from the caller. */
#define REAL(var, field, idx)                                                                  \
    __typeof__(real.field) var = (__typeof__(real.field))resolve(idx);                         \
    if (!var)                                                                                  \
        return missing_real(idx);

static cudaError_t missing_real(int i)
{
    static atomic_int told;
    if (!atomic_exchange(&told, 1))
        log_line("cannot find the real %s: no CUDA runtime (libcudart) is loaded in this "
                 "process; the call fails with cudaErrorSymbolNotFound",
                 real_names[i]);
    return cudaErrorSymbolNotFound;
}

/* ---- the core ---- */

enum state { UNLOADED, LOADING, READY, FAILED, PASSTHROUGH };
static atomic_int state = UNLOADED;

static struct {
    spillway_core_malloc_fn malloc;
    spillway_core_malloc_managed_fn malloc_managed;
    spillway_core_malloc_pitch_fn malloc_pitch;
    spillway_core_malloc_async_fn malloc_async;
    spillway_core_free_fn free;
    spillway_core_free_async_fn free_async;
    spillway_core_mem_get_info_fn mem_get_info;
    spillway_core_device_reset_fn device_reset;
    spillway_core_device_synchronize_fn device_synchronize;
    spillway_core_stream_destroy_fn stream_destroy;
    spillway_core_report_fn report;
    spillway_core_adopt_fn adopt;
} core;

/* Calls this thread is inside; a nested call goes straight to the real runtime. */
static __thread int depth __attribute__((tls_model("initial-exec")));
static __thread int loading_thread __attribute__((tls_model("initial-exec")));

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

static void atfork_child(void)
{
    /* The child has one thread and a Go runtime that believes it has many. */
    int s = atomic_load(&state);
    if (s == LOADING || s == READY)
        atomic_store(&state, PASSTHROUGH);
    pthread_mutex_init(&ledger_lock, NULL);
    pthread_cond_init(&ledger_ready, NULL);
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
    spillway_core_init_fn init = (spillway_core_init_fn)entry(h, "spillway_core_init", &missing);
    core.malloc = (spillway_core_malloc_fn)entry(h, "spillway_core_malloc", &missing);
    core.malloc_managed =
        (spillway_core_malloc_managed_fn)entry(h, "spillway_core_malloc_managed", &missing);
    core.malloc_pitch =
        (spillway_core_malloc_pitch_fn)entry(h, "spillway_core_malloc_pitch", &missing);
    core.malloc_async =
        (spillway_core_malloc_async_fn)entry(h, "spillway_core_malloc_async", &missing);
    core.free = (spillway_core_free_fn)entry(h, "spillway_core_free", &missing);
    core.free_async = (spillway_core_free_async_fn)entry(h, "spillway_core_free_async", &missing);
    core.mem_get_info =
        (spillway_core_mem_get_info_fn)entry(h, "spillway_core_mem_get_info", &missing);
    core.device_reset =
        (spillway_core_device_reset_fn)entry(h, "spillway_core_device_reset", &missing);
    core.device_synchronize = (spillway_core_device_synchronize_fn)entry(
        h, "spillway_core_device_synchronize", &missing);
    core.stream_destroy =
        (spillway_core_stream_destroy_fn)entry(h, "spillway_core_stream_destroy", &missing);
    core.report = (spillway_core_report_fn)entry(h, "spillway_core_report", &missing);
    core.adopt = (spillway_core_adopt_fn)entry(h, "spillway_core_adopt", &missing);
    if (missing) {
        log_line("the core %s lacks an entry point (a front and a core from different builds?)",
                 path);
        return -1;
    }
    for (size_t i = 0; i < sizeof real_names / sizeof real_names[0]; i++)
        resolve((int)i); /* optional ones may stay NULL; the core checks */
    int32_t rc = init(SPILLWAY_CORE_ABI, &real, &probes);
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
    if (ok)
        for (int i = 0; i < ledger_len; i++)
            core.adopt(ledger[i].ptr, ledger[i].size, ledger[i].device);
    ledger_len = 0;
    atomic_store(&state, ok ? READY : FAILED);
    pthread_cond_broadcast(&ledger_ready);
    pthread_mutex_unlock(&ledger_lock);
}

/* How long a thread waits for the core to start, with a quota, before failing closed. */
#define EARLY_WAIT_QUOTA_S 5

enum route {
    ROUTE_REAL,   /* straight to the real runtime */
    ROUTE_CORE,   /* through the Go core */
    ROUTE_EARLY,  /* the core is starting: pass through and keep a ledger */
    ROUTE_REFUSE, /* no core (failed, or still starting) and a quota is configured */
};

static enum route slow_route(int s)
{
    if (s == UNLOADED) {
        const char *off = getenv("SPILLWAY_DISABLE");
        if (off && strcmp(off, "1") == 0) {
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
    if (depth == 0 && atomic_load_explicit(&state, memory_order_acquire) == READY) {
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
    REAL(get_device, get_device, R_GET_DEVICE);
    int d = 0;
    cudaError_t rc = get_device(&d);
    *device = d;
    return rc;
}

/* Records an allocation passed through on the early route; undoes it if it cannot be recorded. */
static cudaError_t early_alloc(cudaError_t rc, void *ptr, uint64_t size)
{
    if (rc != cudaSuccess)
        return rc;
    int32_t device = 0;
    if (current_device(&device) != cudaSuccess || early_record(ptr, size, device) != cudaSuccess) {
        __typeof__(real.free) release = (__typeof__(real.free))resolve(R_FREE);
        if (release)
            release(ptr);
        return cudaErrorMemoryAllocation;
    }
    return cudaSuccess;
}

/* ---- the interposed functions ---- */

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    REAL(real_malloc, malloc, R_MALLOC);
    cudaError_t rc;
    enum route r = route();
    depth++;
    switch (r) {
    case ROUTE_CORE: {
        int32_t device;
        uint64_t p = 0;
        if ((rc = current_device(&device)) != cudaSuccess)
            break;
        if (!devPtr) { /* CUDA's own answer, which also sets the last error */
            rc = real_malloc(devPtr, size);
            break;
        }
        rc = core.malloc(device, size, &p);
        if (rc == cudaSuccess)
            *devPtr = (void *)(uintptr_t)p;
        break;
    }
    case ROUTE_EARLY: {
        rc = real_malloc(devPtr, size);
        rc = early_alloc(rc, devPtr ? *devPtr : NULL, size);
        break;
    }
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    default:
        rc = real_malloc(devPtr, size);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    REAL(real_malloc_managed, malloc_managed, R_MALLOC_MANAGED);
    cudaError_t rc;
    enum route r = route();
    depth++;
    switch (r) {
    case ROUTE_CORE: {
        int32_t device;
        uint64_t p = 0;
        if ((rc = current_device(&device)) != cudaSuccess)
            break;
        if (!devPtr) {
            rc = real_malloc_managed(devPtr, size, flags);
            break;
        }
        rc = core.malloc_managed(device, size, flags, &p);
        if (rc == cudaSuccess)
            *devPtr = (void *)(uintptr_t)p;
        break;
    }
    case ROUTE_EARLY: {
        rc = real_malloc_managed(devPtr, size, flags);
        rc = early_alloc(rc, devPtr ? *devPtr : NULL, size);
        break;
    }
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    default:
        rc = real_malloc_managed(devPtr, size, flags);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    REAL(real_malloc_pitch, malloc_pitch, R_MALLOC_PITCH);
    cudaError_t rc;
    enum route r = route();
    depth++;
    switch (r) {
    case ROUTE_CORE: {
        int32_t device;
        uint64_t p = 0, pt = 0;
        if ((rc = current_device(&device)) != cudaSuccess)
            break;
        if (!devPtr || !pitch) {
            rc = real_malloc_pitch(devPtr, pitch, width, height);
            break;
        }
        rc = core.malloc_pitch(device, width, height, &p, &pt);
        if (rc == cudaSuccess) {
            *devPtr = (void *)(uintptr_t)p;
            *pitch = (size_t)pt;
        }
        break;
    }
    case ROUTE_EARLY: {
        rc = real_malloc_pitch(devPtr, pitch, width, height);
        rc = early_alloc(rc, devPtr ? *devPtr : NULL,
                         rc == cudaSuccess ? (uint64_t)*pitch * height : 0);
        break;
    }
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    default:
        rc = real_malloc_pitch(devPtr, pitch, width, height);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
    REAL(real_malloc_async, malloc_async, R_MALLOC_ASYNC);
    cudaError_t rc;
    enum route r = route();
    depth++;
    switch (r) {
    case ROUTE_CORE: {
        int32_t device;
        uint64_t p = 0;
        if ((rc = current_device(&device)) != cudaSuccess)
            break;
        if (!devPtr) {
            rc = real_malloc_async(devPtr, size, stream);
            break;
        }
        rc = core.malloc_async(device, size, stream_id(stream), &p);
        if (rc == cudaSuccess)
            *devPtr = (void *)(uintptr_t)p;
        break;
    }
    case ROUTE_EARLY: {
        rc = real_malloc_async(devPtr, size, stream);
        rc = early_alloc(rc, devPtr ? *devPtr : NULL, size);
        break;
    }
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    default:
        rc = real_malloc_async(devPtr, size, stream);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaFree(void *devPtr)
{
    REAL(real_free, free, R_FREE);
    cudaError_t rc;
    enum route r = route();
    depth++;
    if (r == ROUTE_EARLY && !early_forget(devPtr))
        r = ROUTE_CORE;
    if (r == ROUTE_CORE) {
        rc = core.free((uint64_t)(uintptr_t)devPtr);
    } else {
        rc = real_free(devPtr);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
    REAL(real_free_async, free_async, R_FREE_ASYNC);
    cudaError_t rc;
    enum route r = route();
    depth++;
    if (r == ROUTE_EARLY && !early_forget(devPtr))
        r = ROUTE_CORE;
    if (r == ROUTE_CORE) {
        rc = core.free_async((uint64_t)(uintptr_t)devPtr, stream_id(stream));
    } else {
        rc = real_free_async(devPtr, stream);
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
    REAL(real_mem_get_info, mem_get_info, R_MEM_GET_INFO);
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
    }
    depth--;
    return rc;
}

EXPORT cudaError_t cudaDeviceReset(void)
{
    REAL(real_device_reset, device_reset, R_DEVICE_RESET);
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
 * the core runs: they never load it.
 */
EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    REAL(real_device_synchronize, device_synchronize, R_DEVICE_SYNCHRONIZE);
    cudaError_t rc;
    if (depth == 0 && atomic_load_explicit(&state, memory_order_acquire) == READY) {
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
    REAL(real_stream_destroy, stream_destroy, R_STREAM_DESTROY);
    cudaError_t rc;
    if (depth == 0 && atomic_load_explicit(&state, memory_order_acquire) == READY &&
        stream != cudaStreamPerThread && stream != cudaStreamLegacy && stream != NULL) {
        depth++;
        rc = core.stream_destroy((uint64_t)(uintptr_t)stream);
        depth--;
        return rc;
    }
    return real_stream_destroy(stream);
}
