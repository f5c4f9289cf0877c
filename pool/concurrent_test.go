package pool_test

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

// TestConcurrentUse runs many goroutines allocating and freeing through every
// entry point; a shared map of granules catches two live blocks sharing
// memory. Run it with -race.
func TestConcurrentUse(t *testing.T) {
	const workers, ops = 16, 2000
	fake := pooltest.New(0)
	// A quota the workers' peak exceeds, so spills and promotions run
	// concurrently with everything else.
	opt := pool.DefaultOptions(24 * miB)
	opt.Oversubscribe = true
	opt.HostLimit = giB
	p, err := pool.New(fake, opt)
	if err != nil {
		t.Fatal(err)
	}
	var (
		ownerMu sync.Mutex
		owner   = make(map[uint64]int) // granule address -> worker
	)
	claim := func(w int, ptr, size uint64, take bool) {
		ownerMu.Lock()
		defer ownerMu.Unlock()
		for g := ptr; g < ptr+size; g += pool.Alignment {
			if take {
				if o, busy := owner[g]; busy {
					t.Errorf("worker %d got %#x, still owned by worker %d", w, g, o)
					return
				}
				owner[g] = w
			} else {
				delete(owner, g)
			}
		}
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			stream := pool.Stream(w % 4)
			type alloc struct{ ptr, size uint64 }
			var mine []alloc
			for range ops {
				switch r := rng.IntN(10); {
				case r < 5 || len(mine) == 0:
					size := uint64(1 + rng.IntN(64*kiB))
					var ptr uint64
					var err error
					if r%2 == 0 {
						ptr, err = p.Alloc(size)
					} else {
						ptr, err = p.AllocAsync(size, stream)
					}
					if err != nil {
						t.Errorf("worker %d: allocation of %d: %v", w, size, err)
						return
					}
					size = alignUp(size)
					claim(w, ptr, size, true)
					mine = append(mine, alloc{ptr, size})
				case r < 9:
					i := rng.IntN(len(mine))
					a := mine[i]
					mine[i] = mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					claim(w, a.ptr, a.size, false)
					var err error
					if r%2 == 0 {
						err = p.Free(a.ptr)
					} else {
						err = p.FreeAsync(a.ptr, stream)
					}
					if err != nil {
						t.Errorf("worker %d: free of %#x: %v", w, a.ptr, err)
						return
					}
				default:
					ticket := p.SyncBegin()
					_ = fake.Synchronize()
					if err := p.SyncEnd(ticket); err != nil {
						t.Errorf("worker %d: SyncEnd: %v", w, err)
					}
					fake.Complete(stream)
					_ = p.Stats()
				}
			}
			for _, a := range mine {
				claim(w, a.ptr, a.size, false)
				if err := p.Free(a.ptr); err != nil {
					t.Errorf("worker %d: final free of %#x: %v", w, a.ptr, err)
				}
			}
		}()
	}
	wg.Wait()
	if st := p.Stats(); st.LiveBytes != 0 || st.LiveBlocks != 0 || st.ReservedBytes != fake.DeviceBytes() {
		t.Fatalf("after every free: %+v, device holds %d", st, fake.DeviceBytes())
	}
	t.Logf("%v", p.Stats())
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if fake.DeviceBytes() != 0 || fake.LiveMarkers() != 0 {
		t.Fatalf("after Close: %d device bytes, %d markers", fake.DeviceBytes(), fake.LiveMarkers())
	}
}
