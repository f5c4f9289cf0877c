/*
 * mempools.c - checks simcuda's explicit memory pools (cuMemPoolCreate,
 * cuMemAllocFromPoolAsync, the pool attributes, cuMemPoolTrimTo, cuMemPoolDestroy)
 * and their runtime wrappers on a 64 MiB device: its one case, "mempools", prints
 * "PASS mempools" and exits 0, or names the failed check and exits 1.
 * Device usage is read exactly with cuMemGetInfo (total - free): the
 * program runs alone on its device.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#include "check.h"

#define MiB ((size_t)1 << 20)

static size_t used(void)
{
	size_t free_bytes, total;
	OK(cuMemGetInfo_v2(&free_bytes, &total));
	return total - free_bytes;
}

static cuuint64_t attribute(CUmemoryPool pool, CUmemPool_attribute attr)
{
	cuuint64_t v = 0;
	OK(cuMemPoolGetAttribute(pool, attr, &v));
	return v;
}

static CUmemPoolProps device_props(int ordinal)
{
	CUmemPoolProps props;
	memset(&props, 0, sizeof(props));
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = ordinal;
	return props;
}

static void driver_pools(void)
{
	CUmemoryPool def, cur, pool, capped;
	CUstream s;
	CUdeviceptr a, b, c;

	OK(cuDeviceGetDefaultMemPool(&def, 0));
	OK(cuDeviceGetMemPool(&cur, 0));
	CHECK(def != NULL && def == cur);
	EXPECT(cuMemPoolDestroy(def), CUDA_ERROR_INVALID_VALUE); /* the default pool stays */
	EXPECT(cuDeviceGetDefaultMemPool(&cur, 7), CUDA_ERROR_INVALID_DEVICE);

	CUmemPoolProps props = device_props(0);
	props.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
	EXPECT(cuMemPoolCreate(&pool, &props), CUDA_ERROR_INVALID_VALUE);
	props = device_props(7);
	EXPECT(cuMemPoolCreate(&pool, &props), CUDA_ERROR_INVALID_DEVICE);
	EXPECT(cuMemPoolCreate(&pool, NULL), CUDA_ERROR_INVALID_VALUE);
	props = device_props(0);
	OK(cuMemPoolCreate(&pool, &props));
	CHECK(pool != def);

	/* Stream-ordered from the pool, counted on the device and in the pool only. */
	OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(cuMemAllocFromPoolAsync(&a, 16 * MiB, pool, s));
	CHECK(used() == 16 * MiB);
	CHECK(attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 16 * MiB);
	CHECK(attribute(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
	OK(cuMemAllocFromPoolAsync(&b, 40 * MiB, pool, s));
	CHECK(used() == 56 * MiB);
	EXPECT(cuMemAllocFromPoolAsync(&c, 16 * MiB, pool, s), CUDA_ERROR_OUT_OF_MEMORY);
	EXPECT(cuMemAllocFromPoolAsync(&c, MiB, NULL, s), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemAllocFromPoolAsync(NULL, MiB, pool, s), CUDA_ERROR_INVALID_VALUE);

	cuuint64_t threshold = UINT64_MAX;
	OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
	CHECK(attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == UINT64_MAX);
	CHECK(attribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 0);
	int reuse = 0;
	OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &reuse));
	CHECK(reuse == 1);
	cuuint64_t high = 5;
	EXPECT(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &high),
	       CUDA_ERROR_INVALID_VALUE);

	/* Frees: stream-ordered and immediate; the bytes go back to the device. */
	OK(cuMemFreeAsync(a, s));
	OK(cuStreamSynchronize(s));
	CHECK(used() == 40 * MiB);
	CHECK(attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 40 * MiB);
	CHECK(attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 56 * MiB);
	OK(cuMemFree_v2(b));
	CHECK(used() == 0);
	OK(cuMemPoolTrimTo(pool, 0));
	high = 0;
	OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &high));
	CHECK(attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 0);

	/* maxSize caps the pool below the device. */
	props.maxSize = 8 * MiB;
	OK(cuMemPoolCreate(&capped, &props));
	OK(cuMemAllocFromPoolAsync(&a, 8 * MiB, capped, s));
	EXPECT(cuMemAllocFromPoolAsync(&b, MiB, capped, s), CUDA_ERROR_OUT_OF_MEMORY);
	OK(cuMemAllocFromPoolAsync(&b, MiB, pool, s));
	OK(cuMemFreeAsync(a, s));
	OK(cuMemFreeAsync(b, s));
	OK(cuStreamSynchronize(s));
	OK(cuMemPoolDestroy(capped));

	/* A destroyed pool's handle is refused; its memory lives until freed. */
	OK(cuMemAllocFromPoolAsync(&a, 4 * MiB, pool, s));
	OK(cuMemPoolDestroy(pool));
	EXPECT(cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemAllocFromPoolAsync(&b, MiB, pool, s), CUDA_ERROR_INVALID_VALUE);
	CHECK(used() == 4 * MiB);
	OK(cuMemFreeAsync(a, s));
	OK(cuStreamSynchronize(s));
	CHECK(used() == 0);
	OK(cuStreamDestroy_v2(s));
}

static void proc_addresses(void)
{
	static const char *const names[] = {
		"cuMemPoolCreate", "cuMemPoolDestroy", "cuDeviceGetDefaultMemPool",
		"cuDeviceGetMemPool", "cuMemAllocFromPoolAsync", "cuMemPoolTrimTo",
		"cuMemPoolSetAttribute", "cuMemPoolGetAttribute",
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++) {
		void *fn = NULL;
		OK(cuGetProcAddress(names[i], &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT));
		CHECK(fn != NULL);
		fn = NULL;
		OK(cuGetProcAddress(names[i], &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM));
		CHECK(fn != NULL);
	}
	void *fn;
	OK(cuGetProcAddress("cuMemAllocFromPoolAsync", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT));
	CHECK(fn == (void *)cuMemAllocFromPoolAsync);
}

static void runtime_pools(void)
{
	cudaMemPool_t def, pool, current;
	CUmemoryPool drv_def;
	cuuint64_t threshold = 8 * MiB, value = 0;
	cudaStream_t s;
	void *p;

	OK(cudaDeviceGetDefaultMemPool(&def, 0));
	OK(cuDeviceGetDefaultMemPool(&drv_def, 0));
	CHECK(def == drv_def);
	struct cudaMemPoolProps props;
	memset(&props, 0, sizeof(props));
	props.allocType = 1;
	props.location.type = 1;
	props.location.id = 0;
	OK(cudaMemPoolCreate(&pool, &props));
	OK(cudaDeviceGetMemPool(&current, 0));
	CHECK(current == def);
	OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
	OK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &value));
	CHECK(value == 8 * MiB);
	OK(cudaStreamCreate(&s));
	OK(cudaMallocFromPoolAsync(&p, 24 * MiB, pool, s));
	CHECK(used() == 24 * MiB);
	OK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &value));
	CHECK(value == 24 * MiB);
	/* Only resetting a high-water mark (to 0) is allowed. */
	EXPECT(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &threshold), cudaErrorInvalidValue);
	EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
	OK(cudaMemPoolTrimTo(pool, 0));
	EXPECT(cudaMallocFromPoolAsync(&p, 48 * MiB, pool, s), cudaErrorMemoryAllocation);
	EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);
	OK(cudaGetLastError());
	OK(cudaFreeAsync(p, s));
	OK(cudaStreamSynchronize(s));
	CHECK(used() == 0);
	OK(cudaMemPoolDestroy(pool));
	EXPECT(cudaMemPoolDestroy(pool), cudaErrorInvalidValue);
	props.allocType = 0;
	EXPECT(cudaMemPoolCreate(&pool, &props), cudaErrorInvalidValue);
	OK(cudaStreamDestroy(s));
}

static void mempools(void)
{
	CUcontext ctx;
	OK(cuInit(0));
	OK(cuDevicePrimaryCtxRetain(&ctx, 0));
	OK(cuCtxSetCurrent(ctx));
	driver_pools();
	proc_addresses();
	runtime_pools();
}

int main(int argc, char **argv)
{
	static const struct test_case cases[] = {{"mempools", mempools}};
	return run_case(cases, sizeof cases / sizeof cases[0], argc, argv);
}
