/*
 * vmm.c - checks simcuda's virtual memory management API, one case per run:
 * `vmm <case>`. It prints "PASS <case>" and exits 0, or names the failed
 * check and exits 1. Device usage is read exactly with cuMemGetInfo
 * (total - free) after every step: the program runs alone on its devices.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <spillway/cuda.h>

#include "check.h"

#define MiB ((size_t)1 << 20)
#define GRANULE (2 * MiB)

/* Bytes in use on the current device: this process's (and in case share its child's). */
static size_t used(void)
{
	size_t free_bytes, total;
	OK(cuMemGetInfo_v2(&free_bytes, &total));
	return total - free_bytes;
}

static void init_device(int ordinal)
{
	CUcontext ctx;
	OK(cuInit(0));
	OK(cuDevicePrimaryCtxRetain(&ctx, ordinal));
	OK(cuCtxSetCurrent(ctx));
}

static CUmemAllocationProp device_prop(int ordinal)
{
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = ordinal;
	return prop;
}

static CUmemGenericAllocationHandle create(size_t size)
{
	CUmemAllocationProp prop = device_prop(0);
	CUmemGenericAllocationHandle h;
	OK(cuMemCreate(&h, size, &prop, 0));
	return h;
}

static CUdeviceptr reserve(size_t size)
{
	CUdeviceptr p;
	OK(cuMemAddressReserve(&p, size, 0, 0, 0));
	return p;
}

static void allow(CUdeviceptr p, size_t size, CUmemAccess_flags flags)
{
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, flags};
	OK(cuMemSetAccess(p, size, &d, 1));
}

/* Maps h at p and makes it read-write for device 0. */
static void map_rw(CUdeviceptr p, size_t size, CUmemGenericAllocationHandle h)
{
	OK(cuMemMap(p, size, 0, h, 0));
	allow(p, size, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
}

static void fill(unsigned char *buf, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		buf[i] = (unsigned char)(i * 131 + seed);
}

/* Writes a pattern through the device API and reads it back. */
static void round_trip(CUdeviceptr p, size_t n, unsigned seed)
{
	unsigned char *in = malloc(n), *out = malloc(n);
	CHECK(in && out);
	fill(in, n, seed);
	OK(cuMemcpyHtoD_v2(p, in, n));
	memset(out, 0, n);
	OK(cuMemcpyDtoH_v2(out, p, n));
	CHECK(memcmp(in, out, n) == 0);
	free(in);
	free(out);
}

static void check_pattern(CUdeviceptr p, size_t n, unsigned seed)
{
	unsigned char *want = malloc(n), *got = malloc(n);
	CHECK(want && got);
	fill(want, n, seed);
	OK(cuMemcpyDtoH_v2(got, p, n));
	CHECK(memcmp(want, got, n) == 0);
	free(want);
	free(got);
}

/* ---- cases ---- */

static void case_granularity(void)
{
	CUmemAllocationProp prop = device_prop(0);
	size_t g = 0;
	int v = -1;

	init_device(0);
	OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
	CHECK(v == 1);
	OK(cuDeviceGetAttribute(&v, (CUdevice_attribute)103, 0)); /* POSIX fd handles */
	CHECK(v == 1);
	OK(cuDeviceGetAttribute(&v, (CUdevice_attribute)128, 0)); /* fabric handles */
	CHECK(v == 0);
	OK(cuDeviceGetAttribute(&v, (CUdevice_attribute)107, 0)); /* compression */
	CHECK(v == 0);
	OK(cuDeviceGetAttribute(&v, (CUdevice_attribute)110, 0)); /* RDMA with VMM */
	CHECK(v == 1);
	OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CHECK(g == GRANULE);
	g = 0;
	OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
	CHECK(g == GRANULE);
	EXPECT(cuMemGetAllocationGranularity(&g, &prop, (CUmemAllocationGranularity_flags)2),
	       CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemGetAllocationGranularity(&g, NULL, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
	       CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemGetAllocationGranularity(NULL, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
	       CUDA_ERROR_INVALID_VALUE);
	prop.location.id = 1; /* one device only */
	EXPECT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
	       CUDA_ERROR_INVALID_DEVICE);
	prop = device_prop(0);
	prop.type = CU_MEM_ALLOCATION_TYPE_INVALID;
	EXPECT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
	       CUDA_ERROR_INVALID_VALUE);
	/* CUDA 12.4: host memory on a NUMA node (0 without NUMA); plain HOST is refused. */
	prop = device_prop(0);
	prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
	prop.location.id = 0;
	OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CHECK(g == GRANULE);
	prop.location.id = 1;
	EXPECT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
	       CUDA_ERROR_INVALID_VALUE);
	prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
	prop.location.id = 0;
	EXPECT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
	       CUDA_ERROR_INVALID_VALUE);
	prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
	EXPECT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
	       CUDA_ERROR_INVALID_VALUE);
}

static void case_round_trip(void)
{
	init_device(0);
	CHECK(used() == 0);
	CUdeviceptr base = reserve(8 * MiB);
	CHECK(base % GRANULE == 0);
	CHECK(used() == 0); /* address space costs no device memory */
	CUmemGenericAllocationHandle h = create(4 * MiB);
	CHECK(used() == 4 * MiB); /* physical memory counts when created */
	map_rw(base, 4 * MiB, h);
	CHECK(used() == 4 * MiB);
	round_trip(base, 4 * MiB, 7);
	round_trip(base + 12345, 1000, 9); /* interior pointers work */

	/* memset and device-to-device copies to and from plain memory */
	CUdeviceptr plain;
	unsigned char buf[4096];
	OK(cuMemAlloc_v2(&plain, 4096));
	OK(cuMemsetD8_v2(base + MiB, 0x5a, 4096));
	OK(cuMemcpyDtoD_v2(plain, base + MiB, 4096));
	OK(cuCtxSynchronize());
	OK(cuMemcpyDtoH_v2(buf, plain, sizeof(buf)));
	for (size_t i = 0; i < sizeof(buf); i++)
		CHECK(buf[i] == 0x5a);
	OK(cuMemFree_v2(plain));

	/* Pointer queries: the range attributes report the reservation (the
	 * mappable range, as CUDA documents), cuMemGetAddressRange the mapping. */
	CUdeviceptr start = 0;
	size_t size = 0;
	unsigned int type = 0;
	int ordinal = -1;
	OK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, base + 100));
	OK(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, base + 100));
	OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, base + 100));
	OK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, base + 100));
	CHECK(start == base && size == 8 * MiB && type == CU_MEMORYTYPE_DEVICE && ordinal == 0);
	CUpointer_attribute range_attrs[2] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
					      CU_POINTER_ATTRIBUTE_RANGE_SIZE};
	void *range_data[2] = {&start, &size};
	start = 0, size = 0;
	OK(cuPointerGetAttributes(2, range_attrs, range_data, base + 3 * MiB));
	CHECK(start == base && size == 8 * MiB);
	int ipc = -1;
	OK(cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, base));
	CHECK(ipc == 0); /* cuIpcGetMemHandle does not take VMM memory */
	CUipcMemHandle refused;
	EXPECT(cuIpcGetMemHandle(&refused, base), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuIpcGetMemHandle(&refused, base + 100), CUDA_ERROR_INVALID_VALUE);
	unsigned long long unanswered = 0;
	EXPECT(cuPointerGetAttribute(&unanswered, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, base),
	       CUDA_ERROR_NOT_SUPPORTED); /* documented: cuMemGetAccess answers instead */
	EXPECT(cuPointerGetAttribute(&unanswered, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, base),
	       CUDA_ERROR_NOT_SUPPORTED);
	start = 0, size = 0;
	OK(cuMemGetAddressRange_v2(&start, &size, base + 3 * MiB));
	CHECK(start == base && size == 4 * MiB);
	EXPECT(cuMemGetAddressRange_v2(&start, &size, base + 5 * MiB), CUDA_ERROR_NOT_FOUND);

	/* handle, properties and access of the mapping */
	CUmemGenericAllocationHandle again = 0;
	OK(cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)(base + 3 * MiB + 17)));
	CHECK(again == h);
	OK(cuMemRelease(again));
	CUmemAllocationProp prop;
	memset(&prop, 0xff, sizeof(prop));
	OK(cuMemGetAllocationPropertiesFromHandle(&prop, h));
	CHECK(prop.type == CU_MEM_ALLOCATION_TYPE_PINNED &&
	      prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop.location.id == 0 &&
	      prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE);
	CUmemLocation dev0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	unsigned long long flags = 0;
	OK(cuMemGetAccess(&flags, &dev0, base + 5));
	CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	EXPECT(cuMemGetAccess(&flags, &dev0, base + 4 * MiB), CUDA_ERROR_INVALID_VALUE);

	OK(cuMemUnmap(base, 4 * MiB));
	CHECK(used() == 4 * MiB); /* the handle still holds it */
	OK(cuMemRelease(h));
	CHECK(used() == 0);
	OK(cuMemAddressFree(base, 8 * MiB));

	/* A free range asked for by address is given back at that address. */
	CUdeviceptr again_at;
	OK(cuMemAddressReserve(&again_at, 8 * MiB, 0, base, 0));
	CHECK(again_at == base);
	CUdeviceptr elsewhere;
	OK(cuMemAddressReserve(&elsewhere, 8 * MiB, 0, base, 0)); /* taken: placed elsewhere */
	CHECK(elsewhere != base && elsewhere % GRANULE == 0);
	OK(cuMemAddressFree(again_at, 8 * MiB));
	OK(cuMemAddressFree(elsewhere, 8 * MiB));
}

static void case_shared(void)
{
	init_device(0);
	CUdeviceptr a = reserve(4 * MiB), b = reserve(2 * MiB);
	CUmemGenericAllocationHandle h = create(4 * MiB), other = create(2 * MiB);
	/* All of h at a, its first granule at b: CUDA maps from offset 0 only. */
	map_rw(a, 4 * MiB, h);
	EXPECT(cuMemMap(b, 2 * MiB, 2 * MiB, h, 0), CUDA_ERROR_INVALID_VALUE);
	OK(cuMemMap(b, 2 * MiB, 0, h, 0));
	allow(b, 2 * MiB, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CHECK(used() == 6 * MiB);
	round_trip(a, 2 * MiB, 3);
	check_pattern(b, 2 * MiB, 3); /* written through a, read through b */
	OK(cuMemsetD8_v2(b + 10, 0xee, 1));
	OK(cuCtxSynchronize());
	unsigned char c = 0;
	OK(cuMemcpyDtoH_v2(&c, a + 10, 1));
	CHECK(c == 0xee);

	/* A copy across two adjacent mappings of different handles. */
	CUdeviceptr r = reserve(4 * MiB);
	map_rw(r, 2 * MiB, h);
	map_rw(r + 2 * MiB, 2 * MiB, other);
	round_trip(r + MiB, 2 * MiB, 11);
	check_pattern(a + MiB, MiB, 11); /* the first half landed in h */
	/* In the second mapping: its own range, and the reservation's as the attributes. */
	CUdeviceptr start = 0;
	size_t size = 0;
	OK(cuMemGetAddressRange_v2(&start, &size, r + 3 * MiB));
	CHECK(start == r + 2 * MiB && size == 2 * MiB);
	OK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, r + 3 * MiB));
	OK(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, r + 3 * MiB));
	CHECK(start == r && size == 4 * MiB);
	OK(cuMemUnmap(r, 4 * MiB));      /* several whole mappings at once */
	OK(cuMemUnmap(a, 4 * MiB));
	OK(cuMemUnmap(b, 2 * MiB));
	OK(cuMemRelease(h));
	OK(cuMemRelease(other));
	CHECK(used() == 0);
	OK(cuMemAddressFree(a, 4 * MiB));
	OK(cuMemAddressFree(b, 2 * MiB));
	OK(cuMemAddressFree(r, 4 * MiB));
}

static void case_release_before_unmap(void)
{
	init_device(0);
	CUdeviceptr p = reserve(4 * MiB);
	CUmemGenericAllocationHandle h = create(4 * MiB);
	map_rw(p, 4 * MiB, h);
	round_trip(p, 4 * MiB, 5);
	OK(cuMemRelease(h));
	CHECK(used() == 4 * MiB); /* still mapped: the memory stays */
	check_pattern(p, 4 * MiB, 5);
	EXPECT(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE); /* already released */
	EXPECT(cuMemMap(p, 4 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	OK(cuMemUnmap(p, 4 * MiB));
	CHECK(used() == 0); /* released and unmapped everywhere: freed */

	/* A retained reference keeps the memory after unmap until it is released. */
	h = create(2 * MiB);
	map_rw(p, 2 * MiB, h);
	CUmemGenericAllocationHandle r;
	OK(cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)p));
	OK(cuMemRelease(h));
	OK(cuMemUnmap(p, 2 * MiB));
	CHECK(used() == 2 * MiB);
	OK(cuMemRelease(r));
	CHECK(used() == 0);
	EXPECT(cuMemRelease(r), CUDA_ERROR_INVALID_VALUE);
	OK(cuMemAddressFree(p, 4 * MiB));
}

static void case_count_once(void)
{
	init_device(0);
	CUdeviceptr r = reserve(6 * MiB), s = reserve(2 * MiB);
	CUmemGenericAllocationHandle h = create(2 * MiB);
	map_rw(r, 2 * MiB, h);
	map_rw(r + 4 * MiB, 2 * MiB, h);
	map_rw(s, 2 * MiB, h);
	CHECK(used() == 2 * MiB);
	/* left mapped at exit: the statistics show it once */
}

static void case_errors(void)
{
	CUmemAllocationProp prop = device_prop(0);
	CUmemGenericAllocationHandle h, bad;
	CUdeviceptr p, plain;
	unsigned char buf[64] = {0};

	init_device(0);
	/* cuMemCreate */
	EXPECT(cuMemCreate(&bad, MiB, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemCreate(&bad, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemCreate(&bad, 3 * MiB, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemCreate(&bad, GRANULE, &prop, 1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemCreate(NULL, GRANULE, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemCreate(&bad, GRANULE, NULL, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemCreate(&bad, 64 * MiB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY); /* 32 MiB device */
	prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
	EXPECT(cuMemCreate(&bad, GRANULE, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	prop = device_prop(0);
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
	EXPECT(cuMemCreate(&bad, GRANULE, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_WIN32;
	EXPECT(cuMemCreate(&bad, GRANULE, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
	prop.requestedHandleTypes = (CUmemAllocationHandleType)0x10;
	EXPECT(cuMemCreate(&bad, GRANULE, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	/* Compression is a hint: granted where the device compresses (not here),
	 * which the properties of the handle tell. */
	prop = device_prop(0);
	prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
	size_t g = 0;
	OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CHECK(g == GRANULE);
	OK(cuMemCreate(&bad, GRANULE, &prop, 0));
	CUmemAllocationProp got;
	memset(&got, 0xff, sizeof(got));
	OK(cuMemGetAllocationPropertiesFromHandle(&got, bad));
	CHECK(got.allocFlags.compressionType == CU_MEM_ALLOCATION_COMP_NONE &&
	      got.location.type == CU_MEM_LOCATION_TYPE_DEVICE && got.location.id == 0);
	OK(cuMemRelease(bad));
	prop.allocFlags.compressionType = 0x40; /* no such compression */
	EXPECT(cuMemCreate(&bad, GRANULE, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
	prop = device_prop(0);
	prop.allocFlags.gpuDirectRDMACapable = 1; /* vLLM sets it when the attribute says so */
	OK(cuMemCreate(&bad, GRANULE, &prop, 0));
	OK(cuMemRelease(bad));
	CHECK(used() == 0);

	/* cuMemAddressReserve / cuMemAddressFree */
	EXPECT(cuMemAddressReserve(&p, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemAddressReserve(&p, 1000, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemAddressReserve(&p, 4 * MiB, 3 * MiB, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemAddressReserve(&p, 4 * MiB, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
	OK(cuMemAddressReserve(&p, 8 * MiB, 8 * MiB, 0, 0));
	CHECK(p % (8 * MiB) == 0);

	/* cuMemMap */
	h = create(4 * MiB);
	EXPECT(cuMemMap(p + 4096, 2 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemMap(p, MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemMap(p, 2 * MiB, MiB, h, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemMap(p, 2 * MiB, 2 * MiB, h, 0), CUDA_ERROR_INVALID_VALUE); /* offset not 0 */
	EXPECT(cuMemMap(p, 6 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* past the handle */
	EXPECT(cuMemMap(p + 6 * MiB, 4 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* past the range */
	EXPECT(cuMemMap(p, 2 * MiB, 0, h + 1000, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemMap(p, 2 * MiB, 0, h, 1), CUDA_ERROR_INVALID_VALUE);
	OK(cuMemAlloc_v2(&plain, 4096));
	EXPECT(cuMemMap(plain & ~(CUdeviceptr)(GRANULE - 1), 2 * MiB, 0, h, 0),
	       CUDA_ERROR_INVALID_VALUE); /* not reserved */
	int fd = -1;
	EXPECT(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
	       CUDA_ERROR_INVALID_VALUE); /* not created to be shared */
	EXPECT(cuMemImportFromShareableHandle(&bad, (void *)(intptr_t)0,
					      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
	       CUDA_ERROR_INVALID_VALUE); /* stdin is no allocation */
	OK(cuMemMap(p, 4 * MiB, 0, h, 0));
	EXPECT(cuMemMap(p, 2 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);      /* already mapped */
	EXPECT(cuMemMap(p + 2 * MiB, 4 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* overlaps */

	/* No access yet: copies and memsets through the driver fail. */
	EXPECT(cuMemcpyHtoD_v2(p, buf, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemcpyDtoH_v2(buf, p, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemcpy(p, (CUdeviceptr)(uintptr_t)buf, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemsetD8_v2(p, 1, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemcpyDtoD_v2(plain, p, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
	/* Reserved but unmapped memory: the same, never a host access. */
	EXPECT(cuMemcpy(p + 4 * MiB, (CUdeviceptr)(uintptr_t)buf, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemcpyDtoH_v2(buf, p + 4 * MiB, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);

	/* cuMemSetAccess */
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	EXPECT(cuMemSetAccess(p, 8 * MiB, &d, 1), CUDA_ERROR_INVALID_VALUE); /* not fully mapped */
	EXPECT(cuMemSetAccess(p, 2 * MiB, &d, 1), CUDA_ERROR_INVALID_VALUE); /* part of a mapping */
	EXPECT(cuMemSetAccess(p, 4 * MiB, &d, 0), CUDA_ERROR_INVALID_VALUE);
	d.flags = (CUmemAccess_flags)2;
	EXPECT(cuMemSetAccess(p, 4 * MiB, &d, 1), CUDA_ERROR_INVALID_VALUE);
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	d.location.id = 3;
	EXPECT(cuMemSetAccess(p, 4 * MiB, &d, 1), CUDA_ERROR_INVALID_DEVICE);
	d.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; /* the CPU cannot map device memory */
	d.location.id = 0;
	EXPECT(cuMemSetAccess(p, 4 * MiB, &d, 1), CUDA_ERROR_INVALID_VALUE);

	/* Read-only access: reads work, writes fail. */
	allow(p, 4 * MiB, CU_MEM_ACCESS_FLAGS_PROT_READ);
	OK(cuMemcpyDtoH_v2(buf, p, sizeof(buf)));
	EXPECT(cuMemcpyHtoD_v2(p, buf, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemsetD8_v2(p, 1, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
	allow(p, 4 * MiB, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	OK(cuMemcpyHtoD_v2(p, buf, sizeof(buf)));
	/* A copy running off the end of the mapping into unmapped space. */
	EXPECT(cuMemcpyHtoD_v2(p + 4 * MiB - 32, buf, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
	allow(p, 4 * MiB, CU_MEM_ACCESS_FLAGS_PROT_NONE); /* revoked */
	EXPECT(cuMemcpyDtoH_v2(buf, p, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);

	/* VMM memory is not cuMemAlloc memory */
	EXPECT(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);

	/* cuMemUnmap, cuMemRelease, cuMemAddressFree */
	EXPECT(cuMemUnmap(p, 2 * MiB), CUDA_ERROR_INVALID_VALUE);            /* part of a mapping */
	EXPECT(cuMemUnmap(p + 4 * MiB, 2 * MiB), CUDA_ERROR_INVALID_VALUE);  /* nothing mapped */
	EXPECT(cuMemUnmap(p, 8 * MiB), CUDA_ERROR_INVALID_VALUE);            /* a gap */
	EXPECT(cuMemAddressFree(p, 8 * MiB), CUDA_ERROR_INVALID_VALUE);      /* still mapped */
	OK(cuMemUnmap(p, 4 * MiB));
	EXPECT(cuMemAddressFree(p, 4 * MiB), CUDA_ERROR_INVALID_VALUE);      /* not its size */
	EXPECT(cuMemAddressFree(p + GRANULE, 6 * MiB), CUDA_ERROR_INVALID_VALUE);
	OK(cuMemAddressFree(p, 8 * MiB));
	EXPECT(cuMemAddressFree(p, 8 * MiB), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemRelease(h + 1000), CUDA_ERROR_INVALID_VALUE);
	OK(cuMemRelease(h));
	EXPECT(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemGetAllocationPropertiesFromHandle(&prop, h), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemRetainAllocationHandle(&bad, (void *)(uintptr_t)p), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
	       CUDA_ERROR_INVALID_VALUE); /* released */
	OK(cuMemFree_v2(plain));
	CHECK(used() == 0);
}

/* Access is per device: a device's streams reach a mapping only as far as it was granted. */
static void case_peer_access(void)
{
	CUcontext ctx1;
	unsigned char buf[256];
	unsigned long long flags = 0;
	CUmemLocation dev1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};

	init_device(0);
	CUmemGenericAllocationHandle h = create(2 * MiB);
	CUdeviceptr p = reserve(2 * MiB);
	map_rw(p, 2 * MiB, h); /* device 0 only */
	round_trip(p, sizeof(buf), 1);
	OK(cuMemGetAccess(&flags, &dev1, p));
	CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
	int peer = -1;
	OK(cuDeviceCanAccessPeer(&peer, 1, 0));
	CHECK(peer == 1); /* SIMCUDA_PEER=1 */

	OK(cuDevicePrimaryCtxRetain(&ctx1, 1));
	OK(cuCtxSetCurrent(ctx1));
	EXPECT(cuMemcpyDtoH_v2(buf, p, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
	CUmemAccessDesc d = {dev1, CU_MEM_ACCESS_FLAGS_PROT_READ};
	OK(cuMemSetAccess(p, 2 * MiB, &d, 1));
	OK(cuMemGetAccess(&flags, &dev1, p));
	CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READ);
	OK(cuMemcpyDtoH_v2(buf, p, sizeof(buf)));
	EXPECT(cuMemcpyHtoD_v2(p, buf, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemsetD8_v2(p, 0, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	OK(cuMemSetAccess(p, 2 * MiB, &d, 1));
	round_trip(p, sizeof(buf), 2);
	CHECK(used() == 0); /* device 1 holds none of it */
}

/*
 * A captured graph is held to the access its launch stream's device has
 * when it is launched, as a direct call is: a copy or memset into memory
 * made read-only, or granted to another device only, since the capture is
 * refused and writes nothing.
 */
static void case_graph_access(void)
{
	CUstream s, s1;
	CUgraph g;
	CUgraphExec x;
	CUcontext ctx1;
	unsigned char buf[4096];

	init_device(0);
	CUmemGenericAllocationHandle h = create(2 * MiB);
	CUdeviceptr p = reserve(2 * MiB);
	map_rw(p, 2 * MiB, h);
	OK(cuMemsetD8_v2(p, 0x11, sizeof(buf)));
	OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	OK(cuMemsetD8Async(p, 0x22, sizeof(buf), s));
	OK(cuMemcpyHtoDAsync_v2(p + sizeof(buf), buf, sizeof(buf), s));
	OK(cuStreamEndCapture(s, &g));
	OK(cuGraphInstantiateWithFlags(&x, g, 0));

	allow(p, 2 * MiB, CU_MEM_ACCESS_FLAGS_PROT_READ);
	EXPECT(cuMemsetD8Async(p, 0x22, sizeof(buf), s), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuGraphLaunch(x, s), CUDA_ERROR_INVALID_VALUE);
	OK(cuStreamSynchronize(s));
	OK(cuMemcpyDtoH_v2(buf, p, sizeof(buf)));
	for (size_t i = 0; i < sizeof(buf); i++)
		CHECK(buf[i] == 0x11); /* the memset did not run */

	/* Granted to device 1 only: device 0's launch is refused, device 1's runs. */
	CUmemAccessDesc d[2] = {
		{{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_NONE},
		{{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
	};
	OK(cuMemSetAccess(p, 2 * MiB, d, 2));
	EXPECT(cuGraphLaunch(x, s), CUDA_ERROR_INVALID_VALUE);
	OK(cuDevicePrimaryCtxRetain(&ctx1, 1));
	OK(cuCtxSetCurrent(ctx1));
	OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
	OK(cuGraphLaunch(x, s1));
	OK(cuStreamSynchronize(s1));
	OK(cuMemcpyDtoH_v2(buf, p, sizeof(buf)));
	for (size_t i = 0; i < sizeof(buf); i++)
		CHECK(buf[i] == 0x22);

	OK(cuGraphExecDestroy(x));
	OK(cuGraphDestroy(g));
	OK(cuStreamDestroy_v2(s1));
	OK(cuStreamDestroy_v2(s));
	OK(cuMemUnmap(p, 2 * MiB));
	OK(cuMemRelease(h));
	OK(cuMemAddressFree(p, 2 * MiB));
}

/* Without peers (the default), device 1 cannot be granted device 0's memory. */
static void case_no_peer(void)
{
	CUmemLocation dev1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
	int peer = -1;

	init_device(0);
	OK(cuDeviceCanAccessPeer(&peer, 1, 0));
	CHECK(peer == 0);
	CUmemGenericAllocationHandle h = create(2 * MiB);
	CUdeviceptr p = reserve(2 * MiB);
	map_rw(p, 2 * MiB, h);
	CUmemAccessDesc d = {dev1, CU_MEM_ACCESS_FLAGS_PROT_READ};
	EXPECT(cuMemSetAccess(p, 2 * MiB, &d, 1), CUDA_ERROR_INVALID_DEVICE);
	OK(cuMemUnmap(p, 2 * MiB));
	OK(cuMemRelease(h));
	OK(cuMemAddressFree(p, 2 * MiB));
}

/* A host function that blocks its stream until the pipe is written. */
static int gate[2];
static volatile int gate_opened;

static void gate_wait(void *arg)
{
	char c;
	(void)arg;
	CHECK(read(gate[0], &c, 1) == 1);
}

static void *open_gate_later(void *arg)
{
	struct timespec delay = {0, 100 * 1000 * 1000};
	(void)arg;
	nanosleep(&delay, NULL); /* lets the main thread reach cuMemUnmap first */
	gate_opened = 1;
	CHECK(write(gate[1], "x", 1) == 1);
	return NULL;
}

/*
 * cuMemUnmap is synchronous: a copy still queued into the range completes
 * before the range goes (a worker writing into an unmapped range would crash).
 */
static void case_unmap_waits(void)
{
	CUstream s;
	pthread_t opener;
	unsigned char *src = malloc(2 * MiB);

	CHECK(src != NULL && pipe(gate) == 0);
	init_device(0);
	CUmemGenericAllocationHandle h = create(2 * MiB);
	CUdeviceptr p = reserve(2 * MiB);
	map_rw(p, 2 * MiB, h);
	OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(cuLaunchHostFunc(s, gate_wait, NULL));
	fill(src, 2 * MiB, 8);
	OK(cuMemcpyHtoDAsync_v2(p, src, 2 * MiB, s)); /* staged: returns at once */
	EXPECT(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
	CHECK(pthread_create(&opener, NULL, open_gate_later, NULL) == 0);
	OK(cuMemUnmap(p, 2 * MiB));
	CHECK(gate_opened);
	OK(cuStreamQuery(s)); /* the copy ran before the unmap returned */
	CHECK(pthread_join(opener, NULL) == 0);
	/* The bytes went into the handle: map it again and look. Like every new
	 * mapping, the new one starts without access, whatever the old one had. */
	OK(cuMemMap(p, 2 * MiB, 0, h, 0));
	CUmemLocation dev0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	unsigned long long flags = 1;
	OK(cuMemGetAccess(&flags, &dev0, p));
	CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
	allow(p, 2 * MiB, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	check_pattern(p, 2 * MiB, 8);
	OK(cuMemUnmap(p, 2 * MiB));
	OK(cuMemRelease(h));
	OK(cuMemAddressFree(p, 2 * MiB));
	OK(cuStreamDestroy_v2(s));
	free(src);
}

/* Device-located VMM memory competes with cuMemAlloc for the same capacity. */
static void case_capacity(void)
{
	CUdeviceptr plain;
	CUmemGenericAllocationHandle h, bad;
	CUmemAllocationProp prop = device_prop(0);

	init_device(0);
	OK(cuMemAlloc_v2(&plain, 26 * MiB));
	EXPECT(cuMemCreate(&bad, 8 * MiB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
	OK(cuMemCreate(&h, 6 * MiB, &prop, 0));
	CHECK(used() == 32 * MiB);
	CUdeviceptr more;
	EXPECT(cuMemAlloc_v2(&more, 512), CUDA_ERROR_OUT_OF_MEMORY);
	OK(cuMemRelease(h));
	OK(cuMemAlloc_v2(&more, 512));
}

static void case_host_numa(void)
{
	CUmemAllocationProp prop = device_prop(0);
	CUmemGenericAllocationHandle h, dev_h;

	init_device(0);
	prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
	prop.location.id = 0;
	OK(cuMemCreate(&h, 4 * MiB, &prop, 0));
	CHECK(used() == 0); /* host memory takes nothing on the device */
	CUdeviceptr p = reserve(4 * MiB);
	OK(cuMemMap(p, 4 * MiB, 0, h, 0));
	CUmemAccessDesc d[2] = {
		{{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
		{{CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
	};
	d[1].location.id = 7; /* CUDA ignores a host NUMA location's id in a grant */
	OK(cuMemSetAccess(p, 4 * MiB, d, 2));
	d[1].location.id = 0;
	unsigned long long flags = 0;
	OK(cuMemGetAccess(&flags, &d[1].location, p));
	CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	/* With host access the CPU reads and writes it directly, the device sees the same bytes. */
	unsigned char *cpu = (unsigned char *)(uintptr_t)p;
	cpu[4096] = 0x42;
	unsigned char c = 0;
	OK(cuMemcpyDtoH_v2(&c, p + 4096, 1));
	CHECK(c == 0x42);
	OK(cuMemsetD8_v2(p + 5, 0x17, 1));
	CHECK(cpu[5] == 0x17);
	unsigned int type = 0;
	OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p));
	CHECK(type == CU_MEMORYTYPE_HOST);
	/* As for device memory, cuMemGetAddressRange answers the mapping and the
	 * range attributes the reservation: here the same 4 MiB. */
	CUdeviceptr start = 0, attr_start = 0;
	size_t size = 0, attr_size = 0;
	OK(cuMemGetAddressRange_v2(&start, &size, p + 3 * MiB));
	CHECK(start == p && size == 4 * MiB);
	OK(cuPointerGetAttribute(&attr_start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 3 * MiB));
	OK(cuPointerGetAttribute(&attr_size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 3 * MiB));
	CHECK(attr_start == p && attr_size == 4 * MiB);
	/* left alive at exit, with 2 MiB of device memory, for the statistics */
	dev_h = create(2 * MiB);
	CHECK(used() == 2 * MiB);
	(void)dev_h;
}

/*
 * PyTorch's expandable segments: one big reservation; as the segment grows,
 * a handle per granule is created, mapped at the end and made accessible; as
 * it shrinks, the top granules are unmapped and released.
 */
static void case_expandable(void)
{
	enum { MAX = 64, GROW = 48, SHRINK_TO = 8 };
	CUmemGenericAllocationHandle hs[MAX];

	init_device(0);
	CUdeviceptr seg = reserve(MAX * GRANULE);
	for (int n = 0; n < GROW; n++) {
		hs[n] = create(GRANULE);
		CHECK(used() == (size_t)(n + 1) * GRANULE);
		map_rw(seg + (size_t)n * GRANULE, GRANULE, hs[n]);
		round_trip(seg + (size_t)n * GRANULE, GRANULE, (unsigned)n);
		CHECK(used() == (size_t)(n + 1) * GRANULE);
	}
	/* A tensor spanning every granule, written and read in one copy each. */
	round_trip(seg + 100, (size_t)GROW * GRANULE - 200, 99);
	for (int n = GROW; n > SHRINK_TO; n--) {
		OK(cuMemUnmap(seg + (size_t)(n - 1) * GRANULE, GRANULE));
		OK(cuMemRelease(hs[n - 1]));
		CHECK(used() == (size_t)(n - 1) * GRANULE);
	}
	/* Grow again into the same addresses. */
	for (int n = SHRINK_TO; n < SHRINK_TO + 4; n++) {
		hs[n] = create(GRANULE);
		map_rw(seg + (size_t)n * GRANULE, GRANULE, hs[n]);
		CHECK(used() == (size_t)(n + 1) * GRANULE);
	}
	round_trip(seg, (size_t)(SHRINK_TO + 4) * GRANULE, 1);
	for (int n = SHRINK_TO + 4; n > 0; n--) {
		OK(cuMemUnmap(seg + (size_t)(n - 1) * GRANULE, GRANULE));
		OK(cuMemRelease(hs[n - 1]));
		CHECK(used() == (size_t)(n - 1) * GRANULE);
	}
	OK(cuMemAddressFree(seg, MAX * GRANULE));
}

/*
 * vLLM's sleep mode: weights and cache live in handles mapped into fixed
 * ranges; sleeping copies what must survive to the host, then unmaps and
 * releases everything; waking creates new handles, maps them at the same
 * addresses and restores the bytes.
 */
static void case_sleep(void)
{
	enum { N = 4 };
	const size_t chunk = 8 * MiB;
	CUmemGenericAllocationHandle hs[N];
	unsigned char *saved = malloc(N * chunk);

	CHECK(saved != NULL);
	init_device(0);
	CUdeviceptr base = reserve(N * chunk);
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < N; i++) {
			hs[i] = create(chunk);
			map_rw(base + i * chunk, chunk, hs[i]);
			CHECK(used() == (size_t)(i + 1) * chunk);
		}
		if (round == 0) {
			fill(saved, N * chunk, 42);
			OK(cuMemcpyHtoD_v2(base, saved, N * chunk));
		} else {
			OK(cuMemcpyHtoD_v2(base, saved, N * chunk)); /* wake: restore */
			check_pattern(base, N * chunk, 42);
		}
		OK(cuMemcpyDtoH_v2(saved, base, N * chunk)); /* sleep: offload */
		for (int i = 0; i < N; i++) {
			OK(cuMemUnmap(base + i * chunk, chunk));
			OK(cuMemRelease(hs[i]));
			CHECK(used() == (size_t)(N - 1 - i) * chunk);
		}
		CHECK(used() == 0);
	}
	OK(cuMemAddressFree(base, N * chunk));
	free(saved);
}

/*
 * POSIX file descriptor handles: an import in this process is the same
 * allocation; a process that imports the descriptor maps the same bytes and
 * is not charged for them.
 */
static const char *self_path;

static void case_share(void)
{
	CUmemAllocationProp prop = device_prop(0);
	CUmemGenericAllocationHandle h, same;
	int fd = -1;

	init_device(0);
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	OK(cuMemCreate(&h, 4 * MiB, &prop, 0));
	CUdeviceptr p = reserve(4 * MiB);
	map_rw(p, 4 * MiB, h);
	round_trip(p, 4 * MiB, 21);
	OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CHECK(fd >= 0);
	OK(cuMemImportFromShareableHandle(&same, (void *)(intptr_t)fd,
					  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	CHECK(same == h);
	OK(cuMemRelease(same));
	CHECK(used() == 4 * MiB);

	/* The child checks the bytes, writes its own, and exits. */
	CHECK(fcntl(fd, F_SETFD, 0) == 0);
	char arg[16];
	snprintf(arg, sizeof(arg), "%d", fd);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		execl(self_path, self_path, "share_child", arg, (char *)NULL);
		_exit(127);
	}
	int status;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	check_pattern(p, 4 * MiB, 22);
	CHECK(close(fd) == 0);
	OK(cuMemUnmap(p, 4 * MiB));
	OK(cuMemRelease(h));
	CHECK(used() == 0);
	OK(cuMemAddressFree(p, 4 * MiB));
}

static void share_child(int fd)
{
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop;

	current_case = "share_child";
	init_device(0);
	OK(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
					  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	OK(cuMemGetAllocationPropertiesFromHandle(&prop, h));
	CHECK(prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop.location.id == 0);
	/* The device holds the exporter's 4 MiB once: importing charges nothing more. */
	CHECK(used() == 4 * MiB);
	CUdeviceptr p = reserve(4 * MiB);
	map_rw(p, 4 * MiB, h);
	check_pattern(p, 4 * MiB, 21);
	unsigned char *buf = malloc(4 * MiB);
	CHECK(buf != NULL);
	fill(buf, 4 * MiB, 22);
	OK(cuMemcpyHtoD_v2(p, buf, 4 * MiB));
	OK(cuMemUnmap(p, 4 * MiB));
	OK(cuMemRelease(h));
	OK(cuMemAddressFree(p, 4 * MiB));
	free(buf);
}

/*
 * A process that sees the devices under other ordinals (CUDA_VISIBLE_DEVICES)
 * imports the memory where it lives: device 1 here is the child's device 0
 * when it sees only that one, and cannot be imported by a child that sees
 * only device 0.
 */
static void case_share_visible(void)
{
	CUmemAllocationProp prop = device_prop(1);
	CUmemGenericAllocationHandle h;
	int fd = -1;

	init_device(1);
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	OK(cuMemCreate(&h, 2 * MiB, &prop, 0));
	CUdeviceptr p = reserve(2 * MiB);
	OK(cuMemMap(p, 2 * MiB, 0, h, 0));
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	OK(cuMemSetAccess(p, 2 * MiB, &d, 1));
	round_trip(p, 2 * MiB, 31);
	OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CHECK(fcntl(fd, F_SETFD, 0) == 0);
	char arg[16];
	snprintf(arg, sizeof(arg), "%d", fd);
	static const char *const visible[] = {"1", "0"};
	for (int i = 0; i < 2; i++) {
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			setenv("CUDA_VISIBLE_DEVICES", visible[i], 1);
			execl(self_path, self_path, "share_visible_child", arg, visible[i], (char *)NULL);
			_exit(127);
		}
		int status;
		CHECK(waitpid(pid, &status, 0) == pid);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	check_pattern(p, 2 * MiB, 32);
	CHECK(close(fd) == 0);
	OK(cuMemUnmap(p, 2 * MiB));
	OK(cuMemRelease(h));
	OK(cuMemAddressFree(p, 2 * MiB));
}

/* The child of case_share_visible, seeing only the device visible names. */
static void share_visible_child(int fd, const char *visible)
{
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop;

	current_case = "share_visible_child";
	init_device(0);
	if (strcmp(visible, "0") == 0) {
		/* The memory lives on a device this process does not see. */
		EXPECT(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
						      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		       CUDA_ERROR_INVALID_DEVICE);
		return;
	}
	OK(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
					  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	OK(cuMemGetAllocationPropertiesFromHandle(&prop, h));
	CHECK(prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop.location.id == 0);
	CHECK(used() == 2 * MiB); /* the parent's, on the device this process calls 0 */
	CUdeviceptr p = reserve(2 * MiB);
	map_rw(p, 2 * MiB, h); /* device 0's own memory: no peer access needed */
	check_pattern(p, 2 * MiB, 31);
	unsigned char *buf = malloc(2 * MiB);
	CHECK(buf != NULL);
	fill(buf, 2 * MiB, 32);
	OK(cuMemcpyHtoD_v2(p, buf, 2 * MiB));
	OK(cuMemUnmap(p, 2 * MiB));
	OK(cuMemRelease(h));
	OK(cuMemAddressFree(p, 2 * MiB));
	free(buf);
}

static void case_no_vmm(void)
{
	CUmemAllocationProp prop = device_prop(0);
	CUmemGenericAllocationHandle h;
	CUdeviceptr p;
	size_t g;
	int v = -1;

	init_device(0);
	OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
	CHECK(v == 0);
	OK(cuDeviceGetAttribute(&v, (CUdevice_attribute)103, 0)); /* POSIX fd handles */
	CHECK(v == 0);
	EXPECT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
	       CUDA_ERROR_NOT_SUPPORTED);
	EXPECT(cuMemAddressReserve(&p, GRANULE, 0, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
	EXPECT(cuMemCreate(&h, GRANULE, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
	EXPECT(cuMemMap(0, GRANULE, 0, 1, 0), CUDA_ERROR_NOT_SUPPORTED);
	EXPECT(cuMemRelease(1), CUDA_ERROR_NOT_SUPPORTED);
	CHECK(used() == 0);
}

/*
 * SIMCUDA_NO_HOST_ACCESS=1: a host location is refused in a grant, alone or
 * beside a device, and the grant changes nothing; the device's own grant
 * still works, so host-located memory serves the device.
 */
static void case_no_host_access(void)
{
	CUmemAllocationProp prop = device_prop(0);
	CUmemGenericAllocationHandle h;

	init_device(0);
	prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
	prop.location.id = 0;
	OK(cuMemCreate(&h, GRANULE, &prop, 0));
	CUdeviceptr p = reserve(GRANULE);
	OK(cuMemMap(p, GRANULE, 0, h, 0));
	CUmemAccessDesc d[2] = {
		{{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
		{{CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
	};
	EXPECT(cuMemSetAccess(p, GRANULE, d, 2), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemSetAccess(p, GRANULE, &d[1], 1), CUDA_ERROR_INVALID_VALUE);
	unsigned long long flags = 1;
	OK(cuMemGetAccess(&flags, &d[0].location, p));
	CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
	OK(cuMemGetAccess(&flags, &d[1].location, p));
	CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
	OK(cuMemSetAccess(p, GRANULE, d, 1));
	round_trip(p, GRANULE, 33);
	OK(cuMemUnmap(p, GRANULE));
	OK(cuMemRelease(h));
	OK(cuMemAddressFree(p, GRANULE));
}

/* The VMM entry points are reachable through cuGetProcAddress, as the runtime finds them. */
static void case_proc_address(void)
{
	static const struct {
		const char *name;
		void *fn;
	} procs[] = {
		{"cuMemGetAllocationGranularity", (void *)cuMemGetAllocationGranularity},
		{"cuMemAddressReserve", (void *)cuMemAddressReserve},
		{"cuMemAddressFree", (void *)cuMemAddressFree},
		{"cuMemCreate", (void *)cuMemCreate},
		{"cuMemRelease", (void *)cuMemRelease},
		{"cuMemMap", (void *)cuMemMap},
		{"cuMemUnmap", (void *)cuMemUnmap},
		{"cuMemSetAccess", (void *)cuMemSetAccess},
		{"cuMemGetAccess", (void *)cuMemGetAccess},
		{"cuMemRetainAllocationHandle", (void *)cuMemRetainAllocationHandle},
		{"cuMemGetAllocationPropertiesFromHandle",
		 (void *)cuMemGetAllocationPropertiesFromHandle},
		{"cuMemExportToShareableHandle", (void *)cuMemExportToShareableHandle},
		{"cuMemImportFromShareableHandle", (void *)cuMemImportFromShareableHandle},
	};
	CUdriverProcAddressQueryResult status;
	void *fn;

	OK(cuInit(0));
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
		fn = NULL;
		OK(cuGetProcAddress_v2(procs[i].name, &fn, 12040, 0, &status));
		CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS && fn == procs[i].fn);
	}
	OK(cuGetProcAddress_v2("cuMemCreate", &fn, 10010, 0, &status));
	CHECK(status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT && fn == NULL);
}

/*
 * A range grown by reserving right after it, as NVIDIA's VectorMemMap sample
 * does: access is set and the whole run unmapped across the two reservations
 * in one call each, and each reservation is freed on its own.
 */
static void case_adjacent(void)
{
	init_device(0);
	/* Reserved next to a, above it or below (the hint is honoured where the
	 * range is free; simcuda's own view of a may lie on one side). */
	CUdeviceptr a = reserve(2 * MiB), b;
	OK(cuMemAddressReserve(&b, 2 * MiB, 0, a + 2 * MiB, 0));
	if (b != a + 2 * MiB) {
		OK(cuMemAddressFree(b, 2 * MiB));
		OK(cuMemAddressReserve(&b, 2 * MiB, 0, a - 2 * MiB, 0));
		CHECK(b == a - 2 * MiB);
		CUdeviceptr low = b;
		b = a;
		a = low;
	}
	CUmemGenericAllocationHandle h = create(2 * MiB), other = create(2 * MiB);
	OK(cuMemMap(a, 2 * MiB, 0, h, 0));
	OK(cuMemMap(b, 2 * MiB, 0, other, 0));
	allow(a, 4 * MiB, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	round_trip(a, 2 * MiB, 5);
	round_trip(b, 2 * MiB, 6);
	EXPECT(cuMemUnmap(a, 3 * MiB), CUDA_ERROR_INVALID_VALUE); /* part of a mapping */
	OK(cuMemUnmap(a, 4 * MiB));
	EXPECT(cuMemUnmap(b, 2 * MiB), CUDA_ERROR_INVALID_VALUE); /* already unmapped */
	OK(cuMemRelease(h));
	OK(cuMemRelease(other));
	CHECK(used() == 0);
	EXPECT(cuMemAddressFree(a, 4 * MiB), CUDA_ERROR_INVALID_VALUE); /* two reservations */
	OK(cuMemAddressFree(a, 2 * MiB));
	OK(cuMemAddressFree(b, 2 * MiB));
}

static const struct test_case cases[] = {
	{"granularity", case_granularity},
	{"round_trip", case_round_trip},
	{"shared", case_shared},
	{"adjacent", case_adjacent},
	{"release_before_unmap", case_release_before_unmap},
	{"count_once", case_count_once},
	{"errors", case_errors},
	{"capacity", case_capacity},
	{"unmap_waits", case_unmap_waits},
	{"peer_access", case_peer_access},
	{"graph_access", case_graph_access},
	{"no_peer", case_no_peer},
	{"host_numa", case_host_numa},
	{"expandable", case_expandable},
	{"sleep", case_sleep},
	{"share", case_share},
	{"share_visible", case_share_visible},
	{"no_vmm", case_no_vmm},
	{"no_host_access", case_no_host_access},
	{"proc_address", case_proc_address},
};

int main(int argc, char **argv)
{
	self_path = argv[0];
	if (argc == 3 && strcmp(argv[1], "share_child") == 0) {
		share_child(atoi(argv[2]));
		return 0;
	}
	if (argc == 4 && strcmp(argv[1], "share_visible_child") == 0) {
		share_visible_child(atoi(argv[2]), argv[3]);
		return 0;
	}
	return run_case(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
