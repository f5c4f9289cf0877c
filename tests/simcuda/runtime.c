/*
 * runtime.c - the simulated CUDA runtime (libcudart.so.12 and
 * libcudart_static.a).
 *
 * Layered as the real runtime is: it never links the driver. At first use it
 * dlopen()s libcuda.so.1, looks up cuGetProcAddress_v2 with dlsym, and gets
 * every other driver function through it, asking for this runtime's CUDA
 * version and the legacy default stream. A driver-level interposer therefore
 * sees the runtime's calls exactly as it would on a GPU.
 *
 * Runtime state: the calling thread's current device and last error, and one
 * retained primary context per device (retained again after cudaDeviceReset),
 * made current by a call that needs a context when the thread has none.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "spillway/cuda.h"
#include "spillway/cuda_runtime.h"

#include "export.h"

#define RT_API __attribute__((visibility("default")))
#define MAX_DEVICES 16

/* Every runtime entry point, for call counting (SIMCUDA_STATS_FILE) and fault injection. */
#define RUNTIME_APIS(X)                                                                     \
	X(cudaGetDeviceCount) X(cudaGetDevice) X(cudaSetDevice) X(cudaDeviceGetAttribute)   \
	X(cudaGetDeviceProperties) X(cudaGetDeviceProperties_v2) X(cudaDeviceSynchronize)   \
	X(cudaDeviceReset) X(cudaDriverGetVersion) X(cudaRuntimeGetVersion)                 \
	X(cudaGetLastError) X(cudaPeekAtLastError) X(cudaGetErrorString) X(cudaGetErrorName) \
	X(cudaMalloc) X(cudaFree) X(cudaMallocManaged) X(cudaMallocPitch) X(cudaMallocHost) \
	X(cudaMalloc3D) X(cudaHostAlloc) X(cudaFreeHost) X(cudaHostGetDevicePointer)        \
	X(cudaHostRegister) X(cudaHostUnregister)                                           \
	X(cudaMemGetInfo) X(cudaMemcpy) X(cudaMemcpyAsync) X(cudaMemset) X(cudaMemsetAsync) \
	X(cudaMemAdvise) X(cudaMemPrefetchAsync) X(cudaMallocAsync) X(cudaFreeAsync)        \
	X(cudaPointerGetAttributes) X(cudaIpcGetMemHandle) X(cudaIpcOpenMemHandle)          \
	X(cudaIpcCloseMemHandle) X(cudaStreamCreate) X(cudaStreamCreateWithFlags)           \
	X(cudaStreamDestroy) X(cudaStreamSynchronize) X(cudaStreamQuery)                    \
	X(cudaStreamWaitEvent) X(cudaEventCreate) X(cudaEventCreateWithFlags)               \
	X(cudaEventRecord) X(cudaEventQuery) X(cudaEventSynchronize)                        \
	X(cudaEventElapsedTime) X(cudaEventDestroy) X(cudaLaunchHostFunc)                   \
	X(cudaStreamBeginCapture) X(cudaStreamEndCapture) X(cudaStreamIsCapturing)          \
	X(cudaStreamGetCaptureInfo) X(cudaStreamGetCaptureInfo_v2)                          \
	X(cudaThreadExchangeStreamCaptureMode) X(cudaGraphInstantiate)                      \
	X(cudaGraphInstantiateWithFlags) X(cudaGraphLaunch) X(cudaGraphExecDestroy)         \
	X(cudaGraphDestroy) X(cudaGetDriverEntryPoint) X(cudaGetDriverEntryPointByVersion) \
	X(cudaMemPoolCreate) X(cudaMemPoolDestroy) X(cudaDeviceGetDefaultMemPool)           \
	X(cudaMallocFromPoolAsync) X(cudaMemPoolSetAttribute) X(cudaMemPoolGetAttribute)    \
	X(cudaMemPoolTrimTo) X(cudaDeviceGetMemPool) X(cudaMallocArray) X(cudaMalloc3DArray)    \
	X(cudaFreeArray) X(cudaArrayGetInfo) X(cudaArrayGetMemoryRequirements)              \
	X(cudaMallocMipmappedArray) X(cudaFreeMipmappedArray) X(cudaGetMipmappedArrayLevel)  \
	X(cudaMemcpy_ptds) X(cudaMemcpyAsync_ptsz) X(cudaMemset_ptds) X(cudaMemsetAsync_ptsz) \
	X(cudaMallocAsync_ptsz) X(cudaFreeAsync_ptsz) X(cudaMallocFromPoolAsync_ptsz)        \
	X(cudaStreamSynchronize_ptsz) X(cudaStreamQuery_ptsz) X(cudaEventRecord_ptsz)         \
	X(cudaStreamWaitEvent_ptsz) X(cudaLaunchHostFunc_ptsz) X(cudaMemPrefetchAsync_ptsz)

#define API_ID(name) API_##name,
enum { RUNTIME_APIS(API_ID) API_COUNT };
#define API_NAME(name) #name,
static const char *const api_names[API_COUNT] = {RUNTIME_APIS(API_NAME)};
static uint64_t api_calls[API_COUNT];

/*
 * The driver functions the runtime uses, obtained with cuGetProcAddress_v2:
 * drv for the legacy default stream, drv_pt for the per-thread one (the
 * driver's _ptsz/_ptds variants, where a function has one), which the
 * runtime's own _ptsz/_ptds entry points call, as a program built with
 * --default-stream per-thread does.
 */
static struct driver {
	CUresult (*Init)(unsigned int);
	CUresult (*DriverGetVersion)(int *);
	CUresult (*GetExportTable)(const void **, const CUuuid *);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGetName)(char *, int, CUdevice);
	CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
	CUresult (*DeviceTotalMem)(size_t *, CUdevice);
	CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*DevicePrimaryCtxRelease)(CUdevice);
	CUresult (*DevicePrimaryCtxReset)(CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*CtxGetCurrent)(CUcontext *);
	CUresult (*CtxGetDevice)(CUdevice *);
	CUresult (*CtxSynchronize)(void);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
	CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
	CUresult (*MemAllocHost)(void **, size_t);
	CUresult (*MemHostAlloc)(void **, size_t, unsigned int);
	CUresult (*MemFreeHost)(void *);
	CUresult (*MemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned int);
	CUresult (*MemHostRegister)(void *, size_t, unsigned int);
	CUresult (*MemHostUnregister)(void *);
	CUresult (*MemGetInfo)(size_t *, size_t *);
	CUresult (*Memcpy)(CUdeviceptr, CUdeviceptr, size_t);
	CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
	CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
	CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
	/* At CUDA 12.2 and later these resolve to the CUmemLocation ABI (_v2). */
	CUresult (*MemAdvise)(CUdeviceptr, size_t, CUmem_advise, CUmemLocation);
	CUresult (*MemPrefetchAsync)(CUdeviceptr, size_t, CUmemLocation, unsigned int, CUstream);
	CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
	CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
	CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
	CUresult (*MemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
	CUresult (*MemPoolDestroy)(CUmemoryPool);
	CUresult (*DeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
	CUresult (*DeviceGetMemPool)(CUmemoryPool *, CUdevice);
	CUresult (*MemPoolSetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
	CUresult (*MemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
	CUresult (*MemPoolTrimTo)(CUmemoryPool, size_t);
	CUresult (*PointerGetAttributes)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);
	CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int); /* _v2 */
	CUresult (*IpcCloseMemHandle)(CUdeviceptr);
	CUresult (*StreamCreate)(CUstream *, unsigned int);
	CUresult (*StreamDestroy)(CUstream);
	CUresult (*StreamSynchronize)(CUstream);
	CUresult (*StreamQuery)(CUstream);
	CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned int);
	CUresult (*EventCreate)(CUevent *, unsigned int);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventQuery)(CUevent);
	CUresult (*EventSynchronize)(CUevent);
	CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
	CUresult (*EventDestroy)(CUevent);
	CUresult (*LaunchHostFunc)(CUstream, CUhostFn, void *);
	CUresult (*StreamBeginCapture)(CUstream, CUstreamCaptureMode);
	CUresult (*StreamEndCapture)(CUstream, CUgraph *);
	CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
	CUresult (*StreamGetCaptureInfo)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
					 const CUgraphNode **, size_t *);
	CUresult (*ThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *);
	CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
	CUresult (*GraphLaunch)(CUgraphExec, CUstream);
	CUresult (*GraphExecDestroy)(CUgraphExec);
	CUresult (*GraphDestroy)(CUgraph);
	CUresult (*Array3DCreate)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
	CUresult (*ArrayDestroy)(CUarray);
	CUresult (*Array3DGetDescriptor)(CUDA_ARRAY3D_DESCRIPTOR *, CUarray);
	CUresult (*ArrayGetMemoryRequirements)(CUDA_ARRAY_MEMORY_REQUIREMENTS *, CUarray, CUdevice);
	CUresult (*MipmappedArrayCreate)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
	CUresult (*MipmappedArrayDestroy)(CUmipmappedArray);
	CUresult (*MipmappedArrayGetLevel)(CUarray *, CUmipmappedArray, unsigned int);
	/* Kept for cudaGetDriverEntryPoint. */
	CUresult (*GetProcAddress)(const char *, void **, int, cuuint64_t,
				   CUdriverProcAddressQueryResult *);
} drv, drv_pt;

#define DRV(base, field) {base, offsetof(struct driver, field)}
static const struct {
	const char *name;
	size_t offset;
} drv_symbols[] = {
	DRV("cuInit", Init), DRV("cuDriverGetVersion", DriverGetVersion),
	DRV("cuGetExportTable", GetExportTable), DRV("cuDeviceGetCount", DeviceGetCount),
	DRV("cuDeviceGetName", DeviceGetName), DRV("cuDeviceGetUuid", DeviceGetUuid),
	DRV("cuDeviceTotalMem", DeviceTotalMem), DRV("cuDeviceGetAttribute", DeviceGetAttribute),
	DRV("cuDevicePrimaryCtxRetain", DevicePrimaryCtxRetain),
	DRV("cuDevicePrimaryCtxRelease", DevicePrimaryCtxRelease),
	DRV("cuDevicePrimaryCtxReset", DevicePrimaryCtxReset),
	DRV("cuCtxSetCurrent", CtxSetCurrent), DRV("cuCtxGetCurrent", CtxGetCurrent),
	DRV("cuCtxGetDevice", CtxGetDevice),
	DRV("cuCtxSynchronize", CtxSynchronize),
	DRV("cuMemAlloc", MemAlloc), DRV("cuMemFree", MemFree),
	DRV("cuMemAllocManaged", MemAllocManaged), DRV("cuMemAllocPitch", MemAllocPitch),
	DRV("cuMemAllocHost", MemAllocHost), DRV("cuMemHostAlloc", MemHostAlloc),
	DRV("cuMemFreeHost", MemFreeHost), DRV("cuMemHostGetDevicePointer", MemHostGetDevicePointer),
	DRV("cuMemHostRegister", MemHostRegister), DRV("cuMemHostUnregister", MemHostUnregister),
	DRV("cuMemGetInfo", MemGetInfo), DRV("cuMemcpy", Memcpy), DRV("cuMemcpyHtoD", MemcpyHtoD),
	DRV("cuMemcpyDtoH", MemcpyDtoH), DRV("cuMemcpyDtoD", MemcpyDtoD),
	DRV("cuMemcpyAsync", MemcpyAsync), DRV("cuMemcpyHtoDAsync", MemcpyHtoDAsync),
	DRV("cuMemcpyDtoHAsync", MemcpyDtoHAsync), DRV("cuMemcpyDtoDAsync", MemcpyDtoDAsync),
	DRV("cuMemsetD8", MemsetD8), DRV("cuMemsetD8Async", MemsetD8Async),
	DRV("cuMemAdvise", MemAdvise), DRV("cuMemPrefetchAsync", MemPrefetchAsync),
	DRV("cuMemAllocAsync", MemAllocAsync), DRV("cuMemFreeAsync", MemFreeAsync),
	DRV("cuMemAllocFromPoolAsync", MemAllocFromPoolAsync),
	DRV("cuMemPoolCreate", MemPoolCreate), DRV("cuMemPoolDestroy", MemPoolDestroy),
	DRV("cuDeviceGetDefaultMemPool", DeviceGetDefaultMemPool),
	DRV("cuDeviceGetMemPool", DeviceGetMemPool),
	DRV("cuMemPoolSetAttribute", MemPoolSetAttribute),
	DRV("cuMemPoolGetAttribute", MemPoolGetAttribute), DRV("cuMemPoolTrimTo", MemPoolTrimTo),
	DRV("cuPointerGetAttributes", PointerGetAttributes),
	DRV("cuIpcGetMemHandle", IpcGetMemHandle), DRV("cuIpcOpenMemHandle", IpcOpenMemHandle),
	DRV("cuIpcCloseMemHandle", IpcCloseMemHandle), DRV("cuStreamCreate", StreamCreate),
	DRV("cuStreamDestroy", StreamDestroy), DRV("cuStreamSynchronize", StreamSynchronize),
	DRV("cuStreamQuery", StreamQuery), DRV("cuStreamWaitEvent", StreamWaitEvent),
	DRV("cuEventCreate", EventCreate), DRV("cuEventRecord", EventRecord),
	DRV("cuEventQuery", EventQuery), DRV("cuEventSynchronize", EventSynchronize),
	DRV("cuEventElapsedTime", EventElapsedTime), DRV("cuEventDestroy", EventDestroy),
	DRV("cuLaunchHostFunc", LaunchHostFunc),
	DRV("cuStreamBeginCapture", StreamBeginCapture), DRV("cuStreamEndCapture", StreamEndCapture),
	DRV("cuStreamIsCapturing", StreamIsCapturing),
	DRV("cuStreamGetCaptureInfo", StreamGetCaptureInfo),
	DRV("cuThreadExchangeStreamCaptureMode", ThreadExchangeStreamCaptureMode),
	DRV("cuGraphInstantiateWithFlags", GraphInstantiate), DRV("cuGraphLaunch", GraphLaunch),
	DRV("cuGraphExecDestroy", GraphExecDestroy), DRV("cuGraphDestroy", GraphDestroy),
	DRV("cuArray3DCreate", Array3DCreate), DRV("cuArrayDestroy", ArrayDestroy),
	DRV("cuArray3DGetDescriptor", Array3DGetDescriptor),
	DRV("cuArrayGetMemoryRequirements", ArrayGetMemoryRequirements),
	DRV("cuMipmappedArrayCreate", MipmappedArrayCreate),
	DRV("cuMipmappedArrayDestroy", MipmappedArrayDestroy),
	DRV("cuMipmappedArrayGetLevel", MipmappedArrayGetLevel),
};

static pthread_mutex_t rt_lock = PTHREAD_MUTEX_INITIALIZER;
static int rt_state;           /* 0: not yet, 1: ready, -1: failed (rt_init_error) */
static cudaError_t rt_init_error;
static int rt_dead_after_fork; /* forked after initialisation: every call fails */
static int device_count;
static const struct simcuda_export_table *sim_table; /* NULL with a driver that has none */

/* Primary contexts: retained once per device; gen counts retains so threads notice a reset. */
static CUcontext contexts[MAX_DEVICES];
static unsigned int context_gen[MAX_DEVICES];
static int context_retained[MAX_DEVICES];

static __thread int tls_device;
static __thread int tls_bound_device = -1;
static __thread unsigned int tls_bound_gen;
static __thread cudaError_t tls_last_error;

static cudaError_t from_driver(CUresult rc)
{
	switch (rc) {
	case CUDA_SUCCESS: return cudaSuccess;
	case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
	case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
	case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
	case CUDA_ERROR_DEINITIALIZED: return cudaErrorCudartUnloading;
	case CUDA_ERROR_STUB_LIBRARY: return cudaErrorStubLibrary;
	case CUDA_ERROR_DEVICE_UNAVAILABLE: return cudaErrorDevicesUnavailable;
	case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
	case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
	case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
	case CUDA_ERROR_MAP_FAILED: return cudaErrorMapBufferObjectFailed;
	case CUDA_ERROR_UNMAP_FAILED: return cudaErrorUnmapBufferObjectFailed;
	case CUDA_ERROR_CONTEXT_IS_DESTROYED: return cudaErrorContextIsDestroyed;
	case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
	case CUDA_ERROR_ILLEGAL_STATE: return cudaErrorIllegalState;
	case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
	case CUDA_ERROR_NOT_READY: return cudaErrorNotReady;
	case CUDA_ERROR_ILLEGAL_ADDRESS: return cudaErrorIllegalAddress;
	case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: return cudaErrorHostMemoryAlreadyRegistered;
	case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: return cudaErrorHostMemoryNotRegistered;
	case CUDA_ERROR_LAUNCH_FAILED: return cudaErrorLaunchFailure;
	case CUDA_ERROR_NOT_PERMITTED: return cudaErrorNotPermitted;
	case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
	case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return cudaErrorStreamCaptureUnsupported;
	case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return cudaErrorStreamCaptureInvalidated;
	case CUDA_ERROR_STREAM_CAPTURE_MERGE: return cudaErrorStreamCaptureMerge;
	case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: return cudaErrorStreamCaptureUnmatched;
	case CUDA_ERROR_STREAM_CAPTURE_UNJOINED: return cudaErrorStreamCaptureUnjoined;
	case CUDA_ERROR_STREAM_CAPTURE_ISOLATION: return cudaErrorStreamCaptureIsolation;
	case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: return cudaErrorStreamCaptureImplicit;
	case CUDA_ERROR_CAPTURED_EVENT: return cudaErrorCapturedEvent;
	case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: return cudaErrorStreamCaptureWrongThread;
	default: return cudaErrorUnknown;
	}
}

/* Every cudaError_t leaves through here: a failure becomes the thread's last error. */
static cudaError_t done(cudaError_t err)
{
	if (err != cudaSuccess)
		tls_last_error = err;
	return err;
}

#define DRIVER(call) done(from_driver(call))

/*
 * rt_lock is held across calls into the driver, whose own fork handlers take
 * its locks: taking rt_lock before fork could deadlock against a thread that
 * holds it and waits for the driver. So the child instead starts with a fresh
 * lock; it is alone, and if the parent had begun initialising, the child is
 * unusable anyway (the driver refuses it too).
 */
static void fork_child(void)
{
	if (rt_state != 0)
		rt_dead_after_fork = 1;
	pthread_mutex_init(&rt_lock, NULL);
}

__attribute__((constructor)) static void runtime_load(void)
{
	pthread_atfork(NULL, NULL, fork_child);
}

static cudaError_t load_driver(void)
{
	CUresult (*get_proc)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	if (lib == NULL)
		return cudaErrorInsufficientDriver;
	*(void **)&get_proc = dlsym(lib, "cuGetProcAddress_v2");
	if (get_proc == NULL)
		return cudaErrorInsufficientDriver;
	drv.GetProcAddress = get_proc;
	drv_pt.GetProcAddress = get_proc;
	for (size_t i = 0; i < sizeof(drv_symbols) / sizeof(drv_symbols[0]); i++) {
		CUdriverProcAddressQueryResult status;
		void **legacy = (void **)((char *)&drv + drv_symbols[i].offset);
		void **per_thread = (void **)((char *)&drv_pt + drv_symbols[i].offset);
		if (get_proc(drv_symbols[i].name, legacy, CUDART_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
			     &status) != CUDA_SUCCESS || *legacy == NULL ||
		    get_proc(drv_symbols[i].name, per_thread, CUDART_VERSION,
			     CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status) != CUDA_SUCCESS ||
		    *per_thread == NULL)
			return cudaErrorInsufficientDriver;
	}
	static const CUuuid table_id = SIMCUDA_EXPORT_TABLE_ID;
	const void *table = NULL;
	if (drv.GetExportTable(&table, &table_id) == CUDA_SUCCESS &&
	    ((const struct simcuda_export_table *)table)->size >= sizeof(struct simcuda_export_table)) {
		sim_table = table;
		sim_table->register_counters(api_names, api_calls, API_COUNT);
	}
	CUresult rc = drv.Init(0);
	if (rc == CUDA_SUCCESS)
		rc = drv.DeviceGetCount(&device_count);
	if (rc != CUDA_SUCCESS)
		return rc == CUDA_ERROR_NO_DEVICE ? cudaErrorNoDevice : cudaErrorInitializationError;
	if (device_count > MAX_DEVICES)
		device_count = MAX_DEVICES;
	return cudaSuccess;
}

static cudaError_t runtime_init(void)
{
	if (__atomic_load_n(&rt_state, __ATOMIC_ACQUIRE) == 1)
		return cudaSuccess;
	pthread_mutex_lock(&rt_lock);
	if (rt_state == 0) {
		rt_init_error = load_driver();
		__atomic_store_n(&rt_state, rt_init_error == cudaSuccess ? 1 : -1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&rt_lock);
	return rt_state == 1 ? cudaSuccess : rt_init_error;
}

/*
 * The calling thread's current context (NULL: none) and its device (-1 when
 * it has none or is destroyed). Through the driver's private table it costs
 * no driver call, as a real runtime's check costs none an interposer sees.
 */
static CUcontext current_context(int *device)
{
	CUcontext ctx = NULL;
	CUdevice dev = -1;

	if (sim_table != NULL)
		return sim_table->current_context(device);
	if (drv.CtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL || drv.CtxGetDevice(&dev) != CUDA_SUCCESS)
		dev = -1;
	*device = dev;
	return ctx;
}

/* The runtime's current device: the current context's, else the one cudaSetDevice set. */
static int runtime_device(void)
{
	int device;

	return current_context(&device) != NULL && device >= 0 ? device : tls_device;
}

/*
 * Retains the device's primary context if needed and makes it current in this
 * thread: with set (cudaSetDevice) always, otherwise only when the thread has
 * no context current. Runtime calls operate on whatever context is current,
 * as CUDA's do with one the application made current with the driver API.
 * Once the thread is bound this checks without a lock (two atomic loads and
 * the driver's thread-local current context), as a real runtime's calls take
 * no process-wide lock after initialisation; retaining takes rt_lock.
 */
static cudaError_t bind_context(int device, int set)
{
	CUresult rc = CUDA_SUCCESS;
	int current_device;
	CUcontext cur = current_context(&current_device);

	if (!set && cur != NULL && tls_bound_device == device &&
	    __atomic_load_n(&context_retained[device], __ATOMIC_ACQUIRE) &&
	    __atomic_load_n(&context_gen[device], __ATOMIC_ACQUIRE) == tls_bound_gen)
		return cudaSuccess;
	pthread_mutex_lock(&rt_lock);
	if (!context_retained[device]) {
		rc = drv.DevicePrimaryCtxRetain(&contexts[device], device);
		if (rc == CUDA_SUCCESS) {
			__atomic_store_n(&context_gen[device], context_gen[device] + 1, __ATOMIC_RELEASE);
			__atomic_store_n(&context_retained[device], 1, __ATOMIC_RELEASE);
		}
	}
	unsigned int gen = context_gen[device];
	CUcontext ctx = contexts[device];
	pthread_mutex_unlock(&rt_lock);
	if (rc == CUDA_SUCCESS && (set || cur == NULL))
		rc = drv.CtxSetCurrent(ctx);
	if (rc != CUDA_SUCCESS)
		return from_driver(rc);
	tls_bound_device = device;
	tls_bound_gen = gen;
	return cudaSuccess;
}

enum { NEED_NOTHING, NEED_DRIVER, NEED_CONTEXT };

/* Entry of every runtime call: counts it, initialises what it needs, injects faults. */
static cudaError_t enter(int api, int need)
{
	if (__atomic_load_n(&rt_dead_after_fork, __ATOMIC_RELAXED))
		return cudaErrorInitializationError;
	uint64_t n = __atomic_add_fetch(&api_calls[api], 1, __ATOMIC_RELAXED);
	if (need == NEED_NOTHING)
		return cudaSuccess;
	cudaError_t err = runtime_init();
	if (err != cudaSuccess)
		return err;
	CUresult fault = sim_table != NULL ? (CUresult)sim_table->should_fail(api_names[api], n) : CUDA_SUCCESS;
	if (fault != CUDA_SUCCESS)
		return from_driver(fault);
	return need == NEED_CONTEXT ? bind_context(tls_device, 0) : cudaSuccess;
}

#define ENTER(name, need)                                          \
	do {                                                       \
		cudaError_t enter_err_ = enter(API_##name, (need)); \
		if (enter_err_ != cudaSuccess)                     \
			return done(enter_err_);                   \
	} while (0)

/* ---- devices ---- */

RT_API cudaError_t cudaGetDeviceCount(int *count)
{
	if (count != NULL)
		*count = 0;
	ENTER(cudaGetDeviceCount, NEED_DRIVER);
	if (count == NULL)
		return done(cudaErrorInvalidValue);
	*count = device_count;
	return cudaSuccess;
}

RT_API cudaError_t cudaGetDevice(int *device)
{
	ENTER(cudaGetDevice, NEED_DRIVER);
	if (device == NULL)
		return done(cudaErrorInvalidValue);
	*device = runtime_device();
	return cudaSuccess;
}

RT_API cudaError_t cudaSetDevice(int device)
{
	ENTER(cudaSetDevice, NEED_DRIVER);
	if (device < 0 || device >= device_count)
		return done(cudaErrorInvalidDevice);
	tls_device = device;
	return done(bind_context(device, 1)); /* since CUDA 12 the context is made at once */
}

RT_API cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
	ENTER(cudaDeviceGetAttribute, NEED_DRIVER);
	return DRIVER(drv.DeviceGetAttribute(value, (CUdevice_attribute)attr, device));
}

static cudaError_t device_properties(struct cudaDeviceProp *prop, int device)
{
	static const struct {
		CUdevice_attribute attr;
		size_t offset;
	} ints[] = {
#define INT_FIELD(a, f) {a, offsetof(struct cudaDeviceProp, f)}
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, regsPerBlock),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_WARP_SIZE, warpSize),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, maxThreadsPerBlock),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, maxThreadsDim[0]),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, maxThreadsDim[1]),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, maxThreadsDim[2]),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, maxGridSize[0]),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, maxGridSize[1]),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, maxGridSize[2]),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_CLOCK_RATE, clockRate),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, major),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, minor),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, deviceOverlap),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, multiProcessorCount),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT, kernelExecTimeoutEnabled),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_INTEGRATED, integrated),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, canMapHostMemory),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, computeMode),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, concurrentKernels),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_ECC_ENABLED, ECCEnabled),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, pciBusID),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, pciDeviceID),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, pciDomainID),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_TCC_DRIVER, tccDriver),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, asyncEngineCount),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, unifiedAddressing),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, memoryClockRate),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, memoryBusWidth),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, l2CacheSize),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, maxThreadsPerMultiProcessor),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, streamPrioritiesSupported),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, managedMemory),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD, isMultiGpuBoard),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, pageableMemoryAccess),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, concurrentManagedAccess),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
			  canUseHostPointerForRegisteredMem),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST,
			  directManagedMemAccessFromHost),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, hostRegisterSupported),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
			  hostRegisterReadOnlySupported),
		INT_FIELD(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, memoryPoolsSupported),
#undef INT_FIELD
	};
	int v;
	CUresult rc;

	if (prop == NULL)
		return cudaErrorInvalidValue;
	if (device < 0 || device >= device_count)
		return cudaErrorInvalidDevice;
	memset(prop, 0, sizeof(*prop));
	rc = drv.DeviceGetName(prop->name, sizeof(prop->name), device);
	if (rc == CUDA_SUCCESS)
		rc = drv.DeviceGetUuid((CUuuid *)&prop->uuid, device);
	if (rc == CUDA_SUCCESS)
		rc = drv.DeviceTotalMem(&prop->totalGlobalMem, device);
	for (size_t i = 0; rc == CUDA_SUCCESS && i < sizeof(ints) / sizeof(ints[0]); i++)
		rc = drv.DeviceGetAttribute((int *)((char *)prop + ints[i].offset), ints[i].attr, device);
	if (rc == CUDA_SUCCESS)
		rc = drv.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, device);
	if (rc == CUDA_SUCCESS)
		prop->sharedMemPerBlock = (size_t)v;
	if (rc == CUDA_SUCCESS)
		rc = drv.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, device);
	if (rc == CUDA_SUCCESS)
		prop->totalConstMem = (size_t)v;
	if (rc == CUDA_SUCCESS)
		rc = drv.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_PITCH, device);
	if (rc == CUDA_SUCCESS)
		prop->memPitch = (size_t)v;
	if (rc == CUDA_SUCCESS)
		rc = drv.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, device);
	if (rc == CUDA_SUCCESS)
		prop->textureAlignment = (size_t)v;
	return from_driver(rc);
}

RT_API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
	ENTER(cudaGetDeviceProperties, NEED_DRIVER);
	return done(device_properties(prop, device));
}

RT_API cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *prop, int device)
{
	ENTER(cudaGetDeviceProperties_v2, NEED_DRIVER);
	return done(device_properties(prop, device));
}

RT_API cudaError_t cudaDeviceSynchronize(void)
{
	ENTER(cudaDeviceSynchronize, NEED_CONTEXT);
	return DRIVER(drv.CtxSynchronize());
}

RT_API cudaError_t cudaDeviceReset(void)
{
	ENTER(cudaDeviceReset, NEED_DRIVER);
	int device = runtime_device();
	CUresult rc = drv.DevicePrimaryCtxReset(device);
	if (rc == CUDA_SUCCESS) {
		/*
		 * A reset leaves the retain count alone: drop the runtime's own retain,
		 * and the next call that needs the context retains (reactivates) it.
		 */
		pthread_mutex_lock(&rt_lock);
		if (context_retained[device])
			rc = drv.DevicePrimaryCtxRelease(device);
		__atomic_store_n(&context_retained[device], 0, __ATOMIC_RELEASE);
		pthread_mutex_unlock(&rt_lock);
	}
	return DRIVER(rc);
}

RT_API cudaError_t cudaDriverGetVersion(int *driverVersion)
{
	if (__atomic_load_n(&rt_dead_after_fork, __ATOMIC_RELAXED))
		return done(cudaErrorInitializationError);
	__atomic_add_fetch(&api_calls[API_cudaDriverGetVersion], 1, __ATOMIC_RELAXED);
	if (driverVersion == NULL)
		return done(cudaErrorInvalidValue);
	/* Without a usable driver the documented answer is version 0, not an error. */
	if (runtime_init() != cudaSuccess || drv.DriverGetVersion(driverVersion) != CUDA_SUCCESS)
		*driverVersion = 0;
	return cudaSuccess;
}

RT_API cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
	ENTER(cudaRuntimeGetVersion, NEED_NOTHING);
	if (runtimeVersion == NULL)
		return done(cudaErrorInvalidValue);
	*runtimeVersion = CUDART_VERSION;
	return cudaSuccess;
}

/* ---- errors ---- */

RT_API cudaError_t cudaGetLastError(void)
{
	ENTER(cudaGetLastError, NEED_NOTHING);
	cudaError_t err = tls_last_error;
	tls_last_error = cudaSuccess;
	return err;
}

RT_API cudaError_t cudaPeekAtLastError(void)
{
	ENTER(cudaPeekAtLastError, NEED_NOTHING);
	return tls_last_error;
}

static const struct {
	cudaError_t code;
	const char *name, *text;
} errors[] = {
	{cudaSuccess, "cudaSuccess", "no error"},
	{cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
	{cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
	{cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
	{cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
	{cudaErrorProfilerDisabled, "cudaErrorProfilerDisabled", "profiler disabled while using external profiling tool"},
	{cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
	{cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
	{cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid device symbol"},
	{cudaErrorInvalidHostPointer, "cudaErrorInvalidHostPointer", "invalid host pointer"},
	{cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
	{cudaErrorInvalidTexture, "cudaErrorInvalidTexture", "invalid texture reference"},
	{cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
	{cudaErrorStubLibrary, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
	{cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"},
	{cudaErrorCallRequiresNewerDriver, "cudaErrorCallRequiresNewerDriver", "API call is not supported in the installed CUDA driver"},
	{cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable", "CUDA-capable device(s) is/are busy or unavailable"},
	{cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
	{cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
	{cudaErrorDeviceNotLicensed, "cudaErrorDeviceNotLicensed", "device doesn't have valid Grid license"},
	{cudaErrorStartupFailure, "cudaErrorStartupFailure", "startup failure in cuda runtime"},
	{cudaErrorInvalidKernelImage, "cudaErrorInvalidKernelImage", "device kernel image is invalid"},
	{cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
	{cudaErrorMapBufferObjectFailed, "cudaErrorMapBufferObjectFailed", "mapping of buffer object failed"},
	{cudaErrorUnmapBufferObjectFailed, "cudaErrorUnmapBufferObjectFailed", "unmapping of buffer object failed"},
	{cudaErrorAlreadyMapped, "cudaErrorAlreadyMapped", "resource already mapped"},
	{cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice", "no kernel image is available for execution on the device"},
	{cudaErrorAlreadyAcquired, "cudaErrorAlreadyAcquired", "resource already acquired"},
	{cudaErrorNotMapped, "cudaErrorNotMapped", "resource not mapped"},
	{cudaErrorInvalidSource, "cudaErrorInvalidSource", "device kernel image is invalid"},
	{cudaErrorFileNotFound, "cudaErrorFileNotFound", "file not found"},
	{cudaErrorOperatingSystem, "cudaErrorOperatingSystem", "OS call failed or operation not supported on this OS"},
	{cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
	{cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
	{cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
	{cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
	{cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
	{cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
	{cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
	{cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled", "peer access is already enabled"},
	{cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled", "peer access has not been enabled"},
	{cudaErrorSetOnActiveProcess, "cudaErrorSetOnActiveProcess", "cannot set while device is active in this process"},
	{cudaErrorContextIsDestroyed, "cudaErrorContextIsDestroyed", "context is destroyed"},
	{cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
	{cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered", "part or all of the requested memory range is already mapped"},
	{cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered", "pointer does not correspond to a registered memory region"},
	{cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
	{cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
	{cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
	{cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
	{cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
	{cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge", "operation would result in a merge of separate capture sequences"},
	{cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched", "capture was not ended in the same stream as it began"},
	{cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined", "capturing stream has unjoined work"},
	{cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation", "dependency created on uncaptured work in another stream"},
	{cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit", "operation would make the legacy stream depend on a capturing blocking stream"},
	{cudaErrorCapturedEvent, "cudaErrorCapturedEvent", "operation not permitted on an event last recorded in a capturing stream"},
	{cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread", "attempt to terminate a thread-local capture sequence from another thread"},
	{cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

static const char *error_text(cudaError_t error, int name)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].code == error)
			return name ? errors[i].name : errors[i].text;
	return "unrecognized error code";
}

RT_API const char *cudaGetErrorString(cudaError_t error)
{
	if (!__atomic_load_n(&rt_dead_after_fork, __ATOMIC_RELAXED))
		__atomic_add_fetch(&api_calls[API_cudaGetErrorString], 1, __ATOMIC_RELAXED);
	return error_text(error, 0);
}

RT_API const char *cudaGetErrorName(cudaError_t error)
{
	if (!__atomic_load_n(&rt_dead_after_fork, __ATOMIC_RELAXED))
		__atomic_add_fetch(&api_calls[API_cudaGetErrorName], 1, __ATOMIC_RELAXED);
	return error_text(error, 1);
}

/* ---- memory ---- */

RT_API cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	ENTER(cudaMalloc, NEED_CONTEXT);
	if (devPtr == NULL)
		return done(cudaErrorInvalidValue);
	if (size == 0) {
		*devPtr = NULL; /* documented: a zero-byte request succeeds with NULL */
		return cudaSuccess;
	}
	return DRIVER(drv.MemAlloc((CUdeviceptr *)devPtr, size));
}

RT_API cudaError_t cudaFree(void *devPtr)
{
	ENTER(cudaFree, NEED_CONTEXT);
	if (devPtr == NULL)
		return cudaSuccess;
	return DRIVER(drv.MemFree((CUdeviceptr)devPtr));
}

RT_API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
	ENTER(cudaMallocManaged, NEED_CONTEXT);
	return DRIVER(drv.MemAllocManaged((CUdeviceptr *)devPtr, size, flags));
}

RT_API cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
	ENTER(cudaMallocPitch, NEED_CONTEXT);
	return DRIVER(drv.MemAllocPitch((CUdeviceptr *)devPtr, pitch, width, height, 16));
}

/* One pitched allocation of height x depth rows, as cudaMallocPitch makes them. */
RT_API cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent)
{
	ENTER(cudaMalloc3D, NEED_CONTEXT);
	if (pitchedDevPtr == NULL)
		return done(cudaErrorInvalidValue);
	if (extent.depth != 0 && extent.height > SIZE_MAX / extent.depth)
		return done(cudaErrorMemoryAllocation); /* as the driver answers a size it cannot hold */
	CUdeviceptr p;
	size_t pitch;
	CUresult rc = drv.MemAllocPitch(&p, &pitch, extent.width, extent.height * extent.depth, 16);
	if (rc != CUDA_SUCCESS)
		return DRIVER(rc);
	*pitchedDevPtr = (struct cudaPitchedPtr){(void *)p, pitch, extent.width, extent.height};
	return cudaSuccess;
}

RT_API cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	ENTER(cudaMallocHost, NEED_CONTEXT);
	if (ptr != NULL && size == 0) {
		*ptr = NULL; /* as cudaMalloc: zero bytes succeed with NULL (the driver refuses 0) */
		return cudaSuccess;
	}
	return DRIVER(drv.MemAllocHost(ptr, size));
}

RT_API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	ENTER(cudaHostAlloc, NEED_CONTEXT);
	if (pHost != NULL && size == 0 &&
	    !(flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped |
				  cudaHostAllocWriteCombined))) {
		*pHost = NULL; /* see cudaMallocHost */
		return cudaSuccess;
	}
	return DRIVER(drv.MemHostAlloc(pHost, size, flags));
}

RT_API cudaError_t cudaFreeHost(void *ptr)
{
	ENTER(cudaFreeHost, NEED_CONTEXT);
	if (ptr == NULL)
		return cudaSuccess; /* as cudaFree(NULL), so a zero-byte cudaMallocHost can be freed */
	return DRIVER(drv.MemFreeHost(ptr));
}

RT_API cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
	ENTER(cudaHostGetDevicePointer, NEED_CONTEXT);
	return DRIVER(drv.MemHostGetDevicePointer((CUdeviceptr *)pDevice, pHost, flags));
}

/* Both go to the driver, as NVIDIA's runtime does, so a driver interposer sees them. */
RT_API cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
	ENTER(cudaHostRegister, NEED_CONTEXT);
	return DRIVER(drv.MemHostRegister(ptr, size, flags));
}

RT_API cudaError_t cudaHostUnregister(void *ptr)
{
	ENTER(cudaHostUnregister, NEED_CONTEXT);
	return DRIVER(drv.MemHostUnregister(ptr));
}

RT_API cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
	ENTER(cudaMemGetInfo, NEED_CONTEXT);
	return DRIVER(drv.MemGetInfo(free, total));
}

/* A copy through driver dv: the legacy or the per-thread default stream's. */
static cudaError_t memcpy_with(const struct driver *dv, void *dst, const void *src, size_t count,
			       enum cudaMemcpyKind kind)
{
	CUdeviceptr d = (CUdeviceptr)dst, s = (CUdeviceptr)src;

	switch (kind) {
	case cudaMemcpyHostToDevice: return DRIVER(dv->MemcpyHtoD(d, src, count));
	case cudaMemcpyDeviceToHost: return DRIVER(dv->MemcpyDtoH(dst, s, count));
	case cudaMemcpyDeviceToDevice: return DRIVER(dv->MemcpyDtoD(d, s, count));
	case cudaMemcpyHostToHost:
	case cudaMemcpyDefault: return DRIVER(dv->Memcpy(d, s, count));
	default: return done(cudaErrorInvalidMemcpyDirection);
	}
}

RT_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	ENTER(cudaMemcpy, NEED_CONTEXT);
	return memcpy_with(&drv, dst, src, count, kind);
}

RT_API cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	ENTER(cudaMemcpy_ptds, NEED_CONTEXT);
	return memcpy_with(&drv_pt, dst, src, count, kind);
}

static cudaError_t memcpy_async_with(const struct driver *dv, void *dst, const void *src,
				     size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
	CUdeviceptr d = (CUdeviceptr)dst, s = (CUdeviceptr)src;

	switch (kind) {
	case cudaMemcpyHostToDevice: return DRIVER(dv->MemcpyHtoDAsync(d, src, count, stream));
	case cudaMemcpyDeviceToHost: return DRIVER(dv->MemcpyDtoHAsync(dst, s, count, stream));
	case cudaMemcpyDeviceToDevice: return DRIVER(dv->MemcpyDtoDAsync(d, s, count, stream));
	case cudaMemcpyHostToHost:
	case cudaMemcpyDefault: return DRIVER(dv->MemcpyAsync(d, s, count, stream));
	default: return done(cudaErrorInvalidMemcpyDirection);
	}
}

RT_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
				   enum cudaMemcpyKind kind, cudaStream_t stream)
{
	ENTER(cudaMemcpyAsync, NEED_CONTEXT);
	return memcpy_async_with(&drv, dst, src, count, kind, stream);
}

RT_API cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
					enum cudaMemcpyKind kind, cudaStream_t stream)
{
	ENTER(cudaMemcpyAsync_ptsz, NEED_CONTEXT);
	return memcpy_async_with(&drv_pt, dst, src, count, kind, stream);
}

RT_API cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
	ENTER(cudaMemset, NEED_CONTEXT);
	return DRIVER(drv.MemsetD8((CUdeviceptr)devPtr, (unsigned char)value, count));
}

RT_API cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count)
{
	ENTER(cudaMemset_ptds, NEED_CONTEXT);
	return DRIVER(drv_pt.MemsetD8((CUdeviceptr)devPtr, (unsigned char)value, count));
}

RT_API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	ENTER(cudaMemsetAsync, NEED_CONTEXT);
	return DRIVER(drv.MemsetD8Async((CUdeviceptr)devPtr, (unsigned char)value, count, stream));
}

RT_API cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	ENTER(cudaMemsetAsync_ptsz, NEED_CONTEXT);
	return DRIVER(drv_pt.MemsetD8Async((CUdeviceptr)devPtr, (unsigned char)value, count, stream));
}

static CUmemLocation location_of(int device)
{
	CUmemLocation loc;

	loc.type = device == cudaCpuDeviceId ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
	loc.id = device == cudaCpuDeviceId ? 0 : device;
	return loc;
}

RT_API cudaError_t cudaMemAdvise(const void *devPtr, size_t count, enum cudaMemoryAdvise advice,
				 int device)
{
	ENTER(cudaMemAdvise, NEED_CONTEXT);
	return DRIVER(drv.MemAdvise((CUdeviceptr)devPtr, count, (CUmem_advise)advice,
				    location_of(device)));
}

RT_API cudaError_t cudaMemPrefetchAsync(const void *devPtr, size_t count, int dstDevice,
					cudaStream_t stream)
{
	ENTER(cudaMemPrefetchAsync, NEED_CONTEXT);
	return DRIVER(drv.MemPrefetchAsync((CUdeviceptr)devPtr, count, location_of(dstDevice), 0,
					   stream));
}

RT_API cudaError_t cudaMemPrefetchAsync_ptsz(const void *devPtr, size_t count, int dstDevice,
					     cudaStream_t stream)
{
	ENTER(cudaMemPrefetchAsync_ptsz, NEED_CONTEXT);
	return DRIVER(drv_pt.MemPrefetchAsync((CUdeviceptr)devPtr, count, location_of(dstDevice), 0,
					      stream));
}

RT_API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
	ENTER(cudaMallocAsync, NEED_CONTEXT);
	return DRIVER(drv.MemAllocAsync((CUdeviceptr *)devPtr, size, hStream));
}

RT_API cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
	ENTER(cudaMallocAsync_ptsz, NEED_CONTEXT);
	return DRIVER(drv_pt.MemAllocAsync((CUdeviceptr *)devPtr, size, hStream));
}

RT_API cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
	ENTER(cudaFreeAsync, NEED_CONTEXT);
	return DRIVER(drv.MemFreeAsync((CUdeviceptr)devPtr, hStream));
}

RT_API cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
	ENTER(cudaFreeAsync_ptsz, NEED_CONTEXT);
	return DRIVER(drv_pt.MemFreeAsync((CUdeviceptr)devPtr, hStream));
}

RT_API cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
					   cudaStream_t stream)
{
	ENTER(cudaMallocFromPoolAsync, NEED_CONTEXT);
	return DRIVER(drv.MemAllocFromPoolAsync((CUdeviceptr *)ptr, size, memPool, stream));
}

RT_API cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
						cudaStream_t stream)
{
	ENTER(cudaMallocFromPoolAsync_ptsz, NEED_CONTEXT);
	return DRIVER(drv_pt.MemAllocFromPoolAsync((CUdeviceptr *)ptr, size, memPool, stream));
}

RT_API cudaError_t cudaMemPoolCreate(cudaMemPool_t *memPool, const struct cudaMemPoolProps *poolProps)
{
	ENTER(cudaMemPoolCreate, NEED_DRIVER);
	if (poolProps == NULL)
		return done(cudaErrorInvalidValue);
	CUmemPoolProps props = {
		.allocType = (CUmemAllocationType)poolProps->allocType,
		.handleTypes = (CUmemAllocationHandleType)poolProps->handleTypes,
		.location = {(CUmemLocationType)poolProps->location.type, poolProps->location.id},
		.win32SecurityAttributes = poolProps->win32SecurityAttributes,
		.maxSize = poolProps->maxSize,
		.usage = poolProps->usage,
	};
	return DRIVER(drv.MemPoolCreate(memPool, &props));
}

RT_API cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool)
{
	ENTER(cudaMemPoolDestroy, NEED_DRIVER);
	return DRIVER(drv.MemPoolDestroy(memPool));
}

RT_API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
	ENTER(cudaDeviceGetDefaultMemPool, NEED_DRIVER);
	return DRIVER(drv.DeviceGetDefaultMemPool(memPool, device));
}

RT_API cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device)
{
	ENTER(cudaDeviceGetMemPool, NEED_DRIVER);
	return DRIVER(drv.DeviceGetMemPool(memPool, device));
}

RT_API cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
					   void *value)
{
	ENTER(cudaMemPoolSetAttribute, NEED_DRIVER);
	return DRIVER(drv.MemPoolSetAttribute(memPool, (CUmemPool_attribute)attr, value));
}

RT_API cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
					   void *value)
{
	ENTER(cudaMemPoolGetAttribute, NEED_DRIVER);
	return DRIVER(drv.MemPoolGetAttribute(memPool, (CUmemPool_attribute)attr, value));
}

RT_API cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep)
{
	ENTER(cudaMemPoolTrimTo, NEED_DRIVER);
	return DRIVER(drv.MemPoolTrimTo(memPool, minBytesToKeep));
}

RT_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
					    const void *ptr)
{
	CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
				       CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
				       CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
				       CU_POINTER_ATTRIBUTE_HOST_POINTER};
	unsigned int type = 0;
	int managed = 0, device = cudaInvalidDeviceId;
	CUdeviceptr dptr = 0;
	void *hptr = NULL;
	void *data[] = {&type, &managed, &device, &dptr, &hptr};

	ENTER(cudaPointerGetAttributes, NEED_DRIVER);
	if (attributes == NULL)
		return done(cudaErrorInvalidValue);
	CUresult rc = drv.PointerGetAttributes(5, which, data, (CUdeviceptr)ptr);
	if (rc != CUDA_SUCCESS)
		return DRIVER(rc);
	attributes->type = managed ? cudaMemoryTypeManaged
			 : type == CU_MEMORYTYPE_DEVICE ? cudaMemoryTypeDevice
			 : type == CU_MEMORYTYPE_HOST ? cudaMemoryTypeHost
						      : cudaMemoryTypeUnregistered;
	attributes->device = device;
	attributes->devicePointer = (void *)dptr;
	/*
	 * Unregistered memory: CUDA hands the pointer back as the host pointer
	 * without checking it (cudaPointerAttributes::hostPointer). Only these four
	 * fields are written: callers built with the older 24-byte struct have no
	 * reserved[] for us to touch.
	 */
	attributes->hostPointer = attributes->type == cudaMemoryTypeUnregistered ? (void *)ptr : hptr;
	return cudaSuccess;
}

/* ---- interprocess memory handles: the driver's cuIpc* calls ---- */

_Static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle),
	       "cudaIpcMemHandle_t is the driver's CUipcMemHandle");
_Static_assert(cudaIpcMemLazyEnablePeerAccess == CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
	       "the runtime's IPC flag is the driver's");

RT_API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
	ENTER(cudaIpcGetMemHandle, NEED_CONTEXT);
	return DRIVER(drv.IpcGetMemHandle((CUipcMemHandle *)handle, (CUdeviceptr)devPtr));
}

RT_API cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
	CUipcMemHandle h;

	ENTER(cudaIpcOpenMemHandle, NEED_CONTEXT);
	memcpy(&h, &handle, sizeof(h));
	return DRIVER(drv.IpcOpenMemHandle((CUdeviceptr *)devPtr, h, flags));
}

RT_API cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
	ENTER(cudaIpcCloseMemHandle, NEED_CONTEXT);
	return DRIVER(drv.IpcCloseMemHandle((CUdeviceptr)devPtr));
}

/* ---- streams, events, host functions ---- */

RT_API cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
	ENTER(cudaStreamCreate, NEED_CONTEXT);
	return DRIVER(drv.StreamCreate(pStream, cudaStreamDefault));
}

RT_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
	ENTER(cudaStreamCreateWithFlags, NEED_CONTEXT);
	return DRIVER(drv.StreamCreate(pStream, flags));
}

RT_API cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
	ENTER(cudaStreamDestroy, NEED_CONTEXT);
	return DRIVER(drv.StreamDestroy(stream));
}

RT_API cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	ENTER(cudaStreamSynchronize, NEED_CONTEXT);
	return DRIVER(drv.StreamSynchronize(stream));
}

RT_API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
	ENTER(cudaStreamSynchronize_ptsz, NEED_CONTEXT);
	return DRIVER(drv_pt.StreamSynchronize(stream));
}

RT_API cudaError_t cudaStreamQuery(cudaStream_t stream)
{
	ENTER(cudaStreamQuery, NEED_CONTEXT);
	/*
	 * cudaErrorNotReady becomes the last error like any other code: real
	 * applications clear it with cudaGetLastError after a not-ready query.
	 */
	return DRIVER(drv.StreamQuery(stream));
}

RT_API cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream)
{
	ENTER(cudaStreamQuery_ptsz, NEED_CONTEXT);
	return DRIVER(drv_pt.StreamQuery(stream));
}

RT_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
	ENTER(cudaStreamWaitEvent, NEED_CONTEXT);
	return DRIVER(drv.StreamWaitEvent(stream, event, flags));
}

RT_API cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
	ENTER(cudaStreamWaitEvent_ptsz, NEED_CONTEXT);
	return DRIVER(drv_pt.StreamWaitEvent(stream, event, flags));
}

RT_API cudaError_t cudaEventCreate(cudaEvent_t *event)
{
	ENTER(cudaEventCreate, NEED_CONTEXT);
	return DRIVER(drv.EventCreate(event, cudaEventDefault));
}

RT_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
	ENTER(cudaEventCreateWithFlags, NEED_CONTEXT);
	return DRIVER(drv.EventCreate(event, flags));
}

RT_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	ENTER(cudaEventRecord, NEED_CONTEXT);
	return DRIVER(drv.EventRecord(event, stream));
}

RT_API cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream)
{
	ENTER(cudaEventRecord_ptsz, NEED_CONTEXT);
	return DRIVER(drv_pt.EventRecord(event, stream));
}

RT_API cudaError_t cudaEventQuery(cudaEvent_t event)
{
	ENTER(cudaEventQuery, NEED_CONTEXT);
	return DRIVER(drv.EventQuery(event)); /* not ready is recorded too (see cudaStreamQuery) */
}

RT_API cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	ENTER(cudaEventSynchronize, NEED_CONTEXT);
	return DRIVER(drv.EventSynchronize(event));
}

RT_API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
	ENTER(cudaEventElapsedTime, NEED_CONTEXT);
	return DRIVER(drv.EventElapsedTime(ms, start, end));
}

RT_API cudaError_t cudaEventDestroy(cudaEvent_t event)
{
	ENTER(cudaEventDestroy, NEED_CONTEXT);
	return DRIVER(drv.EventDestroy(event));
}

RT_API cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
	ENTER(cudaLaunchHostFunc, NEED_CONTEXT);
	return DRIVER(drv.LaunchHostFunc(stream, fn, userData));
}

RT_API cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
	ENTER(cudaLaunchHostFunc_ptsz, NEED_CONTEXT);
	return DRIVER(drv_pt.LaunchHostFunc(stream, fn, userData));
}

/* ---- stream capture and graphs ---- */

RT_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
	ENTER(cudaStreamBeginCapture, NEED_CONTEXT);
	return DRIVER(drv.StreamBeginCapture(stream, (CUstreamCaptureMode)mode));
}

RT_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
	ENTER(cudaStreamEndCapture, NEED_CONTEXT);
	return DRIVER(drv.StreamEndCapture(stream, pGraph));
}

RT_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
					 enum cudaStreamCaptureStatus *pCaptureStatus)
{
	ENTER(cudaStreamIsCapturing, NEED_CONTEXT);
	return DRIVER(drv.StreamIsCapturing(stream, (CUstreamCaptureStatus *)pCaptureStatus));
}

static cudaError_t capture_info(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
				unsigned long long *id, cudaGraph_t *graph,
				const cudaGraphNode_t **deps, size_t *ndeps)
{
	return DRIVER(drv.StreamGetCaptureInfo(stream, (CUstreamCaptureStatus *)status,
					       (cuuint64_t *)id, graph, deps, ndeps));
}

RT_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
					    enum cudaStreamCaptureStatus *captureStatus_out,
					    unsigned long long *id_out, cudaGraph_t *graph_out,
					    const cudaGraphNode_t **dependencies_out,
					    size_t *numDependencies_out)
{
	ENTER(cudaStreamGetCaptureInfo, NEED_CONTEXT);
	return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out,
			    numDependencies_out);
}

RT_API cudaError_t cudaStreamGetCaptureInfo_v2(cudaStream_t stream,
					       enum cudaStreamCaptureStatus *captureStatus_out,
					       unsigned long long *id_out, cudaGraph_t *graph_out,
					       const cudaGraphNode_t **dependencies_out,
					       size_t *numDependencies_out)
{
	ENTER(cudaStreamGetCaptureInfo_v2, NEED_CONTEXT);
	return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out,
			    numDependencies_out);
}

RT_API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
	ENTER(cudaThreadExchangeStreamCaptureMode, NEED_DRIVER);
	return DRIVER(drv.ThreadExchangeStreamCaptureMode((CUstreamCaptureMode *)mode));
}

RT_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
					unsigned long long flags)
{
	ENTER(cudaGraphInstantiate, NEED_CONTEXT);
	return DRIVER(drv.GraphInstantiate(pGraphExec, graph, flags));
}

RT_API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
						 unsigned long long flags)
{
	ENTER(cudaGraphInstantiateWithFlags, NEED_CONTEXT);
	return DRIVER(drv.GraphInstantiate(pGraphExec, graph, flags));
}

RT_API cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	ENTER(cudaGraphLaunch, NEED_CONTEXT);
	return DRIVER(drv.GraphLaunch(graphExec, stream));
}

RT_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
	ENTER(cudaGraphExecDestroy, NEED_CONTEXT);
	return DRIVER(drv.GraphExecDestroy(graphExec));
}

RT_API cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
	ENTER(cudaGraphDestroy, NEED_CONTEXT);
	return DRIVER(drv.GraphDestroy(graph));
}

/* ---- driver entry points ---- */

/*
 * Both go to the driver's cuGetProcAddress with the flags translated:
 * cudaEnableDefault means the default stream of the runtime's ordinary
 * names, the legacy one. A symbol the driver lacks, or lacks
 * at that version, is not an error: funcPtr is NULL and driverStatus says why.
 */
static cudaError_t driver_entry_point(const char *symbol, void **funcPtr, int version,
				      unsigned long long flags,
				      enum cudaDriverEntryPointQueryResult *driverStatus)
{
	cuuint64_t cu_flags;
	CUdriverProcAddressQueryResult status;

	switch (flags) {
	case cudaEnableDefault:
	case cudaEnableLegacyStream: cu_flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM; break;
	case cudaEnablePerThreadDefaultStream:
		cu_flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
		break;
	default: return done(cudaErrorInvalidValue);
	}
	if (symbol == NULL || funcPtr == NULL)
		return done(cudaErrorInvalidValue);
	CUresult rc = drv.GetProcAddress(symbol, funcPtr, version, cu_flags, &status);
	if (rc != CUDA_SUCCESS)
		return DRIVER(rc);
	if (driverStatus != NULL)
		*driverStatus = status == CU_GET_PROC_ADDRESS_SUCCESS ? cudaDriverEntryPointSuccess
				: status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
					? cudaDriverEntryPointVersionNotSufficent
					: cudaDriverEntryPointSymbolNotFound;
	return cudaSuccess;
}

RT_API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
					   unsigned long long flags,
					   enum cudaDriverEntryPointQueryResult *driverStatus)
{
	ENTER(cudaGetDriverEntryPoint, NEED_DRIVER);
	return driver_entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus);
}

RT_API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
						    unsigned int cudaVersion,
						    unsigned long long flags,
						    enum cudaDriverEntryPointQueryResult *driverStatus)
{
	ENTER(cudaGetDriverEntryPointByVersion, NEED_DRIVER);
	if (cudaVersion > INT32_MAX)
		return done(cudaErrorInvalidValue);
	return driver_entry_point(symbol, funcPtr, (int)cudaVersion, flags, driverStatus);
}

/* ---- arrays: the driver's CUarray, made and described with cuArray3DCreate_v2 ---- */

/*
 * The driver's format and channel count of a channel descriptor: 1, 2 or 4
 * components from x on, all of one size (8, 16 or 32 bits; float: 16 or
 * 32). cudaErrorInvalidChannelDescriptor otherwise, cudaErrorNotSupported
 * for NV12 (as the driver for CU_AD_FORMAT_NV12).
 */
static cudaError_t channel_format(const struct cudaChannelFormatDesc *desc, CUarray_format *format,
				  unsigned int *channels)
{
	const int bits[4] = {desc->x, desc->y, desc->z, desc->w};
	unsigned int n = 0;

	if (desc->f == cudaChannelFormatKindNV12)
		return cudaErrorNotSupported;
	while (n < 4 && bits[n] != 0)
		n++;
	for (unsigned int i = 0; i < 4; i++)
		if (bits[i] != (i < n ? bits[0] : 0))
			return cudaErrorInvalidChannelDescriptor;
	if (n == 0 || n == 3)
		return cudaErrorInvalidChannelDescriptor;
	*channels = n;
	switch (desc->f) {
	case cudaChannelFormatKindSigned:
	case cudaChannelFormatKindUnsigned: {
		int sign = desc->f == cudaChannelFormatKindSigned;
		switch (bits[0]) {
		case 8: *format = sign ? CU_AD_FORMAT_SIGNED_INT8 : CU_AD_FORMAT_UNSIGNED_INT8; return cudaSuccess;
		case 16: *format = sign ? CU_AD_FORMAT_SIGNED_INT16 : CU_AD_FORMAT_UNSIGNED_INT16; return cudaSuccess;
		case 32: *format = sign ? CU_AD_FORMAT_SIGNED_INT32 : CU_AD_FORMAT_UNSIGNED_INT32; return cudaSuccess;
		}
		break;
	}
	case cudaChannelFormatKindFloat:
		if (bits[0] == 16 || bits[0] == 32) {
			*format = bits[0] == 16 ? CU_AD_FORMAT_HALF : CU_AD_FORMAT_FLOAT;
			return cudaSuccess;
		}
		break;
	default:
		break;
	}
	return cudaErrorInvalidChannelDescriptor;
}

static cudaError_t malloc_array(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
				struct cudaExtent extent, unsigned int flags)
{
	CUDA_ARRAY3D_DESCRIPTOR d = {.Width = extent.width, .Height = extent.height,
				     .Depth = extent.depth, .Flags = flags};

	if (array == NULL || desc == NULL)
		return done(cudaErrorInvalidValue);
	cudaError_t err = channel_format(desc, &d.Format, &d.NumChannels);
	if (err != cudaSuccess)
		return done(err);
	return DRIVER(drv.Array3DCreate((CUarray *)array, &d));
}

RT_API cudaError_t cudaMallocArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
				   size_t width, size_t height, unsigned int flags)
{
	ENTER(cudaMallocArray, NEED_CONTEXT);
	/* A 1D or 2D array: the layered and cubemap shapes are cudaMalloc3DArray's. */
	if (flags & (cudaArrayLayered | cudaArrayCubemap))
		return done(cudaErrorInvalidValue);
	return malloc_array(array, desc, (struct cudaExtent){width, height, 0}, flags);
}

RT_API cudaError_t cudaMalloc3DArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
				     struct cudaExtent extent, unsigned int flags)
{
	ENTER(cudaMalloc3DArray, NEED_CONTEXT);
	return malloc_array(array, desc, extent, flags);
}

RT_API cudaError_t cudaFreeArray(cudaArray_t array)
{
	ENTER(cudaFreeArray, NEED_CONTEXT);
	if (array == NULL)
		return cudaSuccess; /* documented: no operation */
	return DRIVER(drv.ArrayDestroy((CUarray)array));
}

/* The channel descriptor of a driver format and channel count (made by channel_format). */
static struct cudaChannelFormatDesc channel_desc(CUarray_format format, unsigned int channels)
{
	struct cudaChannelFormatDesc desc = {0};
	int bits = 32;

	switch (format) {
	case CU_AD_FORMAT_SIGNED_INT8:
	case CU_AD_FORMAT_UNSIGNED_INT8: bits = 8; break;
	case CU_AD_FORMAT_SIGNED_INT16:
	case CU_AD_FORMAT_UNSIGNED_INT16:
	case CU_AD_FORMAT_HALF: bits = 16; break;
	default: break;
	}
	desc.f = format == CU_AD_FORMAT_HALF || format == CU_AD_FORMAT_FLOAT ? cudaChannelFormatKindFloat
		 : format == CU_AD_FORMAT_SIGNED_INT8 || format == CU_AD_FORMAT_SIGNED_INT16 ||
				 format == CU_AD_FORMAT_SIGNED_INT32
			 ? cudaChannelFormatKindSigned
			 : cudaChannelFormatKindUnsigned;
	desc.x = bits;
	desc.y = channels >= 2 ? bits : 0;
	desc.z = channels >= 4 ? bits : 0;
	desc.w = channels >= 4 ? bits : 0;
	return desc;
}

/* Any of desc, extent and flags may be NULL, as documented. */
RT_API cudaError_t cudaArrayGetInfo(struct cudaChannelFormatDesc *desc, struct cudaExtent *extent,
				    unsigned int *flags, cudaArray_t array)
{
	CUDA_ARRAY3D_DESCRIPTOR d;

	ENTER(cudaArrayGetInfo, NEED_DRIVER);
	CUresult rc = drv.Array3DGetDescriptor(&d, (CUarray)array);
	if (rc != CUDA_SUCCESS)
		return DRIVER(rc);
	if (desc != NULL)
		*desc = channel_desc(d.Format, d.NumChannels);
	if (extent != NULL)
		*extent = (struct cudaExtent){d.Width, d.Height, d.Depth};
	if (flags != NULL)
		*flags = d.Flags;
	return cudaSuccess;
}

RT_API cudaError_t cudaArrayGetMemoryRequirements(struct cudaArrayMemoryRequirements *memoryRequirements,
						  cudaArray_t array, int device)
{
	_Static_assert(sizeof(struct cudaArrayMemoryRequirements) == sizeof(CUDA_ARRAY_MEMORY_REQUIREMENTS),
		       "cudaArrayMemoryRequirements is laid out as CUDA_ARRAY_MEMORY_REQUIREMENTS");
	ENTER(cudaArrayGetMemoryRequirements, NEED_DRIVER);
	return DRIVER(drv.ArrayGetMemoryRequirements((CUDA_ARRAY_MEMORY_REQUIREMENTS *)memoryRequirements,
						     (CUarray)array, device));
}

/* ---- mipmapped arrays: the driver's CUmipmappedArray, its levels CUarrays ---- */

RT_API cudaError_t cudaMallocMipmappedArray(cudaMipmappedArray_t *mipmappedArray,
					    const struct cudaChannelFormatDesc *desc, struct cudaExtent extent,
					    unsigned int numLevels, unsigned int flags)
{
	CUDA_ARRAY3D_DESCRIPTOR d = {.Width = extent.width, .Height = extent.height,
				     .Depth = extent.depth, .Flags = flags};

	ENTER(cudaMallocMipmappedArray, NEED_CONTEXT);
	if (mipmappedArray == NULL || desc == NULL)
		return done(cudaErrorInvalidValue);
	cudaError_t err = channel_format(desc, &d.Format, &d.NumChannels);
	if (err != cudaSuccess)
		return done(err);
	return DRIVER(drv.MipmappedArrayCreate((CUmipmappedArray *)mipmappedArray, &d, numLevels));
}

RT_API cudaError_t cudaFreeMipmappedArray(cudaMipmappedArray_t mipmappedArray)
{
	ENTER(cudaFreeMipmappedArray, NEED_CONTEXT);
	if (mipmappedArray == NULL)
		return cudaSuccess; /* documented: no operation */
	return DRIVER(drv.MipmappedArrayDestroy((CUmipmappedArray)mipmappedArray));
}

/* A null or unknown mipmapped array: cudaErrorInvalidResourceHandle, as documented. */
RT_API cudaError_t cudaGetMipmappedArrayLevel(cudaArray_t *levelArray,
					      cudaMipmappedArray_const_t mipmappedArray, unsigned int level)
{
	ENTER(cudaGetMipmappedArrayLevel, NEED_DRIVER);
	return DRIVER(drv.MipmappedArrayGetLevel((CUarray *)levelArray, (CUmipmappedArray)mipmappedArray,
						 level));
}
