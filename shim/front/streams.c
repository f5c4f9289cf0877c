/*
 * streams.c: the stream a call is made on, as the core needs it: the
 * identity it crosses as (the per-thread default stream is one per thread),
 * the device and context a stream-ordered allocation is made in, and the
 * context a stream-ordered free is ordered in; a stream's destruction
 * (cudaStreamDestroy, cuStreamDestroy_v2), which retires its identity; and
 * stream capture, whose graphs hold what was freed into them until they are
 * destroyed.
 */
#define _GNU_SOURCE

#include "front.h"

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
uint64_t stream_id(cudaStream_t stream)
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

/*
 * A stream's destruction retires its identity in the pools; it matters only
 * once the core runs and never loads it. The default streams' handles get
 * CUDA's own answer.
 */
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
void stream_place(CUstream stream, int32_t *device, CUcontext *ctx)
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
enum route stream_route(enum route r, CUstream stream, uint64_t size, int32_t *device,
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
 * The context a stream-ordered free on stream is ordered in, for the core:
 * the current one for a default stream (CUDA takes 0, the legacy and the
 * per-thread handles as the current context's, which need not be the
 * memory's device's), at the cost of a cuCtxGetCurrent; 0 for another
 * stream, whose own context the core finds.
 */
uint64_t free_context(CUstream stream)
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

/* ---- stream capture: the graphs it builds ---- */

/*
 * CUDA graphs: the core keeps a block freed during a stream capture until the
 * graph and every executable graph instantiated from it are destroyed. It
 * hears of a graph call once the real call has run (before, nothing was freed
 * into a graph), never from inside its own calls nor twice for one call: the
 * real call runs quiet (CALL_QUIET, front.h), so the runtime's graph calls,
 * which reach the driver's, are reported once, by the runtime's wrapper.
 */

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
CUgraph stream_graph(CUstream stream)
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
