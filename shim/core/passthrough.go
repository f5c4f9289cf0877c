package main

import (
	"sync"
	"sync/atomic"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/shim/config"
)

// allocKind says which CUDA call asked for memory.
type allocKind int

const (
	kindDevice allocKind = iota
	kindManaged
	kindAsync
	kindPitch
)

func (k allocKind) String() string {
	return [...]string{"cudaMalloc", "cudaMallocManaged", "cudaMallocAsync", "cudaMallocPitch"}[k]
}

// request is one allocation call.
type request struct {
	device int
	size   uint64
	kind   allocKind
	flags  uint32           // cudaMallocManaged
	stream interpose.Stream // cudaMallocAsync
}

// block is what the core knows about one live allocation.
type block struct {
	size   uint64
	device int
	tier   interpose.Tier
	source interpose.Source
}

// realRuntime is the part of the real CUDA runtime the core calls;
// *interpose.Runtime implements it, and tests substitute a fake.
type realRuntime interface {
	Malloc(size uint64) (interpose.DevicePtr, interpose.Error)
	MallocManaged(size uint64, flags uint32) (interpose.DevicePtr, interpose.Error)
	MallocPitch(width, height uint64) (interpose.DevicePtr, uint64, interpose.Error)
	MallocAsync(size uint64, s interpose.Stream) (interpose.DevicePtr, interpose.Error)
	Free(p interpose.DevicePtr) interpose.Error
	FreeAsync(p interpose.DevicePtr, s interpose.Stream) interpose.Error
	MemGetInfo() (free, total uint64, rc interpose.Error)
	DeviceReset() interpose.Error
}

// refusalFunc reports a request refused for the quota.
type refusalFunc func(kind allocKind, size uint64, device int, used, quota uint64)

// passThrough serves every call with the real runtime and accounts the
// bytes each device holds through interposed calls against its quota.
// A request is admitted by reserving its bytes before the real call (so
// concurrent callers cannot overshoot together) and rolled back if the call
// fails. Quotas are lock-free; the table of live blocks takes one lock per
// call.
//
// The pool replaces the real calls here with its own blocks; the quota then
// applies to the segments it reserves from the device.
type passThrough struct {
	rt      realRuntime
	cfg     config.Config
	refused refusalFunc
	quotas  [maxDevices]deviceQuota

	mu     sync.Mutex
	blocks map[interpose.DevicePtr]block
}

// maxDevices bounds device ordinals, as config does for SPILLWAY_MEMORY_LIMIT_<n>.
const maxDevices = 1024

// deviceQuota is one device's accounting.
type deviceQuota struct {
	// limit is the quota in bytes plus one, 0 while unresolved (a percentage
	// needs the device's total), 1 for no limit.
	limit atomic.Uint64
	used  atomic.Uint64
}

func newPassThrough(rt realRuntime, cfg config.Config, refused refusalFunc) *passThrough {
	return &passThrough{rt: rt, cfg: cfg, refused: refused, blocks: map[interpose.DevicePtr]block{}}
}

// quota returns the device's accounting and its limit (0: none), resolving
// the limit on first use. device is the current device, so the real
// cudaMemGetInfo answers for it.
func (m *passThrough) quota(device int) (*deviceQuota, uint64, interpose.Error) {
	if device < 0 || device >= maxDevices {
		return nil, 0, interpose.ErrorInvalidDevice
	}
	q := &m.quotas[device]
	if l := q.limit.Load(); l != 0 {
		return q, l - 1, interpose.Success
	}
	limit := m.cfg.LimitFor(device)
	bytes := limit.Bytes
	if limit.Percent > 0 {
		_, total, rc := m.rt.MemGetInfo()
		if rc != interpose.Success {
			return nil, 0, rc
		}
		bytes = limit.Resolve(total)
	}
	q.limit.Store(bytes + 1)
	return q, bytes, interpose.Success
}

// admit reserves size bytes of the device's quota for a request of
// requested bytes (what a refusal reports).
func (m *passThrough) admit(kind allocKind, device int, size, requested uint64) interpose.Error {
	q, limit, rc := m.quota(device)
	if rc != interpose.Success {
		return rc
	}
	for {
		used := q.used.Load()
		if limit != 0 && (size > limit || used > limit-size) {
			m.refused(kind, requested, device, used, limit)
			return interpose.ErrorMemoryAllocation
		}
		if q.used.CompareAndSwap(used, used+size) {
			return interpose.Success
		}
	}
}

func (m *passThrough) unadmit(device int, size uint64) {
	m.quotas[device].used.Add(-size)
}

func (m *passThrough) record(p interpose.DevicePtr, b block) {
	if p == 0 {
		return
	}
	m.mu.Lock()
	m.blocks[p] = b
	m.mu.Unlock()
}

// granule is the unit in which the device hands out memory: every
// allocation holds its size rounded up to it (CUDA aligns allocations to
// at least 256 bytes and sub-allocates small ones in 512-byte units).
const granule = 512

// charge is what an allocation of size bytes holds on the device.
func charge(size uint64) uint64 {
	if size > ^uint64(0)-granule {
		return size
	}
	return (size + granule - 1) / granule * granule
}

func (m *passThrough) malloc(r request) (interpose.DevicePtr, block, interpose.Error) {
	size := charge(r.size)
	if rc := m.admit(r.kind, r.device, size, r.size); rc != interpose.Success {
		return 0, block{}, rc
	}
	var p interpose.DevicePtr
	var rc interpose.Error
	tier := interpose.TierDevice
	switch r.kind {
	case kindManaged:
		p, rc = m.rt.MallocManaged(r.size, r.flags)
		tier = interpose.TierHostManaged
	case kindAsync:
		p, rc = m.rt.MallocAsync(r.size, r.stream)
	default:
		p, rc = m.rt.Malloc(r.size)
	}
	if rc != interpose.Success {
		m.unadmit(r.device, size)
		return 0, block{}, rc
	}
	b := block{size: size, device: r.device, tier: tier, source: interpose.SourcePassThrough}
	m.record(p, b)
	return p, b, interpose.Success
}

// mallocPitch admits the unpadded size first, then the padding the runtime
// chose; a request whose padding breaks the quota is undone and refused.
func (m *passThrough) mallocPitch(device int, width, height uint64) (interpose.DevicePtr, uint64, block, interpose.Error) {
	if height != 0 && width > ^uint64(0)/height {
		return 0, 0, block{}, interpose.ErrorInvalidValue
	}
	size := charge(width * height)
	if rc := m.admit(kindPitch, device, size, width*height); rc != interpose.Success {
		return 0, 0, block{}, rc
	}
	p, pitch, rc := m.rt.MallocPitch(width, height)
	if rc != interpose.Success {
		m.unadmit(device, size)
		return 0, 0, block{}, rc
	}
	if held := pitch * height; pitch >= width && held > size {
		padded := held - size
		if rc := m.admit(kindPitch, device, padded, width*height); rc != interpose.Success {
			m.rt.Free(p)
			m.unadmit(device, size)
			return 0, 0, block{}, rc
		}
		size += padded
	}
	b := block{size: size, device: device, tier: interpose.TierDevice, source: interpose.SourcePassThrough}
	m.record(p, b)
	return p, pitch, b, interpose.Success
}

// free releases p. A pointer the core does not know (NULL, a double free,
// memory from a path the shim does not see) goes to the real runtime as is,
// which gives CUDA's own answer.
func (m *passThrough) free(p interpose.DevicePtr, s interpose.Stream, async bool) (block, bool, interpose.Error) {
	m.mu.Lock()
	b, owned := m.blocks[p]
	delete(m.blocks, p)
	m.mu.Unlock()
	var rc interpose.Error
	if async {
		rc = m.rt.FreeAsync(p, s)
	} else {
		rc = m.rt.Free(p)
	}
	if !owned {
		return block{}, false, rc
	}
	if rc != interpose.Success {
		m.record(p, b) // still allocated as far as CUDA is concerned
		return block{}, false, rc
	}
	m.unadmit(b.device, b.size)
	return b, true, interpose.Success
}

// memGetInfo reports the quota as the total and what is left of it (never
// more than the device really has free) as the free memory.
func (m *passThrough) memGetInfo(device int) (free, total uint64, rc interpose.Error) {
	free, total, rc = m.rt.MemGetInfo()
	if rc != interpose.Success {
		return 0, 0, rc
	}
	q, limit, rc := m.quota(device)
	if rc != interpose.Success {
		return 0, 0, rc
	}
	used := q.used.Load()
	if limit == 0 {
		return free, total, interpose.Success
	}
	left := uint64(0)
	if used < limit {
		left = limit - used
	}
	return min(left, free), limit, interpose.Success
}

// deviceReset forgets every allocation on the device once the runtime has
// destroyed them.
func (m *passThrough) deviceReset(device int) interpose.Error {
	rc := m.rt.DeviceReset()
	if rc != interpose.Success {
		return rc
	}
	if device < 0 || device >= maxDevices {
		return interpose.Success
	}
	m.mu.Lock()
	for p, b := range m.blocks {
		if b.device == device {
			delete(m.blocks, p)
		}
	}
	m.quotas[device].used.Store(0)
	m.mu.Unlock()
	return interpose.Success
}

// adopt accounts an allocation the front passed through while the core was
// starting; it counts against the quota even if that exceeds it.
func (m *passThrough) adopt(p interpose.DevicePtr, size uint64, device int) {
	if device < 0 || device >= maxDevices {
		return
	}
	m.quotas[device].used.Add(size)
	m.record(p, block{size: size, device: device, tier: interpose.TierDevice, source: interpose.SourcePassThrough})
}
