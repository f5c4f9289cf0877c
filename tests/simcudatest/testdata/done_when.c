/*
 * done_when.c - an application written only against the public CUDA runtime
 * API: its own declarations of the standard prototypes, no project headers.
 * Built with -lcudart (and again statically); run with SIMCUDA_DEVICES=1GiB.
 *
 * It fills the device with 256 MiB allocations until the out-of-memory code,
 * shows cudaFree waiting for work pending on a stream, round-trips bytes,
 * and exits leaving one 256 MiB allocation and 1 MiB of pinned memory live,
 * for the statistics file to report.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* From the CUDA runtime API reference. */
typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef void (*cudaHostFn_t)(void *userData);
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };
enum { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
#define cudaStreamNonBlocking 0x01
extern cudaError_t cudaGetDeviceCount(int *count);
extern cudaError_t cudaMalloc(void **devPtr, size_t size);
extern cudaError_t cudaFree(void *devPtr);
extern cudaError_t cudaMallocHost(void **ptr, size_t size);
extern cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind);
extern cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
extern cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData);
extern cudaError_t cudaStreamSynchronize(cudaStream_t stream);
extern cudaError_t cudaGetLastError(void);
extern const char *cudaGetErrorName(cudaError_t error);

#define CHUNK (256UL << 20)

static int gate[2];
static volatile int pending_done;

static void fail(const char *what, cudaError_t err)
{
	fprintf(stderr, "FAIL %s: %d (%s)\n", what, err, cudaGetErrorName(err));
	exit(1);
}

static void pending_work(void *arg)
{
	char c;
	(void)arg;
	if (read(gate[0], &c, 1) != 1)
		abort();
	__atomic_store_n(&pending_done, 1, __ATOMIC_SEQ_CST);
}

static void *release_later(void *arg)
{
	(void)arg;
	usleep(100 * 1000); /* lets a wrong cudaFree return early; a right one waits regardless */
	if (write(gate[1], "x", 1) != 1)
		abort();
	return NULL;
}

int main(void)
{
	void *chunks[64];
	int n = 0, count = 0;
	cudaError_t err;

	if ((err = cudaGetDeviceCount(&count)) != cudaSuccess || count < 1)
		fail("cudaGetDeviceCount", err);

	/* Capacity: allocate until the device says out of memory. */
	while (n < 64 && (err = cudaMalloc(&chunks[n], CHUNK)) == cudaSuccess)
		n++;
	if (err != cudaErrorMemoryAllocation)
		fail("cudaMalloc at capacity", err);
	if (cudaGetLastError() != cudaErrorMemoryAllocation || cudaGetLastError() != cudaSuccess)
		fail("last error after out-of-memory", err);
	printf("allocated %d chunks of 256 MiB, then error %d (%s)\n", n, err, cudaGetErrorName(err));

	/* cudaFree waits for work pending on the device. */
	cudaStream_t s;
	pthread_t releaser;
	if (pipe(gate) != 0)
		return 1;
	if ((err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess)
		fail("cudaStreamCreateWithFlags", err);
	if ((err = cudaLaunchHostFunc(s, pending_work, NULL)) != cudaSuccess)
		fail("cudaLaunchHostFunc", err);
	pthread_create(&releaser, NULL, release_later, NULL);
	if ((err = cudaFree(chunks[--n])) != cudaSuccess)
		fail("cudaFree", err);
	if (!__atomic_load_n(&pending_done, __ATOMIC_SEQ_CST)) {
		fprintf(stderr, "FAIL cudaFree returned before the stream's pending work finished\n");
		return 1;
	}
	pthread_join(releaser, NULL);
	printf("cudaFree waited for the pending stream work\n");

	/* Bytes really move. */
	char in[64], out[64] = {0};
	for (int i = 0; i < 64; i++)
		in[i] = (char)i;
	if ((err = cudaMemcpy(chunks[0], in, 64, cudaMemcpyHostToDevice)) != cudaSuccess ||
	    (err = cudaMemcpy(chunks[1], chunks[0], 64, cudaMemcpyDeviceToDevice)) != cudaSuccess ||
	    (err = cudaMemcpy(out, chunks[1], 64, cudaMemcpyDeviceToHost)) != cudaSuccess)
		fail("cudaMemcpy", err);
	if (memcmp(in, out, 64) != 0) {
		fprintf(stderr, "FAIL bytes changed on the round trip\n");
		return 1;
	}
	printf("64 bytes round-tripped host->device->device->host\n");

	/* Leave one chunk and some pinned memory live for the statistics. */
	while (n > 1)
		if ((err = cudaFree(chunks[--n])) != cudaSuccess)
			fail("cudaFree", err);
	void *pinned;
	if ((err = cudaMallocHost(&pinned, 1 << 20)) != cudaSuccess)
		fail("cudaMallocHost", err);
	if ((err = cudaStreamSynchronize(s)) != cudaSuccess)
		fail("cudaStreamSynchronize", err);
	printf("done\n");
	return 0;
}
