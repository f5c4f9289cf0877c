package pool_test

import (
	"errors"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

// migrateHarness is a pool of 8 granules with migration on, observed as a
// tracer does.
func migrateHarness(t *testing.T) (*harness, *pooltest.VirtualFake, *spillRanges) {
	f := pooltest.NewVirtual(0)
	opt := virtualOptions(8 * granule)
	opt.Oversubscribe = true
	opt.SpillTier = pool.TierPinned
	opt.HostLimit = 64 * granule
	opt.Migrate = true
	obs := &spillRanges{recorder: recorder{sources: map[pool.Source]int{}}, ranges: map[uint64]uint64{}}
	opt.Observer = obs
	return newVirtualHarness(t, f, opt), f, obs
}

// stamp writes a distinct value at the start of every granule of the
// blocks and returns them by address.
func stamp(t *testing.T, f *pooltest.VirtualFake, blocks map[uint64]uint64) map[uint64]uint64 {
	t.Helper()
	want := map[uint64]uint64{}
	for base, size := range blocks {
		for va := base; va < base+size; va += granule {
			want[va] = va ^ 0x5a5a
			if err := f.Write(va, want[va]); err != nil {
				t.Fatal(err)
			}
		}
	}
	return want
}

// oldStampedBlocks allocates three blocks of two granules, stamps them,
// and ends their synchronization interval: blocks a later interval did not
// hand out on, the coldest. It returns them by address, and their stamps.
func oldStampedBlocks(t *testing.T, h *harness, f *pooltest.VirtualFake) (old, want map[uint64]uint64) {
	t.Helper()
	old = map[uint64]uint64{}
	for range 3 {
		old[h.mustAlloc(2*granule)] = 2 * granule
	}
	want = stamp(t, f, old)
	h.appSync()
	return old, want
}

func checkStamps(t *testing.T, f *pooltest.VirtualFake, want map[uint64]uint64, when string) {
	t.Helper()
	for va, v := range want {
		if got, err := f.Read(va); err != nil || got != v {
			t.Fatalf("%s: %#x holds %#x (%v), want %#x", when, va, got, err, v)
		}
	}
}

// TestMigrateMakesRoomForShortLivedBlocks: when a synchronization interval's
// short-lived blocks spilled for lack of device memory, the next
// synchronization demotes as much of the oldest blocks as they needed, so
// the same blocks in the next interval get device memory; when they are no
// longer allocated, the demoted granules come back. The contents and the
// addresses of the moved blocks never change, and a tracer's spilled
// ranges are the host granules at every step.
func TestMigrateMakesRoomForShortLivedBlocks(t *testing.T) {
	h, f, obs := migrateHarness(t)
	old, want := oldStampedBlocks(t, h, f)
	if st := h.p.Stats(); st.DemotedTotal != 0 || st.PromotedTotal != 0 {
		t.Fatalf("moved with room to spare: %v", st)
	}

	// Interval: a short-lived block of four granules, two of them spilled.
	h.mustFree(h.mustAlloc(4 * granule))
	if st := h.p.Stats(); st.SpilledTotal != 2*granule {
		t.Fatalf("spilled %d bytes, want 2 granules", st.SpilledTotal)
	}
	h.appSync()
	obs.check(t, f, "after the demotion")
	checkStamps(t, f, want, "after the demotion")
	st := h.p.Stats()
	if st.DemotedTotal != 2*granule || f.HostBytes() != 2*granule {
		t.Fatalf("demoted %d bytes, host holds %d; want 2 granules: %v", st.DemotedTotal, f.HostBytes(), st)
	}
	oldest := h.liveOldest(old)
	for va := oldest; va < oldest+2*granule; va += granule {
		if !f.HostGranules()[va] {
			t.Fatalf("granule %#x of the oldest block is not on the host: host granules %v", va, f.HostGranules())
		}
	}

	// The same interval again: nothing spills, nothing moves.
	spilled := st.SpilledTotal
	short := h.mustAlloc(4 * granule)
	if !f.Mapped(short, short+4*granule) || len(f.HostGranules()) != 2 {
		t.Fatalf("the short-lived block did not get device memory: host granules %v", f.HostGranules())
	}
	h.mustFree(short)
	h.appSync()
	if st := h.p.Stats(); st.SpilledTotal != spilled || st.DemotedTotal != 2*granule || st.PromotedTotal != 0 {
		t.Fatalf("in a repeated interval: %v; want no spill and no move", st)
	}

	// An interval without it: the demoted granules come back.
	h.appSync()
	obs.check(t, f, "after the promotion")
	checkStamps(t, f, want, "after the promotion")
	if st := h.p.Stats(); st.PromotedTotal != 2*granule || f.HostBytes() != 0 || st.SpilledBytes != 0 {
		t.Fatalf("promoted %d bytes, host holds %d: %v", st.PromotedTotal, f.HostBytes(), st)
	}
	if vc := f.VirtualCounts(); vc.Moves != 4 {
		t.Fatalf("%d moves, want 4", vc.Moves)
	}
	for base := range old {
		h.mustFree(base)
	}
	h.appSync()
	h.closeVirtual()
	obs.check(t, f, "after Close")
}

// liveOldest returns the block of blocks allocated first: the lowest
// address, as the blocks were placed in one arena in order.
func (h *harness) liveOldest(blocks map[uint64]uint64) uint64 {
	oldest := ^uint64(0)
	for base := range blocks {
		oldest = min(oldest, base)
	}
	return oldest
}

// TestMigrateDemotedFreeBytesAreNotCached: a granule demoted while only
// part of it is live holds the rest on the host: the cache (what
// cudaMemGetInfo adds to free) is the device memory no live block uses,
// after the demotion and after the promotion that brings it back.
func TestMigrateDemotedFreeBytesAreNotCached(t *testing.T) {
	h, f, _ := migrateHarness(t)
	h.mustAlloc(granule + granule/2)
	freed := h.mustAlloc(granule + granule/2)
	h.mustAlloc(2 * granule)
	h.mustFree(freed) // the first block's second granule is half free
	h.appSync()
	checkCachedIsDeviceFree := func(when string) {
		t.Helper()
		host := f.HostGranules()
		var onDevice uint64
		for base, size := range h.live {
			for va := base; va < base+size; va = (va + granule) &^ (granule - 1) {
				if !host[va&^(granule-1)] {
					onDevice += min(base+size, (va+granule)&^(granule-1)) - va
				}
			}
		}
		if st := h.p.Stats(); st.CachedBytes != st.ReservedBytes-onDevice {
			t.Errorf("%s: %d bytes cached, want the %d reserved less the %d live on the device (host granules %v)",
				when, st.CachedBytes, st.ReservedBytes, onDevice, host)
		}
	}
	h.mustFree(h.mustAlloc(6 * granule)) // spills: the oldest granules make room
	h.appSync()
	if !f.HostGranules()[h.liveOldest(h.live)+granule] {
		t.Fatalf("the half-free granule was not demoted: host granules %v", f.HostGranules())
	}
	checkCachedIsDeviceFree("after the demotion")
	h.appSync()
	if len(f.HostGranules()) != 0 {
		t.Fatalf("host granules %v left after an interval without spills", f.HostGranules())
	}
	checkCachedIsDeviceFree("after the promotion")
	h.closeVirtual()
}

// TestMigrateNotWhileFreesWait: a block freed while the synchronization ran
// (by another thread, whose work may still be queued) stops every move at
// its end; the next synchronization moves.
func TestMigrateNotWhileFreesWait(t *testing.T) {
	h, f, _ := migrateHarness(t)
	for range 3 {
		h.mustAlloc(2 * granule)
	}
	other := h.mustAlloc(granule / 2)
	h.appSync()
	h.mustFree(h.mustAlloc(4 * granule))
	ticket := h.p.SyncBegin()
	h.mustFree(other) // after the cut: still pending at SyncEnd
	if err := h.f.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := h.p.SyncEnd(ticket); err != nil {
		t.Fatal(err)
	}
	if st := h.p.Stats(); st.DemotedTotal != 0 || f.VirtualCounts().Moves != 0 {
		t.Fatalf("moved with a free pending: %v", st)
	}
	h.mustFree(h.mustAlloc(4 * granule))
	h.appSync()
	if st := h.p.Stats(); st.DemotedTotal == 0 {
		t.Fatalf("nothing demoted once nothing was pending: %v", st)
	}
	h.closeVirtual()
}

// TestMigrateFailedMove: a move that fails changes nothing but the error
// count: the granule stays on the device with its contents, the host
// granule made for it is released, and the next synchronization tries again.
func TestMigrateFailedMove(t *testing.T) {
	h, f, obs := migrateHarness(t)
	_, want := oldStampedBlocks(t, h, f)
	f.FailMove = func(uint64) error { return errors.New("injected copy failure") }
	h.mustFree(h.mustAlloc(4 * granule))
	before := h.p.Stats()
	h.appSync()
	st := h.p.Stats()
	if st.DemotedTotal != 0 || st.BackingErrors != before.BackingErrors+1 || f.HostBytes() != 0 || st.SpilledTotal != before.SpilledTotal {
		t.Fatalf("after a failed move: %v (before %v), host %d bytes", st, before, f.HostBytes())
	}
	if len(obs.failures) != 1 {
		t.Fatalf("failures told: %v, want the move's", obs.failures)
	}
	checkStamps(t, f, want, "after the failed move")
	f.FailMove = nil
	h.mustFree(h.mustAlloc(4 * granule))
	h.appSync()
	if st := h.p.Stats(); st.DemotedTotal != 2*granule {
		t.Fatalf("demoted %d bytes on the retry, want 2 granules", st.DemotedTotal)
	}
	checkStamps(t, f, want, "after the retry")
	obs.check(t, f, "after the retry")
	h.closeVirtual()
}

// TestMigrateOptions: migration without what it needs is refused by New.
func TestMigrateOptions(t *testing.T) {
	opt := virtualOptions(8 * granule)
	opt.Migrate = true
	if _, err := pool.New(pooltest.NewVirtual(0), opt); err == nil {
		t.Fatal("migration without oversubscription accepted")
	}
	opt.Oversubscribe, opt.HostLimit = true, granule
	if _, err := pool.New(pooltest.New(0), opt); err == nil {
		t.Fatal("migration over a backing without virtual memory accepted")
	}
	p, err := pool.New(pooltest.NewVirtual(0), opt)
	if err != nil {
		t.Fatalf("migration with what it needs: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestMigrateHotHostGranules: a host granule handed out on in the interval
// just ended is hot: it is promoted, making room by demoting the coldest
// device granule, never a hot one. A host granule that only cold device
// granules could make room for stays on the host while every device granule
// is hot.
func TestMigrateHotHostGranules(t *testing.T) {
	h, f, obs := migrateHarness(t)
	a := h.mustAlloc(4 * granule)
	h.mustAlloc(4 * granule) // the device is full
	c := h.mustAlloc(granule)
	if !f.HostGranules()[c] {
		t.Fatalf("%#x on the device with the quota full", c)
	}
	h.appSync()
	if vc := f.VirtualCounts(); vc.Moves != 0 || !f.HostGranules()[c] {
		t.Fatalf("%d moves with every device granule hot (host granules %v), want none", vc.Moves, f.HostGranules())
	}

	// The next interval hands out e, on the host: it is hot, the device
	// granules now cold; the coldest (lowest address) makes room for it.
	e := h.mustAlloc(granule)
	h.appSync()
	obs.check(t, f, "after the moves")
	host := f.HostGranules()
	if vc := f.VirtualCounts(); vc.Moves != 2 || host[e] || !host[c] || !host[a] {
		t.Fatalf("%d moves, host granules %v; want 2: e %#x promoted, a's first granule %#x demoted, c %#x left", vc.Moves, host, e, a, c)
	}
	h.closeVirtual()
}

// TestMigrateNotWhileStreamFreesWait: a block freed on a stream while the
// synchronization ran, still stream-owned at SyncEnd, stops every move as a
// pending one does.
func TestMigrateNotWhileStreamFreesWait(t *testing.T) {
	h, f, _ := migrateHarness(t)
	for range 3 {
		h.mustAlloc(2 * granule)
	}
	other, err := h.allocAsync(granule/2, 1)
	if err != nil {
		t.Fatal(err)
	}
	h.appSync()
	h.mustFree(h.mustAlloc(4 * granule))
	ticket := h.p.SyncBegin()
	if err := h.freeAsync(other, 1); err != nil { // after the cut: stream-owned at SyncEnd
		t.Fatal(err)
	}
	if err := h.f.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := h.p.SyncEnd(ticket); err != nil {
		t.Fatal(err)
	}
	if st := h.p.Stats(); st.DemotedTotal != 0 || f.VirtualCounts().Moves != 0 {
		t.Fatalf("moved with a stream's free waiting: %v", st)
	}
	h.closeVirtual()
}

// TestMigrateColdestFirst: demotion takes the granules handed out on
// longest ago first: of four blocks each handed out in an interval of its
// own, the oldest.
func TestMigrateColdestFirst(t *testing.T) {
	h, f, _ := migrateHarness(t)
	var blocks []uint64
	for range 4 { // the device is full
		blocks = append(blocks, h.mustAlloc(2*granule))
		h.appSync()
	}
	h.mustFree(h.mustAlloc(2 * granule)) // on the host: two granules short
	h.appSync()
	host := f.HostGranules()
	if oldest := blocks[0]; len(host) != 2 || !host[oldest] || !host[oldest+granule] {
		t.Fatalf("host granules %v, want the oldest block's two at %#x", host, oldest)
	}
	h.closeVirtual()
}

// TestMigrateIdleGranulesAreRoom: idle granules, mapped with no used byte,
// count as the device's room and are never demoted: a granule freed while
// a hot one waited on the host makes room for it, and the one cold live
// granule that the reserve still needs is demoted.
func TestMigrateIdleGranulesAreRoom(t *testing.T) {
	h, f, _ := migrateHarness(t)
	h.p.Close()
	h.opt.ReleaseThreshold = h.opt.Quota // freed granules stay mapped, idle
	p, err := pool.New(f, h.opt)
	if err != nil {
		t.Fatal(err)
	}
	h.p = p
	w := h.mustAlloc(2 * granule)
	x := h.mustAlloc(granule) // keeps w's arena
	h.mustAlloc(5 * granule)  // the device is full
	h.appSync()
	s := h.mustAlloc(granule) // on the host, hot
	if !f.HostGranules()[s] {
		t.Fatalf("%#x on the device with the quota full", s)
	}
	h.mustFree(w) // idle at SyncEnd, and cold
	h.appSync()
	host := f.HostGranules()
	if st := h.p.Stats(); st.DemotedTotal != granule || len(host) != 1 || !host[x] {
		t.Fatalf("demoted %d bytes, host granules %v; want x's granule %#x alone", st.DemotedTotal, host, x)
	}
	h.closeVirtual()
}

// TestMigrateStreamReuseIsHot: a block handed out again from its stream's
// cache (cudaFreeAsync, then cudaMallocAsync on the same stream) was handed
// out in the interval, as one from the pool's free blocks is: its granules
// are hot, and room for the interval's short-lived blocks is made by
// demoting a block no one handed out since, never it.
func TestMigrateStreamReuseIsHot(t *testing.T) {
	h, f, _ := migrateHarness(t)
	const s = pool.Stream(7)
	old, _ := oldStampedBlocks(t, h, f)
	oldest := h.liveOldest(old)
	if err := h.freeAsync(oldest, s); err != nil {
		t.Fatal(err)
	}
	again, err := h.allocAsync(2*granule, s)
	if err != nil || again != oldest {
		t.Fatalf("reallocation on the stream: %#x (%v), want the block just freed there, %#x", again, err, oldest)
	}
	h.mustFree(h.mustAlloc(4 * granule)) // short-lived: two granules spill
	h.appSync()
	if st := h.p.Stats(); st.DemotedTotal != 2*granule {
		t.Fatalf("demoted %d bytes, want 2 granules: %v", st.DemotedTotal, st)
	}
	for va := oldest; va < oldest+2*granule; va += granule {
		if f.HostGranules()[va] {
			t.Fatalf("granule %#x of the block handed out again in the interval was demoted: host granules %v", va, f.HostGranules())
		}
	}
	h.appSync()
	h.closeVirtual()
}
