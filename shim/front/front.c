/*
 * front.c: libspillway.so, the object users put in LD_PRELOAD. This file
 * holds the probe points, the log, the loading of the core, the ledger of
 * the early route and the routes every interposed call takes; front.h says
 * which file holds the rest.
 *
 * The object defines the interposed CUDA runtime, driver and NVML functions
 * (the list is interpose/calls.h), dlsym and dlclose (dlsym.c), the probe
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
 * Some of the front's own locks guard real calls in every mode, pass-through
 * included; front_lock takes them all, having registered a fork handler
 * first, so that a child forked while another thread holds one starts it
 * afresh and gets CUDA's answer instead of waiting for a thread it lacks.
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
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "front.h"

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

void log_line(const char *fmt, ...)
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

/* ---- the core ---- */

/* What front.h describes: the core's state and entry points, the calls a thread is inside,
 * and whether a capture has begun. */
atomic_int state = UNLOADED;
struct core_entries core;
__thread int depth __attribute__((tls_model("initial-exec")));
atomic_int captures_begun;

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
    /* The child has one thread and a Go runtime that believes it has many;
     * a lock another thread held at the fork would stay held for good. */
    int s = atomic_load(&state);
    if (s == LOADING || s == READY)
        atomic_store(&state, PASSTHROUGH);
    pthread_mutex_init(&ledger_lock, NULL);
    pthread_cond_init(&ledger_ready, NULL);
    pthread_mutex_init(&created_lock, NULL);
    pthread_mutex_init(&contexts_lock, NULL);
    pthread_mutex_init(&vmm_lock, NULL);
    pthread_mutex_init(&arrays_lock, NULL);
    pthread_mutex_init(&pools_lock, NULL);
    reset_lock = (pthread_rwlock_t)PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
}

static void register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
}

/* Registers atfork_child once, before the first lock is taken or the core loads. */
static void ensure_fork_handler(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork_handler);
}

/*
 * Every lock of the front is taken here, so that the fork handler exists
 * before any of them can be held, in every mode: some guard real calls
 * with SPILLWAY_DISABLE=1 or before the core loads, and a child forked
 * meanwhile must get CUDA's answer, not wait for a thread it does not have.
 */
void front_lock(pthread_mutex_t *lock)
{
    ensure_fork_handler();
    pthread_mutex_lock(lock);
}

/* The same for a lock shared by readers. */
void front_read_lock(pthread_rwlock_t *lock)
{
    ensure_fork_handler();
    pthread_rwlock_rdlock(lock);
}

void front_write_lock(pthread_rwlock_t *lock)
{
    ensure_fork_handler();
    pthread_rwlock_wrlock(lock);
}

void *grow_table(void *items, size_t *cap, size_t item_size)
{
    size_t grown_cap = *cap ? 2 * *cap : 8;
    void *grown = realloc(items, grown_cap * item_size);
    if (grown)
        *cap = grown_cap;
    return grown;
}

static int quota_in_environment(void)
{
    extern char **environ;
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, "SPILLWAY_MEMORY_LIMIT", 21) == 0)
            return 1;
    return 0;
}

/* Whether a quota was configured when the core began to load (load_core), as the core
 * reads its settings then: a program that later removes SPILLWAY_MEMORY_LIMIT from its
 * environment (keeping it from its children) must not lift a quota that fails closed.
 * -1 until then, when the environment answers. */
static atomic_int quota_at_load = -1;

int quota_configured(void)
{
    int q = atomic_load_explicit(&quota_at_load, memory_order_acquire);
    return q >= 0 ? q : quota_in_environment();
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

/* SPILLWAY_CORE, or NULL when it is unset or empty. */
static const char *core_variable(void)
{
    const char *env = getenv("SPILLWAY_CORE");
    return env && *env ? env : NULL;
}

static int core_path(char *out, size_t n)
{
    const char *env = core_variable();
    if (env)
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
        /* A path the user gave is named with its variable, the thing to fix. */
        log_line("cannot load the core %s%s: %s; if the error is 'cannot allocate memory in static "
                 "TLS block', set GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384 (spillway "
                 "run does); until then %s",
                 path, core_variable() ? " (SPILLWAY_CORE)" : "", dlerror(), without_core());
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
    for (int i = 0; i < R_COUNT; i++)
        resolve(i); /* optional ones may stay NULL; the core checks */
    depth++; /* the core's own calls into CUDA reach the real functions */
    int32_t rc = core.init(SPILLWAY_CORE_ABI, &real, &probes);
    depth--;
    if (rc != 0) {
        log_line("the core %s refused to start (error %d)", path, rc);
        return -1;
    }
    return 0;
}

/*
 * Go's runtime aborts on a signal that lands while a thread runs Go without
 * an alternate signal stack. A thread that first entered the core with a
 * stack of its own keeps using that one, and some programs remove theirs
 * before exiting: Python's faulthandler does at shutdown, before the atexit
 * handlers run. The exiting thread gets a stack back if it has none.
 */
static void ensure_signal_stack(void)
{
    static char exit_signal_stack[64 * 1024];
    stack_t current;

    if (sigaltstack(NULL, &current) == 0 && (current.ss_flags & SS_DISABLE)) {
        stack_t ss = {.ss_sp = exit_signal_stack, .ss_size = sizeof exit_signal_stack};
        sigaltstack(&ss, NULL);
    }
}

/* At exit, the core prints SPILLWAY_REPORT's lines, unless this is a forked child. */
static void report_at_exit(void)
{
    if (atomic_load(&state) == READY && depth == 0) {
        ensure_signal_stack();
        depth++;
        core.report();
        depth--;
    }
}

static void load_core(void)
{
    atomic_store_explicit(&quota_at_load, quota_in_environment(), memory_order_release);
    /* Before the Go runtime starts: a child forked from here on never enters it. */
    ensure_fork_handler();
    loading_thread = 1;
    int ok = open_core() == 0;
    loading_thread = 0;
    if (ok)
        atexit(report_at_exit);
    front_lock(&ledger_lock);
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
    /* A capture begun while the core started (see tell_capture_begun, streams.c). */
    if (ok && atomic_load(&captures_begun)) {
        depth++;
        core.capture_begun();
        depth--;
    }
}

/* How long a thread waits for the core to start, with a quota, before failing closed. */
#define EARLY_WAIT_QUOTA_S 5

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

enum route slow_route(int s)
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
        front_lock(&ledger_lock);
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

/* Records an allocation made on the early route; adopts it if the core became ready since. */
cudaError_t early_record(void *ptr, uint64_t size, int32_t device)
{
    cudaError_t rc = cudaSuccess;
    front_lock(&ledger_lock);
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
int early_forget(void *ptr)
{
    front_lock(&ledger_lock);
    int early = atomic_load(&state) != READY;
    for (int i = 0; early && i < ledger_len; i++)
        if (ledger[i].ptr == (uint64_t)(uintptr_t)ptr) {
            ledger[i] = ledger[--ledger_len];
            break;
        }
    pthread_mutex_unlock(&ledger_lock);
    return early;
}
