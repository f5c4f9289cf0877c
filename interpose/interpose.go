// Package interpose is the typed boundary between Spillway's Go code and the
// real CUDA runtime: CUDA's types and error codes for Go, and typed calls
// through the table of real functions that the shim's C front resolved
// (see real.h). It is the only Go code that calls real CUDA, and the only
// place besides the core's exported entry points where cgo appears.
//
// The calls Spillway makes for its own purposes go through Runtime.On: they
// run on the device they concern and leave the thread's last error
// (cudaGetLastError) as the application left it, whatever they return.
//
// It must never call an interposed symbol by name (that would resolve to the
// shim itself), never keep Go pointers in C, and never decide anything:
// policy (quotas, pooling) lives above it.
package interpose

/*
#cgo CFLAGS: -I${SRCDIR}/include -I${SRCDIR}
#include <stdint.h>
#include "real.h"

// A guard brackets an internal call (device >= 0): the call runs in that
// device's primary context (primary; where it could not be retained, with
// the device current), the thread's context is then put back exactly as
// it was (a context the application created or pushed, or none), and the
// thread's last error is left as the application left it. device < 0: a
// call made on the application's behalf, unguarded, whose outcome is the
// application's.
struct guard {
	int device, prev;
	CUcontext primary, prev_ctx;
	int switched;
	cudaError_t pending;
};
// producible reports whether produce can make code the thread's last error.
static int producible(const struct spillway_real *r, cudaError_t code) {
	return code == cudaErrorInvalidValue || code == cudaErrorMemoryAllocation ||
	       code == cudaErrorInvalidDevice ||
	       (code == cudaErrorInvalidResourceHandle && r->event_query);
}

// produce makes code the thread's last error with a real call that fails
// with it and changes nothing else.
static void produce(const struct spillway_real *r, cudaError_t code) {
	void *p = 0;
	size_t pitch = 0;
	switch (code) {
	case cudaErrorInvalidValue:
		r->get_device(0);
		break;
	case cudaErrorMemoryAllocation: // 2^59 bytes: more than any device holds
		r->malloc_pitch(&p, &pitch, 1, (size_t)1 << 50);
		break;
	case cudaErrorInvalidDevice:
		if (r->set_device)
			r->set_device(-1);
		break;
	case cudaErrorInvalidResourceHandle: // a stream-ordered call on a stream that is not valid
		r->event_query(0);
		break;
	default:
		break;
	}
}

// set_last_error makes code the thread's last error, as the real call the
// shim answered without would have; a code produce cannot make leaves the
// last error alone.
static void set_last_error(const struct spillway_real *r, cudaError_t code) {
	if (!r->peek_at_last_error || !r->get_last_error || r->peek_at_last_error() == code ||
	    !producible(r, code))
		return;
	r->get_last_error();
	produce(r, code);
}

// restore puts back the last error an internal call found. An error that
// cannot be produced again stays replaced by the internal one: an error
// still shows, rather than none.
static void restore(const struct spillway_real *r, cudaError_t pending) {
	if (!r->peek_at_last_error || !r->get_last_error || r->peek_at_last_error() == pending)
		return;
	if (pending == cudaSuccess) {
		r->get_last_error();
		return;
	}
	set_last_error(r, pending);
}

// enter_primary makes g->primary current, remembering the thread's context
// to put back. With none current, a runtime call binds the primary context
// of the runtime's current device and leaves it current: so does a call on
// that device.
static cudaError_t enter_primary(const struct spillway_real *r, struct guard *g) {
	CUcontext cur = NULL;
	if (r->cu_ctx_get_current(&cur) != CUDA_SUCCESS)
		return cudaErrorInitializationError;
	if (cur == g->primary)
		return cudaSuccess;
	int runtime_device = -1;
	int binds = !cur && r->get_device(&runtime_device) == cudaSuccess && runtime_device == g->device;
	if (r->cu_ctx_set_current(g->primary) != CUDA_SUCCESS)
		return cudaErrorInvalidDevice;
	g->prev_ctx = cur;
	g->switched = !binds;
	return cudaSuccess;
}

static cudaError_t enter(const struct spillway_real *r, int device, CUcontext primary, struct guard *g) {
	g->device = device;
	g->prev = -1;
	g->primary = primary;
	g->switched = 0;
	if (device < 0)
		return cudaSuccess;
	g->pending = r->peek_at_last_error ? r->peek_at_last_error() : cudaSuccess;
	if (primary)
		return enter_primary(r, g);
	int cur = -1;
	cudaError_t rc = r->get_device(&cur);
	if (rc != cudaSuccess || cur == device)
		return rc;
	if (!r->set_device)
		return cudaErrorSymbolNotFound;
	if ((rc = r->set_device(device)) == cudaSuccess)
		g->prev = cur;
	return rc;
}

static cudaError_t leave(const struct spillway_real *r, const struct guard *g, cudaError_t rc) {
	if (g->device < 0)
		return rc;
	int failed = rc != cudaSuccess;
	if (g->switched && r->cu_ctx_set_current(g->prev_ctx) != CUDA_SUCCESS)
		failed = 1;
	if (g->prev >= 0 && r->set_device(g->prev) != cudaSuccess)
		failed = 1;
	if (failed)
		restore(r, g->pending);
	return rc;
}

// out is what a call returns besides its error: returned by value, it
// spares the Go side a pointer into its memory (which would move to the
// heap) for every call.
struct out {
	uint64_t v, w;
	cudaError_t rc;
};

// GUARDED runs call between enter and leave; the helpers below use it.
#define GUARDED(call)                                  \
	struct guard g;                                    \
	cudaError_t rc = enter(r, device, primary, &g);    \
	if (rc == cudaSuccess)                             \
		rc = (call);                                   \
	rc = leave(r, &g, rc)

static struct out call_malloc(const struct spillway_real *r, int device, CUcontext primary, uint64_t size) {
	void *p = 0;
	GUARDED(r->malloc(&p, (size_t)size));
	return (struct out){(uint64_t)(uintptr_t)p, 0, rc};
}
static cudaError_t call_free(const struct spillway_real *r, int device, CUcontext primary, uint64_t ptr) {
	GUARDED(r->free((void *)(uintptr_t)ptr));
	return rc;
}
static struct out call_malloc_managed(const struct spillway_real *r, int device, CUcontext primary, uint64_t size, unsigned flags) {
	void *p = 0;
	GUARDED(r->malloc_managed(&p, (size_t)size, flags));
	return (struct out){(uint64_t)(uintptr_t)p, 0, rc};
}
static struct out call_malloc_pitch(const struct spillway_real *r, int device, CUcontext primary, uint64_t width, uint64_t height) {
	void *p = 0;
	size_t pt = 0;
	GUARDED(r->malloc_pitch(&p, &pt, (size_t)width, (size_t)height));
	return (struct out){(uint64_t)(uintptr_t)p, pt, rc};
}
static struct out call_malloc_async(const struct spillway_real *r, int device, CUcontext primary, uint64_t size, uint64_t stream) {
	void *p = 0;
	GUARDED(r->malloc_async(&p, (size_t)size, (cudaStream_t)(uintptr_t)stream));
	return (struct out){(uint64_t)(uintptr_t)p, 0, rc};
}
static cudaError_t call_free_async(const struct spillway_real *r, int device, CUcontext primary, uint64_t ptr, uint64_t stream) {
	GUARDED(r->free_async((void *)(uintptr_t)ptr, (cudaStream_t)(uintptr_t)stream));
	return rc;
}
static struct out call_mem_get_info(const struct spillway_real *r, int device, CUcontext primary) {
	size_t f = 0, t = 0;
	GUARDED(r->mem_get_info(&f, &t));
	return (struct out){f, t, rc};
}
static cudaError_t call_device_reset(const struct spillway_real *r, int device, CUcontext primary) {
	GUARDED(r->device_reset());
	return rc;
}
static struct out call_get_device(const struct spillway_real *r) {
	int d = 0;
	cudaError_t rc = r->get_device(&d);
	return (struct out){(uint64_t)d, 0, rc};
}
static cudaError_t call_set_device(const struct spillway_real *r, int device) { return r->set_device(device); }
static struct out call_get_device_count(const struct spillway_real *r) {
	int n = 0;
	cudaError_t rc = r->get_device_count(&n);
	return (struct out){(uint64_t)n, 0, rc};
}
static cudaError_t call_device_synchronize(const struct spillway_real *r, int device, CUcontext primary) {
	GUARDED(r->device_synchronize());
	return rc;
}
static cudaError_t call_stream_synchronize(const struct spillway_real *r, int device, CUcontext primary, uint64_t stream) {
	GUARDED(r->stream_synchronize((cudaStream_t)(uintptr_t)stream));
	return rc;
}
static struct out call_event_create(const struct spillway_real *r, int device, CUcontext primary, unsigned flags) {
	cudaEvent_t e = 0;
	GUARDED(r->event_create_with_flags(&e, flags));
	return (struct out){(uint64_t)(uintptr_t)e, 0, rc};
}
static cudaError_t call_event_record(const struct spillway_real *r, int device, CUcontext primary, uint64_t event, uint64_t stream) {
	GUARDED(r->event_record((cudaEvent_t)(uintptr_t)event, (cudaStream_t)(uintptr_t)stream));
	return rc;
}
static cudaError_t call_event_query(const struct spillway_real *r, int device, CUcontext primary, uint64_t event) {
	GUARDED(r->event_query((cudaEvent_t)(uintptr_t)event));
	return rc;
}
static cudaError_t call_event_synchronize(const struct spillway_real *r, int device, CUcontext primary, uint64_t event) {
	GUARDED(r->event_synchronize((cudaEvent_t)(uintptr_t)event));
	return rc;
}
static cudaError_t call_event_destroy(const struct spillway_real *r, int device, CUcontext primary, uint64_t event) {
	GUARDED(r->event_destroy((cudaEvent_t)(uintptr_t)event));
	return rc;
}
static cudaError_t call_stream_destroy(const struct spillway_real *r, int device, CUcontext primary, uint64_t stream) {
	GUARDED(r->stream_destroy((cudaStream_t)(uintptr_t)stream));
	return rc;
}
static struct out call_device_get_attribute(const struct spillway_real *r, int device, CUcontext primary, int attr, int of) {
	int v = 0;
	GUARDED(r->device_get_attribute(&v, (enum cudaDeviceAttr)attr, of));
	return (struct out){(uint64_t)(int64_t)v, 0, rc};
}
static struct out call_host_alloc(const struct spillway_real *r, int device, CUcontext primary, uint64_t size, unsigned flags) {
	void *p = 0;
	GUARDED(r->host_alloc(&p, (size_t)size, flags));
	return (struct out){(uint64_t)(uintptr_t)p, 0, rc};
}
static cudaError_t call_free_host(const struct spillway_real *r, int device, CUcontext primary, uint64_t ptr) {
	GUARDED(r->free_host((void *)(uintptr_t)ptr));
	return rc;
}
static struct out call_host_get_device_pointer(const struct spillway_real *r, int device, CUcontext primary, uint64_t host) {
	void *p = 0;
	GUARDED(r->host_get_device_pointer(&p, (void *)(uintptr_t)host, 0));
	return (struct out){(uint64_t)(uintptr_t)p, 0, rc};
}
static cudaError_t call_mem_advise(const struct spillway_real *r, int device, CUcontext primary, uint64_t ptr, uint64_t size, int advice, int on) {
	GUARDED(r->mem_advise((const void *)(uintptr_t)ptr, (size_t)size, (enum cudaMemoryAdvise)advice, on));
	return rc;
}
static cudaError_t call_mem_prefetch_async(const struct spillway_real *r, int device, CUcontext primary, uint64_t ptr, uint64_t size, int to, uint64_t stream) {
	GUARDED(r->mem_prefetch_async((const void *)(uintptr_t)ptr, (size_t)size, to, (cudaStream_t)(uintptr_t)stream));
	return rc;
}
static cudaError_t call_stream_query(const struct spillway_real *r, int device, CUcontext primary, uint64_t stream) {
	GUARDED(r->stream_query((cudaStream_t)(uintptr_t)stream));
	return rc;
}
static struct out call_stream_capture_graph(const struct spillway_real *r, int device, CUcontext primary, uint64_t stream) {
	int status = 0;
	cudaGraph_t graph = NULL;
	GUARDED(r->stream_get_capture_info((cudaStream_t)(uintptr_t)stream, &status, NULL, &graph, NULL, NULL, NULL));
	return (struct out){(uint64_t)status, (uint64_t)(uintptr_t)graph, rc};
}
static struct out call_thread_exchange_stream_capture_mode(const struct spillway_real *r, int device, CUcontext primary, int mode) {
	GUARDED(r->thread_exchange_stream_capture_mode(&mode));
	return (struct out){(uint64_t)mode, 0, rc};
}

// Which entries are present, as a bit set in field order (bit 0: malloc).
static uint32_t present(const struct spillway_real *r) {
	void *const *f = (void *const *)&r->malloc;
	size_t n = (r->size - offsetof(struct spillway_real, malloc)) / sizeof(void *);
	uint32_t bits = 0;
	for (size_t i = 0; i < n && i < 32; i++)
		if (f[i])
			bits |= 1u << i;
	return bits;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Error is a cudaError_t.
type Error int32

// The cudaError_t values Spillway produces or inspects (from cuda_runtime.h).
const (
	Success                = Error(C.cudaSuccess)
	ErrorInvalidValue      = Error(C.cudaErrorInvalidValue)
	ErrorMemoryAllocation  = Error(C.cudaErrorMemoryAllocation)
	ErrorInitialization    = Error(C.cudaErrorInitializationError)
	ErrorInvalidDevice     = Error(C.cudaErrorInvalidDevice)
	ErrorInvalidDevicePtr  = Error(C.cudaErrorInvalidDevicePointer)
	ErrorSymbolNotFound    = Error(C.cudaErrorSymbolNotFound)
	ErrorNotReady          = Error(C.cudaErrorNotReady)
	ErrorNotSupported      = Error(C.cudaErrorNotSupported)
	ErrorUnknown           = Error(C.cudaErrorUnknown)
	ErrorInsufficientDrive = Error(C.cudaErrorInsufficientDriver)
	// ErrorInvalidResourceHandle: an invalid or destroyed stream or event.
	ErrorInvalidResourceHandle = Error(C.cudaErrorInvalidResourceHandle)
	// ErrorStreamCaptureUnsupported: the call is not allowed while a stream captures.
	ErrorStreamCaptureUnsupported = Error(C.cudaErrorStreamCaptureUnsupported)
)

var errorNames = map[Error]string{
	Success:                       "cudaSuccess",
	ErrorInvalidValue:             "cudaErrorInvalidValue",
	ErrorMemoryAllocation:         "cudaErrorMemoryAllocation",
	ErrorInitialization:           "cudaErrorInitializationError",
	ErrorInvalidDevice:            "cudaErrorInvalidDevice",
	ErrorInvalidDevicePtr:         "cudaErrorInvalidDevicePointer",
	ErrorSymbolNotFound:           "cudaErrorSymbolNotFound",
	ErrorNotReady:                 "cudaErrorNotReady",
	ErrorNotSupported:             "cudaErrorNotSupported",
	ErrorUnknown:                  "cudaErrorUnknown",
	ErrorInsufficientDrive:        "cudaErrorInsufficientDriver",
	ErrorInvalidResourceHandle:    "cudaErrorInvalidResourceHandle",
	ErrorStreamCaptureUnsupported: "cudaErrorStreamCaptureUnsupported",
	// Errors of the device or its context, which a call the shim makes for
	// the application (a synchronization, a reservation) may meet and pass on.
	Error(C.cudaErrorCudartUnloading):     "cudaErrorCudartUnloading",
	Error(C.cudaErrorNoDevice):            "cudaErrorNoDevice",
	Error(C.cudaErrorDeviceUninitialized): "cudaErrorDeviceUninitialized",
	Error(C.cudaErrorIllegalAddress):      "cudaErrorIllegalAddress",
	Error(C.cudaErrorContextIsDestroyed):  "cudaErrorContextIsDestroyed",
	Error(C.cudaErrorAssert):              "cudaErrorAssert",
	Error(C.cudaErrorLaunchFailure):       "cudaErrorLaunchFailure",
	Error(C.cudaErrorNotPermitted):        "cudaErrorNotPermitted",
}

func (e Error) Error() string {
	if name, ok := errorNames[e]; ok {
		return fmt.Sprintf("%s (%d)", name, int32(e))
	}
	return fmt.Sprintf("cudaError %d", int32(e))
}

// DevicePtr is a device (or managed) address.
type DevicePtr uint64

// Stream is a cudaStream_t handle; 0 is the legacy default stream.
type Stream uint64

// Event is a cudaEvent_t handle.
type Event uint64

// Managed-memory attach flags for MallocManaged.
const AttachGlobal = uint32(C.cudaMemAttachGlobal)

// Flags and special values of the calls below.
const (
	EventDisableTiming = uint32(C.cudaEventDisableTiming)
	HostAllocMapped    = uint32(C.cudaHostAllocMapped)
	// CPUDevice is cudaCpuDeviceId, the host as a MemAdvise or
	// MemPrefetchAsync location.
	CPUDevice = int(C.cudaCpuDeviceId)
	// StreamLegacy and StreamPerThread are the special stream handles.
	StreamLegacy    = Stream(1)
	StreamPerThread = Stream(2)
)

// Advice is a cudaMemoryAdvise value.
type Advice int32

// The advice Spillway gives.
const (
	AdviseSetPreferredLocation = Advice(C.cudaMemAdviseSetPreferredLocation)
	AdviseSetAccessedBy        = Advice(C.cudaMemAdviseSetAccessedBy)
)

// DeviceAttr is a cudaDeviceAttr value.
type DeviceAttr int32

// DevAttrManagedMemory: whether the device supports managed memory.
const DevAttrManagedMemory = DeviceAttr(C.cudaDevAttrManagedMemory)

// The device's PCI domain, bus and device (slot) numbers: what names it to
// NVML whatever ordinal CUDA_VISIBLE_DEVICES gives it.
const (
	DevAttrPCIDomainID = DeviceAttr(C.cudaDevAttrPciDomainId)
	DevAttrPCIBusID    = DeviceAttr(C.cudaDevAttrPciBusId)
	DevAttrPCIDeviceID = DeviceAttr(C.cudaDevAttrPciDeviceId)
)

// Runtime calls the real CUDA runtime through the front's table. The table
// is owned by the front, lives for the whole process, and is never written
// after the core starts.
type Runtime struct {
	t *C.struct_spillway_real
	// device is the device the calls run on, or -1 for the calling
	// thread's current device (see On).
	device C.int
	// primary is device's primary context, which On's calls run in; nil
	// where it could not be retained (they then run with device current).
	primary  C.CUcontext
	contexts *primaryContexts
}

// required are the entries without which no call can be served, in field order.
var required = []string{"cudaMalloc", "cudaFree", "cudaMallocManaged", "cudaMallocPitch",
	"cudaMallocAsync", "cudaFreeAsync", "cudaMemGetInfo", "cudaDeviceReset", "cudaGetDevice"}

// realTable is table, a const struct spillway_real *, where it is one this
// build can read: present, and at least as long as this build's.
func realTable(table unsafe.Pointer) (*C.struct_spillway_real, error) {
	t := (*C.struct_spillway_real)(table)
	if t == nil {
		return nil, errors.New("no real-function table")
	}
	if uintptr(t.size) < unsafe.Sizeof(*t) {
		return nil, fmt.Errorf("real-function table of %d bytes, want at least %d (front and core from different builds?)", t.size, unsafe.Sizeof(*t))
	}
	return t, nil
}

// NewRuntime wraps the table at table, a const struct spillway_real *.
func NewRuntime(table unsafe.Pointer) (*Runtime, error) {
	t, err := realTable(table)
	if err != nil {
		return nil, err
	}
	bits := uint32(C.present(t))
	for i, name := range required {
		if bits&(1<<i) == 0 {
			return nil, fmt.Errorf("the real %s was not found", name)
		}
	}
	return &Runtime{t: t, device: -1, contexts: &primaryContexts{ctx: map[int]C.CUcontext{}}}, nil
}

// On returns a Runtime for calls the caller makes for its own purposes
// (the pool's reservations, events and queries), not on an application's
// behalf. Each call runs in device's primary context, where the pool's
// memory, streams and events live, whatever context the application has
// current (one it created, another device's, none), and puts the
// application's context back, in one crossing into C (with none current, a
// call on the runtime's current device leaves its primary context current,
// as the runtime's own calls do). The primary
// context is retained at the first On for the device and held for the
// life of the process, as the runtime holds it; where it cannot be (no
// such device), the calls run with device current instead. Each call also
// leaves the thread's last error (cudaGetLastError) as it found it: the
// application must not see the failures its allocator recovers from. When
// the application had an error pending that cannot be produced again (see
// SetLastError), the internal call's error replaces it, so that an error
// still shows.
func (r *Runtime) On(device int) *Runtime {
	return &Runtime{t: r.t, device: C.int(device), primary: r.contexts.retain(r.t, device), contexts: r.contexts}
}

// SetLastError makes code the thread's last error, as a real call that
// failed with it would have, for a call the shim answers without calling
// the runtime. It uses a real call that fails with that code and changes
// nothing else: cudaGetDevice(NULL) for ErrorInvalidValue, a
// cudaMallocPitch of 2^59 bytes for ErrorMemoryAllocation,
// cudaSetDevice(-1) for ErrorInvalidDevice, cudaEventQuery(NULL) for
// ErrorInvalidResourceHandle. Other codes have no such call
// (ErrorInitialization, ErrorUnknown): the last error is left as it is.
// It does nothing when code is already the last error, or without
// cudaPeekAtLastError and cudaGetLastError in the table.
func (r *Runtime) SetLastError(code Error) {
	if code != Success {
		C.set_last_error(r.t, C.cudaError_t(code))
	}
}

// Malloc calls cudaMalloc.
func (r *Runtime) Malloc(size uint64) (DevicePtr, Error) {
	o := C.call_malloc(r.t, r.device, r.primary, C.uint64_t(size))
	return DevicePtr(o.v), Error(o.rc)
}

// Free calls cudaFree.
func (r *Runtime) Free(p DevicePtr) Error {
	return Error(C.call_free(r.t, r.device, r.primary, C.uint64_t(p)))
}

// MallocManaged calls cudaMallocManaged.
func (r *Runtime) MallocManaged(size uint64, flags uint32) (DevicePtr, Error) {
	o := C.call_malloc_managed(r.t, r.device, r.primary, C.uint64_t(size), C.unsigned(flags))
	return DevicePtr(o.v), Error(o.rc)
}

// MallocPitch calls cudaMallocPitch and returns the pointer and the pitch.
func (r *Runtime) MallocPitch(width, height uint64) (DevicePtr, uint64, Error) {
	o := C.call_malloc_pitch(r.t, r.device, r.primary, C.uint64_t(width), C.uint64_t(height))
	return DevicePtr(o.v), uint64(o.w), Error(o.rc)
}

// MallocAsync calls cudaMallocAsync.
func (r *Runtime) MallocAsync(size uint64, s Stream) (DevicePtr, Error) {
	o := C.call_malloc_async(r.t, r.device, r.primary, C.uint64_t(size), C.uint64_t(s))
	return DevicePtr(o.v), Error(o.rc)
}

// FreeAsync calls cudaFreeAsync.
func (r *Runtime) FreeAsync(p DevicePtr, s Stream) Error {
	return Error(C.call_free_async(r.t, r.device, r.primary, C.uint64_t(p), C.uint64_t(s)))
}

// MemGetInfo calls cudaMemGetInfo for the current device.
func (r *Runtime) MemGetInfo() (free, total uint64, rc Error) {
	o := C.call_mem_get_info(r.t, r.device, r.primary)
	return uint64(o.v), uint64(o.w), Error(o.rc)
}

// DeviceReset calls cudaDeviceReset for the current device.
func (r *Runtime) DeviceReset() Error { return Error(C.call_device_reset(r.t, r.device, r.primary)) }

// GetDevice calls cudaGetDevice.
func (r *Runtime) GetDevice() (int, Error) {
	o := C.call_get_device(r.t)
	return int(o.v), Error(o.rc)
}

// The entries below are optional in the table; a missing one answers
// ErrorSymbolNotFound.

// SetDevice calls cudaSetDevice.
func (r *Runtime) SetDevice(device int) Error {
	if r.t.set_device == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_set_device(r.t, C.int(device)))
}

// GetDeviceCount calls cudaGetDeviceCount.
func (r *Runtime) GetDeviceCount() (int, Error) {
	if r.t.get_device_count == nil {
		return 0, ErrorSymbolNotFound
	}
	o := C.call_get_device_count(r.t)
	return int(o.v), Error(o.rc)
}

// DeviceSynchronize calls cudaDeviceSynchronize for the current device.
func (r *Runtime) DeviceSynchronize() Error {
	if r.t.device_synchronize == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_device_synchronize(r.t, r.device, r.primary))
}

// StreamSynchronize calls cudaStreamSynchronize.
func (r *Runtime) StreamSynchronize(s Stream) Error {
	if r.t.stream_synchronize == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_stream_synchronize(r.t, r.device, r.primary, C.uint64_t(s)))
}

// EventCreate calls cudaEventCreateWithFlags.
func (r *Runtime) EventCreate(flags uint32) (Event, Error) {
	if r.t.event_create_with_flags == nil {
		return 0, ErrorSymbolNotFound
	}
	o := C.call_event_create(r.t, r.device, r.primary, C.unsigned(flags))
	return Event(o.v), Error(o.rc)
}

// EventRecord calls cudaEventRecord.
func (r *Runtime) EventRecord(e Event, s Stream) Error {
	if r.t.event_record == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_event_record(r.t, r.device, r.primary, C.uint64_t(e), C.uint64_t(s)))
}

// EventQuery calls cudaEventQuery: Success when complete, ErrorNotReady when not.
func (r *Runtime) EventQuery(e Event) Error {
	if r.t.event_query == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_event_query(r.t, r.device, r.primary, C.uint64_t(e)))
}

// EventSynchronize calls cudaEventSynchronize.
func (r *Runtime) EventSynchronize(e Event) Error {
	if r.t.event_synchronize == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_event_synchronize(r.t, r.device, r.primary, C.uint64_t(e)))
}

// EventDestroy calls cudaEventDestroy.
func (r *Runtime) EventDestroy(e Event) Error {
	if r.t.event_destroy == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_event_destroy(r.t, r.device, r.primary, C.uint64_t(e)))
}

// StreamDestroy calls cudaStreamDestroy.
func (r *Runtime) StreamDestroy(s Stream) Error {
	if r.t.stream_destroy == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_stream_destroy(r.t, r.device, r.primary, C.uint64_t(s)))
}

// DeviceGetAttribute calls cudaDeviceGetAttribute.
func (r *Runtime) DeviceGetAttribute(attr DeviceAttr, device int) (int, Error) {
	if r.t.device_get_attribute == nil {
		return 0, ErrorSymbolNotFound
	}
	o := C.call_device_get_attribute(r.t, r.device, r.primary, C.int(attr), C.int(device))
	return int(int64(o.v)), Error(o.rc)
}

// HostAlloc calls cudaHostAlloc and returns the host pointer.
func (r *Runtime) HostAlloc(size uint64, flags uint32) (uint64, Error) {
	if r.t.host_alloc == nil {
		return 0, ErrorSymbolNotFound
	}
	o := C.call_host_alloc(r.t, r.device, r.primary, C.uint64_t(size), C.unsigned(flags))
	return uint64(o.v), Error(o.rc)
}

// FreeHost calls cudaFreeHost with a host pointer from HostAlloc.
func (r *Runtime) FreeHost(host uint64) Error {
	if r.t.free_host == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_free_host(r.t, r.device, r.primary, C.uint64_t(host)))
}

// HostGetDevicePointer calls cudaHostGetDevicePointer for mapped pinned memory.
func (r *Runtime) HostGetDevicePointer(host uint64) (DevicePtr, Error) {
	if r.t.host_get_device_pointer == nil {
		return 0, ErrorSymbolNotFound
	}
	o := C.call_host_get_device_pointer(r.t, r.device, r.primary, C.uint64_t(host))
	return DevicePtr(o.v), Error(o.rc)
}

// MemAdvise calls cudaMemAdvise (CUDA 12's int-device form); device may be CPUDevice.
func (r *Runtime) MemAdvise(p DevicePtr, size uint64, advice Advice, device int) Error {
	if r.t.mem_advise == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_mem_advise(r.t, r.device, r.primary, C.uint64_t(p), C.uint64_t(size), C.int(advice), C.int(device)))
}

// MemPrefetchAsync calls cudaMemPrefetchAsync (CUDA 12's int-device form).
func (r *Runtime) MemPrefetchAsync(p DevicePtr, size uint64, device int, s Stream) Error {
	if r.t.mem_prefetch_async == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_mem_prefetch_async(r.t, r.device, r.primary, C.uint64_t(p), C.uint64_t(size), C.int(device), C.uint64_t(s)))
}

// CaptureStatus is a cudaStreamCaptureStatus value.
type CaptureStatus int32

// The capture states of a stream.
const (
	CaptureNone        = CaptureStatus(0) // cudaStreamCaptureStatusNone
	CaptureActive      = CaptureStatus(1) // cudaStreamCaptureStatusActive
	CaptureInvalidated = CaptureStatus(2) // cudaStreamCaptureStatusInvalidated
)

// CaptureMode is a cudaStreamCaptureMode value.
type CaptureMode int32

// The capture modes of a thread.
const (
	CaptureModeGlobal      = CaptureMode(0) // cudaStreamCaptureModeGlobal
	CaptureModeThreadLocal = CaptureMode(1) // cudaStreamCaptureModeThreadLocal
	CaptureModeRelaxed     = CaptureMode(2) // cudaStreamCaptureModeRelaxed
)

// StreamQuery calls cudaStreamQuery: Success or ErrorNotReady for a valid
// stream, ErrorInvalidResourceHandle for an invalid or destroyed one.
func (r *Runtime) StreamQuery(s Stream) Error {
	if r.t.stream_query == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_stream_query(r.t, r.device, r.primary, C.uint64_t(s)))
}

// StreamCapture calls cudaStreamGetCaptureInfo: the stream's capture
// status and, while it captures, the graph being built.
func (r *Runtime) StreamCapture(s Stream) (CaptureStatus, uint64, Error) {
	if r.t.stream_get_capture_info == nil {
		return CaptureNone, 0, ErrorSymbolNotFound
	}
	o := C.call_stream_capture_graph(r.t, r.device, r.primary, C.uint64_t(s))
	return CaptureStatus(o.v), uint64(o.w), Error(o.rc)
}

// ThreadExchangeStreamCaptureMode calls cudaThreadExchangeStreamCaptureMode:
// it sets the calling thread's capture mode and returns the previous one.
func (r *Runtime) ThreadExchangeStreamCaptureMode(mode CaptureMode) (CaptureMode, Error) {
	if r.t.thread_exchange_stream_capture_mode == nil {
		return mode, ErrorSymbolNotFound
	}
	o := C.call_thread_exchange_stream_capture_mode(r.t, r.device, r.primary, C.int(mode))
	return CaptureMode(o.v), Error(o.rc)
}
