/*
 * capture MODE STREAM THREADS: what PyTorch and vLLM do with CUDA graphs,
 * under a pool at the edge of its quota. Before the capture, another stream
 * holds freed blocks that need a marker before anyone else may use them,
 * cudaFree leaves blocks pending until a device synchronization, and live
 * blocks fill the quota but for a little room. Then a graph is captured on
 * STREAM (nonblocking, as PyTorch and vLLM capture, or blocking) in capture
 * mode MODE (global, thread_local or relaxed). It allocates with
 * cudaMallocAsync the buffers its work uses (kept after the capture, as
 * PyTorch keeps a graph's static tensors), allocates and frees a block with
 * cudaMallocAsync/cudaFreeAsync (and with cudaMalloc/cudaFree in relaxed
 * mode, where CUDA allows them, and which this pressure may refuse) and
 * asks for more than the quota can hold, while THREADS other threads
 * allocate and free on streams of their own (at least 100 times each while
 * the capture is open). The capture must end with a graph, which is replayed three times with new contents; then
 * everything is freed.
 *
 * Prints "big_request RC" (the request the quota cannot hold),
 * "capture RC STATUS" (cudaStreamEndCapture's result, the capture status
 * before it), "churn ALLOCS FAILED CORRUPT" (the other threads), "info FREE
 * TOTAL" at the end, and "PASS"; a failed check is named on stderr with
 * exit status 1.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <spillway/cuda_runtime.h>

#define MiB ((size_t)1 << 20)
#define LIVE_MAX 256
#define CHURNERS_MAX 8

#define CHECK(cond)                                                                     \
	do {                                                                            \
		if (!(cond)) {                                                          \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			exit(1);                                                        \
		}                                                                       \
	} while (0)

#define EXPECT(call, want)                                                                     \
	do {                                                                                   \
		int got_ = (int)(call);                                                        \
		if (got_ != (int)(want)) {                                                     \
			fprintf(stderr, "%s:%d: %s returned %d, want %d\n", __FILE__, __LINE__, \
				#call, got_, (int)(want));                                     \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

static atomic_int stop, churn_async_only;
static atomic_long churn_allocs, churn_failed, churn_corrupt;

/* Another thread of the program: allocates, writes, checks and frees on a
 * non-blocking stream of its own and with cudaMalloc, until told to stop. */
static void *churn(void *arg)
{
	uint64_t seed = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
	cudaStream_t own;
	EXPECT(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), cudaSuccess);
	while (!atomic_load(&stop)) {
		seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
		size_t size = 512 + seed % (MiB / 16);
		int async = atomic_load(&churn_async_only) || ((seed >> 40) & 1);
		unsigned char tag = (unsigned char)(seed >> 48) | 1, got = 0;
		unsigned char *p = NULL;
		cudaError_t rc = async ? cudaMallocAsync((void **)&p, size, own) : cudaMalloc((void **)&p, size);
		atomic_fetch_add(&churn_allocs, 1);
		if (rc != cudaSuccess) {
			atomic_fetch_add(&churn_failed, 1);
			continue;
		}
		if (cudaMemsetAsync(p + size - 1, tag, 1, own) != cudaSuccess ||
		    cudaMemcpyAsync(&got, p + size - 1, 1, cudaMemcpyDeviceToHost, own) != cudaSuccess ||
		    cudaStreamSynchronize(own) != cudaSuccess || got != tag)
			atomic_fetch_add(&churn_corrupt, 1);
		rc = async ? cudaFreeAsync(p, own) : cudaFree(p);
		if (rc != cudaSuccess)
			atomic_fetch_add(&churn_failed, 1);
	}
	EXPECT(cudaStreamSynchronize(own), cudaSuccess);
	EXPECT(cudaStreamDestroy(own), cudaSuccess);
	return NULL;
}

static enum cudaStreamCaptureStatus capture_status(cudaStream_t s)
{
	enum cudaStreamCaptureStatus st = (enum cudaStreamCaptureStatus)-1;
	EXPECT(cudaStreamIsCapturing(s, &st), cudaSuccess);
	return st;
}

int main(int argc, char **argv)
{
	CHECK(argc == 4);
	enum cudaStreamCaptureMode mode;
	if (strcmp(argv[1], "global") == 0)
		mode = cudaStreamCaptureModeGlobal;
	else if (strcmp(argv[1], "thread_local") == 0)
		mode = cudaStreamCaptureModeThreadLocal;
	else if (strcmp(argv[1], "relaxed") == 0)
		mode = cudaStreamCaptureModeRelaxed;
	else
		CHECK(!"MODE is global, thread_local or relaxed");
	CHECK(strcmp(argv[2], "nonblocking") == 0 || strcmp(argv[2], "blocking") == 0);
	unsigned int stream_flags = strcmp(argv[2], "blocking") == 0 ? cudaStreamDefault : cudaStreamNonBlocking;
	int churners = atoi(argv[3]);
	/* While a blocking stream captures, no device synchronization may make
	 * cudaFree'd memory reusable: the other threads then free in stream
	 * order only, or they would fill the quota with pending frees. */
	atomic_store(&churn_async_only, stream_flags == cudaStreamDefault);
	CHECK(churners >= 0 && churners <= CHURNERS_MAX);

	size_t free0, quota;
	EXPECT(cudaMemGetInfo(&free0, &quota), cudaSuccess);
	CHECK(quota >= 24 * MiB && quota <= LIVE_MAX * MiB);

	cudaStream_t other, s;
	EXPECT(cudaStreamCreate(&other), cudaSuccess);
	EXPECT(cudaStreamCreateWithFlags(&s, stream_flags), cudaSuccess);

	/* Live blocks first, so that the cached and pending blocks below are
	 * new memory, not these blocks' again. */
	void *cached[4], *pending[4], *live[LIVE_MAX];
	int nlive = (int)((quota - 12 * MiB) / MiB);
	for (int i = 0; i < nlive; i++) {
		EXPECT(cudaMalloc(&live[i], MiB), cudaSuccess);
		EXPECT(cudaMemset(live[i], i & 0xff, MiB), cudaSuccess);
	}
	/* Blocks freed on another stream: reusable elsewhere only after a marker. */
	for (int i = 0; i < 4; i++) {
		EXPECT(cudaMallocAsync(&cached[i], MiB, other), cudaSuccess);
		EXPECT(cudaMemsetAsync(cached[i], 0x11, MiB, other), cudaSuccess);
	}
	for (int i = 0; i < 4; i++)
		EXPECT(cudaFreeAsync(cached[i], other), cudaSuccess);
	/* Blocks freed with cudaFree: reusable only after a device synchronization. */
	for (int i = 0; i < 4; i++)
		EXPECT(cudaMalloc(&pending[i], MiB), cudaSuccess);
	for (int i = 0; i < 4; i++)
		EXPECT(cudaFree(pending[i]), cudaSuccess);
	/* Everything but 4 MiB of the quota is now held: live, cached or pending. */

	pthread_t threads[CHURNERS_MAX];
	for (int i = 0; i < churners; i++)
		CHECK(pthread_create(&threads[i], NULL, churn, (void *)(intptr_t)(i + 1)) == 0);

	static unsigned char src[MiB], out[MiB];
	unsigned char *a = NULL, *b = NULL;
	cudaGraph_t graph = NULL;
	EXPECT(cudaStreamBeginCapture(s, mode), cudaSuccess);
	long churned = atomic_load(&churn_allocs);
	EXPECT(cudaMallocAsync((void **)&a, MiB, s), cudaSuccess);
	EXPECT(cudaMallocAsync((void **)&b, MiB, s), cudaSuccess);
	/* The other threads allocate and free while this capture is open. */
	while (atomic_load(&churn_allocs) - churned < 100L * churners)
		nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
	EXPECT(cudaMemcpyAsync(a, src, MiB, cudaMemcpyHostToDevice, s), cudaSuccess);
	EXPECT(cudaMemcpyAsync(b, a, MiB, cudaMemcpyDeviceToDevice, s), cudaSuccess);
	EXPECT(cudaMemsetAsync(b, 'z', 16, s), cudaSuccess);
	EXPECT(cudaMemcpyAsync(out, b, MiB, cudaMemcpyDeviceToHost, s), cudaSuccess);
	void *scratch = NULL;
	EXPECT(cudaMallocAsync(&scratch, MiB / 4, s), cudaSuccess);
	EXPECT(cudaFreeAsync(scratch, s), cudaSuccess);
	/* More than the quota can hold with what is live: refused, and the
	 * refusal, its last error included, leaves the capture alone. */
	void *big = NULL;
	cudaError_t rc = cudaMallocAsync(&big, quota / 2, s);
	printf("big_request %d\n", (int)rc);
	EXPECT(rc, cudaErrorMemoryAllocation);
	EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);
	CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
	if (mode == cudaStreamCaptureModeRelaxed) {
		void *c = NULL;
		rc = cudaMalloc(&c, MiB);
		CHECK(rc == cudaSuccess || rc == cudaErrorMemoryAllocation);
		if (rc == cudaSuccess)
			EXPECT(cudaFree(c), cudaSuccess);
		else
			EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);
	}
	enum cudaStreamCaptureStatus st = capture_status(s);
	rc = cudaStreamEndCapture(s, &graph);
	printf("capture %d %d\n", (int)rc, (int)st);
	EXPECT(rc, cudaSuccess);
	CHECK(graph != NULL && capture_status(s) == cudaStreamCaptureStatusNone);

	atomic_store(&stop, 1);
	for (int i = 0; i < churners; i++)
		CHECK(pthread_join(threads[i], NULL) == 0);
	printf("churn %ld %ld %ld\n", atomic_load(&churn_allocs), atomic_load(&churn_failed),
	       atomic_load(&churn_corrupt));

	cudaGraphExec_t exec;
	EXPECT(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
	for (int k = 0; k < 3; k++) {
		memset(src, 'a' + k, sizeof(src));
		memset(out, 0, sizeof(out));
		EXPECT(cudaGraphLaunch(exec, s), cudaSuccess);
		EXPECT(cudaStreamSynchronize(s), cudaSuccess);
		for (size_t i = 0; i < sizeof(out); i++)
			CHECK(out[i] == (i < 16 ? 'z' : 'a' + k));
	}
	EXPECT(cudaFreeAsync(a, s), cudaSuccess);
	EXPECT(cudaFreeAsync(b, s), cudaSuccess);
	for (int i = 0; i < nlive; i++) {
		unsigned char first = 0, last = 0;
		EXPECT(cudaMemcpy(&first, live[i], 1, cudaMemcpyDeviceToHost), cudaSuccess);
		EXPECT(cudaMemcpy(&last, (unsigned char *)live[i] + MiB - 1, 1, cudaMemcpyDeviceToHost),
		       cudaSuccess);
		CHECK(first == (i & 0xff) && last == (i & 0xff));
		EXPECT(cudaFree(live[i]), cudaSuccess);
	}
	EXPECT(cudaGraphExecDestroy(exec), cudaSuccess);
	EXPECT(cudaGraphDestroy(graph), cudaSuccess);
	EXPECT(cudaStreamSynchronize(other), cudaSuccess);
	EXPECT(cudaStreamDestroy(other), cudaSuccess);
	EXPECT(cudaStreamDestroy(s), cudaSuccess);
	EXPECT(cudaDeviceSynchronize(), cudaSuccess);
	EXPECT(cudaPeekAtLastError(), cudaSuccess);
	size_t free1, total1;
	EXPECT(cudaMemGetInfo(&free1, &total1), cudaSuccess);
	printf("info %zu %zu\n", free1, total1);
	printf("PASS\n");
	return 0;
}
