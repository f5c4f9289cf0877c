package bpf

import (
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"
)

// Kind is the type of a record (enum event_type in events.h).
type Kind uint16

const (
	KindAPI          Kind = 1 // an outermost CUDA API call returned
	KindProbe        Kind = 2 // the shim fired a probe point
	KindFault        Kind = 3 // a CPU page fault
	KindExit         Kind = 4 // a traced process exited
	KindUVMFault     Kind = 5 // nvidia-uvm serviced a fault
	KindUVMMigration Kind = 6 // nvidia-uvm migrated pages
)

// Flags of a record (EVENT_FLAG_* in events.h).
const (
	flagSpilled  = 0x1
	flagUnpaired = 0x2
)

// Event is one decoded record.
type Event struct {
	Kind    Kind
	PID     uint32        // thread group id
	TID     uint32        // thread id
	TimeNs  uint64        // CLOCK_MONOTONIC nanoseconds at entry (API) or at the event
	Latency time.Duration // KindAPI: entry to return
	Func    Func          // KindAPI
	Probe   ProbePoint    // KindProbe
	// Args are the raw argument registers at entry (KindAPI, KindProbe); for
	// KindFault the address, instruction pointer and error code; for
	// KindUVMMigration the destination, source, address, bytes and cause.
	Args  [6]uint64
	Out   uint64 // KindAPI: the pointer stored through the out argument; KindFault: start of the spilled allocation
	Ret   int64  // KindAPI: the return value (a cudaError_t or CUresult)
	Flags uint32
}

// EventSize is the size of a record in the ring buffer.
const EventSize = int(unsafe.Sizeof(spillwayEvent{}))

var (
	offTs       = unsafe.Offsetof(spillwayEvent{}.TsNs)
	offLatency  = unsafe.Offsetof(spillwayEvent{}.LatencyNs)
	offArgs     = unsafe.Offsetof(spillwayEvent{}.Args)
	offOut      = unsafe.Offsetof(spillwayEvent{}.Out)
	offRet      = unsafe.Offsetof(spillwayEvent{}.Ret)
	offPid      = unsafe.Offsetof(spillwayEvent{}.Pid)
	offTid      = unsafe.Offsetof(spillwayEvent{}.Tid)
	offType     = unsafe.Offsetof(spillwayEvent{}.Type)
	offFunc     = unsafe.Offsetof(spillwayEvent{}.Func)
	offFlags    = unsafe.Offsetof(spillwayEvent{}.Flags)
	nativeOrder = binary.NativeEndian
)

// DecodeEvent decodes one ring-buffer record.
func DecodeEvent(raw []byte, e *Event) error {
	if len(raw) < EventSize {
		return fmt.Errorf("decode event: record of %d bytes, want %d", len(raw), EventSize)
	}
	u64 := func(off uintptr) uint64 { return nativeOrder.Uint64(raw[off:]) }
	e.TimeNs = u64(offTs)
	e.Latency = time.Duration(u64(offLatency))
	for i := range e.Args {
		e.Args[i] = u64(offArgs + uintptr(i)*8)
	}
	e.Out = u64(offOut)
	e.Ret = int64(u64(offRet))
	e.PID = nativeOrder.Uint32(raw[offPid:])
	e.TID = nativeOrder.Uint32(raw[offTid:])
	e.Kind = Kind(nativeOrder.Uint16(raw[offType:]))
	code := nativeOrder.Uint16(raw[offFunc:])
	e.Func, e.Probe = 0, 0
	switch e.Kind {
	case KindAPI:
		e.Func = Func(code)
	case KindProbe:
		e.Probe = ProbePoint(code)
	}
	e.Flags = nativeOrder.Uint32(raw[offFlags:])
	return nil
}

// OK reports whether an API call succeeded (returned 0).
func (e *Event) OK() bool { return e.Ret == 0 }

// Unpaired reports an API record whose return was matched to an entry of a
// different function, which happens only if a probed call never returned
// normally (longjmp, a thread killed mid-call).
func (e *Event) Unpaired() bool { return e.Flags&flagUnpaired != 0 }

// Spilled reports whether a fault hit memory the shim had spilled to the
// host, or whether a copy or memset named an address range whose first or
// last byte lay in such memory when it returned.
func (e *Event) Spilled() bool { return e.Flags&flagSpilled != 0 }

// Size returns the byte count of an API call or probe point: the request of
// an allocation, the bytes of a copy, memset or prefetch, the size of the allocation a
// probe point names (for sync: the bytes made reusable; for refuse: the
// request). It is 0 when the record carries none.
func (e *Event) Size() uint64 {
	switch e.Kind {
	case KindAPI:
		if !e.Func.valid() || funcs[e.Func].sizeArg < 0 {
			return 0
		}
		spec := funcs[e.Func]
		if spec.rowsArg > 0 {
			return e.Args[spec.sizeArg] * e.Args[spec.rowsArg]
		}
		return e.Args[spec.sizeArg] << spec.unitShift
	case KindProbe:
		switch e.Probe {
		case ProbeRefuse:
			return e.Args[0]
		default:
			return e.Args[1]
		}
	case KindUVMMigration:
		return e.Args[3]
	}
	return 0
}

// Direction returns the direction of a copy (KindAPI with Op OpMemcpy),
// decoding the cudaMemcpyKind argument of the runtime's functions.
func (e *Event) Direction() Direction {
	if e.Kind != KindAPI || !e.Func.valid() {
		return DirectionInvalid
	}
	spec := funcs[e.Func]
	if spec.kindArg < 0 {
		return spec.dir
	}
	kind := uint32(e.Args[spec.kindArg]) // an enum travels in the low 32 bits
	if kind > uint32(DirectionDefault) {
		return DirectionInvalid
	}
	return Direction(kind)
}

// Pointer returns the device pointer an API call or probe point is about:
// the new pointer of an allocation, the freed, prefetched or set pointer, or
// the pointer a probe point names.
func (e *Event) Pointer() uint64 {
	switch e.Kind {
	case KindAPI:
		switch e.Func.Op() {
		case OpAlloc:
			return e.Out
		case OpFree, OpPrefetch, OpMemset:
			return e.Args[0]
		}
	case KindProbe:
		if e.Probe != ProbeSync && e.Probe != ProbeRefuse {
			return e.Args[0]
		}
	}
	return 0
}

// Device returns the device a probe point names.
func (e *Event) Device() int32 {
	switch e.Probe {
	case ProbeSync:
		return int32(e.Args[0])
	case ProbeRefuse:
		return int32(e.Args[1])
	}
	return int32(e.Args[2])
}

// Tier returns the tier of an alloc, free, spill or promote probe point
// (0 device, 1 host managed, 2 host pinned).
func (e *Event) Tier() int32 { return int32(e.Args[3]) }

// Source returns where an alloc probe point's memory came from (Source*).
func (e *Event) Source() int32 { return int32(e.Args[4]) }

// Address returns a fault's address.
func (e *Event) Address() uint64 { return e.Args[0] }
