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
			if got := m.del(k); got != ref[k] {
				t.Fatalf("del(%#x) = %p, want %p", k, got, ref[k])
			}
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

// TestLiveMapAgreesWithABuiltInMap checks the young and old tables together:
// blocks freed young, blocks that age into the old table, and descriptors
// and addresses handed out again right after their free, as a stream's
// cache does.
func TestLiveMapAgreesWithABuiltInMap(t *testing.T) {
	var m liveMap
	ref := map[uint64]*block{}
	rng := rand.New(rand.NewPCG(7, 8))
	var keys []uint64
	var freed []*block // descriptors to hand out again
	for i := range 100000 {
		if len(keys) == 0 || rng.IntN(20) < 11 { // the live set grows slowly
			k := uint64(0x7f00_0000_0000) + uint64(rng.IntN(2*youngBlocks))<<granuleShift
			if _, ok := ref[k]; ok {
				continue
			}
			b := &block{}
			if n := len(freed); n > 0 && rng.IntN(2) == 0 {
				b, freed = freed[n-1], freed[:n-1]
			}
			b.base = k
			m.put(b)
			ref[k] = b
			keys = append(keys, k)
		} else {
			// Free mostly the newest blocks (they die young), sometimes any.
			j := len(keys) - 1 - rng.IntN(min(len(keys), 8))
			if rng.IntN(4) == 0 {
				j = rng.IntN(len(keys))
			}
			k := keys[j]
			keys = append(keys[:j], keys[j+1:]...)
			if got := m.take(k); got != ref[k] {
				t.Fatalf("step %d: take(%#x) = %p, want %p", i, k, got, ref[k])
			}
			freed = append(freed, ref[k])
			delete(ref, k)
		}
		if m.young.count+m.old.count != len(ref) {
			t.Fatalf("step %d: %d + %d entries, want %d", i, m.young.count, m.old.count, len(ref))
		}
		ring := 0
		for slot, b := range m.order {
			if b == nil {
				continue
			}
			ring++
			if m.young.get(b.base) != b || int(b.ringSlot) != slot+1 {
				t.Fatalf("step %d: ring slot %d holds %#x, which young maps to %p with ring slot %d", i, slot, b.base, m.young.get(b.base), b.ringSlot)
			}
		}
		if ring != m.young.count {
			t.Fatalf("step %d: %d blocks in the ring, %d in the young table", i, ring, m.young.count)
		}
		if i%500 == 0 {
			for k, b := range ref {
				if got := m.get(k); got != b {
					t.Fatalf("step %d: get(%#x) = %p, want %p", i, k, got, b)
				}
			}
		}
	}
	if m.old.count == 0 {
		t.Fatal("no block aged into the old table")
	}
	n := 0
	m.each(func(*block) { n++ })
	if n != len(ref) {
		t.Fatalf("each visited %d entries, want %d", n, len(ref))
	}
}
