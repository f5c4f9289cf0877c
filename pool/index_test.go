package pool

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// indexModel is the free-block index written from its definition: one list
// per class, newest block first, and classes ordered by the sizes they hold.
type indexModel map[[2]int][]*block

// classLow returns the smallest size, in granules, of class (fl, sl).
func classLow(fl, sl int) uint64 {
	if fl == 0 {
		return uint64(sl)
	}
	return uint64(slCount+sl) << (fl - 1)
}

// find examines up to scan blocks of the size's own class, taking the
// smallest that fits, and otherwise takes the first block of the smallest
// non-empty class that begins at or above the size; a block more than
// maxSlack too large is refused.
func (m indexModel) find(size, maxSlack uint64, scan int) *block {
	fl, sl := classOfUnits(size >> granuleShift)
	var best *block
	for i, b := range m[[2]int{fl, sl}] {
		if i == scan {
			break
		}
		if b.size >= size && (best == nil || b.size < best.size) {
			best = b
		}
	}
	if best == nil {
		for c := fl*slCount + sl; c < flCount*slCount; c++ {
			fl, sl := c/slCount, c%slCount
			if l := m[[2]int{fl, sl}]; len(l) > 0 && classLow(fl, sl)<<granuleShift >= size {
				best = l[0]
				break
			}
		}
	}
	if best == nil || best.size-size > maxSlack {
		return nil
	}
	return best
}

func TestIndexFindAgreesWithItsDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	// Sizes cluster around a few powers of two, so that classes hold several
	// blocks and requests fall on class boundaries as well as inside them.
	randomUnits := func() uint64 {
		u := uint64(1) << rng.IntN(20)
		switch rng.IntN(3) {
		case 0:
			return u
		case 1:
			return u + uint64(rng.IntN(int(u)))
		}
		return u - min(u-1, uint64(rng.IntN(4)))
	}
	var x index
	model := indexModel{}
	var free []*block
	for step := range 20000 {
		if len(free) == 0 || rng.IntN(5) < 3 {
			b := &block{size: randomUnits() << granuleShift}
			x.insert(b)
			fl, sl := classOfUnits(b.size >> granuleShift)
			k := [2]int{fl, sl}
			model[k] = append([]*block{b}, model[k]...)
			free = append(free, b)
		} else {
			i := rng.IntN(len(free))
			b := free[i]
			free[i] = free[len(free)-1]
			free = free[:len(free)-1]
			x.remove(b)
			fl, sl := classOfUnits(b.size >> granuleShift)
			k := [2]int{fl, sl}
			model[k] = slices.DeleteFunc(model[k], func(c *block) bool { return c == b })
		}
		size := randomUnits() << granuleShift
		for _, scan := range []int{1, exactScan, math.MaxInt} {
			for _, slack := range []uint64{0, size / 8, math.MaxUint64} {
				if got, want := x.find(size, slack, scan), model.find(size, slack, scan); got != want {
					t.Fatalf("step %d: find(%d, %d, %d) = %p, want %p", step, size, slack, scan, got, want)
				}
			}
		}
	}
}
