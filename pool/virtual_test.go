package pool_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

const granule = pooltest.Granularity

// newVirtualHarness is newHarness on a device with virtual memory. Every
// unmap is checked against the model: no live block and no freed block that
// queued work may still use lies under an unmapped granule, so a granule
// remapped elsewhere is never reused before its work completed.
func newVirtualHarness(t testing.TB, f *pooltest.VirtualFake, opt pool.Options) *harness {
	t.Helper()
	p, err := pool.New(f, opt)
	if err != nil {
		t.Fatalf("pool.New: %v", err)
	}
	h := &harness{t: t, f: f.Fake, p: p, opt: opt, live: make(map[uint64]uint64), vmm: f}
	f.OnUnmap = h.checkUnmap
	return h
}

func (h *harness) checkUnmap(va, size uint64) {
	h.t.Helper()
	for base, n := range h.live {
		if base < va+size && va < base+n {
			h.unmappedLive = append(h.unmappedLive, base)
		}
	}
	for _, d := range h.dirty {
		if d.lo < va+size && va < d.hi && !h.f.SafeSince(d.at, d.stream, d.anyStream) {
			h.t.Fatalf("unmap of [%#x,%#x) under [%#x,%#x) freed at %d (stream %d, any %v) before the free completed",
				va, va+size, d.lo, d.hi, d.at, d.stream, d.anyStream)
		}
	}
}

// checkVirtualRefusal: with virtual memory a request needs whole granules
// wherever it is placed, so it may be refused only when the quota left cannot
// hold the granules it covers at a granule boundary.
func (h *harness) checkVirtualRefusal(size uint64) {
	h.t.Helper()
	st := h.p.Stats()
	need := (alignUp(size) + granule - 1) &^ (granule - 1)
	if st.ReservedBytes <= h.opt.Quota && (h.opt.Quota-st.ReservedBytes)&^(granule-1) >= need {
		h.t.Fatalf("refused %d bytes with only %d of %d reserved", size, st.ReservedBytes, h.opt.Quota)
	}
}

// checkPhysical compares the pool's granules with the device's ground truth
// and checks that no block still live lost its memory.
func (h *harness) checkPhysical() {
	h.t.Helper()
	for _, base := range h.unmappedLive {
		if n, ok := h.live[base]; ok {
			h.t.Fatalf("granule unmapped under live [%#x,%#x)", base, base+n)
		}
	}
	h.unmappedLive = h.unmappedLive[:0]
	st := h.p.Stats()
	if got := h.vmm.PhysicalBytes(); st.Granules*granule != got {
		h.t.Fatalf("pool holds %d granules, device has %d physical bytes", st.Granules, got)
	}
	if st.ReservedBytes < st.Granules*granule {
		h.t.Fatalf("reserved %d bytes, below %d granules", st.ReservedBytes, st.Granules)
	}
	if st.CachedBytes > st.ReservedBytes {
		h.t.Fatalf("%d bytes cached, more than the %d reserved: host memory counted as the device's", st.CachedBytes, st.ReservedBytes)
	}
}

func (h *harness) closeVirtual() {
	h.t.Helper()
	h.vmm.OnUnmap = nil // Close releases live blocks too
	h.close()
}

// checkVirtualClosed fails if the device still holds an address range, a
// mapping or physical memory, device or host, after Close.
func (h *harness) checkVirtualClosed() {
	h.t.Helper()
	if n, m, ph := h.vmm.AddressRanges(), h.vmm.MappedBytes(), h.vmm.PhysicalHandles(); n != 0 || m != 0 || ph != 0 {
		h.t.Fatalf("after Close: %d address ranges, %d mapped bytes, %d physical allocations (device or host) left", n, m, ph)
	}
}

// closeEither closes the pool, with closeVirtual's checks on a virtual one.
func (h *harness) closeEither() {
	h.t.Helper()
	if h.vmm != nil {
		h.closeVirtual()
	} else {
		h.close()
	}
}

func virtualOptions(quota uint64) pool.Options {
	opt := pool.DefaultOptions(quota)
	opt.ReleaseThreshold = 0
	return opt
}

// TestVirtualStitching: blocks freed apart from each other serve one larger
// request by mapping their granules behind a new address range, where fixed
// segments, each still holding live blocks, cannot.
func TestVirtualStitching(t *testing.T) {
	for _, virtual := range []bool{true, false} {
		f := pooltest.NewVirtual(0)
		opt := virtualOptions(1 * giB)
		opt.ReleaseThreshold = opt.Quota
		opt.VirtualMemory = virtual
		h := newVirtualHarness(t, f, opt)
		var blocks []uint64
		for range 255 { // 1020 MiB: 51 medium segments of 20 MiB
			blocks = append(blocks, h.mustAlloc(4*miB))
		}
		for i := 0; i < len(blocks); i += 2 {
			h.mustFree(blocks[i])
		}
		h.appSync()
		_, err := h.alloc(8 * miB)
		if !virtual {
			if !errors.Is(err, pool.ErrQuota) {
				t.Fatalf("fixed segments: 8 MiB in two 4 MiB holes gave %v, want a refusal", err)
			}
			if vc := f.VirtualCounts(); vc.Maps != 0 {
				t.Fatalf("virtual memory off, yet %d maps", vc.Maps)
			}
			h.closeVirtual()
			continue
		}
		if err != nil {
			t.Fatalf("8 MiB from two freed 4 MiB blocks: %v", err)
		}
		h.checkPhysical()
		if got := f.PhysicalBytes(); got != 1020*miB {
			t.Fatalf("%d physical bytes, want 1020 MiB", got)
		}
		// The last 4 MiB block was freed: the new block starts there, on its
		// two idle granules, and takes two more from the other holes.
		if st, vc := h.p.Stats(), f.VirtualCounts(); st.GranuleUnmaps != 2 || vc.Creates != 510 {
			t.Fatalf("%d granules remapped and %d created, want 2 and 510", st.GranuleUnmaps, vc.Creates)
		}
		h.closeVirtual()
	}
}

// TestVirtualPreferMapped: a request whose own class would map a granule
// takes free bytes of a granule already mapped, in another class's arena.
func TestVirtualPreferMapped(t *testing.T) {
	f := pooltest.NewVirtual(0)
	h := newVirtualHarness(t, f, virtualOptions(64*miB))
	small := h.mustAlloc(256 << 10) // its granule keeps 1.75 MiB free
	h.mustAlloc(3 * miB)            // the medium arena: its second granule keeps 1 MiB free
	// The medium arena's free block would map a third granule under 1.5 MiB.
	medium := h.mustAlloc(1536 << 10)
	if small/granule != medium/granule {
		t.Fatalf("1.5 MiB at %#x, 256 KiB at %#x: want both on one granule", medium, small)
	}
	if got := f.PhysicalBytes(); got != 3*granule {
		t.Fatalf("%d physical bytes, want 3 granules", got)
	}
	// No free block lies on fewer unmapped granules than the class's own.
	other := h.mustAlloc(1536 << 10)
	if other/granule == small/granule {
		t.Fatalf("a second 1.5 MiB at %#x, on the granule of the first", other)
	}
	if got := f.PhysicalBytes(); got != 4*granule {
		t.Fatalf("%d physical bytes, want 4 granules", got)
	}
	h.checkPhysical()
	h.closeVirtual()
}

// TestVirtualBlockOnGranuleBoundary: a block that must take an unused
// granule starts on it rather than at the start of its free block, so that
// once freed it leaves that granule unused, while the bytes it skipped stay
// free on the granule in use before it.
func TestVirtualBlockOnGranuleBoundary(t *testing.T) {
	f := pooltest.NewVirtual(0)
	h := newVirtualHarness(t, f, virtualOptions(64*miB))
	first := h.mustAlloc(1536 << 10) // the medium arena's first granule keeps 0.5 MiB free
	if first%granule != 0 {
		t.Fatalf("1.5 MiB at %#x, want the start of an arena", first)
	}
	whole := h.mustAlloc(2 * miB)
	if whole != first+granule {
		t.Fatalf("2 MiB at %#x, want %#x: on one granule, not across two", whole, first+granule)
	}
	h.mustAlloc(1536 << 10) // after it, on a granule of its own
	h.mustFree(whole)
	h.appSync()
	// Its granule goes back (release threshold 0); on two granules it would
	// have kept the one the last block shares with it.
	if got := f.PhysicalBytes(); got != 2*granule {
		t.Fatalf("%d physical bytes under 3 MiB live, want 2 granules", got)
	}
	h.checkPhysical()
	h.closeVirtual()
}

// TestVirtualPendingGranules: a granule freed by Free stays mapped until a
// synchronization, and a granule freed on a stream until the stream's work is
// known complete, even when the quota needs it elsewhere.
func TestVirtualPendingGranules(t *testing.T) {
	f := pooltest.NewVirtual(0)
	h := newVirtualHarness(t, f, virtualOptions(4*miB))
	a := h.mustAlloc(4 * miB)
	h.mustFree(a)
	syncs := f.Counts().Syncs
	if _, err := h.allocAsync(4*miB, 1); err != nil {
		t.Fatal(err)
	}
	if f.Counts().Syncs != syncs+1 {
		t.Fatalf("the pool reused a pending granule without synchronizing")
	}
	h.closeVirtual()

	f = pooltest.NewVirtual(0)
	h = newVirtualHarness(t, f, virtualOptions(4*miB))
	a, err := h.allocAsync(3*miB, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.freeAsync(a, 1); err != nil {
		t.Fatal(err)
	}
	// Another stream needs the granules: they are handed over only after a
	// synchronization (checked by the harness at every unmap and reuse).
	if _, err := h.allocAsync(4*miB, 2); err != nil {
		t.Fatal(err)
	}
	h.checkPhysical()
	h.closeVirtual()
}

// TestVirtualReleaseThreshold: with a threshold of 0 the granules of freed
// blocks go back to the device once the frees complete, and only the granules
// under live blocks stay.
func TestVirtualReleaseThreshold(t *testing.T) {
	f := pooltest.NewVirtual(0)
	h := newVirtualHarness(t, f, virtualOptions(64*miB))
	keep := h.mustAlloc(1 * miB)
	var ptrs []uint64
	for range 5 {
		ptrs = append(ptrs, h.mustAlloc(3*miB))
	}
	for _, p := range ptrs {
		h.mustFree(p)
	}
	// 16 MiB in eight granules: the first 3 MiB block follows the MiB on
	// its granule, in the small class's arena, rather than map two new ones
	// in the medium class's.
	if got := f.PhysicalBytes(); got != 8*granule {
		t.Fatalf("%d physical bytes before the synchronization, want 8 granules", got)
	}
	h.appSync()
	h.checkPhysical()
	if got := f.PhysicalBytes(); got != granule {
		t.Fatalf("%d physical bytes after it, want one granule under the live MiB", got)
	}
	h.mustFree(keep)
	h.appSync()
	if got := f.PhysicalBytes(); got != 0 {
		t.Fatalf("%d physical bytes with nothing live", got)
	}
	h.closeVirtual()
}

// TestVirtualOff: Options.VirtualMemory false keeps fixed segments over a
// backing with virtual memory.
func TestVirtualOff(t *testing.T) {
	f := pooltest.NewVirtual(0)
	opt := virtualOptions(64 * miB)
	opt.VirtualMemory = false
	h := newVirtualHarness(t, f, opt)
	h.mustFree(h.mustAlloc(5 * miB))
	if c, vc := f.Counts(), f.VirtualCounts(); c.Reserves != 1 || vc != (pooltest.VirtualCounts{}) {
		t.Fatalf("counts %+v and %+v, want one fixed segment and no virtual memory", c, vc)
	}
	h.closeVirtual()
}

// TestVirtualDeviceFull: a device out of memory below the quota refuses with
// its own error, counts the refusal, gives back to the device the granules
// it mapped trying (the GPU's other processes need them more than a request
// that failed) and leaves the accounting exact.
func TestVirtualDeviceFull(t *testing.T) {
	f := pooltest.NewVirtual(10 * miB)
	opt := pool.DefaultOptions(64 * miB) // its release threshold would keep the granules mapped trying
	h := newVirtualHarness(t, f, opt)
	h.mustAlloc(5 * miB)
	_, err := h.alloc(8 * miB)
	if !errors.Is(err, pool.ErrOutOfMemory) || errors.Is(err, pool.ErrQuota) {
		t.Fatalf("allocation beyond the device: %v, want the device's out of memory", err)
	}
	if st := h.p.Stats(); st.Refused != 1 || st.ReservedBytes != 6*miB || f.PhysicalBytes() != 6*miB {
		t.Fatalf("%d refusals, %d bytes reserved, %d physical; want 1 and the three granules of the live block",
			st.Refused, st.ReservedBytes, f.PhysicalBytes())
	}
	h.checkPhysical()
	h.closeVirtual()
}

// TestVirtualDeviceFullSpills: with oversubscription, the granules a device
// out of memory below the quota cannot give (other processes hold the rest)
// are host memory behind the same range, as beyond the quota.
func TestVirtualDeviceFullSpills(t *testing.T) {
	f := pooltest.NewVirtual(6 * miB)
	opt := virtualOptions(64 * miB)
	opt.Oversubscribe = true
	h := newVirtualHarness(t, f, opt)
	h.mustAlloc(5 * miB) // three granules: the device has room for none more
	h.mustAlloc(4 * miB)
	st := h.p.Stats()
	if st.Refused != 0 || st.SpilledBytes != 2*granule || f.HostBytes() != 2*granule || st.ReservedBytes != 6*miB {
		t.Fatalf("refused %d, spilled %d, host %d, reserved %d; want nothing refused, two granules on the host and the device's 6 MiB reserved",
			st.Refused, st.SpilledBytes, f.HostBytes(), st.ReservedBytes)
	}
	h.checkPhysical()
	h.closeVirtual()
}

// TestVirtualDeviceFullSpillRefused: with oversubscription, a request the
// full device cannot hold whose spill fails too (past the host limit) gives
// back to the device the granules it mapped trying, as its refusal without
// oversubscription does.
func TestVirtualDeviceFullSpillRefused(t *testing.T) {
	f := pooltest.NewVirtual(10 * miB)
	opt := oversubscribed(64*miB, pool.TierManaged) // its release threshold would keep the granules mapped trying
	opt.HostLimit = granule
	h := newVirtualHarness(t, f, opt)
	h.mustAlloc(5 * miB)
	if _, err := h.alloc(8 * miB); !errors.Is(err, pool.ErrHostLimit) {
		t.Fatalf("allocation beyond the device and the host limit: %v, want ErrHostLimit", err)
	}
	if st := h.p.Stats(); st.Refused != 1 || st.ReservedBytes != 6*miB || f.PhysicalBytes() != 6*miB || f.HostBytes() != 0 {
		t.Fatalf("%d refusals, %d bytes reserved, %d physical, %d on the host; want 1 and the three granules of the live block",
			st.Refused, st.ReservedBytes, f.PhysicalBytes(), f.HostBytes())
	}
	h.checkPhysical()
	h.closeVirtual()
}

// TestVirtualFailedSpillCountsNothing: a request the full device cannot
// hold whose page-granular spill fails partway (past the host limit, or the
// host cannot make the memory) and whose whole-block spill fails too gives
// back every host granule it mapped trying, and counts and reports nothing
// as spilled; a spill that then succeeds counts only its own granules.
func TestVirtualFailedSpillCountsNothing(t *testing.T) {
	for _, tc := range []struct {
		name         string
		hostLimit    uint64
		hostCapacity uint64
		want         error
	}{
		{"host limit", granule, 0, pool.ErrHostLimit},
		{"host out of memory", 64 * miB, granule, pool.ErrOutOfMemory},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := pooltest.NewVirtual(10 * miB)
			f.HostCapacity = tc.hostCapacity
			opt := oversubscribed(64*miB, pool.TierManaged)
			opt.HostLimit = tc.hostLimit
			obs := &spillRanges{recorder: recorder{sources: map[pool.Source]int{}}, ranges: map[uint64]uint64{}}
			opt.Observer = obs
			h := newVirtualHarness(t, f, opt)
			h.mustAlloc(5 * miB) // three granules: the device has room for two more
			if _, err := h.alloc(8 * miB); !errors.Is(err, tc.want) || !errors.Is(err, pool.ErrDeviceFull) {
				t.Fatalf("allocation beyond the device and the host: %v, want %v and ErrDeviceFull", err, tc.want)
			}
			if st := h.p.Stats(); st.SpilledBytes != 0 || st.PeakSpilledBytes != 0 || st.SpilledTotal != 0 || len(obs.spills) != 0 {
				t.Fatalf("after a failed spill: spilled %d, peak %d, total %d, %d Spill events; want none",
					st.SpilledBytes, st.PeakSpilledBytes, st.SpilledTotal, len(obs.spills))
			}
			if n, host := f.HostBytes(), f.HostGranules(); n != 0 || len(host) != 0 {
				t.Fatalf("after a failed spill: %d host bytes, host granules %v left", n, host)
			}
			h.checkPhysical()
			h.mustAlloc(6 * miB) // two granules on the device, one on the host
			if st := h.p.Stats(); st.SpilledBytes != granule || st.PeakSpilledBytes != granule || st.SpilledTotal != granule {
				t.Fatalf("after a spill of one granule: spilled %d, peak %d, total %d; want %d each",
					st.SpilledBytes, st.PeakSpilledBytes, st.SpilledTotal, granule)
			}
			obs.check(t, f, "after the spill")
			h.closeVirtual()
		})
	}
}

// TestVirtualHostOutOfMemoryIsARefusal: with virtual memory, a request
// beyond the quota, or beyond a full device below it, whose host granules
// and whole-block spill the host cannot make is a refusal, counted and told
// to the Observer as one past the host limit is.
func TestVirtualHostOutOfMemoryIsARefusal(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity uint64 // of the device
	}{
		{"quota", 0},
		{"device full", 10 * miB},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := pooltest.NewVirtual(tc.capacity)
			f.HostCapacity = granule
			rec := &recorder{sources: map[pool.Source]int{}}
			quota := uint64(6 * miB)
			if tc.capacity != 0 {
				quota = 64 * miB
			}
			opt := oversubscribed(quota, pool.TierManaged)
			opt.HostLimit = 64 * miB
			opt.Observer = rec
			h := newVirtualHarness(t, f, opt)
			h.mustAlloc(5 * miB) // three granules
			_, err := h.alloc(12 * miB)
			if !errors.Is(err, pool.ErrOutOfMemory) || errors.Is(err, pool.ErrHostLimit) {
				t.Fatalf("host out of memory: %v, want ErrOutOfMemory, not ErrHostLimit", err)
			}
			if st := h.p.Stats(); st.Refused != 1 || rec.refusals != 1 || st.BackingErrors != 0 || f.HostBytes() != 0 {
				t.Fatalf("%d refusals counted, %d told, %d backing errors, %d host bytes left; want one refusal, nothing else",
					st.Refused, rec.refusals, st.BackingErrors, f.HostBytes())
			}
			h.checkPhysical()
			h.closeVirtual()
		})
	}
}

// FuzzPoolVirtual is FuzzPool on a device with virtual memory, checking
// besides the reference model that every unmapped granule is free of queued
// work and that the pool's granules are the device's physical memory. With
// migration on, the first word of each block mapped in granules is stamped
// and checked after each synchronization, where granules move.
func FuzzPoolVirtual(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 2, 1, 3, 0, 0, 1, 4, 5, 6})
	f.Add([]byte{0x13, 2, 0x40, 0x10, 4, 1, 2, 0x80, 0x01, 6, 2, 0x40, 0x10, 5, 3})
	f.Add([]byte{0x08, 0, 0xff, 0xff, 0, 0xff, 0x7f, 7, 0, 3, 0, 7, 1, 7, 2, 7, 3})
	f.Add([]byte{0x20, 0, 0x80, 0x16, 0, 0x80, 0x16, 3, 0, 4, 1, 0, 0x81, 0x17, 2, 0x40, 0x15, 1, 6, 1})
	f.Add([]byte{0xba, 0, 0x60, 0x16, 0, 0x60, 0x16, 0, 0x60, 0x16, 5, 0, 0x80, 0x17, 3, 3, 5, 0, 0x80, 0x17, 3, 3, 5, 5, 5})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		cfg := data[0]
		data = data[1:]
		quotas := [...]uint64{8 * miB, 20 * miB, 64 * miB, 1 * giB}
		opt := pool.DefaultOptions(quotas[cfg&3])
		opt.StrictFree = cfg&4 != 0
		opt.Oversubscribe = cfg&8 != 0
		if cfg&0x10 != 0 {
			opt.SpillTier = pool.TierPinned
		}
		if cfg&0x20 != 0 {
			opt.ReleaseThreshold = 0
		}
		if cfg&0x40 != 0 {
			opt.Reserve = opt.Quota / 4
		}
		opt.Migrate = cfg&0x80 != 0 && opt.Oversubscribe
		fake := pooltest.NewVirtual(0)
		h := newVirtualHarness(t, fake, opt)
		d := &fuzzOps{t: t, h: h, fake: fake.Fake, data: data, afterOp: h.checkPhysical}
		d.misc = func(sel byte) {
			switch sel % 3 {
			case 0:
				h.forgetStream(d.stream())
			case 1:
				if _, err := h.p.Promote(); err != nil {
					t.Fatalf("Promote: %v", err)
				}
			case 2:
				if err := h.p.Free(0x1000); !errors.Is(err, pool.ErrNotOwned) {
					t.Fatalf("foreign free: %v", err)
				}
			}
		}
		if opt.Migrate {
			stamped := map[uint64]bool{} // blocks whose first word holds their address
			d.allocated = func(p uint64) {
				if fake.Write(p, p) == nil {
					stamped[p] = true
				}
			}
			d.released = func(p uint64) { delete(stamped, p) }
			d.synced = func() {
				for p := range stamped {
					if v, err := fake.Read(p); err != nil || v != p {
						t.Fatalf("block %#x holds %#x (%v) after a synchronization", p, v, err)
					}
				}
			}
		}
		d.run()
		d.settle()
		h.closeVirtual()
	})
}

// TestVirtualConcurrent allocates and frees from many goroutines over virtual
// memory under a quota the peak exceeds, then checks the device's ground
// truth. Run it with -race.
func TestVirtualConcurrent(t *testing.T) {
	for _, migrate := range []bool{false, true} {
		t.Run(fmt.Sprintf("migrate=%v", migrate), func(t *testing.T) { testVirtualConcurrent(t, migrate) })
	}
}

// testVirtualConcurrent is TestVirtualConcurrent, with migration on or off;
// with it, the workers also announce synchronizations now and then.
func testVirtualConcurrent(t *testing.T, migrate bool) {
	f := pooltest.NewVirtual(0)
	opt := pool.DefaultOptions(64 * miB)
	opt.Oversubscribe = true
	opt.HostLimit = giB
	opt.Migrate = migrate
	p, err := pool.New(f, opt)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			s := pool.Stream(w % 3)
			var mine []uint64
			for range 1000 {
				if len(mine) > 0 && rng.IntN(2) == 0 {
					i := rng.IntN(len(mine))
					var err error
					if rng.IntN(2) == 0 {
						err = p.Free(mine[i])
					} else {
						err = p.FreeAsync(mine[i], s)
					}
					if err != nil {
						t.Error(err)
						return
					}
					mine[i] = mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					continue
				}
				ptr, err := p.AllocAsync(uint64(1+rng.IntN(6*miB)), s)
				if err != nil {
					t.Error(err)
					return
				}
				mine = append(mine, ptr)
				if rng.IntN(50) == 0 {
					f.Complete(s)
				}
				if migrate && rng.IntN(100) == 0 {
					ticket := p.SyncBegin()
					if err := f.Synchronize(); err != nil {
						t.Error(err)
						return
					}
					if err := p.SyncEnd(ticket); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	st := p.Stats()
	if st.ReservedBytes != f.DeviceBytes() || st.Granules*granule != f.PhysicalBytes() || st.ReservedBytes > opt.Quota {
		t.Fatalf("pool %+v, device %d bytes, %d physical", st, f.DeviceBytes(), f.PhysicalBytes())
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if f.DeviceBytes() != 0 || f.HostBytes() != 0 || f.AddressRanges() != 0 {
		t.Fatalf("after Close: %d device, %d host bytes, %d ranges", f.DeviceBytes(), f.HostBytes(), f.AddressRanges())
	}
}

// TestVirtualPageSpill: with oversubscription, the granules of a block that
// the quota cannot hold are host memory mapped behind the same range, and go
// back to the host as soon as the block's free completes.
func TestVirtualPageSpill(t *testing.T) {
	f := pooltest.NewVirtual(0)
	opt := virtualOptions(8 * miB)
	opt.Oversubscribe = true
	opt.HostLimit = 64 * miB
	h := newVirtualHarness(t, f, opt)
	keep := h.mustAlloc(6 * miB)
	ptr := h.mustAlloc(5 * miB) // three granules: one on the device, two on the host
	if a, _ := h.p.Lookup(ptr); a.Tier != pool.TierDevice {
		t.Fatalf("a partly spilled block has tier %v, want one range on the device", a.Tier)
	}
	st := h.p.Stats()
	if st.ReservedBytes != 8*miB || st.SpilledBytes != 2*granule || f.HostBytes() != 2*granule {
		t.Fatalf("reserved %d, spilled %d, host %d; want 8 MiB and two granules", st.ReservedBytes, st.SpilledBytes, f.HostBytes())
	}
	if st.CachedBytes != 0 {
		t.Fatalf("%d bytes cached, want none: the MiB left in the last host granule is host memory", st.CachedBytes)
	}
	if vc := f.VirtualCounts(); vc.HostCreates != 2 {
		t.Fatalf("%d host granules created, want 2", vc.HostCreates)
	}
	h.mustFree(ptr)
	if f.HostBytes() != 2*granule {
		t.Fatalf("host granules released before the free completed")
	}
	h.appSync()
	if st := h.p.Stats(); f.HostBytes() != 0 || st.SpilledBytes != 0 {
		t.Fatalf("%d host bytes (%d spilled) after the free completed, want 0", f.HostBytes(), st.SpilledBytes)
	}
	// The device granule it had is reused; the host ones are not needed.
	h.mustFree(keep)
	h.appSync()
	h.mustAlloc(8 * miB)
	if f.HostBytes() != 0 {
		t.Fatalf("spilled with the quota free")
	}
	h.closeVirtual()
}

// TestVirtualDeviceBeforeHost: a request the index would place on a host
// granule takes a free block on a device granule instead, where one lies
// among those it looks at.
func TestVirtualDeviceBeforeHost(t *testing.T) {
	f := pooltest.NewVirtual(0)
	opt := virtualOptions(8 * miB)
	opt.Oversubscribe = true
	h := newVirtualHarness(t, f, opt)
	var onDevice []uint64
	for range 8 {
		onDevice = append(onDevice, h.mustAlloc(1*miB))
	}
	spilled := h.mustAlloc(1 * miB)
	h.mustAlloc(1 * miB)
	if f.HostBytes() != granule {
		t.Fatalf("%d host bytes, want the two spilled MiB on one granule", f.HostBytes())
	}
	// Freed last, the host MiB heads its class's free list.
	h.mustFree(onDevice[2])
	h.mustFree(spilled)
	h.appSync()
	if got := h.mustAlloc(1 * miB); got != onDevice[2] {
		t.Fatalf("1 MiB at %#x, want the free MiB on the device at %#x, not the one on the host at %#x", got, onDevice[2], spilled)
	}
	h.checkPhysical()
	h.closeVirtual()
}

// TestVirtualArenas: a request of another class is served by the free parts
// of granules that still hold live blocks rather than new granules; one
// refused under quota pressure, which tried a second arena of its class,
// leaves no address range behind.
func TestVirtualArenas(t *testing.T) {
	f := pooltest.NewVirtual(0)
	h := newVirtualHarness(t, f, virtualOptions(8*miB))
	var small []uint64
	for range 8 {
		small = append(small, h.mustAlloc(1*miB))
	}
	// Every granule still holds a live MiB after these frees; two free
	// ranges of 2 MiB straddle two granules each.
	for _, i := range []int{1, 2, 5, 6} {
		h.mustFree(small[i])
	}
	h.appSync()
	ranges := f.AddressRanges()
	holes := map[uint64]bool{small[1]: true, small[5]: true}
	for range holes {
		if got := h.mustAlloc(1*miB + 512); !holes[got] {
			t.Fatalf("a medium request at %#x, want one of the free ranges at %#x and %#x", got, small[1], small[5])
		}
	}
	if vc := f.VirtualCounts(); vc.Creates != 4 {
		t.Fatalf("%d granules created, want the 4 the small blocks have", vc.Creates)
	}
	for range 3 {
		if _, err := h.alloc(1*miB + 512); !errors.Is(err, pool.ErrQuota) {
			t.Fatalf("a medium request with every granule in use: %v", err)
		}
	}
	// The medium class's first arena stays; the pressure arenas are freed.
	if got := f.AddressRanges(); got != ranges+1 {
		t.Fatalf("%d address ranges after refusals, want %d", got, ranges+1)
	}
	if vc := f.VirtualCounts(); vc.AddressFrees != vc.AddressReserves-ranges-1 {
		t.Fatalf("%d ranges reserved, %d freed", vc.AddressReserves, vc.AddressFrees)
	}
	h.closeVirtual()
}

// TestVirtualSyncBeforeNewGranule: a placement on one idle and one unmapped
// granule needs new memory when no other granule is idle, so the pool
// synchronizes for the pending bytes that can serve it instead of creating a
// granule.
func TestVirtualSyncBeforeNewGranule(t *testing.T) {
	f := pooltest.NewVirtual(0)
	h := newVirtualHarness(t, f, pool.DefaultOptions(1*giB))
	e := h.mustAlloc(4 * miB) // granules 0 and 1
	a := h.mustAlloc(2 * miB) // granule 2
	h.mustFree(a)
	h.appSync() // granule 2 idle
	h.mustFree(e)
	syncs := f.Counts().Syncs
	h.mustAlloc(4 * miB)
	if got := f.PhysicalBytes(); got != 3*granule || f.Counts().Syncs != syncs+1 {
		t.Fatalf("%d physical bytes after %d synchronizations, want 3 granules after one", got, f.Counts().Syncs-syncs)
	}
	h.closeVirtual()
}

// TestVirtualSyncForFewerPendingBytes: the pool synchronizes before creating
// a granule even when the pending bytes are fewer than the request: the
// granule they free serves part of it.
func TestVirtualSyncForFewerPendingBytes(t *testing.T) {
	f := pooltest.NewVirtual(0)
	h := newVirtualHarness(t, f, pool.DefaultOptions(1*giB))
	a := h.mustAlloc(2 * miB) // granule 0
	h.mustAlloc(2 * miB)      // granule 1
	h.mustFree(a)             // 2 MiB pending
	syncs := f.Counts().Syncs
	h.mustAlloc(3 * miB) // granules 2 and 3: granule 0's memory and one new
	if got := f.PhysicalBytes(); got != 3*granule || f.Counts().Syncs != syncs+1 {
		t.Fatalf("%d physical bytes after %d synchronizations, want 3 granules after one", got, f.Counts().Syncs-syncs)
	}
	h.checkPhysical()
	h.closeVirtual()
}

// TestVirtualSyncBeforeFewGranulesLeft: near the quota, a placement that
// free and idle granules could serve but that would leave few granules
// within reach synchronizes first when a free is pending: the pending
// block, once free, serves the request where its memory is mapped, and the
// idle granules stay for later. With the quota far, the same placement
// takes the idle granules without waiting for the device.
func TestVirtualSyncBeforeFewGranulesLeft(t *testing.T) {
	for _, quota := range []uint64{12 * granule, 1 * giB} {
		f := pooltest.NewVirtual(0)
		opt := pool.DefaultOptions(quota)
		opt.ReleaseThreshold = quota // idle granules stay mapped
		h := newVirtualHarness(t, f, opt)
		var holes []uint64
		for range 2 { // granules 0 to 3: two 2 MiB blocks, each before one that stays
			holes = append(holes, h.mustAlloc(2*miB))
			h.mustAlloc(2 * miB)
		}
		pending := h.mustAlloc(4 * miB) // granules 4 and 5
		for _, a := range holes {
			h.mustFree(a)
		}
		h.appSync() // granules 0 and 2 idle: too small apart for 4 MiB
		h.mustFree(pending)
		syncs, maps := f.Counts().Syncs, f.VirtualCounts().Maps
		got := h.mustAlloc(4 * miB)
		wantSyncs, wantMaps := 1, 0
		if near := quota < 1*giB; near && got != pending {
			t.Fatalf("quota %d: 4 MiB at %#x, want them at %#x, the pending block's mapped granules", quota, got, pending)
		} else if !near {
			wantSyncs, wantMaps = 0, 2 // the idle granules, mapped under the new block
		}
		if f.Counts().Syncs-syncs != wantSyncs || f.VirtualCounts().Maps-maps != wantMaps {
			t.Fatalf("quota %d: %d synchronizations and %d granules mapped, want %d and %d",
				quota, f.Counts().Syncs-syncs, f.VirtualCounts().Maps-maps, wantSyncs, wantMaps)
		}
		h.checkPhysical()
		h.closeVirtual()
	}
}

// TestVirtualStreamCaptureGrowsOrRefusesInstead: with virtual memory too,
// a synchronization the Backing refuses for stream capture is tried once per
// request; the block is placed on new granules, or refused for the quota, as
// if nothing were pending, and no error of the capture reaches the caller.
func TestVirtualStreamCaptureGrowsOrRefusesInstead(t *testing.T) {
	f := pooltest.NewVirtual(0)
	syncs := 0
	f.FailSynchronize = func() error { syncs++; return pool.ErrStreamCapture }
	h := newVirtualHarness(t, f, virtualOptions(8*miB))
	a := h.mustAlloc(4 * miB)
	h.mustFree(a)
	b := h.mustAlloc(4 * miB) // the pending block could serve it: new granules instead
	if syncs != 1 || b == a {
		t.Fatalf("%d synchronizations tried, got %#x (freed %#x)", syncs, b, a)
	}
	if _, err := h.alloc(4 * miB); !errors.Is(err, pool.ErrQuota) || errors.Is(err, pool.ErrStreamCapture) {
		t.Fatalf("at the quota under capture: %v, want a quota refusal", err)
	}
	if syncs != 2 {
		t.Fatalf("%d synchronizations tried, want one per request", syncs)
	}
	f.FailSynchronize = nil
	h.appSync()
	h.mustAlloc(4 * miB) // the freed block, now reusable
	h.checkPhysical()
	h.closeVirtual()
}

// TestVirtualStreamCaptureLooksAgain: a synchronization refused for stream
// capture released the lock while it was tried, so the cached block found
// before it may have been handed out meanwhile; the placement looks again
// instead of handing it out twice.
func TestVirtualStreamCaptureLooksAgain(t *testing.T) {
	f := pooltest.NewVirtual(0)
	h := newVirtualHarness(t, f, pool.DefaultOptions(1*giB))
	a := h.mustAlloc(2 * miB) // granule 0
	b := h.mustAlloc(2 * miB) // granule 1
	h.mustFree(b)
	h.appSync() // b's granule, mapped and idle, heads the arena's free rest
	h.mustFree(a)
	var taken uint64
	f.FailSynchronize = func() error {
		if taken == 0 { // another thread, served from the mapped granule
			taken = h.mustAlloc(2 * miB)
		}
		return pool.ErrStreamCapture
	}
	c := h.mustAlloc(4 * miB) // misses the mapped granule alone: synchronizes
	if taken == 0 {
		t.Fatal("no synchronization was tried")
	}
	if c < taken+2*miB && taken < c+4*miB {
		t.Fatalf("[%#x, +4MiB) handed out over [%#x, +2MiB), handed out while the lock was released", c, taken)
	}
	f.FailSynchronize = nil
	h.checkPhysical()
	h.closeVirtual()
}

// spillRanges is an Observer that keeps the spilled ranges as spillway
// trace's probes do: a Spill adds its range under its address; a Promote,
// or a Free of host memory (a block in device memory ends no range), at
// that address removes it.
type spillRanges struct {
	recorder
	ranges map[uint64]uint64
	spills []uint64 // sizes of the Spill events, in order
	bad    []string
	// failures are the Backing failures told (pool.FailureObserver).
	failures []error
}

func (s *spillRanges) BackingFailed(err error) { s.failures = append(s.failures, err) }

func (s *spillRanges) Spill(ptr, size uint64, tier pool.Tier) {
	s.recorder.Spill(ptr, size, tier)
	if _, ok := s.ranges[ptr]; ok || size == 0 || tier != pool.TierPinned {
		s.bad = append(s.bad, fmt.Sprintf("Spill(%#x, %d, %v) over a known range or empty", ptr, size, tier))
	}
	s.ranges[ptr] = size
	s.spills = append(s.spills, size)
}

func (s *spillRanges) Free(ptr, size uint64, tier pool.Tier) {
	s.recorder.Free(ptr, size, tier)
	if tier != pool.TierDevice {
		delete(s.ranges, ptr)
	}
}

func (s *spillRanges) Promote(ptr, size uint64, tier pool.Tier) {
	s.recorder.Promote(ptr, size, tier)
	delete(s.ranges, ptr)
}

// check fails unless the known ranges are exactly the granules mapped to
// host memory, each in one range.
func (s *spillRanges) check(t *testing.T, f *pooltest.VirtualFake, when string) {
	t.Helper()
	host := f.HostGranules()
	if covered := s.checkWithin(t, f, when); covered != len(host) {
		t.Fatalf("%s: host granules %v, ranges reported %v", when, host, s.ranges)
	}
}

// checkWithin fails unless every known range lies on host granules, each
// granule in one range at most (no device memory is called spilled), and
// returns how many granules they cover.
func (s *spillRanges) checkWithin(t *testing.T, f *pooltest.VirtualFake, when string) int {
	t.Helper()
	host := f.HostGranules()
	covered := map[uint64]bool{}
	for base, size := range s.ranges {
		for g := base; g < base+size; g += granule {
			if !host[g] || covered[g] {
				t.Fatalf("%s: range [%#x, +%d) reported spilled, but the granule at %#x is not (host granules %v)", when, base, size, g, host)
			}
			covered[g] = true
		}
	}
	if len(s.bad) > 0 {
		t.Fatalf("%s: %v", when, s.bad)
	}
	return len(covered)
}

// TestVirtualPageSpillEvents: the Observer hears of a page-granular spill as
// the ranges of the host granules themselves, one Spill per contiguous run,
// and of their return by a Free of the same range, so that a tracer's
// spilled ranges are at every moment exactly the host granules.
func TestVirtualPageSpillEvents(t *testing.T) {
	f := pooltest.NewVirtual(0)
	opt := virtualOptions(8 * miB)
	opt.Oversubscribe = true
	opt.HostLimit = 64 * miB
	obs := &spillRanges{recorder: recorder{sources: map[pool.Source]int{}}, ranges: map[uint64]uint64{}}
	opt.Observer = obs
	h := newVirtualHarness(t, f, opt)
	keep := h.mustAlloc(6 * miB)
	// Three granules: the first on the device, then one host granule of its
	// own and one it shares with what follows it.
	big := h.mustAlloc(9 * miB / 2)
	obs.check(t, f, "after the spill")
	if len(obs.spills) != 2 || obs.spills[0] != granule || obs.spills[1] != granule {
		t.Fatalf("spills of %v bytes, want two runs of one granule (the shared one on its own)", obs.spills)
	}
	if _, ok := obs.ranges[big]; ok {
		t.Fatalf("a range reported at the block's start %#x, which is on the device", big)
	}
	tail := h.mustAlloc(5 * miB / 4) // medium: the free part of the last host granule
	h.mustFree(big)
	h.appSync()
	obs.check(t, f, "after the spilled block's free")
	h.mustFree(tail)
	h.appSync()
	obs.check(t, f, "after every free")
	if len(obs.ranges) != 0 || len(f.HostGranules()) != 0 {
		t.Fatalf("ranges %v and host granules %v left", obs.ranges, f.HostGranules())
	}
	h.mustFree(keep)

	// A random oversubscribed churn keeps the invariant after every call.
	rng := rand.New(rand.NewPCG(1, 2))
	var live []uint64
	for i := range 400 {
		if len(live) > 0 && rng.IntN(3) == 0 {
			j := rng.IntN(len(live))
			h.mustFree(live[j])
			live = slices.Delete(live, j, j+1)
		} else if p, err := h.alloc(uint64(rng.IntN(6*miB)) + 1); err == nil {
			live = append(live, p)
		}
		if i%7 == 0 {
			h.appSync()
		}
		obs.check(t, f, fmt.Sprintf("churn step %d", i))
	}
	if len(obs.spills) < 10 {
		t.Fatalf("the churn spilled nothing: %+v", obs.recorder)
	}
	for _, p := range live {
		h.mustFree(p)
	}
	h.appSync()
	obs.check(t, f, "after the churn")
	h.closeVirtual()
	obs.check(t, f, "after Close")
}

// TestVirtualReserveBeforeNewGranules: a free block of the static reserve,
// which needs no granule, serves a request whose own class would map one,
// and under quota pressure it is served there rather than refused.
func TestVirtualReserveBeforeNewGranules(t *testing.T) {
	for _, quota := range []uint64{2 * granule, 64 * granule} {
		t.Run(fmt.Sprintf("quota=%d", quota), func(t *testing.T) {
			f := pooltest.NewVirtual(0)
			opt := virtualOptions(quota)
			opt.Reserve = granule
			h := newVirtualHarness(t, f, opt)
			a := h.mustAlloc(1 * miB) // the reserve
			h.mustAlloc(1 * miB)      // the reserve, now full
			h.mustAlloc(1 * miB)      // the small class's first granule
			h.mustAlloc(1 * miB)
			h.mustFree(a)
			h.appSync()
			physical := f.PhysicalBytes()
			got, err := h.alloc(1 * miB)
			if err != nil {
				t.Fatalf("1 MiB refused with a free MiB in the reserve at %#x: %v", a, err)
			}
			if got != a || f.PhysicalBytes() != physical {
				t.Fatalf("1 MiB at %#x with %d physical bytes, want the reserve's free MiB at %#x and %d", got, f.PhysicalBytes(), a, physical)
			}
			h.closeVirtual()
		})
	}
}

// TestVirtualIdleGranulesTakenBack: a block handed out again on idle
// granules takes them off the idle list, so a later request short of memory
// never unmaps them from under it.
func TestVirtualIdleGranulesTakenBack(t *testing.T) {
	f := pooltest.NewVirtual(0)
	opt := virtualOptions(2 * granule)
	opt.ReleaseThreshold = opt.Quota // freed granules stay mapped, idle
	h := newVirtualHarness(t, f, opt)
	a := h.mustAlloc(2 * granule)
	h.mustFree(a)
	h.appSync()
	if b := h.mustAlloc(2 * granule); b != a {
		t.Fatalf("two granules at %#x, want them at %#x, where they are mapped", b, a)
	}
	if _, err := h.alloc(granule); !errors.Is(err, pool.ErrQuota) {
		t.Fatalf("a granule more than the quota: %v", err)
	}
	if !f.Mapped(a, a+2*granule) {
		t.Fatalf("the live block at %#x lost its memory", a)
	}
	if st := h.p.Stats(); st.CachedBytes != 0 {
		t.Fatalf("%d bytes cached with every granule in use", st.CachedBytes)
	}
	h.closeVirtual()
}

// TestVirtualFailedGranuleGivesBackItsQuota: a granule the device fails to
// create, for lack of memory or otherwise, gives its bytes back to the
// ledger, so the whole quota is still there once the device recovers.
func TestVirtualFailedGranuleGivesBackItsQuota(t *testing.T) {
	f := pooltest.NewVirtual(2 * granule)
	h := newVirtualHarness(t, f, virtualOptions(4*granule))
	for range 3 {
		if _, err := h.alloc(3 * granule); !errors.Is(err, pool.ErrOutOfMemory) {
			t.Fatalf("three granules on a device of two: %v", err)
		}
	}
	f.FailReserve = func(uint64) error { return errors.New("injected creation failure") }
	if _, err := h.alloc(granule); err == nil {
		t.Fatal("allocation succeeded with every granule creation failing")
	}
	f.FailReserve = nil
	f.Capacity = 0
	h.mustAlloc(4 * granule)
	h.closeVirtual()
}

// TestVirtualArenaSize: an arena reserves twice the quota, at least 1 GiB
// and at most 64 GiB, and a class's last arena stays when it empties.
func TestVirtualArenaSize(t *testing.T) {
	for _, c := range []struct{ quota, arena uint64 }{
		{64 * miB, 1 * giB}, {1 * giB, 2 * giB}, {48 * giB, 64 * giB},
	} {
		f := pooltest.NewVirtual(0)
		h := newVirtualHarness(t, f, virtualOptions(c.quota))
		a := h.mustAlloc(1 * miB)
		if got := h.p.Stats().LargestFreeBlock; got != c.arena-1*miB {
			t.Fatalf("quota %d: %d bytes of free address space after 1 MiB, want an arena of %d", c.quota, got, c.arena)
		}
		h.mustFree(a)
		h.appSync()
		h.mustAlloc(1 * miB)
		if vc := f.VirtualCounts(); vc.AddressReserves != 1 || vc.AddressFrees != 0 {
			t.Fatalf("quota %d: %d address ranges reserved and %d freed, want the one arena kept", c.quota, vc.AddressReserves, vc.AddressFrees)
		}
		h.closeVirtual()
	}
}
