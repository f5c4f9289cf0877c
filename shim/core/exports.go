package main

/*
#cgo CFLAGS: -I${SRCDIR}/../../interpose -I${SRCDIR}/../../interpose/include
#include "abi.h"
*/
import "C"

import (
	"unsafe"

	"github.com/spillway-gpu/spillway/internal/devmem"
	"github.com/spillway-gpu/spillway/interpose"
)

// Every entry point recovers from panics: a panic becomes a CUDA error and
// a log line, never a crash of the host.

// abiVersion is abi.h's SPILLWAY_CORE_ABI, which the front must share.
const abiVersion = C.SPILLWAY_CORE_ABI

//export spillway_core_abi
func spillway_core_abi() C.int32_t { return abiVersion }

//export spillway_core_init
func spillway_core_init(abi C.int32_t, real *C.struct_spillway_real, probes *C.struct_spillway_probes) (rc C.int32_t) {
	defer recoverTo(&rc, "init")
	return C.int32_t(start(int32(abi), unsafe.Pointer(real), unsafe.Pointer(probes)))
}

//export spillway_core_malloc
func spillway_core_malloc(device C.int32_t, size C.uint64_t, ptr *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaMalloc")
	p, e := running().Malloc(devmem.RuntimeAPI, int(device), uint64(size))
	return answer(allocated(p, e, ptr))
}

//export spillway_core_malloc_managed
func spillway_core_malloc_managed(device C.int32_t, size C.uint64_t, flags C.uint32_t, ptr *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaMallocManaged")
	p, e := running().MallocManaged(devmem.RuntimeAPI, int(device), uint64(size), uint32(flags))
	return answer(allocated(p, e, ptr))
}

//export spillway_core_malloc_pitch
func spillway_core_malloc_pitch(device C.int32_t, width, height C.uint64_t, ptr, pitch *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaMallocPitch")
	return answer(mallocPitch(devmem.RuntimeAPI, device, width, height, ptr, pitch))
}

//export spillway_core_malloc_async
func spillway_core_malloc_async(device C.int32_t, size, stream C.uint64_t, ptr *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaMallocAsync")
	p, e := running().MallocAsync(devmem.RuntimeAPI, int(device), uint64(size), interpose.Stream(stream))
	return answer(allocated(p, e, ptr))
}

//export spillway_core_free
func spillway_core_free(ptr C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaFree")
	return answer(running().Free(devmem.RuntimeAPI, interpose.DevicePtr(ptr)))
}

//export spillway_core_free_async
func spillway_core_free_async(ptr, stream, current C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaFreeAsync")
	return answer(running().FreeAsync(devmem.RuntimeAPI, interpose.DevicePtr(ptr), interpose.Stream(stream), uint64(current)))
}

//export spillway_core_mem_get_info
func spillway_core_mem_get_info(device C.int32_t, free, total *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaMemGetInfo")
	return answer(memGetInfo(device, free, total))
}

//export spillway_core_device_reset
func spillway_core_device_reset(device C.int32_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaDeviceReset")
	return answer(running().DeviceReset(int(device)))
}

//export spillway_core_device_synchronize
func spillway_core_device_synchronize(device C.int32_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaDeviceSynchronize")
	return answer(running().DeviceSynchronize(int(device)))
}

//export spillway_core_stream_destroy
func spillway_core_stream_destroy(stream C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaStreamDestroy")
	return answer(running().StreamDestroy(interpose.Stream(stream)))
}

//export spillway_core_cu_stream_forget
func spillway_core_cu_stream_forget(stream C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuStreamDestroy")
	running().StreamForget(interpose.Stream(stream))
	return 0
}

//export spillway_core_report
func spillway_core_report() (rc C.int32_t) {
	defer recoverTo(&rc, "report")
	running().Report()
	return 0
}

//export spillway_core_adopt
func spillway_core_adopt(ptr, size C.uint64_t, device C.int32_t) (rc C.int32_t) {
	defer recoverTo(&rc, "adopt")
	running().Adopt(interpose.DevicePtr(ptr), uint64(size), int(device))
	return 0
}

// The runtime's and the driver's entry points share their calls to the
// core, which write the outputs only after a success; each answers e in
// its own API (answer, driverAnswer).

// allocated writes p to ptr after a success and passes e on.
func allocated(p interpose.DevicePtr, e interpose.Error, ptr *C.uint64_t) interpose.Error {
	if e == interpose.Success {
		*ptr = C.uint64_t(p)
	}
	return e
}

// mallocPitch is cudaMallocPitch's and cuMemAllocPitch's call.
func mallocPitch(api devmem.API, device C.int32_t, width, height C.uint64_t, ptr, pitch *C.uint64_t) interpose.Error {
	p, pt, e := running().MallocPitch(api, int(device), uint64(width), uint64(height))
	if e == interpose.Success {
		*pitch = C.uint64_t(pt)
	}
	return allocated(p, e, ptr)
}

// memGetInfo is cudaMemGetInfo's and cuMemGetInfo's call.
func memGetInfo(device C.int32_t, free, total *C.uint64_t) interpose.Error {
	f, t, e := running().MemGetInfo(int(device))
	if e == interpose.Success {
		*free, *total = C.uint64_t(f), C.uint64_t(t)
	}
	return e
}

// answer returns an interposed call's result. A failure becomes the
// thread's last error, as the real call's would (interpose.Runtime's
// SetLastError), also when the core refused the call without calling the
// runtime (a quota, a double free); the core's own calls left none.
func answer(e interpose.Error) C.int32_t {
	if e != interpose.Success {
		setLastError(e)
	}
	return C.int32_t(e)
}

// setLastError sets e in the relaxed capture mode (devmem.Core.SetLastError).
func setLastError(e interpose.Error) {
	running().SetLastError(e)
}

// The driver's entry points answer a CUresult (a panic: CUDA_ERROR_UNKNOWN,
// the same 999 as cudaErrorUnknown) and never touch the runtime's last
// error: a driver call leaves none.

//export spillway_core_cu_malloc
func spillway_core_cu_malloc(device C.int32_t, size C.uint64_t, ptr *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemAlloc_v2")
	p, e := running().Malloc(devmem.DriverAPI, int(device), uint64(size))
	return driverAnswer(allocated(p, e, ptr))
}

//export spillway_core_cu_free
func spillway_core_cu_free(ptr C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemFree_v2")
	return driverAnswer(running().Free(devmem.DriverAPI, interpose.DevicePtr(ptr)))
}

//export spillway_core_cu_mem_get_info
func spillway_core_cu_mem_get_info(device C.int32_t, free, total *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemGetInfo_v2")
	return driverAnswer(memGetInfo(device, free, total))
}

// driverAnswer is the CUresult the driver would give for the runtime's e.
func driverAnswer(e interpose.Error) C.int32_t { return C.int32_t(e.DriverResult()) }

//export spillway_core_cu_malloc_managed
func spillway_core_cu_malloc_managed(device C.int32_t, size C.uint64_t, flags C.uint32_t, ptr *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemAllocManaged")
	p, e := running().MallocManaged(devmem.DriverAPI, int(device), uint64(size), uint32(flags))
	return driverAnswer(allocated(p, e, ptr))
}

//export spillway_core_cu_malloc_pitch
func spillway_core_cu_malloc_pitch(device C.int32_t, width, height C.uint64_t, ptr, pitch *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemAllocPitch_v2")
	return driverAnswer(mallocPitch(devmem.DriverAPI, device, width, height, ptr, pitch))
}

//export spillway_core_cu_malloc_async
func spillway_core_cu_malloc_async(device C.int32_t, size, stream C.uint64_t, ptr *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemAllocAsync")
	p, e := running().MallocAsync(devmem.DriverAPI, int(device), uint64(size), interpose.Stream(stream))
	return driverAnswer(allocated(p, e, ptr))
}

//export spillway_core_cu_free_async
func spillway_core_cu_free_async(ptr, stream, current C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemFreeAsync")
	return driverAnswer(running().FreeAsync(devmem.DriverAPI, interpose.DevicePtr(ptr), interpose.Stream(stream), uint64(current)))
}

//export spillway_core_cu_device_total_mem
func spillway_core_cu_device_total_mem(device C.int32_t, total *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuDeviceTotalMem_v2")
	t, e := running().TotalMem(int(device), uint64(*total))
	if e == interpose.Success {
		*total = C.uint64_t(t)
	}
	return driverAnswer(e)
}

//export spillway_core_cu_device_reset
func spillway_core_cu_device_reset(device C.int32_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuDevicePrimaryCtxReset")
	return driverAnswer(running().PrimaryCtxReset(int(device)))
}

//export spillway_core_cu_device_synchronize
func spillway_core_cu_device_synchronize(device C.int32_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuCtxSynchronize")
	return driverAnswer(running().DeviceSynchronize(int(device)))
}

//export spillway_core_nvml_memory
func spillway_core_nvml_memory(device C.int32_t, cudaTotal C.uint64_t, quota, used *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "nvmlDeviceGetMemoryInfo")
	q, u, e := running().NVMLMemory(int(device), uint64(cudaTotal))
	if e == interpose.Success {
		*quota, *used = C.uint64_t(q), C.uint64_t(u)
	}
	return C.int32_t(e)
}

// Memory counted outside the pools: contexts the application created, its
// explicit memory pools and its virtual-memory calls (devmem's outside.go,
// vmm.go). CUresult, no last error, but for the runtime's kinds.

// devmem.TakeKind's values are abi.h's SPILLWAY_TAKE_* (a compile-time check).
var (
	_ = [1]struct{}{}[devmem.TakeContext-C.SPILLWAY_TAKE_CONTEXT]
	_ = [1]struct{}{}[devmem.TakeVMM-C.SPILLWAY_TAKE_VMM]
	_ = [1]struct{}{}[devmem.TakeRuntime-C.SPILLWAY_TAKE_RUNTIME]
	_ = [1]struct{}{}[devmem.TakePool-C.SPILLWAY_TAKE_POOL]
	_ = [1]struct{}{}[devmem.TakeRuntimePool-C.SPILLWAY_TAKE_RUNTIME_POOL]
	_ = [1]struct{}{}[devmem.TakeVMMHost-C.SPILLWAY_TAKE_VMM_HOST]
	_ = [1]struct{}{}[devmem.TakeArray-C.SPILLWAY_TAKE_ARRAY]
	_ = [1]struct{}{}[devmem.TakeRuntimeArray-C.SPILLWAY_TAKE_RUNTIME_ARRAY]
	_ = [1]struct{}{}[devmem.TakeMipmappedArray-C.SPILLWAY_TAKE_MIPMAPPED_ARRAY]
	_ = [1]struct{}{}[devmem.TakeRuntimeMipmappedArray-C.SPILLWAY_TAKE_RUNTIME_MIPMAPPED_ARRAY]
	_ = [1]struct{}{}[devmem.TakeQuiet-C.SPILLWAY_TAKE_QUIET]
	_ = [1]struct{}{}[devmem.TakeInPrimary-C.SPILLWAY_TAKE_IN_PRIMARY]
)

//export spillway_core_take
func spillway_core_take(device C.int32_t, size C.uint64_t, kind C.int32_t) (rc C.int32_t) {
	defer recoverTo(&rc, "take")
	e := running().Take(int(device), uint64(size), devmem.TakeKind(kind))
	if devmem.TakeKind(kind).Runtime() {
		return answer(e) // the runtime's code, and its last error
	}
	return driverAnswer(e)
}

//export spillway_core_give
func spillway_core_give(device C.int32_t, size C.uint64_t, kind C.int32_t) (rc C.int32_t) {
	defer recoverTo(&rc, "give")
	running().Give(int(device), uint64(size), devmem.TakeKind(kind))
	return C.CUDA_SUCCESS
}

//export spillway_core_ctx_record
func spillway_core_ctx_record(ctx C.uint64_t, device C.int32_t, ptr, size C.uint64_t, fromPool C.int32_t) (rc C.int32_t) {
	defer recoverTo(&rc, "ctx_record")
	running().CtxRecord(uint64(ctx), int(device), interpose.DevicePtr(ptr), uint64(size), fromPool != 0)
	return C.CUDA_SUCCESS
}

//export spillway_core_ctx_forget
func spillway_core_ctx_forget(ptr C.uint64_t, ctx *C.uint64_t, device *C.int32_t, size *C.uint64_t, fromPool *C.int32_t) (rc C.int32_t) {
	defer recoverTo(&rc, "ctx_forget")
	b, ok := running().CtxForget(interpose.DevicePtr(ptr))
	if !ok {
		return 0
	}
	*ctx, *device, *size = C.uint64_t(b.Ctx), C.int32_t(b.Device), C.uint64_t(b.Size)
	*fromPool = 0
	if b.FromPool {
		*fromPool = 1
	}
	return 1
}

//export spillway_core_ctx_destroying
func spillway_core_ctx_destroying(ctx C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuCtxDestroy")
	running().CtxDestroying(uint64(ctx))
	return C.CUDA_SUCCESS
}

//export spillway_core_ctx_kept
func spillway_core_ctx_kept(ctx C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuCtxDestroy")
	running().CtxKept(uint64(ctx))
	return C.CUDA_SUCCESS
}

//export spillway_core_ctx_destroyed
func spillway_core_ctx_destroyed(ctx C.uint64_t, count *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuCtxDestroy")
	*count = C.uint64_t(running().CtxDestroyed(uint64(ctx)))
	return C.CUDA_SUCCESS
}

//export spillway_core_vmm_created
func spillway_core_vmm_created(handle C.uint64_t, device C.int32_t, size C.uint64_t, kind C.int32_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemCreate")
	running().VMMCreated(uint64(handle), int(device), uint64(size), devmem.TakeKind(kind))
	return C.CUDA_SUCCESS
}

//export spillway_core_vmm_retained
func spillway_core_vmm_retained(handle C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemRetainAllocationHandle")
	running().VMMRetained(uint64(handle))
	return C.CUDA_SUCCESS
}

//export spillway_core_vmm_released
func spillway_core_vmm_released(handle C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemRelease")
	running().VMMReleased(uint64(handle))
	return C.CUDA_SUCCESS
}

//export spillway_core_vmm_mapped
func spillway_core_vmm_mapped(ptr, size, handle C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemMap")
	running().VMMMapped(interpose.DevicePtr(ptr), uint64(size), uint64(handle))
	return C.CUDA_SUCCESS
}

//export spillway_core_vmm_unmapped
func spillway_core_vmm_unmapped(ptr, size C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemUnmap")
	running().VMMUnmapped(interpose.DevicePtr(ptr), uint64(size))
	return C.CUDA_SUCCESS
}

//export spillway_core_vmm_accessed
func spillway_core_vmm_accessed(ptr, size C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemSetAccess")
	running().VMMAccessed(interpose.DevicePtr(ptr), uint64(size))
	return C.CUDA_SUCCESS
}

//export spillway_core_address_range
func spillway_core_address_range(ptr C.uint64_t, held *C.int32_t, base, size *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemGetAddressRange")
	b, n, live, inPool := running().AddressRange(interpose.DevicePtr(ptr))
	switch {
	case live:
		*held, *base, *size = C.SPILLWAY_HELD_BLOCK, C.uint64_t(b), C.uint64_t(n)
	case inPool:
		*held = C.SPILLWAY_HELD_FREE
	default:
		*held = C.SPILLWAY_HELD_NOT
	}
	return C.CUDA_SUCCESS
}

//export spillway_core_graph_instantiated
func spillway_core_graph_instantiated(exec, graph C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaGraphInstantiate")
	running().GraphInstantiated(uint64(exec), uint64(graph))
	return C.CUDA_SUCCESS
}

//export spillway_core_graph_exec_destroyed
func spillway_core_graph_exec_destroyed(exec C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaGraphExecDestroy")
	running().GraphExecDestroyed(uint64(exec))
	return C.CUDA_SUCCESS
}

//export spillway_core_graph_destroyed
func spillway_core_graph_destroyed(graph C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaGraphDestroy")
	running().GraphDestroyed(uint64(graph))
	return C.CUDA_SUCCESS
}

//export spillway_core_graph_keep
func spillway_core_graph_keep(graph C.uint64_t, device C.int32_t, size C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cudaFreeAsync")
	running().GraphKeeps(uint64(graph), int(device), uint64(size))
	return C.CUDA_SUCCESS
}

//export spillway_core_capture_begun
func spillway_core_capture_begun() (rc C.int32_t) {
	defer recoverTo(&rc, "cudaStreamBeginCapture")
	running().CaptureBegun()
	return C.CUDA_SUCCESS
}

// A device's default memory pool (devmem's mempool.go): 1 when Spillway's
// pool answered, 0 when CUDA's answer stands.

//export spillway_core_mempool_usage
func spillway_core_mempool_usage(device, attr C.int32_t, value *C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemPoolGetAttribute")
	u, ok := running().DefaultPoolUsage(int(device))
	if !ok {
		return 0
	}
	switch attr {
	case C.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
		*value = C.uint64_t(u.Reserved)
	case C.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
		*value = C.uint64_t(u.ReservedHigh)
	case C.CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
		*value = C.uint64_t(u.Used)
	case C.CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		*value = C.uint64_t(u.UsedHigh)
	default:
		return 0
	}
	return 1
}

//export spillway_core_mempool_reset_high
func spillway_core_mempool_reset_high(device, attr C.int32_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemPoolSetAttribute")
	if attr != C.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH && attr != C.CU_MEMPOOL_ATTR_USED_MEM_HIGH {
		return 0
	}
	if !running().ResetDefaultPoolHigh(int(device), attr == C.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) {
		return 0
	}
	return 1
}

//export spillway_core_mempool_trim
func spillway_core_mempool_trim(device C.int32_t, keep C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuMemPoolTrimTo")
	if !running().TrimDefaultPool(int(device), uint64(keep)) {
		return 0
	}
	return 1
}

//export spillway_core_array_created
func spillway_core_array_created(handle, ctx C.uint64_t, device C.int32_t, size C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuArray3DCreate")
	running().ArrayCreated(uint64(handle), uint64(ctx), int(device), uint64(size))
	return C.CUDA_SUCCESS
}

//export spillway_core_array_destroyed
func spillway_core_array_destroyed(handle C.uint64_t) (rc C.int32_t) {
	defer recoverTo(&rc, "cuArrayDestroy")
	running().ArrayDestroyed(uint64(handle))
	return C.CUDA_SUCCESS
}
