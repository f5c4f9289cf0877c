// Package interpose is the typed boundary between Spillway's Go code and the
// real CUDA runtime: CUDA's types and error codes for Go, and typed calls
// through the table of real functions that the shim's C front resolved
// (see real.h). It is the only Go code that calls real CUDA, and the only
// place besides the core's exported entry points where cgo appears.
//
// It must never call an interposed symbol by name (that would resolve to the
// shim itself), never keep Go pointers in C, and never decide anything:
// policy (quotas, pooling) lives above it.
package interpose

/*
#cgo CFLAGS: -I${SRCDIR}/include -I${SRCDIR}
#include <stdint.h>
#include "real.h"

static cudaError_t call_malloc(const struct spillway_real *r, uint64_t size, uint64_t *ptr) {
	void *p = 0;
	cudaError_t rc = r->malloc(&p, (size_t)size);
	*ptr = (uint64_t)(uintptr_t)p;
	return rc;
}
static cudaError_t call_free(const struct spillway_real *r, uint64_t ptr) {
	return r->free((void *)(uintptr_t)ptr);
}
static cudaError_t call_malloc_managed(const struct spillway_real *r, uint64_t size, unsigned flags, uint64_t *ptr) {
	void *p = 0;
	cudaError_t rc = r->malloc_managed(&p, (size_t)size, flags);
	*ptr = (uint64_t)(uintptr_t)p;
	return rc;
}
static cudaError_t call_malloc_pitch(const struct spillway_real *r, uint64_t width, uint64_t height, uint64_t *ptr, uint64_t *pitch) {
	void *p = 0;
	size_t pt = 0;
	cudaError_t rc = r->malloc_pitch(&p, &pt, (size_t)width, (size_t)height);
	*ptr = (uint64_t)(uintptr_t)p;
	*pitch = pt;
	return rc;
}
static cudaError_t call_malloc_async(const struct spillway_real *r, uint64_t size, uint64_t stream, uint64_t *ptr) {
	void *p = 0;
	cudaError_t rc = r->malloc_async(&p, (size_t)size, (cudaStream_t)(uintptr_t)stream);
	*ptr = (uint64_t)(uintptr_t)p;
	return rc;
}
static cudaError_t call_free_async(const struct spillway_real *r, uint64_t ptr, uint64_t stream) {
	return r->free_async((void *)(uintptr_t)ptr, (cudaStream_t)(uintptr_t)stream);
}
static cudaError_t call_mem_get_info(const struct spillway_real *r, uint64_t *free, uint64_t *total) {
	size_t f = 0, t = 0;
	cudaError_t rc = r->mem_get_info(&f, &t);
	*free = f;
	*total = t;
	return rc;
}
static cudaError_t call_device_reset(const struct spillway_real *r) { return r->device_reset(); }
static cudaError_t call_get_device(const struct spillway_real *r, int *device) { return r->get_device(device); }
static cudaError_t call_set_device(const struct spillway_real *r, int device) { return r->set_device(device); }
static cudaError_t call_get_device_count(const struct spillway_real *r, int *count) { return r->get_device_count(count); }
static cudaError_t call_device_synchronize(const struct spillway_real *r) { return r->device_synchronize(); }
static cudaError_t call_stream_synchronize(const struct spillway_real *r, uint64_t stream) {
	return r->stream_synchronize((cudaStream_t)(uintptr_t)stream);
}
static cudaError_t call_event_create(const struct spillway_real *r, unsigned flags, uint64_t *event) {
	cudaEvent_t e = 0;
	cudaError_t rc = r->event_create_with_flags(&e, flags);
	*event = (uint64_t)(uintptr_t)e;
	return rc;
}
static cudaError_t call_event_record(const struct spillway_real *r, uint64_t event, uint64_t stream) {
	return r->event_record((cudaEvent_t)(uintptr_t)event, (cudaStream_t)(uintptr_t)stream);
}
static cudaError_t call_event_query(const struct spillway_real *r, uint64_t event) {
	return r->event_query((cudaEvent_t)(uintptr_t)event);
}
static cudaError_t call_event_synchronize(const struct spillway_real *r, uint64_t event) {
	return r->event_synchronize((cudaEvent_t)(uintptr_t)event);
}
static cudaError_t call_event_destroy(const struct spillway_real *r, uint64_t event) {
	return r->event_destroy((cudaEvent_t)(uintptr_t)event);
}
static cudaError_t call_stream_destroy(const struct spillway_real *r, uint64_t stream) {
	return r->stream_destroy((cudaStream_t)(uintptr_t)stream);
}
static cudaError_t call_device_get_attribute(const struct spillway_real *r, int attr, int device, int *value) {
	return r->device_get_attribute(value, (enum cudaDeviceAttr)attr, device);
}
static cudaError_t call_host_alloc(const struct spillway_real *r, uint64_t size, unsigned flags, uint64_t *ptr) {
	void *p = 0;
	cudaError_t rc = r->host_alloc(&p, (size_t)size, flags);
	*ptr = (uint64_t)(uintptr_t)p;
	return rc;
}
static cudaError_t call_free_host(const struct spillway_real *r, uint64_t ptr) {
	return r->free_host((void *)(uintptr_t)ptr);
}
static cudaError_t call_host_get_device_pointer(const struct spillway_real *r, uint64_t host, uint64_t *dev) {
	void *p = 0;
	cudaError_t rc = r->host_get_device_pointer(&p, (void *)(uintptr_t)host, 0);
	*dev = (uint64_t)(uintptr_t)p;
	return rc;
}
static cudaError_t call_mem_advise(const struct spillway_real *r, uint64_t ptr, uint64_t size, int advice, int device) {
	return r->mem_advise((const void *)(uintptr_t)ptr, (size_t)size, (enum cudaMemoryAdvise)advice, device);
}
static cudaError_t call_mem_prefetch_async(const struct spillway_real *r, uint64_t ptr, uint64_t size, int device, uint64_t stream) {
	return r->mem_prefetch_async((const void *)(uintptr_t)ptr, (size_t)size, device, (cudaStream_t)(uintptr_t)stream);
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
)

var errorNames = map[Error]string{
	Success:                "cudaSuccess",
	ErrorInvalidValue:      "cudaErrorInvalidValue",
	ErrorMemoryAllocation:  "cudaErrorMemoryAllocation",
	ErrorInitialization:    "cudaErrorInitializationError",
	ErrorInvalidDevice:     "cudaErrorInvalidDevice",
	ErrorInvalidDevicePtr:  "cudaErrorInvalidDevicePointer",
	ErrorSymbolNotFound:    "cudaErrorSymbolNotFound",
	ErrorNotReady:          "cudaErrorNotReady",
	ErrorNotSupported:      "cudaErrorNotSupported",
	ErrorUnknown:           "cudaErrorUnknown",
	ErrorInsufficientDrive: "cudaErrorInsufficientDriver",
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

// Runtime calls the real CUDA runtime through the front's table. The table
// is owned by the front, lives for the whole process, and is never written
// after the core starts.
type Runtime struct {
	t *C.struct_spillway_real
}

// required are the entries without which no call can be served, in field order.
var required = []string{"cudaMalloc", "cudaFree", "cudaMallocManaged", "cudaMallocPitch",
	"cudaMallocAsync", "cudaFreeAsync", "cudaMemGetInfo", "cudaDeviceReset", "cudaGetDevice"}

// NewRuntime wraps the table at table, a const struct spillway_real *.
func NewRuntime(table unsafe.Pointer) (*Runtime, error) {
	t := (*C.struct_spillway_real)(table)
	if t == nil {
		return nil, fmt.Errorf("no real-function table")
	}
	if uintptr(t.size) < unsafe.Sizeof(*t) {
		return nil, fmt.Errorf("real-function table of %d bytes, want at least %d (front and core from different builds?)", t.size, unsafe.Sizeof(*t))
	}
	bits := uint32(C.present(t))
	for i, name := range required {
		if bits&(1<<i) == 0 {
			return nil, fmt.Errorf("the real %s was not found", name)
		}
	}
	return &Runtime{t: t}, nil
}

// Malloc calls cudaMalloc.
func (r *Runtime) Malloc(size uint64) (DevicePtr, Error) {
	var p C.uint64_t
	rc := C.call_malloc(r.t, C.uint64_t(size), &p)
	return DevicePtr(p), Error(rc)
}

// Free calls cudaFree.
func (r *Runtime) Free(p DevicePtr) Error {
	return Error(C.call_free(r.t, C.uint64_t(p)))
}

// MallocManaged calls cudaMallocManaged.
func (r *Runtime) MallocManaged(size uint64, flags uint32) (DevicePtr, Error) {
	var p C.uint64_t
	rc := C.call_malloc_managed(r.t, C.uint64_t(size), C.unsigned(flags), &p)
	return DevicePtr(p), Error(rc)
}

// MallocPitch calls cudaMallocPitch and returns the pointer and the pitch.
func (r *Runtime) MallocPitch(width, height uint64) (DevicePtr, uint64, Error) {
	var p, pitch C.uint64_t
	rc := C.call_malloc_pitch(r.t, C.uint64_t(width), C.uint64_t(height), &p, &pitch)
	return DevicePtr(p), uint64(pitch), Error(rc)
}

// MallocAsync calls cudaMallocAsync.
func (r *Runtime) MallocAsync(size uint64, s Stream) (DevicePtr, Error) {
	var p C.uint64_t
	rc := C.call_malloc_async(r.t, C.uint64_t(size), C.uint64_t(s), &p)
	return DevicePtr(p), Error(rc)
}

// FreeAsync calls cudaFreeAsync.
func (r *Runtime) FreeAsync(p DevicePtr, s Stream) Error {
	return Error(C.call_free_async(r.t, C.uint64_t(p), C.uint64_t(s)))
}

// MemGetInfo calls cudaMemGetInfo for the current device.
func (r *Runtime) MemGetInfo() (free, total uint64, rc Error) {
	var f, t C.uint64_t
	rc = Error(C.call_mem_get_info(r.t, &f, &t))
	return uint64(f), uint64(t), rc
}

// DeviceReset calls cudaDeviceReset for the current device.
func (r *Runtime) DeviceReset() Error { return Error(C.call_device_reset(r.t)) }

// GetDevice calls cudaGetDevice.
func (r *Runtime) GetDevice() (int, Error) {
	var d C.int
	rc := C.call_get_device(r.t, &d)
	return int(d), Error(rc)
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
	var n C.int
	rc := C.call_get_device_count(r.t, &n)
	return int(n), Error(rc)
}

// DeviceSynchronize calls cudaDeviceSynchronize for the current device.
func (r *Runtime) DeviceSynchronize() Error {
	if r.t.device_synchronize == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_device_synchronize(r.t))
}

// StreamSynchronize calls cudaStreamSynchronize.
func (r *Runtime) StreamSynchronize(s Stream) Error {
	if r.t.stream_synchronize == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_stream_synchronize(r.t, C.uint64_t(s)))
}

// EventCreate calls cudaEventCreateWithFlags.
func (r *Runtime) EventCreate(flags uint32) (Event, Error) {
	if r.t.event_create_with_flags == nil {
		return 0, ErrorSymbolNotFound
	}
	var e C.uint64_t
	rc := C.call_event_create(r.t, C.unsigned(flags), &e)
	return Event(e), Error(rc)
}

// EventRecord calls cudaEventRecord.
func (r *Runtime) EventRecord(e Event, s Stream) Error {
	if r.t.event_record == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_event_record(r.t, C.uint64_t(e), C.uint64_t(s)))
}

// EventQuery calls cudaEventQuery: Success when complete, ErrorNotReady when not.
func (r *Runtime) EventQuery(e Event) Error {
	if r.t.event_query == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_event_query(r.t, C.uint64_t(e)))
}

// EventSynchronize calls cudaEventSynchronize.
func (r *Runtime) EventSynchronize(e Event) Error {
	if r.t.event_synchronize == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_event_synchronize(r.t, C.uint64_t(e)))
}

// EventDestroy calls cudaEventDestroy.
func (r *Runtime) EventDestroy(e Event) Error {
	if r.t.event_destroy == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_event_destroy(r.t, C.uint64_t(e)))
}

// StreamDestroy calls cudaStreamDestroy.
func (r *Runtime) StreamDestroy(s Stream) Error {
	if r.t.stream_destroy == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_stream_destroy(r.t, C.uint64_t(s)))
}

// DeviceGetAttribute calls cudaDeviceGetAttribute.
func (r *Runtime) DeviceGetAttribute(attr DeviceAttr, device int) (int, Error) {
	if r.t.device_get_attribute == nil {
		return 0, ErrorSymbolNotFound
	}
	var v C.int
	rc := C.call_device_get_attribute(r.t, C.int(attr), C.int(device), &v)
	return int(v), Error(rc)
}

// HostAlloc calls cudaHostAlloc and returns the host pointer.
func (r *Runtime) HostAlloc(size uint64, flags uint32) (uint64, Error) {
	if r.t.host_alloc == nil {
		return 0, ErrorSymbolNotFound
	}
	var p C.uint64_t
	rc := C.call_host_alloc(r.t, C.uint64_t(size), C.unsigned(flags), &p)
	return uint64(p), Error(rc)
}

// FreeHost calls cudaFreeHost with a host pointer from HostAlloc.
func (r *Runtime) FreeHost(host uint64) Error {
	if r.t.free_host == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_free_host(r.t, C.uint64_t(host)))
}

// HostGetDevicePointer calls cudaHostGetDevicePointer for mapped pinned memory.
func (r *Runtime) HostGetDevicePointer(host uint64) (DevicePtr, Error) {
	if r.t.host_get_device_pointer == nil {
		return 0, ErrorSymbolNotFound
	}
	var p C.uint64_t
	rc := C.call_host_get_device_pointer(r.t, C.uint64_t(host), &p)
	return DevicePtr(p), Error(rc)
}

// MemAdvise calls cudaMemAdvise (CUDA 12's int-device form); device may be CPUDevice.
func (r *Runtime) MemAdvise(p DevicePtr, size uint64, advice Advice, device int) Error {
	if r.t.mem_advise == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_mem_advise(r.t, C.uint64_t(p), C.uint64_t(size), C.int(advice), C.int(device)))
}

// MemPrefetchAsync calls cudaMemPrefetchAsync (CUDA 12's int-device form).
func (r *Runtime) MemPrefetchAsync(p DevicePtr, size uint64, device int, s Stream) Error {
	if r.t.mem_prefetch_async == nil {
		return ErrorSymbolNotFound
	}
	return Error(C.call_mem_prefetch_async(r.t, C.uint64_t(p), C.uint64_t(size), C.int(device), C.uint64_t(s)))
}
