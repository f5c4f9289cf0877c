package pool_test

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

// TestQuotaLedgerNeverExceedsItsQuota takes and gives from many goroutines
// at once (run it with -race): what is held, counted by the takers, never
// passes the quota, and everything given back leaves the ledger empty.
func TestQuotaLedgerNeverExceedsItsQuota(t *testing.T) {
	const quota = 1 << 20
	l := pool.NewQuotaLedger(quota)
	var held atomic.Uint64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			var mine []uint64
			for range 20000 {
				if len(mine) > 0 && rng.IntN(2) == 0 {
					n := mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					held.Add(-n)
					l.Give(n)
					continue
				}
				n := uint64(1 + rng.IntN(quota/4))
				if !l.Take(n) {
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
				l.Give(n)
			}
		}()
	}
	wg.Wait()
	if l.Taken() != 0 || l.Headroom() != quota {
		t.Fatalf("after every give: %d taken, %d headroom", l.Taken(), l.Headroom())
	}
	if l.Take(quota + 1) {
		t.Fatal("took more than the quota")
	}
	if !l.Take(quota) || l.Headroom() != 0 || l.Take(1) {
		t.Fatal("the whole quota, then nothing more")
	}
}

// TestSharedLedger: a pool whose ledger another user shares holds the quota
// for both, takes every byte it holds and gives it all back, and returns its
// cache on demand (ReleaseCached) so that the other user's request fits.
func TestSharedLedger(t *testing.T) {
	for _, virtual := range []bool{false, true} {
		name := "fixed"
		var back pool.Backing
		var device func() uint64
		if virtual {
			f := pooltest.NewVirtual(0)
			name, back, device = "virtual", f, f.DeviceBytes
		} else {
			f := pooltest.New(0)
			back, device = f, f.DeviceBytes
		}
		t.Run(name, func(t *testing.T) {
			l := pool.NewQuotaLedger(16 * miB)
			opt := pool.DefaultOptions(16 * miB)
			opt.Ledger = l
			opt.ReleaseThreshold = 16 * miB // nothing goes back by the threshold
			p, err := pool.New(back, opt)
			if err != nil {
				t.Fatal(err)
			}
			exact := func(outside uint64) {
				t.Helper()
				if st := p.Stats(); st.ReservedBytes != device() || l.Taken() != device()+outside {
					t.Fatalf("the ledger holds %d, the pool reserved %d, the device %d, outside %d", l.Taken(), st.ReservedBytes, device(), outside)
				}
			}
			if !l.Take(10 * miB) { // another user's
				t.Fatal("the empty ledger refused 10 MiB")
			}
			if _, err := p.Alloc(8 * miB); !errors.Is(err, pool.ErrQuota) {
				t.Fatalf("8 MiB beside 10 MiB of another user's under 16 MiB: %v", err)
			}
			exact(10 * miB)
			a, err := p.Alloc(4 * miB)
			if err != nil {
				t.Fatalf("4 MiB beside 10 MiB under 16 MiB: %v", err)
			}
			exact(10 * miB)
			l.Give(10 * miB)
			if err := p.Free(a); err != nil {
				t.Fatal(err)
			}
			// The freed block is cached (and pending): the other user's 16
			// MiB fit only once the pool returns it.
			if l.Take(16 * miB) {
				t.Fatal("the ledger admitted 16 MiB while the pool held its cache")
			}
			if n := p.ReleaseCached(false); n != 0 {
				t.Fatalf("without synchronizing, ReleaseCached released %d bytes of a block still pending", n)
			}
			if n := p.ReleaseCached(true); n == 0 || device() != 0 {
				t.Fatalf("ReleaseCached returned %d bytes, the device still holds %d", n, device())
			}
			if !l.Take(16 * miB) {
				t.Fatalf("16 MiB refused after the pool returned its cache: %d taken", l.Taken())
			}
			l.Give(16 * miB)
			if _, err := p.Alloc(miB); err != nil {
				t.Fatal(err)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			if l.Taken() != 0 || device() != 0 {
				t.Fatalf("after Close the ledger holds %d, the device %d", l.Taken(), device())
			}
		})
	}
}
