/*
 * arrays.c - CUDA arrays in the simulated driver: cuArrayCreate_v2,
 * cuArray3DCreate_v2, cuArrayDestroy, their descriptors and
 * cuArrayGetMemoryRequirements, and mipmapped arrays (cuMipmappedArrayCreate,
 * cuMipmappedArrayDestroy, cuMipmappedArrayGetLevel), with the argument
 * rules of the CUDA 12.4 driver API reference.
 *
 * An array has no bytes here (nothing can copy into one: the 2D/3D and
 * array copies are not simulated), but it takes device capacity as on a GPU:
 * width x height x depth elements of its format, rounded up to
 * ARRAY_GRANULE, count in the device's plain_bytes (so in device_bytes,
 * capacity checks and NVML) from its creation until it is destroyed, or its
 * context is. An array made with CUDA_ARRAY3D_DEFERRED_MAPPING has no memory
 * of its own (it would be mapped onto cuMemCreate memory, which
 * cuMemMapArrayAsync, not provided, does) and takes nothing. A mipmapped
 * array takes the sum of its levels, each an array of its own extents (the
 * previous level's halved, never below 1), made with it and destroyed only
 * with it. Handles are looked up in a list before use, so a stale or
 * foreign handle is refused, never dereferenced. Guarded by sim.lock.
 */
#include "driver.h"

#include <stdlib.h>

/* What an array is charged in: the texture alignment (CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT). */
#define ARRAY_GRANULE 512u
/* cuArrayGetMemoryRequirements' alignment: what mapping needs (the VMM granularity). */
#define ARRAY_MAP_ALIGNMENT ((size_t)2 << 20)

#define ARRAY_MAGIC 0x41525259u /* "ARRY" */
#define MIPMAP_MAGIC 0x4d49504du /* "MIPM" */

/* The most levels a mipmapped array has: 1 + log2 of the widest extent the limits allow. */
#define MIPMAP_MAX_LEVELS 18

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
	ATTR_TEX2D_MIPMAPPED_WIDTH = 73,
	ATTR_TEX2D_MIPMAPPED_HEIGHT = 74,
	ATTR_TEX1D_MIPMAPPED_WIDTH = 77,
};

struct CUarray_st {
	uint32_t magic;
	struct CUctx_st *ctx; /* destroyed with it */
	int device;
	CUDA_ARRAY3D_DESCRIPTOR desc;
	uint64_t bytes;  /* its footprint: elements times element size, in ARRAY_GRANULEs */
	uint64_t charge; /* what it takes on the device: bytes, or 0 for a deferred mapping */
	/* The mipmapped array it is a level of (which takes its bytes and destroys it), or NULL. */
	struct CUmipmappedArray_st *mipmap;
	struct CUarray_st *next;
};

struct CUmipmappedArray_st {
	uint32_t magic;
	struct CUctx_st *ctx; /* destroyed with it */
	int device;
	unsigned int nlevels;
	struct CUarray_st *levels[MIPMAP_MAX_LEVELS];
	uint64_t charge; /* its levels' bytes, or 0 for a deferred mapping */
	struct CUmipmappedArray_st *next;
};

static struct CUarray_st *arrays;
static struct CUmipmappedArray_st *mipmaps;
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
 * multiple of six. Each extent within the device's texture limits, the
 * mipmapped ones for a mipmapped 1D or 2D array; CUDA_ARRAY3D_TEXTURE_GATHER
 * only on a 2D array.
 */
static int valid_shape(const CUDA_ARRAY3D_DESCRIPTOR *d, int mipmapped)
{
	unsigned int shape = d->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP);
	size_t w = d->Width, h = d->Height, depth = d->Depth;

	if ((d->Flags & CUDA_ARRAY3D_TEXTURE_GATHER) && (shape != 0 || h == 0 || depth != 0))
		return 0;
	switch (shape) {
	case 0:
		if (h == 0 && depth == 0)
			return within(w, mipmapped ? ATTR_TEX1D_MIPMAPPED_WIDTH : ATTR_TEX1D_WIDTH);
		if (depth == 0 && mipmapped)
			return within(w, ATTR_TEX2D_MIPMAPPED_WIDTH) && within(h, ATTR_TEX2D_MIPMAPPED_HEIGHT);
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

/* Checks d as cuArray3DCreate_v2 (or, mipmapped, cuMipmappedArrayCreate) does. */
static CUresult check_descriptor(const CUDA_ARRAY3D_DESCRIPTOR *d, int mipmapped)
{
	unsigned int size = component_bytes(d->Format);

	if (size == 0)
		return other_known_format(d->Format) ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
	if ((d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4) ||
	    (d->Flags & ~(unsigned int)ARRAY_KNOWN_FLAGS) || !valid_shape(d, mipmapped))
		return CUDA_ERROR_INVALID_VALUE;
	/* The device reports no sparse arrays (SPARSE_CUDA_ARRAY_SUPPORTED is 0). */
	if (d->Flags & CUDA_ARRAY3D_SPARSE)
		return CUDA_ERROR_NOT_SUPPORTED;
	return CUDA_SUCCESS;
}

/* The footprint of a valid descriptor, in ARRAY_GRANULEs (the limits keep it far below 2^64). */
static uint64_t footprint(const CUDA_ARRAY3D_DESCRIPTOR *d)
{
	uint64_t n = (uint64_t)d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) *
		     d->NumChannels * component_bytes(d->Format);
	return (n + ARRAY_GRANULE - 1) / ARRAY_GRANULE * ARRAY_GRANULE;
}

/*
 * Takes charge bytes of device's capacity for arrays, making room as the
 * allocations do; 0 when they do not fit. With sim.lock held.
 */
static int array_take(int device, uint64_t charge)
{
	struct sim_device *d = &sim.dev[device];
	uint64_t cap = d->others_bytes < d->capacity ? d->capacity - d->others_bytes : 0;
	if (charge > cap || d->plain_bytes + d->ctx_bytes > cap - charge ||
	    mem_make_room(device, charge, NULL) != 0)
		return 0;
	d->plain_bytes += charge;
	array_bytes[device] += charge;
	mem_usage_changed(device);
	return 1;
}

/* Gives back what array_take took; with sim.lock held. */
static void array_give(int device, uint64_t charge)
{
	sim.dev[device].plain_bytes -= charge;
	array_bytes[device] -= charge;
	mem_usage_changed(device);
}

static CUresult array_create(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
	int device;

	if (handle == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = check_descriptor(desc, 0);
	if (rc != CUDA_SUCCESS)
		return rc;
	uint64_t bytes = footprint(desc);
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
	if (!array_take(device, charge)) {
		pthread_mutex_unlock(&sim.lock);
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*a = (struct CUarray_st){.magic = ARRAY_MAGIC, .ctx = sim_current_ctx(), .device = device,
				 .desc = *desc, .bytes = bytes, .charge = charge, .next = arrays};
	arrays = a;
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
	array_give(a->device, a->charge);
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
	/* A mipmapped array's level is not the application's to destroy: only the whole is. */
	int mine = a != NULL && a->mipmap == NULL;
	if (mine)
		array_release(a);
	pthread_mutex_unlock(&sim.lock);
	return mine ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static struct CUmipmappedArray_st *mipmap_find(CUmipmappedArray handle)
{
	for (struct CUmipmappedArray_st *m = mipmaps; m != NULL; m = m->next)
		if (m == handle)
			return m;
	return NULL;
}

/* Unlinks m, destroys its levels and gives its bytes back; with sim.lock held. */
static void mipmap_release(struct CUmipmappedArray_st *m)
{
	struct CUmipmappedArray_st **link = &mipmaps;
	while (*link != m)
		link = &(*link)->next;
	*link = m->next;
	for (unsigned int i = 0; i < m->nlevels; i++)
		array_release(m->levels[i]);
	array_give(m->device, m->charge);
	free(m);
}

/*
 * The number of levels a mipmapped array of d gets for numMipmapLevels:
 * clamped, as documented, to [1, 1 + floor(log2(widest extent))], the
 * extents being those that halve from level to level (the layers of a
 * layered or cubemap array do not).
 */
static unsigned int mipmap_levels(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int numMipmapLevels)
{
	size_t widest = d->Width > d->Height ? d->Width : d->Height;
	if (!(d->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) && d->Depth > widest)
		widest = d->Depth;
	unsigned int most = 1;
	while (widest >> most != 0)
		most++;
	return numMipmapLevels < 1 ? 1 : numMipmapLevels > most ? most : numMipmapLevels;
}

/* An extent at the next level: halved, never below 1 (0, an absent extent, stays 0). */
static size_t halve(size_t extent)
{
	return extent > 1 ? extent / 2 : extent;
}

SIM_API CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
					const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
					unsigned int numMipmapLevels)
{
	int device;

	ENTER(ENTER_INIT);
	if (pHandle == NULL || pMipmappedArrayDesc == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = check_descriptor(pMipmappedArrayDesc, 1);
	if (rc != CUDA_SUCCESS)
		return rc;
	if ((rc = capture_check_unsafe()) != CUDA_SUCCESS)
		return rc;
	if ((rc = sim_current_device(&device)) != CUDA_SUCCESS)
		return rc;
	struct CUmipmappedArray_st *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	m->nlevels = mipmap_levels(pMipmappedArrayDesc, numMipmapLevels);
	CUDA_ARRAY3D_DESCRIPTOR level = *pMipmappedArrayDesc;
	int layered = level.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP);
	uint64_t bytes = 0;
	for (unsigned int i = 0; i < m->nlevels; i++) {
		if ((m->levels[i] = calloc(1, sizeof(struct CUarray_st))) == NULL) {
			while (i-- > 0)
				free(m->levels[i]);
			free(m);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		*m->levels[i] = (struct CUarray_st){.magic = ARRAY_MAGIC, .device = device, .desc = level,
						    .bytes = footprint(&level), .mipmap = m};
		bytes += m->levels[i]->bytes;
		level.Width = halve(level.Width);
		level.Height = halve(level.Height);
		if (!layered)
			level.Depth = halve(level.Depth);
	}
	uint64_t charge = pMipmappedArrayDesc->Flags & CUDA_ARRAY3D_DEFERRED_MAPPING ? 0 : bytes;
	mem_refresh_others(device);
	pthread_mutex_lock(&sim.lock);
	if (!array_take(device, charge)) {
		pthread_mutex_unlock(&sim.lock);
		for (unsigned int i = 0; i < m->nlevels; i++)
			free(m->levels[i]);
		free(m);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	m->magic = MIPMAP_MAGIC;
	m->ctx = sim_current_ctx();
	m->device = device;
	m->charge = charge;
	for (unsigned int i = 0; i < m->nlevels; i++) {
		m->levels[i]->ctx = m->ctx;
		m->levels[i]->next = arrays;
		arrays = m->levels[i];
	}
	m->next = mipmaps;
	mipmaps = m;
	*pHandle = m;
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
	ENTER(ENTER_INIT);
	CUresult rc = capture_check_unsafe();
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&sim.lock);
	struct CUmipmappedArray_st *m = mipmap_find(hMipmappedArray);
	if (m != NULL)
		mipmap_release(m);
	pthread_mutex_unlock(&sim.lock);
	return m != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* As documented: CUDA_ERROR_INVALID_VALUE for a level past the last. */
SIM_API CUresult cuMipmappedArrayGetLevel(CUarray *pLevelArray, CUmipmappedArray hMipmappedArray,
					  unsigned int level)
{
	ENTER(ENTER_INIT);
	if (pLevelArray == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	struct CUmipmappedArray_st *m = mipmap_find(hMipmappedArray);
	CUresult rc = m == NULL ? CUDA_ERROR_INVALID_HANDLE
		      : level >= m->nlevels ? CUDA_ERROR_INVALID_VALUE
					    : CUDA_SUCCESS;
	if (rc == CUDA_SUCCESS)
		*pLevelArray = m->levels[level];
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

void array_release_context(const struct CUctx_st *ctx)
{
	struct CUmipmappedArray_st *next_mipmap;
	for (struct CUmipmappedArray_st *m = mipmaps; m != NULL; m = next_mipmap) {
		next_mipmap = m->next;
		if (m->ctx == ctx)
			mipmap_release(m);
	}
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
