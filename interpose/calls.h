/*
 * calls.h: the one list of the CUDA functions the shim knows, and of the
 * core's entry points. Everything that must agree about them is generated
 * from these rows: the table of real functions and its names (real.h), the
 * index of each real function, the declaration of each interposed function
 * and the check that it has the real one's type (shim/front/front.h and
 * real.c), the entry points' types (abi.h), the front's lookups of them
 * (shim/front/front.c), and the check that the Go core exports each one
 * with that type (shim/core/entries.c).
 *
 * Define the macros a reader needs, then include this file (it has no
 * include guard: each inclusion is one expansion); the others
 * expand to nothing, and all are undefined at its end.
 *
 * SPILLWAY_REAL(ret, field, name, params)
 *   a real function the core calls but the front does not interpose: a
 *   field `field` of struct spillway_real, resolved by the CUDA name `name`.
 * SPILLWAY_INTERPOSED(ret, field, name, params)
 *   the same, and the front also defines `name` with exactly that type.
 * Both kinds share one sequence, the field order of struct spillway_real:
 * append new rows at the end of it and never reorder (the front and the
 * core are separate objects and check the table's size).
 *
 * SPILLWAY_ENTRY(name, params)
 *   the core's entry point spillway_core_<name>, returning int32_t: a
 *   cudaError_t for the runtime's calls (which leave the thread's last
 *   error as CUDA would), a CUresult for the driver's (which never touch
 *   the runtime's last error).
 */
#ifndef SPILLWAY_REAL
#define SPILLWAY_REAL(ret, field, name, params)
#endif
#ifndef SPILLWAY_INTERPOSED
#define SPILLWAY_INTERPOSED(ret, field, name, params)
#endif
#ifndef SPILLWAY_ENTRY
#define SPILLWAY_ENTRY(name, params)
#endif

/* ---- struct spillway_real, in field order ---- */
SPILLWAY_INTERPOSED(cudaError_t, malloc, cudaMalloc, (void **devPtr, size_t size))
SPILLWAY_INTERPOSED(cudaError_t, free, cudaFree, (void *devPtr))
SPILLWAY_INTERPOSED(cudaError_t, malloc_managed, cudaMallocManaged,
                    (void **devPtr, size_t size, unsigned int flags))
SPILLWAY_INTERPOSED(cudaError_t, malloc_pitch, cudaMallocPitch,
                    (void **devPtr, size_t *pitch, size_t width, size_t height))
SPILLWAY_INTERPOSED(cudaError_t, malloc_async, cudaMallocAsync,
                    (void **devPtr, size_t size, cudaStream_t stream))
SPILLWAY_INTERPOSED(cudaError_t, free_async, cudaFreeAsync, (void *devPtr, cudaStream_t stream))
SPILLWAY_INTERPOSED(cudaError_t, mem_get_info, cudaMemGetInfo, (size_t *free, size_t *total))
SPILLWAY_INTERPOSED(cudaError_t, device_reset, cudaDeviceReset, (void))
SPILLWAY_REAL(cudaError_t, get_device, cudaGetDevice, (int *device))
SPILLWAY_REAL(cudaError_t, set_device, cudaSetDevice, (int device))
SPILLWAY_REAL(cudaError_t, get_device_count, cudaGetDeviceCount, (int *count))
SPILLWAY_INTERPOSED(cudaError_t, device_synchronize, cudaDeviceSynchronize, (void))
SPILLWAY_REAL(cudaError_t, stream_synchronize, cudaStreamSynchronize, (cudaStream_t stream))
SPILLWAY_REAL(cudaError_t, event_create_with_flags, cudaEventCreateWithFlags,
              (cudaEvent_t * event, unsigned int flags))
SPILLWAY_REAL(cudaError_t, event_record, cudaEventRecord, (cudaEvent_t event, cudaStream_t stream))
SPILLWAY_REAL(cudaError_t, event_query, cudaEventQuery, (cudaEvent_t event))
SPILLWAY_REAL(cudaError_t, event_synchronize, cudaEventSynchronize, (cudaEvent_t event))
SPILLWAY_REAL(cudaError_t, event_destroy, cudaEventDestroy, (cudaEvent_t event))
/* Added for the pool and spilling. */
SPILLWAY_INTERPOSED(cudaError_t, stream_destroy, cudaStreamDestroy, (cudaStream_t stream))
SPILLWAY_REAL(cudaError_t, device_get_attribute, cudaDeviceGetAttribute,
              (int *value, enum cudaDeviceAttr attr, int device))
SPILLWAY_REAL(cudaError_t, host_alloc, cudaHostAlloc, (void **pHost, size_t size, unsigned int flags))
SPILLWAY_REAL(cudaError_t, free_host, cudaFreeHost, (void *ptr))
SPILLWAY_REAL(cudaError_t, host_get_device_pointer, cudaHostGetDevicePointer,
              (void **pDevice, void *pHost, unsigned int flags))
/* CUDA 12 runtime signatures (an int device), not the cudaMemLocation forms. */
SPILLWAY_REAL(cudaError_t, mem_advise, cudaMemAdvise,
              (const void *devPtr, size_t count, enum cudaMemoryAdvise advice, int device))
SPILLWAY_REAL(cudaError_t, mem_prefetch_async, cudaMemPrefetchAsync,
              (const void *devPtr, size_t count, int dstDevice, cudaStream_t stream))
/* Added to keep the application's last error as CUDA would leave it. */
SPILLWAY_REAL(cudaError_t, peek_at_last_error, cudaPeekAtLastError, (void))
SPILLWAY_REAL(cudaError_t, get_last_error, cudaGetLastError, (void))
/* The driver's memory API (CUresult; never the runtime's last error). */
SPILLWAY_INTERPOSED(CUresult, cu_mem_alloc, cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize))
SPILLWAY_INTERPOSED(CUresult, cu_mem_free, cuMemFree_v2, (CUdeviceptr dptr))
SPILLWAY_INTERPOSED(CUresult, cu_mem_get_info, cuMemGetInfo_v2, (size_t *free, size_t *total))
SPILLWAY_REAL(CUresult, cu_ctx_get_device, cuCtxGetDevice, (CUdevice * device))
SPILLWAY_INTERPOSED(CUresult, cu_mem_alloc_pitch, cuMemAllocPitch_v2,
                    (CUdeviceptr * dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                     unsigned int ElementSizeBytes))
SPILLWAY_INTERPOSED(CUresult, cu_mem_alloc_managed, cuMemAllocManaged,
                    (CUdeviceptr * dptr, size_t bytesize, unsigned int flags))
SPILLWAY_INTERPOSED(CUresult, cu_mem_alloc_async, cuMemAllocAsync,
                    (CUdeviceptr * dptr, size_t bytesize, CUstream hStream))
SPILLWAY_INTERPOSED(CUresult, cu_mem_alloc_async_ptsz, cuMemAllocAsync_ptsz,
                    (CUdeviceptr * dptr, size_t bytesize, CUstream hStream))
SPILLWAY_INTERPOSED(CUresult, cu_mem_free_async, cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream))
SPILLWAY_INTERPOSED(CUresult, cu_mem_free_async_ptsz, cuMemFreeAsync_ptsz,
                    (CUdeviceptr dptr, CUstream hStream))
SPILLWAY_INTERPOSED(CUresult, cu_device_total_mem, cuDeviceTotalMem_v2, (size_t * bytes, CUdevice dev))
SPILLWAY_INTERPOSED(CUresult, cu_primary_ctx_reset, cuDevicePrimaryCtxReset_v2, (CUdevice dev))
SPILLWAY_INTERPOSED(CUresult, cu_ctx_synchronize, cuCtxSynchronize, (void))
/* The driver's own lookup: what it returns for an interposed function is
 * exchanged for the front's (by the pointer, whatever name, version or
 * flags the caller asked with). */
SPILLWAY_INTERPOSED(CUresult, cu_get_proc_address, cuGetProcAddress,
                    (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags))
SPILLWAY_INTERPOSED(CUresult, cu_get_proc_address_v2, cuGetProcAddress_v2,
                    (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                     CUdriverProcAddressQueryResult *symbolStatus))
/* NVML's memory reports, and what maps its devices to CUDA's ordinals. */
SPILLWAY_INTERPOSED(nvmlReturn_t, nvml_memory_info, nvmlDeviceGetMemoryInfo,
                    (nvmlDevice_t device, nvmlMemory_t *memory))
SPILLWAY_INTERPOSED(nvmlReturn_t, nvml_memory_info_v2, nvmlDeviceGetMemoryInfo_v2,
                    (nvmlDevice_t device, nvmlMemory_v2_t *memory))
SPILLWAY_INTERPOSED(nvmlReturn_t, nvml_processes_v2, nvmlDeviceGetComputeRunningProcesses_v2,
                    (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos))
SPILLWAY_INTERPOSED(nvmlReturn_t, nvml_processes_v3, nvmlDeviceGetComputeRunningProcesses_v3,
                    (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos))
SPILLWAY_REAL(nvmlReturn_t, nvml_device_uuid, nvmlDeviceGetUUID,
              (nvmlDevice_t device, char *uuid, unsigned int length))
SPILLWAY_REAL(CUresult, cu_init, cuInit, (unsigned int Flags))
SPILLWAY_REAL(CUresult, cu_device_get_count, cuDeviceGetCount, (int *count))
SPILLWAY_REAL(CUresult, cu_device_get, cuDeviceGet, (CUdevice * device, int ordinal))
SPILLWAY_REAL(CUresult, cu_device_get_uuid, cuDeviceGetUuid, (CUuuid * uuid, CUdevice dev))
/* The driver's calls that serve the core where there is no runtime. */
SPILLWAY_REAL(CUresult, cu_ctx_get_current, cuCtxGetCurrent, (CUcontext * pctx))
SPILLWAY_REAL(CUresult, cu_ctx_set_current, cuCtxSetCurrent, (CUcontext ctx))
SPILLWAY_REAL(CUresult, cu_primary_ctx_retain, cuDevicePrimaryCtxRetain,
              (CUcontext * pctx, CUdevice dev))
SPILLWAY_REAL(CUresult, cu_stream_synchronize, cuStreamSynchronize, (CUstream hStream))
SPILLWAY_INTERPOSED(CUresult, cu_stream_destroy, cuStreamDestroy_v2, (CUstream hStream))
SPILLWAY_REAL(CUresult, cu_event_create, cuEventCreate, (CUevent * phEvent, unsigned int Flags))
SPILLWAY_REAL(CUresult, cu_event_record, cuEventRecord, (CUevent hEvent, CUstream hStream))
SPILLWAY_REAL(CUresult, cu_event_query, cuEventQuery, (CUevent hEvent))
SPILLWAY_REAL(CUresult, cu_event_synchronize, cuEventSynchronize, (CUevent hEvent))
SPILLWAY_REAL(CUresult, cu_event_destroy, cuEventDestroy_v2, (CUevent hEvent))
SPILLWAY_REAL(CUresult, cu_device_get_attribute, cuDeviceGetAttribute,
              (int *pi, CUdevice_attribute attrib, CUdevice dev))
SPILLWAY_REAL(CUresult, cu_mem_host_alloc, cuMemHostAlloc, (void **pp, size_t bytesize, unsigned int Flags))
SPILLWAY_REAL(CUresult, cu_mem_free_host, cuMemFreeHost, (void *p))
SPILLWAY_REAL(CUresult, cu_mem_host_get_device_pointer, cuMemHostGetDevicePointer_v2,
              (CUdeviceptr * pdptr, void *p, unsigned int Flags))
SPILLWAY_REAL(CUresult, cu_mem_advise, cuMemAdvise,
              (CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device))
SPILLWAY_REAL(CUresult, cu_mem_prefetch_async, cuMemPrefetchAsync,
              (CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream))
/* Checking the application's streams, and stream capture (enums as int). */
SPILLWAY_REAL(cudaError_t, stream_query, cudaStreamQuery, (cudaStream_t stream))
SPILLWAY_REAL(cudaError_t, thread_exchange_stream_capture_mode,
              cudaThreadExchangeStreamCaptureMode, (int *mode))
SPILLWAY_REAL(CUresult, cu_stream_query, cuStreamQuery, (CUstream hStream))
/* A stream's capture status and the graph it builds (a block freed in it is
 * the graph's). CUDA 12's form takes six arguments; CUDA 13's inserts
 * edgeData_out before numDependencies_out. Declared with seven and called
 * with NULL for every output but status and graph, it reads only NULLs in
 * either: a six-argument callee never looks at the seventh (x86-64 passes
 * it on the stack). */
SPILLWAY_REAL(cudaError_t, stream_get_capture_info, cudaStreamGetCaptureInfo,
              (cudaStream_t stream, int *captureStatus_out, unsigned long long *id_out,
               cudaGraph_t *graph_out, const cudaGraphNode_t **dependencies_out,
               const void **edgeData_out, size_t *numDependencies_out))
SPILLWAY_REAL(CUresult, cu_stream_get_capture_info, cuStreamGetCaptureInfo_v2,
              (CUstream hStream, int *captureStatus_out, cuuint64_t *id_out, CUgraph *graph_out,
               const CUgraphNode **dependencies_out, size_t *numDependencies_out))
/* CUDA graphs: a block freed during a capture stays the graph's until the
 * graph and every executable graph instantiated from it are destroyed. Frees
 * are checked for a capture only once one has begun. */
SPILLWAY_INTERPOSED(cudaError_t, stream_begin_capture, cudaStreamBeginCapture,
                    (cudaStream_t stream, enum cudaStreamCaptureMode mode))
SPILLWAY_INTERPOSED(CUresult, cu_stream_begin_capture, cuStreamBeginCapture_v2,
                    (CUstream hStream, CUstreamCaptureMode mode))
SPILLWAY_INTERPOSED(CUresult, cu_stream_begin_capture_ptsz, cuStreamBeginCapture_v2_ptsz,
                    (CUstream hStream, CUstreamCaptureMode mode))
SPILLWAY_INTERPOSED(cudaError_t, stream_end_capture, cudaStreamEndCapture,
                    (cudaStream_t stream, cudaGraph_t *pGraph))
SPILLWAY_INTERPOSED(CUresult, cu_stream_end_capture, cuStreamEndCapture,
                    (CUstream hStream, CUgraph *phGraph))
SPILLWAY_INTERPOSED(CUresult, cu_stream_end_capture_ptsz, cuStreamEndCapture_ptsz,
                    (CUstream hStream, CUgraph *phGraph))
SPILLWAY_INTERPOSED(cudaError_t, graph_instantiate, cudaGraphInstantiate,
                    (cudaGraphExec_t * pGraphExec, cudaGraph_t graph, unsigned long long flags))
SPILLWAY_INTERPOSED(cudaError_t, graph_instantiate_with_flags, cudaGraphInstantiateWithFlags,
                    (cudaGraphExec_t * pGraphExec, cudaGraph_t graph, unsigned long long flags))
SPILLWAY_INTERPOSED(cudaError_t, graph_exec_destroy, cudaGraphExecDestroy,
                    (cudaGraphExec_t graphExec))
SPILLWAY_INTERPOSED(cudaError_t, graph_destroy, cudaGraphDestroy, (cudaGraph_t graph))
SPILLWAY_INTERPOSED(CUresult, cu_graph_instantiate_with_flags, cuGraphInstantiateWithFlags,
                    (CUgraphExec * phGraphExec, CUgraph hGraph, unsigned long long flags))
SPILLWAY_INTERPOSED(CUresult, cu_graph_exec_destroy, cuGraphExecDestroy, (CUgraphExec hGraphExec))
SPILLWAY_INTERPOSED(CUresult, cu_graph_destroy, cuGraphDestroy, (CUgraph hGraph))
/* Contexts the application creates (and pycuda's usage counts): what is
 * allocated in one is counted, passed through, and given back with it. */
SPILLWAY_INTERPOSED(CUresult, cu_ctx_create, cuCtxCreate_v2,
                    (CUcontext * pctx, unsigned int flags, CUdevice dev))
SPILLWAY_INTERPOSED(CUresult, cu_ctx_destroy, cuCtxDestroy_v2, (CUcontext ctx))
SPILLWAY_INTERPOSED(CUresult, cu_ctx_attach, cuCtxAttach, (CUcontext * pctx, unsigned int flags))
SPILLWAY_INTERPOSED(CUresult, cu_ctx_detach, cuCtxDetach, (CUcontext ctx))
/* The virtual-memory API: device-located physical memory counts from
 * cuMemCreate until its handle is released and its last mapping unmapped. */
SPILLWAY_INTERPOSED(CUresult, cu_mem_create, cuMemCreate,
                    (CUmemGenericAllocationHandle * handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags))
SPILLWAY_INTERPOSED(CUresult, cu_mem_release, cuMemRelease, (CUmemGenericAllocationHandle handle))
SPILLWAY_INTERPOSED(CUresult, cu_mem_retain_allocation_handle, cuMemRetainAllocationHandle,
                    (CUmemGenericAllocationHandle * handle, void *addr))
SPILLWAY_INTERPOSED(CUresult, cu_mem_map, cuMemMap,
                    (CUdeviceptr ptr, size_t size, size_t offset,
                     CUmemGenericAllocationHandle handle, unsigned long long flags))
SPILLWAY_INTERPOSED(CUresult, cu_mem_unmap, cuMemUnmap, (CUdeviceptr ptr, size_t size))
/* An import of a handle this process created is one more reference to it. */
SPILLWAY_INTERPOSED(CUresult, cu_mem_import_from_shareable_handle, cuMemImportFromShareableHandle,
                    (CUmemGenericAllocationHandle * handle, void *osHandle,
                     CUmemAllocationHandleType shHandleType))
/* The runtime's lookup of driver functions, exchanged like cuGetProcAddress's. */
SPILLWAY_INTERPOSED(cudaError_t, get_driver_entry_point, cudaGetDriverEntryPoint,
                    (const char *symbol, void **funcPtr, unsigned long long flags,
                     enum cudaDriverEntryPointQueryResult *driverStatus))
SPILLWAY_INTERPOSED(cudaError_t, get_driver_entry_point_by_version,
                    cudaGetDriverEntryPointByVersion,
                    (const char *symbol, void **funcPtr, unsigned int cudaVersion,
                     unsigned long long flags, enum cudaDriverEntryPointQueryResult *driverStatus))
/* NVML's other memory reports. */
SPILLWAY_INTERPOSED(nvmlReturn_t, nvml_bar1_memory_info, nvmlDeviceGetBAR1MemoryInfo,
                    (nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory))
SPILLWAY_INTERPOSED(nvmlReturn_t, nvml_processes_v1, nvmlDeviceGetComputeRunningProcesses,
                    (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos))
/* Virtual memory management, for the pool's granules (the core's own calls,
 * in the device's primary context; never counted as the application's). The
 * core also calls the real cuMemCreate, cuMemRelease, cuMemMap and cuMemUnmap
 * through the interposed rows above, and cuMemSetAccess through its row. */
SPILLWAY_REAL(CUresult, cu_mem_get_allocation_granularity, cuMemGetAllocationGranularity,
              (size_t * granularity, const CUmemAllocationProp *prop,
               CUmemAllocationGranularity_flags option))
SPILLWAY_REAL(CUresult, cu_mem_address_reserve, cuMemAddressReserve,
              (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr,
               unsigned long long flags))
SPILLWAY_REAL(CUresult, cu_mem_address_free, cuMemAddressFree, (CUdeviceptr ptr, size_t size))
/* The application's grants reach the core, which adds the CPU's to memory
 * the front placed on the host (vmm_accessed). */
SPILLWAY_INTERPOSED(CUresult, cu_mem_set_access, cuMemSetAccess,
                    (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count))
/* The pool's granules are granted to every device that can reach them. */
SPILLWAY_REAL(CUresult, cu_device_can_access_peer, cuDeviceCanAccessPeer,
              (int *canAccessPeer, CUdevice dev, CUdevice peerDev))
/* Migration copies a granule's contents before remapping it. */
SPILLWAY_REAL(CUresult, cu_memcpy_dtod, cuMemcpyDtoD_v2,
              (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount))
/* Allocations from the application's explicit memory pools: counted on the
 * device and passed through, never pooled (the application chose its pool). */
SPILLWAY_INTERPOSED(CUresult, cu_mem_alloc_from_pool_async, cuMemAllocFromPoolAsync,
                    (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream))
SPILLWAY_INTERPOSED(CUresult, cu_mem_alloc_from_pool_async_ptsz, cuMemAllocFromPoolAsync_ptsz,
                    (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream))
SPILLWAY_INTERPOSED(cudaError_t, malloc_from_pool_async, cudaMallocFromPoolAsync,
                    (void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream))
/* A device's default memory pool: its attributes and trimming answer of
 * Spillway's pool, which serves the allocations CUDA's would. */
SPILLWAY_REAL(CUresult, cu_device_get_default_mem_pool, cuDeviceGetDefaultMemPool,
              (CUmemoryPool * pool_out, CUdevice dev))
SPILLWAY_INTERPOSED(CUresult, cu_mem_pool_get_attribute, cuMemPoolGetAttribute,
                    (CUmemoryPool pool, CUmemPool_attribute attr, void *value))
SPILLWAY_INTERPOSED(CUresult, cu_mem_pool_set_attribute, cuMemPoolSetAttribute,
                    (CUmemoryPool pool, CUmemPool_attribute attr, void *value))
SPILLWAY_INTERPOSED(CUresult, cu_mem_pool_trim_to, cuMemPoolTrimTo,
                    (CUmemoryPool pool, size_t minBytesToKeep))
SPILLWAY_INTERPOSED(cudaError_t, mem_pool_get_attribute, cudaMemPoolGetAttribute,
                    (cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value))
SPILLWAY_INTERPOSED(cudaError_t, mem_pool_set_attribute, cudaMemPoolSetAttribute,
                    (cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value))
SPILLWAY_INTERPOSED(cudaError_t, mem_pool_trim_to, cudaMemPoolTrimTo,
                    (cudaMemPool_t memPool, size_t minBytesToKeep))
/* A stream-ordered allocation is made on its stream's device: the stream's
 * context, and that context's device when it is not the current one. */
SPILLWAY_REAL(CUresult, cu_stream_get_ctx, cuStreamGetCtx, (CUstream hStream, CUcontext *pctx))
SPILLWAY_REAL(CUresult, cu_ctx_push_current, cuCtxPushCurrent_v2, (CUcontext ctx))
SPILLWAY_REAL(CUresult, cu_ctx_pop_current, cuCtxPopCurrent_v2, (CUcontext * pctx))
/* An explicit pool's allocation counts on the pool's device, remembered as
 * the pool is created (CUDA answers no query for it). */
SPILLWAY_INTERPOSED(CUresult, cu_mem_pool_create, cuMemPoolCreate,
                    (CUmemoryPool * pool, const CUmemPoolProps *poolProps))
SPILLWAY_INTERPOSED(CUresult, cu_mem_pool_destroy, cuMemPoolDestroy, (CUmemoryPool pool))
SPILLWAY_INTERPOSED(cudaError_t, mem_pool_create, cudaMemPoolCreate,
                    (cudaMemPool_t * memPool, const struct cudaMemPoolProps *poolProps))
SPILLWAY_INTERPOSED(cudaError_t, mem_pool_destroy, cudaMemPoolDestroy, (cudaMemPool_t memPool))
/* Contexts created with execution affinity (CUDA 11.4: cuGetProcAddress's
 * cuCtxCreate from then on) or creation parameters (CUDA 12.5; CUDA 13's
 * cuCtxCreate) are created contexts too. */
SPILLWAY_INTERPOSED(CUresult, cu_ctx_create_v3, cuCtxCreate_v3,
                    (CUcontext * pctx, CUexecAffinityParam *paramsArray, int numParams,
                     unsigned int flags, CUdevice dev))
SPILLWAY_INTERPOSED(CUresult, cu_ctx_create_v4, cuCtxCreate_v4,
                    (CUcontext * pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                     CUdevice dev))
/* CUDA arrays: counted on their context's device from creation until
 * destroyed, with their context or by a reset of the primary context. The
 * runtime's forms call the driver's (through cuGetProcAddress), below them. */
SPILLWAY_INTERPOSED(CUresult, cu_array_create, cuArrayCreate_v2,
                    (CUarray * pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray))
SPILLWAY_INTERPOSED(CUresult, cu_array_3d_create, cuArray3DCreate_v2,
                    (CUarray * pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray))
SPILLWAY_INTERPOSED(CUresult, cu_array_destroy, cuArrayDestroy, (CUarray hArray))
SPILLWAY_INTERPOSED(cudaError_t, malloc_array, cudaMallocArray,
                    (cudaArray_t * array, const struct cudaChannelFormatDesc *desc, size_t width,
                     size_t height, unsigned int flags))
SPILLWAY_INTERPOSED(cudaError_t, malloc_3d_array, cudaMalloc3DArray,
                    (cudaArray_t * array, const struct cudaChannelFormatDesc *desc,
                     struct cudaExtent extent, unsigned int flags))
SPILLWAY_INTERPOSED(cudaError_t, free_array, cudaFreeArray, (cudaArray_t array))
/* Mipmapped arrays: counted as arrays are, by the sum of their levels. */
SPILLWAY_INTERPOSED(CUresult, cu_mipmapped_array_create, cuMipmappedArrayCreate,
                    (CUmipmappedArray * pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                     unsigned int numMipmapLevels))
SPILLWAY_INTERPOSED(CUresult, cu_mipmapped_array_destroy, cuMipmappedArrayDestroy,
                    (CUmipmappedArray hMipmappedArray))
SPILLWAY_INTERPOSED(cudaError_t, malloc_mipmapped_array, cudaMallocMipmappedArray,
                    (cudaMipmappedArray_t * mipmappedArray, const struct cudaChannelFormatDesc *desc,
                     struct cudaExtent extent, unsigned int numLevels, unsigned int flags))
SPILLWAY_INTERPOSED(cudaError_t, free_mipmapped_array, cudaFreeMipmappedArray,
                    (cudaMipmappedArray_t mipmappedArray))
/* The primary context's reset as programs built with CUDA 7 to 10 call it
 * (and cuGetProcAddress answers it below CUDA 11.0): the same reset. */
SPILLWAY_INTERPOSED(CUresult, cu_primary_ctx_reset_v1, cuDevicePrimaryCtxReset, (CUdevice dev))
/* The address range of a pointer: a pooled block's is the block's own,
 * not that of the pool's memory it was cut from. */
SPILLWAY_INTERPOSED(CUresult, cu_mem_get_address_range, cuMemGetAddressRange_v2,
                    (CUdeviceptr * pbase, size_t *psize, CUdeviceptr dptr))
SPILLWAY_INTERPOSED(CUresult, cu_pointer_get_attribute, cuPointerGetAttribute,
                    (void *data, CUpointer_attribute attribute, CUdeviceptr ptr))
SPILLWAY_INTERPOSED(CUresult, cu_pointer_get_attributes, cuPointerGetAttributes,
                    (unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                     CUdeviceptr ptr))
/* An IPC handle names the whole allocation behind a pointer, for a pooled
 * block the pool's memory: refused there (the runtime's cudaIpcGetMemHandle
 * calls it through cuGetProcAddress). */
SPILLWAY_INTERPOSED(CUresult, cu_ipc_get_mem_handle, cuIpcGetMemHandle,
                    (CUipcMemHandle * pHandle, CUdeviceptr dptr))

/* ---- the core's entry points ---- */
/* Returns the core's SPILLWAY_CORE_ABI; the front calls it first. */
SPILLWAY_ENTRY(abi, (void))
/* abi is the front's SPILLWAY_CORE_ABI; the core refuses another. The core
 * only reads the tables (Go's exports cannot say const). */
SPILLWAY_ENTRY(init, (int32_t abi, struct spillway_real *real, struct spillway_probes *probes))
SPILLWAY_ENTRY(malloc, (int32_t device, uint64_t size, uint64_t *ptr))
SPILLWAY_ENTRY(malloc_managed, (int32_t device, uint64_t size, uint32_t flags, uint64_t *ptr))
SPILLWAY_ENTRY(malloc_pitch,
               (int32_t device, uint64_t width, uint64_t height, uint64_t *ptr, uint64_t *pitch))
SPILLWAY_ENTRY(malloc_async, (int32_t device, uint64_t size, uint64_t stream, uint64_t *ptr))
SPILLWAY_ENTRY(free, (uint64_t ptr))
/* current: the current context where stream is a default stream (which CUDA
 * takes as the current context's), else 0. */
SPILLWAY_ENTRY(free_async, (uint64_t ptr, uint64_t stream, uint64_t current))
SPILLWAY_ENTRY(mem_get_info, (int32_t device, uint64_t *free, uint64_t *total))
SPILLWAY_ENTRY(device_reset, (int32_t device))
SPILLWAY_ENTRY(device_synchronize, (int32_t device))
/* Makes the pools forget the stream, then destroys it. */
SPILLWAY_ENTRY(stream_destroy, (uint64_t stream))
/* Makes the pools forget the stream, which the front destroys next
 * (cuStreamDestroy_v2); CUresult. */
SPILLWAY_ENTRY(cu_stream_forget, (uint64_t stream))
/* Prints the SPILLWAY_REPORT lines; the front calls it at exit. */
SPILLWAY_ENTRY(report, (void))
/* Hands over an allocation the front passed through while the core was starting. */
SPILLWAY_ENTRY(adopt, (uint64_t ptr, uint64_t size, int32_t device))
/* The driver's forms: CUresult, and the runtime's last error left alone. */
SPILLWAY_ENTRY(cu_malloc, (int32_t device, uint64_t size, uint64_t *ptr))
SPILLWAY_ENTRY(cu_free, (uint64_t ptr))
SPILLWAY_ENTRY(cu_mem_get_info, (int32_t device, uint64_t *free, uint64_t *total))
SPILLWAY_ENTRY(cu_malloc_managed, (int32_t device, uint64_t size, uint32_t flags, uint64_t *ptr))
SPILLWAY_ENTRY(cu_malloc_pitch,
               (int32_t device, uint64_t width, uint64_t height, uint64_t *ptr, uint64_t *pitch))
SPILLWAY_ENTRY(cu_malloc_async, (int32_t device, uint64_t size, uint64_t stream, uint64_t *ptr))
SPILLWAY_ENTRY(cu_free_async, (uint64_t ptr, uint64_t stream, uint64_t current))
/* total: the device's real total in, what the process may see of it out. */
SPILLWAY_ENTRY(cu_device_total_mem, (int32_t device, uint64_t *total))
SPILLWAY_ENTRY(cu_device_reset, (int32_t device))
SPILLWAY_ENTRY(cu_device_synchronize, (int32_t device))
/* NVML's view of CUDA device `device`, whose total CUDA reports as
 * cuda_total (cuDeviceTotalMem; NVML's total also counts what the driver
 * reserves): *quota the process's quota there, the one every other report
 * gives, and *used what it holds against it; *quota 0 when the device has
 * no quota (NVML's own figures stand). Returns a cudaError_t and never
 * touches the last error. */
SPILLWAY_ENTRY(nvml_memory, (int32_t device, uint64_t cuda_total, uint64_t *quota, uint64_t *used))
/*
 * Memory counted but not pooled (contexts the application created, its
 * cuMemCreate). take admits size bytes on device outside the pool against
 * its quota, or refuses them with CUDA_ERROR_OUT_OF_MEMORY (logged, the
 * refuse probe fired; kind: SPILLWAY_TAKE_* in abi.h, which also says
 * whether the answer is the runtime's, with its last error); give returns
 * bytes taken for the same kind. CUresult otherwise.
 */
SPILLWAY_ENTRY(take, (int32_t device, uint64_t size, int32_t kind))
SPILLWAY_ENTRY(give, (int32_t device, uint64_t size, int32_t kind))
/* An allocation of size bytes, taken, made in created context ctx: kept
 * until ctx_forget or ctx_destroyed. from_pool: 1 for memory from a memory
 * pool (cuMemAllocAsync, cuMemAllocFromPoolAsync), which is no context's:
 * it outlives ctx, becoming its device's primary context's. */
SPILLWAY_ENTRY(ctx_record, (uint64_t ctx, int32_t device, uint64_t ptr, uint64_t size, int32_t from_pool))
/* Returns 1 and forgets ptr if it was recorded (its bytes stay taken: the
 * front gives them once the real free succeeds, or records ptr again);
 * 0 otherwise. */
SPILLWAY_ENTRY(ctx_forget, (uint64_t ptr, uint64_t *ctx, int32_t *device, uint64_t *size, int32_t *from_pool))
/* Before the real call that may destroy ctx (cuCtxDestroy_v2, a last
 * cuCtxDetach): what was recorded in it is set aside, no longer found by
 * ctx_forget, as the real call frees those addresses for other allocations
 * before ctx_destroyed is told; ctx_kept records it again where ctx was not
 * destroyed. */
SPILLWAY_ENTRY(ctx_destroying, (uint64_t ctx))
SPILLWAY_ENTRY(ctx_kept, (uint64_t ctx))
/* ctx was destroyed: gives back what was recorded in it, or set aside,
 * except memory from a pool, which stays recorded, now its device's primary
 * context's; *count: how many were given back. */
SPILLWAY_ENTRY(ctx_destroyed, (uint64_t ctx, uint64_t *count))
/* The virtual-memory API's events, after the real call succeeded:
 * vmm_created records a handle whose size bytes were taken on device for
 * kind (SPILLWAY_TAKE_VMM or SPILLWAY_TAKE_VMM_HOST). */
SPILLWAY_ENTRY(vmm_created, (uint64_t handle, int32_t device, uint64_t size, int32_t kind))
SPILLWAY_ENTRY(vmm_retained, (uint64_t handle))
SPILLWAY_ENTRY(vmm_released, (uint64_t handle))
SPILLWAY_ENTRY(vmm_mapped, (uint64_t ptr, uint64_t size, uint64_t handle))
SPILLWAY_ENTRY(vmm_unmapped, (uint64_t ptr, uint64_t size))
/* The application granted devices only access to [ptr, ptr+size), a run of
 * whole mappings: the core grants the CPU too each mapping of a handle
 * created with SPILLWAY_TAKE_VMM_HOST, in the calling thread's context. */
SPILLWAY_ENTRY(vmm_accessed, (uint64_t ptr, uint64_t size))
/* CUDA graphs' events, after the real call succeeded: a capture began
 * (from then on frees are checked for one); exec was instantiated from
 * graph; exec, or graph, was destroyed. */
SPILLWAY_ENTRY(capture_begun, (void))
SPILLWAY_ENTRY(graph_instantiated, (uint64_t exec, uint64_t graph))
SPILLWAY_ENTRY(graph_exec_destroyed, (uint64_t exec))
SPILLWAY_ENTRY(graph_destroyed, (uint64_t graph))
/* size bytes taken on device (a created context's or an explicit pool's
 * allocation, forgotten by ctx_forget) were freed during the capture of
 * graph: given back when the graph and every executable graph instantiated
 * from it are destroyed, instead of by give. */
SPILLWAY_ENTRY(graph_keep, (uint64_t graph, int32_t device, uint64_t size))
/*
 * The default memory pool of device, once the real call succeeded (it
 * checked the arguments). Each returns 1 when Spillway's pool serves the
 * device's allocations and answered, 0 when CUDA's answer stands (the pool
 * off, an invalid configuration). mempool_usage: *value is the attribute
 * attr (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT to CU_MEMPOOL_ATTR_USED_MEM_HIGH)
 * of Spillway's pool; mempool_reset_high: the high-water mark attr
 * (CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH or CU_MEMPOOL_ATTR_USED_MEM_HIGH) was
 * set to 0 and starts again from the current figure; mempool_trim: the pool
 * returns cached memory until it holds at most keep bytes.
 */
SPILLWAY_ENTRY(mempool_usage, (int32_t device, int32_t attr, uint64_t *value))
SPILLWAY_ENTRY(mempool_reset_high, (int32_t device, int32_t attr))
SPILLWAY_ENTRY(mempool_trim, (int32_t device, uint64_t keep))
/* CUDA arrays and mipmapped arrays, after the real call succeeded:
 * array_created records one whose size bytes were taken on device
 * (SPILLWAY_TAKE_ARRAY, SPILLWAY_TAKE_RUNTIME_ARRAY,
 * SPILLWAY_TAKE_MIPMAPPED_ARRAY or SPILLWAY_TAKE_RUNTIME_MIPMAPPED_ARRAY),
 * made in ctx, a context the application
 * created, or 0 for the device's primary context; array_destroyed gives its
 * bytes back (a handle not recorded is ignored). Destroying a created
 * context, or resetting the primary one, gives back the arrays made in it. */
SPILLWAY_ENTRY(array_created, (uint64_t handle, uint64_t ctx, int32_t device, uint64_t size))
SPILLWAY_ENTRY(array_destroyed, (uint64_t handle))
/* How the pools hold ptr, in *held: SPILLWAY_HELD_NOT (no pool's memory:
 * CUDA's answer stands), SPILLWAY_HELD_FREE (a pool's memory no live block
 * holds), SPILLWAY_HELD_BLOCK (inside the live block of *size bytes at
 * *base). CUresult. */
SPILLWAY_ENTRY(address_range, (uint64_t ptr, int32_t *held, uint64_t *base, uint64_t *size))

#undef SPILLWAY_REAL
#undef SPILLWAY_INTERPOSED
#undef SPILLWAY_ENTRY
