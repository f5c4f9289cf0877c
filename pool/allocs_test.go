package pool_test

import (
	"fmt"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

// TestPairsAllocateNothing checks that allocating and freeing cached blocks
// leaves nothing for the garbage collector, whose collections would scan
// every descriptor and slow every pair while they run: descriptors and the
// pointer table grow in amortized steps, so a steady state of pairs makes
// less than one heap allocation per pair.
func TestPairsAllocateNothing(t *testing.T) {
	for _, virtual := range []bool{false, true} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("virtual=%v/stream=%v", virtual, stream), func(t *testing.T) {
				f := pooltest.NewVirtual(0)
				opt := pool.DefaultOptions(64 * giB)
				opt.VirtualMemory = virtual
				p, err := pool.New(f, opt)
				if err != nil {
					t.Fatal(err)
				}
				const s pool.Stream = 1
				var ring [pairWindow]uint64
				i := 0
				pair := func() {
					if err := pairAt(p, ring[:], i%pairWindow, uint64(4*kiB)<<(i%5), stream, s); err != nil {
						t.Fatal(err)
					}
					if i++; i%pairWindow == 0 {
						f.Complete(s)
					}
				}
				for range 10 * pairWindow {
					pair()
				}
				if n := testing.AllocsPerRun(10*pairWindow, pair); n != 0 {
					t.Errorf("%v heap allocations per allocation+free pair, want none", n)
				}
				if err := p.Close(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
