package pool_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

// errInjected is the failure the tests inject into the virtual fake.
var errInjected = errors.New("injected device failure")

// observedVirtual is a virtual harness whose Observer keeps the spilled
// ranges and the failures told.
func observedVirtual(t *testing.T, f *pooltest.VirtualFake, opt pool.Options) (*harness, *spillRanges) {
	t.Helper()
	obs := &spillRanges{recorder: recorder{sources: map[pool.Source]int{}}, ranges: map[uint64]uint64{}}
	opt.Observer = obs
	return newVirtualHarness(t, f, opt), obs
}

// checkFailures fails unless the pool counted backing errors and told
// told of them to the FailureObserver.
func checkFailures(t *testing.T, h *harness, obs *spillRanges, backing uint64, told int, when string) {
	t.Helper()
	if st := h.p.Stats(); st.BackingErrors != backing || st.ReleaseErrors != 0 || len(obs.failures) != told {
		t.Fatalf("%s: %d backing errors, %d release errors, failures told %v; want %d, none and %d told",
			when, st.BackingErrors, st.ReleaseErrors, obs.failures, backing, told)
	}
	for _, err := range obs.failures {
		if !errors.Is(err, errInjected) {
			t.Fatalf("%s: failure told %v, want the injected one", when, err)
		}
	}
}

// TestVirtualFailedMapKeepsTheGranule: a granule whose mapping fails is
// kept free, not lost: the allocation fails with the device's error,
// counted and not told (the call returns it), and the retry maps the same
// physical memory without creating any.
func TestVirtualFailedMapKeepsTheGranule(t *testing.T) {
	f := pooltest.NewVirtual(0)
	h, obs := observedVirtual(t, f, virtualOptions(4*granule))
	maps := 0
	f.FailMap = func(uint64, uint64) error {
		if maps++; maps == 2 {
			return errInjected
		}
		return nil
	}
	if _, err := h.alloc(2 * granule); !errors.Is(err, errInjected) {
		t.Fatalf("allocation whose second granule fails to map: %v, want the device's error", err)
	}
	checkFailures(t, h, obs, 1, 0, "after the failed map")
	if st := h.p.Stats(); st.Granules != 2 || f.MappedBytes() != granule {
		t.Fatalf("after the failed map: %d granules held, %d bytes mapped; want both kept, the first mapped", st.Granules, f.MappedBytes())
	}
	f.FailMap = nil
	h.mustAlloc(2 * granule)
	if vc := f.VirtualCounts(); vc.Creates != 2 {
		t.Fatalf("%d granules created, want the retry to reuse the 2 of the failed try", vc.Creates)
	}
	h.closeVirtual()
}

// TestVirtualFailedHostMapGivesTheHostGranuleBack: a host granule whose
// mapping fails goes back to the host, counted nowhere as spilled; the
// request fails with the device's error, counted and not told, as on the
// device, and the retry spills.
func TestVirtualFailedHostMapGivesTheHostGranuleBack(t *testing.T) {
	f := pooltest.NewVirtual(0)
	opt := virtualOptions(granule) // the device granule is the whole quota
	opt.Oversubscribe = true
	opt.SpillTier = pool.TierPinned
	opt.HostLimit = 8 * granule
	h, obs := observedVirtual(t, f, opt)
	h.mustAlloc(granule)
	f.FailMap = func(uint64, uint64) error { return errInjected } // every later map is a host granule's
	if _, err := h.alloc(granule); !errors.Is(err, errInjected) {
		t.Fatalf("allocation whose host granule fails to map: %v, want the device's error", err)
	}
	f.FailMap = nil
	checkFailures(t, h, obs, 1, 0, "after the failed host map")
	if st := h.p.Stats(); st.SpilledBytes != 0 || st.SpilledTotal != 0 || f.PhysicalHandles() != 1 || len(f.HostGranules()) != 0 {
		t.Fatalf("after the failed host map: %d bytes spilled (%d in all), %d physical allocations, host granules %v; want the device granule alone",
			st.SpilledBytes, st.SpilledTotal, f.PhysicalHandles(), f.HostGranules())
	}
	obs.check(t, f, "after the failed host map")
	if c := h.mustAlloc(granule); !f.HostGranules()[c] {
		t.Fatalf("retry at %#x not on a host granule (host granules %v)", c, f.HostGranules())
	}
	h.closeVirtual()
}

// TestVirtualFailedReleaseKeepsTheGranule: a granule the device fails to
// release stays held and counted: the device bytes, the quota's and the
// pool's figures still include it, the failure is counted and told, and a
// later release gives it back.
func TestVirtualFailedReleaseKeepsTheGranule(t *testing.T) {
	f := pooltest.NewVirtual(0)
	h, obs := observedVirtual(t, f, virtualOptions(4*granule))
	a := h.mustAlloc(granule)
	f.FailReleasePhysical = func(uint64) error { return errInjected }
	h.mustFree(a)
	h.appSync() // the release threshold of 0 releases the idle granule
	checkFailures(t, h, obs, 1, 1, "after the failed release")
	if st := h.p.Stats(); st.Granules != 1 || st.ReservedBytes != granule || st.BytesReleased != 0 || f.PhysicalBytes() != granule {
		t.Fatalf("after the failed release: %d granules, %d bytes reserved, %d released, %d physical; want the granule held",
			st.Granules, st.ReservedBytes, st.BytesReleased, f.PhysicalBytes())
	}
	f.FailReleasePhysical = nil
	if got := h.p.ReleaseCached(false); got != granule {
		t.Fatalf("ReleaseCached gave back %d bytes, want the granule's %d", got, granule)
	}
	h.check()
	h.closeVirtual()
}

// TestVirtualFailedHostReleaseKeepsTheGranule: a host granule the host
// fails to release when its block is freed stays held and counted as
// spilled, the failure counted and told, until Close releases it.
func TestVirtualFailedHostReleaseKeepsTheGranule(t *testing.T) {
	f := pooltest.NewVirtual(0)
	opt := virtualOptions(granule)
	opt.Oversubscribe = true
	opt.SpillTier = pool.TierPinned
	opt.HostLimit = 8 * granule
	h, obs := observedVirtual(t, f, opt)
	h.mustAlloc(granule)
	c := h.mustAlloc(granule)
	if !f.HostGranules()[c] {
		t.Fatalf("%#x on the device with the quota full", c)
	}
	f.FailReleasePhysical = func(uint64) error { return errInjected }
	h.mustFree(c)
	h.appSync()
	f.FailReleasePhysical = nil
	checkFailures(t, h, obs, 1, 1, "after the failed host release")
	if st := h.p.Stats(); st.SpilledBytes != granule || f.HostBytes() != granule {
		t.Fatalf("after the failed host release: %d bytes spilled, host holds %d; want the granule still counted", st.SpilledBytes, f.HostBytes())
	}
	// The device granule is the live block's: the granule left on the host
	// is no device memory cudaMemGetInfo may report free.
	if st := h.p.Stats(); st.CachedBytes != 0 {
		t.Errorf("after the failed host release: %d bytes cached, want none", st.CachedBytes)
	}
	obs.check(t, f, "after the failed host release") // unmapped: no longer a spilled range
	h.closeVirtual()
}

// emptiedArenaHarness returns a pool whose medium class has two arenas, the
// second (at the address returned) holding one block on a device and a host
// granule, with the failure hooks set by arm in force from its free on.
func emptiedArena(t *testing.T, arm func(f *pooltest.VirtualFake, arena uint64)) (*harness, *pooltest.VirtualFake, *spillRanges) {
	t.Helper()
	f := pooltest.NewVirtual(0)
	opt := virtualOptions(3 * granule)
	opt.Oversubscribe = true
	opt.SpillTier = pool.TierPinned
	opt.HostLimit = 8 * granule
	h, obs := observedVirtual(t, f, opt)
	h.mustAlloc(2 * granule)
	b := h.mustAlloc(2 * granule) // the quota holds one granule more: an arena of its own
	if st := h.p.Stats(); st.Segments != 2 || f.HostGranules()[b] || !f.HostGranules()[b+granule] {
		t.Fatalf("%d arenas, host granules %v; want a second arena at %#x, its first granule on the device and its second on the host",
			st.Segments, f.HostGranules(), b)
	}
	arm(f, b)
	h.mustFree(b)
	h.appSync()
	return h, f, obs
}

// TestVirtualArenaUnmapFailureKeepsTheArena: an emptied arena whose granule
// fails to unmap is kept, with its range, and the device is asked to free
// nothing; the failure is counted and told once. Close frees it.
func TestVirtualArenaUnmapFailureKeepsTheArena(t *testing.T) {
	h, f, obs := emptiedArena(t, func(f *pooltest.VirtualFake, arena uint64) {
		f.FailUnmap = func(va uint64) error {
			if va == arena {
				return errInjected
			}
			return nil
		}
	})
	f.FailUnmap = nil
	checkFailures(t, h, obs, 1, 1, "after the failed unmap")
	if st, vc := h.p.Stats(), f.VirtualCounts(); st.Segments != 2 || f.AddressRanges() != 2 || vc.AddressFrees != 0 {
		t.Fatalf("after the failed unmap: %d arenas, %d ranges, %d freed; want both arenas kept", st.Segments, f.AddressRanges(), vc.AddressFrees)
	}
	h.closeVirtual()
}

// TestVirtualArenaFreeFailureKeepsTheArena: an emptied arena whose range
// the device fails to free is kept, the failure counted and told. Close
// frees it.
func TestVirtualArenaFreeFailureKeepsTheArena(t *testing.T) {
	h, f, obs := emptiedArena(t, func(f *pooltest.VirtualFake, arena uint64) {
		f.FailFreeAddress = func(va uint64) error {
			if va == arena {
				return errInjected
			}
			return nil
		}
	})
	f.FailFreeAddress = nil
	checkFailures(t, h, obs, 1, 1, "after the failed free of the range")
	if st := h.p.Stats(); st.Segments != 2 || f.AddressRanges() != 2 {
		t.Fatalf("after the failed free of the range: %d arenas, %d ranges; want both kept", st.Segments, f.AddressRanges())
	}
	h.closeVirtual()
}

// TestMigrateFailedPromotion: a promotion whose move fails leaves the block
// on the host with its contents, keeps the device granule taken for it
// free (a release gives it back), and is counted and told.
func TestMigrateFailedPromotion(t *testing.T) {
	h, f, obs := migrateHarness(t)
	a := h.mustAlloc(4 * granule)
	h.mustAlloc(4 * granule) // the device is full
	c := h.mustAlloc(granule)
	want := stamp(t, f, map[uint64]uint64{c: granule})
	h.appSync() // every device granule hot: nothing moves
	moves := 0
	f.FailMove = func(uint64) error { moves++; return errInjected }
	h.mustFree(a)
	h.appSync()
	h.appSync()
	f.FailMove = nil
	if moves == 0 {
		t.Fatal("no promotion tried with room on the device")
	}
	checkFailures(t, h, obs, uint64(moves), moves, "after the failed promotions")
	if !f.HostGranules()[c] {
		t.Fatalf("%#x left the host with every move failing", c)
	}
	checkStamps(t, f, want, "after the failed promotions")
	h.p.ReleaseCached(false)
	if st := h.p.Stats(); st.Granules != 4 || f.PhysicalBytes() != 4*granule {
		t.Fatalf("after ReleaseCached: %d granules, %d physical bytes; want the 4 in use", st.Granules, f.PhysicalBytes())
	}
	h.closeVirtual()
}

// TestVirtualFailedCreationCounted: physical memory or address space the
// backing fails to create for a reason other than lack of memory fails the
// allocation with its error and is counted (not told: the call returns
// it); lack of memory is a refusal, not a failure.
func TestVirtualFailedCreationCounted(t *testing.T) {
	oom := fmt.Errorf("injected: %w", pool.ErrOutOfMemory)
	for _, c := range []struct {
		name    string
		inject  func(f *pooltest.VirtualFake, err error)
		host    bool
		counted bool
		err     error
	}{
		{"device granule", func(f *pooltest.VirtualFake, err error) {
			f.FailReserve = func(uint64) error { return err }
		}, false, true, errInjected},
		{"device granule, out of memory", func(f *pooltest.VirtualFake, err error) {
			f.FailReserve = func(uint64) error { return err }
		}, false, false, oom},
		{"address range", func(f *pooltest.VirtualFake, err error) {
			f.FailReserveAddress = func(uint64) error { return err }
		}, false, true, errInjected},
		{"address range, out of memory", func(f *pooltest.VirtualFake, err error) {
			f.FailReserveAddress = func(uint64) error { return err }
		}, false, false, oom},
		{"host granule", func(f *pooltest.VirtualFake, err error) {
			f.FailCreateHost = func(uint64) error { return err }
		}, true, true, errInjected},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := pooltest.NewVirtual(0)
			opt := virtualOptions(4 * granule)
			if c.host {
				opt = virtualOptions(granule) // the device granule is the whole quota
				opt.Oversubscribe = true
				opt.SpillTier = pool.TierPinned
				opt.HostLimit = 8 * granule
			}
			h, obs := observedVirtual(t, f, opt)
			if c.host {
				h.mustAlloc(granule)
			}
			c.inject(f, c.err)
			if _, err := h.alloc(granule); err == nil || c.counted && !errors.Is(err, errInjected) {
				t.Fatalf("allocation whose %s fails: %v, want the backing's error", c.name, err)
			}
			want := uint64(0)
			if c.counted {
				want = 1
			}
			if st := h.p.Stats(); st.BackingErrors != want || len(obs.failures) != 0 {
				t.Fatalf("after the failed %s: %d backing errors, failures told %v; want %d, none told",
					c.name, st.BackingErrors, obs.failures, want)
			}
			f.FailReserve, f.FailReserveAddress, f.FailCreateHost = nil, nil, nil
			h.mustAlloc(granule)
			h.closeVirtual()
		})
	}
}
