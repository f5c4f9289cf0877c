package interpose

/*
#include <stdint.h>
#include "probes.h"

static void fire_alloc(const struct spillway_probes *p, uint64_t ptr, uint64_t size, int32_t device, int32_t tier, int32_t source) { p->alloc(ptr, size, device, tier, source); }
static void fire_free(const struct spillway_probes *p, uint64_t ptr, uint64_t size, int32_t device, int32_t tier) { p->free(ptr, size, device, tier); }
static void fire_sync(const struct spillway_probes *p, int32_t device, uint64_t bytes) { p->sync(device, bytes); }
static void fire_spill(const struct spillway_probes *p, uint64_t ptr, uint64_t size, int32_t device, int32_t tier) { p->spill(ptr, size, device, tier); }
static void fire_promote(const struct spillway_probes *p, uint64_t ptr, uint64_t size, int32_t device, int32_t tier) { p->promote(ptr, size, device, tier); }
static void fire_refuse(const struct spillway_probes *p, uint64_t size, int32_t device, uint64_t used, uint64_t quota) { p->refuse(size, device, used, quota); }
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Tier says where a block lives, as the probe points report it.
type Tier int32

// Tiers.
const (
	TierDevice      Tier = 0
	TierHostManaged Tier = 1
	TierHostPinned  Tier = 2
)

// Source says how an allocation was served, as the probe points report it.
type Source int32

// Sources.
const (
	SourceCache       Source = 0 // the pool's cache
	SourceReservation Source = 1 // a new reservation: a device segment, or host memory when the tier is not TierDevice
	SourcePassThrough Source = 2 // not pooled: pool off, or the application's own managed memory
)

// Probes fires the shim's probe points, and only while the probe semaphore
// is non-zero, that is while a tracer's uprobes are attached to them: each
// method first reads the semaphore (one plain load, which a tracer that
// attaches meanwhile may miss: that event goes unreported) and returns at
// once when it is zero.
type Probes struct {
	p   *C.struct_spillway_probes
	sem *uint16 // the kernel updates it from outside Go
}

// NewProbes wraps the table at table, a const struct spillway_probes *.
func NewProbes(table unsafe.Pointer) (*Probes, error) {
	p := (*C.struct_spillway_probes)(table)
	switch {
	case p == nil:
		return nil, errors.New("no probe table")
	case uintptr(p.size) < unsafe.Sizeof(*p):
		return nil, fmt.Errorf("probe table of %d bytes, want at least %d (front and core from different builds?)", p.size, unsafe.Sizeof(*p))
	case p.alloc == nil || p.free == nil || p.sync == nil || p.spill == nil || p.promote == nil || p.refuse == nil || p.semaphore == nil:
		return nil, errors.New("probe table with an unset entry: every probe point and the semaphore must be set (front and core from different builds?)")
	}
	return &Probes{p: p, sem: (*uint16)(unsafe.Pointer(p.semaphore))}, nil
}

// Enabled reports whether a tracer is attached to the probe points.
func (p *Probes) Enabled() bool { return *p.sem != 0 }

// Alloc fires spillway_probe_alloc.
func (p *Probes) Alloc(ptr DevicePtr, size uint64, device int, tier Tier, source Source) {
	if *p.sem == 0 {
		return
	}
	C.fire_alloc(p.p, C.uint64_t(ptr), C.uint64_t(size), C.int32_t(device), C.int32_t(tier), C.int32_t(source))
}

// Free fires spillway_probe_free.
func (p *Probes) Free(ptr DevicePtr, size uint64, device int, tier Tier) {
	if *p.sem == 0 {
		return
	}
	C.fire_free(p.p, C.uint64_t(ptr), C.uint64_t(size), C.int32_t(device), C.int32_t(tier))
}

// Sync fires spillway_probe_sync.
func (p *Probes) Sync(device int, freedBytes uint64) {
	if *p.sem == 0 {
		return
	}
	C.fire_sync(p.p, C.int32_t(device), C.uint64_t(freedBytes))
}

// Spill fires spillway_probe_spill.
func (p *Probes) Spill(ptr DevicePtr, size uint64, device int, tier Tier) {
	if *p.sem == 0 {
		return
	}
	C.fire_spill(p.p, C.uint64_t(ptr), C.uint64_t(size), C.int32_t(device), C.int32_t(tier))
}

// Promote fires spillway_probe_promote.
func (p *Probes) Promote(ptr DevicePtr, size uint64, device int, tier Tier) {
	if *p.sem == 0 {
		return
	}
	C.fire_promote(p.p, C.uint64_t(ptr), C.uint64_t(size), C.int32_t(device), C.int32_t(tier))
}

// Refuse fires spillway_probe_refuse.
func (p *Probes) Refuse(size uint64, device int, used, quota uint64) {
	if *p.sem == 0 {
		return
	}
	C.fire_refuse(p.p, C.uint64_t(size), C.int32_t(device), C.uint64_t(used), C.uint64_t(quota))
}
