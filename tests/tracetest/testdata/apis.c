/* apis: one call of each probed allocation, copy and memset function of the
 * runtime and the driver, for comparing a session's figures with simcuda's
 * own count of the bytes it copied (SIMCUDA_STATS_FILE). Run under the shim.
 *
 * Besides the successful calls it makes one cudaMemcpy with an invalid kind,
 * which must fail. Exits 1 on any other unexpected result. */
#include <stdio.h>
#include <stdlib.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#define CHECK(call)                                                                 \
	do {                                                                        \
		int rc_ = (call);                                                   \
		if (rc_ != 0) {                                                     \
			fprintf(stderr, "apis: %s failed: %d\n", #call, rc_);       \
			exit(1);                                                    \
		}                                                                   \
	} while (0)

int main(void)
{
	static char host[1 << 16];
	void *a, *b, *pinned, *mapped, *managed, *pitched, *async, *pooled;
	size_t pitch;

	/* The runtime first, which makes the device's context current for the
	 * driver calls below. */
	CHECK(cudaMalloc(&a, 65536));
	CHECK(cudaMalloc(&b, 65536));
	CHECK(cudaMemcpy(a, host, 1000, cudaMemcpyHostToDevice));
	CHECK(cudaMemcpy(host, a, 700, cudaMemcpyDeviceToHost));
	CHECK(cudaMemcpy(b, a, 300, cudaMemcpyDeviceToDevice));
	CHECK(cudaMemcpy(host, host + 4096, 200, cudaMemcpyHostToHost));
	CHECK(cudaMemcpy(b, a, 50, cudaMemcpyDefault));
	CHECK(cudaMemcpyAsync(a, host, 111, cudaMemcpyHostToDevice, 0));
	CHECK(cudaMemcpyAsync(host, a, 222, cudaMemcpyDeviceToHost, 0));
	if (cudaMemcpy(b, a, 10, (enum cudaMemcpyKind)7) == cudaSuccess) {
		fprintf(stderr, "apis: cudaMemcpy of kind 7 succeeded\n");
		return 1;
	}
	CHECK(cudaMemset(a, 0, 333));
	CHECK(cudaMemsetAsync(a, 0, 444, 0));
	CHECK(cudaMallocHost(&pinned, 5000));
	CHECK(cudaHostAlloc(&mapped, 6000, 0));
	CHECK(cudaMallocManaged(&managed, 1 << 20, cudaMemAttachGlobal));
	CHECK(cudaMemPrefetchAsync(managed, 4096, 0, 0));
	CHECK(cudaMallocPitch(&pitched, &pitch, 100, 10));
	CHECK(cudaMallocAsync(&async, 7000, 0));
	CHECK(cudaFreeAsync(async, 0));
	cudaMemPool_t pool;
	CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
	CHECK(cudaMallocFromPoolAsync(&pooled, 8000, pool, 0));
	CHECK(cudaFreeAsync(pooled, 0));
	CHECK(cudaDeviceSynchronize());

	CUdeviceptr d, dpitched, dpooled;
	size_t dpitch;
	CUmemoryPool dpool;
	CUcontext ctx;
	CHECK(cuMemAlloc_v2(&d, 9000));
	CHECK(cuMemAllocPitch_v2(&dpitched, &dpitch, 200, 20, 4));
	CHECK(cuDeviceGetDefaultMemPool(&dpool, 0));
	CHECK(cuMemAllocFromPoolAsync(&dpooled, 3000, dpool, 0));
	CHECK(cuMemFreeAsync(dpooled, 0));
	CHECK(cuMemcpyHtoD_v2(d, host, 64));
	CHECK(cuMemcpyDtoH_v2(host, d, 32));
	CHECK(cuMemcpyDtoD_v2((CUdeviceptr)a, d, 16));
	CHECK(cuMemcpyHtoDAsync_v2(d, host, 65, 0));
	CHECK(cuMemcpyDtoHAsync_v2(host, d, 33, 0));
	CHECK(cuMemcpyDtoDAsync_v2((CUdeviceptr)a, d, 17, 0));
	CHECK(cuMemcpy((CUdeviceptr)b, d, 18));
	CHECK(cuMemcpyAsync((CUdeviceptr)b, d, 19, 0));
	CHECK(cuCtxGetCurrent(&ctx));
	CHECK(cuMemcpyPeer((CUdeviceptr)b, ctx, d, ctx, 20));
	CHECK(cuMemcpyPeerAsync((CUdeviceptr)b, ctx, d, ctx, 21, 0));
	CHECK(cuMemsetD8_v2(d, 1, 100));
	CHECK(cuMemsetD8Async(d, 1, 101, 0));
	CHECK(cuCtxSynchronize());
	CHECK(cuMemFree_v2(d));
	CHECK(cuMemFree_v2(dpitched));

	CHECK(cudaFree(pitched));
	CHECK(cudaFree(managed));
	CHECK(cudaFreeHost(pinned));
	CHECK(cudaFreeHost(mapped));
	CHECK(cudaFree(a));
	CHECK(cudaFree(b));
	return 0;
}
