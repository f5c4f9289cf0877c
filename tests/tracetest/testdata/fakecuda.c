/* A stand-in for the CUDA runtime, driver and the shim's probe points: the
 * same exported names and signatures, layered as the real ones are (the
 * runtime calls the driver), with host memory behind every pointer. It lets
 * the tracing tests run without the simulated CUDA. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((noinline, used, visibility("default")))
#define BARRIER() __asm__ volatile("" ::: "memory")
/* The probe points start with a 5-byte nop: a uprobe there is emulated, or
 * on x86-64 Linux 6.18 turned into a call, instead of single-stepping the
 * function's first instruction out of line, which costs tens of times more. */
#define PROBE_BARRIER() __asm__ volatile(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00" ::: "memory")

typedef unsigned long long CUdeviceptr;
typedef void *cudaStream_t;

EXPORT int cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	void *p = malloc(bytesize ? bytesize : 1);
	if (!p)
		return 2;
	*dptr = (CUdeviceptr)(uintptr_t)p;
	return 0;
}

EXPORT int cuMemFree_v2(CUdeviceptr dptr)
{
	free((void *)(uintptr_t)dptr);
	return 0;
}

EXPORT int cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	memcpy((void *)(uintptr_t)dst, src, n);
	return 0;
}

EXPORT int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	memcpy(dst, (const void *)(uintptr_t)src, n);
	return 0;
}

EXPORT int cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
	return 0;
}

EXPORT int cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
	return 0;
}

EXPORT int cudaMalloc(void **devPtr, size_t size)
{
	CUdeviceptr p;
	int rc = cuMemAlloc_v2(&p, size);
	if (rc == 0)
		*devPtr = (void *)(uintptr_t)p;
	return rc;
}

EXPORT int cudaFree(void *devPtr)
{
	return cuMemFree_v2((CUdeviceptr)(uintptr_t)devPtr);
}

EXPORT int cudaMemcpy(void *dst, const void *src, size_t count, int kind)
{
	CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, s = (CUdeviceptr)(uintptr_t)src;
	switch (kind) {
	case 1:
		return cuMemcpyHtoD_v2(d, src, count);
	case 2:
		return cuMemcpyDtoH_v2(dst, s, count);
	case 3:
		return cuMemcpyDtoD_v2(d, s, count);
	case 0:
	case 4:
		return cuMemcpy(d, s, count);
	}
	return 21; /* cudaErrorInvalidMemcpyDirection */
}

EXPORT int cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, cudaStream_t stream)
{
	(void)stream;
	return cudaMemcpy(dst, src, count, kind);
}

EXPORT int cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n)
{
	memset((void *)(uintptr_t)dst, value, n);
	return 0;
}

EXPORT int cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n)
{
	uint32_t *p = (uint32_t *)(uintptr_t)dst;
	for (size_t i = 0; i < n; i++)
		p[i] = value;
	return 0;
}

EXPORT int cudaMemset(void *devPtr, int value, size_t count)
{
	return cuMemsetD8_v2((CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count);
}

EXPORT int cuCtxSynchronize(void)
{
	BARRIER();
	return 0;
}

EXPORT int cudaDeviceSynchronize(void)
{
	return cuCtxSynchronize();
}

/* The shim's probe points. */
EXPORT void spillway_probe_alloc(uint64_t ptr, uint64_t size, int32_t device, int32_t tier, int32_t source)
{
	(void)ptr, (void)size, (void)device, (void)tier, (void)source;
	PROBE_BARRIER();
}

EXPORT void spillway_probe_free(uint64_t ptr, uint64_t size, int32_t device, int32_t tier)
{
	(void)ptr, (void)size, (void)device, (void)tier;
	PROBE_BARRIER();
}

EXPORT void spillway_probe_sync(int32_t device, uint64_t freed_bytes_made_reusable)
{
	(void)device, (void)freed_bytes_made_reusable;
	PROBE_BARRIER();
}

EXPORT void spillway_probe_spill(uint64_t ptr, uint64_t size, int32_t device, int32_t tier)
{
	(void)ptr, (void)size, (void)device, (void)tier;
	PROBE_BARRIER();
}

EXPORT void spillway_probe_promote(uint64_t ptr, uint64_t size, int32_t device, int32_t tier)
{
	(void)ptr, (void)size, (void)device, (void)tier;
	PROBE_BARRIER();
}

EXPORT void spillway_probe_refuse(uint64_t size, int32_t device, uint64_t used, uint64_t quota)
{
	(void)size, (void)device, (void)used, (void)quota;
	PROBE_BARRIER();
}
