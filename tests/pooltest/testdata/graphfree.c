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
 *   fails, and the block is free again. Prints "end RC" and "reused 0|1".
 *
 * A capture on a non-blocking stream allocates a block, sets it to 0xAA and
 * frees it; after it, a block of the same size allocated on the same stream
 * is set to 0x55; the graph is launched twice; the second block must still
 * hold 0x55. Once both graphs are destroyed and the device synchronized, the
 * graph's block is free again. Prints "same_address 0|1" (whether the second
 * block got the graph's address), "intact 0|1", "reused 0|1" (whether an
 * allocation after the destruction got the graph's address back) and "PASS".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#define SIZE ((size_t)1 << 20)

#define EXPECT(call, want)                                                                  \
	do {                                                                                \
		int got_ = (int)(call);                                                     \
		if (got_ != (int)(want)) {                                                  \
			fprintf(stderr, "%s:%d: %s returned %d, want %d\n", __FILE__, __LINE__, \
				#call, got_, (int)(want));                                  \
			exit(1);                                                            \
		}                                                                           \
	} while (0)

static int holds(void *p, unsigned char want)
{
	static unsigned char host[SIZE];
	EXPECT(cudaMemcpy(host, p, SIZE, cudaMemcpyDeviceToHost), cudaSuccess);
	for (size_t i = 0; i < SIZE; i++)
		if (host[i] != want)
			return 0;
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 2 || (strcmp(argv[1], "runtime") && strcmp(argv[1], "driver") &&
			  strcmp(argv[1], "invalidated"))) {
		fprintf(stderr, "usage: graphfree runtime|driver|invalidated\n");
		return 2;
	}
	int driver = strcmp(argv[1], "driver") == 0;
	EXPECT(cudaSetDevice(0), cudaSuccess);
	cudaStream_t s;
	EXPECT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
	void *in_graph = NULL, *after = NULL, *again = NULL;
	cudaGraph_t graph;
	cudaGraphExec_t exec;
	if (strcmp(argv[1], "invalidated") == 0) {
		EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
		EXPECT(cudaMallocAsync(&in_graph, SIZE, s), cudaSuccess);
		EXPECT(cudaFreeAsync(in_graph, s), cudaSuccess);
		if (cudaStreamSynchronize(s) == cudaSuccess) {
			fprintf(stderr, "cudaStreamSynchronize succeeded on a capturing stream\n");
			return 1;
		}
		printf("end %d\n", (int)cudaStreamEndCapture(s, &graph));
		(void)cudaGetLastError();
		EXPECT(cudaDeviceSynchronize(), cudaSuccess);
		EXPECT(cudaMallocAsync(&again, SIZE, s), cudaSuccess);
		printf("reused %d\n", again == in_graph);
		EXPECT(cudaFreeAsync(again, s), cudaSuccess);
		EXPECT(cudaStreamDestroy(s), cudaSuccess);
		EXPECT(cudaDeviceSynchronize(), cudaSuccess);
		printf("PASS\n");
		return 0;
	}
	if (driver) {
		CUdeviceptr p;
		EXPECT(cuStreamBeginCapture_v2((CUstream)s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
		EXPECT(cuMemAllocAsync(&p, SIZE, (CUstream)s), CUDA_SUCCESS);
		EXPECT(cuMemsetD8Async(p, 0xAA, SIZE, (CUstream)s), CUDA_SUCCESS);
		EXPECT(cuMemFreeAsync(p, (CUstream)s), CUDA_SUCCESS);
		EXPECT(cuStreamEndCapture((CUstream)s, (CUgraph *)&graph), CUDA_SUCCESS);
		EXPECT(cuGraphInstantiateWithFlags((CUgraphExec *)&exec, (CUgraph)graph, 0), CUDA_SUCCESS);
		in_graph = (void *)(uintptr_t)p;
	} else {
		EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
		EXPECT(cudaMallocAsync(&in_graph, SIZE, s), cudaSuccess);
		EXPECT(cudaMemsetAsync(in_graph, 0xAA, SIZE, s), cudaSuccess);
		EXPECT(cudaFreeAsync(in_graph, s), cudaSuccess);
		EXPECT(cudaStreamEndCapture(s, &graph), cudaSuccess);
		EXPECT(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
	}

	EXPECT(cudaMallocAsync(&after, SIZE, s), cudaSuccess);
	EXPECT(cudaMemsetAsync(after, 0x55, SIZE, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	for (int i = 0; i < 2; i++)
		EXPECT(cudaGraphLaunch(exec, s), cudaSuccess);
	EXPECT(cudaStreamSynchronize(s), cudaSuccess);
	printf("same_address %d\n", after == in_graph);
	printf("intact %d\n", holds(after, 0x55));

	if (driver) {
		EXPECT(cuGraphDestroy((CUgraph)graph), CUDA_SUCCESS);
		EXPECT(cuGraphExecDestroy((CUgraphExec)exec), CUDA_SUCCESS);
	} else {
		EXPECT(cudaGraphExecDestroy(exec), cudaSuccess);
		EXPECT(cudaGraphDestroy(graph), cudaSuccess);
	}
	EXPECT(cudaDeviceSynchronize(), cudaSuccess);
	EXPECT(cudaMallocAsync(&again, SIZE, s), cudaSuccess);
	printf("reused %d\n", again == in_graph);
	EXPECT(cudaFreeAsync(again, s), cudaSuccess);
	EXPECT(cudaFreeAsync(after, s), cudaSuccess);
	EXPECT(cudaStreamDestroy(s), cudaSuccess);
	EXPECT(cudaDeviceSynchronize(), cudaSuccess);
	printf("PASS\n");
	return 0;
}
