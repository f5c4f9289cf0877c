/*
 * contexts.c: contexts the application created (cuCtxCreate, cuCtxAttach),
 * kept here so that those created before the core runs are known. The core
 * serves a device's primary context from its pool; an allocation in a created
 * context is counted against the quota and passed through, and given back
 * when it is freed or its context is destroyed (memory from a pool, which
 * is no context's, only when freed or the primary context reset). Also the route of a free,
 * which tells the two apart.
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "front.h"

/*
 * Contexts the application created with cuCtxCreate, and their usage
 * counts (cuCtxAttach adds one, cuCtxDetach drops one, the last destroys
 * the context, as cuCtxDestroy does). Kept here, so that contexts created
 * before the core runs are known; created_live spares every allocation the
 * look-up while there are none.
 */
pthread_mutex_t created_lock = PTHREAD_MUTEX_INITIALIZER;
static struct created {
    CUcontext ctx;
    unsigned int usage;
} *created;
static size_t created_len, created_cap;
atomic_size_t created_live;

/*
 * Creating a context, and destroying one with the core's record of its
 * end, happen under one lock: CUDA hands a destroyed context's handle to a
 * context created later, whose allocations must not be given back as the
 * destroyed one's, nor set aside with them, before the core has heard of
 * the destruction.
 */
pthread_mutex_t contexts_lock = PTHREAD_MUTEX_INITIALIZER;

/* Allocations the core recorded as made in a created context. */
static atomic_long context_blocks;

/*
 * A reset of a device's primary context (cudaDeviceReset,
 * cuDevicePrimaryCtxReset) destroys what the application allocated there
 * from its own memory pools and the arrays made there, and the core gives
 * back what it recorded of them. Such an allocation holds this lock for
 * reading from its real call to its record, and a free of a recorded
 * allocation from the core's forgetting it to its record again after a
 * failed real free, and so does the destruction of a created context
 * (context_ending); a reset holds it for writing. So the reset
 * never falls between a real call and its record: an allocation is either
 * recorded before the reset, which gives it back, or made after it, and
 * a free never records again memory the reset destroyed meanwhile.
 * Writers first, so that allocating threads never hold a reset off for
 * long; no thread takes it twice (the real calls run at depth > 0).
 */
pthread_rwlock_t reset_lock = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;

static void created_add(CUcontext ctx)
{
    front_lock(&created_lock);
    if (created_len == created_cap) {
        struct created *grown = grow_table(created, &created_cap, sizeof *created);
        if (!grown) {
            pthread_mutex_unlock(&created_lock);
            log_line("cannot record a created context (out of host memory): its allocations are "
                     "served as the primary context's");
            return;
        }
        created = grown;
    }
    created[created_len++] = (struct created){ctx, 1};
    atomic_store(&created_live, created_len);
    pthread_mutex_unlock(&created_lock);
}

/*
 * Changes ctx's usage count by delta (0: looks it up); returns -1 if ctx
 * is not a created context, else its new count. A count of 0 forgets it.
 */
long created_usage(CUcontext ctx, int delta)
{
    long usage = -1;
    front_lock(&created_lock);
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
    front_lock(&created_lock);
    for (size_t i = 0; i < created_len && !found; i++)
        if ((found = created[i].ctx == ctx)) {
            created[i] = created[--created_len];
            atomic_store(&created_live, created_len);
        }
    pthread_mutex_unlock(&created_lock);
    return found;
}

/* The calling thread's current context if the application created it, else NULL. */
CUcontext current_created(void)
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

/*
 * SPILLWAY_TAKE_IN_PRIMARY where the calling thread is in device's primary
 * context, the pool's own, so that the pool may synchronize to give back
 * what it holds freed before memory counted outside it is refused; else 0.
 */
int32_t take_in_primary(int32_t device)
{
    int32_t current = -1;
    return !current_created() && context_device(&current) == CUDA_SUCCESS && current == device
               ? SPILLWAY_TAKE_IN_PRIMARY
               : 0;
}

/* Admits a driver allocation of size bytes in a created context on device; a CUresult. */
CUresult context_take(int32_t device, uint64_t size)
{
    return (CUresult)core.take(device, size, SPILLWAY_TAKE_CONTEXT);
}

/* The same for the runtime: a cudaError_t, and a refusal is the thread's last error. */
cudaError_t runtime_context_take(int32_t device, uint64_t size)
{
    return (cudaError_t)core.take(device, size, SPILLWAY_TAKE_RUNTIME);
}

/* After the real allocation: records it in the core, or gives its bytes back. */
static void took(CUresult rc, CUcontext ctx, int32_t device, CUdeviceptr p, uint64_t size,
                 int32_t from_pool)
{
    if (rc != CUDA_SUCCESS) {
        core.give(device, size, SPILLWAY_TAKE_CONTEXT);
        return;
    }
    core.ctx_record((uint64_t)(uintptr_t)ctx, device, (uint64_t)p, size, from_pool);
    atomic_fetch_add(&context_blocks, 1);
}

void context_took(CUresult rc, CUcontext ctx, int32_t device, CUdeviceptr p, uint64_t size)
{
    took(rc, ctx, device, p, size, 0);
}

/* The same for memory from a memory pool, which outlives its context (cuCtxDestroy). */
void context_took_from_pool(CUresult rc, CUcontext ctx, int32_t device, CUdeviceptr p,
                            uint64_t size)
{
    took(rc, ctx, device, p, size, 1);
}

/*
 * Whether p was allocated in a created context or from a memory pool (the
 * core forgets it, and resets wait until context_freed records the outcome).
 */
static int context_owns(uint64_t p, struct context_block *b)
{
    if (atomic_load_explicit(&context_blocks, memory_order_acquire) == 0)
        return 0;
    front_read_lock(&reset_lock);
    if (core.ctx_forget(p, &b->ctx, &b->device, &b->size, &b->from_pool))
        return 1;
    pthread_rwlock_unlock(&reset_lock);
    return 0;
}

/* After the real free of b at p: its bytes go back, or it is recorded again. */
void context_freed(int rc, uint64_t p, const struct context_block *b)
{
    if (rc == 0) {
        core.give(b->device, b->size, SPILLWAY_TAKE_CONTEXT);
        atomic_fetch_sub(&context_blocks, 1);
    } else {
        core.ctx_record(b->ctx, b->device, p, b->size, b->from_pool);
    }
    pthread_rwlock_unlock(&reset_lock);
}

/*
 * After the real stream-ordered free of b at p on stream: freed during a
 * capture, the memory is the graph's until the graph is destroyed, and its
 * bytes stay taken until then (the core gives them back).
 */
void context_freed_async(int rc, uint64_t p, const struct context_block *b, CUstream stream)
{
    CUgraph graph = rc == 0 ? stream_graph(stream) : NULL;
    if (!graph) {
        context_freed(rc, p, b);
        return;
    }
    core.graph_keep((uint64_t)(uintptr_t)graph, b->device, b->size);
    atomic_fetch_sub(&context_blocks, 1);
    pthread_rwlock_unlock(&reset_lock);
}

/*
 * The route of a free of p, given r, the route() taken before depth was
 * raised: the core's, also where p was allocated on the early route and
 * the core has adopted the ledger since; ROUTE_CONTEXT for an allocation
 * of a created context (fills *b, for context_freed after the real free);
 * the real function's otherwise, and always for the null pointer: CUDA's
 * own answer, which for cudaFree(NULL), the usual way to initialise CUDA,
 * initialises the runtime and its context, or reports why it cannot.
 */
enum route free_route(enum route r, uint64_t p, struct context_block *b)
{
    if (p == 0)
        return ROUTE_REAL;
    if (r == ROUTE_EARLY && !early_forget((void *)(uintptr_t)p))
        r = ROUTE_CORE;
    if (r != ROUTE_CORE)
        return ROUTE_REAL;
    return context_owns(p, b) ? ROUTE_CONTEXT : ROUTE_CORE;
}

/* ---- contexts: creation and destruction ---- */

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    REAL(real_create, cu_ctx_create);
    front_lock(&contexts_lock);
    CUresult rc = real_create(pctx, flags, dev);
    if (rc == CUDA_SUCCESS && depth == 0)
        created_add(*pctx);
    pthread_mutex_unlock(&contexts_lock);
    return rc;
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                               unsigned int flags, CUdevice dev)
{
    REAL(real_create, cu_ctx_create_v3);
    front_lock(&contexts_lock);
    CUresult rc = real_create(pctx, paramsArray, numParams, flags, dev);
    if (rc == CUDA_SUCCESS && depth == 0)
        created_add(*pctx);
    pthread_mutex_unlock(&contexts_lock);
    return rc;
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                               unsigned int flags, CUdevice dev)
{
    REAL(real_create, cu_ctx_create_v4);
    front_lock(&contexts_lock);
    CUresult rc = real_create(pctx, ctxCreateParams, flags, dev);
    if (rc == CUDA_SUCCESS && depth == 0)
        created_add(*pctx);
    pthread_mutex_unlock(&contexts_lock);
    return rc;
}

/* Whether the core holds what was allocated in created contexts. */
static int core_counts_contexts(void)
{
    return depth == 0 && atomic_load_explicit(&state, memory_order_acquire) == READY;
}

/*
 * Before the real call that may destroy ctx: the core sets aside what was
 * allocated in it, as the real call frees those addresses, and another
 * thread may be handed one (for the pool, or another context) before this
 * one can tell the core; a free of it then routes by its new owner.
 * Returns whether it did, so that context_kept puts it back if ctx lives on.
 */
static int context_dying(CUcontext ctx)
{
    if (!core_counts_contexts())
        return 0;
    depth++;
    core.ctx_destroying((uint64_t)(uintptr_t)ctx);
    depth--;
    return 1;
}

/* ctx lives on: the core records again what context_dying set aside. */
static void context_kept(CUcontext ctx)
{
    depth++;
    core.ctx_kept((uint64_t)(uintptr_t)ctx);
    depth--;
}

/* ctx is gone: the core gives back what was allocated in it. */
static void context_gone(CUcontext ctx)
{
    if (!core_counts_contexts())
        return;
    uint64_t n = 0;
    depth++;
    core.ctx_destroyed((uint64_t)(uintptr_t)ctx, &n);
    depth--;
    atomic_fetch_sub(&context_blocks, (long)n);
}

/*
 * Around a call that may destroy a created context: resets wait, since the
 * memory from a memory pool it leaves becomes the primary context's only
 * once the core has heard of the destruction (context_gone), and a reset
 * meanwhile would destroy that memory without its bytes being given back.
 * Not within the front's own calls (depth), which may hold resets off already.
 */
static void context_ending(void)
{
    if (depth == 0)
        front_read_lock(&reset_lock);
}

static void context_ended(void)
{
    if (depth == 0)
        pthread_rwlock_unlock(&reset_lock);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    REAL(real_destroy, cu_ctx_destroy);
    front_lock(&contexts_lock);
    context_ending();
    int dying = created_usage(ctx, 0) > 0 && context_dying(ctx);
    CUresult rc = real_destroy(ctx);
    if (rc == CUDA_SUCCESS && created_remove(ctx))
        context_gone(ctx);
    else if (dying)
        context_kept(ctx);
    context_ended();
    pthread_mutex_unlock(&contexts_lock);
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
    front_lock(&contexts_lock);
    context_ending();
    /* The last usage: the real call destroys the context. */
    int dying = created_usage(ctx, 0) == 1 && context_dying(ctx);
    CUresult rc = real_detach(ctx);
    if (rc == CUDA_SUCCESS && created_usage(ctx, -1) == 0)
        context_gone(ctx);
    else if (dying)
        context_kept(ctx);
    context_ended();
    pthread_mutex_unlock(&contexts_lock);
    return rc;
}
