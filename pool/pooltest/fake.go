// Package pooltest provides a simulated device for testing and benchmarking
// package pool without CUDA: a Backing whose memory is only address space,
// with a clock that orders frees, stream progress and synchronizations. It
// must never be used outside tests and benchmarks.
package pooltest

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/spillway-gpu/spillway/pool"
)

// Fake is a simulated device. Its zero value is not usable; call New.
// Every method is safe for concurrent use.
type Fake struct {
	mu sync.Mutex
	// Capacity is the device memory in bytes; Reserve fails with
	// pool.ErrOutOfMemory beyond it. Zero means unlimited.
	Capacity uint64
	// HostCapacity is the host memory for spilling; zero means unlimited.
	HostCapacity uint64
	// The Fail hooks, if set, are consulted before the call they name,
	// without the fake's lock (they may block, to hold a call in flight);
	// an error they return is the call's. Set them before the pool runs.
	//
	// FailReserve: Reserve fails, reserving nothing.
	FailReserve func(size uint64) error
	// FailRelease: Release or ReleaseAsync fails, freeing nothing.
	FailRelease func(base, size uint64) error
	// FailReleaseHost: ReleaseHost fails, freeing nothing.
	FailReleaseHost func(base, size uint64) error
	// FailSynchronize: Synchronize fails, and nothing completes.
	FailSynchronize func() error
	// FailRecordMarker: RecordMarker or RecordForeignMarker on s fails,
	// recording nothing.
	FailRecordMarker func(s pool.Stream) error
	// FailPromote: an error wrapping pool.ErrNotMoved, pool.ErrOutOfMemory
	// or pool.ErrStreamCapture fails Promote before anything moves; any other
	// is returned after the block has moved to the device, as when the
	// wait for a prefetch fails.
	FailPromote func(base, size uint64) error

	next      uint64
	clock     uint64
	lastSync  uint64
	completed map[pool.Stream]uint64
	queued    map[pool.Stream]uint64 // when work was last queued on a stream (Enqueue)
	foreign   map[pool.Stream]bool
	segments  map[uint64]uint64 // device reservations: base -> size
	host      map[uint64]hostBlock
	markers   map[pool.Marker]marker
	lost      map[pool.Marker]bool // markers gone with their context (EndContext)
	markerID  pool.Marker
	devBytes  uint64
	hostBytes uint64
	counts    Counts
}

type hostBlock struct {
	size     uint64
	tier     pool.Tier
	onDevice bool
}

type marker struct {
	stream  pool.Stream
	at      uint64
	foreign bool // recorded by RecordForeignMarker
}

// Counts are the calls the fake has served.
type Counts struct {
	Reserves, Releases, Syncs, Markers, MarkerQueries int
	StreamQueries                                     int // StreamIdle calls
	HostReserves, HostReleases, Promotions            int
	AsyncHostReleases                                 int // host releases ordered on a stream
	AsyncReserves, AsyncReleases                      int
}

// New returns a fake device with capacity bytes of memory (0: unlimited).
func New(capacity uint64) *Fake {
	return &Fake{
		Capacity:  capacity,
		next:      0x7f00_0000_0000,
		completed: make(map[pool.Stream]uint64),
		queued:    make(map[pool.Stream]uint64),
		foreign:   make(map[pool.Stream]bool),
		segments:  make(map[uint64]uint64),
		host:      make(map[uint64]hostBlock),
		markers:   make(map[pool.Marker]marker),
		lost:      make(map[pool.Marker]bool),
	}
}

// Tick advances the clock and returns the new time. Tests tick before each
// pool call they want to order against stream progress.
func (f *Fake) Tick() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clock++
	return f.clock
}

// Enqueue advances the clock, as Tick does, and notes that work (a free
// ordered on the stream) is queued on s at the new time, which it returns:
// s is not idle (StreamIdle) until Complete(s).
func (f *Fake) Enqueue(s pool.Stream) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clock++
	f.queued[s] = f.clock
	return f.clock
}

// StreamIdle implements pool.IdleStreamBacking: s is idle when it completed
// (Complete) after the last work queued on it (Enqueue). A stream nothing
// was queued on through Enqueue is never idle, since the fake cannot tell.
func (f *Fake) StreamIdle(s pool.Stream) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.StreamQueries++
	q, ok := f.queued[s]
	return ok && f.completed[s] > q, nil
}

// Complete makes all work queued on s so far complete.
func (f *Fake) Complete(s pool.Stream) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clock++
	f.completed[s] = f.clock
}

// MakeForeign makes s a foreign stream, as one of another device is:
// Synchronize does not wait for it, RecordMarker fails on it, and only
// RecordForeignMarker marks it.
func (f *Fake) MakeForeign(s pool.Stream) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.foreign[s] = true
}

// EndContext ends the context of streams ss, as destroying it or resetting
// its device does: their work completes, and the markers recorded on them
// are gone, so that querying one fails and destroying one panics, as it is
// a bug in the pool. Lost names them.
func (f *Fake) EndContext(ss ...pool.Stream) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clock++
	for _, s := range ss {
		f.completed[s] = f.clock
	}
	for m, mk := range f.markers {
		if slices.Contains(ss, mk.stream) {
			delete(f.markers, m)
			f.lost[m] = true
		}
	}
}

// Lost reports whether marker m went with its context (EndContext).
func (f *Fake) Lost(m pool.Marker) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lost[m]
}

// DestroyStream forgets what the fake knows of stream s, which must hold
// no marker and no queued work the caller still cares about.
func (f *Fake) DestroyStream(s pool.Stream) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.completed, s)
	delete(f.queued, s)
}

// SafeSince reports whether work queued at time t on stream s (or on every
// stream, when anyStream) is known complete: a synchronization began after t
// (not for a foreign stream), or s completed after t.
func (f *Fake) SafeSince(t uint64, s pool.Stream, anyStream bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lastSync > t && (anyStream || !f.foreign[s]) {
		return true
	}
	return !anyStream && f.completed[s] > t
}

func (f *Fake) alloc(size uint64) uint64 {
	const align = 2 << 20
	base := (f.next + align - 1) &^ (align - 1)
	f.next = base + size
	return base
}

// Reserve implements pool.Backing.
func (f *Fake) Reserve(size uint64) (uint64, error) {
	if f.FailReserve != nil {
		if err := f.FailReserve(size); err != nil {
			return 0, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Capacity != 0 && f.devBytes+size > f.Capacity {
		return 0, fmt.Errorf("fake device: %d bytes with %d of %d used: %w", size, f.devBytes, f.Capacity, pool.ErrOutOfMemory)
	}
	base := f.alloc(size)
	f.segments[base] = size
	f.devBytes += size
	f.counts.Reserves++
	return base, nil
}

// Release implements pool.Backing.
func (f *Fake) Release(base, size uint64) error {
	if f.FailRelease != nil {
		if err := f.FailRelease(base, size); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	got, ok := f.segments[base]
	if !ok {
		return fmt.Errorf("fake device: release of unknown segment %#x", base)
	}
	if got != size {
		return fmt.Errorf("fake device: release of %#x with size %d, reserved with %d", base, size, got)
	}
	delete(f.segments, base)
	f.devBytes -= size
	f.counts.Releases++
	return nil
}

// ReserveAsync implements pool.StreamOrderedBacking.
func (f *Fake) ReserveAsync(size uint64, s pool.Stream) (uint64, error) {
	base, err := f.Reserve(size)
	if err == nil {
		f.mu.Lock()
		f.counts.AsyncReserves++
		f.mu.Unlock()
	}
	return base, err
}

// ReleaseAsync implements pool.StreamOrderedBacking.
func (f *Fake) ReleaseAsync(base, size uint64, s pool.Stream) error {
	err := f.Release(base, size)
	if err == nil {
		f.mu.Lock()
		f.counts.AsyncReleases++
		f.mu.Unlock()
	}
	return err
}

// Synchronize implements pool.Backing: everything queued so far completes.
func (f *Fake) Synchronize() error {
	if f.FailSynchronize != nil {
		if err := f.FailSynchronize(); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clock++
	f.lastSync = f.clock
	f.counts.Syncs++
	return nil
}

// RecordMarker implements pool.Backing.
func (f *Fake) RecordMarker(s pool.Stream) (pool.Marker, error) {
	if f.FailRecordMarker != nil {
		if err := f.FailRecordMarker(s); err != nil {
			return 0, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.foreign[s] {
		return 0, fmt.Errorf("fake device: a marker of the device on foreign stream %d", s)
	}
	return f.record(s, false), nil
}

// record records a marker on s; f.mu is held.
func (f *Fake) record(s pool.Stream, foreign bool) pool.Marker {
	f.clock++
	f.markerID++
	f.markers[f.markerID] = marker{stream: s, at: f.clock, foreign: foreign}
	f.counts.Markers++
	return f.markerID
}

// RecordForeignMarker implements pool.ForeignStreamBacking: it fails on a
// stream that is not foreign (MakeForeign), where the pool has no reason
// to call it.
func (f *Fake) RecordForeignMarker(s pool.Stream) (pool.Marker, error) {
	if f.FailRecordMarker != nil {
		if err := f.FailRecordMarker(s); err != nil {
			return 0, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.foreign[s] {
		return 0, fmt.Errorf("fake device: a foreign marker on stream %d, the device's own", s)
	}
	return f.record(s, true), nil
}

// DestroyForeignMarker implements pool.ForeignStreamBacking; destroying an
// unknown marker, or one of RecordMarker, panics, as it is a bug in the pool.
func (f *Fake) DestroyForeignMarker(m pool.Marker) {
	f.destroy(m, true)
}

// MarkerDone implements pool.Backing.
func (f *Fake) MarkerDone(m pool.Marker) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	mk, ok := f.markers[m]
	if !ok {
		return false, fmt.Errorf("fake device: query of unknown marker %d", m)
	}
	f.counts.MarkerQueries++
	return (!mk.foreign && f.lastSync >= mk.at) || f.completed[mk.stream] >= mk.at, nil
}

// DestroyMarker implements pool.Backing; destroying an unknown marker, or
// one of RecordForeignMarker, panics, as it is a bug in the pool.
func (f *Fake) DestroyMarker(m pool.Marker) {
	f.destroy(m, false)
}

func (f *Fake) destroy(m pool.Marker, foreign bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	mk, ok := f.markers[m]
	if !ok || mk.foreign != foreign {
		panic(fmt.Sprintf("fake device: destroy of unknown marker %d (foreign %v)", m, foreign))
	}
	delete(f.markers, m)
}

// ReserveHost implements pool.HostBacking.
func (f *Fake) ReserveHost(size uint64, tier pool.Tier) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.HostCapacity != 0 && f.hostBytes+size > f.HostCapacity {
		return 0, fmt.Errorf("fake host: %d bytes with %d of %d used: %w", size, f.hostBytes, f.HostCapacity, pool.ErrOutOfMemory)
	}
	base := f.alloc(size)
	f.host[base] = hostBlock{size: size, tier: tier}
	f.hostBytes += size
	f.counts.HostReserves++
	return base, nil
}

// ReleaseHost implements pool.HostBacking. Work completes at once on the
// fake device, so a stream-ordered release (s not nil) is counted and then
// made like any other.
func (f *Fake) ReleaseHost(base, size uint64, tier pool.Tier, s *pool.Stream) error {
	if f.FailReleaseHost != nil {
		if err := f.FailReleaseHost(base, size); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.host[base]
	if !ok || h.size != size || h.tier != tier {
		return fmt.Errorf("fake host: release of %#x (%d bytes, %v) does not match a reservation", base, size, tier)
	}
	delete(f.host, base)
	if h.onDevice {
		f.devBytes -= size
	} else {
		f.hostBytes -= size
	}
	f.counts.HostReleases++
	if s != nil {
		f.counts.AsyncHostReleases++
	}
	return nil
}

// Promote implements pool.HostBacking.
func (f *Fake) Promote(base, size uint64) error {
	var failed error
	if f.FailPromote != nil {
		failed = f.FailPromote(base, size)
		if errors.Is(failed, pool.ErrNotMoved) || errors.Is(failed, pool.ErrOutOfMemory) || errors.Is(failed, pool.ErrStreamCapture) {
			return failed
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.host[base]
	if !ok || h.size != size || h.tier != pool.TierManaged || h.onDevice {
		return fmt.Errorf("fake host: promotion of %#x (%d bytes) does not match a managed host block", base, size)
	}
	h.onDevice = true
	f.host[base] = h
	f.hostBytes -= size
	f.devBytes += size
	f.counts.Promotions++
	return failed
}

// DeviceBytes returns the device memory reserved now, promoted blocks included.
func (f *Fake) DeviceBytes() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.devBytes
}

// HostBytes returns the host memory held now by blocks not promoted.
func (f *Fake) HostBytes() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hostBytes
}

// LiveMarkers returns how many markers exist (recorded, not destroyed).
func (f *Fake) LiveMarkers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.markers)
}

// Counts returns the calls served so far.
func (f *Fake) Counts() Counts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts
}
