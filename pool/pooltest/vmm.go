package pooltest

import (
	"fmt"
	"maps"

	"github.com/spillway-gpu/spillway/pool"
)

// Granularity is the virtual fake's physical allocation granularity, that of
// current CUDA devices.
const Granularity = 2 << 20

// VirtualFake is a Fake that also implements pool.VirtualBacking, with CUDA's
// rules: address ranges and mappings aligned to the granularity, no mapping
// over a mapping, no unmapping of what is not mapped, no release of mapped
// physical memory or of a range with mappings in it. Physical memory counts
// in DeviceBytes (host-located memory in HostBytes) from creation to
// release, however often it is mapped.
type VirtualFake struct {
	*Fake
	// OnUnmap, if set, is called with the range of every successful Unmap,
	// so a test can check that no queued work may still use it.
	OnUnmap func(va, size uint64)
	// FailMove, if set, can fail a MoveGranule before anything changes.
	FailMove func(va uint64) error
	// The other Fail hooks, like Fake's, are consulted before the call they
	// name, without the fake's lock; an error they return is the call's,
	// which then changes nothing.
	//
	// FailMap: Map of handle at va fails, mapping nothing.
	FailMap func(va, handle uint64) error
	// FailUnmap: Unmap at va fails, the memory staying mapped.
	FailUnmap func(va uint64) error
	// FailReleasePhysical: ReleasePhysical of handle fails, freeing nothing.
	FailReleasePhysical func(handle uint64) error
	// FailFreeAddress: FreeAddress of the range at va fails, the range
	// staying reserved.
	FailFreeAddress func(va uint64) error
	// FailReserveAddress: ReserveAddress of size bytes fails, reserving
	// nothing. (Device physical memory fails with Fake's FailReserve.)
	FailReserveAddress func(size uint64) error
	// FailCreateHost: CreatePhysical of size bytes of host-located memory
	// fails, creating nothing.
	FailCreateHost func(size uint64) error

	ranges   map[uint64]uint64 // reserved address ranges: base -> size
	handles  map[uint64]*physical
	mappings map[uint64]uint64 // granule address -> handle
	handleID uint64
	physical uint64
	vcounts  VirtualCounts
}

type physical struct {
	mapped, host bool
	// contents stands for the bytes: what Write put at an address mapped
	// to it, by offset in the granule.
	contents map[uint64]uint64
}

// VirtualCounts are the virtual-memory calls the fake has served.
type VirtualCounts struct {
	AddressReserves, AddressFrees, Creates, HostCreates, Releases, Maps, Unmaps, Moves int
}

// NewVirtual returns a virtual fake device with capacity bytes of memory
// (0: unlimited).
func NewVirtual(capacity uint64) *VirtualFake {
	return &VirtualFake{
		Fake:     New(capacity),
		ranges:   make(map[uint64]uint64),
		handles:  make(map[uint64]*physical),
		mappings: make(map[uint64]uint64),
	}
}

// Granularity implements pool.VirtualBacking.
func (f *VirtualFake) Granularity() uint64 { return Granularity }

func aligned(v uint64) bool { return v%Granularity == 0 }

// ReserveAddress implements pool.VirtualBacking.
func (f *VirtualFake) ReserveAddress(size uint64) (uint64, error) {
	if f.FailReserveAddress != nil {
		if err := f.FailReserveAddress(size); err != nil {
			return 0, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if size == 0 || !aligned(size) {
		return 0, fmt.Errorf("fake device: address reservation of %d bytes, not a multiple of %d", size, Granularity)
	}
	base := f.alloc(size)
	f.ranges[base] = size
	f.vcounts.AddressReserves++
	return base, nil
}

// FreeAddress implements pool.VirtualBacking.
func (f *VirtualFake) FreeAddress(va, size uint64) error {
	if f.FailFreeAddress != nil {
		if err := f.FailFreeAddress(va); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if got, ok := f.ranges[va]; !ok || got != size {
		return fmt.Errorf("fake device: free of address range %#x (%d bytes) that was not reserved", va, size)
	}
	for g := va; g < va+size; g += Granularity {
		if _, ok := f.mappings[g]; ok {
			return fmt.Errorf("fake device: free of address range %#x with %#x still mapped", va, g)
		}
	}
	delete(f.ranges, va)
	f.vcounts.AddressFrees++
	return nil
}

// CreatePhysical implements pool.VirtualBacking: TierDevice memory counts
// against Capacity, TierPinned (host-located) memory against HostCapacity.
func (f *VirtualFake) CreatePhysical(size uint64, tier pool.Tier) (uint64, error) {
	if tier == pool.TierPinned {
		return f.createHost(size)
	}
	if tier != pool.TierDevice {
		return 0, fmt.Errorf("fake device: physical memory of tier %v; want %v or %v", tier, pool.TierDevice, pool.TierPinned)
	}
	if f.FailReserve != nil {
		if err := f.FailReserve(size); err != nil {
			return 0, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if size == 0 || !aligned(size) {
		return 0, fmt.Errorf("fake device: physical allocation of %d bytes, not a multiple of %d", size, Granularity)
	}
	if f.Capacity != 0 && f.devBytes+size > f.Capacity {
		return 0, fmt.Errorf("fake device: %d bytes with %d of %d used: %w", size, f.devBytes, f.Capacity, pool.ErrOutOfMemory)
	}
	f.handleID++
	f.handles[f.handleID] = &physical{}
	f.devBytes += size
	f.physical += size
	f.vcounts.Creates++
	return f.handleID, nil
}

func (f *VirtualFake) createHost(size uint64) (uint64, error) {
	if f.FailCreateHost != nil {
		if err := f.FailCreateHost(size); err != nil {
			return 0, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if size == 0 || !aligned(size) {
		return 0, fmt.Errorf("fake host: physical allocation of %d bytes, not a multiple of %d", size, Granularity)
	}
	if f.HostCapacity != 0 && f.hostBytes+size > f.HostCapacity {
		return 0, fmt.Errorf("fake host: %d bytes with %d of %d used: %w", size, f.hostBytes, f.HostCapacity, pool.ErrOutOfMemory)
	}
	f.handleID++
	f.handles[f.handleID] = &physical{host: true}
	f.hostBytes += size
	f.vcounts.HostCreates++
	return f.handleID, nil
}

// ReleasePhysical implements pool.VirtualBacking.
func (f *VirtualFake) ReleasePhysical(handle, size uint64) error {
	if f.FailReleasePhysical != nil {
		if err := f.FailReleasePhysical(handle); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ph, ok := f.handles[handle]
	switch {
	case !ok:
		return fmt.Errorf("fake device: release of unknown physical handle %d", handle)
	case ph.mapped:
		return fmt.Errorf("fake device: release of physical handle %d while mapped", handle)
	case size != Granularity:
		return fmt.Errorf("fake device: release of physical handle %d with size %d, created with %d", handle, size, Granularity)
	}
	delete(f.handles, handle)
	if ph.host {
		f.hostBytes -= size
	} else {
		f.devBytes -= size
		f.physical -= size
	}
	f.vcounts.Releases++
	return nil
}

func (f *VirtualFake) inRange(va, size uint64) bool {
	for base, n := range f.ranges {
		if base <= va && va+size <= base+n {
			return true
		}
	}
	return false
}

// Map implements pool.VirtualBacking. One handle is one granule.
func (f *VirtualFake) Map(va, size, handle uint64) error {
	if f.FailMap != nil {
		if err := f.FailMap(va, handle); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ph, ok := f.handles[handle]
	switch {
	case !ok:
		return fmt.Errorf("fake device: map of unknown physical handle %d", handle)
	case size != Granularity || !aligned(va):
		return fmt.Errorf("fake device: map of %d bytes at %#x, not one aligned granule", size, va)
	case !f.inRange(va, size):
		return fmt.Errorf("fake device: map at %#x outside every reserved range", va)
	case ph.mapped:
		return fmt.Errorf("fake device: physical handle %d is already mapped", handle)
	}
	if _, ok := f.mappings[va]; ok {
		return fmt.Errorf("fake device: map at %#x over an existing mapping", va)
	}
	f.mappings[va] = handle
	ph.mapped = true
	f.vcounts.Maps++
	return nil
}

// Unmap implements pool.VirtualBacking.
func (f *VirtualFake) Unmap(va, size uint64) error {
	if f.FailUnmap != nil {
		if err := f.FailUnmap(va); err != nil {
			return err
		}
	}
	f.mu.Lock()
	if !aligned(va) || !aligned(size) || size == 0 {
		f.mu.Unlock()
		return fmt.Errorf("fake device: unmap of %d bytes at %#x, not aligned to %d", size, va, Granularity)
	}
	for g := va; g < va+size; g += Granularity {
		if _, ok := f.mappings[g]; !ok {
			f.mu.Unlock()
			return fmt.Errorf("fake device: unmap at %#x, which is not mapped", g)
		}
	}
	for g := va; g < va+size; g += Granularity {
		f.handles[f.mappings[g]].mapped = false
		delete(f.mappings, g)
	}
	f.vcounts.Unmaps++
	hook := f.OnUnmap
	f.mu.Unlock()
	if hook != nil {
		hook(va, size)
	}
	return nil
}

// Mapped reports whether every byte of [lo, hi) is device memory: mapped, or
// inside one segment from Reserve.
func (f *VirtualFake) Mapped(lo, hi uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for base, size := range f.segments {
		if base <= lo && hi <= base+size {
			return true
		}
	}
	for g := lo &^ (Granularity - 1); g < hi; g += Granularity {
		if _, ok := f.mappings[g]; !ok {
			return false
		}
	}
	return true
}

// PhysicalBytes returns the device memory created and not released.
func (f *VirtualFake) PhysicalBytes() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.physical
}

// PhysicalHandles returns how many physical allocations, device or host,
// are created and not released.
func (f *VirtualFake) PhysicalHandles() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.handles)
}

// MappedBytes returns the physical memory mapped now.
func (f *VirtualFake) MappedBytes() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return uint64(len(f.mappings)) * Granularity
}

// AddressRanges returns how many address ranges are reserved.
func (f *VirtualFake) AddressRanges() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ranges)
}

// VirtualCounts returns the virtual-memory calls served so far.
func (f *VirtualFake) VirtualCounts() VirtualCounts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.vcounts
}

// HostGranules returns the addresses of the granules mapped to host-located
// memory now.
func (f *VirtualFake) HostGranules() map[uint64]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	host := map[uint64]bool{}
	for va, h := range f.mappings {
		if f.handles[h].host {
			host[va] = true
		}
	}
	return host
}

// MoveGranule implements pool.GranuleMover: from must be mapped at va and
// to mapped nowhere, of the same granularity; the contents go with the move.
func (f *VirtualFake) MoveGranule(va, size, from, to uint64) error {
	if f.FailMove != nil {
		if err := f.FailMove(va); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	src, dst := f.handles[from], f.handles[to]
	switch {
	case size != Granularity || !aligned(va):
		return fmt.Errorf("fake device: move of %d bytes at %#x, not one aligned granule", size, va)
	case src == nil || dst == nil:
		return fmt.Errorf("fake device: move between unknown physical handles %d and %d", from, to)
	case f.mappings[va] != from:
		return fmt.Errorf("fake device: move at %#x of handle %d, which is not mapped there", va, from)
	case dst.mapped:
		return fmt.Errorf("fake device: move at %#x to handle %d, which is mapped", va, to)
	}
	dst.contents = maps.Clone(src.contents)
	src.contents = nil
	src.mapped, dst.mapped = false, true
	f.mappings[va] = to
	f.vcounts.Moves++
	return nil
}

// Write stores value at address va, which must be mapped: it stays with the
// physical memory, wherever that is mapped next.
func (f *VirtualFake) Write(va, value uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.mappings[va&^(Granularity-1)]
	if !ok {
		return fmt.Errorf("fake device: write at %#x, which is not mapped", va)
	}
	ph := f.handles[h]
	if ph.contents == nil {
		ph.contents = map[uint64]uint64{}
	}
	ph.contents[va%Granularity] = value
	return nil
}

// Read returns what Write last stored at va (0 if nothing), which must be
// mapped.
func (f *VirtualFake) Read(va uint64) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.mappings[va&^(Granularity-1)]
	if !ok {
		return 0, fmt.Errorf("fake device: read at %#x, which is not mapped", va)
	}
	return f.handles[h].contents[va%Granularity], nil
}
