/*
 * arrays.c: CUDA arrays and mipmapped arrays, taken from the quota by their
 * footprint before the real call and given back when they are destroyed
 * (or their context is).
 */
#define _GNU_SOURCE

#include "front.h"

/*
 * An array's memory is charged its footprint, estimated from its
 * descriptor: CUDA tells an array's size only for one made with
 * CUDA_ARRAY3D_DEFERRED_MAPPING (cuArrayGetMemoryRequirements refuses the
 * others), and a GPU lays arrays out in tiles, so this is the least one
 * takes. An array_unit is how its elements pack: bytes for each block of
 * width x height elements (1 x 1 but for NV12 and the block-compressed
 * formats).
 */
struct array_unit {
    uint64_t bytes, width, height;
};

static struct array_unit format_unit(CUarray_format format, unsigned int channels)
{
    /* The plain formats pack 1, 2 or 4 channels: CUDA refuses others, so nothing is counted. */
    uint64_t packed = channels == 1 || channels == 2 || channels == 4 ? channels : 0;
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return (struct array_unit){packed, 1, 1};
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return (struct array_unit){2 * packed, 1, 1};
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return (struct array_unit){4 * packed, 1, 1};
    case CU_AD_FORMAT_NV12: /* a byte of luma per element, chroma at half resolution */
        return (struct array_unit){3, 2, 1};
    case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1:
        return (struct array_unit){1, 1, 1};
    case CU_AD_FORMAT_UNORM_INT8X2:
    case CU_AD_FORMAT_SNORM_INT8X2:
    case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1:
        return (struct array_unit){2, 1, 1};
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4:
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2:
        return (struct array_unit){4, 1, 1};
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4:
        return (struct array_unit){8, 1, 1};
    case CU_AD_FORMAT_BC1_UNORM:
    case CU_AD_FORMAT_BC1_UNORM_SRGB:
    case CU_AD_FORMAT_BC4_UNORM:
    case CU_AD_FORMAT_BC4_SNORM:
        return (struct array_unit){8, 4, 4};
    default:
        if (format >= CU_AD_FORMAT_BC2_UNORM && format <= CU_AD_FORMAT_BC7_UNORM_SRGB)
            return (struct array_unit){16, 4, 4};
        /* A format of a later CUDA: the widest element an array has. */
        return (struct array_unit){16, 1, 1};
    }
}

/* The runtime's channel descriptor: its components' bits; NV12 and the
 * block-compressed kinds, whose components are a decoded texel's, as the
 * driver's formats. */
static struct array_unit channel_unit(const struct cudaChannelFormatDesc *desc)
{
    switch (desc->f) {
    case cudaChannelFormatKindNV12:
        return format_unit(CU_AD_FORMAT_NV12, 1);
    case cudaChannelFormatKindUnsignedBlockCompressed1:
    case cudaChannelFormatKindUnsignedBlockCompressed1SRGB:
    case cudaChannelFormatKindUnsignedBlockCompressed4:
    case cudaChannelFormatKindSignedBlockCompressed4:
        return format_unit(CU_AD_FORMAT_BC1_UNORM, 4); /* 8 bytes a block */
    case cudaChannelFormatKindUnsignedBlockCompressed2:
    case cudaChannelFormatKindUnsignedBlockCompressed2SRGB:
    case cudaChannelFormatKindUnsignedBlockCompressed3:
    case cudaChannelFormatKindUnsignedBlockCompressed3SRGB:
    case cudaChannelFormatKindUnsignedBlockCompressed5:
    case cudaChannelFormatKindSignedBlockCompressed5:
    case cudaChannelFormatKindUnsignedBlockCompressed6H:
    case cudaChannelFormatKindSignedBlockCompressed6H:
    case cudaChannelFormatKindUnsignedBlockCompressed7:
    case cudaChannelFormatKindUnsignedBlockCompressed7SRGB:
        return format_unit(CU_AD_FORMAT_BC2_UNORM, 4); /* 16 bytes a block */
    default:
        break;
    }
    if (desc->x < 0 || desc->y < 0 || desc->z < 0 || desc->w < 0)
        return (struct array_unit){0, 1, 1}; /* refused by CUDA */
    /* The plain kinds have 1, 2 or 4 components from x on, all of x's size:
     * CUDA refuses others (float3 the usual one), so nothing is counted. */
    if (desc->f == cudaChannelFormatKindSigned || desc->f == cudaChannelFormatKindUnsigned ||
        desc->f == cudaChannelFormatKindFloat) {
        int n = desc->y == 0 ? 1 : desc->z == 0 ? 2 : 4;
        if (desc->y != (n > 1 ? desc->x : 0) || desc->z != (n > 2 ? desc->x : 0) ||
            desc->w != (n > 2 ? desc->x : 0))
            return (struct array_unit){0, 1, 1};
    }
    uint64_t bits = (uint64_t)desc->x + (uint64_t)desc->y + (uint64_t)desc->z + (uint64_t)desc->w;
    return (struct array_unit){(bits + 7) / 8, 1, 1};
}

/*
 * The bytes an array of width x height x depth (0 counts as 1, but for the
 * width) units of u takes; 0 when it takes none of its own (a sparse or
 * deferred-mapping array, mapped onto cuMemCreate memory, which is counted)
 * or when CUDA refuses it anyway (a zero width or unit, extents whose
 * product overflows).
 */
static uint64_t array_footprint(struct array_unit u, uint64_t width, uint64_t height, uint64_t depth,
                                unsigned int flags)
{
    if (flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING))
        return 0;
    uint64_t extents[3] = {(width + u.width - 1) / u.width,
                           ((height ? height : 1) + u.height - 1) / u.height, depth ? depth : 1};
    uint64_t n = u.bytes;
    for (int i = 0; i < 3; i++) {
        if (extents[i] == 0 || (n && extents[i] > UINT64_MAX / n))
            return 0;
        n *= extents[i];
    }
    return n;
}

/* An extent at the next mipmap level: halved, never below 1 (0, an absent extent, stays 0). */
static uint64_t halve(uint64_t extent)
{
    return extent > 1 ? extent / 2 : extent;
}

/* A level's share of the ledger: whole 512-byte granules, as the ledger charges an array. */
#define LEVEL_GRANULE 512

/*
 * The bytes a mipmapped array takes: the sum of its levels' footprints,
 * each level halving the extents that shrink (width, height, and depth for
 * a 3D array only: a layered or cubemap array keeps its layers), with
 * levels clamped as CUDA documents to [1, 1 + floor(log2(widest extent))].
 * Each level is an array of its own, so each is rounded up to granules
 * before the sum: a single rounding would leave the small levels' granules
 * out. 0 where array_footprint gives 0 (nothing of its own, or refused
 * anyway).
 */
static uint64_t mipmap_footprint(struct array_unit u, uint64_t width, uint64_t height, uint64_t depth,
                                 unsigned int flags, unsigned int levels)
{
    int layered = (flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    uint64_t widest = width > height ? width : height;
    if (!layered && depth > widest)
        widest = depth;
    unsigned int most = 1;
    while (most < 64 && widest >> most != 0)
        most++;
    levels = levels < 1 ? 1 : levels > most ? most : levels;
    uint64_t total = 0;
    for (unsigned int i = 0; i < levels; i++) {
        uint64_t bytes = array_footprint(u, width, height, depth, flags);
        if (bytes == 0 || bytes > UINT64_MAX - LEVEL_GRANULE)
            return 0;
        bytes = (bytes + LEVEL_GRANULE - 1) / LEVEL_GRANULE * LEVEL_GRANULE;
        if (total > UINT64_MAX - bytes)
            return 0;
        total += bytes;
        width = halve(width);
        height = halve(height);
        if (!layered)
            depth = halve(depth);
    }
    return total;
}

/*
 * Creating and destroying an array and the core's record of it happen
 * under one lock, so that a handle CUDA reuses for a new array in another
 * thread is never recorded before the old one is forgotten. Creating one
 * also holds resets off (reset_lock, contexts.c), taken first.
 */
pthread_mutex_t arrays_lock = PTHREAD_MUTEX_INITIALIZER;

/* After the real creation of an array (or mipmapped array) of bytes taken on device in ctx
 * (NULL: the primary context): the core records it, or the bytes go back. */
static void array_made(int made, const void *handle, CUcontext ctx, int32_t device, uint64_t bytes,
                       int32_t kind)
{
    if (made)
        core.array_created((uint64_t)(uintptr_t)handle, (uint64_t)(uintptr_t)ctx, device, bytes);
    else
        core.give(device, bytes, kind);
}

/* A driver call making an array (or mipmapped array) in *handle from desc, with levels. */
typedef CUresult (*driver_make_fn)(void **handle, const void *desc, unsigned int levels);

/*
 * A driver array of bytes of kind is taken from the quota of its context's
 * device before the real call (refused with CUDA_ERROR_OUT_OF_MEMORY when it
 * does not fit: an array cannot live on the host, so oversubscription does
 * not take it either). In a primary context, the pool's, the pool may
 * synchronize to make room, as it does for its own allocations. Calls the
 * core cannot place (no current context, a null argument, nothing to count)
 * get the real driver's own answer; those while the core is not running pass
 * through uncounted and never load it.
 */
static CUresult driver_array(driver_make_fn make, void **handle, const void *desc, unsigned int levels,
                             uint64_t bytes, int32_t kind)
{
    enum route r = route();
    if (r == ROUTE_REFUSE)
        return CUDA_ERROR_NOT_INITIALIZED;
    int32_t device = 0;
    if (r != ROUTE_CORE || bytes == 0 || context_device(&device) != CUDA_SUCCESS)
        return make(handle, desc, levels);
    CUcontext ctx = current_created();
    depth++;
    CUresult rc = (CUresult)core.take(device, bytes, ctx ? kind : kind | SPILLWAY_TAKE_IN_PRIMARY);
    if (rc == CUDA_SUCCESS) {
        front_read_lock(&reset_lock);
        front_lock(&arrays_lock);
        rc = make(handle, desc, levels);
        array_made(rc == CUDA_SUCCESS, rc == CUDA_SUCCESS ? *handle : NULL, ctx, device, bytes, kind);
        pthread_mutex_unlock(&arrays_lock);
        pthread_rwlock_unlock(&reset_lock);
    }
    depth--;
    return rc;
}

/* The real cuArrayCreate_v2, cuArray3DCreate_v2 and cuMipmappedArrayCreate, in driver_make_fn's shape. */
static CUresult make_array(void **handle, const void *desc, unsigned int levels)
{
    (void)levels;
    REAL(real_create, cu_array_create);
    return real_create((CUarray *)handle, desc);
}

static CUresult make_3d_array(void **handle, const void *desc, unsigned int levels)
{
    (void)levels;
    REAL(real_create, cu_array_3d_create);
    return real_create((CUarray *)handle, desc);
}

static CUresult make_mipmapped_array(void **handle, const void *desc, unsigned int levels)
{
    REAL(real_create, cu_mipmapped_array_create);
    return real_create((CUmipmappedArray *)handle, desc, levels);
}

EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    const CUDA_ARRAY_DESCRIPTOR *d = pAllocateArray;
    uint64_t bytes =
        pHandle && d ? array_footprint(format_unit(d->Format, d->NumChannels), d->Width, d->Height, 0, 0) : 0;
    return driver_array(make_array, (void **)pHandle, d, 1, bytes, SPILLWAY_TAKE_ARRAY);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    const CUDA_ARRAY3D_DESCRIPTOR *d = pAllocateArray;
    uint64_t bytes = pHandle && d ? array_footprint(format_unit(d->Format, d->NumChannels), d->Width,
                                                    d->Height, d->Depth, d->Flags)
                                  : 0;
    return driver_array(make_3d_array, (void **)pHandle, d, 1, bytes, SPILLWAY_TAKE_ARRAY);
}

/* A mipmapped array is charged the sum of its levels, which belong to it:
 * they are neither counted nor destroyed on their own. */
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                       const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                       unsigned int numMipmapLevels)
{
    const CUDA_ARRAY3D_DESCRIPTOR *d = pMipmappedArrayDesc;
    uint64_t bytes = pHandle && d ? mipmap_footprint(format_unit(d->Format, d->NumChannels), d->Width,
                                                     d->Height, d->Depth, d->Flags, numMipmapLevels)
                                  : 0;
    return driver_array(make_mipmapped_array, (void **)pHandle, d, numMipmapLevels, bytes,
                        SPILLWAY_TAKE_MIPMAPPED_ARRAY);
}

/* A runtime call making an array (or mipmapped array) in *handle, given its extent, levels and flags. */
typedef cudaError_t (*runtime_make_fn)(void **handle, const struct cudaChannelFormatDesc *desc,
                                       struct cudaExtent extent, unsigned int levels, unsigned int flags);

/*
 * The runtime's arrays and mipmapped arrays are counted here, bytes of
 * kind, and the driver's calls the runtime makes for them pass through
 * (depth), so that each is counted once.
 */
static cudaError_t runtime_array(runtime_make_fn make, void **handle, const struct cudaChannelFormatDesc *desc,
                                 struct cudaExtent extent, unsigned int levels, unsigned int flags,
                                 uint64_t bytes, int32_t kind)
{
    cudaError_t rc = cudaSuccess;
    int32_t device = 0;
    CUcontext ctx = NULL;
    enum route r = route();
    depth++;
    switch (runtime_alloc_route(r, handle, bytes, &device, &ctx, &rc)) {
    case ROUTE_CORE:
    case ROUTE_CONTEXT:
        if (bytes == 0) {
            rc = make(handle, desc, extent, levels, flags);
            break;
        }
        rc = (cudaError_t)core.take(device, bytes, ctx ? kind : kind | SPILLWAY_TAKE_IN_PRIMARY);
        if (rc != cudaSuccess)
            break;
        front_read_lock(&reset_lock);
        front_lock(&arrays_lock);
        rc = make(handle, desc, extent, levels, flags);
        array_made(rc == cudaSuccess, rc == cudaSuccess ? *handle : NULL, ctx, device, bytes, kind);
        pthread_mutex_unlock(&arrays_lock);
        pthread_rwlock_unlock(&reset_lock);
        break;
    case ROUTE_REFUSE:
        rc = cudaErrorInitializationError;
        break;
    case ROUTE_FAILED:
        break;
    default:
        rc = make(handle, desc, extent, levels, flags);
    }
    depth--;
    return rc;
}

/* The real cudaMallocArray, cudaMalloc3DArray and cudaMallocMipmappedArray, in runtime_make_fn's shape. */
static cudaError_t malloc_array(void **handle, const struct cudaChannelFormatDesc *desc, struct cudaExtent extent,
                                unsigned int levels, unsigned int flags)
{
    (void)levels;
    REAL(real_malloc_array, malloc_array);
    return real_malloc_array((cudaArray_t *)handle, desc, extent.width, extent.height, flags);
}

static cudaError_t malloc_3d_array(void **handle, const struct cudaChannelFormatDesc *desc,
                                   struct cudaExtent extent, unsigned int levels, unsigned int flags)
{
    (void)levels;
    REAL(real_malloc_3d_array, malloc_3d_array);
    return real_malloc_3d_array((cudaArray_t *)handle, desc, extent, flags);
}

static cudaError_t malloc_mipmapped_array(void **handle, const struct cudaChannelFormatDesc *desc,
                                          struct cudaExtent extent, unsigned int levels, unsigned int flags)
{
    REAL(real_malloc_mipmapped_array, malloc_mipmapped_array);
    return real_malloc_mipmapped_array((cudaMipmappedArray_t *)handle, desc, extent, levels, flags);
}

/* A runtime array's bytes: its footprint. */
static uint64_t runtime_footprint(const struct cudaChannelFormatDesc *desc, struct cudaExtent extent,
                                  unsigned int flags)
{
    return desc ? array_footprint(channel_unit(desc), extent.width, extent.height, extent.depth, flags) : 0;
}

EXPORT cudaError_t cudaMallocArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                                   size_t width, size_t height, unsigned int flags)
{
    struct cudaExtent extent = {width, height, 0};
    return runtime_array(malloc_array, (void **)array, desc, extent, 1, flags,
                         runtime_footprint(desc, extent, flags), SPILLWAY_TAKE_RUNTIME_ARRAY);
}

EXPORT cudaError_t cudaMalloc3DArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                                     struct cudaExtent extent, unsigned int flags)
{
    return runtime_array(malloc_3d_array, (void **)array, desc, extent, 1, flags,
                         runtime_footprint(desc, extent, flags), SPILLWAY_TAKE_RUNTIME_ARRAY);
}

EXPORT cudaError_t cudaMallocMipmappedArray(cudaMipmappedArray_t *mipmappedArray,
                                            const struct cudaChannelFormatDesc *desc, struct cudaExtent extent,
                                            unsigned int numLevels, unsigned int flags)
{
    uint64_t bytes =
        desc ? mipmap_footprint(channel_unit(desc), extent.width, extent.height, extent.depth, flags, numLevels) : 0;
    return runtime_array(malloc_mipmapped_array, (void **)mipmappedArray, desc, extent, numLevels, flags, bytes,
                         SPILLWAY_TAKE_RUNTIME_MIPMAPPED_ARRAY);
}

EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    REAL(real_destroy, cu_array_destroy);
    if (!core_listens())
        return real_destroy(hArray);
    front_lock(&arrays_lock);
    CUresult rc = real_destroy(hArray);
    if (rc == CUDA_SUCCESS)
        core.array_destroyed((uint64_t)(uintptr_t)hArray);
    pthread_mutex_unlock(&arrays_lock);
    return rc;
}

EXPORT cudaError_t cudaFreeArray(cudaArray_t array)
{
    REAL(real_free_array, free_array);
    if (!core_listens())
        return real_free_array(array);
    depth++;
    front_lock(&arrays_lock);
    cudaError_t rc = real_free_array(array);
    if (rc == cudaSuccess && array)
        core.array_destroyed((uint64_t)(uintptr_t)array);
    pthread_mutex_unlock(&arrays_lock);
    depth--;
    return rc;
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    REAL(real_destroy, cu_mipmapped_array_destroy);
    if (!core_listens())
        return real_destroy(hMipmappedArray);
    front_lock(&arrays_lock);
    CUresult rc = real_destroy(hMipmappedArray);
    if (rc == CUDA_SUCCESS)
        core.array_destroyed((uint64_t)(uintptr_t)hMipmappedArray);
    pthread_mutex_unlock(&arrays_lock);
    return rc;
}

EXPORT cudaError_t cudaFreeMipmappedArray(cudaMipmappedArray_t mipmappedArray)
{
    REAL(real_free_mipmapped_array, free_mipmapped_array);
    if (!core_listens())
        return real_free_mipmapped_array(mipmappedArray);
    depth++;
    front_lock(&arrays_lock);
    cudaError_t rc = real_free_mipmapped_array(mipmappedArray);
    if (rc == cudaSuccess && mipmappedArray)
        core.array_destroyed((uint64_t)(uintptr_t)mipmappedArray);
    pthread_mutex_unlock(&arrays_lock);
    depth--;
    return rc;
}
