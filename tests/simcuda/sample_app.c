/*
 * sample_app.c - a small CUDA application for `make demo`: it allocates,
 * copies, overlaps work on streams, uses managed memory and runs into the
 * device's capacity, printing what it does at each step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spillway/cuda_runtime.h"

#define MiB ((size_t)1 << 20)

static void check(cudaError_t err, const char *what)
{
	if (err != cudaSuccess) {
		fprintf(stderr, "sample_app: %s: %s\n", what, cudaGetErrorString(err));
		exit(1);
	}
}

static void report_free(const char *when)
{
	size_t free_bytes, total;
	check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
	printf("  %-34s %6zu MiB free of %zu MiB\n", when, free_bytes / MiB, total / MiB);
}

static void announce(void *msg)
{
	printf("  host function on the stream: %s\n", (const char *)msg);
}

int main(void)
{
	struct cudaDeviceProp prop;
	int count;

	check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
	for (int i = 0; i < count; i++) {
		check(cudaGetDeviceProperties(&prop, i), "cudaGetDeviceProperties");
		printf("device %d: %s, %zu MiB, compute capability %d.%d\n", i, prop.name,
		       prop.totalGlobalMem / MiB, prop.major, prop.minor);
	}

	printf("plain device memory:\n");
	report_free("before allocating");
	char *a, *b, host[64] = "bytes that travel host -> device -> device -> host";
	check(cudaMalloc((void **)&a, 512 * MiB), "cudaMalloc");
	check(cudaMalloc((void **)&b, 512 * MiB), "cudaMalloc");
	report_free("after two 512 MiB cudaMalloc");
	char out[64] = {0};
	check(cudaMemcpy(a, host, sizeof(host), cudaMemcpyHostToDevice), "cudaMemcpy");
	check(cudaMemcpy(b, a, sizeof(host), cudaMemcpyDeviceToDevice), "cudaMemcpy");
	check(cudaMemcpy(out, b, sizeof(out), cudaMemcpyDeviceToHost), "cudaMemcpy");
	printf("  copied back: \"%s\"\n", out);

	printf("a stream with ordered work:\n");
	cudaStream_t s;
	cudaEvent_t start, stop;
	float ms;
	check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
	check(cudaEventCreate(&start), "cudaEventCreate");
	check(cudaEventCreate(&stop), "cudaEventCreate");
	check(cudaEventRecord(start, s), "cudaEventRecord");
	check(cudaMemsetAsync(a, 0x5a, 16 * MiB, s), "cudaMemsetAsync");
	check(cudaLaunchHostFunc(s, announce, "the 16 MiB memset before me is done"), "cudaLaunchHostFunc");
	check(cudaFreeAsync(b, s), "cudaFreeAsync");
	check(cudaEventRecord(stop, s), "cudaEventRecord");
	check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
	check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
	printf("  memset, host function and stream-ordered free took %.1f ms\n", ms);
	report_free("after cudaFreeAsync");

	printf("managed memory:\n");
	char *m;
	check(cudaMallocManaged((void **)&m, 256 * MiB, cudaMemAttachGlobal), "cudaMallocManaged");
	report_free("256 MiB managed, untouched");
	check(cudaMemPrefetchAsync(m, 256 * MiB, 0, s), "cudaMemPrefetchAsync");
	check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
	report_free("prefetched to device 0");
	check(cudaMemPrefetchAsync(m, 256 * MiB, cudaCpuDeviceId, s), "cudaMemPrefetchAsync");
	check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
	report_free("prefetched back to the CPU");

	printf("capacity:\n");
	void *p;
	int n = 0;
	cudaError_t err;
	while ((err = cudaMalloc(&p, 256 * MiB)) == cudaSuccess)
		n++;
	printf("  %d more 256 MiB allocations fit, then: %s (%d)\n", n, cudaGetErrorName(err), err);
	cudaError_t first = cudaGetLastError(), second = cudaGetLastError();
	printf("  cudaGetLastError: %s, then %s\n", cudaGetErrorName(first), cudaGetErrorName(second));
	return 0;
}
