package interpose

/*
#cgo CFLAGS: -I${SRCDIR}/include -I${SRCDIR}
#include <stdint.h>
#include <string.h>
#include "real.h"

// The driver's calls made for the core where the process has no runtime.
// A call with ctx set runs with that context current and puts the
// caller's back; with ctx NULL it runs in the calling thread's context.

struct drv_guard {
	CUcontext prev;
	int switched;
};

static CUresult drv_enter(const struct spillway_real *r, CUcontext ctx, struct drv_guard *g) {
	g->switched = 0;
	if (!ctx)
		return CUDA_SUCCESS;
	CUcontext cur = NULL;
	CUresult rc = r->cu_ctx_get_current(&cur);
	if (rc != CUDA_SUCCESS || cur == ctx)
		return rc;
	if ((rc = r->cu_ctx_set_current(ctx)) == CUDA_SUCCESS) {
		g->prev = cur;
		g->switched = 1;
	}
	return rc;
}

static void drv_leave(const struct spillway_real *r, const struct drv_guard *g) {
	if (g->switched)
		r->cu_ctx_set_current(g->prev);
}

#define IN_CONTEXT(call)                          \
	struct drv_guard g;                           \
	CUresult rc = drv_enter(r, ctx, &g);          \
	if (rc == CUDA_SUCCESS) {                     \
		rc = (call);                              \
		drv_leave(r, &g);                         \
	}

struct drv_out {
	uint64_t v, w;
	CUresult rc;
};

// The first function the driver runtime needs that the table lacks, or NULL.
static const char *drv_missing(const struct spillway_real *r) {
	if (!r->cu_mem_alloc) return "cuMemAlloc_v2";
	if (!r->cu_mem_free) return "cuMemFree_v2";
	if (!r->cu_mem_get_info) return "cuMemGetInfo_v2";
	if (!r->cu_ctx_get_current) return "cuCtxGetCurrent";
	if (!r->cu_ctx_set_current) return "cuCtxSetCurrent";
	if (!r->cu_ctx_get_device) return "cuCtxGetDevice";
	if (!r->cu_primary_ctx_retain) return "cuDevicePrimaryCtxRetain";
	if (!r->cu_ctx_synchronize) return "cuCtxSynchronize";
	return NULL;
}

struct drv_ctx {
	CUcontext ctx;
	CUresult rc;
};

// drv_retain retains device's primary context, which is of use only where
// the table can also make it current.
static struct drv_ctx drv_retain(const struct spillway_real *r, int device) {
	struct drv_ctx o = {NULL, CUDA_ERROR_NOT_FOUND};
	if (r->cu_primary_ctx_retain && r->cu_ctx_get_current && r->cu_ctx_set_current)
		o.rc = r->cu_primary_ctx_retain(&o.ctx, device);
	return o;
}
static struct drv_out drv_malloc(const struct spillway_real *r, CUcontext ctx, uint64_t size) {
	CUdeviceptr p = 0;
	IN_CONTEXT(r->cu_mem_alloc(&p, (size_t)size));
	return (struct drv_out){p, 0, rc};
}
static struct drv_out drv_malloc_managed(const struct spillway_real *r, CUcontext ctx, uint64_t size, unsigned flags) {
	CUdeviceptr p = 0;
	IN_CONTEXT(r->cu_mem_alloc_managed ? r->cu_mem_alloc_managed(&p, (size_t)size, flags) : CUDA_ERROR_NOT_FOUND);
	return (struct drv_out){p, 0, rc};
}
static struct drv_out drv_malloc_async(const struct spillway_real *r, CUcontext ctx, uint64_t size, uint64_t stream) {
	CUdeviceptr p = 0;
	IN_CONTEXT(r->cu_mem_alloc_async ? r->cu_mem_alloc_async(&p, (size_t)size, (CUstream)(uintptr_t)stream) : CUDA_ERROR_NOT_FOUND);
	return (struct drv_out){p, 0, rc};
}
static CUresult drv_free(const struct spillway_real *r, CUcontext ctx, uint64_t p) {
	IN_CONTEXT(r->cu_mem_free((CUdeviceptr)p));
	return rc;
}
static CUresult drv_free_async(const struct spillway_real *r, CUcontext ctx, uint64_t p, uint64_t stream) {
	IN_CONTEXT(r->cu_mem_free_async ? r->cu_mem_free_async((CUdeviceptr)p, (CUstream)(uintptr_t)stream) : CUDA_ERROR_NOT_FOUND);
	return rc;
}
static struct drv_out drv_mem_get_info(const struct spillway_real *r, CUcontext ctx) {
	size_t f = 0, t = 0;
	IN_CONTEXT(r->cu_mem_get_info(&f, &t));
	return (struct drv_out){f, t, rc};
}
static struct drv_out drv_device_count(const struct spillway_real *r) {
	int n = 0;
	CUresult rc = r->cu_device_get_count ? r->cu_device_get_count(&n) : CUDA_ERROR_NOT_FOUND;
	return (struct drv_out){(uint64_t)n, 0, rc};
}
// Resets device's primary context; device -1: the device of ctx (the
// calling thread's context when ctx is NULL).
static CUresult drv_device_reset(const struct spillway_real *r, CUcontext ctx, int device) {
	CUdevice dev = device;
	if (device < 0) {
		IN_CONTEXT(r->cu_ctx_get_device(&dev));
		if (rc != CUDA_SUCCESS)
			return rc;
	}
	return r->cu_primary_ctx_reset ? r->cu_primary_ctx_reset(dev) : CUDA_ERROR_NOT_FOUND;
}
static CUresult drv_synchronize(const struct spillway_real *r, CUcontext ctx) {
	IN_CONTEXT(r->cu_ctx_synchronize());
	return rc;
}
static CUresult drv_stream_synchronize(const struct spillway_real *r, CUcontext ctx, uint64_t s) {
	IN_CONTEXT(r->cu_stream_synchronize ? r->cu_stream_synchronize((CUstream)(uintptr_t)s) : CUDA_ERROR_NOT_FOUND);
	return rc;
}
static CUresult drv_stream_query(const struct spillway_real *r, CUcontext ctx, uint64_t s) {
	IN_CONTEXT(r->cu_stream_query ? r->cu_stream_query((CUstream)(uintptr_t)s) : CUDA_ERROR_NOT_FOUND);
	return rc;
}
static struct drv_out drv_stream_capture_graph(const struct spillway_real *r, CUcontext ctx, uint64_t s) {
	int status = 0;
	CUgraph graph = NULL;
	IN_CONTEXT(r->cu_stream_get_capture_info ? r->cu_stream_get_capture_info((CUstream)(uintptr_t)s, &status, NULL, &graph, NULL, NULL) : CUDA_ERROR_NOT_FOUND);
	return (struct drv_out){(uint64_t)status, (uint64_t)(uintptr_t)graph, rc};
}
static CUresult drv_stream_destroy(const struct spillway_real *r, CUcontext ctx, uint64_t s) {
	IN_CONTEXT(r->cu_stream_destroy ? r->cu_stream_destroy((CUstream)(uintptr_t)s) : CUDA_ERROR_NOT_FOUND);
	return rc;
}
static struct drv_out drv_event_create(const struct spillway_real *r, CUcontext ctx, unsigned flags) {
	CUevent e = NULL;
	IN_CONTEXT(r->cu_event_create ? r->cu_event_create(&e, flags) : CUDA_ERROR_NOT_FOUND);
	return (struct drv_out){(uint64_t)(uintptr_t)e, 0, rc};
}
static CUresult drv_event_record(const struct spillway_real *r, CUcontext ctx, uint64_t e, uint64_t s) {
	IN_CONTEXT(r->cu_event_record ? r->cu_event_record((CUevent)(uintptr_t)e, (CUstream)(uintptr_t)s) : CUDA_ERROR_NOT_FOUND);
	return rc;
}
static CUresult drv_event_query(const struct spillway_real *r, CUcontext ctx, uint64_t e) {
	IN_CONTEXT(r->cu_event_query ? r->cu_event_query((CUevent)(uintptr_t)e) : CUDA_ERROR_NOT_FOUND);
	return rc;
}
static CUresult drv_event_synchronize(const struct spillway_real *r, CUcontext ctx, uint64_t e) {
	IN_CONTEXT(r->cu_event_synchronize ? r->cu_event_synchronize((CUevent)(uintptr_t)e) : CUDA_ERROR_NOT_FOUND);
	return rc;
}
static CUresult drv_event_destroy(const struct spillway_real *r, CUcontext ctx, uint64_t e) {
	IN_CONTEXT(r->cu_event_destroy ? r->cu_event_destroy((CUevent)(uintptr_t)e) : CUDA_ERROR_NOT_FOUND);
	return rc;
}
static struct drv_out drv_device_get_attribute(const struct spillway_real *r, int attr, int device) {
	int v = 0;
	CUresult rc = r->cu_device_get_attribute ? r->cu_device_get_attribute(&v, (CUdevice_attribute)attr, device) : CUDA_ERROR_NOT_FOUND;
	return (struct drv_out){(uint64_t)v, 0, rc};
}
static struct drv_out drv_host_alloc(const struct spillway_real *r, CUcontext ctx, uint64_t size, unsigned flags) {
	void *p = NULL;
	IN_CONTEXT(r->cu_mem_host_alloc ? r->cu_mem_host_alloc(&p, (size_t)size, flags) : CUDA_ERROR_NOT_FOUND);
	return (struct drv_out){(uint64_t)(uintptr_t)p, 0, rc};
}
static CUresult drv_free_host(const struct spillway_real *r, CUcontext ctx, uint64_t p) {
	IN_CONTEXT(r->cu_mem_free_host ? r->cu_mem_free_host((void *)(uintptr_t)p) : CUDA_ERROR_NOT_FOUND);
	return rc;
}
static struct drv_out drv_host_get_device_pointer(const struct spillway_real *r, CUcontext ctx, uint64_t host) {
	CUdeviceptr d = 0;
	IN_CONTEXT(r->cu_mem_host_get_device_pointer ? r->cu_mem_host_get_device_pointer(&d, (void *)(uintptr_t)host, 0) : CUDA_ERROR_NOT_FOUND);
	return (struct drv_out){d, 0, rc};
}
static CUresult drv_mem_advise(const struct spillway_real *r, CUcontext ctx, uint64_t p, uint64_t size, int advice, int device) {
	IN_CONTEXT(r->cu_mem_advise ? r->cu_mem_advise((CUdeviceptr)p, (size_t)size, (CUmem_advise)advice, device) : CUDA_ERROR_NOT_FOUND);
	return rc;
}
static CUresult drv_mem_prefetch_async(const struct spillway_real *r, CUcontext ctx, uint64_t p, uint64_t size, int device, uint64_t s) {
	IN_CONTEXT(r->cu_mem_prefetch_async ? r->cu_mem_prefetch_async((CUdeviceptr)p, (size_t)size, device, (CUstream)(uintptr_t)s) : CUDA_ERROR_NOT_FOUND);
	return rc;
}

// stream_context answers the context stream s was made in.
static struct drv_out stream_context(const struct spillway_real *r, uint64_t s) {
	CUcontext ctx = NULL;
	CUresult rc = r->cu_stream_get_ctx ? r->cu_stream_get_ctx((CUstream)(uintptr_t)s, &ctx) : CUDA_ERROR_NOT_FOUND;
	return (struct drv_out){(uint64_t)(uintptr_t)ctx, 0, rc};
}

// record_in_stream_context creates an event in the context stream s was
// made in and records it on s, that context pushed for the two calls and
// popped after, so the thread's contexts are left as they were.
static struct drv_out record_in_stream_context(const struct spillway_real *r, uint64_t s) {
	CUstream stream = (CUstream)(uintptr_t)s;
	CUcontext ctx = NULL, popped = NULL;
	CUevent e = NULL;
	if (!r->cu_stream_get_ctx || !r->cu_ctx_push_current || !r->cu_ctx_pop_current || !r->cu_event_create ||
	    !r->cu_event_record || !r->cu_event_destroy)
		return (struct drv_out){0, 0, CUDA_ERROR_NOT_FOUND};
	CUresult rc = r->cu_stream_get_ctx(stream, &ctx);
	if (rc != CUDA_SUCCESS || (rc = r->cu_ctx_push_current(ctx)) != CUDA_SUCCESS)
		return (struct drv_out){0, 0, rc};
	if ((rc = r->cu_event_create(&e, CU_EVENT_DISABLE_TIMING)) == CUDA_SUCCESS &&
	    (rc = r->cu_event_record(e, stream)) != CUDA_SUCCESS)
		r->cu_event_destroy(e);
	r->cu_ctx_pop_current(&popped);
	return (struct drv_out){(uint64_t)(uintptr_t)e, 0, rc};
}

// record_in_context creates an event in context ctx and records it on that
// context's legacy stream, which completes after the work queued before it
// on every blocking stream of the context, the per-thread ones included;
// ctx pushed for the two calls and popped after.
static struct drv_out record_in_context(const struct spillway_real *r, uint64_t c) {
	CUcontext ctx = (CUcontext)(uintptr_t)c, popped = NULL;
	CUevent e = NULL;
	if (!r->cu_ctx_push_current || !r->cu_ctx_pop_current || !r->cu_event_create ||
	    !r->cu_event_record || !r->cu_event_destroy)
		return (struct drv_out){0, 0, CUDA_ERROR_NOT_FOUND};
	CUresult rc = r->cu_ctx_push_current(ctx);
	if (rc != CUDA_SUCCESS)
		return (struct drv_out){0, 0, rc};
	if ((rc = r->cu_event_create(&e, CU_EVENT_DISABLE_TIMING)) == CUDA_SUCCESS &&
	    (rc = r->cu_event_record(e, CU_STREAM_LEGACY)) != CUDA_SUCCESS)
		r->cu_event_destroy(e);
	r->cu_ctx_pop_current(&popped);
	return (struct drv_out){(uint64_t)(uintptr_t)e, 0, rc};
}

// free_async_in_context frees p in stream order on context ctx's legacy
// stream, ctx pushed for the call.
static CUresult free_async_in_context(const struct spillway_real *r, uint64_t c, uint64_t p) {
	CUcontext ctx = (CUcontext)(uintptr_t)c, popped = NULL;
	if (!r->cu_ctx_push_current || !r->cu_ctx_pop_current || !r->cu_mem_free_async)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = r->cu_ctx_push_current(ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = r->cu_mem_free_async((CUdeviceptr)p, CU_STREAM_LEGACY);
	r->cu_ctx_pop_current(&popped);
	return rc;
}

// Virtual memory management for the core's own granules (VMM below). These
// call the real functions in the table, never the interposed ones.

// The first function VMM needs that the table lacks, or NULL.
static const char *vmm_missing(const struct spillway_real *r) {
	if (!r->cu_mem_get_allocation_granularity) return "cuMemGetAllocationGranularity";
	if (!r->cu_mem_address_reserve) return "cuMemAddressReserve";
	if (!r->cu_mem_address_free) return "cuMemAddressFree";
	if (!r->cu_mem_create) return "cuMemCreate";
	if (!r->cu_mem_release) return "cuMemRelease";
	if (!r->cu_mem_map) return "cuMemMap";
	if (!r->cu_mem_unmap) return "cuMemUnmap";
	if (!r->cu_mem_set_access) return "cuMemSetAccess";
	if (!r->cu_device_get_attribute) return "cuDeviceGetAttribute";
	if (!r->cu_primary_ctx_retain) return "cuDevicePrimaryCtxRetain";
	if (!r->cu_ctx_get_current) return "cuCtxGetCurrent";
	if (!r->cu_ctx_set_current) return "cuCtxSetCurrent";
	return NULL;
}

// vmm_prop describes pinned physical memory on the device, or on host NUMA
// node 0 (host), which every host has.
static CUmemAllocationProp vmm_prop(int device, int host) {
	CUmemAllocationProp p;
	memset(&p, 0, sizeof p);
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = host ? 0 : device;
	return p;
}
static struct drv_out vmm_granularity(const struct spillway_real *r, CUcontext ctx, int device, int host) {
	size_t gran = 0;
	CUmemAllocationProp p = vmm_prop(device, host);
	IN_CONTEXT(r->cu_mem_get_allocation_granularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	return (struct drv_out){gran, 0, rc};
}
static struct drv_out vmm_address_reserve(const struct spillway_real *r, CUcontext ctx, uint64_t size, uint64_t alignment) {
	CUdeviceptr p = 0;
	IN_CONTEXT(r->cu_mem_address_reserve(&p, (size_t)size, (size_t)alignment, 0, 0));
	return (struct drv_out){p, 0, rc};
}
static CUresult vmm_address_free(const struct spillway_real *r, CUcontext ctx, uint64_t va, uint64_t size) {
	IN_CONTEXT(r->cu_mem_address_free((CUdeviceptr)va, (size_t)size));
	return rc;
}
static struct drv_out vmm_create(const struct spillway_real *r, CUcontext ctx, int device, uint64_t size, int host) {
	CUmemGenericAllocationHandle h = 0;
	CUmemAllocationProp p = vmm_prop(device, host);
	IN_CONTEXT(r->cu_mem_create(&h, (size_t)size, &p, 0));
	return (struct drv_out){h, 0, rc};
}
static CUresult vmm_release(const struct spillway_real *r, CUcontext ctx, uint64_t h) {
	IN_CONTEXT(r->cu_mem_release((CUmemGenericAllocationHandle)h));
	return rc;
}
static CUresult vmm_map(const struct spillway_real *r, CUcontext ctx, uint64_t va, uint64_t size, uint64_t h) {
	IN_CONTEXT(r->cu_mem_map((CUdeviceptr)va, (size_t)size, 0, (CUmemGenericAllocationHandle)h, 0));
	return rc;
}
static CUresult vmm_unmap(const struct spillway_real *r, CUcontext ctx, uint64_t va, uint64_t size) {
	IN_CONTEXT(r->cu_mem_unmap((CUdeviceptr)va, (size_t)size));
	return rc;
}
// copy_and_wait copies size bytes between two mapped ranges and waits for the
// copy: a device-to-device cuMemcpy may return before it completes.
static CUresult copy_and_wait(const struct spillway_real *r, uint64_t dst, uint64_t src, uint64_t size) {
	CUresult rc = r->cu_memcpy_dtod((CUdeviceptr)dst, (CUdeviceptr)src, (size_t)size);
	return rc == CUDA_SUCCESS ? r->cu_ctx_synchronize() : rc;
}
static CUresult vmm_copy(const struct spillway_real *r, CUcontext ctx, uint64_t dst, uint64_t src, uint64_t size) {
	if (!r->cu_memcpy_dtod || !r->cu_ctx_synchronize)
		return CUDA_ERROR_NOT_FOUND;
	IN_CONTEXT(copy_and_wait(r, dst, src, size));
	return rc;
}
// The most devices one grant names: the device and its peers.
#define VMM_MAX_GRANTS 64

// The devices that may read and write device's memory: itself, then each
// device cuDeviceCanAccessPeer says can reach it (none where the table
// lacks it). Returns how many it wrote to out.
static int vmm_grantees(const struct spillway_real *r, int device, int *out) {
	int n = 0, count = 0;
	out[n++] = device;
	if (!r->cu_device_can_access_peer || !r->cu_device_get_count || r->cu_device_get_count(&count) != CUDA_SUCCESS)
		return n;
	for (int d = 0; d < count && n < VMM_MAX_GRANTS; d++) {
		int can = 0;
		if (d != device && r->cu_device_can_access_peer(&can, d, device) == CUDA_SUCCESS && can)
			out[n++] = d;
	}
	return n;
}

// vmm_set_access grants the devices read and write access, and the CPU too
// (cpu) through host NUMA node 0, where vmm_create puts host memory.
static CUresult vmm_set_access(const struct spillway_real *r, CUcontext ctx, uint64_t va, uint64_t size, const int *devices, int n, int cpu) {
	CUmemAccessDesc d[VMM_MAX_GRANTS + 1];
	memset(d, 0, sizeof d);
	for (int i = 0; i < n; i++) {
		d[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		d[i].location.id = devices[i];
		d[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	}
	if (cpu) {
		d[n].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
		d[n].location.id = 0;
		d[n].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		n++;
	}
	IN_CONTEXT(r->cu_mem_set_access((CUdeviceptr)va, (size_t)size, d, (size_t)n));
	return rc;
}
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// Driver serves the core's calls with the driver API where the process has
// no CUDA runtime (a program that uses only libcuda, or a static runtime,
// whose functions the shim cannot call). It has Runtime's methods, with
// cudaError_t results; a call for a device runs in that device's primary
// context, which the Driver retains at its first use and holds for the
// life of the process, as the runtime does.
type Driver struct {
	t *C.struct_spillway_real
	// ctx is the context the calls run in; nil: the calling thread's.
	ctx C.CUcontext
	// device is the device On bound the calls to; -1: none.
	device   C.int
	contexts *primaryContexts
}

type primaryContexts struct {
	mu  sync.Mutex
	ctx map[int]C.CUcontext
}

// NewDriverRuntime returns a Driver over the table of real functions, or
// an error naming a driver function the table lacks.
func NewDriverRuntime(table unsafe.Pointer) (*Driver, error) {
	t, err := realTable(table)
	if err != nil {
		return nil, err
	}
	if missing := C.drv_missing(t); missing != nil {
		return nil, fmt.Errorf("the real %s was not found", C.GoString(missing))
	}
	return &Driver{t: t, device: -1, contexts: &primaryContexts{ctx: map[int]C.CUcontext{}}}, nil
}

// On returns a Driver whose calls run in the primary context of device;
// where it cannot be retained (no such device) they run in the calling
// thread's context, and DeviceReset answers the driver's error for device.
func (d *Driver) On(device int) *Driver {
	return &Driver{t: d.t, ctx: d.contexts.retain(d.t, device), device: C.int(device), contexts: d.contexts}
}

// retain returns device's primary context, retained at its first use and
// held for the life of the process; nil where it cannot be retained.
func (p *primaryContexts) retain(t *C.struct_spillway_real, device int) C.CUcontext {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ctx, ok := p.ctx[device]; ok {
		return ctx
	}
	o := C.drv_retain(t, C.int(device))
	if o.rc != C.CUDA_SUCCESS {
		return nil
	}
	p.ctx[device] = o.ctx
	return o.ctx
}

// SetLastError does nothing: without a runtime there is no last error.
func (d *Driver) SetLastError(Error) {}

// fromDriver is the cudaError_t the runtime returns for a CUresult: the
// same number, as the runtime numbers its errors after the driver's
// (CUDA_ERROR_ILLEGAL_ADDRESS and cudaErrorIllegalAddress are both 700;
// the one code of the driver's with no runtime twin,
// CUDA_ERROR_CONTEXT_ALREADY_CURRENT, is deprecated and never returned).
// So an error of the device's, a kernel's illegal address that every
// later call reports, reaches the caller as the driver gave it.
func fromDriver(rc C.CUresult) Error { return Error(rc) }

// DriverResult is the CUresult a driver entry point answers where the
// runtime's would answer e: the same number (see fromDriver), but for the
// codes the driver does not have, the runtime's own checks of kernels,
// textures, symbols and the toolkit (9 to 98 but 34 and 46, 103 and 127):
// an invalid device pointer is the driver's CUDA_ERROR_INVALID_VALUE, and
// the others, which the shim never produces, CUDA_ERROR_UNKNOWN.
func (e Error) DriverResult() int32 {
	switch {
	case e == ErrorInvalidDevicePtr:
		return C.CUDA_ERROR_INVALID_VALUE
	case e > 8 && e < 100 && e != 34 && e != 46, e == 103, e == 127:
		return C.CUDA_ERROR_UNKNOWN
	}
	return int32(e)
}

func (d *Driver) Malloc(size uint64) (DevicePtr, Error) {
	o := C.drv_malloc(d.t, d.ctx, C.uint64_t(size))
	return DevicePtr(o.v), fromDriver(o.rc)
}

func (d *Driver) MallocManaged(size uint64, flags uint32) (DevicePtr, Error) {
	o := C.drv_malloc_managed(d.t, d.ctx, C.uint64_t(size), C.unsigned(flags))
	return DevicePtr(o.v), fromDriver(o.rc)
}

func (d *Driver) MallocAsync(size uint64, s Stream) (DevicePtr, Error) {
	o := C.drv_malloc_async(d.t, d.ctx, C.uint64_t(size), C.uint64_t(s))
	return DevicePtr(o.v), fromDriver(o.rc)
}

func (d *Driver) Free(p DevicePtr) Error { return fromDriver(C.drv_free(d.t, d.ctx, C.uint64_t(p))) }

func (d *Driver) FreeAsync(p DevicePtr, s Stream) Error {
	return fromDriver(C.drv_free_async(d.t, d.ctx, C.uint64_t(p), C.uint64_t(s)))
}

func (d *Driver) MemGetInfo() (free, total uint64, rc Error) {
	o := C.drv_mem_get_info(d.t, d.ctx)
	return uint64(o.v), uint64(o.w), fromDriver(o.rc)
}

// DeviceReset resets the primary context of the context's device.
// GetDeviceCount calls cuDeviceGetCount.
func (d *Driver) GetDeviceCount() (int, Error) {
	o := C.drv_device_count(d.t)
	return int(o.v), fromDriver(o.rc)
}

// DeviceReset resets the primary context of the device On bound d to (which
// answers CUDA_ERROR_INVALID_DEVICE for one that does not exist), or of the
// calling thread's device.
func (d *Driver) DeviceReset() Error { return fromDriver(C.drv_device_reset(d.t, d.ctx, d.device)) }

func (d *Driver) DeviceSynchronize() Error { return fromDriver(C.drv_synchronize(d.t, d.ctx)) }

func (d *Driver) StreamSynchronize(s Stream) Error {
	return fromDriver(C.drv_stream_synchronize(d.t, d.ctx, C.uint64_t(s)))
}

// StreamQuery calls cuStreamQuery.
func (d *Driver) StreamQuery(s Stream) Error {
	return fromDriver(C.drv_stream_query(d.t, d.ctx, C.uint64_t(s)))
}

// StreamCapture calls cuStreamGetCaptureInfo_v2: the stream's capture
// status and, while it captures, the graph being built.
func (d *Driver) StreamCapture(s Stream) (CaptureStatus, uint64, Error) {
	o := C.drv_stream_capture_graph(d.t, d.ctx, C.uint64_t(s))
	return CaptureStatus(o.v), uint64(o.w), fromDriver(o.rc)
}

func (d *Driver) StreamDestroy(s Stream) Error {
	return fromDriver(C.drv_stream_destroy(d.t, d.ctx, C.uint64_t(s)))
}

func (d *Driver) EventCreate(flags uint32) (Event, Error) {
	o := C.drv_event_create(d.t, d.ctx, C.unsigned(flags))
	return Event(o.v), fromDriver(o.rc)
}

func (d *Driver) EventRecord(e Event, s Stream) Error {
	return fromDriver(C.drv_event_record(d.t, d.ctx, C.uint64_t(e), C.uint64_t(s)))
}

func (d *Driver) EventQuery(e Event) Error {
	return fromDriver(C.drv_event_query(d.t, d.ctx, C.uint64_t(e)))
}

func (d *Driver) EventSynchronize(e Event) Error {
	return fromDriver(C.drv_event_synchronize(d.t, d.ctx, C.uint64_t(e)))
}

func (d *Driver) EventDestroy(e Event) Error {
	return fromDriver(C.drv_event_destroy(d.t, d.ctx, C.uint64_t(e)))
}

// DeviceGetAttribute: the runtime's attribute numbers are the driver's.
func (d *Driver) DeviceGetAttribute(attr DeviceAttr, device int) (int, Error) {
	o := C.drv_device_get_attribute(d.t, C.int(attr), C.int(device))
	return int(o.v), fromDriver(o.rc)
}

// HostAlloc: cudaHostAlloc's flags are cuMemHostAlloc's.
func (d *Driver) HostAlloc(size uint64, flags uint32) (uint64, Error) {
	o := C.drv_host_alloc(d.t, d.ctx, C.uint64_t(size), C.unsigned(flags))
	return uint64(o.v), fromDriver(o.rc)
}

func (d *Driver) FreeHost(host uint64) Error {
	return fromDriver(C.drv_free_host(d.t, d.ctx, C.uint64_t(host)))
}

func (d *Driver) HostGetDevicePointer(host uint64) (DevicePtr, Error) {
	o := C.drv_host_get_device_pointer(d.t, d.ctx, C.uint64_t(host))
	return DevicePtr(o.v), fromDriver(o.rc)
}

// MemAdvise: the advice values and CPUDevice are the driver's (CU_DEVICE_CPU).
func (d *Driver) MemAdvise(p DevicePtr, size uint64, advice Advice, device int) Error {
	return fromDriver(C.drv_mem_advise(d.t, d.ctx, C.uint64_t(p), C.uint64_t(size), C.int(advice), C.int(device)))
}

func (d *Driver) MemPrefetchAsync(p DevicePtr, size uint64, device int, s Stream) Error {
	return fromDriver(C.drv_mem_prefetch_async(d.t, d.ctx, C.uint64_t(p), C.uint64_t(size), C.int(device), C.uint64_t(s)))
}

// Context is the context the calls of a Runtime bound with On run in: the
// device's primary context, as a number; 0 where it could not be retained
// or the calls are not bound.
func (r *Runtime) Context() uint64 { return uint64(uintptr(unsafe.Pointer(r.primary))) }

// Context is the context the calls of a Driver bound with On run in: the
// device's primary context, as a number; 0 where it could not be retained
// or the calls are not bound.
func (d *Driver) Context() uint64 { return uint64(uintptr(unsafe.Pointer(d.ctx))) }

// StreamContext calls cuStreamGetCtx: the context stream s was made in, as
// a number (the current one for the default streams).
func (r *Runtime) StreamContext(s Stream) (uint64, Error) { return streamContext(r.t, s) }

// StreamContext calls cuStreamGetCtx: the context stream s was made in, as
// a number (the current one for the default streams).
func (d *Driver) StreamContext(s Stream) (uint64, Error) { return streamContext(d.t, s) }

func streamContext(t *C.struct_spillway_real, s Stream) (uint64, Error) {
	o := C.stream_context(t, C.uint64_t(s))
	return uint64(o.v), fromDriver(o.rc)
}

// RecordInStreamContext creates an event without timing in the context
// stream s was made in and records it on s (cuEventCreate, cuEventRecord
// with that context pushed), for a stream of another device or context
// than the bound one, where an event of the bound device cannot be
// recorded. Query and destroy it as any other event.
func (r *Runtime) RecordInStreamContext(s Stream) (Event, Error) {
	return recordInStreamContext(r.t, s)
}

// RecordInStreamContext: as Runtime's.
func (d *Driver) RecordInStreamContext(s Stream) (Event, Error) { return recordInStreamContext(d.t, s) }

func recordInStreamContext(t *C.struct_spillway_real, s Stream) (Event, Error) {
	o := C.record_in_stream_context(t, C.uint64_t(s))
	return Event(o.v), fromDriver(o.rc)
}

// RecordInContext creates an event without timing in context ctx and
// records it on that context's legacy stream, for a free made on a default
// stream while ctx, not the bound one, was current. Query and destroy it as
// any other event.
func (r *Runtime) RecordInContext(ctx uint64) (Event, Error) { return recordInContext(r.t, ctx) }

// RecordInContext: as Runtime's.
func (d *Driver) RecordInContext(ctx uint64) (Event, Error) { return recordInContext(d.t, ctx) }

func recordInContext(t *C.struct_spillway_real, ctx uint64) (Event, Error) {
	o := C.record_in_context(t, C.uint64_t(ctx))
	return Event(o.v), fromDriver(o.rc)
}

// FreeAsyncInContext calls cuMemFreeAsync on context ctx's legacy stream,
// ctx pushed for the call: the stream a free made on a default stream while
// ctx was current is ordered on.
func (r *Runtime) FreeAsyncInContext(ctx uint64, p DevicePtr) Error {
	return fromDriver(C.free_async_in_context(r.t, C.uint64_t(ctx), C.uint64_t(p)))
}

// FreeAsyncInContext: as Runtime's.
func (d *Driver) FreeAsyncInContext(ctx uint64, p DevicePtr) Error {
	return fromDriver(C.free_async_in_context(d.t, C.uint64_t(ctx), C.uint64_t(p)))
}

// VMM calls the driver's virtual memory management (cuMemCreate,
// cuMemAddressReserve, cuMemMap, ...) for the core's own use, in a device's
// primary context, whether or not the process has a runtime. It calls the
// real functions from the table, so that the core's granules are never
// counted as the application's own calls to them.
type VMM struct {
	t      *C.struct_spillway_real
	ctx    C.CUcontext
	device C.int
	// grantees are the devices every mapping is made readable and
	// writable by: the device, and its peers, so that copies made in a
	// peer's context (cudaMemcpyPeer, a cudaMemcpy while it is current)
	// reach pooled memory as they reach cudaMalloc's.
	grantees []C.int
}

// NewVMM returns a VMM over the table of real functions for device, whose
// primary context it retains (and holds for the life of the process, as
// the runtime does), or an error naming a function the table lacks. The
// context is retained at each call, so one reset by cudaDeviceReset is
// made active again.
func NewVMM(table unsafe.Pointer, device int) (*VMM, error) {
	t, err := realTable(table)
	if err != nil {
		return nil, err
	}
	if missing := C.vmm_missing(t); missing != nil {
		return nil, fmt.Errorf("the real %s was not found", C.GoString(missing))
	}
	o := C.drv_retain(t, C.int(device))
	if o.rc != C.CUDA_SUCCESS {
		return nil, fmt.Errorf("cuDevicePrimaryCtxRetain of device %d: %w", device, fromDriver(o.rc))
	}
	var devices [C.VMM_MAX_GRANTS]C.int
	n := C.vmm_grantees(t, C.int(device), &devices[0])
	return &VMM{t: t, ctx: o.ctx, device: C.int(device), grantees: append([]C.int(nil), devices[:n]...)}, nil
}

// Supported asks cuDeviceGetAttribute whether the device has virtual
// memory management.
func (v *VMM) Supported() (bool, Error) {
	o := C.drv_device_get_attribute(v.t, C.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, v.device)
	return o.v != 0, fromDriver(o.rc)
}

// Granularity calls cuMemGetAllocationGranularity (the minimum) for pinned
// memory on the device, or on the host (host-located memory).
func (v *VMM) Granularity(host bool) (uint64, Error) {
	o := C.vmm_granularity(v.t, v.ctx, v.device, cbool(host))
	return uint64(o.v), fromDriver(o.rc)
}

// AddressReserve calls cuMemAddressReserve for size bytes of address space
// aligned to alignment, anywhere.
func (v *VMM) AddressReserve(size, alignment uint64) (DevicePtr, Error) {
	o := C.vmm_address_reserve(v.t, v.ctx, C.uint64_t(size), C.uint64_t(alignment))
	return DevicePtr(o.v), fromDriver(o.rc)
}

// AddressFree calls cuMemAddressFree.
func (v *VMM) AddressFree(va DevicePtr, size uint64) Error {
	return fromDriver(C.vmm_address_free(v.t, v.ctx, C.uint64_t(va), C.uint64_t(size)))
}

// Create calls cuMemCreate for size bytes of pinned memory on the device,
// or on host NUMA node 0 (host), and returns the handle.
func (v *VMM) Create(size uint64, host bool) (uint64, Error) {
	o := C.vmm_create(v.t, v.ctx, v.device, C.uint64_t(size), cbool(host))
	return uint64(o.v), fromDriver(o.rc)
}

// Release calls cuMemRelease.
func (v *VMM) Release(handle uint64) Error {
	return fromDriver(C.vmm_release(v.t, v.ctx, C.uint64_t(handle)))
}

// Map calls cuMemMap: all of handle's size bytes at va.
func (v *VMM) Map(va DevicePtr, size, handle uint64) Error {
	return fromDriver(C.vmm_map(v.t, v.ctx, C.uint64_t(va), C.uint64_t(size), C.uint64_t(handle)))
}

// Unmap calls cuMemUnmap.
func (v *VMM) Unmap(va DevicePtr, size uint64) Error {
	return fromDriver(C.vmm_unmap(v.t, v.ctx, C.uint64_t(va), C.uint64_t(size)))
}

// Copy copies size bytes from src to dst, both mapped, with cuMemcpyDtoD,
// and waits for the copy with cuCtxSynchronize.
func (v *VMM) Copy(dst, src DevicePtr, size uint64) Error {
	return fromDriver(C.vmm_copy(v.t, v.ctx, C.uint64_t(dst), C.uint64_t(src), C.uint64_t(size)))
}

// SetAccess calls cuMemSetAccess: the device and its peers read and write
// [va, va+size), and so does the CPU (cpu), which the driver allows for
// host-located memory only, so that the address of memory CUDA calls host
// is one the CPU can use, as pinned memory's is.
func (v *VMM) SetAccess(va DevicePtr, size uint64, cpu bool) Error {
	return fromDriver(C.vmm_set_access(v.t, v.ctx, C.uint64_t(va), C.uint64_t(size), &v.grantees[0], C.int(len(v.grantees)), cbool(cpu)))
}

// HostAccess grants the CPU the application's own host-located virtual
// memory, as VMM.SetAccess does the pool's host granules.
type HostAccess struct {
	t *C.struct_spillway_real
}

// NewHostAccess returns a HostAccess over the table of real functions.
func NewHostAccess(table unsafe.Pointer) (*HostAccess, error) {
	t, err := realTable(table)
	if err != nil {
		return nil, err
	}
	return &HostAccess{t: t}, nil
}

// Grant calls cuMemSetAccess, in the calling thread's context, to let the
// CPU read and write [va, va+size) through host NUMA node 0, where the
// front places host memory; the devices' access stays as it was.
func (h *HostAccess) Grant(va DevicePtr, size uint64) Error {
	if h.t.cu_mem_set_access == nil {
		return fromDriver(C.CUDA_ERROR_NOT_FOUND)
	}
	return fromDriver(C.vmm_set_access(h.t, nil, C.uint64_t(va), C.uint64_t(size), nil, 0, 1))
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
