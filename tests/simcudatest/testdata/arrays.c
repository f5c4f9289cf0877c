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

/* The CUDA_ARRAY3D_DESCRIPTOR of level i of m. */
static CUDA_ARRAY3D_DESCRIPTOR level_desc(CUmipmappedArray m, unsigned int i)
{
	CUarray level;
	CUDA_ARRAY3D_DESCRIPTOR d;
	OK(cuMipmappedArrayGetLevel(&level, m, i));
	OK(cuArray3DGetDescriptor_v2(&d, level));
	return d;
}

/*
 * A mipmapped array takes the sum of its levels, each halving the extents
 * (never below 1; a layered array keeps its layers), in 512-byte granules;
 * the level count is clamped to [1, 1 + log2(widest extent)]. A level is the
 * mipmapped array's: cuArrayDestroy refuses it, and it goes with the whole.
 */
static void mipmap_charge(void)
{
	init_device();
	size_t base = used();
	CUmipmappedArray flat, cube, layered, single, narrow;
	CUarray level;
	/* Layers are no extent for the level count: 4 wide in 64 layers has 3 levels, not 7. */
	CUDA_ARRAY3D_DESCRIPTOR d = desc3d(4, 0, 64, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_LAYERED);
	OK(cuMipmappedArrayCreate(&narrow, &d, 20));
	CHECK(used() - base == 1024 + 512 + 512);
	CUDA_ARRAY3D_DESCRIPTOR got = level_desc(narrow, 2);
	CHECK(got.Width == 1 && got.Height == 0 && got.Depth == 64);
	EXPECT(cuMipmappedArrayGetLevel(&level, narrow, 3), CUDA_ERROR_INVALID_VALUE);
	OK(cuMipmappedArrayDestroy(narrow));
	CHECK(used() == base);
	/* 9 levels, 256x128 to 1x1: 131072 + 32768 + 8192 + 2048 + 512 + four granules. */
	d = desc3d(256, 128, 0, CU_AD_FORMAT_FLOAT, 1, 0);
	OK(cuMipmappedArrayCreate(&flat, &d, 100));
	CHECK(used() - base == 176640);
	got = level_desc(flat, 8);
	CHECK(got.Width == 1 && got.Height == 1 && got.Depth == 0 && got.Format == CU_AD_FORMAT_FLOAT);
	got = level_desc(flat, 3);
	CHECK(got.Width == 32 && got.Height == 16);
	EXPECT(cuMipmappedArrayGetLevel(&level, flat, 9), CUDA_ERROR_INVALID_VALUE);
	/* 3 of 7 levels of a 3D array: 64^3, 32^3, 16^3 elements of 4 bytes. */
	d = desc3d(64, 64, 64, CU_AD_FORMAT_HALF, 2, 0);
	OK(cuMipmappedArrayCreate(&cube, &d, 3));
	CHECK(used() - base == 176640 + 1196032);
	got = level_desc(cube, 2);
	CHECK(got.Width == 16 && got.Height == 16 && got.Depth == 16);
	EXPECT(cuMipmappedArrayGetLevel(&level, cube, 3), CUDA_ERROR_INVALID_VALUE);
	/* 7 levels of 8 layers, 64x64 to 1x1 bytes each: the layers do not halve. */
	d = desc3d(64, 64, 8, CU_AD_FORMAT_UNSIGNED_INT8, 1, CUDA_ARRAY3D_LAYERED);
	OK(cuMipmappedArrayCreate(&layered, &d, 1000));
	CHECK(used() - base == 176640 + 1196032 + 45056);
	got = level_desc(layered, 6);
	CHECK(got.Width == 1 && got.Height == 1 && got.Depth == 8 && got.Flags == CUDA_ARRAY3D_LAYERED);
	EXPECT(cuMipmappedArrayGetLevel(&level, layered, 7), CUDA_ERROR_INVALID_VALUE);
	/* 0 levels is clamped to 1. */
	d = desc3d(1000, 0, 0, CU_AD_FORMAT_FLOAT, 1, 0);
	OK(cuMipmappedArrayCreate(&single, &d, 0));
	CHECK(used() - base == 176640 + 1196032 + 45056 + 4096);
	EXPECT(cuMipmappedArrayGetLevel(&level, single, 1), CUDA_ERROR_INVALID_VALUE);

	/* A level cannot be destroyed on its own; it stays charged and usable. */
	OK(cuMipmappedArrayGetLevel(&level, flat, 0));
	EXPECT(cuArrayDestroy(level), CUDA_ERROR_INVALID_HANDLE);
	CHECK(used() - base == 176640 + 1196032 + 45056 + 4096);
	OK(cuArray3DGetDescriptor_v2(&got, level));

	OK(cuMipmappedArrayDestroy(flat));
	CHECK(used() - base == 1196032 + 45056 + 4096);
	/* The levels went with it. */
	EXPECT(cuArray3DGetDescriptor_v2(&got, level), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuMipmappedArrayDestroy(flat), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuMipmappedArrayGetLevel(&level, flat, 0), CUDA_ERROR_INVALID_HANDLE);
	OK(cuMipmappedArrayDestroy(cube));
	OK(cuMipmappedArrayDestroy(layered));
	OK(cuMipmappedArrayDestroy(single));
	CHECK(used() == base);
}

/* The documented argument rules, each refused without taking anything. */
static void mipmap_errors(void)
{
	CUmipmappedArray m;
	CUDA_ARRAY3D_DESCRIPTOR d = desc3d(16, 16, 0, CU_AD_FORMAT_FLOAT, 1, 0);
	EXPECT(cuMipmappedArrayCreate(&m, &d, 1), CUDA_ERROR_NOT_INITIALIZED);
	OK(cuInit(0));
	EXPECT(cuMipmappedArrayCreate(&m, &d, 1), CUDA_ERROR_INVALID_CONTEXT);
	init_device();
	size_t base = used();
	EXPECT(cuMipmappedArrayCreate(NULL, &d, 1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMipmappedArrayCreate(&m, NULL, 1), CUDA_ERROR_INVALID_VALUE);
	const struct {
		CUDA_ARRAY3D_DESCRIPTOR d;
		CUresult want;
	} bad[] = {
		{desc3d(0, 0, 0, CU_AD_FORMAT_FLOAT, 1, 0), CUDA_ERROR_INVALID_VALUE},    /* no width */
		{desc3d(16, 16, 0, CU_AD_FORMAT_FLOAT, 3, 0), CUDA_ERROR_INVALID_VALUE},  /* 3 channels */
		{desc3d(32769, 0, 0, CU_AD_FORMAT_FLOAT, 1, 0), CUDA_ERROR_INVALID_VALUE}, /* past the mipmapped 1D width */
		{desc3d(32769, 16, 0, CU_AD_FORMAT_FLOAT, 1, 0), CUDA_ERROR_INVALID_VALUE}, /* past the mipmapped 2D width */
		{desc3d(16, 8, 6, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_CUBEMAP), CUDA_ERROR_INVALID_VALUE}, /* not square */
		{desc3d(16, 16, 16, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_TEXTURE_GATHER), CUDA_ERROR_INVALID_VALUE},
		{desc3d(16, 16, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SPARSE), CUDA_ERROR_NOT_SUPPORTED},
		{desc3d(16, 16, 0, CU_AD_FORMAT_NV12, 1, 0), CUDA_ERROR_NOT_SUPPORTED},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CUresult rc = cuMipmappedArrayCreate(&m, &bad[i].d, 2);
		if (rc != bad[i].want) {
			fprintf(stderr, "%s: bad descriptor #%zu: %d, want %d\n", current_case, i, rc, bad[i].want);
			exit(1);
		}
	}
	CHECK(used() == base);
	/* A deferred-mapping mipmapped array takes nothing of its own. */
	d.Flags = CUDA_ARRAY3D_DEFERRED_MAPPING;
	OK(cuMipmappedArrayCreate(&m, &d, 5));
	CHECK(used() == base);
	OK(cuMipmappedArrayDestroy(m));

	d = desc3d(16, 16, 0, CU_AD_FORMAT_FLOAT, 1, 0);
	OK(cuMipmappedArrayCreate(&m, &d, 1));
	CUarray level, plain;
	EXPECT(cuMipmappedArrayGetLevel(NULL, m, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMipmappedArrayGetLevel(&level, NULL, 0), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuMipmappedArrayDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
	/* An array is not a mipmapped array, nor the other way round. */
	OK(cuArray3DCreate_v2(&plain, &d));
	EXPECT(cuMipmappedArrayDestroy((CUmipmappedArray)plain), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuArrayDestroy((CUarray)m), CUDA_ERROR_INVALID_HANDLE);
	OK(cuArrayDestroy(plain));
	OK(cuMipmappedArrayDestroy(m));
	CHECK(used() == base);
}

/* A mipmapped array past the device's capacity is refused whole: its levels count, not just the first. */
static void mipmap_capacity(void)
{
	init_device(); /* SIMCUDA_DEVICES=64MiB */
	size_t base = used();
	CUmipmappedArray a, b;
	/* 32 MiB at level 0, 44741120 bytes in its 13 levels: two of the first fit, not two of the whole. */
	CUDA_ARRAY3D_DESCRIPTOR d = desc3d(4096, 2048, 0, CU_AD_FORMAT_FLOAT, 1, 0);
	OK(cuMipmappedArrayCreate(&a, &d, 13));
	CHECK(used() - base == 44741120);
	EXPECT(cuMipmappedArrayCreate(&b, &d, 13), CUDA_ERROR_OUT_OF_MEMORY);
	EXPECT(cuMipmappedArrayCreate(&b, &d, 1), CUDA_ERROR_OUT_OF_MEMORY);
	CUdeviceptr p;
	EXPECT(cuMemAlloc_v2(&p, 24 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
	CHECK(used() - base == 44741120);
}

/* Destroying a created context, or resetting the primary one, destroys its mipmapped arrays. */
static void mipmap_contexts(void)
{
	init_device();
	size_t base = used();
	CUmipmappedArray primary, created;
	CUarray level;
	CUDA_ARRAY3D_DESCRIPTOR d = desc3d(1024, 1024, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0);
	OK(cuMipmappedArrayCreate(&primary, &d, 1));
	CUcontext ctx;
	OK(cuCtxCreate_v2(&ctx, 0, 0));
	OK(cuMipmappedArrayCreate(&created, &d, 1));
	OK(cuMipmappedArrayGetLevel(&level, created, 0));
	CHECK(used() - base == 2 * MiB);
	OK(cuCtxDestroy_v2(ctx));
	CHECK(used() - base == MiB);
	EXPECT(cuMipmappedArrayDestroy(created), CUDA_ERROR_INVALID_HANDLE);
	CUDA_ARRAY3D_DESCRIPTOR got;
	EXPECT(cuArray3DGetDescriptor_v2(&got, level), CUDA_ERROR_INVALID_HANDLE);
	OK(cuDevicePrimaryCtxReset_v2(0));
	EXPECT(cuMipmappedArrayDestroy(primary), CUDA_ERROR_INVALID_HANDLE);
	OK(cuDevicePrimaryCtxRetain(&ctx, 0));
	OK(cuCtxSetCurrent(ctx));
	CHECK(used() == base);
}

/* The runtime's forms reach the driver's mipmapped arrays, which cuGetProcAddress hands out. */
static void mipmap_runtime(void)
{
	OK(cudaSetDevice(0));
	size_t free_bytes, total;
	OK(cudaMemGetInfo(&free_bytes, &total));
	size_t base = total - free_bytes;
	struct cudaChannelFormatDesc float4 = {32, 32, 32, 32, cudaChannelFormatKindFloat};
	cudaMipmappedArray_t m;
	OK(cudaMallocMipmappedArray(&m, &float4, (struct cudaExtent){256, 256, 0}, 2, cudaArrayDefault));
	OK(cudaMemGetInfo(&free_bytes, &total));
	CHECK(total - free_bytes - base == MiB + MiB / 4);
	cudaArray_t level;
	struct cudaExtent extent;
	OK(cudaGetMipmappedArrayLevel(&level, m, 1));
	OK(cudaArrayGetInfo(NULL, &extent, NULL, level));
	CHECK(extent.width == 128 && extent.height == 128 && extent.depth == 0);
	EXPECT(cudaFreeArray(level), cudaErrorInvalidResourceHandle);
	EXPECT(cudaGetMipmappedArrayLevel(&level, m, 2), cudaErrorInvalidValue);
	EXPECT(cudaGetMipmappedArrayLevel(&level, NULL, 0), cudaErrorInvalidResourceHandle);
	EXPECT(cudaGetLastError(), cudaErrorInvalidResourceHandle);
	/* The driver sees the runtime's mipmapped array. */
	CUarray driver_level;
	OK(cuMipmappedArrayGetLevel(&driver_level, (CUmipmappedArray)m, 1));
	CHECK((void *)driver_level == (void *)level);

	cudaMipmappedArray_t other;
	struct cudaChannelFormatDesc three = {32, 32, 32, 0, cudaChannelFormatKindFloat};
	EXPECT(cudaMallocMipmappedArray(NULL, &float4, (struct cudaExtent){16, 16, 0}, 1, 0), cudaErrorInvalidValue);
	EXPECT(cudaMallocMipmappedArray(&other, NULL, (struct cudaExtent){16, 16, 0}, 1, 0), cudaErrorInvalidValue);
	EXPECT(cudaMallocMipmappedArray(&other, &three, (struct cudaExtent){16, 16, 0}, 1, 0),
	       cudaErrorInvalidChannelDescriptor);
	EXPECT(cudaMallocMipmappedArray(&other, &float4, (struct cudaExtent){16, 8, 6}, 1, cudaArrayCubemap),
	       cudaErrorInvalidValue);

	void *fn = NULL;
	CUdriverProcAddressQueryResult status;
	const char *names[] = {"cuMipmappedArrayCreate", "cuMipmappedArrayDestroy", "cuMipmappedArrayGetLevel"};
	void *want[] = {(void *)cuMipmappedArrayCreate, (void *)cuMipmappedArrayDestroy,
			(void *)cuMipmappedArrayGetLevel};
	for (size_t i = 0; i < 3; i++) {
		OK(cuGetProcAddress_v2(names[i], &fn, 12000, 0, &status));
		CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS && fn == want[i]);
	}

	OK(cudaFreeMipmappedArray(m));
	OK(cudaFreeMipmappedArray(NULL));
	EXPECT(cudaFreeMipmappedArray(m), cudaErrorInvalidResourceHandle);
	OK(cudaMemGetInfo(&free_bytes, &total));
	CHECK(total - free_bytes == base);
}

static const struct test_case cases[] = {
	{"driver_charge", driver_charge}, {"driver_errors", driver_errors},
	{"requirements", requirements},   {"capacity", capacity},
	{"contexts", contexts},           {"runtime", runtime},
	{"mipmap_charge", mipmap_charge}, {"mipmap_errors", mipmap_errors},
	{"mipmap_capacity", mipmap_capacity}, {"mipmap_contexts", mipmap_contexts},
	{"mipmap_runtime", mipmap_runtime},
};

int main(int argc, char **argv)
{
	return run_case(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
