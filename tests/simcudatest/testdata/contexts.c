/*
 * contexts.c - checks simcuda's driver contexts as driver-API clients use
 * them: `contexts <case>`. It prints "PASS <case>" and exits 0, or names the
 * failed check and exits 1. Linked against libcuda only.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <spillway/cuda.h>

#include "check.h"

#define MiB (1ULL << 20)

static size_t free_bytes(void)
{
	size_t free_, total;

	EXPECT(cuMemGetInfo_v2(&free_, &total), CUDA_SUCCESS);
	return free_;
}

/* Push, pop, set and create follow the per-thread stack CUDA documents. */
static void stack(void)
{
	CUcontext primary, a, b, got;

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuCtxPopCurrent_v2(&got), CUDA_ERROR_INVALID_CONTEXT); /* empty stack */
	EXPECT(cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
	EXPECT(cuCtxPushCurrent_v2(primary), CUDA_SUCCESS);

	EXPECT(cuCtxCreate_v2(&a, CU_CTX_SCHED_AUTO, 0), CUDA_SUCCESS); /* pushed */
	CHECK(a != NULL && a != primary);
	EXPECT(cuCtxGetCurrent(&got), CUDA_SUCCESS);
	CHECK(got == a);
	EXPECT(cuCtxCreate_v2(&b, CU_CTX_SCHED_BLOCKING_SYNC, 0), CUDA_SUCCESS);
	CHECK(b != a && b != primary);
	unsigned int flags;
	EXPECT(cuCtxGetFlags(&flags), CUDA_SUCCESS);
	CHECK(flags == CU_CTX_SCHED_BLOCKING_SYNC);

	EXPECT(cuCtxPopCurrent_v2(&got), CUDA_SUCCESS);
	CHECK(got == b);
	EXPECT(cuCtxPopCurrent_v2(&got), CUDA_SUCCESS);
	CHECK(got == a);
	EXPECT(cuCtxGetCurrent(&got), CUDA_SUCCESS);
	CHECK(got == primary);

	/* cuCtxSetCurrent replaces the top; NULL pops it. */
	EXPECT(cuCtxPushCurrent_v2(a), CUDA_SUCCESS);
	EXPECT(cuCtxSetCurrent(b), CUDA_SUCCESS);
	EXPECT(cuCtxPopCurrent_v2(&got), CUDA_SUCCESS);
	CHECK(got == b);
	EXPECT(cuCtxGetCurrent(&got), CUDA_SUCCESS);
	CHECK(got == primary);
	EXPECT(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
	EXPECT(cuCtxGetCurrent(&got), CUDA_SUCCESS);
	CHECK(got == NULL);

	/* Bad flags and devices are refused. */
	EXPECT(cuCtxCreate_v2(&got, 0x100, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuCtxCreate_v2(&got, 0, 7), CUDA_ERROR_INVALID_DEVICE);
	EXPECT(cuCtxPushCurrent_v2(NULL), CUDA_ERROR_INVALID_CONTEXT);

	/* A destroyed context is refused everywhere, and the primary one cannot be destroyed. */
	EXPECT(cuCtxDestroy_v2(b), CUDA_SUCCESS);
	EXPECT(cuCtxDestroy_v2(b), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuCtxPushCurrent_v2(b), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT(cuCtxDestroy_v2(primary), CUDA_ERROR_INVALID_CONTEXT);

	/* cuCtxDetach needs the context current and destroys it at the last usage. */
	EXPECT(cuCtxPushCurrent_v2(a), CUDA_SUCCESS);
	EXPECT(cuCtxAttach(&got, 0), CUDA_SUCCESS);
	CHECK(got == a);
	EXPECT(cuCtxDetach(a), CUDA_SUCCESS); /* usage 2 -> 1 */
	EXPECT(cuCtxPushCurrent_v2(primary), CUDA_SUCCESS);
	EXPECT(cuCtxDetach(a), CUDA_ERROR_INVALID_CONTEXT); /* not current */
	EXPECT(cuCtxPopCurrent_v2(&got), CUDA_SUCCESS);
	EXPECT(cuCtxDetach(a), CUDA_SUCCESS); /* last usage: destroyed and popped */
	EXPECT(cuCtxGetCurrent(&got), CUDA_SUCCESS);
	CHECK(got == NULL);
	EXPECT(cuCtxPushCurrent_v2(a), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
}

struct thread_result {
	CUcontext seen;
};

static void *other_thread(void *arg)
{
	struct thread_result *r = arg;

	cuCtxGetCurrent(&r->seen);
	return NULL;
}

/* The stack is per thread: a new thread starts with none current. */
static void per_thread(void)
{
	CUcontext a;
	pthread_t t;
	struct thread_result r = {.seen = (CUcontext)1};

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuCtxCreate_v2(&a, 0, 0), CUDA_SUCCESS);
	CHECK(pthread_create(&t, NULL, other_thread, &r) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	CHECK(r.seen == NULL);
	EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
}

/*
 * Memory belongs to the context it was allocated in: another context can
 * free it (cuMemFree finds the owner from the pointer), and destroying the
 * context frees what is left, on the device's shared capacity.
 */
static void ownership(void)
{
	CUcontext primary, a, owner;
	CUdeviceptr p, q, r;

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
	EXPECT(cuCtxPushCurrent_v2(primary), CUDA_SUCCESS);
	size_t before = free_bytes();
	EXPECT(cuMemAlloc_v2(&r, 2 * MiB), CUDA_SUCCESS); /* the primary context's */

	EXPECT(cuCtxCreate_v2(&a, 0, 0), CUDA_SUCCESS);
	EXPECT(cuMemAlloc_v2(&p, 4 * MiB), CUDA_SUCCESS);
	EXPECT(cuMemAlloc_v2(&q, 8 * MiB), CUDA_SUCCESS);
	EXPECT(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p), CUDA_SUCCESS);
	CHECK(owner == a);
	EXPECT(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, r), CUDA_SUCCESS);
	CHECK(owner == primary);
	CHECK(free_bytes() == before - 14 * MiB);

	/* Bytes really move between the contexts' memory. */
	char out[64] = "created context", in[64] = {0};
	EXPECT(cuMemcpyHtoD_v2(p, out, sizeof(out)), CUDA_SUCCESS);
	EXPECT(cuCtxPopCurrent_v2(&owner), CUDA_SUCCESS);
	CHECK(owner == a);
	EXPECT(cuMemcpyDtoD_v2(r, p, sizeof(out)), CUDA_SUCCESS);
	EXPECT(cuMemcpyDtoH_v2(in, r, sizeof(in)), CUDA_SUCCESS);
	CHECK(strcmp(in, out) == 0);

	/* Freed from the primary context: the owner is found from the pointer. */
	EXPECT(cuMemFree_v2(p), CUDA_SUCCESS);
	CHECK(free_bytes() == before - 10 * MiB);

	/* Destroying the created context frees q, and nothing of the primary context. */
	EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
	CHECK(free_bytes() == before - 2 * MiB);
	EXPECT(cuMemFree_v2(q), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemFree_v2(r), CUDA_SUCCESS);
	CHECK(free_bytes() == before);
	EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
}

/*
 * cuMemFree_v2 and cuMemFreeHost need no current context; allocating does.
 * numba frees pending pinned memory after popping every context, when it
 * resets a device.
 */
static void free_without_context(void)
{
	CUcontext a, got;
	CUdeviceptr p;
	void *pinned, *mapped;

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuCtxCreate_v2(&a, 0, 0), CUDA_SUCCESS);
	EXPECT(cuMemAlloc_v2(&p, MiB), CUDA_SUCCESS);
	EXPECT(cuMemAllocHost_v2(&pinned, MiB), CUDA_SUCCESS);
	EXPECT(cuMemHostAlloc(&mapped, MiB, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
	EXPECT(cuCtxPopCurrent_v2(&got), CUDA_SUCCESS);
	EXPECT(cuCtxGetCurrent(&got), CUDA_SUCCESS);
	CHECK(got == NULL);
	EXPECT(cuMemAlloc_v2(&p, MiB), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT(cuMemFree_v2(p), CUDA_SUCCESS);
	EXPECT(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE); /* already freed */
	EXPECT(cuMemFree_v2(0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemFreeHost(pinned), CUDA_SUCCESS);
	EXPECT(cuMemFreeHost(mapped), CUDA_SUCCESS);
	EXPECT(cuMemFreeHost(pinned), CUDA_ERROR_INVALID_VALUE); /* already freed */
	EXPECT(cuMemFreeHost(NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
}

/*
 * cuCtxDestroy does not destroy memory from cuMemAllocAsync,
 * cuMemAllocFromPoolAsync or cuMemCreate ("not associated with any CUDA
 * context"): made in a created context, it outlives it, keeps its bytes and
 * its contents, and is freed later from another context. Pool memory left
 * so is freed by a primary context reset, as the device's.
 */
static void pool_memory_outlives(void)
{
	CUcontext primary, a, b, got;
	CUstream s;
	CUmemoryPool pool;
	CUdeviceptr p, q, r, plain;
	CUmemGenericAllocationHandle h;
	size_t granule;

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
	EXPECT(cuCtxPushCurrent_v2(primary), CUDA_SUCCESS);
	size_t before = free_bytes();
	CUmemPoolProps pool_props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
	EXPECT(cuMemPoolCreate(&pool, &pool_props), CUDA_SUCCESS);
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
	EXPECT(cuMemGetAllocationGranularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
	       CUDA_SUCCESS);

	EXPECT(cuCtxCreate_v2(&a, 0, 0), CUDA_SUCCESS);
	EXPECT(cuStreamCreate(&s, CU_STREAM_DEFAULT), CUDA_SUCCESS);
	EXPECT(cuMemAllocAsync(&p, 4 * MiB, s), CUDA_SUCCESS);
	EXPECT(cuMemAllocFromPoolAsync(&q, 2 * MiB, pool, s), CUDA_SUCCESS);
	EXPECT(cuMemCreate(&h, granule, &prop, 0), CUDA_SUCCESS);
	EXPECT(cuMemAlloc_v2(&plain, MiB), CUDA_SUCCESS);
	char out[64] = "outlives its context", in[64] = {0};
	EXPECT(cuMemcpyHtoDAsync_v2(p, out, sizeof(out), s), CUDA_SUCCESS);
	EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
	CHECK(free_bytes() == before - 7 * MiB - granule);

	EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
	EXPECT(cuCtxGetCurrent(&got), CUDA_SUCCESS);
	CHECK(got == primary);
	CHECK(free_bytes() == before - 6 * MiB - granule); /* only cuMemAlloc's memory went */
	EXPECT(cuMemFree_v2(plain), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemcpyDtoH_v2(in, p, sizeof(in)), CUDA_SUCCESS);
	CHECK(strcmp(in, out) == 0);

	/* Freed from other contexts: a new one, then the primary one. */
	EXPECT(cuCtxCreate_v2(&b, 0, 0), CUDA_SUCCESS);
	EXPECT(cuMemFreeAsync(p, NULL), CUDA_SUCCESS);
	EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
	EXPECT(cuMemRelease(h), CUDA_SUCCESS);
	EXPECT(cuCtxDestroy_v2(b), CUDA_SUCCESS);
	CHECK(free_bytes() == before - 2 * MiB);
	EXPECT(cuMemFree_v2(q), CUDA_SUCCESS);
	CHECK(free_bytes() == before);

	/* Left to the primary context, pool memory goes with its reset. */
	EXPECT(cuCtxCreate_v2(&a, 0, 0), CUDA_SUCCESS);
	EXPECT(cuMemAllocAsync(&r, 4 * MiB, NULL), CUDA_SUCCESS);
	EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
	CHECK(free_bytes() == before - 4 * MiB);
	EXPECT(cuDevicePrimaryCtxReset_v2(0), CUDA_SUCCESS);
	EXPECT(cuMemFree_v2(r), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemPoolDestroy(pool), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&got, 0), CUDA_SUCCESS);
	CHECK(free_bytes() == before);
	EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
}

/* A created context's bytes (SIMCUDA_CONTEXT_BYTES=256MiB) come and go with it. */
static void context_bytes(void)
{
	CUcontext primary, a, got;

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
	EXPECT(cuCtxPushCurrent_v2(primary), CUDA_SUCCESS);
	size_t total, before;
	EXPECT(cuMemGetInfo_v2(&before, &total), CUDA_SUCCESS);
	CHECK(before == total - 256 * MiB);
	EXPECT(cuCtxCreate_v2(&a, 0, 0), CUDA_SUCCESS);
	CHECK(free_bytes() == before - 256 * MiB);
	EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
	EXPECT(cuCtxGetCurrent(&got), CUDA_SUCCESS);
	CHECK(got == primary);
	CHECK(free_bytes() == before);
	EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
}

/* Every attribute of CUDA 12.4 (1 to CU_DEVICE_ATTRIBUTE_MAX - 1 = 134) answers; others do not. */
static void attributes(void)
{
	int v;

	EXPECT(cuInit(0), CUDA_SUCCESS);
	for (int attr = 1; attr <= 134; attr++) {
		v = -12345;
		if (cuDeviceGetAttribute(&v, (CUdevice_attribute)attr, 0) != CUDA_SUCCESS) {
			fprintf(stderr, "%s: attribute %d refused\n", current_case, attr);
			exit(1);
		}
		CHECK(v != -12345);
	}
	EXPECT(cuDeviceGetAttribute(&v, (CUdevice_attribute)0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuDeviceGetAttribute(&v, (CUdevice_attribute)135, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuDeviceGetAttribute(&v, (CUdevice_attribute)-1, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 1),
	       CUDA_ERROR_INVALID_DEVICE);

	int major, minor;
	EXPECT(cuDeviceComputeCapability(&major, &minor, 0), CUDA_SUCCESS);
	CHECK(major == 9 && minor == 0);
	EXPECT(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0),
	       CUDA_SUCCESS);
	CHECK(v == major);

	char bus[32];
	CUdevice dev;
	EXPECT(cuDeviceGetPCIBusId(bus, sizeof(bus), 0), CUDA_SUCCESS);
	CHECK(strcmp(bus, "0000:18:00.0") == 0);
	EXPECT(cuDeviceGetByPCIBusId(&dev, bus), CUDA_SUCCESS);
	CHECK(dev == 0);
	EXPECT(cuDeviceGetByPCIBusId(&dev, "0000:19:00.0"), CUDA_ERROR_INVALID_DEVICE);
	EXPECT(cuDeviceGetByPCIBusId(&dev, "bus 18"), CUDA_ERROR_INVALID_VALUE);
}

/* A gate a host function waits at, for at most two seconds. */
struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cond;
	int open, passed, timed_out;
};

static void wait_at_gate(void *arg)
{
	struct gate *g = arg;
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 2;
	pthread_mutex_lock(&g->mu);
	while (!g->open && !g->timed_out)
		g->timed_out = pthread_cond_timedwait(&g->cond, &g->mu, &until) != 0;
	g->passed = 1;
	pthread_mutex_unlock(&g->mu);
}

static int gate_passed(struct gate *g)
{
	pthread_mutex_lock(&g->mu);
	int passed = g->passed;
	pthread_mutex_unlock(&g->mu);
	return passed;
}

static void open_gate(struct gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->open = 1;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->mu);
}

/*
 * cuCtxSynchronize waits for the current context's work only: a created
 * context's synchronization returns while a stream of the primary context
 * is still busy, and waits for a stream of its own.
 */
static void synchronize(void)
{
	CUcontext primary, a, got;
	CUstream busy, own;
	struct gate primary_gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};
	struct gate own_gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1, 0, 0};

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
	EXPECT(cuCtxPushCurrent_v2(primary), CUDA_SUCCESS);
	EXPECT(cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	EXPECT(cuLaunchHostFunc(busy, wait_at_gate, &primary_gate), CUDA_SUCCESS);

	EXPECT(cuCtxCreate_v2(&a, 0, 0), CUDA_SUCCESS);
	EXPECT(cuStreamCreate(&own, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	EXPECT(cuLaunchHostFunc(own, wait_at_gate, &own_gate), CUDA_SUCCESS);
	EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
	CHECK(gate_passed(&own_gate));
	CHECK(!gate_passed(&primary_gate)); /* the primary context's stream still waits */

	EXPECT(cuCtxPopCurrent_v2(&got), CUDA_SUCCESS);
	CHECK(got == a);
	open_gate(&primary_gate);
	EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
	CHECK(gate_passed(&primary_gate) && !primary_gate.timed_out);
	EXPECT(cuStreamDestroy_v2(busy), CUDA_SUCCESS);
	EXPECT(cuStreamDestroy_v2(own), CUDA_SUCCESS);
	EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
}

/*
 * cuStreamGetCtx answers the context a stream was made in, and the default
 * streams the current context; cuMemAllocAsync allocates on the stream's
 * device, not the current one, and cuMemAllocFromPoolAsync on the pool's,
 * not the stream's. Needs two devices.
 */
static void stream_context(void)
{
	CUcontext p0, p1, a, got;
	CUstream s1, sa, gone;
	CUdeviceptr d = 0;
	int ordinal = -1;

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&p0, 0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&p1, 1), CUDA_SUCCESS);
	EXPECT(cuCtxPushCurrent_v2(p1), CUDA_SUCCESS);
	EXPECT(cuStreamCreate(&s1, CU_STREAM_DEFAULT), CUDA_SUCCESS);
	EXPECT(cuCtxCreate_v2(&a, 0, 1), CUDA_SUCCESS); /* pushed */
	EXPECT(cuStreamCreate(&sa, CU_STREAM_DEFAULT), CUDA_SUCCESS);
	EXPECT(cuStreamCreate(&gone, CU_STREAM_DEFAULT), CUDA_SUCCESS);
	EXPECT(cuStreamDestroy_v2(gone), CUDA_SUCCESS);
	EXPECT(cuCtxSetCurrent(p0), CUDA_SUCCESS);

	EXPECT(cuStreamGetCtx(s1, &got), CUDA_SUCCESS);
	CHECK(got == p1);
	EXPECT(cuStreamGetCtx(sa, &got), CUDA_SUCCESS);
	CHECK(got == a);
	CUstream defaults[] = {NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
	for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) {
		got = NULL;
		EXPECT(cuStreamGetCtx(defaults[i], &got), CUDA_SUCCESS);
		CHECK(got == p0);
	}
	got = NULL;
	EXPECT(cuStreamGetCtx_ptsz(NULL, &got), CUDA_SUCCESS);
	CHECK(got == p0);
	EXPECT(cuStreamGetCtx(s1, NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuStreamGetCtx(gone, &got), CUDA_ERROR_INVALID_HANDLE);

	/* Device 0 current: the stream's device, 1, serves the allocation. */
	EXPECT(cuMemAllocAsync(&d, MiB, s1), CUDA_SUCCESS);
	EXPECT(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d), CUDA_SUCCESS);
	CHECK(ordinal == 1);
	EXPECT(cuMemFreeAsync(d, s1), CUDA_SUCCESS);
	EXPECT(cuStreamSynchronize(s1), CUDA_SUCCESS);

	/* A pool of device 0 serves a stream of device 1 with device 0's memory. */
	CUmemPoolProps props;
	CUmemoryPool pool;
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = 0;
	EXPECT(cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
	EXPECT(cuMemAllocFromPoolAsync(&d, MiB, pool, s1), CUDA_SUCCESS);
	EXPECT(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d), CUDA_SUCCESS);
	CHECK(ordinal == 0);
	EXPECT(cuMemFreeAsync(d, s1), CUDA_SUCCESS);
	EXPECT(cuStreamSynchronize(s1), CUDA_SUCCESS);
	EXPECT(cuMemPoolDestroy(pool), CUDA_SUCCESS);

	EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
	EXPECT(cuStreamGetCtx(sa, &got), CUDA_ERROR_INVALID_HANDLE); /* destroyed with a */
	EXPECT(cuStreamDestroy_v2(s1), CUDA_SUCCESS);
	EXPECT(cuCtxPopCurrent_v2(&got), CUDA_SUCCESS);
	CHECK(got == p0);
	EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
}

/*
 * Resetting the primary context destroys the streams and events made in it
 * (cuDevicePrimaryCtxReset: "destroys and cleans up all resources
 * associated with the current device"): their handles are refused with
 * CUDA_ERROR_INVALID_HANDLE, as destroyed ones are. A created context's
 * streams and events, on the same device, stay.
 */
static void reset_lifetimes(void)
{
	CUcontext primary, a, got;
	CUstream sp, sa;
	CUevent ep, ea;

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
	EXPECT(cuCtxPushCurrent_v2(primary), CUDA_SUCCESS);
	EXPECT(cuStreamCreate(&sp, CU_STREAM_DEFAULT), CUDA_SUCCESS);
	EXPECT(cuEventCreate(&ep, CU_EVENT_DEFAULT), CUDA_SUCCESS);
	EXPECT(cuEventRecord(ep, sp), CUDA_SUCCESS);
	EXPECT(cuCtxCreate_v2(&a, 0, 0), CUDA_SUCCESS); /* pushed */
	EXPECT(cuStreamCreate(&sa, CU_STREAM_DEFAULT), CUDA_SUCCESS);
	EXPECT(cuEventCreate(&ea, CU_EVENT_DEFAULT), CUDA_SUCCESS);
	EXPECT(cuEventRecord(ea, sa), CUDA_SUCCESS);

	EXPECT(cuDevicePrimaryCtxReset_v2(0), CUDA_SUCCESS);
	EXPECT(cuStreamQuery(sp), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuEventQuery(ep), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuEventRecord(ep, sa), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuEventDestroy_v2(ep), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuStreamDestroy_v2(sp), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuStreamQuery(sa), CUDA_SUCCESS);
	EXPECT(cuEventQuery(ea), CUDA_SUCCESS);
	EXPECT(cuEventRecord(ea, sa), CUDA_SUCCESS);
	EXPECT(cuStreamSynchronize(sa), CUDA_SUCCESS);
	EXPECT(cuEventDestroy_v2(ea), CUDA_SUCCESS);
	EXPECT(cuStreamDestroy_v2(sa), CUDA_SUCCESS);

	EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
	EXPECT(cuCtxPopCurrent_v2(&got), CUDA_SUCCESS);
	CHECK(got == primary);
	EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
}

/*
 * Destroying a created context destroys the streams and events made in it
 * (cuCtxDestroy: "Destroys and cleans up all resources associated with the
 * context", CUstream and CUevent among them): their handles are refused
 * with CUDA_ERROR_INVALID_HANDLE, a capture begun on one ends. The primary
 * context's stay.
 */
static void destroy_lifetimes(void)
{
	CUcontext primary, a, got;
	CUstream sp, sa, sc;
	CUevent ep, ea;
	CUstreamCaptureStatus status;

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
	EXPECT(cuCtxPushCurrent_v2(primary), CUDA_SUCCESS);
	EXPECT(cuStreamCreate(&sp, CU_STREAM_DEFAULT), CUDA_SUCCESS);
	EXPECT(cuEventCreate(&ep, CU_EVENT_DEFAULT), CUDA_SUCCESS);
	EXPECT(cuCtxCreate_v2(&a, 0, 0), CUDA_SUCCESS); /* pushed */
	EXPECT(cuStreamCreate(&sa, CU_STREAM_DEFAULT), CUDA_SUCCESS);
	EXPECT(cuStreamCreate(&sc, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	EXPECT(cuEventCreate(&ea, CU_EVENT_DEFAULT), CUDA_SUCCESS);
	EXPECT(cuEventRecord(ea, sa), CUDA_SUCCESS);
	EXPECT(cuStreamBeginCapture_v2(sc, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);

	EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
	EXPECT(cuCtxGetCurrent(&got), CUDA_SUCCESS);
	CHECK(got == primary);
	EXPECT(cuStreamQuery(sa), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuStreamGetCtx(sa, &got), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuStreamIsCapturing(sc, &status), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuEventQuery(ea), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuEventRecord(ea, sp), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuEventDestroy_v2(ea), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuStreamDestroy_v2(sa), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuEventRecord(ep, sp), CUDA_SUCCESS);
	EXPECT(cuEventSynchronize(ep), CUDA_SUCCESS);
	EXPECT(cuEventDestroy_v2(ep), CUDA_SUCCESS);
	EXPECT(cuStreamDestroy_v2(sp), CUDA_SUCCESS);
	EXPECT(cuCtxPopCurrent_v2(&got), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
}

/*
 * A program that creates and destroys contexts for ever holds bounded
 * memory: a new context reuses a destroyed one's, as CUDA reuses the
 * memory behind a destroyed context's handle, so among many cycles only a
 * bounded number of handles appear. A destroyed handle not reused yet is
 * still refused.
 */
static void context_reuse(void)
{
	enum { CYCLES = 300, MAX_DISTINCT = 100 };
	static CUcontext seen[CYCLES];
	int distinct = 0;
	CUcontext a, got;
	CUstream s;
	CUevent e;

	EXPECT(cuInit(0), CUDA_SUCCESS);
	for (int i = 0; i < CYCLES; i++) {
		EXPECT(cuCtxCreate_v2(&a, 0, 0), CUDA_SUCCESS);
		EXPECT(cuStreamCreate(&s, CU_STREAM_DEFAULT), CUDA_SUCCESS);
		EXPECT(cuEventCreate(&e, CU_EVENT_DEFAULT), CUDA_SUCCESS);
		EXPECT(cuEventRecord(e, s), CUDA_SUCCESS);
		EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
		EXPECT(cuCtxPushCurrent_v2(a), CUDA_ERROR_INVALID_CONTEXT);
		EXPECT(cuCtxGetCurrent(&got), CUDA_SUCCESS);
		CHECK(got == NULL);
		int known = 0;
		for (int j = 0; j < distinct && !known; j++)
			known = seen[j] == a;
		if (!known)
			seen[distinct++] = a;
	}
	CHECK(distinct <= MAX_DISTINCT);
}

/*
 * cuCtxCreate_v3 (execution affinity) and cuCtxCreate_v4 (creation
 * parameters) make regular contexts when given no affinity; an affinity is
 * unsupported (MPS only), CIG parameters too, and malformed parameters are
 * invalid. cuGetProcAddress's cuCtxCreate is cuCtxCreate_v3 from CUDA 11.4
 * on, cuCtxCreate_v2 before.
 */
static void create_forms(void)
{
	CUcontext a, got;
	CUexecAffinityParam sms = {CU_EXEC_AFFINITY_TYPE_SM_COUNT, {{4}}};
	CUexecAffinityParam bad = {CU_EXEC_AFFINITY_TYPE_MAX, {{4}}};
	CUctxCreateParams params = {NULL, 0, NULL};
	CUctxCigParam *cig = (CUctxCigParam *)&params; /* any non-NULL pointer: never read */

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuCtxCreate_v3(&a, NULL, 0, CU_CTX_SCHED_YIELD, 0), CUDA_SUCCESS);
	unsigned int flags;
	EXPECT(cuCtxGetFlags(&flags), CUDA_SUCCESS);
	CHECK(flags == CU_CTX_SCHED_YIELD);
	EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
	EXPECT(cuCtxCreate_v3(&a, &sms, 1, 0, 0), CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY);
	EXPECT(cuCtxCreate_v3(&a, &bad, 1, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuCtxCreate_v3(&a, NULL, 1, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuCtxCreate_v3(&a, &sms, -1, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuCtxCreate_v3(NULL, NULL, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuCtxCreate_v3(&a, NULL, 0, 0, 7), CUDA_ERROR_INVALID_DEVICE);

	EXPECT(cuCtxCreate_v4(&a, NULL, 0, 0), CUDA_SUCCESS);
	EXPECT(cuCtxGetCurrent(&got), CUDA_SUCCESS);
	CHECK(got == a);
	EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
	EXPECT(cuCtxCreate_v4(&a, &params, 0, 0), CUDA_SUCCESS);
	EXPECT(cuCtxDestroy_v2(a), CUDA_SUCCESS);
	params.execAffinityParams = &sms;
	params.numExecAffinityParams = 1;
	EXPECT(cuCtxCreate_v4(&a, &params, 0, 0), CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY);
	params.cigParams = cig;
	EXPECT(cuCtxCreate_v4(&a, &params, 0, 0), CUDA_ERROR_INVALID_VALUE);
	params.execAffinityParams = NULL;
	params.numExecAffinityParams = 0;
	EXPECT(cuCtxCreate_v4(&a, &params, 0, 0), CUDA_ERROR_NOT_SUPPORTED);

	void *fn = NULL;
	CUdriverProcAddressQueryResult status;
	EXPECT(cuGetProcAddress_v2("cuCtxCreate", &fn, 11040, 0, &status), CUDA_SUCCESS);
	CHECK(fn == (void *)cuCtxCreate_v3);
	EXPECT(cuGetProcAddress_v2("cuCtxCreate", &fn, 11030, 0, &status), CUDA_SUCCESS);
	CHECK(fn == (void *)cuCtxCreate_v2);
}

static const struct test_case cases[] = {
	{"stack", stack},
	{"per_thread", per_thread},
	{"ownership", ownership},
	{"free_without_context", free_without_context},
	{"context_bytes", context_bytes},
	{"attributes", attributes},
	{"synchronize", synchronize},
	{"stream_context", stream_context},
	{"create_forms", create_forms},
	{"reset_lifetimes", reset_lifetimes},
	{"destroy_lifetimes", destroy_lifetimes},
	{"context_reuse", context_reuse},
	{"pool_memory_outlives", pool_memory_outlives},
};

int main(int argc, char **argv)
{
	return run_case(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
