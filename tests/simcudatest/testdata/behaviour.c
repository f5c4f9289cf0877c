/*
 * behaviour.c - checks one documented CUDA behaviour of simcuda per run:
 * `behaviour <case>`. It prints "PASS <case>" and exits 0, or names the
 * failed check and exits 1. Pending device work is created with host
 * functions that block on a pipe, never with sleeps, so every check is
 * deterministic.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#include "check.h"

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)

/* ---- a gate: a host function that blocks its stream until opened ---- */

struct gate {
	int fds[2];
};

static void gate_init(struct gate *g)
{
	CHECK(pipe(g->fds) == 0);
}

static void gate_wait(void *arg)
{
	struct gate *g = arg;
	char c;
	CHECK(read(g->fds[0], &c, 1) == 1);
}

static void gate_open(struct gate *g)
{
	CHECK(write(g->fds[1], "x", 1) == 1);
}

/* Host functions that append a letter to a log, to observe execution order. */
static char order_log[64];
static pthread_mutex_t order_lock = PTHREAD_MUTEX_INITIALIZER;

static void log_letter(void *arg)
{
	pthread_mutex_lock(&order_lock);
	size_t n = strlen(order_log);
	order_log[n] = *(const char *)arg;
	order_log[n + 1] = '\0';
	pthread_mutex_unlock(&order_lock);
}

static size_t device_used(void)
{
	size_t free_bytes, total;
	EXPECT(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
	return total - free_bytes;
}

/* ---- cases ---- */

/* SIMCUDA_DEVICES=2x1GiB */
static void case_capacity(void)
{
	void *p[4], *extra;
	CUdeviceptr d;
	size_t free_bytes, total;
	int count;

	EXPECT(cudaGetDeviceCount(&count), cudaSuccess);
	CHECK(count == 2);
	EXPECT(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
	CHECK(total == GiB && free_bytes == GiB);
	for (int i = 0; i < 4; i++)
		EXPECT(cudaMalloc(&p[i], 256 * MiB), cudaSuccess);
	EXPECT(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
	CHECK(free_bytes == 0);
	EXPECT(cudaMalloc(&extra, 1), cudaErrorMemoryAllocation);
	EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);
	EXPECT(cuMemAlloc_v2(&d, 512), CUDA_ERROR_OUT_OF_MEMORY);
	/* A request larger than the whole device fails the same way. */
	EXPECT(cudaMalloc(&extra, 2 * GiB), cudaErrorMemoryAllocation);
	/* Device 1 is independent of device 0. */
	EXPECT(cudaSetDevice(1), cudaSuccess);
	EXPECT(cudaMalloc(&extra, 512 * MiB), cudaSuccess);
	EXPECT(cudaFree(extra), cudaSuccess);
	EXPECT(cudaSetDevice(0), cudaSuccess);
	EXPECT(cudaFree(p[0]), cudaSuccess);
	EXPECT(cudaMalloc(&extra, 256 * MiB), cudaSuccess);
	EXPECT(cudaMalloc(&p[0], 1), cudaErrorMemoryAllocation);
	/* Pinned host memory does not count against the device. */
	void *host;
	EXPECT(cudaMallocHost(&host, 64 * MiB), cudaSuccess);
	EXPECT(cudaFreeHost(host), cudaSuccess);
}

/* Device pointers: aligned, disjoint, never inside host memory, not host-accessible. */
static void case_alignment(void)
{
	static const size_t sizes[] = {1, 3, 255, 256, 257, 4095, 4097, MiB + 1, 3 * MiB};
	enum { N = sizeof(sizes) / sizeof(sizes[0]) };
	char *p[N], *host[N];

	for (int i = 0; i < N; i++) {
		EXPECT(cudaMalloc((void **)&p[i], sizes[i]), cudaSuccess);
		host[i] = malloc(sizes[i]);
		CHECK(host[i] != NULL);
		CHECK((uintptr_t)p[i] % 256 == 0);
	}
	for (int i = 0; i < N; i++) {
		for (int j = 0; j < N; j++) {
			CHECK(i == j || p[i] + sizes[i] <= p[j] || p[j] + sizes[j] <= p[i]);
			CHECK(host[j] + sizes[j] <= p[i] || p[i] + sizes[i] <= host[j]);
		}
	}
	char *pitched;
	size_t pitch;
	EXPECT(cudaMallocPitch((void **)&pitched, &pitch, 100, 10), cudaSuccess);
	CHECK(pitch >= 100 && pitch % 256 == 0 && (uintptr_t)pitched % 256 == 0);

	/* As on a discrete GPU, the CPU cannot dereference device memory. */
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct rlimit no_core = {0, 0};
		setrlimit(RLIMIT_CORE, &no_core); /* the crash is the expected outcome */
		volatile char c = *p[0];
		(void)c;
		_exit(0);
	}
	int status;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
}

/* Freeing unknown or freed pointers fails with the documented code and changes nothing. */
static void case_bad_free(void)
{
	char *p, *q, *host = malloc(64);
	void *pinned;

	EXPECT(cudaMalloc((void **)&p, MiB), cudaSuccess);
	EXPECT(cudaMalloc((void **)&q, MiB), cudaSuccess);
	EXPECT(cudaMallocHost(&pinned, MiB), cudaSuccess);
	size_t used = device_used();
	EXPECT(cudaFree(host), cudaErrorInvalidValue);
	EXPECT(cudaFree(p + 256), cudaErrorInvalidValue);
	EXPECT(cudaFree(pinned), cudaErrorInvalidValue);
	EXPECT(cudaFreeHost(p), cudaErrorInvalidValue);
	EXPECT(cuMemFree_v2(0), CUDA_ERROR_INVALID_VALUE);
	CHECK(device_used() == used);
	EXPECT(cudaFree(p), cudaSuccess);
	EXPECT(cudaFree(p), cudaErrorInvalidValue);
	EXPECT(cudaFree(NULL), cudaSuccess);
	CHECK(device_used() == used - MiB);
	/* q is untouched: its bytes still round-trip. */
	char in[16] = "still here", out[16] = {0};
	EXPECT(cudaMemcpy(q, in, sizeof(in), cudaMemcpyHostToDevice), cudaSuccess);
	EXPECT(cudaMemcpy(out, q, sizeof(out), cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK(strcmp(out, "still here") == 0);
	EXPECT(cudaFreeHost(pinned), cudaSuccess);
	EXPECT(cudaFreeHost(pinned), cudaErrorInvalidValue);
}

/* One stream runs memset, copies and host functions in submission order. */
static void case_stream_order(void)
{
	static const char a = 'a', b = 'b';
	struct gate g;
	cudaStream_t s;
	cudaEvent_t done;
	char *d1, *d2, *pinned, src[32];

	gate_init(&g);
	EXPECT(cudaStreamCreate(&s), cudaSuccess);
	EXPECT(cudaEventCreate(&done), cudaSuccess);
	EXPECT(cudaMalloc((void **)&d1, 32), cudaSuccess);
	EXPECT(cudaMalloc((void **)&d2, 32), cudaSuccess);
	EXPECT(cudaMallocHost((void **)&pinned, 32), cudaSuccess);
	memset(pinned, 0, 32);
	memset(src, 'S', sizeof(src));

	EXPECT(cudaLaunchHostFunc(s, gate_wait, &g), cudaSuccess);
	EXPECT(cudaLaunchHostFunc(s, log_letter, (void *)&a), cudaSuccess);
	EXPECT(cudaMemsetAsync(d1, 'M', 32, s), cudaSuccess);
	/* The source is pageable: it is staged, so changing it now must not matter. */
	EXPECT(cudaMemcpyAsync(d1, src, 16, cudaMemcpyHostToDevice, s), cudaSuccess);
	memset(src, 'X', sizeof(src));
	EXPECT(cudaMemcpyAsync(d2, d1, 32, cudaMemcpyDeviceToDevice, s), cudaSuccess);
	EXPECT(cudaMemcpyAsync(pinned, d2, 32, cudaMemcpyDeviceToHost, s), cudaSuccess);
	EXPECT(cudaLaunchHostFunc(s, log_letter, (void *)&b), cudaSuccess);
	EXPECT(cudaEventRecord(done, s), cudaSuccess);

	EXPECT(cudaStreamQuery(s), cudaErrorNotReady);
	EXPECT(cudaEventQuery(done), cudaErrorNotReady);
	/* Not ready is recorded as the last error, as CUDA does; applications clear it. */
	EXPECT(cudaPeekAtLastError(), cudaErrorNotReady);
	EXPECT(cudaGetLastError(), cudaErrorNotReady);
	EXPECT(cudaGetLastError(), cudaSuccess);
	CHECK(pinned[0] == 0 && order_log[0] == '\0');
	gate_open(&g);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	EXPECT(cudaStreamQuery(s), cudaSuccess);
	EXPECT(cudaEventQuery(done), cudaSuccess);
	CHECK(strcmp(order_log, "ab") == 0);
	for (int i = 0; i < 32; i++)
		CHECK(pinned[i] == (i < 16 ? 'S' : 'M'));
	EXPECT(cudaStreamDestroy(s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
}

/* The legacy default stream waits for blocking streams and they for it; non-blocking ones don't. */
static void case_default_stream(void)
{
	static const char blocked = 'B', legacy = 'L', after = 'A', nonblocking = 'N';
	struct gate g1, g2;
	cudaStream_t blocking, other_blocking, free_running;
	cudaEvent_t legacy_done, after_done, nb_done;

	gate_init(&g1);
	gate_init(&g2);
	EXPECT(cudaStreamCreate(&blocking), cudaSuccess);
	EXPECT(cudaStreamCreate(&other_blocking), cudaSuccess);
	EXPECT(cudaStreamCreateWithFlags(&free_running, cudaStreamNonBlocking), cudaSuccess);
	EXPECT(cudaEventCreate(&legacy_done), cudaSuccess);
	EXPECT(cudaEventCreate(&after_done), cudaSuccess);
	EXPECT(cudaEventCreate(&nb_done), cudaSuccess);

	EXPECT(cudaLaunchHostFunc(blocking, gate_wait, &g1), cudaSuccess);
	EXPECT(cudaLaunchHostFunc(blocking, log_letter, (void *)&blocked), cudaSuccess);
	/* Legacy work submitted now must wait for the blocked stream. */
	EXPECT(cudaLaunchHostFunc(0, log_letter, (void *)&legacy), cudaSuccess);
	EXPECT(cudaEventRecord(legacy_done, 0), cudaSuccess);
	/* Blocking-stream work submitted after it must wait for the legacy stream. */
	EXPECT(cudaLaunchHostFunc(other_blocking, log_letter, (void *)&after), cudaSuccess);
	EXPECT(cudaEventRecord(after_done, other_blocking), cudaSuccess);
	/* A non-blocking stream is independent of all of it. */
	EXPECT(cudaLaunchHostFunc(free_running, log_letter, (void *)&nonblocking), cudaSuccess);
	EXPECT(cudaEventRecord(nb_done, free_running), cudaSuccess);
	EXPECT(cudaEventSynchronize(nb_done), cudaSuccess);

	EXPECT(cudaEventQuery(legacy_done), cudaErrorNotReady);
	EXPECT(cudaEventQuery(after_done), cudaErrorNotReady);
	CHECK(strcmp(order_log, "N") == 0);
	gate_open(&g1);
	EXPECT(cudaDeviceSynchronize(), cudaSuccess);
	CHECK(strcmp(order_log, "NBLA") == 0);

	/* A non-blocking stream's pending work does not hold up the legacy stream. */
	EXPECT(cudaLaunchHostFunc(free_running, gate_wait, &g2), cudaSuccess);
	EXPECT(cudaLaunchHostFunc(0, log_letter, (void *)&legacy), cudaSuccess);
	EXPECT(cudaStreamSynchronize(0), cudaSuccess);
	CHECK(strcmp(order_log, "NBLAL") == 0);
	EXPECT(cudaStreamQuery(free_running), cudaErrorNotReady);
	gate_open(&g2);
	EXPECT(cudaStreamSynchronize(free_running), cudaSuccess);

	/* The per-thread default stream is a blocking stream too. */
	EXPECT(cudaLaunchHostFunc(blocking, gate_wait, &g1), cudaSuccess);
	EXPECT(cudaLaunchHostFunc(0, log_letter, (void *)&legacy), cudaSuccess);
	EXPECT(cudaLaunchHostFunc(cudaStreamPerThread, log_letter, (void *)&after), cudaSuccess);
	EXPECT(cudaEventRecord(after_done, cudaStreamPerThread), cudaSuccess);
	EXPECT(cudaEventQuery(after_done), cudaErrorNotReady);
	gate_open(&g1);
	EXPECT(cudaEventSynchronize(after_done), cudaSuccess);
	CHECK(strcmp(order_log, "NBLALLA") == 0);
}

static volatile int host_fn_finished;
static struct gate free_gate;

static void wait_then_finish(void *arg)
{
	(void)arg;
	char c;
	CHECK(read(free_gate.fds[0], &c, 1) == 1);
	__atomic_store_n(&host_fn_finished, 1, __ATOMIC_SEQ_CST);
}

static void *open_gate_soon(void *arg)
{
	(void)arg;
	/* Give cudaFree the chance to return early if it were wrong; correctness never depends on it. */
	usleep(100 * 1000);
	gate_open(&free_gate);
	return NULL;
}

/* cudaFree waits for all outstanding work on the device, even on other streams. */
static void case_free_waits(void)
{
	cudaStream_t s;
	void *p, *q;
	pthread_t opener;

	gate_init(&free_gate);
	EXPECT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
	EXPECT(cudaMalloc(&p, MiB), cudaSuccess);
	EXPECT(cudaMalloc(&q, 2 * MiB), cudaSuccess);
	EXPECT(cudaLaunchHostFunc(s, wait_then_finish, NULL), cudaSuccess);
	CHECK(pthread_create(&opener, NULL, open_gate_soon, NULL) == 0);
	EXPECT(cudaFree(p), cudaSuccess);
	CHECK(__atomic_load_n(&host_fn_finished, __ATOMIC_SEQ_CST) == 1);
	CHECK(pthread_join(opener, NULL) == 0);

	/* cudaFreeAsync frees in stream order: the bytes stay taken while the stream is blocked. */
	struct gate g;
	gate_init(&g);
	size_t before = device_used();
	EXPECT(cudaLaunchHostFunc(s, gate_wait, &g), cudaSuccess);
	EXPECT(cudaFreeAsync(q, s), cudaSuccess);
	EXPECT(cudaFreeAsync(q, s), cudaErrorInvalidValue);
	CHECK(device_used() == before);
	gate_open(&g);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	CHECK(device_used() == before - 2 * MiB);

	/* A pointer whose stream-ordered free is queued can no longer be used. */
	EXPECT(cudaMalloc(&q, MiB), cudaSuccess);
	EXPECT(cudaFreeAsync(q, s), cudaSuccess);
	EXPECT(cudaMemsetAsync(q, 0, MiB, s), cudaErrorInvalidValue);
	EXPECT(cudaFree(q), cudaErrorInvalidValue);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);

	/* cudaMallocAsync memory is usable in stream order. */
	char *r, out[8] = {0};
	EXPECT(cudaMallocAsync((void **)&r, 8, s), cudaSuccess);
	EXPECT(cudaMemcpyAsync(r, "abcdefg", 8, cudaMemcpyHostToDevice, s), cudaSuccess);
	EXPECT(cudaMemcpyAsync(out, r, 8, cudaMemcpyDeviceToHost, s), cudaSuccess);
	EXPECT(cudaFreeAsync(r, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	CHECK(strcmp(out, "abcdefg") == 0);
}

static void call_cuda(void *arg)
{
	void *p;
	*(cudaError_t *)arg = cudaMalloc(&p, 16);
}

/* Events: completion, waits across streams, timing and its errors. */
static void case_events(void)
{
	struct gate g;
	cudaStream_t s1, s2;
	cudaEvent_t start, stop, untimed, never, marker;
	float ms = -1;
	cudaError_t from_host_fn = cudaSuccess;

	gate_init(&g);
	EXPECT(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
	EXPECT(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
	EXPECT(cudaEventCreate(&start), cudaSuccess);
	EXPECT(cudaEventCreate(&stop), cudaSuccess);
	EXPECT(cudaEventCreate(&never), cudaSuccess);
	EXPECT(cudaEventCreate(&marker), cudaSuccess);
	EXPECT(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
	EXPECT(cudaEventQuery(never), cudaSuccess); /* never recorded: complete */
	EXPECT(cudaEventSynchronize(never), cudaSuccess);

	EXPECT(cudaEventRecord(start, s1), cudaSuccess);
	EXPECT(cudaLaunchHostFunc(s1, gate_wait, &g), cudaSuccess);
	EXPECT(cudaEventRecord(stop, s1), cudaSuccess);
	EXPECT(cudaEventRecord(untimed, s1), cudaSuccess);
	/* s2 waits for stop, then runs a host function that must not call CUDA. */
	EXPECT(cudaStreamWaitEvent(s2, stop, cudaEventWaitExternal), cudaSuccess);
	EXPECT(cudaStreamWaitEvent(s2, stop, 0x2), cudaErrorInvalidValue);
	EXPECT(cudaLaunchHostFunc(s2, call_cuda, &from_host_fn), cudaSuccess);
	EXPECT(cudaEventRecord(marker, s2), cudaSuccess);
	EXPECT(cudaEventQuery(marker), cudaErrorNotReady);
	EXPECT(cudaEventElapsedTime(&ms, start, stop), cudaErrorNotReady);
	gate_open(&g);
	EXPECT(cudaEventSynchronize(marker), cudaSuccess);
	EXPECT(cudaEventQuery(stop), cudaSuccess);
	EXPECT(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
	CHECK(ms >= 0);
	EXPECT(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);
	EXPECT(cudaEventElapsedTime(&ms, start, never), cudaErrorInvalidResourceHandle);
	EXPECT(from_host_fn, cudaErrorNotPermitted);
	EXPECT(cudaEventDestroy(marker), cudaSuccess);
	EXPECT(cudaEventQuery(marker), cudaErrorInvalidResourceHandle);
	EXPECT(cudaEventCreateWithFlags(&marker, 0x80), cudaErrorInvalidValue);
}

/* Managed memory residency, observed through cudaMemGetInfo. SIMCUDA_DEVICES=1GiB. */
static void case_managed(void)
{
	const size_t size = 64 * MiB;
	char *m, out[8];
	cudaStream_t s;
	int attr;

	EXPECT(cudaDeviceGetAttribute(&attr, cudaDevAttrManagedMemory, 0), cudaSuccess);
	CHECK(attr == 1);
	EXPECT(cudaDeviceGetAttribute(&attr, cudaDevAttrConcurrentManagedAccess, 0), cudaSuccess);
	CHECK(attr == 1);
	EXPECT(cudaStreamCreate(&s), cudaSuccess);
	size_t base = device_used();

	/* Untouched: on the host. Host writes are visible to the device side. */
	EXPECT(cudaMallocManaged((void **)&m, size, cudaMemAttachGlobal), cudaSuccess);
	CHECK(device_used() == base);
	memcpy(m, "managed", 8);
	/* Prefetch to the device, then back to the CPU. */
	EXPECT(cudaMemPrefetchAsync(m, size, 0, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	CHECK(device_used() == base + size);
	EXPECT(cudaMemcpy(out, m, 8, cudaMemcpyDefault), cudaSuccess);
	CHECK(strcmp(out, "managed") == 0);
	EXPECT(cudaMemPrefetchAsync(m, size, cudaCpuDeviceId, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	CHECK(device_used() == base);
	/* A prefetch of part of the range moves only the blocks it touches (2 MiB granularity). */
	EXPECT(cudaMemPrefetchAsync(m + 4 * MiB, 3 * MiB, 0, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	CHECK(device_used() == base + 4 * MiB);
	EXPECT(cudaMemPrefetchAsync(m, size, cudaCpuDeviceId, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);

	/* Device access without advice migrates to the device. */
	EXPECT(cudaMemset(m, 1, size), cudaSuccess);
	CHECK(device_used() == base + size);
	CHECK(m[0] == 1 && m[size - 1] == 1);
	EXPECT(cudaFree(m), cudaSuccess);
	CHECK(device_used() == base);

	/* Preferred location CPU: device access reads it in place (with or without accessed-by). */
	EXPECT(cudaMallocManaged((void **)&m, size, cudaMemAttachGlobal), cudaSuccess);
	EXPECT(cudaMemAdvise(m, size, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId), cudaSuccess);
	EXPECT(cudaMemset(m, 2, size), cudaSuccess);
	CHECK(device_used() == base);
	EXPECT(cudaMemAdvise(m, size, cudaMemAdviseSetAccessedBy, 0), cudaSuccess);
	EXPECT(cudaMemset(m, 3, size), cudaSuccess);
	CHECK(device_used() == base && m[7] == 3);
	/* An explicit prefetch still moves it. */
	EXPECT(cudaMemPrefetchAsync(m, size, 0, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	CHECK(device_used() == base + size);
	EXPECT(cudaFree(m), cudaSuccess);

	/* Accessed-by alone: the device maps it and reads it in place. */
	EXPECT(cudaMallocManaged((void **)&m, size, cudaMemAttachGlobal), cudaSuccess);
	EXPECT(cudaMemAdvise(m, size, cudaMemAdviseSetAccessedBy, 0), cudaSuccess);
	EXPECT(cudaMemset(m, 4, size), cudaSuccess);
	CHECK(device_used() == base);
	EXPECT(cudaMemAdvise(m, size, cudaMemAdviseUnsetAccessedBy, 0), cudaSuccess);
	EXPECT(cudaMemset(m, 4, size), cudaSuccess);
	CHECK(device_used() == base + size);
	EXPECT(cudaFree(m), cudaSuccess);

	/* Preferred location the device: setting it moves nothing, device access places it there. */
	EXPECT(cudaMallocManaged((void **)&m, size, cudaMemAttachGlobal), cudaSuccess);
	EXPECT(cudaMemAdvise(m, size, cudaMemAdviseSetPreferredLocation, 0), cudaSuccess);
	CHECK(device_used() == base);
	EXPECT(cudaMemAdvise(m, size, cudaMemAdviseSetAccessedBy, 0), cudaSuccess);
	EXPECT(cudaMemset(m, 5, size), cudaSuccess);
	CHECK(device_used() == base + size);
	EXPECT(cudaFree(m), cudaSuccess);

	/* Oversubscription: managed bytes are evicted to make room for cudaMalloc. */
	EXPECT(cudaMallocManaged((void **)&m, 768 * MiB, cudaMemAttachGlobal), cudaSuccess);
	EXPECT(cudaMemPrefetchAsync(m, 768 * MiB, 0, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	CHECK(device_used() == base + 768 * MiB);
	void *plain;
	EXPECT(cudaMalloc(&plain, 512 * MiB), cudaSuccess);
	CHECK(device_used() == base + 1024 * MiB); /* 512 MiB plain + 512 MiB managed */
	EXPECT(cudaMalloc(&plain, 512 * MiB), cudaSuccess); /* evicts the rest of the managed bytes */
	CHECK(device_used() == base + 1024 * MiB);
	EXPECT(cudaMalloc(&plain, 1), cudaErrorMemoryAllocation); /* plain memory is never evicted */
	/* The evicted managed data is intact. */
	m[768 * MiB - 1] = 9;
	EXPECT(cudaMemcpy(out, m + 768 * MiB - 8, 8, cudaMemcpyDefault), cudaSuccess);
	CHECK(out[7] == 9);

	/* Bad advice and prefetch arguments. */
	char *host = malloc(64);
	EXPECT(cudaMemAdvise(host, 64, cudaMemAdviseSetReadMostly, 0), cudaErrorInvalidValue);
	EXPECT(cudaMemAdvise(m, 64, cudaMemAdviseSetPreferredLocation, 7), cudaErrorInvalidDevice);
	EXPECT(cudaMemPrefetchAsync(m, 2 * GiB, 0, s), cudaErrorInvalidValue);
	EXPECT(cudaMallocManaged((void **)&host, 0, cudaMemAttachGlobal), cudaErrorInvalidValue);
}

/* SIMCUDA_NO_MANAGED=1: the device reports no managed memory and refuses it. */
static void case_no_managed(void)
{
	int attr = -1;
	void *m;

	EXPECT(cudaDeviceGetAttribute(&attr, cudaDevAttrManagedMemory, 0), cudaSuccess);
	CHECK(attr == 0);
	EXPECT(cudaDeviceGetAttribute(&attr, cudaDevAttrConcurrentManagedAccess, 0), cudaSuccess);
	CHECK(attr == 0);
	struct cudaDeviceProp prop;
	EXPECT(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
	CHECK(prop.managedMemory == 0);
	EXPECT(cudaMallocManaged(&m, MiB, cudaMemAttachGlobal), cudaErrorNotSupported);
}

/* cudaGetLastError returns and clears; cudaPeekAtLastError does not clear; successes keep it. */
static void case_last_error(void)
{
	void *p;

	EXPECT(cudaGetLastError(), cudaSuccess);
	EXPECT(cudaMalloc(&p, 1ULL << 50), cudaErrorMemoryAllocation);
	EXPECT(cudaMalloc(&p, 16), cudaSuccess);
	EXPECT(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
	EXPECT(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
	EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);
	EXPECT(cudaGetLastError(), cudaSuccess);
	EXPECT(cudaSetDevice(5), cudaErrorInvalidDevice);
	EXPECT(cudaMemcpy(p, p, 16, (enum cudaMemcpyKind)9), cudaErrorInvalidMemcpyDirection);
	EXPECT(cudaGetLastError(), cudaErrorInvalidMemcpyDirection);
	CHECK(strcmp(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation") == 0);
	CHECK(strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0);
	const char *name;
	EXPECT(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &name), CUDA_SUCCESS);
	CHECK(strcmp(name, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
	EXPECT(cuGetErrorName((CUresult)12345, &name), CUDA_ERROR_INVALID_VALUE);
}

static int child_status(pid_t pid)
{
	int status;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status));
	return WEXITSTATUS(status);
}

/* A child forked after initialisation cannot use CUDA; one forked before can. */
static void case_fork(void)
{
	void *p;
	CUdeviceptr d;
	int n;

	pid_t early = fork();
	CHECK(early >= 0);
	if (early == 0) {
		_exit(cudaMalloc(&p, 16) == cudaSuccess && cudaFree(p) == cudaSuccess ? 0 : 1);
	}
	CHECK(child_status(early) == 0);

	EXPECT(cudaMalloc(&p, 16), cudaSuccess);
	/* Pending work in the parent must not make the child block either. */
	struct gate g;
	cudaStream_t s;
	gate_init(&g);
	EXPECT(cudaStreamCreate(&s), cudaSuccess);
	EXPECT(cudaLaunchHostFunc(s, gate_wait, &g), cudaSuccess);
	pid_t late = fork();
	CHECK(late >= 0);
	if (late == 0) {
		int bad = 0;
		bad |= cudaMalloc(&p, 16) != cudaErrorInitializationError;
		bad |= cudaGetDeviceCount(&n) != cudaErrorInitializationError;
		bad |= cudaDeviceSynchronize() != cudaErrorInitializationError;
		bad |= cudaFree(p) != cudaErrorInitializationError;
		bad |= cuMemAlloc_v2(&d, 16) != CUDA_ERROR_NOT_INITIALIZED;
		bad |= cuInit(0) != CUDA_ERROR_NOT_INITIALIZED;
		bad |= cuCtxSynchronize() != CUDA_ERROR_NOT_INITIALIZED;
		_exit(bad);
	}
	CHECK(child_status(late) == 0);
	gate_open(&g);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	EXPECT(cudaFree(p), cudaSuccess);
}

/*
 * SIMCUDA_FAIL=cudaMalloc:2,cuMemAlloc_v2:4,cudaMalloc:7=700,cuMemAlloc_v2:6=719:
 * exactly those calls fail, with out-of-memory or the code named (a driver
 * code the runtime reports as its own).
 */
static void case_fault(void)
{
	void *p[5];

	EXPECT(cudaMalloc(&p[0], 16), cudaSuccess);
	EXPECT(cudaMalloc(&p[1], 16), cudaErrorMemoryAllocation); /* 2nd cudaMalloc */
	EXPECT(cudaMalloc(&p[1], 16), cudaSuccess);                /* 2nd cuMemAlloc_v2 */
	EXPECT(cudaMalloc(&p[2], 16), cudaSuccess);                /* 3rd */
	EXPECT(cudaMalloc(&p[3], 16), cudaErrorMemoryAllocation); /* 4th cuMemAlloc_v2 */
	EXPECT(cudaMalloc(&p[3], 16), cudaSuccess);                /* 5th */
	EXPECT(cudaMalloc(&p[4], 16), cudaErrorIllegalAddress);   /* 7th cudaMalloc */
	EXPECT(cudaMalloc(&p[4], 16), cudaErrorLaunchFailure);    /* 6th cuMemAlloc_v2 */
	EXPECT(cudaMalloc(&p[4], 16), cudaSuccess);
	for (int i = 0; i < 5; i++)
		EXPECT(cudaFree(p[i]), cudaSuccess);
}

/* The driver's cuGetProcAddress hands out the versioned ABI the caller asks for. */
static void case_proc_address(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	void *fn;
	CUdriverProcAddressQueryResult status;

	CHECK(lib != NULL); /* the runtime loaded it */
	EXPECT(cuGetProcAddress_v2("cuMemAlloc", &fn, 12040, 0, &status), CUDA_SUCCESS);
	CHECK(fn == dlsym(lib, "cuMemAlloc_v2") && status == CU_GET_PROC_ADDRESS_SUCCESS);
	EXPECT(cuGetProcAddress_v2("cuMemAlloc", &fn, 3000, 0, &status), CUDA_SUCCESS);
	CHECK(fn == NULL && status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
	EXPECT(cuGetProcAddress_v2("cuNoSuchThing", &fn, 12040, 0, &status), CUDA_SUCCESS);
	CHECK(fn == NULL && status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
	EXPECT(cuGetProcAddress("cuNoSuchThing", &fn, 12040, 0), CUDA_ERROR_NOT_FOUND);
	EXPECT(cuGetProcAddress_v2("cuMemcpyAsync", &fn, 12040,
				   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status),
	       CUDA_SUCCESS);
	CHECK(fn == dlsym(lib, "cuMemcpyAsync_ptsz"));
	EXPECT(cuGetProcAddress_v2("cuMemAdvise", &fn, 12000, 0, &status), CUDA_SUCCESS);
	CHECK(fn == dlsym(lib, "cuMemAdvise"));
	EXPECT(cuGetProcAddress_v2("cuMemAdvise", &fn, 12020, 0, &status), CUDA_SUCCESS);
	CHECK(fn == dlsym(lib, "cuMemAdvise_v2"));
	EXPECT(cuGetProcAddress_v2("cuMemAlloc", &fn, 99000, 0, &status), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuGetProcAddress_v2("cuMemHostRegister", &fn, 12040, 0, &status), CUDA_SUCCESS);
	CHECK(fn == dlsym(lib, "cuMemHostRegister_v2"));
	EXPECT(cuGetProcAddress_v2("cuMemHostRegister", &fn, 6000, 0, &status), CUDA_SUCCESS);
	CHECK(fn == dlsym(lib, "cuMemHostRegister"));
	EXPECT(cuGetProcAddress_v2("cuMemHostUnregister", &fn, 12040, 0, &status), CUDA_SUCCESS);
	CHECK(fn == dlsym(lib, "cuMemHostUnregister"));
}

/* Pointer attributes, host allocations and their device pointers. */
static void case_pointers(void)
{
	void *d, *m, *pinned, *mapped, *dev_of_pinned;
	char stack[8];
	struct cudaPointerAttributes a;

	EXPECT(cudaMalloc(&d, 4096), cudaSuccess);
	EXPECT(cudaMallocManaged(&m, 4096, cudaMemAttachGlobal), cudaSuccess);
	EXPECT(cudaMallocHost(&pinned, 4096), cudaSuccess);
	EXPECT(cudaHostAlloc(&mapped, 4096, cudaHostAllocMapped | cudaHostAllocPortable), cudaSuccess);
	EXPECT(cudaHostAlloc(&mapped, 4096, 0x100), cudaErrorInvalidValue);
	EXPECT(cudaHostAlloc(&mapped, 4096, cudaHostAllocMapped), cudaSuccess);

	EXPECT(cudaPointerGetAttributes(&a, (char *)d + 100), cudaSuccess);
	CHECK(a.type == cudaMemoryTypeDevice && a.device == 0 && a.devicePointer == (char *)d + 100 &&
	      a.hostPointer == NULL);
	EXPECT(cudaPointerGetAttributes(&a, m), cudaSuccess);
	CHECK(a.type == cudaMemoryTypeManaged && a.devicePointer == m && a.hostPointer == m);
	EXPECT(cudaPointerGetAttributes(&a, pinned), cudaSuccess);
	CHECK(a.type == cudaMemoryTypeHost && a.hostPointer == pinned && a.devicePointer == pinned);
	EXPECT(cudaPointerGetAttributes(&a, stack), cudaSuccess);
	/* Unregistered memory: the pointer comes back as the host pointer, unchecked. */
	CHECK(a.type == cudaMemoryTypeUnregistered && a.hostPointer == stack && a.devicePointer == NULL);
	/* CUDA 12's struct ends in reserved[8]; the runtime writes only the four fields before it. */
	CHECK(sizeof(struct cudaPointerAttributes) == 24 + 8 * sizeof(long));
	memset(a.reserved, 0x5a, sizeof(a.reserved));
	EXPECT(cudaPointerGetAttributes(&a, d), cudaSuccess);
	for (size_t i = 0; i < sizeof(a.reserved); i++)
		CHECK(((unsigned char *)a.reserved)[i] == 0x5a);

	EXPECT(cudaHostGetDevicePointer(&dev_of_pinned, mapped, 0), cudaSuccess);
	CHECK(dev_of_pinned == mapped);
	EXPECT(cudaHostGetDevicePointer(&dev_of_pinned, stack, 0), cudaErrorInvalidValue);

	CUdeviceptr base;
	size_t size;
	EXPECT(cuMemGetAddressRange_v2(&base, &size, (CUdeviceptr)d + 10), CUDA_SUCCESS);
	CHECK(base == (CUdeviceptr)d && size == 4096);
	/* Mapped pinned memory has a device address under unified addressing,
	 * and its range is that of the host allocation (numba sizes mapped
	 * arrays this way). */
	EXPECT(cuMemGetAddressRange_v2(&base, &size, (CUdeviceptr)dev_of_pinned + 10), CUDA_SUCCESS);
	CHECK(base == (CUdeviceptr)mapped && size == 4096);
	EXPECT(cuMemGetAddressRange_v2(&base, &size, (CUdeviceptr)stack), CUDA_ERROR_NOT_FOUND);
	int is_managed = -1;
	EXPECT(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (CUdeviceptr)m),
	       CUDA_SUCCESS);
	CHECK(is_managed == 1);
	EXPECT(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (CUdeviceptr)stack),
	       CUDA_ERROR_INVALID_VALUE);

	/* Pinned memory is reachable from the device side: copies to and from it. */
	memcpy(pinned, "pinned!", 8);
	EXPECT(cudaMemcpy(d, pinned, 8, cudaMemcpyDefault), cudaSuccess);
	EXPECT(cudaMemcpy(mapped, d, 8, cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK(strcmp(mapped, "pinned!") == 0);
	/* A host-to-device copy into pageable memory is refused. */
	EXPECT(cudaMemcpy(stack, pinned, 8, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	/* An out-of-bounds copy is refused. */
	EXPECT(cudaMemcpy(d, pinned, 8192, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
}

/* SIMCUDA_CONTEXT_BYTES=256MiB on SIMCUDA_DEVICES=2x1GiB: each context takes its bytes on first use. */
static void case_context_bytes(void)
{
	size_t free_bytes, total;

	EXPECT(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
	CHECK(free_bytes == total - 256 * MiB);
	void *p;
	EXPECT(cudaMalloc(&p, 768 * MiB), cudaSuccess);
	EXPECT(cudaMalloc(&p, 1), cudaErrorMemoryAllocation);
	EXPECT(cudaSetDevice(1), cudaSuccess);
	EXPECT(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
	CHECK(free_bytes == total - 256 * MiB);
	/* cudaDeviceReset destroys the context: its allocations and its bytes go. */
	EXPECT(cudaSetDevice(0), cudaSuccess);
	EXPECT(cudaDeviceReset(), cudaSuccess);
	EXPECT(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
	CHECK(free_bytes == total - 256 * MiB); /* a new context, nothing else */
}

/* A bad SIMCUDA_DEVICES makes initialisation fail, with a message. */
static void case_bad_config(void)
{
	int n = -1;
	EXPECT(cudaGetDeviceCount(&n), cudaErrorInitializationError);
	CHECK(n == 0);
	EXPECT(cudaDriverGetVersion(&n), cudaSuccess);
	CHECK(n == 0);
}

/* Properties: name and totalGlobalMem at CUDA 12's offsets, versions. */
static void case_properties(void)
{
	struct cudaDeviceProp prop;
	char name[256];
	int v;

	EXPECT(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
	EXPECT(cuDeviceGetName(name, sizeof(name), 0), CUDA_SUCCESS);
	CHECK(strcmp(prop.name, name) == 0);
	CHECK(prop.totalGlobalMem == 80 * GiB);
	CHECK(prop.major == 9 && prop.minor == 0 && prop.warpSize == 32 && prop.managedMemory == 1);
	CHECK(prop.unifiedAddressing == 1 && prop.memoryPoolsSupported == 1);
	EXPECT(cudaGetDeviceProperties(&prop, 1), cudaSuccess);
	CHECK(prop.totalGlobalMem == 24 * GiB);
	EXPECT(cudaGetDeviceProperties(&prop, 2), cudaErrorInvalidDevice);
	EXPECT(cudaDeviceGetAttribute(&v, (enum cudaDeviceAttr)102, 0), cudaSuccess);
	CHECK(v == 1); /* virtual memory management is simulated (vmm_test.go) */
	EXPECT(cudaDriverGetVersion(&v), cudaSuccess);
	CHECK(v == 12040);
	EXPECT(cudaRuntimeGetVersion(&v), cudaSuccess);
	CHECK(v == 12040);
}

/* cudaMemGetInfo's used bytes on device, making it current. */
static size_t used_on(int device)
{
	EXPECT(cudaSetDevice(device), cudaSuccess);
	return device_used();
}

/*
 * SIMCUDA_DEVICES=2x1GiB. A preferred location keeps data from migrating only
 * while the data is there; data elsewhere migrates to the device that
 * accesses it (cudaMemAdviseSetPreferredLocation).
 */
static void case_managed_preferred(void)
{
	const size_t size = 64 * MiB;
	char *m;
	cudaStream_t s1;

	size_t base0 = used_on(0), base1 = used_on(1);
	EXPECT(cudaStreamCreate(&s1), cudaSuccess); /* a stream of device 1 */
	EXPECT(cudaSetDevice(0), cudaSuccess);
	EXPECT(cudaMallocManaged((void **)&m, size, cudaMemAttachGlobal), cudaSuccess);
	EXPECT(cudaMemAdvise(m, size, cudaMemAdviseSetPreferredLocation, 1), cudaSuccess);
	/* Untouched, so on the host, not at its preferred location: device 0's access moves it. */
	EXPECT(cudaMemset(m, 1, size), cudaSuccess);
	CHECK(used_on(0) == base0 + size && used_on(1) == base1);
	/* At its preferred location, device 0's access leaves it there. */
	EXPECT(cudaMemPrefetchAsync(m, size, 1, s1), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s1), cudaSuccess);
	CHECK(used_on(0) == base0 && used_on(1) == base1 + size);
	EXPECT(cudaSetDevice(0), cudaSuccess);
	EXPECT(cudaMemset(m, 2, size), cudaSuccess);
	CHECK(used_on(0) == base0 && used_on(1) == base1 + size);
	CHECK(m[0] == 2 && m[size - 1] == 2);
	EXPECT(cudaFree(m), cudaSuccess);
}

/* A gate that a watchdog thread opens after delay_ms, unless released earlier. */
struct watchdog {
	struct gate gate;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int released, fired;
	long delay_ms;
	pthread_t thread;
};

static void *watchdog_run(void *arg)
{
	struct watchdog *w = arg;
	struct timespec deadline;

	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += w->delay_ms / 1000;
	deadline.tv_nsec += (w->delay_ms % 1000) * 1000000;
	if (deadline.tv_nsec >= 1000000000) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&w->lock);
	while (!w->released)
		if (pthread_cond_timedwait(&w->cond, &w->lock, &deadline) != 0)
			break;
	w->fired = !w->released;
	pthread_mutex_unlock(&w->lock);
	gate_open(&w->gate);
	return NULL;
}

static void watchdog_start(struct watchdog *w, long delay_ms)
{
	gate_init(&w->gate);
	w->delay_ms = delay_ms;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	w->released = w->fired = 0;
	CHECK(pthread_create(&w->thread, NULL, watchdog_run, w) == 0);
}

/* Opens the gate now; returns whether the watchdog had to open it already. */
static int watchdog_release(struct watchdog *w)
{
	pthread_mutex_lock(&w->lock);
	int fired = w->fired;
	w->released = 1;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
	CHECK(pthread_join(w->thread, NULL) == 0);
	return fired;
}

/*
 * cudaFree of cudaMallocAsync memory does not synchronise (cudaFree's note);
 * freeing it under pending work is refused loudly, a documented deviation.
 */
static void case_free_async_pointer(void)
{
	cudaStream_t blocked, other;
	struct watchdog w;
	void *p, *busy;

	EXPECT(cudaStreamCreateWithFlags(&blocked, cudaStreamNonBlocking), cudaSuccess);
	EXPECT(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
	EXPECT(cudaMallocAsync(&p, MiB, other), cudaSuccess);
	EXPECT(cudaMallocAsync(&busy, MiB, other), cudaSuccess);
	EXPECT(cudaStreamSynchronize(other), cudaSuccess);
	size_t used = device_used();

	/* Ten seconds: far beyond any scheduling delay, so only a wrong wait reaches it. */
	watchdog_start(&w, 10000);
	EXPECT(cudaLaunchHostFunc(blocked, gate_wait, &w.gate), cudaSuccess);
	EXPECT(cudaMemsetAsync(busy, 0, MiB, blocked), cudaSuccess);
	/* Returns while the device still has pending work. */
	EXPECT(cudaFree(p), cudaSuccess);
	CHECK(device_used() == used - MiB);
	/* busy is still used by the blocked stream: refused, nothing changes. */
	EXPECT(cudaFree(busy), cudaErrorIllegalState);
	EXPECT(cudaGetLastError(), cudaErrorIllegalState);
	CHECK(device_used() == used - MiB);
	CHECK(!watchdog_release(&w));
	EXPECT(cudaStreamSynchronize(blocked), cudaSuccess);
	EXPECT(cudaFree(busy), cudaSuccess);
	CHECK(device_used() == used - 2 * MiB);
}

/* Async copies between host buffers are fully synchronous ("API synchronization behavior"). */
static void case_async_host_copy(void)
{
	cudaStream_t s;
	struct watchdog w;
	char *src, *dst;

	EXPECT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
	EXPECT(cudaMallocHost((void **)&src, 64), cudaSuccess);
	EXPECT(cudaMallocHost((void **)&dst, 64), cudaSuccess);
	memset(dst, 0, 64);
	strcpy(src, "pinned to pinned");
	/* A wrong copy returns before the gate opens; a right one waits, whatever the delay. */
	watchdog_start(&w, 100);
	EXPECT(cudaLaunchHostFunc(s, gate_wait, &w.gate), cudaSuccess);
	/* The stream is blocked until the watchdog fires: the copy can only return after that. */
	EXPECT(cudaMemcpyAsync(dst, src, 64, cudaMemcpyHostToHost, s), cudaSuccess);
	CHECK(strcmp(dst, "pinned to pinned") == 0);
	CHECK(watchdog_release(&w));
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
}

/*
 * cudaDeviceReset (cuDevicePrimaryCtxReset) destroys the context's state but
 * releases no one's retain: another holder may still release it afterwards.
 */
static void case_primary_reset(void)
{
	CUcontext ctx;
	unsigned int flags;
	int active = -1;
	void *p;

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
	EXPECT(cudaMalloc(&p, MiB), cudaSuccess);
	EXPECT(cudaDeviceReset(), cudaSuccess);
	EXPECT(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
	CHECK(active == 0);
	EXPECT(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS); /* the retain above survived the reset */
	EXPECT(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT); /* and was the last one */
	/* The runtime retains the context again on its next call. */
	EXPECT(cudaMalloc(&p, MiB), cudaSuccess);
	EXPECT(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
	CHECK(active == 1);
	EXPECT(cudaFree(p), cudaSuccess);
}

/*
 * SIMCUDA_DEVICES=1GiB. The default pool reuses memory whose cudaFreeAsync is
 * still queued: on the same stream as it is, on another stream by making that
 * stream wait for the free (cudaMemPoolReuse*, enabled by default).
 */
static void case_pool_reuse(void)
{
	static const char reused = 'R';
	cudaStream_t s1, s2;
	struct gate g;
	void *p, *q, *r;

	gate_init(&g);
	EXPECT(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
	EXPECT(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
	EXPECT(cudaLaunchHostFunc(s1, gate_wait, &g), cudaSuccess);
	EXPECT(cudaMallocAsync(&p, 768 * MiB, s1), cudaSuccess);
	EXPECT(cudaFreeAsync(p, s1), cudaSuccess); /* queued behind the gate */
	/* Same stream: the queued free's memory serves the next allocation. */
	EXPECT(cudaMallocAsync(&q, 768 * MiB, s1), cudaSuccess);
	CHECK(device_used() == 768 * MiB);
	/* Plain cudaMalloc memory is not the pool's: its queued free cannot be reused. */
	EXPECT(cudaMalloc(&p, 256 * MiB), cudaSuccess);
	EXPECT(cudaFreeAsync(p, s1), cudaSuccess);
	EXPECT(cudaMallocAsync(&p, 256 * MiB, s2), cudaErrorMemoryAllocation);
	/* Another stream: it reuses q's memory once s1 reaches q's free. */
	EXPECT(cudaFreeAsync(q, s1), cudaSuccess);
	EXPECT(cudaMallocAsync(&r, 768 * MiB, s2), cudaSuccess);
	EXPECT(cudaLaunchHostFunc(s2, log_letter, (void *)&reused), cudaSuccess);
	CHECK(device_used() == GiB);
	EXPECT(cudaStreamQuery(s2), cudaErrorNotReady); /* waits for s1's free */
	CHECK(order_log[0] == '\0');
	gate_open(&g);
	EXPECT(cudaStreamSynchronize(s2), cudaSuccess);
	CHECK(strcmp(order_log, "R") == 0);
	EXPECT(cudaStreamSynchronize(s1), cudaSuccess);
	CHECK(device_used() == 768 * MiB);
	EXPECT(cudaFreeAsync(r, s2), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s2), cudaSuccess);
	CHECK(device_used() == 0);
}

/* SIMCUDA_DEVICES=2x1GiB. An event records only on streams of its own device (cudaEventRecord). */
static void case_event_device(void)
{
	cudaStream_t s1;
	cudaEvent_t e0, e1;

	EXPECT(cudaSetDevice(0), cudaSuccess);
	EXPECT(cudaEventCreate(&e0), cudaSuccess);
	EXPECT(cudaSetDevice(1), cudaSuccess);
	EXPECT(cudaEventCreate(&e1), cudaSuccess);
	EXPECT(cudaStreamCreate(&s1), cudaSuccess);
	EXPECT(cudaEventRecord(e0, s1), cudaErrorInvalidResourceHandle);
	EXPECT(cudaEventRecord(e0, 0), cudaErrorInvalidResourceHandle); /* device 1's legacy stream */
	EXPECT(cudaEventRecord(e1, s1), cudaSuccess);
	/* Waiting is allowed across devices. */
	EXPECT(cudaSetDevice(0), cudaSuccess);
	EXPECT(cudaStreamWaitEvent(0, e1, 0), cudaSuccess);
	EXPECT(cudaEventRecord(e0, 0), cudaSuccess);
	EXPECT(cudaEventSynchronize(e0), cudaSuccess);
}

/*
 * Zero-byte requests: the runtime's allocators succeed with NULL and their
 * frees accept NULL; cudaMallocManaged and cuMemAlloc refuse zero bytes, as
 * documented.
 */
static void case_zero_size(void)
{
	void *p = (void *)0x1234;
	CUdeviceptr d = 1;
	cudaStream_t s;

	EXPECT(cudaStreamCreate(&s), cudaSuccess);
	size_t used = device_used();
	EXPECT(cudaMalloc(&p, 0), cudaSuccess);
	CHECK(p == NULL);
	EXPECT(cudaFree(p), cudaSuccess);
	p = (void *)0x1234;
	EXPECT(cudaMallocHost(&p, 0), cudaSuccess);
	CHECK(p == NULL);
	EXPECT(cudaFreeHost(p), cudaSuccess);
	p = (void *)0x1234;
	EXPECT(cudaHostAlloc(&p, 0, cudaHostAllocMapped), cudaSuccess);
	CHECK(p == NULL);
	EXPECT(cudaHostAlloc(&p, 0, 0x100), cudaErrorInvalidValue);
	p = (void *)0x1234;
	EXPECT(cudaMallocAsync(&p, 0, s), cudaSuccess);
	CHECK(p == NULL);
	EXPECT(cudaFreeAsync(p, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	EXPECT(cudaMallocManaged(&p, 0, cudaMemAttachGlobal), cudaErrorInvalidValue);
	EXPECT(cuMemAlloc_v2(&d, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cudaMalloc(NULL, 16), cudaErrorInvalidValue);
	EXPECT(cudaMallocHost(NULL, 0), cudaErrorInvalidValue);
	CHECK(device_used() == used);
}

/*
 * cudaFreeAsync reaching its stream while another stream still has work on
 * that memory (a missing dependency) stops the process with a message
 * instead of corrupting memory silently. Runs in a child forked before any
 * CUDA use, which it then initialises itself.
 */
static void case_free_async_race(void)
{
	int err[2];

	CHECK(pipe(err) == 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct rlimit no_core = {0, 0};
		cudaStream_t s1, s2;
		struct gate g;
		void *p;

		setrlimit(RLIMIT_CORE, &no_core); /* the abort is the expected outcome */
		dup2(err[1], 2);
		gate_init(&g);
		EXPECT(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
		EXPECT(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
		EXPECT(cudaMallocAsync(&p, MiB, s1), cudaSuccess);
		EXPECT(cudaStreamSynchronize(s1), cudaSuccess);
		EXPECT(cudaLaunchHostFunc(s2, gate_wait, &g), cudaSuccess);
		EXPECT(cudaMemsetAsync(p, 0, MiB, s2), cudaSuccess);
		EXPECT(cudaFreeAsync(p, s1), cudaSuccess); /* no dependency on s2's memset */
		cudaStreamSynchronize(s1);
		_exit(0);
	}
	close(err[1]);
	char msg[512] = {0};
	size_t n = 0;
	ssize_t r;
	while (n < sizeof(msg) - 1 && (r = read(err[0], msg + n, sizeof(msg) - 1 - n)) > 0)
		n += (size_t)r;
	int status;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
	CHECK(strstr(msg, "missing stream dependency") != NULL);
}

/* Holds 768 MiB of a 1 GiB device until stdin closes (for shared_capacity). */
static void case_hold(void)
{
	void *p;
	char buf[64];

	EXPECT(cudaMalloc(&p, 768 * MiB), cudaSuccess);
	printf("ready\n");
	fflush(stdout);
	while (fread(buf, 1, sizeof(buf), stdin) > 0)
		;
}

/* Another process holds 768 MiB of the same 1 GiB device: capacity is shared, as on a GPU. */
static void case_shared_capacity(void)
{
	size_t free_bytes, total;
	void *p;

	EXPECT(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
	CHECK(total == GiB && free_bytes == 256 * MiB);
	EXPECT(cudaMalloc(&p, 512 * MiB), cudaErrorMemoryAllocation);
	EXPECT(cudaMalloc(&p, 256 * MiB), cudaSuccess);
}

/* The device that owns runtime allocation p. */
static int device_of(const void *p)
{
	struct cudaPointerAttributes attr;

	EXPECT(cudaPointerGetAttributes(&attr, p), cudaSuccess);
	return attr.device;
}

/*
 * SIMCUDA_DEVICES=2x1GiB. Runtime calls operate on the context current to the
 * calling thread, whoever made it current; with none current (never set,
 * popped, destroyed) they make the current device's primary context current
 * again. cudaSetDevice always makes the primary context current, and
 * cudaGetDevice answers the device of the current context.
 */
static void case_runtime_context(void)
{
	CUcontext primary0, primary1, created, cur;
	int device = -1;
	void *p;

	EXPECT(cudaSetDevice(0), cudaSuccess);
	EXPECT(cuCtxGetCurrent(&primary0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&primary1, 1), CUDA_SUCCESS);
	EXPECT(cuCtxSetCurrent(primary1), CUDA_SUCCESS);
	EXPECT(cudaGetDevice(&device), cudaSuccess);
	CHECK(device == 1);
	EXPECT(cudaMalloc(&p, MiB), cudaSuccess);
	CHECK(device_of(p) == 1);
	EXPECT(cudaFree(p), cudaSuccess);

	/* Nothing current: the runtime makes the current device's primary context current. */
	EXPECT(cudaSetDevice(0), cudaSuccess);
	EXPECT(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
	EXPECT(cudaMalloc(&p, MiB), cudaSuccess);
	CHECK(device_of(p) == 0);
	EXPECT(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
	CHECK(cur == primary0);
	EXPECT(cudaFree(p), cudaSuccess);

	/* cudaSetDevice of the device already set still replaces a created context. */
	EXPECT(cuCtxCreate_v2(&created, 0, 1), CUDA_SUCCESS);
	EXPECT(cudaGetDevice(&device), cudaSuccess);
	CHECK(device == 1);
	EXPECT(cudaSetDevice(0), cudaSuccess);
	EXPECT(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
	CHECK(cur == primary0);

	/* Destroying the current created context leaves the runtime its primary context. */
	EXPECT(cuCtxPushCurrent_v2(created), CUDA_SUCCESS);
	EXPECT(cuCtxDestroy_v2(created), CUDA_SUCCESS);
	EXPECT(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
	EXPECT(cudaMalloc(&p, MiB), cudaSuccess);
	CHECK(device_of(p) == 0);
	EXPECT(cudaGetDevice(&device), cudaSuccess);
	CHECK(device == 0);
	EXPECT(cudaFree(p), cudaSuccess);
	EXPECT(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
}

/*
 * cudaMalloc3D: width x height x depth bytes of pitched device memory, rows
 * padded as cudaMallocPitch pads them, the extent echoed in xsize and ysize.
 */
static void case_malloc3d(void)
{
	struct cudaPitchedPtr pp;
	struct cudaExtent extent = {100, 10, 4};
	size_t used = device_used();

	EXPECT(cudaMalloc3D(&pp, extent), cudaSuccess);
	CHECK(pp.ptr != NULL && (uintptr_t)pp.ptr % 256 == 0);
	CHECK(pp.pitch >= 100 && pp.pitch % 256 == 0);
	CHECK(pp.xsize == 100 && pp.ysize == 10);
	CHECK(device_used() == used + pp.pitch * 10 * 4);
	EXPECT(cudaMemset(pp.ptr, 7, pp.pitch * 10 * 4), cudaSuccess);
	EXPECT(cudaMemset(pp.ptr, 7, pp.pitch * 10 * 4 + 1), cudaErrorInvalidValue);
	EXPECT(cudaFree(pp.ptr), cudaSuccess);
	CHECK(device_used() == used);

	EXPECT(cudaMalloc3D(NULL, extent), cudaErrorInvalidValue);
	struct cudaExtent too_deep = {100, SIZE_MAX / 2, 4};
	EXPECT(cudaMalloc3D(&pp, too_deep), cudaErrorMemoryAllocation);
	EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);
	CHECK(device_used() == used);
}

/*
 * SIMCUDA_DEVICES=1GiB. cudaHostRegister page-locks existing host memory:
 * pinned memory that stays the application's, counts on no device (2 GiB
 * register on a 1 GiB device), answers as host memory with the host pointer
 * as its device pointer, and refuses what CUDA documents it refuses.
 */
static void case_host_register(void)
{
	int attr = -1;
	struct cudaDeviceProp prop;

	EXPECT(cudaDeviceGetAttribute(&attr, cudaDevAttrHostRegisterSupported, 0), cudaSuccess);
	CHECK(attr == 1);
	EXPECT(cudaDeviceGetAttribute(&attr, cudaDevAttrHostRegisterReadOnlySupported, 0), cudaSuccess);
	CHECK(attr == 0);
	EXPECT(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
	CHECK(prop.hostRegisterSupported == 1 && prop.hostRegisterReadOnlySupported == 0);

	/* An unaligned range of ordinary memory; the device's memory is untouched. */
	char *heap = malloc(3 * MiB + 64), *buf = heap + 8;
	CHECK(heap != NULL);
	size_t used = device_used();
	EXPECT(cudaHostRegister(buf, 3 * MiB, cudaHostRegisterMapped), cudaSuccess);
	CHECK(device_used() == used);
	size_t big = 2 * GiB;
	char *huge = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	CHECK(huge != MAP_FAILED);
	EXPECT(cudaHostRegister(huge, big, cudaHostRegisterDefault), cudaSuccess);
	CHECK(device_used() == used);

	/* Registered memory answers as pinned host memory, its range the one registered. */
	struct cudaPointerAttributes a;
	EXPECT(cudaPointerGetAttributes(&a, buf + 10), cudaSuccess);
	CHECK(a.type == cudaMemoryTypeHost && a.hostPointer == buf + 10 && a.devicePointer == buf + 10 &&
	      a.device == 0);
	CUdeviceptr base = 0;
	size_t size = 0;
	EXPECT(cuMemGetAddressRange_v2(&base, &size, (CUdeviceptr)buf + 10), CUDA_SUCCESS);
	CHECK(base == (CUdeviceptr)buf && size == 3 * MiB);
	EXPECT(cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)buf + 1),
	       CUDA_SUCCESS);
	CHECK(base == (CUdeviceptr)buf);
	EXPECT(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)buf + 1),
	       CUDA_SUCCESS);
	CHECK(size == 3 * MiB);
	CUcontext ctx = NULL, cur = NULL;
	EXPECT(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)buf), CUDA_SUCCESS);
	EXPECT(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
	CHECK(ctx == cur);
	void *dev_ptr = NULL;
	EXPECT(cudaHostGetDevicePointer(&dev_ptr, buf + 5, 0), cudaSuccess);
	CHECK(dev_ptr == buf + 5);
	/* cuMemHostGetFlags answers only memory cuMemAllocHost or cuMemHostAlloc made. */
	unsigned int flags = 0;
	EXPECT(cuMemHostGetFlags(&flags, buf), CUDA_ERROR_INVALID_VALUE);

	/* Device-side operations reach it, as they reach allocated pinned memory. */
	char *d;
	EXPECT(cudaMalloc((void **)&d, 16), cudaSuccess);
	EXPECT(cudaMemset(buf, 'r', 16), cudaSuccess);
	EXPECT(cudaMemcpy(d, buf, 16, cudaMemcpyHostToDevice), cudaSuccess);
	EXPECT(cudaMemset(buf, 0, 16), cudaSuccess);
	EXPECT(cudaMemcpy(buf + 16, d, 16, cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK(buf[0] == 0 && buf[16] == 'r' && buf[31] == 'r');
	EXPECT(cudaMemcpy(d, buf + 3 * MiB - 8, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);

	/* Registering page-locked memory again, in part or through an allocation, is refused. */
	EXPECT(cudaHostRegister(buf, 3 * MiB, 0), cudaErrorHostMemoryAlreadyRegistered);
	EXPECT(cudaHostRegister(heap, 16, 0), cudaErrorHostMemoryAlreadyRegistered);
	EXPECT(cudaHostRegister(buf + MiB, MiB, 0), cudaErrorHostMemoryAlreadyRegistered);
	void *pinned;
	EXPECT(cudaMallocHost(&pinned, 4096), cudaSuccess);
	EXPECT(cudaHostRegister(pinned, 4096, 0), cudaErrorHostMemoryAlreadyRegistered);
	/* Device memory is not host memory; neither is an unmapped range. */
	EXPECT(cudaHostRegister(d, 16, 0), cudaErrorInvalidValue);
	char *gone = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(gone != MAP_FAILED && munmap(gone, 8192) == 0);
	EXPECT(cudaHostRegister(gone, 8192, 0), cudaErrorInvalidValue);
	/* Arguments: as documented. */
	char spare[64];
	EXPECT(cudaHostRegister(NULL, 16, 0), cudaErrorInvalidValue);
	EXPECT(cudaHostRegister(spare, 0, 0), cudaErrorInvalidValue);
	EXPECT(cudaHostRegister(spare, sizeof(spare), 0x10), cudaErrorInvalidValue);
	EXPECT(cudaHostRegister(spare, sizeof(spare), cudaHostRegisterIoMemory), cudaErrorNotSupported);
	EXPECT(cudaHostRegister(spare, sizeof(spare), cudaHostRegisterReadOnly), cudaErrorNotSupported);
	EXPECT(cudaGetLastError(), cudaErrorNotSupported);

	/* Only the registered base unregisters; cudaFreeHost does not. */
	EXPECT(cudaFreeHost(buf), cudaErrorInvalidValue);
	EXPECT(cudaHostUnregister(buf + 1), cudaErrorHostMemoryNotRegistered);
	EXPECT(cudaHostUnregister(pinned), cudaErrorHostMemoryNotRegistered);
	EXPECT(cudaHostUnregister(spare), cudaErrorHostMemoryNotRegistered);
	EXPECT(cudaHostUnregister(NULL), cudaErrorInvalidValue);
	EXPECT(cudaFreeHost(pinned), cudaSuccess);

	/* Unregistering waits for the device's work, and leaves the memory pageable and mapped. */
	cudaStream_t s;
	pthread_t opener;
	gate_init(&free_gate);
	EXPECT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
	EXPECT(cudaLaunchHostFunc(s, wait_then_finish, NULL), cudaSuccess);
	CHECK(pthread_create(&opener, NULL, open_gate_soon, NULL) == 0);
	EXPECT(cudaHostUnregister(buf), cudaSuccess);
	CHECK(__atomic_load_n(&host_fn_finished, __ATOMIC_SEQ_CST) == 1);
	CHECK(pthread_join(opener, NULL) == 0);
	EXPECT(cudaHostUnregister(buf), cudaErrorHostMemoryNotRegistered);
	EXPECT(cudaPointerGetAttributes(&a, buf), cudaSuccess);
	CHECK(a.type == cudaMemoryTypeUnregistered);
	EXPECT(cudaMemset(buf, 0, 16), cudaErrorInvalidValue);
	CHECK(buf[16] == 'r');
	buf[0] = 'x';

	/* Destroying the context that registered it unregisters it, and unmaps nothing. */
	CUcontext created;
	EXPECT(cuCtxCreate_v2(&created, 0, 0), CUDA_SUCCESS);
	EXPECT(cuMemHostRegister_v2(buf, MiB, CU_MEMHOSTREGISTER_PORTABLE), CUDA_SUCCESS);
	EXPECT(cuCtxDestroy_v2(created), CUDA_SUCCESS);
	buf[MiB - 1] = 'y';
	EXPECT(cuMemHostUnregister(buf), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
	EXPECT(cuMemHostRegister_v2(buf, MiB, 0), CUDA_SUCCESS);
	EXPECT(cuMemHostUnregister(buf), CUDA_SUCCESS);
	EXPECT(cudaFree(d), cudaSuccess);
	free(heap);
	/* huge stays registered: the statistics file reports it, on no device. */
}

/* SIMCUDA_NO_HOST_REGISTER=1: the device reports no host registration, and the calls are unsupported. */
static void case_no_host_register(void)
{
	int attr = -1;
	char buf[64];
	struct cudaDeviceProp prop;

	EXPECT(cudaDeviceGetAttribute(&attr, cudaDevAttrHostRegisterSupported, 0), cudaSuccess);
	CHECK(attr == 0);
	EXPECT(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
	CHECK(prop.hostRegisterSupported == 0);
	EXPECT(cudaHostRegister(buf, sizeof(buf), 0), cudaErrorNotSupported);
	EXPECT(cudaHostUnregister(buf), cudaErrorNotSupported);
}

static const struct test_case cases[] = {
	{"hold", case_hold},
	{"shared_capacity", case_shared_capacity},
	{"capacity", case_capacity},
	{"alignment", case_alignment},
	{"bad_free", case_bad_free},
	{"stream_order", case_stream_order},
	{"default_stream", case_default_stream},
	{"free_waits", case_free_waits},
	{"events", case_events},
	{"managed", case_managed},
	{"no_managed", case_no_managed},
	{"last_error", case_last_error},
	{"fork", case_fork},
	{"fault", case_fault},
	{"proc_address", case_proc_address},
	{"pointers", case_pointers},
	{"context_bytes", case_context_bytes},
	{"bad_config", case_bad_config},
	{"properties", case_properties},
	{"managed_preferred", case_managed_preferred},
	{"free_async_pointer", case_free_async_pointer},
	{"async_host_copy", case_async_host_copy},
	{"primary_reset", case_primary_reset},
	{"pool_reuse", case_pool_reuse},
	{"event_device", case_event_device},
	{"zero_size", case_zero_size},
	{"malloc3d", case_malloc3d},
	{"free_async_race", case_free_async_race},
	{"runtime_context", case_runtime_context},
	{"host_register", case_host_register},
	{"no_host_register", case_no_host_register},
};

int main(int argc, char **argv)
{
	return run_case(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
