/*
 * arrays.c - CUDA arrays in the simulated driver: cuArrayCreate_v2,
 * cuArray3DCreate_v2, cuArrayDestroy, their descriptors and
 * cuArrayGetMemoryRequirements, with the argument rules of the CUDA 12.4
 * driver API reference.
 *
 * An array has no bytes here (nothing can copy into one: the 2D/3D and
 * array copies are not simulated), but it takes device capacity as on a GPU:
 * width x height x depth elements of its format, rounded up to
 * ARRAY_GRANULE, count in the device's plain_bytes (so in device_bytes,
 * capacity checks and NVML) from its creation until it is destroyed, or its
 * context is. An array made with CUDA_ARRAY3D_DEFERRED_MAPPING has no memory
 * of its own (it would be mapped onto cuMemCreate memory, which
 * cuMemMapArrayAsync, not provided, does) and takes nothing. Handles are
 * looked up in a list before use, so a stale or foreign handle is refused,
 * never dereferenced. Guarded by sim.lock.
 */
#include "driver.h"

#include <stdlib.h>

/* What an array is charged in: the texture alignment (CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT). */
#define ARRAY_GRANULE 512u
/* cuArrayGetMemoryRequirements' alignment: what mapping needs (the VMM granularity). */
#define ARRAY_MAP_ALIGNMENT ((size_t)2 << 20)

#define ARRAY_MAGIC 0x41525259u /* "ARRY" */

/* The flags cuArray3DCreate_v2 knows (CUDA 12.4). */
#define ARRAY_KNOWN_FLAGS                                                                       \
	(CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_CUBEMAP |              \
	 CUDA_ARRAY3D_TEXTURE_GATHER | CUDA_ARRAY3D_DEPTH_TEXTURE | CUDA_ARRAY3D_COLOR_ATTACHMENT | \
	 CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)

/* The texture limits of driver.c's attribute table, by CUdevice_attribute value. */
enum {
	ATTR_TEX1D_WIDTH = 21,
	ATTR_TEX2D_WIDTH = 22,
	ATTR_TEX2D_HEIGHT = 23,
	ATTR_TEX3D_WIDTH = 24,
	ATTR_TEX3D_HEIGHT = 25,
	ATTR_TEX3D_DEPTH = 26,
	ATTR_TEX2D_LAYERED_WIDTH = 27,
	ATTR_TEX2D_LAYERED_HEIGHT = 28,
	ATTR_TEX2D_LAYERED_LAYERS = 29,
	ATTR_TEX1D_LAYERED_WIDTH = 42,
	ATTR_TEX1D_LAYERED_LAYERS = 43,
	ATTR_TEX2D_GATHER_WIDTH = 45,
	ATTR_TEX2D_GATHER_HEIGHT = 46,
	ATTR_CUBEMAP_WIDTH = 52,
	ATTR_CUBEMAP_LAYERED_WIDTH = 53,
	ATTR_CUBEMAP_LAYERED_LAYERS = 54,
};

struct CUarray_st {
	uint32_t magic;
	struct CUctx_st *ctx; /* destroyed with it */
	int device;
	CUDA_ARRAY3D_DESCRIPTOR desc;
	uint64_t bytes;  /* its footprint: elements times element size, in ARRAY_GRANULEs */
	uint64_t charge; /* what it takes on the device: bytes, or 0 for a deferred mapping */
	struct CUarray_st *next;
};

static struct CUarray_st *arrays;
static uint64_t array_bytes[SIMCUDA_MAX_DEVICES];

static struct CUarray_st *array_find(CUarray handle)
{
	for (struct CUarray_st *a = arrays; a != NULL; a = a->next)
		if (a == handle)
			return a;
	return NULL;
}

/* Bytes of one component of format; 0 for a format simcuda does not simulate. */
static unsigned int component_bytes(CUarray_format format)
{
	switch (format) {
	case CU_AD_FORMAT_UNSIGNED_INT8:
	case CU_AD_FORMAT_SIGNED_INT8: return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16:
	case CU_AD_FORMAT_SIGNED_INT16:
	case CU_AD_FORMAT_HALF: return 2;
	case CU_AD_FORMAT_UNSIGNED_INT32:
	case CU_AD_FORMAT_SIGNED_INT32:
	case CU_AD_FORMAT_FLOAT: return 4;
	default: return 0;
	}
}

/* Whether format is one of CUDA 12.4's others (NV12, normalized, block-compressed). */
static int other_known_format(CUarray_format format)
{
	return format == CU_AD_FORMAT_NV12 ||
	       (format >= CU_AD_FORMAT_UNORM_INT8X1 && format <= CU_AD_FORMAT_SNORM_INT16X4) ||
	       (format >= CU_AD_FORMAT_BC1_UNORM && format <= CU_AD_FORMAT_BC7_UNORM_SRGB);
}

static int within(size_t v, int attrib)
{
	return v >= 1 && v <= (size_t)sim_device_limit(attrib);
}

/*
 * The documented shapes: 1D (height and depth 0), 2D (depth 0), 3D; with
 * CUDA_ARRAY3D_LAYERED a 1D (height 0) or 2D layered array of depth layers;
 * with CUDA_ARRAY3D_CUBEMAP six square faces (depth 6), or, layered, a
 * multiple of six. Each extent within the device's texture limits;
 * CUDA_ARRAY3D_TEXTURE_GATHER only on a 2D array.
 */
static int valid_shape(const CUDA_ARRAY3D_DESCRIPTOR *d)
{
	unsigned int shape = d->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP);
	size_t w = d->Width, h = d->Height, depth = d->Depth;

	if ((d->Flags & CUDA_ARRAY3D_TEXTURE_GATHER) && (shape != 0 || h == 0 || depth != 0))
		return 0;
	switch (shape) {
	case 0:
		if (h == 0 && depth == 0)
			return within(w, ATTR_TEX1D_WIDTH);
		if (depth == 0 && (d->Flags & CUDA_ARRAY3D_TEXTURE_GATHER))
			return within(w, ATTR_TEX2D_GATHER_WIDTH) && within(h, ATTR_TEX2D_GATHER_HEIGHT);
		if (depth == 0)
			return within(w, ATTR_TEX2D_WIDTH) && within(h, ATTR_TEX2D_HEIGHT);
		return within(w, ATTR_TEX3D_WIDTH) && within(h, ATTR_TEX3D_HEIGHT) &&
		       within(depth, ATTR_TEX3D_DEPTH);
	case CUDA_ARRAY3D_LAYERED:
		if (h == 0)
			return within(w, ATTR_TEX1D_LAYERED_WIDTH) && within(depth, ATTR_TEX1D_LAYERED_LAYERS);
		return within(w, ATTR_TEX2D_LAYERED_WIDTH) && within(h, ATTR_TEX2D_LAYERED_HEIGHT) &&
		       within(depth, ATTR_TEX2D_LAYERED_LAYERS);
	case CUDA_ARRAY3D_CUBEMAP:
		return w == h && depth == 6 && within(w, ATTR_CUBEMAP_WIDTH);
	default: /* cubemap layered */
		return w == h && depth % 6 == 0 && within(w, ATTR_CUBEMAP_LAYERED_WIDTH) &&
		       within(depth, ATTR_CUBEMAP_LAYERED_LAYERS);
	}
}

/* Checks d as cuArray3DCreate_v2 does; sets *bytes, its footprint. */
static CUresult check_descriptor(const CUDA_ARRAY3D_DESCRIPTOR *d, uint64_t *bytes)
{
	unsigned int size = component_bytes(d->Format);

	if (size == 0)
		return other_known_format(d->Format) ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
	if ((d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4) ||
	    (d->Flags & ~(unsigned int)ARRAY_KNOWN_FLAGS) || !valid_shape(d))
		return CUDA_ERROR_INVALID_VALUE;
	/* The device reports no sparse arrays (SPARSE_CUDA_ARRAY_SUPPORTED is 0). */
	if (d->Flags & CUDA_ARRAY3D_SPARSE)
		return CUDA_ERROR_NOT_SUPPORTED;
	/* The limits keep this far below 2^64. */
	uint64_t n = (uint64_t)d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) *
		     d->NumChannels * size;
	*bytes = (n + ARRAY_GRANULE - 1) / ARRAY_GRANULE * ARRAY_GRANULE;
	return CUDA_SUCCESS;
}

static CUresult array_create(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
	uint64_t bytes = 0;
	int device;

	if (handle == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = check_descriptor(desc, &bytes);
	if (rc != CUDA_SUCCESS)
		return rc;
	uint64_t charge = desc->Flags & CUDA_ARRAY3D_DEFERRED_MAPPING ? 0 : bytes;
	if ((rc = capture_check_unsafe()) != CUDA_SUCCESS)
		return rc;
	if ((rc = sim_current_device(&device)) != CUDA_SUCCESS)
		return rc;
	struct CUarray_st *a = calloc(1, sizeof(*a));
	if (a == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	mem_refresh_others(device);
	pthread_mutex_lock(&sim.lock);
	struct sim_device *d = &sim.dev[device];
	uint64_t cap = d->others_bytes < d->capacity ? d->capacity - d->others_bytes : 0;
	if (charge > cap || d->plain_bytes + d->ctx_bytes > cap - charge ||
	    mem_make_room(device, charge, NULL) != 0) {
		pthread_mutex_unlock(&sim.lock);
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*a = (struct CUarray_st){.magic = ARRAY_MAGIC, .ctx = sim_current_ctx(), .device = device,
				 .desc = *desc, .bytes = bytes, .charge = charge, .next = arrays};
	arrays = a;
	d->plain_bytes += charge;
	array_bytes[device] += charge;
	mem_usage_changed(device);
	*handle = a;
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
	ENTER(ENTER_INIT);
	if (pAllocateArray == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = pAllocateArray->Width,
					.Height = pAllocateArray->Height,
					.Format = pAllocateArray->Format,
					.NumChannels = pAllocateArray->NumChannels};
	return array_create(pHandle, &desc);
}

SIM_API CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
	ENTER(ENTER_INIT);
	if (pAllocateArray == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	return array_create(pHandle, pAllocateArray);
}

/* Unlinks a and gives its bytes back; with sim.lock held. */
static void array_release(struct CUarray_st *a)
{
	struct CUarray_st **link = &arrays;
	while (*link != a)
		link = &(*link)->next;
	*link = a->next;
	sim.dev[a->device].plain_bytes -= a->charge;
	array_bytes[a->device] -= a->charge;
	mem_usage_changed(a->device);
	free(a);
}

SIM_API CUresult cuArrayDestroy(CUarray hArray)
{
	ENTER(ENTER_INIT);
	CUresult rc = capture_check_unsafe();
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&sim.lock);
	struct CUarray_st *a = array_find(hArray);
	if (a != NULL)
		array_release(a);
	pthread_mutex_unlock(&sim.lock);
	return a != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

void array_release_context(const struct CUctx_st *ctx)
{
	struct CUarray_st *next;
	for (struct CUarray_st *a = arrays; a != NULL; a = next) {
		next = a->next;
		if (a->ctx == ctx)
			array_release(a);
	}
}

uint64_t array_device_bytes(int device)
{
	return array_bytes[device];
}

/* Copies hArray into *out; CUDA_ERROR_INVALID_HANDLE for an unknown handle. */
static CUresult array_copy(CUarray hArray, struct CUarray_st *out)
{
	pthread_mutex_lock(&sim.lock);
	struct CUarray_st *a = array_find(hArray);
	if (a != NULL)
		*out = *a;
	pthread_mutex_unlock(&sim.lock);
	return a != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

SIM_API CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *pArrayDescriptor, CUarray hArray)
{
	struct CUarray_st a;

	ENTER(ENTER_INIT);
	if (pArrayDescriptor == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = array_copy(hArray, &a);
	if (rc == CUDA_SUCCESS)
		*pArrayDescriptor = (CUDA_ARRAY_DESCRIPTOR){.Width = a.desc.Width, .Height = a.desc.Height,
							    .Format = a.desc.Format,
							    .NumChannels = a.desc.NumChannels};
	return rc;
}

SIM_API CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *pArrayDescriptor, CUarray hArray)
{
	struct CUarray_st a;

	ENTER(ENTER_INIT);
	if (pArrayDescriptor == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = array_copy(hArray, &a);
	if (rc == CUDA_SUCCESS)
		*pArrayDescriptor = a.desc;
	return rc;
}

/*
 * As documented, only an array made with CUDA_ARRAY3D_DEFERRED_MAPPING has
 * requirements (CUDA_ERROR_INVALID_VALUE for any other): its footprint
 * rounded up to, and aligned as, the memory it would be mapped onto.
 */
SIM_API CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *memoryRequirements,
					      CUarray array, CUdevice device)
{
	struct CUarray_st a;

	ENTER(ENTER_INIT);
	if (memoryRequirements == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = array_copy(array, &a);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (!sim_valid_device(device))
		return CUDA_ERROR_INVALID_DEVICE;
	if (!(a.desc.Flags & CUDA_ARRAY3D_DEFERRED_MAPPING))
		return CUDA_ERROR_INVALID_VALUE;
	*memoryRequirements = (CUDA_ARRAY_MEMORY_REQUIREMENTS){
		.size = (a.bytes + ARRAY_MAP_ALIGNMENT - 1) / ARRAY_MAP_ALIGNMENT * ARRAY_MAP_ALIGNMENT,
		.alignment = ARRAY_MAP_ALIGNMENT};
	return CUDA_SUCCESS;
}
