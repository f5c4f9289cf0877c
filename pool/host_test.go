package pool_test

import (
	"errors"
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
