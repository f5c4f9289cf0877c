package bpf

import "fmt"

// Func identifies a probed CUDA API function.
type Func uint16

// Op is what a probed function does to memory.
type Op uint8

const (
	OpAlloc    Op = iota + 1 // reserves memory; Size is the request
	OpFree                   // releases memory
	OpMemcpy                 // copies Size bytes in a Direction
	OpPrefetch               // migrates Size bytes of managed memory
	// OpOther does not change memory itself, but a layer below may do so
	// while serving it (the shim releases and promotes memory inside
	// cudaStreamDestroy): probing it makes those calls nested.
	OpOther
	OpMemset // sets Size bytes of device memory
	// OpSync waits for the device (cudaDeviceSynchronize, cuCtxSynchronize):
	// an application's step. Like OpOther, the shim may free and promote
	// memory while serving it.
	OpSync
)

// Direction is a copy's direction, numbered as cudaMemcpyKind.
type Direction uint8

const (
	HostToHost     Direction = 0
	HostToDevice   Direction = 1
	DeviceToHost   Direction = 2
	DeviceToDevice Direction = 3
	// DirectionDefault is cudaMemcpyDefault: the driver infers the direction
	// from the pointers, so it is counted as its own kind.
	DirectionDefault Direction = 4
	// DirectionInvalid is a cudaMemcpyKind outside 0..4; the call fails.
	DirectionInvalid Direction = 255
)

// String returns the short name used in summaries: h2h, h2d, d2h, d2d, default.
func (d Direction) String() string {
	switch d {
	case HostToHost:
		return "h2h"
	case HostToDevice:
		return "h2d"
	case DeviceToHost:
		return "d2h"
	case DeviceToDevice:
		return "d2d"
	case DirectionDefault:
		return "default"
	}
	return "invalid"
}

// funcSpec says where a function's interesting arguments are (indexes into
// the six argument registers; -1 when absent).
type funcSpec struct {
	name    string
	op      Op
	outArg  int       // out-pointer whose target (the new pointer) is read at return
	sizeArg int       // byte count
	kindArg int       // cudaMemcpyKind argument
	dir     Direction // fixed direction when kindArg is -1
	// rowsArg multiplies sizeArg when the size is given as width and
	// height (cudaMallocPitch); 0 when there is none.
	rowsArg int
	// addrArgs is a bit mask of the address arguments of a copy or memset,
	// classified against the spilled ranges in the kernel.
	addrArgs uint8
	// unitShift is log2 of the unit of sizeArg: cuMemsetD16/D32 count
	// 2- and 4-byte elements.
	unitShift uint8
}

// Address masks of copies: destination and source, or for the peer copies
// (dst, dstDevice, src, srcDevice, count; the driver's take contexts for
// devices) arguments 0 and 2.
const (
	dstSrc     = 0b11
	dstSrcPeer = 0b101
	dstOnly    = 0b1
)

// funcs is indexed by Func; entry 0 is unused so that a zero Func is invalid.
var funcs = [...]funcSpec{
	{},
	// Runtime API.
	{"cudaMalloc", OpAlloc, 0, 1, -1, 0, 0, 0, 0},
	{"cudaFree", OpFree, -1, -1, -1, 0, 0, 0, 0},
	{"cudaMallocManaged", OpAlloc, 0, 1, -1, 0, 0, 0, 0},
	{"cudaMallocHost", OpAlloc, 0, 1, -1, 0, 0, 0, 0},
	{"cudaHostAlloc", OpAlloc, 0, 1, -1, 0, 0, 0, 0},
	{"cudaFreeHost", OpFree, -1, -1, -1, 0, 0, 0, 0},
	{"cudaMallocAsync", OpAlloc, 0, 1, -1, 0, 0, 0, 0},
	{"cudaFreeAsync", OpFree, -1, -1, -1, 0, 0, 0, 0},
	{"cudaMemcpy", OpMemcpy, -1, 2, 3, 0, 0, dstSrc, 0},
	{"cudaMemcpyAsync", OpMemcpy, -1, 2, 3, 0, 0, dstSrc, 0},
	{"cudaMemcpyPeer", OpMemcpy, -1, 4, -1, DeviceToDevice, 0, dstSrcPeer, 0},
	{"cudaMemcpyPeerAsync", OpMemcpy, -1, 4, -1, DeviceToDevice, 0, dstSrcPeer, 0},
	{"cudaMemPrefetchAsync", OpPrefetch, -1, 1, -1, 0, 0, 0, 0},
	// Driver API.
	{"cuMemAlloc_v2", OpAlloc, 0, 1, -1, 0, 0, 0, 0},
	{"cuMemAlloc", OpAlloc, 0, 1, -1, 0, 0, 0, 0},
	{"cuMemFree_v2", OpFree, -1, -1, -1, 0, 0, 0, 0},
	{"cuMemFree", OpFree, -1, -1, -1, 0, 0, 0, 0},
	{"cuMemAllocManaged", OpAlloc, 0, 1, -1, 0, 0, 0, 0},
	{"cuMemAllocHost_v2", OpAlloc, 0, 1, -1, 0, 0, 0, 0},
	{"cuMemHostAlloc", OpAlloc, 0, 1, -1, 0, 0, 0, 0},
	{"cuMemFreeHost", OpFree, -1, -1, -1, 0, 0, 0, 0},
	{"cuMemAllocAsync", OpAlloc, 0, 1, -1, 0, 0, 0, 0},
	{"cuMemFreeAsync", OpFree, -1, -1, -1, 0, 0, 0, 0},
	{"cuMemcpy", OpMemcpy, -1, 2, -1, DirectionDefault, 0, dstSrc, 0},
	{"cuMemcpyAsync", OpMemcpy, -1, 2, -1, DirectionDefault, 0, dstSrc, 0},
	{"cuMemcpyHtoD_v2", OpMemcpy, -1, 2, -1, HostToDevice, 0, dstSrc, 0},
	{"cuMemcpyDtoH_v2", OpMemcpy, -1, 2, -1, DeviceToHost, 0, dstSrc, 0},
	{"cuMemcpyDtoD_v2", OpMemcpy, -1, 2, -1, DeviceToDevice, 0, dstSrc, 0},
	{"cuMemcpyHtoDAsync_v2", OpMemcpy, -1, 2, -1, HostToDevice, 0, dstSrc, 0},
	{"cuMemcpyDtoHAsync_v2", OpMemcpy, -1, 2, -1, DeviceToHost, 0, dstSrc, 0},
	{"cuMemcpyDtoDAsync_v2", OpMemcpy, -1, 2, -1, DeviceToDevice, 0, dstSrc, 0},
	{"cuMemPrefetchAsync", OpPrefetch, -1, 1, -1, 0, 0, 0, 0},
	{"cuMemPrefetchAsync_v2", OpPrefetch, -1, 1, -1, 0, 0, 0, 0},
	// Added later, so that the ids above keep their values.
	{"cudaMallocPitch", OpAlloc, 0, 2, -1, 0, 3, 0, 0},
	{"cudaMemGetInfo", OpOther, -1, -1, -1, 0, 0, 0, 0},
	{"cudaDeviceSynchronize", OpSync, -1, -1, -1, 0, 0, 0, 0},
	{"cudaStreamDestroy", OpOther, -1, -1, -1, 0, 0, 0, 0},
	{"cudaDeviceReset", OpOther, -1, -1, -1, 0, 0, 0, 0},
	{"cuCtxSynchronize", OpSync, -1, -1, -1, 0, 0, 0, 0},
	{"cudaMemset", OpMemset, -1, 2, -1, 0, 0, dstOnly, 0},
	{"cudaMemsetAsync", OpMemset, -1, 2, -1, 0, 0, dstOnly, 0},
	{"cuMemsetD8_v2", OpMemset, -1, 2, -1, 0, 0, dstOnly, 0},
	{"cuMemsetD8Async", OpMemset, -1, 2, -1, 0, 0, dstOnly, 0},
	{"cuMemsetD16_v2", OpMemset, -1, 2, -1, 0, 0, dstOnly, 1},
	{"cuMemsetD16Async", OpMemset, -1, 2, -1, 0, 0, dstOnly, 1},
	{"cuMemsetD32_v2", OpMemset, -1, 2, -1, 0, 0, dstOnly, 2},
	{"cuMemsetD32Async", OpMemset, -1, 2, -1, 0, 0, dstOnly, 2},
	// The shim serves these itself (and the driver's peer copies go through
	// cuMemcpy): unprobed, what they call below would be counted as the
	// application's own calls.
	{"cuMemAllocPitch_v2", OpAlloc, 0, 2, -1, 0, 3, 0, 0},
	{"cudaMallocFromPoolAsync", OpAlloc, 0, 1, -1, 0, 0, 0, 0},
	{"cuMemAllocFromPoolAsync", OpAlloc, 0, 1, -1, 0, 0, 0, 0},
	{"cuMemcpyPeer", OpMemcpy, -1, 4, -1, DeviceToDevice, 0, dstSrcPeer, 0},
	{"cuMemcpyPeerAsync", OpMemcpy, -1, 4, -1, DeviceToDevice, 0, dstSrcPeer, 0},
}

// Funcs returns every probed function, in a stable order.
func Funcs() []Func {
	out := make([]Func, 0, len(funcs)-1)
	for i := 1; i < len(funcs); i++ {
		out = append(out, Func(i))
	}
	return out
}

func (f Func) valid() bool { return f > 0 && int(f) < len(funcs) }

// String returns the function's symbol name.
func (f Func) String() string {
	if !f.valid() {
		return fmt.Sprintf("func(%d)", uint16(f))
	}
	return funcs[f].name
}

// Op returns what the function does to memory.
func (f Func) Op() Op {
	if !f.valid() {
		return 0
	}
	return funcs[f].op
}

// cookie encodes the function, its out-pointer argument and the address
// ranges to classify for the probes (see COOKIE_* in events.h).
func (f Func) cookie() uint64 {
	spec := funcs[f]
	c := uint64(f)
	if spec.outArg >= 0 {
		c |= uint64(spec.outArg+1) << 16
	}
	if spec.addrArgs != 0 && spec.sizeArg >= 0 {
		c |= uint64(spec.addrArgs)<<20 | uint64(spec.sizeArg+1)<<26 | uint64(spec.unitShift)<<30
	}
	return c
}

// ProbePoint identifies one of the shim's probe points.
type ProbePoint uint16

// Values match enum probe_point in events.h.
const (
	ProbeAlloc   ProbePoint = 1
	ProbeFree    ProbePoint = 2
	ProbeSync    ProbePoint = 3
	ProbeSpill   ProbePoint = 4
	ProbePromote ProbePoint = 5
	ProbeRefuse  ProbePoint = 6
)

var probeSymbols = map[ProbePoint]string{
	ProbeAlloc:   "spillway_probe_alloc",
	ProbeFree:    "spillway_probe_free",
	ProbeSync:    "spillway_probe_sync",
	ProbeSpill:   "spillway_probe_spill",
	ProbePromote: "spillway_probe_promote",
	ProbeRefuse:  "spillway_probe_refuse",
}

// String returns the probe point's short name (alloc, free, ...).
func (p ProbePoint) String() string {
	if s, ok := probeSymbols[p]; ok {
		return s[len("spillway_probe_"):]
	}
	return fmt.Sprintf("probe(%d)", uint16(p))
}

// Tiers of the alloc, free, spill and promote probe points.
const (
	TierDevice      = 0
	TierHostManaged = 1
	TierHostPinned  = 2
)

// Allocation sources of spillway_probe_alloc.
const (
	SourceCache       = 0 // served from the pool's cache
	SourceDevice      = 1 // a new reservation: a device segment, or host memory when the tier is not TierDevice
	SourcePassThrough = 2 // not pooled: the pool is off, or the application's own cudaMallocManaged memory
)
