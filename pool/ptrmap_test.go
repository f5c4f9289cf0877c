package pool

import (
	"math/rand/v2"
	"testing"
)

func TestPtrMapAgreesWithABuiltInMap(t *testing.T) {
	var m ptrMap
	ref := map[uint64]*block{}
	rng := rand.New(rand.NewPCG(5, 6))
	keys := []uint64{}
	for i := range 200000 {
		switch {
		case len(keys) == 0 || rng.IntN(3) != 0:
			// Keys clustered in a few segments collide in their probe runs.
			k := uint64(0x7f00_0000_0000) + uint64(rng.IntN(1<<14))<<granuleShift
			if _, ok := ref[k]; ok {
				continue
			}
			b := &block{base: k}
			m.put(k, b)
			ref[k] = b
			keys = append(keys, k)
		default:
			j := rng.IntN(len(keys))
			k := keys[j]
			keys[j] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			m.del(k)
			delete(ref, k)
		}
		if i%1000 == 0 {
			if m.count != len(ref) {
				t.Fatalf("count %d, want %d", m.count, len(ref))
			}
			for k, b := range ref {
				if got := m.get(k); got != b {
					t.Fatalf("get(%#x) = %p, want %p", k, got, b)
				}
			}
			if m.get(0x1000) != nil {
				t.Fatal("found a key never inserted")
			}
		}
	}
	n := 0
	m.each(func(*block) { n++ })
	if n != len(ref) {
		t.Fatalf("each visited %d entries, want %d", n, len(ref))
	}
}
