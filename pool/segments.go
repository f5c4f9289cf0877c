package pool

// Segments: reserving and releasing them, and returning blocks to their
// free index.

import (
	"cmp"
	"fmt"
	"slices"
)

// descriptorSlab is how many descriptors are allocated together. Slabs keep
// descriptors dense in memory and the garbage collector's object count low;
// a descriptor is never returned to the heap, only to the spare list, so a
// slab lives as long as the pool.
const descriptorSlab = 256

func (p *Pool) newBlock() *block {
	if p.spare == nil {
		slab := make([]block, descriptorSlab)
		for i := range slab[:len(slab)-1] {
			slab[i].nextFree = &slab[i+1]
		}
		p.spare = &slab[0]
	}
	b := p.spare
	p.spare = b.nextFree
	b.nextFree = nil
	return b
}

func (p *Pool) recycle(b *block) {
	*b = block{nextFree: p.spare}
	p.spare = b
}

// grow reserves a segment of size bytes for class and returns its single free
// block, already in the class index.
func (p *Pool) grow(size uint64, class int) (*block, error) {
	if !p.ledger.Take(size) {
		return nil, fmt.Errorf("pool: reserving a %d-byte segment: %w", size, errNoRoom)
	}
	base, err := p.back.Reserve(size)
	if err != nil {
		p.ledger.Give(size)
		if !isOOM(err) {
			p.stats.BackingErrors++
		}
		return nil, fmt.Errorf("pool: reserving a %d-byte segment: %w", size, err)
	}
	if base%Alignment != 0 || base == 0 {
		p.stats.BackingErrors++
		relErr := p.back.Release(base, size)
		if relErr == nil {
			p.ledger.Give(size)
		} else {
			// Still held: counted until Close, which gives it back.
			p.stats.ReleaseErrors++
			p.addDevice(size)
		}
		return nil, fmt.Errorf("pool: backing returned segment %#x, not aligned to %d bytes (release: %v)", base, Alignment, relErr)
	}
	seg := &segment{base: base, size: size, class: class}
	b := p.newBlock()
	b.base, b.size, b.seg, b.state = base, size, seg, stateFree
	seg.head = b
	i, _ := slices.BinarySearchFunc(p.segs, base, bySegmentBase)
	p.segs = slices.Insert(p.segs, i, seg)
	p.idx[class].insert(b)
	p.empty.push(seg)
	p.segBytes += size
	p.addDevice(size)
	p.stats.Segments++
	return b, nil
}

// errNoRoom says that the ledger did not admit the bytes a reservation
// needs: the quota is full, not the device.
var errNoRoom = fmt.Errorf("the ledger has no room: %w: %w", ErrQuota, ErrOutOfMemory)

// addDevice counts size device bytes the ledger admitted and the pool now holds.
func (p *Pool) addDevice(size uint64) {
	p.devBytes += size
	p.stats.PeakReservedBytes = max(p.stats.PeakReservedBytes, p.devBytes)
	p.stats.HighReservedBytes = max(p.stats.HighReservedBytes, p.devBytes)
}

// subDevice counts size device bytes released and gives them back to the ledger.
func (p *Pool) subDevice(size uint64) {
	p.devBytes -= size
	p.ledger.Give(size)
}

// releaseSegment returns an empty segment to the device.
func (p *Pool) releaseSegment(seg *segment) error {
	b := seg.head
	p.empty.remove(seg)
	if err := p.back.Release(seg.base, seg.size); err != nil {
		// The segment's state is unknown: keep it, but never try again.
		seg.pinned = true
		p.stats.ReleaseErrors++
		return fmt.Errorf("pool: releasing the %d-byte segment at %#x: %w", seg.size, seg.base, err)
	}
	p.idx[seg.class].remove(b)
	p.recycle(b)
	i, _ := slices.BinarySearchFunc(p.segs, seg.base, bySegmentBase)
	p.segs = slices.Delete(p.segs, i, i+1)
	p.segBytes -= seg.size
	p.subDevice(seg.size)
	p.stats.Segments--
	p.stats.SegmentsReleased++
	p.stats.BytesReleased += seg.size
	return nil
}

// releaseEmptyWhile releases empty segments, oldest emptied first, then
// free and idle granules, each where cond holds for its size; it stops once
// cond fails for every size (for size 0). A segment cond refuses for its
// size is kept and the next one tried (TrimTo's floor). A failed release is
// counted, told to a FailureObserver, and skipped.
func (p *Pool) releaseEmptyWhile(cond func(size uint64) bool) {
	for seg := p.empty.head; seg != nil && cond(0); {
		next := seg.nextEmpty
		if cond(seg.size) {
			if err := p.releaseSegment(seg); err != nil {
				p.tellFailure(err)
			}
		}
		seg = next
	}
	if v := p.virt; v != nil {
		p.releaseGranulesWhile(func() bool { return cond(v.gran) })
	}
}

// trim applies the release threshold.
func (p *Pool) trim() {
	p.releaseEmptyWhile(func(uint64) bool { return p.cachedBytes() > p.opt.ReleaseThreshold })
}

// makeFree returns a block to its class index, merging it with free
// neighbours, and notes an empty segment.
func (p *Pool) makeFree(b *block) {
	seg := b.seg
	base, size := b.base, b.size // the bytes made free, before merging
	idx := &p.idx[seg.class]
	if prev := b.prevPhys; prev != nil && prev.state == stateFree {
		idx.remove(prev)
		p.absorbPrev(b)
	}
	if next := b.nextPhys; next != nil && next.state == stateFree {
		idx.remove(next)
		p.absorbNext(b)
	}
	b.state = stateFree
	b.cache = nil
	idx.insert(b)
	if seg.granules != nil && p.virt.leftWhole(b, base, size) {
		p.granulesLeft(b, base, size)
	}
	if b.prevPhys == nil && b.nextPhys == nil { // the segment is empty
		if seg.granules != nil {
			p.arenaEmptied(b)
		} else if !seg.pinned {
			p.empty.push(seg)
		}
	}
}

// reserveAtFirstUse reserves Options.Reserve as one pinned segment.
func (p *Pool) reserveAtFirstUse() error {
	size := alignUp(p.opt.Reserve, Alignment)
	b, err := p.grow(size, classMedium)
	if err != nil {
		return fmt.Errorf("pool: reserve of %d bytes at first use: %w", size, err)
	}
	b.seg.pinned = true
	p.empty.remove(b.seg)
	p.reserved = true
	return nil
}

// bySegmentBase orders p.segs, which are sorted by base address.
func bySegmentBase(s *segment, base uint64) int {
	return cmp.Compare(s.base, base)
}

// absorbPrev merges b's physical predecessor, already taken out of every
// index and queue, into b.
func (p *Pool) absorbPrev(b *block) {
	prev := b.prevPhys
	b.base = prev.base
	b.size += prev.size
	b.prevPhys = prev.prevPhys
	if b.prevPhys != nil {
		b.prevPhys.nextPhys = b
	} else {
		b.seg.head = b
	}
	p.recycle(prev)
}

// absorbNext merges b's physical successor, already taken out of every index
// and queue, into b.
func (p *Pool) absorbNext(b *block) {
	next := b.nextPhys
	b.size += next.size
	b.nextPhys = next.nextPhys
	if b.nextPhys != nil {
		b.nextPhys.prevPhys = b
	}
	p.recycle(next)
}
