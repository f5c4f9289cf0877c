package devmem

import (
	"sync"
	"sync/atomic"

	"github.com/spillway-gpu/spillway/interpose"
)

// vmmLedger counts the application's virtual-memory calls by physical
// bytes. CUDA frees the memory behind a handle once the handle has been
// released (every cuMemCreate and cuMemRetainAllocationHandle matched by
// a cuMemRelease) and its last mapping unmapped, in either order; the
// bytes, taken at cuMemCreate, are given back then. Mapping a handle
// twice charges nothing more. A handle the front placed on the host for
// oversubscription (TakeVMMHost) gives its bytes back to the device's host
// account instead (hostAccount, which carries them across a reset). Handles
// the ledger does not know (imported from another
// process, host-located memory the application asked for) are ignored:
// they hold no memory this process is charged for.
type vmmLedger struct {
	mu       sync.Mutex
	handles  map[uint64]*physical
	mappings map[interpose.DevicePtr]mapping // by start address
	// grantCPU lets the CPU read and write a range, in the calling thread's
	// context (cuMemSetAccess for host NUMA node 0); nil: not asked.
	grantCPU func(p interpose.DevicePtr, size uint64) interpose.Error
	noCPU    atomic.Bool // the driver refused grantCPU: not asked again
}

type physical struct {
	size    uint64
	ordinal int
	ledger  *deviceLedger // the device's: its quota, or its host account
	onHost  bool          // host memory for oversubscription (TakeVMMHost)
	refs    int           // cuMemCreate and cuMemRetainAllocationHandle, less cuMemRelease
	maps    int           // live mappings
}

type mapping struct {
	size   uint64
	handle uint64
}

// VMMCreated records a handle whose size bytes were taken on device for
// kind (TakeVMM, or TakeVMMHost for one placed on the host).
func (c *Core) VMMCreated(handle uint64, ordinal int, size uint64, kind TakeKind) {
	h := &physical{size: size, ordinal: ordinal, refs: 1, onHost: kind == TakeVMMHost}
	if h.ledger = c.mem.ledgerAt(ordinal); h.ledger == nil {
		return
	}
	v := &c.vmm
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.handles == nil {
		v.handles = map[uint64]*physical{}
	}
	v.handles[handle] = h
}

func (c *Core) VMMRetained(handle uint64) {
	v := &c.vmm
	v.mu.Lock()
	defer v.mu.Unlock()
	if h := v.handles[handle]; h != nil {
		h.refs++
	}
}

func (c *Core) VMMReleased(handle uint64) {
	v := &c.vmm
	v.mu.Lock()
	defer v.mu.Unlock()
	if h := v.handles[handle]; h != nil && h.refs > 0 {
		h.refs--
		v.freeIfGone(handle, h)
	}
}

// VMMMapped records a mapping of handle at [p, p+size): every one, so that
// an unmap finds the mappings of its range end to end; only those of known
// handles count.
func (c *Core) VMMMapped(p interpose.DevicePtr, size, handle uint64) {
	v := &c.vmm
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.mappings == nil {
		v.mappings = map[interpose.DevicePtr]mapping{}
	}
	v.mappings[p] = mapping{size: size, handle: handle}
	if h := v.handles[handle]; h != nil {
		h.maps++
		if h.onHost {
			// A tracing session learns spilled ranges from spills: this one
			// is spilled memory wherever it is mapped.
			c.mem.probes.Spill(p, size, h.ordinal, interpose.TierHostPinned)
		}
	}
}

// VMMUnmapped forgets the mappings within [p, p+size).
func (c *Core) VMMUnmapped(p interpose.DevicePtr, size uint64) {
	v := &c.vmm
	v.mu.Lock()
	defer v.mu.Unlock()
	v.within(p, size, c.unmapped)
}

// VMMAccessed follows the application's cuMemSetAccess of [p, p+size): each
// mapping in it of a handle the front placed on the host is granted to the
// CPU as well. The application asked for device memory and granted its
// devices only, but CUDA's pointer queries call this memory host memory,
// and a library that reads host memory with the CPU (CUDA-aware MPI)
// faults on it unless the CPU was granted. Mapping by mapping: the range
// may hold device memory too, which the driver never grants the CPU. A
// driver that refuses the grant is said once and not asked again.
func (c *Core) VMMAccessed(p interpose.DevicePtr, size uint64) {
	v := &c.vmm
	if v.grantCPU == nil || v.noCPU.Load() {
		return
	}
	type onHost struct {
		at      interpose.DevicePtr
		size    uint64
		ordinal int
	}
	var host []onHost
	v.mu.Lock()
	v.within(p, size, func(at interpose.DevicePtr, m mapping) {
		if h := v.handles[m.handle]; h != nil && h.onHost {
			host = append(host, onHost{at, m.size, h.ordinal})
		}
	})
	v.mu.Unlock()
	for _, r := range host {
		if rc := v.grantCPU(r.at, r.size); rc != interpose.Success {
			if !v.noCPU.Swap(true) {
				c.mem.hostPlacedCPURefused(r.ordinal, rc)
			}
			return
		}
	}
}

// within calls f for each mapping within [p, p+size); v.mu is held, and f
// may forget the mapping. cuMemUnmap and cuMemSetAccess take whole mappings
// only, so they lie end to end from p: one look-up each, where a scan of
// every mapping per call would make a large range handled granule by
// granule quadratic. A gap (a mapping made while the core was not
// listening) falls back to that scan for the rest of the range.
func (v *vmmLedger) within(p interpose.DevicePtr, size uint64, f func(at interpose.DevicePtr, m mapping)) {
	end := p + interpose.DevicePtr(size)
	start := p
	for start < end {
		m, ok := v.mappings[start]
		if !ok {
			break
		}
		f(start, m)
		start += interpose.DevicePtr(m.size)
	}
	if start >= end {
		return
	}
	for at, m := range v.mappings {
		if start <= at && at < end {
			f(at, m)
		}
	}
}

// unmapped forgets the mapping m at start; v.mu is held.
func (c *Core) unmapped(start interpose.DevicePtr, m mapping) {
	v := &c.vmm
	delete(v.mappings, start)
	if h := v.handles[m.handle]; h != nil {
		if h.onHost {
			c.mem.probes.Free(start, m.size, h.ordinal, interpose.TierHostPinned)
		}
		h.maps--
		v.freeIfGone(m.handle, h)
	}
}

// freeIfGone gives back a handle's bytes once CUDA has freed them; v.mu is held.
func (v *vmmLedger) freeIfGone(handle uint64, h *physical) {
	if h.refs == 0 && h.maps == 0 {
		h.ledger.giveTaken(h.size, h.onHost)
		delete(v.handles, handle)
	}
}
