/*
 * arrays.c - checks simcuda's CUDA arrays, one case per run: `arrays <case>`.
 * It prints "PASS <case>" and exits 0, or names the failed check and exits
 * 1. Device usage is read exactly with cuMemGetInfo (total - free) after
 * every step: the program runs alone on its devices.
 */
#include <stdint.h>
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

static void init_device(void)
{
	CUcontext ctx;
	OK(cuInit(0));
	OK(cuDevicePrimaryCtxRetain(&ctx, 0));
	OK(cuCtxSetCurrent(ctx));
}

static CUDA_ARRAY3D_DESCRIPTOR desc3d(size_t w, size_t h, size_t d, CUarray_format format,
				      unsigned int channels, unsigned int flags)
{
	CUDA_ARRAY3D_DESCRIPTOR desc = {w, h, d, format, channels, flags};
	return desc;
}

/* Each shape takes its elements times their size, in 512-byte granules, until destroyed. */
static void driver_charge(void)
{
	init_device();
	size_t base = used();
	CUarray a, b, c;
	CUDA_ARRAY_DESCRIPTOR d2 = {1024, 768, CU_AD_FORMAT_FLOAT, 4};
	OK(cuArrayCreate_v2(&a, &d2));
	CHECK(used() - base == (size_t)1024 * 768 * 16);
	CUDA_ARRAY_DESCRIPTOR d1 = {100, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1}; /* 100 bytes: one granule */
	OK(cuArrayCreate_v2(&b, &d1));
	CHECK(used() - base == (size_t)1024 * 768 * 16 + 512);
	CUDA_ARRAY3D_DESCRIPTOR d3 = desc3d(64, 64, 64, CU_AD_FORMAT_HALF, 2, 0);
	OK(cuArray3DCreate_v2(&c, &d3));
	CHECK(used() - base == (size_t)1024 * 768 * 16 + 512 + 64 * 64 * 64 * 4);

	CUDA_ARRAY_DESCRIPTOR got;
	OK(cuArrayGetDescriptor_v2(&got, a));
	CHECK(got.Width == 1024 && got.Height == 768 && got.Format == CU_AD_FORMAT_FLOAT && got.NumChannels == 4);
	CUDA_ARRAY3D_DESCRIPTOR got3;
	OK(cuArray3DGetDescriptor_v2(&got3, c));
	CHECK(memcmp(&got3, &d3, sizeof(d3)) == 0);
	OK(cuArray3DGetDescriptor_v2(&got3, b));
	CHECK(got3.Width == 100 && got3.Height == 0 && got3.Depth == 0 && got3.Flags == 0);

	OK(cuArrayDestroy(a));
	CHECK(used() - base == 512 + (size_t)64 * 64 * 64 * 4);
	OK(cuArrayDestroy(b));
	OK(cuArrayDestroy(c));
	CHECK(used() == base);
	/* A destroyed handle is refused. */
	EXPECT(cuArrayDestroy(a), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuArrayGetDescriptor_v2(&got, a), CUDA_ERROR_INVALID_HANDLE);
}

/* The documented argument rules, each refused without taking anything. */
static void driver_errors(void)
{
	CUarray a;
	CUDA_ARRAY_DESCRIPTOR d2 = {16, 16, CU_AD_FORMAT_FLOAT, 1};
	EXPECT(cuArrayCreate_v2(&a, &d2), CUDA_ERROR_NOT_INITIALIZED);
	OK(cuInit(0));
	EXPECT(cuArrayCreate_v2(&a, &d2), CUDA_ERROR_INVALID_CONTEXT);
	init_device();
	size_t base = used();
	EXPECT(cuArrayCreate_v2(NULL, &d2), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuArrayCreate_v2(&a, NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuArray3DCreate_v2(&a, NULL), CUDA_ERROR_INVALID_VALUE);
	const struct {
		CUDA_ARRAY3D_DESCRIPTOR d;
		CUresult want;
	} bad[] = {
		{desc3d(0, 0, 0, CU_AD_FORMAT_FLOAT, 1, 0), CUDA_ERROR_INVALID_VALUE},     /* no width */
		{desc3d(16, 16, 16, CU_AD_FORMAT_FLOAT, 3, 0), CUDA_ERROR_INVALID_VALUE},  /* 3 channels */
		{desc3d(16, 16, 16, CU_AD_FORMAT_FLOAT, 0, 0), CUDA_ERROR_INVALID_VALUE},  /* 0 channels */
		{desc3d(16, 16, 16, (CUarray_format)0x04, 1, 0), CUDA_ERROR_INVALID_VALUE}, /* no such format */
		{desc3d(16, 16, 0, CU_AD_FORMAT_NV12, 1, 0), CUDA_ERROR_NOT_SUPPORTED},    /* not simulated */
		{desc3d(16, 16, 16, CU_AD_FORMAT_FLOAT, 1, 0x100), CUDA_ERROR_INVALID_VALUE}, /* unknown flag */
		{desc3d(16, 0, 16, CU_AD_FORMAT_FLOAT, 1, 0), CUDA_ERROR_INVALID_VALUE},   /* depth, no height, not layered */
		{desc3d(16, 16, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_LAYERED), CUDA_ERROR_INVALID_VALUE}, /* no layers */
		{desc3d(16, 8, 6, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_CUBEMAP), CUDA_ERROR_INVALID_VALUE},  /* not square */
		{desc3d(16, 16, 5, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_CUBEMAP), CUDA_ERROR_INVALID_VALUE}, /* not 6 faces */
		{desc3d(16, 16, 8, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_CUBEMAP | CUDA_ARRAY3D_LAYERED),
		 CUDA_ERROR_INVALID_VALUE}, /* layers not a multiple of 6 */
		{desc3d(16, 16, 16, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_TEXTURE_GATHER), CUDA_ERROR_INVALID_VALUE}, /* gather: 2D only */
		{desc3d(131073, 0, 0, CU_AD_FORMAT_FLOAT, 1, 0), CUDA_ERROR_INVALID_VALUE}, /* past the 1D texture width */
		{desc3d(16384, 16384, 16385, CU_AD_FORMAT_FLOAT, 1, 0), CUDA_ERROR_INVALID_VALUE}, /* past the 3D depth */
		{desc3d(16, 16, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SPARSE), CUDA_ERROR_NOT_SUPPORTED},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CUresult rc = cuArray3DCreate_v2(&a, &bad[i].d);
		if (rc != bad[i].want) {
			fprintf(stderr, "%s: bad descriptor #%zu: %d, want %d\n", current_case, i, rc, bad[i].want);
			exit(1);
		}
	}
	/* The accepted shapes: layered 1D and 2D, cubemap, layered cubemap, gather, 1D. */
	const CUDA_ARRAY3D_DESCRIPTOR good[] = {
		desc3d(16, 0, 4, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_LAYERED),
		desc3d(16, 16, 4, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST),
		desc3d(16, 16, 6, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_CUBEMAP),
		desc3d(16, 16, 12, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_CUBEMAP | CUDA_ARRAY3D_LAYERED),
		desc3d(16, 16, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, CUDA_ARRAY3D_TEXTURE_GATHER),
		desc3d(131072, 0, 0, CU_AD_FORMAT_SIGNED_INT32, 1, 0),
	};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		CUresult rc = cuArray3DCreate_v2(&a, &good[i]);
		if (rc != CUDA_SUCCESS) {
			fprintf(stderr, "%s: good descriptor #%zu: %d\n", current_case, i, rc);
			exit(1);
		}
		OK(cuArrayDestroy(a));
	}
	CHECK(used() == base);
	EXPECT(cuArrayDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuArrayDestroy((CUarray)&a), CUDA_ERROR_INVALID_HANDLE);
	CUDA_ARRAY3D_DESCRIPTOR ok = desc3d(16, 16, 0, CU_AD_FORMAT_FLOAT, 1, 0);
	OK(cuArray3DCreate_v2(&a, &ok));
	EXPECT(cuArrayGetDescriptor_v2(NULL, a), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuArray3DGetDescriptor_v2(NULL, a), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuArray3DGetDescriptor_v2(&ok, NULL), CUDA_ERROR_INVALID_HANDLE);
	OK(cuArrayDestroy(a));
}

/* Only a deferred-mapping array has requirements; it takes no memory of its own. */
static void requirements(void)
{
	init_device();
	size_t base = used();
	CUarray a, deferred;
	CUDA_ARRAY_MEMORY_REQUIREMENTS req;
	CUDA_ARRAY3D_DESCRIPTOR d = desc3d(1024, 1024, 0, CU_AD_FORMAT_FLOAT, 4, 0);
	OK(cuArray3DCreate_v2(&a, &d));
	EXPECT(cuArrayGetMemoryRequirements(&req, a, 0), CUDA_ERROR_INVALID_VALUE);
	d.Flags = CUDA_ARRAY3D_DEFERRED_MAPPING;
	size_t with_one = used();
	OK(cuArray3DCreate_v2(&deferred, &d));
	CHECK(used() == with_one);
	EXPECT(cuArrayGetMemoryRequirements(NULL, deferred, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuArrayGetMemoryRequirements(&req, NULL, 0), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuArrayGetMemoryRequirements(&req, deferred, 7), CUDA_ERROR_INVALID_DEVICE);
	OK(cuArrayGetMemoryRequirements(&req, deferred, 0));
	CHECK(req.size == 16 * MiB && req.alignment == 2 * MiB);
	int supported = -1;
	OK(cuDeviceGetAttribute(&supported, (CUdevice_attribute)121, 0)); /* DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED */
	CHECK(supported == 1);
	OK(cuArrayDestroy(deferred));
	OK(cuArrayDestroy(a));
	CHECK(used() == base);
}

/* An array that does not fit the device is refused and takes nothing. */
static void capacity(void)
{
	init_device(); /* SIMCUDA_DEVICES=64MiB */
	size_t base = used();
	CUarray a, b;
	CUDA_ARRAY3D_DESCRIPTOR d = desc3d(2049, 2048, 0, CU_AD_FORMAT_FLOAT, 4, 0); /* past 64 MiB */
	EXPECT(cuArray3DCreate_v2(&a, &d), CUDA_ERROR_OUT_OF_MEMORY);
	CHECK(used() == base);
	d.Width = 2048;
	d.Height = 1025; /* a little over 32 MiB: two do not fit */
	OK(cuArray3DCreate_v2(&a, &d));
	EXPECT(cuArray3DCreate_v2(&b, &d), CUDA_ERROR_OUT_OF_MEMORY);
	CUdeviceptr p;
	EXPECT(cuMemAlloc_v2(&p, 32 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
	OK(cuArrayDestroy(a));
	OK(cuArray3DCreate_v2(&b, &d));
}

/* Destroying a created context, or resetting the primary one, destroys its arrays. */
static void contexts(void)
{
	init_device();
	size_t base = used();
	CUarray primary, created;
	CUDA_ARRAY3D_DESCRIPTOR d = desc3d(1024, 1024, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0);
	OK(cuArray3DCreate_v2(&primary, &d));
	CUcontext ctx;
	OK(cuCtxCreate_v2(&ctx, 0, 0));
	OK(cuArray3DCreate_v2(&created, &d));
	CHECK(used() - base == 2 * MiB);
	OK(cuCtxDestroy_v2(ctx));
	CHECK(used() - base == MiB);
	EXPECT(cuArrayDestroy(created), CUDA_ERROR_INVALID_HANDLE);
	OK(cuDevicePrimaryCtxReset_v2(0));
	EXPECT(cuArrayDestroy(primary), CUDA_ERROR_INVALID_HANDLE);
	OK(cuDevicePrimaryCtxRetain(&ctx, 0));
	OK(cuCtxSetCurrent(ctx));
	CHECK(used() == base);
}

/* The runtime's forms reach the driver's arrays; its channel descriptors follow CUDA's rules. */
static void runtime(void)
{
	OK(cudaSetDevice(0));
	size_t free_bytes, total;
	OK(cudaMemGetInfo(&free_bytes, &total));
	size_t base = total - free_bytes;
	struct cudaChannelFormatDesc float4 = {32, 32, 32, 32, cudaChannelFormatKindFloat};
	cudaArray_t a, b;
	OK(cudaMallocArray(&a, &float4, 256, 256, cudaArrayDefault));
	OK(cudaMemGetInfo(&free_bytes, &total));
	CHECK(total - free_bytes - base == MiB);
	struct cudaChannelFormatDesc uchar2 = {8, 8, 0, 0, cudaChannelFormatKindUnsigned};
	OK(cudaMalloc3DArray(&b, &uchar2, (struct cudaExtent){64, 64, 8}, cudaArrayLayered));

	struct cudaChannelFormatDesc got;
	struct cudaExtent extent;
	unsigned int flags;
	OK(cudaArrayGetInfo(&got, &extent, &flags, b));
	CHECK(memcmp(&got, &uchar2, sizeof(got)) == 0);
	CHECK(extent.width == 64 && extent.height == 64 && extent.depth == 8 && flags == cudaArrayLayered);
	OK(cudaArrayGetInfo(NULL, &extent, NULL, a));
	CHECK(extent.width == 256 && extent.height == 256 && extent.depth == 0);
	/* The driver sees the runtime's array. */
	CUDA_ARRAY3D_DESCRIPTOR d;
	OK(cuArray3DGetDescriptor_v2(&d, (CUarray)a));
	CHECK(d.Format == CU_AD_FORMAT_FLOAT && d.NumChannels == 4);

	struct cudaArrayMemoryRequirements req;
	EXPECT(cudaArrayGetMemoryRequirements(&req, a, 0), cudaErrorInvalidValue);
	EXPECT(cudaGetLastError(), cudaErrorInvalidValue);

	const struct cudaChannelFormatDesc bad[] = {
		{0, 0, 0, 0, cudaChannelFormatKindFloat},     /* no component */
		{32, 32, 32, 0, cudaChannelFormatKindFloat},  /* three */
		{32, 0, 32, 0, cudaChannelFormatKindFloat},   /* a gap */
		{32, 16, 0, 0, cudaChannelFormatKindSigned},  /* mixed sizes */
		{8, 0, 0, 0, cudaChannelFormatKindFloat},     /* 8-bit float */
		{24, 0, 0, 0, cudaChannelFormatKindUnsigned}, /* 24 bits */
		{8, 0, 0, 0, cudaChannelFormatKindNone},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cudaError_t err = cudaMallocArray(&a, &bad[i], 16, 16, 0);
		if (err != cudaErrorInvalidChannelDescriptor) {
			fprintf(stderr, "%s: bad channel descriptor #%zu: %d\n", current_case, i, err);
			exit(1);
		}
	}
	cudaArray_t c;
	EXPECT(cudaMallocArray(NULL, &float4, 16, 16, 0), cudaErrorInvalidValue);
	EXPECT(cudaMallocArray(&c, NULL, 16, 16, 0), cudaErrorInvalidValue);
	EXPECT(cudaMallocArray(&c, &float4, 0, 16, 0), cudaErrorInvalidValue);
	EXPECT(cudaMallocArray(&c, &float4, 16, 16, cudaArrayLayered), cudaErrorInvalidValue);
	EXPECT(cudaMalloc3DArray(&c, &float4, (struct cudaExtent){16, 16, 5}, cudaArrayCubemap), cudaErrorInvalidValue);

	OK(cudaFreeArray(a));
	OK(cudaFreeArray(b));
	OK(cudaFreeArray(NULL));
	EXPECT(cudaFreeArray(a), cudaErrorInvalidResourceHandle);
	EXPECT(cudaArrayGetInfo(NULL, NULL, NULL, a), cudaErrorInvalidResourceHandle);
	OK(cudaMemGetInfo(&free_bytes, &total));
	CHECK(total - free_bytes == base);
}

static const struct test_case cases[] = {
	{"driver_charge", driver_charge}, {"driver_errors", driver_errors},
	{"requirements", requirements},   {"capacity", capacity},
	{"contexts", contexts},           {"runtime", runtime},
};

int main(int argc, char **argv)
{
	return run_case(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
