package pool_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

func oversubscribed(quota uint64, tier pool.Tier) pool.Options {
	opt := pool.DefaultOptions(quota)
	opt.Oversubscribe = true
	opt.SpillTier = tier
	opt.HostLimit = 4 * quota
	opt.ReleaseThreshold = quota // keep the cache: only promotion releases
	return opt
}

func TestSpillBeyondTheQuota(t *testing.T) {
	f := pooltest.New(0)
	opt := oversubscribed(16*miB, pool.TierManaged)
	h := newHarness(t, f, opt)
	var onHost int
	for range 8 { // twice the quota in 4 MiB chunks
		p := h.mustAlloc(4 * miB)
		a, ok := h.p.Lookup(p)
		if !ok || a.Size != 4*miB {
			t.Fatalf("Lookup(%#x) = %+v, %v", p, a, ok)
		}
		if a.Tier == pool.TierManaged {
			onHost++
		}
	}
	st := h.p.Stats()
	if st.ReservedBytes > opt.Quota || onHost < 4 || st.SpilledBytes != uint64(onHost)*4*miB || st.SpilledTotal != st.SpilledBytes {
		t.Fatalf("%d of 8 blocks spilled; stats %+v", onHost, st)
	}
	h.close()
}

func TestPassThroughSpills(t *testing.T) {
	f := pooltest.New(0)
	opt := oversubscribed(8*miB, pool.TierPinned)
	opt.Pooling = false
	h := newHarness(t, f, opt)
	a, b := h.mustAlloc(6*miB), h.mustAlloc(6*miB)
	if at, _ := h.p.Lookup(b); at.Tier != pool.TierPinned {
		t.Fatalf("second block on %v, want pinned host memory", at.Tier)
	}
	h.mustFree(a)
	h.mustFree(b)
	h.close()
}

func TestHostLimit(t *testing.T) {
	f := pooltest.New(0)
	opt := oversubscribed(4*miB, pool.TierManaged)
	opt.HostLimit = 8 * miB
	h := newHarness(t, f, opt)
	h.mustAlloc(4 * miB)
	h.mustAlloc(8 * miB)
	_, err := h.alloc(miB)
	if !errors.Is(err, pool.ErrHostLimit) || !errors.Is(err, pool.ErrOutOfMemory) {
		t.Fatalf("beyond the host limit: %v, want ErrHostLimit and ErrOutOfMemory", err)
	}
	h.close()
}

// TestTakeHostSharesTheHostLimit: host memory the application holds
// outside the pool leaves the pool's spills only the rest of the host limit.
func TestTakeHostSharesTheHostLimit(t *testing.T) {
	f := pooltest.New(0)
	opt := oversubscribed(4*miB, pool.TierManaged)
	opt.HostLimit = 8 * miB
	h := newHarness(t, f, opt)
	if err := h.p.TakeHost(6 * miB); err != nil {
		t.Fatal(err)
	}
	if err := h.p.TakeHost(4 * miB); !errors.Is(err, pool.ErrHostLimit) || !errors.Is(err, pool.ErrOutOfMemory) {
		t.Fatalf("beyond the host limit: %v, want ErrHostLimit and ErrOutOfMemory", err)
	}
	if st := h.p.Stats(); st.HostOutside != 6*miB || st.SpilledBytes != 0 {
		t.Fatalf("%d bytes held outside the pool, %d spilled; want 6 MiB and none", st.HostOutside, st.SpilledBytes)
	}
	h.mustAlloc(4 * miB) // the quota
	if _, err := h.alloc(4 * miB); !errors.Is(err, pool.ErrHostLimit) {
		t.Fatalf("a spill beyond the 2 MiB left of the host limit: %v, want ErrHostLimit", err)
	}
	h.p.GiveHost(6 * miB)
	if st := h.p.Stats(); st.HostOutside != 0 {
		t.Fatalf("%d bytes held outside the pool after GiveHost, want 0", st.HostOutside)
	}
	h.mustAlloc(4 * miB) // now spilled by the pool
	h.close()

	off := newHarness(t, pooltest.New(0), pool.DefaultOptions(4*miB))
	if err := off.p.TakeHost(miB); !errors.Is(err, pool.ErrOutOfMemory) {
		t.Fatalf("TakeHost without oversubscription: %v, want ErrOutOfMemory", err)
	}
	off.close()
}

func TestHostReservationFailureIsAnError(t *testing.T) {
	f := pooltest.New(0)
	f.HostCapacity = 2 * miB
	h := newHarness(t, f, oversubscribed(4*miB, pool.TierManaged))
	h.mustAlloc(4 * miB)
	if _, err := h.alloc(4 * miB); !errors.Is(err, pool.ErrOutOfMemory) {
		t.Fatalf("host out of memory: %v", err)
	}
	h.close()
}

// TestHostOutOfMemoryIsARefusal: a spill the host cannot make the memory
// for is a refusal, counted and told to the Observer as one past the host
// limit is, pooled or passed through.
func TestHostOutOfMemoryIsARefusal(t *testing.T) {
	for _, pooling := range []bool{true, false} {
		t.Run(fmt.Sprintf("pooling=%v", pooling), func(t *testing.T) {
			f := pooltest.New(0)
			f.HostCapacity = 2 * miB
			rec := &recorder{sources: map[pool.Source]int{}}
			opt := oversubscribed(4*miB, pool.TierManaged)
			opt.Pooling = pooling
			opt.Observer = rec
			h := newHarness(t, f, opt)
			h.mustAlloc(4 * miB)
			_, err := h.alloc(4 * miB)
			if !errors.Is(err, pool.ErrOutOfMemory) || errors.Is(err, pool.ErrHostLimit) {
				t.Fatalf("host out of memory: %v, want ErrOutOfMemory, not ErrHostLimit", err)
			}
			if st := h.p.Stats(); st.Refused != 1 || rec.refusals != 1 || st.BackingErrors != 0 || st.SpilledTotal != 0 {
				t.Fatalf("%d refusals counted, %d told, %d backing errors, %d bytes spilled; want one refusal, nothing else",
					st.Refused, rec.refusals, st.BackingErrors, st.SpilledTotal)
			}
			h.close()
		})
	}
}

func TestPromotionOldestFirstWhileItFits(t *testing.T) {
	f := pooltest.New(0)
	rec := &recorder{sources: map[pool.Source]int{}}
	opt := oversubscribed(32*miB, pool.TierManaged)
	opt.Observer = rec
	h := newHarness(t, f, opt)
	dev := []uint64{h.mustAlloc(12 * miB), h.mustAlloc(12 * miB), h.mustAlloc(8 * miB)} // the quota is full
	old := h.mustAlloc(10 * miB)                                                        // spilled first
	young := h.mustAlloc(2 * miB)                                                       // spilled second
	for _, p := range []uint64{old, young} {
		if a, _ := h.p.Lookup(p); a.Tier != pool.TierManaged {
			t.Fatalf("%#x not spilled", p)
		}
	}
	// 8 MiB of room: the young block would fit but must not overtake.
	h.mustFree(dev[2])
	h.appSync()
	if st := h.p.Stats(); st.PromotedTotal != 0 {
		t.Fatalf("promoted %d bytes while the oldest block could not fit", st.PromotedTotal)
	}
	h.mustFree(dev[1])
	h.appSync()
	st := h.p.Stats()
	if st.PromotedTotal != 12*miB || st.PromotedBytes != 12*miB || st.SpilledBytes != 0 || st.ReservedBytes > opt.Quota {
		t.Fatalf("after 20 MiB of room: %+v", st)
	}
	if c := f.Counts(); c.Promotions != 2 || rec.promotes != 2 || rec.spills != 2 {
		t.Fatalf("%d promotions, observer %+v", c.Promotions, rec)
	}
	// Pointers keep their tier; freeing a promoted block gives back device room.
	if a, _ := h.p.Lookup(old); a.Tier != pool.TierManaged {
		t.Fatalf("promoted block changed tier: %v", a.Tier)
	}
	h.mustFree(old)
	if st := h.p.Stats(); st.PromotedBytes != 2*miB {
		t.Fatalf("after freeing a promoted block: %+v", st)
	}
	h.close()
}

// failures is an Observer that also hears of the backing failures that did
// not fail a call.
type failures struct {
	recorder
	errs []error
}

func (f *failures) BackingFailed(err error) { f.errs = append(f.errs, err) }

// A promotion that fails does not fail the application's synchronization:
// it is counted and told to the observer. One that failed before anything
// moved (out of memory) leaves the block first in line for the next pass.
func TestFailedPromotionDoesNotFailTheSynchronization(t *testing.T) {
	for _, full := range []error{
		fmt.Errorf("device full: %w", pool.ErrOutOfMemory),
		fmt.Errorf("advice refused: %w", pool.ErrNotMoved),
	} {
		t.Run(full.Error(), func(t *testing.T) { failedPromotionBeforeTheMove(t, full) })
	}
}

func failedPromotionBeforeTheMove(t *testing.T, full error) {
	f := pooltest.New(0)
	f.FailPromote = func(uint64, uint64) error { return full }
	obs := &failures{recorder: recorder{sources: map[pool.Source]int{}}}
	opt := oversubscribed(8*miB, pool.TierManaged)
	opt.Pooling = false // a free gives its room back at once
	opt.Observer = obs
	h := newHarness(t, f, opt)
	dev := h.mustAlloc(8 * miB)
	spilled := h.mustAlloc(4 * miB)
	if a, _ := h.p.Lookup(spilled); a.Tier != pool.TierManaged {
		t.Fatalf("%#x not spilled", spilled)
	}
	h.mustFree(dev)
	h.appSync() // checks the accounting against the device
	st := h.p.Stats()
	if st.BackingErrors != 1 || st.PromotedTotal != 0 || st.SpilledBytes != 4*miB || len(obs.errs) != 1 || !errors.Is(obs.errs[0], full) {
		t.Fatalf("stats %v, observer told %v; want 1 failure told, the block still spilled", st, obs.errs)
	}
	if _, err := h.p.Promote(); !errors.Is(err, full) {
		t.Fatalf("Promote() = %v, want the failure: an explicit promotion reports it", err)
	}
	f.FailPromote = nil
	h.appSync()
	if st := h.p.Stats(); st.PromotedTotal != 4*miB {
		t.Fatalf("after the failures: promoted %d bytes, want the 4 MiB block", st.PromotedTotal)
	}
	h.close()
}

// A promotion whose wait fails may have moved the block: the block is
// counted on the device from then on, so the quota holds against what the
// device really holds, and freeing it gives the room back.
func TestPromotionWhoseWaitFailsIsCountedOnTheDevice(t *testing.T) {
	f := pooltest.New(0)
	broken := errors.New("stream synchronize failed")
	f.FailPromote = func(uint64, uint64) error { return broken }
	obs := &failures{recorder: recorder{sources: map[pool.Source]int{}}}
	opt := oversubscribed(8*miB, pool.TierManaged)
	opt.Pooling = false
	opt.Observer = obs
	h := newHarness(t, f, opt)
	dev := h.mustAlloc(8 * miB)
	spilled := h.mustAlloc(4 * miB)
	h.mustFree(dev)
	h.appSync() // the device holds the block: the accounting must say so
	st := h.p.Stats()
	if st.ReservedBytes != 4*miB || st.PromotedBytes != 4*miB || st.BackingErrors != 1 || len(obs.errs) != 1 || !errors.Is(obs.errs[0], broken) {
		t.Fatalf("after a failed wait: %v, observer told %v", st, obs.errs)
	}
	// Only 4 MiB of the quota is left: 8 MiB must spill, never reach the device.
	big := h.mustAlloc(8 * miB)
	if a, _ := h.p.Lookup(big); a.Tier != pool.TierManaged || f.DeviceBytes() > opt.Quota {
		t.Fatalf("8 MiB on %v with %d device bytes under a quota of %d", a.Tier, f.DeviceBytes(), opt.Quota)
	}
	h.mustFree(spilled)
	if st := h.p.Stats(); st.ReservedBytes != 0 || st.PromotedBytes != 0 {
		t.Fatalf("after freeing the block: %v", st)
	}
	h.close()
}

// Promotion runs at announced synchronizations and on demand, never inside
// Free or FreeAsync, where it would make the free wait for the device.
func TestFreeNeverPromotes(t *testing.T) {
	f := pooltest.New(0)
	opt := oversubscribed(8*miB, pool.TierManaged)
	opt.Pooling = false
	h := newHarness(t, f, opt)
	a, b := h.mustAlloc(4*miB), h.mustAlloc(4*miB)
	spilled := h.mustAlloc(4 * miB)
	h.mustFree(a)
	if err := h.freeAsync(b, 1); err != nil {
		t.Fatal(err)
	}
	if c := f.Counts(); c.Promotions != 0 {
		t.Fatalf("%d promotions inside Free and FreeAsync", c.Promotions)
	}
	h.appSync()
	if c := f.Counts(); c.Promotions != 1 {
		t.Fatalf("%d promotions at the announced synchronization, want 1", c.Promotions)
	}
	h.mustFree(spilled)
	h.close()
}

// A release that fails changes nothing: the block stays live and counted,
// the failure is counted, and the application's retry releases it. With
// pinned spill the retry frees the host memory.
func TestFailedReleaseIsRetried(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tier    pool.Tier
		promote bool
	}{
		{"promoted", pool.TierManaged, true},
		{"managed", pool.TierManaged, false},
		{"pinned", pool.TierPinned, false},
		{"device", pool.TierDevice, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := pooltest.New(0)
			opt := oversubscribed(8*miB, pool.TierManaged)
			if tc.tier == pool.TierPinned {
				opt.SpillTier = pool.TierPinned
			}
			opt.Pooling = false
			h := newHarness(t, f, opt)
			dev := h.mustAlloc(8 * miB)
			victim := dev
			if tc.tier != pool.TierDevice {
				victim = h.mustAlloc(4 * miB)
				if a, _ := h.p.Lookup(victim); a.Tier != tc.tier {
					t.Fatalf("block on %v, want %v", a.Tier, tc.tier)
				}
				h.mustFree(dev)
			}
			if tc.promote {
				h.appSync()
				if st := h.p.Stats(); st.PromotedBytes != 4*miB {
					t.Fatalf("not promoted: %v", st)
				}
			}
			broken := errors.New("release failed")
			fail := func(uint64, uint64) error { return broken }
			f.FailRelease, f.FailReleaseHost = fail, fail
			if err := h.p.Free(victim); !errors.Is(err, broken) {
				t.Fatalf("Free with a failing release: %v", err)
			}
			h.check() // still live, still counted, as the device says
			if st := h.p.Stats(); st.ReleaseErrors != 1 || !strings.Contains(st.String(), " release_errors=1") {
				t.Fatalf("failed release not counted: %v", st)
			}
			f.FailRelease, f.FailReleaseHost = nil, nil
			h.mustFree(victim)
			if st := h.p.Stats(); st.ReservedBytes != 0 || st.SpilledBytes != 0 || st.PromotedBytes != 0 || f.HostBytes() != 0 {
				t.Fatalf("after the retried free: %v, host holds %d", st, f.HostBytes())
			}
			h.close()
		})
	}
}

// A spilled block freed by FreeAsync is released in the order of its
// stream; by Free, at once.
func TestSpilledBlockReleasedOnItsStream(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, oversubscribed(4*miB, pool.TierPinned))
	h.mustAlloc(4 * miB)
	a, b := h.mustAlloc(miB), h.mustAlloc(miB)
	if err := h.freeAsync(a, 3); err != nil {
		t.Fatal(err)
	}
	if c := f.Counts(); c.HostReleases != 1 || c.AsyncHostReleases != 1 {
		t.Fatalf("FreeAsync of a spilled block: %+v, want one release ordered on the stream", c)
	}
	if err := h.free(b); err != nil {
		t.Fatal(err)
	}
	if c := f.Counts(); c.HostReleases != 2 || c.AsyncHostReleases != 1 {
		t.Fatalf("Free of a spilled block: %+v, want a release at once", c)
	}
	h.close()
}

func TestPinnedSpillIsNeverPromoted(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, oversubscribed(8*miB, pool.TierPinned))
	a := h.mustAlloc(8 * miB)
	h.mustAlloc(4 * miB)
	h.mustFree(a)
	h.appSync()
	if n, err := h.p.Promote(); n != 0 || err != nil {
		t.Fatalf("Promote() = %d, %v; pinned memory cannot be promoted", n, err)
	}
	h.close()
}

func TestOversubscriptionNeedsAHostBacking(t *testing.T) {
	deviceOnly := struct{ pool.Backing }{pooltest.New(0)}
	if _, err := pool.New(deviceOnly, oversubscribed(miB, pool.TierManaged)); err == nil {
		t.Fatal("oversubscription accepted over a backing without host memory")
	}
}

// TestSpillFailureSaysWhatWasFull: a spill that fails (here past the host
// limit) wraps ErrDeviceFull when the device, below the quota, is what sent
// the request to the host, and not when the quota is, with fixed segments
// and with virtual memory.
func TestSpillFailureSaysWhatWasFull(t *testing.T) {
	for _, c := range []struct {
		name            string
		virtual         bool
		capacity, quota uint64
		held, requested uint64
		deviceFull      bool
	}{
		{"quota full, segments", false, 0, 8 * miB, 6 * miB, 4 * miB, false},
		{"device full, segments", false, 8 * miB, 64 * miB, 6 * miB, 4 * miB, true},
		{"quota full, virtual memory", true, 0, 8 * miB, 6 * miB, 8 * miB, false},
		{"device full, virtual memory", true, 10 * miB, 64 * miB, 5 * miB, 8 * miB, true},
	} {
		opt := oversubscribed(c.quota, pool.TierManaged)
		opt.HostLimit = granule
		var h *harness
		if c.virtual {
			h = newVirtualHarness(t, pooltest.NewVirtual(c.capacity), opt)
		} else {
			h = newHarness(t, pooltest.New(c.capacity), opt)
		}
		h.mustAlloc(c.held)
		_, err := h.alloc(c.requested)
		if !errors.Is(err, pool.ErrHostLimit) || errors.Is(err, pool.ErrDeviceFull) != c.deviceFull {
			t.Errorf("%s: %v; want ErrHostLimit, and ErrDeviceFull %v", c.name, err, c.deviceFull)
		}
		if c.virtual {
			h.closeVirtual()
		} else {
			h.close()
		}
	}
}

// A promotion pass releases no cached segment for a block it cannot fit
// even with every empty segment released, and for one it can, only as many
// as the block needs, oldest emptied first.
func TestPromotionReleasesOnlyTheSegmentsItNeeds(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, oversubscribed(12*miB, pool.TierManaged))
	a, b := h.mustAlloc(4*miB), h.mustAlloc(4*miB) // a segment each
	h.mustAlloc(4 * miB)
	big := h.mustAlloc(6 * miB) // spilled: the quota is full
	h.mustFree(a)
	h.appSync() // 4 MiB cached: the 6 MiB block does not fit
	if st := h.p.Stats(); st.Segments != 3 || st.PromotedTotal != 0 {
		t.Fatalf("after a promotion that cannot fit: %d segments held, %d bytes promoted; want the empty segment kept", st.Segments, st.PromotedTotal)
	}
	h.mustFree(big)
	a = h.mustAlloc(4 * miB) // a's segment again
	if st := h.p.Stats(); st.Segments != 3 || st.SpilledBytes != 0 {
		t.Fatalf("%d segments held, %d bytes spilled; want the cached segment reused", st.Segments, st.SpilledBytes)
	}
	h.mustAlloc(4 * miB) // spilled
	h.mustFree(a)
	h.mustFree(b)
	h.appSync()
	if st := h.p.Stats(); st.PromotedTotal != 4*miB || st.SegmentsReleased != 1 {
		t.Fatalf("after promoting a 4 MiB block with two empty 4 MiB segments: %d bytes promoted, %d segments released; want 4 MiB and one segment", st.PromotedTotal, st.SegmentsReleased)
	}
	h.close()
}

// A block whose promotion failed before it moved stays first in line: the
// next pass tries it before the blocks spilled after it.
func TestBlockNotMovedStaysFirstInLine(t *testing.T) {
	f := pooltest.New(0)
	var tried []uint64
	f.FailPromote = func(base, size uint64) error {
		tried = append(tried, base)
		if len(tried) == 1 {
			return fmt.Errorf("advice refused: %w", pool.ErrNotMoved)
		}
		return nil
	}
	opt := oversubscribed(8*miB, pool.TierManaged)
	opt.Pooling = false // a free gives its room back at once
	h := newHarness(t, f, opt)
	dev := h.mustAlloc(8 * miB)
	older, younger := h.mustAlloc(4*miB), h.mustAlloc(4*miB) // both spilled
	h.mustFree(dev)
	h.appSync()          // the older block's promotion fails before it moves
	h.mustAlloc(4 * miB) // room for one of them only
	h.appSync()
	if len(tried) != 2 || tried[1] != older {
		t.Fatalf("promotions tried at %#x; want the older block %#x again first (the younger is %#x)", tried, older, younger)
	}
	h.close()
}

// GiveHost never returns more than TakeHost admitted: the host limit still
// holds after a caller gives back too much.
func TestGiveHostReturnsNoMoreThanHeld(t *testing.T) {
	opt := oversubscribed(4*miB, pool.TierManaged)
	opt.HostLimit = 4 * miB
	h := newHarness(t, pooltest.New(0), opt)
	if err := h.p.TakeHost(miB); err != nil {
		t.Fatal(err)
	}
	h.p.GiveHost(2 * miB)
	if st := h.p.Stats(); st.HostOutside != 0 {
		t.Fatalf("%d bytes held outside the pool after giving back more than taken, want 0", st.HostOutside)
	}
	if err := h.p.TakeHost(4 * miB); err != nil {
		t.Fatal(err)
	}
	if err := h.p.TakeHost(miB); !errors.Is(err, pool.ErrHostLimit) {
		t.Fatalf("TakeHost beyond the 4 MiB host limit: %v, want ErrHostLimit", err)
	}
	h.p.GiveHost(4 * miB)
	h.close()
}

// TestContaining: a pointer anywhere in a live block's accounted bytes finds
// that block; one in the pool's memory that no live block holds (a freed
// block) is held but not live; one outside the pool's memory, or in a block
// spilled whole (an allocation of its own), is not held.
func TestContaining(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(64*miB))
	small := h.mustAlloc(1000)
	mid := h.mustAlloc(5000)
	freed := h.mustAlloc(4096)
	h.mustFree(freed)
	for _, q := range []struct {
		ptr, base, size uint64
	}{{small, small, 1024}, {small + 1023, small, 1024}, {mid, mid, 5120}, {mid + 5119, mid, 5120}} {
		a, live, held := h.p.Containing(q.ptr)
		if !live || !held || a.Base != q.base || a.Size != q.size {
			t.Errorf("Containing(%#x) = %+v live %v held %v, want base %#x size %d", q.ptr, a, live, held, q.base, q.size)
		}
	}
	for _, ptr := range []uint64{freed, freed + 100} { // freed starts where mid's bytes end
		if _, live, held := h.p.Containing(ptr); live || !held {
			t.Errorf("Containing(%#x, in a freed block) live %v held %v, want held and not live", ptr, live, held)
		}
	}
	// A huge block is handed out whole, its segment rounded up to 2 MiB:
	// the bytes past the request are in no allocation.
	huge := h.mustAlloc(15 * miB)
	if a, live, held := h.p.Containing(huge + 15*miB); live || !held {
		t.Errorf("Containing(past the request in a huge block) = %+v live %v held %v, want held and not live", a, live, held)
	}
	if _, live, held := h.p.Containing(1); live || held {
		t.Errorf("Containing(1) live %v held %v, want neither", live, held)
	}

	spilling := newHarness(t, pooltest.New(0), oversubscribed(16*miB, pool.TierManaged))
	spilled := 0
	for range 8 {
		p := spilling.mustAlloc(4 * miB)
		if a, _ := spilling.p.Lookup(p); a.Tier != pool.TierManaged {
			continue
		}
		spilled++
		for _, ptr := range []uint64{p, p + miB} {
			if _, live, held := spilling.p.Containing(ptr); live || held {
				t.Errorf("Containing(%#x, in a block spilled whole at %#x) live %v held %v, want neither", ptr, p, live, held)
			}
		}
	}
	if spilled == 0 {
		t.Fatal("no block spilled beyond the quota")
	}

	opt := pool.DefaultOptions(64 * miB)
	opt.Pooling = false
	passing := newHarness(t, pooltest.New(0), opt)
	through := passing.mustAlloc(4096)
	for _, ptr := range []uint64{through, through + 100} {
		if _, live, held := passing.p.Containing(ptr); live || held {
			t.Errorf("Containing(%#x, in a block passed through at %#x) live %v held %v, want neither", ptr, through, live, held)
		}
	}
}
