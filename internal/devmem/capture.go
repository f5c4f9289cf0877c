package devmem

import (
	"runtime"

	"github.com/spillway-gpu/spillway/interpose"
)

// relaxedCalls makes the calls CUDA counts as potentially unsafe during
// stream capture (cudaMalloc, cudaFree, cudaMallocManaged, cudaHostAlloc,
// cudaFreeHost, cudaDeviceSynchronize), when the pool makes them for its own
// work, in the relaxed capture mode, then restores the thread's mode. In
// global mode a capture by any thread, in thread-local mode one by the
// calling thread, forbids them and is invalidated by them, and nothing tells
// the pool that a non-blocking stream of another thread is capturing. The
// application's own calls keep their mode: they reach CUDA unwrapped. A
// runtime without capture modes (the driver serving for an absent runtime,
// a fake in tests) is called as is.
type relaxedCalls struct{ realRuntime }

// captureModes is a runtime that can switch the calling thread's capture
// mode (*interpose.Runtime).
type captureModes interface {
	ThreadExchangeStreamCaptureMode(mode interpose.CaptureMode) (interpose.CaptureMode, interpose.Error)
}

// relaxed switches the calling thread to the relaxed mode and returns what
// restores it. The goroutine stays on its thread meanwhile, since the mode
// belongs to the thread.
func (r relaxedCalls) relaxed() (restore func()) {
	modes, ok := r.realRuntime.(captureModes)
	if !ok {
		return func() {}
	}
	runtime.LockOSThread()
	prev, rc := modes.ThreadExchangeStreamCaptureMode(interpose.CaptureModeRelaxed)
	return func() {
		if rc == interpose.Success && prev != interpose.CaptureModeRelaxed {
			modes.ThreadExchangeStreamCaptureMode(prev)
		}
		runtime.UnlockOSThread()
	}
}

func (r relaxedCalls) Malloc(size uint64) (interpose.DevicePtr, interpose.Error) {
	defer r.relaxed()()
	return r.realRuntime.Malloc(size)
}

func (r relaxedCalls) MallocManaged(size uint64, flags uint32) (interpose.DevicePtr, interpose.Error) {
	defer r.relaxed()()
	return r.realRuntime.MallocManaged(size, flags)
}

func (r relaxedCalls) Free(p interpose.DevicePtr) interpose.Error {
	defer r.relaxed()()
	return r.realRuntime.Free(p)
}

func (r relaxedCalls) HostAlloc(size uint64, flags uint32) (uint64, interpose.Error) {
	defer r.relaxed()()
	return r.realRuntime.HostAlloc(size, flags)
}

func (r relaxedCalls) FreeHost(host uint64) interpose.Error {
	defer r.relaxed()()
	return r.realRuntime.FreeHost(host)
}

func (r relaxedCalls) DeviceSynchronize() interpose.Error {
	defer r.relaxed()()
	return r.realRuntime.DeviceSynchronize()
}
