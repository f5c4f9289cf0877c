package pool

import "math/bits"

// The free-block index is a two-level segregated fit (TLSF) over sizes counted
// in granules of Alignment bytes. The first level is the power of two of the
// size, the second splits each power of two into 32 linear classes, so a class
// spans at most 1/32 (3.1%) of its sizes. Sizes below 32 granules (16 KiB) map
// to one class per granule. Two bitmaps record which classes are non-empty, so
// finding the smallest non-empty class at or above a size is two find-first-set
// instructions whatever the number of free blocks.
const (
	granuleShift = 9 // log2(Alignment)
	slLog2       = 5
	slCount      = 1 << slLog2
	flCount      = 40 // covers sizes up to 2^(flCount+slLog2-1) granules, above MaxRequest
	// exactScan bounds how many blocks of the request's own class are
	// examined before falling back to the next class up (which always fits).
	// Without it a request of a size a free block has exactly would skip that
	// block whenever its class spans more than one granule.
	exactScan = 8
)

type index struct {
	flMap uint64
	slMap [flCount]uint32
	// heads holds the lists of one first-level class per row, allocated at
	// the row's first block: an index costs about 500 bytes plus 256 per
	// power of two it has held, so a stream's cache stays small.
	heads [flCount]*[slCount]*block
}

// classOfUnits returns the class (fl, sl) whose range contains units.
func classOfUnits(units uint64) (fl, sl int) {
	if units < slCount {
		return 0, int(units)
	}
	t := bits.Len64(units) - 1 // t >= slLog2
	return t - slLog2 + 1, int(units>>(t-slLog2)) - slCount
}

func (x *index) insert(b *block) {
	fl, sl := classOfUnits(b.size >> granuleShift)
	b.listFl, b.listSl = uint8(fl), uint8(sl)
	row := x.heads[fl]
	if row == nil {
		row = new([slCount]*block)
		x.heads[fl] = row
	}
	head := row[sl]
	b.prevFree, b.nextFree = nil, head
	if head != nil {
		head.prevFree = b
	}
	row[sl] = b
	x.slMap[fl] |= 1 << sl
	x.flMap |= 1 << fl
}

func (x *index) remove(b *block) {
	if b.prevFree != nil {
		b.prevFree.nextFree = b.nextFree
	} else {
		fl, sl := b.listFl, b.listSl
		x.heads[fl][sl] = b.nextFree
		if b.nextFree == nil {
			x.slMap[fl] &^= 1 << sl
			if x.slMap[fl] == 0 {
				x.flMap &^= 1 << fl
			}
		}
	}
	if b.nextFree != nil {
		b.nextFree.prevFree = b.prevFree
	}
	b.prevFree, b.nextFree = nil, nil
}

// find returns a block of at least size bytes and at most size+maxSlack, or
// nil. It examines at most scan blocks of the size's own class (taking the
// smallest that fits) and then the head of the smallest non-empty class whose
// every block fits: O(1) in the number of free blocks for a constant scan.
func (x *index) find(size, maxSlack uint64, scan int) *block {
	if x.flMap == 0 {
		return nil
	}
	units := size >> granuleShift
	fl, sl := classOfUnits(units)
	var best *block
	var first *block
	if row := x.heads[fl]; row != nil {
		first = row[sl]
	}
	n := 0
	for b := first; b != nil && n < scan; b, n = b.nextFree, n+1 {
		if b.size >= size && (best == nil || b.size < best.size) {
			best = b
			if b.size == size {
				break
			}
		}
	}
	if best != nil {
		if best.size-size <= maxSlack {
			return best
		}
		return nil // every block of a higher class is larger still
	}
	// Every block of a class above the size's fits (size is a multiple of
	// Alignment). The size's own class is left out: it is empty, or it
	// begins below the size, as its first block did not fit.
	m := x.slMap[fl] & (^uint32(1) << sl)
	if m == 0 {
		f := x.flMap & (^uint64(0) << (fl + 1))
		if f == 0 {
			return nil
		}
		fl = bits.TrailingZeros64(f)
		m = x.slMap[fl]
	}
	b := x.heads[fl][bits.TrailingZeros32(m)]
	if b.size-size > maxSlack {
		return nil
	}
	return b
}

// scan visits up to n blocks, from the smallest class that may hold size
// bytes upwards, and calls f with those of at least size bytes until it
// returns false.
func (x *index) scan(size uint64, n int, f func(*block) bool) {
	first, sl := classOfUnits(size >> granuleShift)
	for rows := x.flMap & (^uint64(0) << first); rows != 0; rows &= rows - 1 {
		fl := bits.TrailingZeros64(rows)
		m := x.slMap[fl]
		if fl == first {
			m &= ^uint32(0) << sl
		}
		for ; m != 0; m &= m - 1 {
			for b := x.heads[fl][bits.TrailingZeros32(m)]; b != nil; b = b.nextFree {
				if b.size >= size && !f(b) {
					return
				}
				if n--; n == 0 {
					return
				}
			}
		}
	}
}

// largest returns the size of the largest block in the index. It scans only
// the highest non-empty class.
func (x *index) largest() uint64 {
	if x.flMap == 0 {
		return 0
	}
	fl := 63 - bits.LeadingZeros64(x.flMap)
	sl := 31 - bits.LeadingZeros32(x.slMap[fl])
	var max uint64
	for b := x.heads[fl][sl]; b != nil; b = b.nextFree {
		if b.size > max {
			max = b.size
		}
	}
	return max
}
