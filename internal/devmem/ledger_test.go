package devmem

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// TestDeviceLedgerArithmetic: the pool's and the outside paths' takes,
// from many goroutines at once (run it with -race), never hold more than
// the quota together, and everything given back leaves the ledger empty.
func TestDeviceLedgerArithmetic(t *testing.T) {
	const quota = 1 << 20
	l := newDeviceLedger(quota, true)
	var held atomic.Uint64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			outside := g%2 == 0
			take, give := l.Take, l.Give
			if outside {
				take = func(n uint64) bool { return l.takeOutside(n, g%4 == 0) }
				give = l.giveOutside
			}
			var mine []uint64
			for range 20000 {
				if len(mine) > 0 && rng.IntN(2) == 0 {
					n := mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					held.Add(-n)
					give(n)
					continue
				}
				n := uint64(1 + rng.IntN(quota/4))
				if !take(n) {
					continue
				}
				if h := held.Add(n); h > quota {
					t.Errorf("%d bytes held under a quota of %d", h, quota)
					return
				}
				mine = append(mine, n)
			}
			for _, n := range mine {
				held.Add(-n)
				give(n)
			}
		}()
	}
	wg.Wait()
	if l.used() != 0 || l.Headroom() != quota || l.left() != quota {
		t.Fatalf("after every give: %d used, %d headroom, %d left", l.used(), l.Headroom(), l.left())
	}
}

// TestDeviceLedgerReclaims: a request outside the pool that does not fit
// makes the pool give back its stream-ordered frees in flight and its
// cache, then is tried once more; the pool's own takes reclaim only the
// frees in flight, never the cache (the pool's lock is held then).
func TestDeviceLedgerReclaims(t *testing.T) {
	l := newDeviceLedger(16, true)
	if !l.Take(12) {
		t.Fatal("12 of 16 refused")
	}
	var inflight, cached uint64 = 2, 10 // of the pool's 12
	var cacheCalls int
	l.reclaim.Store(&reclaimers{
		inflight: func() bool {
			if inflight == 0 {
				return false
			}
			l.Give(inflight)
			inflight = 0
			return true
		},
		cache: func(synchronize bool) uint64 {
			if !synchronize {
				return 0 // what is cached waits for a synchronization
			}
			cacheCalls++
			n := cached
			l.Give(n)
			cached = 0
			return n
		},
	})
	if l.Take(8) || cacheCalls != 0 || inflight != 0 {
		t.Fatalf("the pool's take of 8: cache asked %d times, %d in flight left", cacheCalls, inflight)
	}
	if l.takeOutside(14, false) || cacheCalls != 0 {
		t.Fatalf("14 outside without a synchronization: used %d", l.used())
	}
	if !l.takeOutside(14, true) || cacheCalls != 1 || l.used() != 14 {
		t.Fatalf("14 outside after the cache was returned: used %d, cache asked %d times", l.used(), cacheCalls)
	}
	if l.takeOutside(3, true) || cacheCalls != 2 {
		t.Fatalf("3 more outside: used %d, cache asked %d times", l.used(), cacheCalls)
	}
	// Without a quota, memory outside the pool is always admitted and does
	// not count against the pool.
	u := newDeviceLedger(16, false)
	if !u.takeOutside(100, false) || !u.Take(16) || u.Take(1) || u.used() != 116 {
		t.Fatalf("without a quota: used %d", u.used())
	}
}
