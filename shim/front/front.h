/*
 * front.h: what the files of the front (libspillway.so) share. Everything
 * declared here is hidden: the object exports only what a file marks
 * EXPORT (the interposed functions, declared at the end), dlsym and dlclose
 * (dlsym.c) and the probe points and their semaphore (front.c).
 *
 *   front.c     the probe points, the log, loading the core, the ledger of
 *               the early route, and the routes every call takes
 *   real.c      finding the real functions, and handing out the front's in
 *               their stead (cuGetProcAddress, cudaGetDriverEntryPoint, dlsym)
 *   runtime.c   the runtime's interposed memory calls and the current device
 *   driver.c    the driver's memory API
 *   streams.c   the stream a call is made on: its identity for the core, its
 *               device and context, its destruction, and stream capture's graphs
 *   pools.c     memory pools: the application's, and a device's default pool
 *   contexts.c  contexts the application created, and what is allocated in them
 *   vmm.c       the virtual-memory API
 *   arrays.c    CUDA arrays
 *   nvml.c      NVML's memory reports
 *   dlsym.c     dlsym and dlclose (dlsym.h)
 *
 * The hot path of every call (resolve, route, core_listens) is inline here,
 * so that no file pays a call for it.
 */
#ifndef SPILLWAY_FRONT_H
#define SPILLWAY_FRONT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "abi.h"
#include "dlsym.h"

#define EXPORT __attribute__((visibility("default")))

#pragma GCC visibility push(hidden)

/* ---- the real functions (real.c) ---- */

/* The table of real functions handed to the core. */
extern struct spillway_real real;

/* R_<field>: a real function's index in the table. */
enum {
#define SPILLWAY_REAL(ret, field, name, params) R_##field,
#define SPILLWAY_INTERPOSED SPILLWAY_REAL
#include "calls.h"
    R_COUNT
};

/* The CUDA names of the table's entries, in field order. */
extern const char *const real_names[R_COUNT];

/* The table's function pointers, as an array indexed in field order. */
static inline void **real_slot(int i)
{
    return (void **)((char *)&real + offsetof(struct spillway_real, malloc)) + i;
}

_Static_assert(R_COUNT == (sizeof(struct spillway_real) - offsetof(struct spillway_real, malloc)) /
                              sizeof(void *),
               "every field of spillway_real needs a row in calls.h");

void *find_real(const char *name);
__attribute__((noinline, cold)) unsigned int refresh_real(unsigned int unloads);

/* The count of CUDA libraries closed (front_unloads) the table was last refreshed at. */
extern unsigned int real_refreshed;

/* The real function with index i; NULL if the process has none. */
static inline void *resolve(int i)
{
    unsigned int unloads = __atomic_load_n(&front_unloads, __ATOMIC_ACQUIRE);
    if (__builtin_expect(unloads != __atomic_load_n(&real_refreshed, __ATOMIC_RELAXED), 0)) {
        __atomic_store_n(&real_refreshed, refresh_real(unloads), __ATOMIC_RELAXED);
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

int missing_real(int i);

/* ---- the core and the routes (front.c) ---- */

void log_line(const char *fmt, ...);

/* A table of *cap items of item_size bytes moved to one with more room
 * (double, 8 at first; *cap updated), or NULL, items and *cap unchanged,
 * when the host has no memory for it. */
void *grow_table(void *items, size_t *cap, size_t item_size);

enum state { UNLOADED, LOADING, READY, FAILED, PASSTHROUGH };
extern atomic_int state;

/* The core's entry points, once loaded. */
struct core_entries {
#define SPILLWAY_ENTRY(name, params) spillway_core_##name##_fn name;
#include "calls.h"
};
extern struct core_entries core;

/* Calls this thread is inside; a nested call goes straight to the real runtime. */
extern __thread int depth __attribute__((tls_model("initial-exec")));

/* Runs a real call quiet: the interposed calls it makes pass through (depth). */
#define CALL_QUIET(rc, call)                                                                   \
    do {                                                                                       \
        depth++;                                                                               \
        rc = (call);                                                                           \
        depth--;                                                                               \
    } while (0)

/* Whether the core hears of this call: it runs, and the call is not one of
 * its own (or of the real runtime's, below an interposed call). */
static inline int core_listens(void)
{
    return depth == 0 && atomic_load_explicit(&state, memory_order_acquire) == READY;
}

/* Set by the first capture (streams.c); read by load_core after it sets READY, so
 * that the core hears of a capture whichever of the two comes first. */
extern atomic_int captures_begun;

/* Locks defined with what they guard (contexts.c, vmm.c, arrays.c, pools.c); a forked
 * child starts them afresh (front.c). */
extern pthread_mutex_t created_lock, contexts_lock, vmm_lock, arrays_lock, pools_lock;
extern pthread_rwlock_t reset_lock;

/* Takes one of the front's locks; none is taken otherwise (front.c says why). */
void front_lock(pthread_mutex_t *lock);
void front_read_lock(pthread_rwlock_t *lock);
void front_write_lock(pthread_rwlock_t *lock);

int quota_configured(void);

enum route {
    ROUTE_REAL,   /* straight to the real runtime */
    ROUTE_CORE,   /* through the Go core */
    ROUTE_EARLY,  /* the core is starting: pass through and keep a ledger */
    ROUTE_REFUSE, /* no core (failed, or still starting) and a quota is configured */
    ROUTE_CONTEXT, /* counted by the core, passed through: a context the application created */
    ROUTE_FAILED,  /* answered already: the device of a call for the core could not be found */
};

enum route slow_route(int s);

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

cudaError_t early_record(void *ptr, uint64_t size, int32_t device);
int early_forget(void *ptr);

/* ---- contexts the application created (contexts.c) ---- */

/* The bytes of height rows of width bytes at the widest pitch CUDA pads them to (its pitch
 * alignment is at most 512): a pitched allocation in a created context is taken at it
 * (runtime.c, driver.c). 0 for no width or no rows, or where the bytes overflow. */
static inline uint64_t pitch_bound(uint64_t width, uint64_t height)
{
    uint64_t pitch = width > UINT64_MAX - 511 ? UINT64_MAX : (width + 511) / 512 * 512;
    return width == 0 || height > UINT64_MAX / pitch ? 0 : pitch * height;
}

/* The flags cudaMallocManaged and cuMemAllocManaged accept: others get CUDA's own answer
 * (runtime.c, driver.c), never the quota's. */
static inline int valid_attach_flags(unsigned int flags)
{
    return flags == CU_MEM_ATTACH_GLOBAL || flags == CU_MEM_ATTACH_HOST;
}

extern atomic_size_t created_live;
long created_usage(CUcontext ctx, int delta);
CUcontext current_created(void);
int32_t take_in_primary(int32_t device);
CUresult context_take(int32_t device, uint64_t size);
cudaError_t runtime_context_take(int32_t device, uint64_t size);
void context_took(CUresult rc, CUcontext ctx, int32_t device, CUdeviceptr p, uint64_t size);
void context_took_from_pool(CUresult rc, CUcontext ctx, int32_t device, CUdeviceptr p,
                            uint64_t size);

/* An allocation of a created context being freed. */
struct context_block {
    uint64_t ctx, size;
    int32_t device, from_pool;
};

void context_freed(int rc, uint64_t p, const struct context_block *b);
void context_freed_async(int rc, uint64_t p, const struct context_block *b, CUstream stream);
enum route free_route(enum route r, uint64_t p, struct context_block *b);

/* ---- streams (streams.c) ---- */

uint64_t stream_id(cudaStream_t stream);
void stream_place(CUstream stream, int32_t *device, CUcontext *ctx);
enum route stream_route(enum route r, CUstream stream, uint64_t size, int32_t *device,
                        CUcontext *ctx);
uint64_t free_context(CUstream stream);
CUgraph stream_graph(CUstream stream);

/* ---- the runtime (runtime.c) ---- */

cudaError_t current_device(int32_t *device);
enum route runtime_alloc_route(enum route r, void **devPtr, uint64_t size, int32_t *device,
                               CUcontext *ctx, cudaError_t *rc);

/* ---- the driver (driver.c) ---- */

CUresult context_device(int32_t *device);
enum route driver_alloc_route(CUdeviceptr *dptr, uint64_t size, int32_t *device, CUcontext *ctx);
/* How the pools hold ptr (SPILLWAY_HELD_*); for a block, its range. Never loads the core. */
int32_t pool_holds(CUdeviceptr ptr, uint64_t *base, uint64_t *size);

#pragma GCC visibility pop

/* Every interposed function, declared; each file defines its own. */
#define SPILLWAY_INTERPOSED(ret, field, name, params) EXPORT ret name params;
#include "calls.h"

#endif
