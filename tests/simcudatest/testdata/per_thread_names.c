/*
 * per_thread_names.c: every runtime function the project's cuda_runtime.h
 * declares that CUDA's header gives a per-thread entry point, called as a
 * program built with --default-stream per-thread calls it (nvcc defines
 * CUDA_API_PER_THREAD_DEFAULT_STREAM). Compiled, never linked: the test
 * reads which names the object calls.
 */
#define CUDA_API_PER_THREAD_DEFAULT_STREAM
#include <spillway/cuda_runtime.h>

void per_thread_calls(void);

void per_thread_calls(void)
{
	void *p = 0;
	char host[8];
	cudaStream_t s = 0;
	cudaEvent_t e = 0;
	cudaGraph_t g = 0;
	cudaGraphExec_t x = 0;
	cudaMemPool_t pool = 0;
	enum cudaStreamCaptureStatus status;
	unsigned long long id;
	void *fn = 0;

	cudaMemcpy(host, p, sizeof host, cudaMemcpyDeviceToHost);
	cudaMemcpyAsync(host, p, sizeof host, cudaMemcpyDeviceToHost, s);
	cudaMemset(p, 0, 8);
	cudaMemsetAsync(p, 0, 8, s);
	cudaMallocAsync(&p, 8, s);
	cudaFreeAsync(p, s);
	cudaMallocFromPoolAsync(&p, 8, pool, s);
	cudaMemPrefetchAsync(p, 8, 0, s);
	cudaStreamSynchronize(s);
	cudaStreamQuery(s);
	cudaEventRecord(e, s);
	cudaStreamWaitEvent(s, e, 0);
	cudaLaunchHostFunc(s, 0, 0);
	cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
	cudaStreamEndCapture(s, &g);
	cudaStreamIsCapturing(s, &status);
	cudaStreamGetCaptureInfo(s, &status, &id, 0, 0, 0);
	cudaStreamGetCaptureInfo_v2(s, &status, &id, 0, 0, 0);
	cudaGraphLaunch(x, s);
	cudaGetDriverEntryPoint("cuMemAlloc", &fn, 0, 0);
	cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, 0, 0);
}
