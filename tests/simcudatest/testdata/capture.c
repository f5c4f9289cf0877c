/*
 * capture.c - checks simcuda's stream capture, graphs and driver entry
 * points, one case per run: `capture <case>`. It prints "PASS <case>" and
 * exits 0, or names the failed check and exits 1.
 */
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#include "check.h"

#define MiB (1ULL << 20)

static enum cudaStreamCaptureStatus capture_status(cudaStream_t s)
{
	enum cudaStreamCaptureStatus st = (enum cudaStreamCaptureStatus)-1;
	EXPECT(cudaStreamIsCapturing(s, &st), cudaSuccess);
	return st;
}

static void count_call(void *arg)
{
	__atomic_add_fetch((int *)arg, 1, __ATOMIC_SEQ_CST);
}

/* Capture and replay of copies, memsets and a host function: recorded, not run. */
static void case_replay(void)
{
	cudaStream_t s;
	cudaGraph_t graph;
	cudaGraphExec_t exec;
	char *d1, *d2;
	static char src[4096], out[4096];
	int calls = 0;

	EXPECT(cudaStreamCreate(&s), cudaSuccess);
	EXPECT(cudaMalloc((void **)&d1, sizeof(src)), cudaSuccess);
	EXPECT(cudaMalloc((void **)&d2, sizeof(src)), cudaSuccess);
	EXPECT(cudaMemset(d2, 0, sizeof(src)), cudaSuccess);
	EXPECT(cudaDeviceSynchronize(), cudaSuccess);
	memset(src, 'a', sizeof(src));
	memset(out, '.', sizeof(out));

	CHECK(capture_status(s) == cudaStreamCaptureStatusNone);
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
	enum cudaStreamCaptureStatus st;
	unsigned long long id = 0;
	cudaGraph_t building = NULL;
	const cudaGraphNode_t *deps = NULL;
	size_t ndeps = 99;
	EXPECT(cudaStreamGetCaptureInfo(s, &st, &id, &building, &deps, &ndeps), cudaSuccess);
	CHECK(st == cudaStreamCaptureStatusActive && id != 0 && building != NULL && ndeps == 0);

	EXPECT(cudaMemcpyAsync(d1, src, sizeof(src), cudaMemcpyHostToDevice, s), cudaSuccess);
	EXPECT(cudaMemsetAsync(d1, 'b', 16, s), cudaSuccess);
	EXPECT(cudaMemcpyAsync(d2, d1, sizeof(src), cudaMemcpyDeviceToDevice, s), cudaSuccess);
	EXPECT(cudaLaunchHostFunc(s, count_call, &calls), cudaSuccess);
	/* Into pageable memory: outside capture this waits; here it only records. */
	EXPECT(cudaMemcpyAsync(out, d2, sizeof(out), cudaMemcpyDeviceToHost, s), cudaSuccess);
	EXPECT(cudaStreamGetCaptureInfo_v2(s, &st, NULL, NULL, &deps, &ndeps), cudaSuccess);
	CHECK(ndeps == 1 && deps != NULL && deps[0] != NULL);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaSuccess);
	CHECK(graph == building);
	CHECK(capture_status(s) == cudaStreamCaptureStatusNone);

	/* Nothing ran: the destination and the device buffer are untouched. */
	EXPECT(cudaDeviceSynchronize(), cudaSuccess);
	CHECK(out[0] == '.' && calls == 0);
	char probe[16];
	EXPECT(cudaMemcpy(probe, d2, sizeof(probe), cudaMemcpyDeviceToHost), cudaSuccess);
	for (size_t i = 0; i < sizeof(probe); i++)
		CHECK(probe[i] == 0);

	EXPECT(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
	/* The graph reads the source when it runs, not when it was captured. */
	memset(src, 'c', sizeof(src));
	EXPECT(cudaGraphLaunch(exec, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	EXPECT(calls, 1);
	for (size_t i = 0; i < sizeof(out); i++)
		CHECK(out[i] == (i < 16 ? 'b' : 'c'));

	/* Replays again, on another stream, after the graph handle is gone. */
	EXPECT(cudaGraphDestroy(graph), cudaSuccess);
	memset(src, 'd', sizeof(src));
	EXPECT(cudaGraphLaunch(exec, cudaStreamPerThread), cudaSuccess);
	EXPECT(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
	CHECK(calls == 2 && out[15] == 'b' && out[16] == 'd' && out[4095] == 'd');

	EXPECT(cudaGraphExecDestroy(exec), cudaSuccess);
	EXPECT(cudaGraphExecDestroy(exec), cudaErrorInvalidValue);
	EXPECT(cudaGraphLaunch(exec, s), cudaErrorInvalidResourceHandle);
	/* A graph replayed after its memory was freed is refused, not run on freed memory. */
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	EXPECT(cudaMemsetAsync(d1, 1, 16, s), cudaSuccess);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaSuccess);
	EXPECT(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
	EXPECT(cudaFree(d1), cudaSuccess);
	EXPECT(cudaGraphLaunch(exec, s), cudaErrorInvalidValue);
	EXPECT(cudaGraphInstantiate(&exec, graph, 1ULL << 7), cudaErrorInvalidValue);
	EXPECT(cudaGraphExecDestroy(exec), cudaSuccess);
	EXPECT(cudaGraphDestroy(graph), cudaSuccess);
	EXPECT(cudaFree(d2), cudaSuccess);
	EXPECT(cudaStreamDestroy(s), cudaSuccess);
}

/* ---- forbidden calls ---- */

struct forbidden {
	const char *what;
	cudaError_t want;
};

static cudaStream_t fs;
static cudaEvent_t captured_ev, outside_ev;
static void *scratch;

static void *malloc_on_thread(void *arg)
{
	void *p = NULL;
	*(cudaError_t *)arg = cudaMalloc(&p, MiB);
	if (p != NULL)
		cudaFree(p);
	return NULL;
}

static cudaError_t other_thread_malloc(void)
{
	pthread_t t;
	cudaError_t err = cudaSuccess;
	CHECK(pthread_create(&t, NULL, malloc_on_thread, &err) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	return err;
}

/* Host memory registered before the captures, and memory never registered. */
static char registered_buf[4096], unregistered_buf[4096];

static cudaError_t call_forbidden(int i)
{
	void *p = NULL;
	char host[64];

	switch (i) {
	case 0: return cudaMalloc(&p, MiB);
	case 1: return cudaFree(scratch);
	case 2: return cudaMallocHost(&p, 4096);
	case 3: return cudaMallocManaged(&p, MiB, cudaMemAttachGlobal);
	case 4: return cudaDeviceSynchronize();
	case 5: return cudaStreamSynchronize(fs);
	case 6: return cudaStreamQuery(fs);
	case 7: return cudaMemcpy(host, scratch, sizeof(host), cudaMemcpyDeviceToHost);
	case 8: return cudaMemsetAsync(scratch, 0, 64, 0);
	case 9: return cudaStreamSynchronize(0);
	case 10: return cudaEventQuery(captured_ev);
	case 11: return cudaEventSynchronize(captured_ev);
	case 12: return cudaStreamWaitEvent(fs, outside_ev, 0);
	case 13: return other_thread_malloc();
	case 14: return cudaHostRegister(unregistered_buf, sizeof(unregistered_buf), 0);
	case 15: return cudaHostUnregister(registered_buf);
	default: return cudaErrorUnknown;
	}
}

static const struct forbidden forbidden[] = {
	{"cudaMalloc", cudaErrorStreamCaptureUnsupported},
	{"cudaFree", cudaErrorStreamCaptureUnsupported},
	{"cudaMallocHost", cudaErrorStreamCaptureUnsupported},
	{"cudaMallocManaged", cudaErrorStreamCaptureUnsupported},
	{"cudaDeviceSynchronize", cudaErrorStreamCaptureUnsupported},
	{"cudaStreamSynchronize(capturing)", cudaErrorStreamCaptureUnsupported},
	{"cudaStreamQuery(capturing)", cudaErrorStreamCaptureUnsupported},
	{"cudaMemcpy (legacy stream)", cudaErrorStreamCaptureImplicit},
	{"cudaMemsetAsync on the legacy stream", cudaErrorStreamCaptureImplicit},
	{"cudaStreamSynchronize(legacy)", cudaErrorStreamCaptureImplicit},
	{"cudaEventQuery(captured event)", cudaErrorCapturedEvent},
	{"cudaEventSynchronize(captured event)", cudaErrorCapturedEvent},
	{"cudaStreamWaitEvent(uncaptured event)", cudaErrorStreamCaptureIsolation},
	{"cudaMalloc in another thread", cudaErrorStreamCaptureUnsupported},
	{"cudaHostRegister", cudaErrorStreamCaptureUnsupported},
	{"cudaHostUnregister", cudaErrorStreamCaptureUnsupported},
};

/* Every forbidden call gives its error and invalidates a global-mode capture. */
static void case_forbidden(void)
{
	EXPECT(cudaStreamCreate(&fs), cudaSuccess);
	EXPECT(cudaMalloc(&scratch, MiB), cudaSuccess);
	EXPECT(cudaEventCreate(&captured_ev), cudaSuccess);
	EXPECT(cudaEventCreate(&outside_ev), cudaSuccess);
	EXPECT(cudaEventRecord(outside_ev, fs), cudaSuccess);
	EXPECT(cudaHostRegister(registered_buf, sizeof(registered_buf), 0), cudaSuccess);
	for (int i = 0; i < (int)(sizeof(forbidden) / sizeof(forbidden[0])); i++) {
		cudaGraph_t graph = (cudaGraph_t)&graph;
		cudaGetLastError();
		EXPECT(cudaStreamBeginCapture(fs, cudaStreamCaptureModeGlobal), cudaSuccess);
		EXPECT(cudaMemsetAsync(scratch, 1, 64, fs), cudaSuccess);
		EXPECT(cudaEventRecord(captured_ev, fs), cudaSuccess);
		cudaError_t got = call_forbidden(i);
		if (got != forbidden[i].want) {
			fprintf(stderr, "%s: %s returned %d, want %d\n", current_case, forbidden[i].what,
				got, forbidden[i].want);
			exit(1);
		}
		if (i != 13) /* the other thread's error is that thread's last error */
			EXPECT(cudaPeekAtLastError(), forbidden[i].want);
		if (capture_status(fs) != cudaStreamCaptureStatusInvalidated) {
			fprintf(stderr, "%s: %s did not invalidate the capture\n", current_case,
				forbidden[i].what);
			exit(1);
		}
		EXPECT(cudaMemsetAsync(scratch, 2, 64, fs), cudaErrorStreamCaptureInvalidated);
		EXPECT(cudaStreamEndCapture(fs, &graph), cudaErrorStreamCaptureInvalidated);
		CHECK(graph == NULL);
		CHECK(capture_status(fs) == cudaStreamCaptureStatusNone);
	}
	/* The event stays last recorded in a capture until recorded outside one. */
	EXPECT(cudaEventQuery(captured_ev), cudaErrorCapturedEvent);
	EXPECT(cudaEventRecord(captured_ev, fs), cudaSuccess);
	EXPECT(cudaEventSynchronize(captured_ev), cudaSuccess);
	/* Nothing captured ever ran, and the refused cudaFree freed nothing. */
	char host[64];
	EXPECT(cudaMemcpy(host, scratch, sizeof(host), cudaMemcpyDeviceToHost), cudaSuccess);
	for (size_t i = 0; i < sizeof(host); i++)
		CHECK(host[i] == 0);
	EXPECT(cudaFree(scratch), cudaSuccess);
	/* The refused registration registered nothing, the refused unregistration kept its range. */
	EXPECT(cudaHostUnregister(unregistered_buf), cudaErrorHostMemoryNotRegistered);
	EXPECT(cudaHostUnregister(registered_buf), cudaSuccess);
	/* Beginning a capture on the legacy stream is unsupported. */
	EXPECT(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal),
	       cudaErrorStreamCaptureUnsupported);
	EXPECT(cudaStreamBeginCapture(fs, (enum cudaStreamCaptureMode)3), cudaErrorInvalidValue);
	EXPECT(cudaStreamDestroy(fs), cudaSuccess);
}

/* Relaxed captures allow the potentially unsafe calls, not the conflicting ones. */
static void case_relaxed(void)
{
	cudaStream_t s;
	cudaGraph_t graph;
	cudaGraphExec_t exec;
	cudaEvent_t ev;
	void *p, *d;
	char host[64];

	EXPECT(cudaStreamCreate(&s), cudaSuccess);
	EXPECT(cudaEventCreate(&ev), cudaSuccess);
	EXPECT(cudaMalloc(&d, 4096), cudaSuccess);
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
	EXPECT(cudaMemsetAsync(d, 7, sizeof(host), s), cudaSuccess);
	EXPECT(cudaMalloc(&p, MiB), cudaSuccess);
	EXPECT(cudaFree(p), cudaSuccess);
	EXPECT(cudaMallocHost(&p, 4096), cudaSuccess);
	EXPECT(cudaFreeHost(p), cudaSuccess);
	EXPECT(cudaHostRegister(registered_buf, sizeof(registered_buf), 0), cudaSuccess);
	EXPECT(cudaHostUnregister(registered_buf), cudaSuccess);
	EXPECT(cudaDeviceSynchronize(), cudaSuccess);
	EXPECT(other_thread_malloc(), cudaSuccess);
	CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
	/* What necessarily conflicts with capture is still refused. */
	EXPECT(cudaEventRecord(ev, s), cudaSuccess);
	EXPECT(cudaEventQuery(ev), cudaErrorCapturedEvent);
	CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);

	/* Again, without the conflicting call: the graph is good. */
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
	EXPECT(cudaMemsetAsync(d, 7, sizeof(host), s), cudaSuccess);
	EXPECT(cudaMalloc(&p, MiB), cudaSuccess);
	EXPECT(cudaFree(p), cudaSuccess);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaSuccess);
	EXPECT(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
	EXPECT(cudaGraphLaunch(exec, s), cudaSuccess);
	EXPECT(cudaMemcpyAsync(host, d, sizeof(host), cudaMemcpyDeviceToHost, s), cudaSuccess);
	for (size_t i = 0; i < sizeof(host); i++)
		CHECK(host[i] == 7);
	EXPECT(cudaGraphExecDestroy(exec), cudaSuccess);
	EXPECT(cudaGraphDestroy(graph), cudaSuccess);

	/* A thread that switches itself to relaxed may call them during a global capture. */
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
	EXPECT(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
	CHECK(mode == cudaStreamCaptureModeGlobal);
	EXPECT(cudaMalloc(&p, MiB), cudaSuccess);
	EXPECT(cudaFree(p), cudaSuccess);
	CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
	EXPECT(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
	CHECK(mode == cudaStreamCaptureModeRelaxed);
	mode = (enum cudaStreamCaptureMode)7;
	EXPECT(cudaThreadExchangeStreamCaptureMode(&mode), cudaErrorInvalidValue);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaSuccess);
	EXPECT(cudaGraphDestroy(graph), cudaSuccess);

	/* Thread-local: other threads are not affected, this one is. */
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	EXPECT(other_thread_malloc(), cudaSuccess);
	CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
	EXPECT(cudaMalloc(&p, MiB), cudaErrorStreamCaptureUnsupported);
	CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
	EXPECT(cudaFree(d), cudaSuccess);
	EXPECT(cudaStreamDestroy(s), cudaSuccess);
}

/* cudaMallocAsync in a capture: a pointer the graph can use, memory the graph owns. */
static void case_malloc_async(void)
{
	cudaStream_t s;
	cudaGraph_t graph;
	cudaGraphExec_t exec;
	size_t free0, free1, total;
	char *p = NULL, *kept = NULL;
	static char src[8192], out[8192];

	EXPECT(cudaStreamCreate(&s), cudaSuccess);
	EXPECT(cudaMemGetInfo(&free0, &total), cudaSuccess);
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	EXPECT(cudaMallocAsync((void **)&p, 4 * MiB, s), cudaSuccess);
	CHECK(p != NULL);
	EXPECT(cudaMemcpyAsync(p, src, sizeof(src), cudaMemcpyHostToDevice, s), cudaSuccess);
	EXPECT(cudaMemcpyAsync(out, p, sizeof(out), cudaMemcpyDeviceToHost, s), cudaSuccess);
	EXPECT(cudaFreeAsync(p, s), cudaSuccess);
	EXPECT(cudaMallocAsync((void **)&kept, MiB, s), cudaSuccess);
	EXPECT(cudaMemsetAsync(kept, 'k', MiB, s), cudaSuccess);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaSuccess);
	EXPECT(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch),
	       cudaSuccess);
	for (char c = 'x'; c <= 'z'; c++) {
		memset(src, c, sizeof(src));
		EXPECT(cudaGraphLaunch(exec, s), cudaSuccess);
		EXPECT(cudaStreamSynchronize(s), cudaSuccess);
		for (size_t i = 0; i < sizeof(out); i++)
			CHECK(out[i] == c);
	}
	/* Memory allocated and not freed in the capture is the program's. */
	char probe[8];
	EXPECT(cudaMemcpy(probe, kept, sizeof(probe), cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK(probe[0] == 'k' && probe[7] == 'k');
	EXPECT(cudaFree(kept), cudaSuccess);
	EXPECT(cudaMemGetInfo(&free1, &total), cudaSuccess);
	CHECK(free1 == free0 - 4 * MiB); /* the graph holds its allocation */
	EXPECT(cudaGraphDestroy(graph), cudaSuccess);
	EXPECT(cudaMemGetInfo(&free1, &total), cudaSuccess);
	CHECK(free1 == free0 - 4 * MiB); /* until the executable graph goes too */
	EXPECT(cudaGraphExecDestroy(exec), cudaSuccess);
	EXPECT(cudaMemGetInfo(&free1, &total), cudaSuccess);
	CHECK(free1 == free0);

	/* An invalidated capture's allocations go with it. */
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	EXPECT(cudaMallocAsync((void **)&p, 4 * MiB, s), cudaSuccess);
	EXPECT(cudaFreeAsync(p, s), cudaSuccess);
	EXPECT(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
	EXPECT(cudaMallocAsync((void **)&p, MiB, s), cudaErrorStreamCaptureInvalidated);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
	EXPECT(cudaMemGetInfo(&free1, &total), cudaSuccess);
	CHECK(free1 == free0);

	/* Memory allocated before the capture and freed in it is freed by the first launch. */
	EXPECT(cudaMallocAsync((void **)&p, MiB, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	EXPECT(cudaFreeAsync(p, s), cudaSuccess);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaSuccess);
	EXPECT(cudaMemsetAsync(p, 0, 16, s), cudaErrorInvalidValue); /* freed as far as callers go */
	EXPECT(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
	EXPECT(cudaGraphLaunch(exec, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	EXPECT(cudaMemGetInfo(&free1, &total), cudaSuccess);
	CHECK(free1 == free0);
	EXPECT(cudaGraphLaunch(exec, s), cudaErrorInvalidValue); /* a second free of it */
	EXPECT(cudaGraphExecDestroy(exec), cudaSuccess);
	EXPECT(cudaGraphDestroy(graph), cudaSuccess);

	/* A free recorded in a capture that is discarded never happens: the memory is the
	 * program's again. */
	EXPECT(cudaMallocAsync((void **)&p, MiB, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	EXPECT(cudaFreeAsync(p, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
	EXPECT(cudaFree(p), cudaSuccess);

	/* Destroying a capturing stream ends its capture; the memory goes with the graph. */
	cudaStream_t doomed;
	EXPECT(cudaStreamCreate(&doomed), cudaSuccess);
	EXPECT(cudaStreamBeginCapture(doomed, cudaStreamCaptureModeGlobal), cudaSuccess);
	EXPECT(cudaMallocAsync((void **)&p, MiB, doomed), cudaSuccess);
	EXPECT(cudaFreeAsync(p, doomed), cudaSuccess);
	EXPECT(cudaStreamDestroy(doomed), cudaSuccess);
	EXPECT(cudaMalloc((void **)&p, MiB), cudaSuccess); /* no capture forbids it any more */
	EXPECT(cudaFree(p), cudaSuccess);
	EXPECT(cudaMemGetInfo(&free1, &total), cudaSuccess);
	CHECK(free1 == free0);
	EXPECT(cudaStreamDestroy(s), cudaSuccess);
}

static cudaStream_t wrong_thread_stream;

static void *end_on_thread(void *arg)
{
	cudaGraph_t g = NULL;
	*(cudaError_t *)arg = cudaStreamEndCapture(wrong_thread_stream, &g);
	if (g != NULL)
		cudaGraphDestroy(g);
	return NULL;
}

static cudaError_t end_from_other_thread(cudaStream_t s)
{
	pthread_t t;
	cudaError_t err = cudaErrorUnknown;
	wrong_thread_stream = s;
	CHECK(pthread_create(&t, NULL, end_on_thread, &err) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	return err;
}

/* Capture status queries, the legacy stream beside a capture, cross-stream joins. */
static void case_status(void)
{
	cudaStream_t s, s2, nb;
	cudaEvent_t fork, join;
	cudaGraph_t graph;
	cudaGraphExec_t exec;
	enum cudaStreamCaptureStatus st;
	char *d;
	char host[32];

	EXPECT(cudaStreamCreate(&s), cudaSuccess);
	EXPECT(cudaStreamCreate(&s2), cudaSuccess);
	EXPECT(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking), cudaSuccess);
	EXPECT(cudaEventCreate(&fork), cudaSuccess);
	EXPECT(cudaEventCreate(&join), cudaSuccess);
	EXPECT(cudaMalloc((void **)&d, 4096), cudaSuccess);

	EXPECT(cudaStreamEndCapture(s, &graph), cudaErrorIllegalState);
	EXPECT(cudaStreamIsCapturing(s, NULL), cudaErrorInvalidValue);
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
	/* The legacy stream beside a capturing blocking stream: documented, not invalidating. */
	EXPECT(cudaStreamIsCapturing(0, &st), cudaErrorStreamCaptureImplicit);
	EXPECT(cudaStreamGetCaptureInfo(0, &st, NULL, NULL, NULL, NULL),
	       cudaErrorStreamCaptureImplicit);
	CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
	CHECK(capture_status(s2) == cudaStreamCaptureStatusNone);
	/* Global and thread-local captures may only be ended by their thread. */
	EXPECT(end_from_other_thread(s), cudaErrorStreamCaptureWrongThread);
	CHECK(capture_status(s) == cudaStreamCaptureStatusActive);

	/* Fork to s2 and join back: one graph, both streams' work, in order. */
	EXPECT(cudaMemsetAsync(d, 'a', sizeof(host), s), cudaSuccess);
	EXPECT(cudaEventRecord(fork, s), cudaSuccess);
	EXPECT(cudaStreamWaitEvent(s2, fork, 0), cudaSuccess);
	CHECK(capture_status(s2) == cudaStreamCaptureStatusActive);
	unsigned long long id1 = 0, id2 = 0;
	EXPECT(cudaStreamGetCaptureInfo(s, &st, &id1, NULL, NULL, NULL), cudaSuccess);
	EXPECT(cudaStreamGetCaptureInfo(s2, &st, &id2, NULL, NULL, NULL), cudaSuccess);
	CHECK(id1 != 0 && id1 == id2);
	EXPECT(cudaMemsetAsync(d + 8, 'b', 8, s2), cudaSuccess);
	EXPECT(cudaStreamEndCapture(s2, &graph), cudaErrorStreamCaptureUnmatched);
	EXPECT(cudaEventRecord(join, s2), cudaSuccess);
	EXPECT(cudaStreamWaitEvent(s, join, 0), cudaSuccess);
	EXPECT(cudaMemcpyAsync(host, d, sizeof(host), cudaMemcpyDeviceToHost, s), cudaSuccess);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaSuccess);
	CHECK(capture_status(s2) == cudaStreamCaptureStatusNone);
	memset(host, 0, sizeof(host));
	EXPECT(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
	EXPECT(cudaGraphLaunch(exec, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	for (size_t i = 0; i < sizeof(host); i++)
		CHECK(host[i] == (i >= 8 && i < 16 ? 'b' : 'a'));
	EXPECT(cudaGraphExecDestroy(exec), cudaSuccess);
	EXPECT(cudaGraphDestroy(graph), cudaSuccess);
	/* The events stay captured ones: waiting for them now crosses no live capture. */
	EXPECT(cudaStreamWaitEvent(s2, join, 0), cudaErrorCapturedEvent);

	/* A fork that never joins back. */
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	EXPECT(cudaEventRecord(fork, s), cudaSuccess);
	EXPECT(cudaStreamWaitEvent(s2, fork, 0), cudaSuccess);
	EXPECT(cudaMemsetAsync(d, 'c', 8, s2), cudaSuccess);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureUnjoined);
	CHECK(graph == NULL);
	CHECK(capture_status(s2) == cudaStreamCaptureStatusNone);

	/* Two captures cannot merge. */
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	EXPECT(cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal), cudaSuccess);
	EXPECT(cudaEventRecord(fork, s), cudaSuccess);
	EXPECT(cudaStreamWaitEvent(s2, fork, 0), cudaErrorStreamCaptureMerge);
	EXPECT(cudaStreamEndCapture(s2, &graph), cudaErrorStreamCaptureInvalidated);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);

	/* Waiting for an event never recorded waits for nothing, in capture too. */
	cudaEvent_t never;
	EXPECT(cudaEventCreate(&never), cudaSuccess);
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	EXPECT(cudaStreamWaitEvent(s, never, 0), cudaSuccess);
	CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaSuccess);
	EXPECT(cudaGraphDestroy(graph), cudaSuccess);

	/* An external wait is allowed and waits at launch. */
	EXPECT(cudaEventRecord(join, s2), cudaSuccess);
	EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	EXPECT(cudaStreamWaitEvent(s, join, cudaEventWaitExternal), cudaSuccess);
	EXPECT(cudaStreamEndCapture(s, &graph), cudaSuccess);
	EXPECT(cudaGraphDestroy(graph), cudaSuccess);

	/* A non-blocking stream's capture does not involve the legacy stream. */
	EXPECT(cudaStreamBeginCapture(nb, cudaStreamCaptureModeRelaxed), cudaSuccess);
	CHECK(capture_status(0) == cudaStreamCaptureStatusNone);
	EXPECT(cudaMemset(d, 0, 16), cudaSuccess);
	/* A relaxed capture may be ended by another thread. */
	EXPECT(end_from_other_thread(nb), cudaSuccess);

	/* The per-thread default stream can capture. */
	EXPECT(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeGlobal), cudaSuccess);
	CHECK(capture_status(cudaStreamPerThread) == cudaStreamCaptureStatusActive);
	EXPECT(cudaStreamEndCapture(cudaStreamPerThread, &graph), cudaSuccess);
	EXPECT(cudaGraphDestroy(graph), cudaSuccess);
	EXPECT(cudaGraphDestroy(graph), cudaErrorInvalidValue);
	EXPECT(cudaFree(d), cudaSuccess);
}

/* The driver API directly, through cuGetProcAddress as a driver client would. */
static void case_driver(void)
{
	CUresult (*get_proc)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
	CUresult (*begin)(CUstream, CUstreamCaptureMode);
	CUresult (*end)(CUstream, CUgraph *);
	CUresult (*exchange)(CUstreamCaptureMode *);
	CUdriverProcAddressQueryResult st;
	CUstream s;
	CUgraph g;
	CUcontext ctx;
	CUdeviceptr p;

	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	CHECK(lib != NULL);
	*(void **)&get_proc = dlsym(lib, "cuGetProcAddress_v2");
	CHECK(get_proc != NULL);
	EXPECT(get_proc("cuStreamBeginCapture", (void **)&begin, 12040, 0, &st), CUDA_SUCCESS);
	CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS && (void *)begin == dlsym(lib, "cuStreamBeginCapture_v2"));
	EXPECT(get_proc("cuStreamBeginCapture", (void **)&begin, 10000, 0, &st), CUDA_SUCCESS);
	CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT && begin == NULL);
	EXPECT(get_proc("cuStreamBeginCapture", (void **)&begin, 12040,
			CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
	       CUDA_SUCCESS);
	CHECK((void *)begin == dlsym(lib, "cuStreamBeginCapture_v2_ptsz"));
	EXPECT(get_proc("cuStreamBeginCapture", (void **)&begin, 12040, 0, &st), CUDA_SUCCESS);
	EXPECT(get_proc("cuStreamEndCapture", (void **)&end, 12040, 0, &st), CUDA_SUCCESS);
	EXPECT(get_proc("cuThreadExchangeStreamCaptureMode", (void **)&exchange, 12040, 0, &st),
	       CUDA_SUCCESS);
	CHECK(end != NULL && exchange != NULL);

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
	EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
	EXPECT(cuStreamCreate(&s, CU_STREAM_DEFAULT), CUDA_SUCCESS);
	EXPECT(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	EXPECT(cuMemAlloc_v2(&p, MiB), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	EXPECT(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	EXPECT(end(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	const char *name;
	EXPECT(cuGetErrorName(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, &name), CUDA_SUCCESS);
	CHECK(strcmp(name, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED") == 0);
	CHECK(strcmp(cudaGetErrorName(cudaErrorStreamCaptureImplicit),
		     "cudaErrorStreamCaptureImplicit") == 0);
	EXPECT(cuStreamDestroy_v2(s), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
}

/* cudaGetDriverEntryPoint[ByVersion] hand out the driver's own pointers. */
static void case_entry_points(void)
{
	enum cudaDriverEntryPointQueryResult st;
	void *fn;
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);

	CHECK(lib != NULL);
	EXPECT(cudaGetDriverEntryPoint("cuMemAlloc", &fn, cudaEnableDefault, &st), cudaSuccess);
	CHECK(st == cudaDriverEntryPointSuccess && fn == dlsym(lib, "cuMemAlloc_v2"));
	EXPECT(cudaGetDriverEntryPoint("cuMemcpyAsync", &fn, cudaEnableLegacyStream, &st), cudaSuccess);
	CHECK(st == cudaDriverEntryPointSuccess && fn == dlsym(lib, "cuMemcpyAsync"));
	EXPECT(cudaGetDriverEntryPoint("cuMemcpyAsync", &fn, cudaEnablePerThreadDefaultStream, &st),
	       cudaSuccess);
	CHECK(fn == dlsym(lib, "cuMemcpyAsync_ptsz"));
	EXPECT(cudaGetDriverEntryPoint("cuGraphInstantiate", &fn, cudaEnableDefault, NULL),
	       cudaSuccess);
	CHECK(fn == dlsym(lib, "cuGraphInstantiateWithFlags"));
	/* A miss is no error: a NULL pointer and the reason in driverStatus. */
	fn = &fn;
	EXPECT(cudaGetDriverEntryPoint("cuNoSuchFunction", &fn, cudaEnableDefault, &st), cudaSuccess);
	CHECK(fn == NULL && st == cudaDriverEntryPointSymbolNotFound);
	EXPECT(cudaGetDriverEntryPoint("cuMemAlloc", &fn, 4, &st), cudaErrorInvalidValue);
	EXPECT(cudaGetDriverEntryPoint(NULL, &fn, cudaEnableDefault, &st), cudaErrorInvalidValue);

	EXPECT(cudaGetDriverEntryPointByVersion("cuMemAdvise", &fn, 12000, cudaEnableDefault, &st),
	       cudaSuccess);
	CHECK(st == cudaDriverEntryPointSuccess && fn == dlsym(lib, "cuMemAdvise"));
	EXPECT(cudaGetDriverEntryPointByVersion("cuMemAdvise", &fn, 12020, cudaEnableDefault, &st),
	       cudaSuccess);
	CHECK(fn == dlsym(lib, "cuMemAdvise_v2"));
	EXPECT(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &fn, 11000, cudaEnableDefault, &st),
	       cudaSuccess);
	CHECK(fn == NULL && st == cudaDriverEntryPointVersionNotSufficent);
	EXPECT(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 13000, cudaEnableDefault, &st),
	       cudaErrorInvalidValue);
}

/*
 * Destroying a graph and its executable graph frees what the capture made,
 * the capture's own records included: a program that captures, launches
 * and destroys a graph per step holds bounded memory. The heap in use grows
 * by less than 64 KiB over 2000 cycles (at least 150 bytes a cycle were
 * never freed before).
 */
static void one_graph_cycle(cudaStream_t s, cudaStream_t joined, cudaEvent_t fork, void *p)
{
	cudaGraph_t g;
	cudaGraphExec_t x;

	OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
	OK(cudaEventRecord(fork, s));
	OK(cudaStreamWaitEvent(joined, fork, 0));
	OK(cudaMemsetAsync(p, 1, 4096, joined));
	OK(cudaEventRecord(fork, joined));
	OK(cudaStreamWaitEvent(s, fork, 0));
	OK(cudaMemsetAsync(p, 0, 4096, s));
	OK(cudaStreamEndCapture(s, &g));
	OK(cudaGraphInstantiate(&x, g, 0));
	OK(cudaGraphLaunch(x, s));
	OK(cudaStreamSynchronize(s));
	OK(cudaGraphExecDestroy(x));
	OK(cudaGraphDestroy(g));
	EXPECT(cudaGraphDestroy(g), cudaErrorInvalidValue);
	EXPECT(cudaGraphExecDestroy(x), cudaErrorInvalidValue);
}

static void case_graph_cycles(void)
{
	cudaStream_t s, joined;
	cudaEvent_t fork;
	void *p;

	OK(cudaStreamCreate(&s));
	OK(cudaStreamCreate(&joined));
	OK(cudaEventCreate(&fork));
	OK(cudaMalloc(&p, 4096));
	for (int i = 0; i < 100; i++)
		one_graph_cycle(s, joined, fork, p);
	size_t before = mallinfo2().uordblks;
	for (int i = 0; i < 2000; i++)
		one_graph_cycle(s, joined, fork, p);
	size_t after = mallinfo2().uordblks;
	if (after > before + 64 * 1024)
		fprintf(stderr, "heap in use grew from %zu to %zu bytes\n", before, after);
	CHECK(after <= before + 64 * 1024);
	OK(cudaFree(p));
	OK(cudaEventDestroy(fork));
	OK(cudaStreamDestroy(joined));
	OK(cudaStreamDestroy(s));
}

static const struct test_case cases[] = {
	{"replay", case_replay},           {"forbidden", case_forbidden},
	{"relaxed", case_relaxed},         {"malloc_async", case_malloc_async},
	{"status", case_status},           {"driver", case_driver},
	{"entry_points", case_entry_points}, {"graph_cycles", case_graph_cycles},
};

int main(int argc, char **argv)
{
	return run_case(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
