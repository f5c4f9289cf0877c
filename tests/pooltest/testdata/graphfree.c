/*
 * graphfree API: a block allocated and freed in a stream capture belongs to
 * the graph (CUDA's graph memory): each launch writes it again, so no
 * allocation may get its address while the graph or an executable graph
 * made from it exists. API is "runtime" (cudaStreamBeginCapture, ...) or
 * "driver" (cuStreamBeginCapture_v2, cuMemAllocAsync, ...; the graph is
 * destroyed before its executable graph).
 *
 *   graphfree invalidated: the capture allocates and frees a block, then
 *   synchronizes its stream, which invalidates it; cudaStreamEndCapture
 *   fails, and the block is free again. Prints "end RC", "reused 0|1" and
 *   "PASS invalidated".
 *
 * A capture on a non-blocking stream allocates a block, sets it to 0xAA and
 * frees it; after it, a block of the same size allocated on the same stream
 * is set to 0x55; the graph is launched twice; the second block must still
 * hold 0x55. Once both graphs are destroyed and the device synchronized, the
 * graph's block is free again. Prints "same_address 0|1" (whether the second
 * block got the graph's address), "intact 0|1", "reused 0|1" (whether an
 * allocation after the destruction got the graph's address back) and "PASS
 * runtime" or "PASS driver".
 *
 * The checks are tests/simcudatest's (check.h): a failed one names the case,
 * the place and the call, and exits 1; a bad command line exits 2.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#include "../../simcudatest/testdata/check.h"

#define SIZE ((size_t)1 << 20)

static int holds(void *p, unsigned char want)
{
	static unsigned char host[SIZE];
	OK(cudaMemcpy(host, p, SIZE, cudaMemcpyDeviceToHost));
	for (size_t i = 0; i < SIZE; i++)
		if (host[i] != want)
			return 0;
	return 1;
}

static cudaStream_t nonblocking_stream(void)
{
	cudaStream_t s;
	OK(cudaSetDevice(0));
	OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	return s;
}

/* A capture that fails destroys its graph: the block freed in it is free
 * again. */
static void invalidated(void)
{
	cudaStream_t s = nonblocking_stream();
	void *in_graph = NULL, *again = NULL;
	cudaGraph_t graph;
	OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	OK(cudaMallocAsync(&in_graph, SIZE, s));
	OK(cudaFreeAsync(in_graph, s));
	/* Synchronizing a capturing stream fails and invalidates the capture. */
	CHECK(cudaStreamSynchronize(s) != cudaSuccess);
	printf("end %d\n", (int)cudaStreamEndCapture(s, &graph));
	(void)cudaGetLastError();
	OK(cudaDeviceSynchronize());
	OK(cudaMallocAsync(&again, SIZE, s));
	printf("reused %d\n", again == in_graph);
	OK(cudaFreeAsync(again, s));
	OK(cudaStreamDestroy(s));
	OK(cudaDeviceSynchronize());
}

/* The graph's block, captured through the runtime or the driver. */
static void graph_keeps_block(int driver)
{
	cudaStream_t s = nonblocking_stream();
	void *in_graph = NULL, *after = NULL, *again = NULL;
	cudaGraph_t graph;
	cudaGraphExec_t exec;
	if (driver) {
		CUdeviceptr p;
		OK(cuStreamBeginCapture_v2((CUstream)s, CU_STREAM_CAPTURE_MODE_GLOBAL));
		OK(cuMemAllocAsync(&p, SIZE, (CUstream)s));
		OK(cuMemsetD8Async(p, 0xAA, SIZE, (CUstream)s));
		OK(cuMemFreeAsync(p, (CUstream)s));
		OK(cuStreamEndCapture((CUstream)s, (CUgraph *)&graph));
		OK(cuGraphInstantiateWithFlags((CUgraphExec *)&exec, (CUgraph)graph, 0));
		in_graph = (void *)(uintptr_t)p;
	} else {
		OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
		OK(cudaMallocAsync(&in_graph, SIZE, s));
		OK(cudaMemsetAsync(in_graph, 0xAA, SIZE, s));
		OK(cudaFreeAsync(in_graph, s));
		OK(cudaStreamEndCapture(s, &graph));
		OK(cudaGraphInstantiate(&exec, graph, 0));
	}

	OK(cudaMallocAsync(&after, SIZE, s));
	OK(cudaMemsetAsync(after, 0x55, SIZE, s));
	OK(cudaStreamSynchronize(s));
	for (int i = 0; i < 2; i++)
		OK(cudaGraphLaunch(exec, s));
	OK(cudaStreamSynchronize(s));
	printf("same_address %d\n", after == in_graph);
	printf("intact %d\n", holds(after, 0x55));

	if (driver) {
		OK(cuGraphDestroy((CUgraph)graph));
		OK(cuGraphExecDestroy((CUgraphExec)exec));
	} else {
		OK(cudaGraphExecDestroy(exec));
		OK(cudaGraphDestroy(graph));
	}
	OK(cudaDeviceSynchronize());
	OK(cudaMallocAsync(&again, SIZE, s));
	printf("reused %d\n", again == in_graph);
	OK(cudaFreeAsync(again, s));
	OK(cudaFreeAsync(after, s));
	OK(cudaStreamDestroy(s));
	OK(cudaDeviceSynchronize());
}

static void runtime(void)
{
	graph_keeps_block(0);
}

static void driver(void)
{
	graph_keeps_block(1);
}

int main(int argc, char **argv)
{
	static const struct test_case cases[] = {
		{"runtime", runtime},
		{"driver", driver},
		{"invalidated", invalidated},
	};
	return run_case(cases, sizeof cases / sizeof cases[0], argc, argv);
}
