package pool

// Migration: the granules of live blocks move between the device and the
// host at announced synchronizations. See "Migration" in the package
// documentation.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// GranuleMover is implemented by a VirtualBacking that can move the memory
// behind a mapped address, as Options.Migrate needs.
type GranuleMover interface {
	// MoveGranule copies the size bytes mapped at va, the physical memory
	// of handle from, into handle to, which is mapped nowhere, and maps to
	// at va in place of from, with the same access; from is then mapped
	// nowhere and the address has not changed. The pool calls it only
	// when no queued work may use the range. On failure va still maps
	// from, with its contents, and to is mapped nowhere.
	MoveGranule(va, size, from, to uint64) error
}

// migration is the state of Options.Migrate.
type migration struct {
	mover GranuleMover
	// nextBorn stamps each block handed out (block.born), so that the
	// oldest blocks are demoted first.
	nextBorn uint64
	// order lists the host granules (virtualMemory.spilled) in the order
	// they were spilled; those that went back to the host since are
	// skipped, and dropped when the list is compacted.
	order []uint64
}

func (m *migration) handed(b *block) {
	b.born = m.nextBorn
	m.nextBorn++
}

// spilledGranule reports the host granule at va to the Observer.
func (p *Pool) spilledGranule(va uint64) {
	v := p.virt
	v.spilled[va] = struct{}{}
	if m := p.migration; m != nil {
		if len(m.order) > 2*len(v.spilled)+64 {
			m.order = slices.DeleteFunc(m.order, func(a uint64) bool { _, ok := v.spilled[a]; return !ok })
		}
		m.order = append(m.order, va)
	}
	if p.obs != nil {
		p.obs.Spill(va, v.gran, TierPinned)
	}
}

// migrate runs after an announced synchronization: it makes the device's
// room (free and idle granules and the ledger's headroom) match what the
// interval that just ended needed for its short-lived blocks, by demoting
// granules of the oldest live blocks to the host when the room is short, or
// by promoting spilled granules, oldest spilled first, while more than a
// granule is left over. Nothing moves if a block freed during the
// synchronization is still pending or stream-owned: then another thread is
// at work, whose queued work could be using any block. A failed move ends
// the pass; it is counted and told to a FailureObserver.
func (p *Pool) migrate() {
	v := p.virt
	// The granules the interval held at its peak and gave back by its end
	// are what its short-lived blocks needed, stream-owned and pending
	// ones included.
	reserve := (v.inUsePeak - v.inUse) << v.shift
	v.inUsePeak = v.inUse
	if p.pending.bytes > 0 || p.streamBytes() > 0 {
		return
	}
	room := uint64(len(v.free)+v.idle.n)<<v.shift + p.ledger.Headroom()&^(v.gran-1)
	var err error
	switch {
	case room < reserve:
		err = p.demote(reserve - room)
	case room >= reserve+v.gran:
		err = p.promoteGranules(room - reserve)
	}
	if err != nil {
		p.tellFailure(err)
	}
}

// demote moves the device granules of live blocks to host memory, oldest
// block first, until need bytes of device memory are free or the host
// limit is reached.
func (p *Pool) demote(need uint64) error {
	v := p.virt
	var blocks []*block
	for _, seg := range p.segs {
		if seg.granules == nil {
			continue
		}
		for b := seg.head; b != nil; b = b.nextPhys {
			if b.state == stateLive {
				blocks = append(blocks, b)
			}
		}
	}
	slices.SortFunc(blocks, func(a, b *block) int { return cmp.Compare(a.born, b.born) })
	var freed uint64
	for _, b := range blocks {
		first, last := v.granuleRange(b.seg, b.base, b.size)
		for i := first; i <= last; i++ {
			if freed >= need || p.hostBytes+v.gran > p.opt.HostLimit {
				return nil
			}
			g := &b.seg.granules[i]
			if !g.mapped || g.host {
				continue
			}
			if err := p.demoteGranule(g); err != nil {
				return err
			}
			freed += v.gran
		}
	}
	return nil
}

// demoteGranule moves the memory of device granule g to a new host granule,
// and keeps the device granule free.
func (p *Pool) demoteGranule(g *granule) error {
	v := p.virt
	h, err := p.createHostGranule()
	if err != nil {
		return fmt.Errorf("pool: demoting the granule at %#x: %w", g.va, err)
	}
	if err := p.migration.mover.MoveGranule(g.va, v.gran, g.handle, h); err != nil {
		p.stats.BackingErrors++
		p.stats.SpilledTotal -= v.gran
		p.releaseHostGranule(h)
		return fmt.Errorf("pool: demoting the granule at %#x: %w", g.va, err)
	}
	v.free = append(v.free, g.handle)
	g.handle, g.host = h, true
	p.stats.DemotedTotal += v.gran
	p.spilledGranule(g.va)
	return nil
}

// promoteGranules moves host granules back to device memory, oldest
// spilled first, while spare bytes are left.
func (p *Pool) promoteGranules(spare uint64) error {
	v := p.virt
	m := p.migration
	for ; len(m.order) > 0 && spare >= v.gran; m.order = m.order[1:] {
		va := m.order[0]
		if _, ok := v.spilled[va]; !ok {
			continue // gone back to the host since
		}
		seg := p.segmentOf(va)
		g := &seg.granules[(va-seg.base)>>v.shift]
		h, err := p.takePhysical()
		if errors.Is(err, errNoPhysical) {
			return nil // the ledger is shared: its headroom shrank
		}
		if err != nil {
			return fmt.Errorf("pool: promoting the granule at %#x: %w", va, err)
		}
		if err := m.mover.MoveGranule(va, v.gran, g.handle, h); err != nil {
			p.stats.BackingErrors++
			v.free = append(v.free, h)
			return fmt.Errorf("pool: promoting the granule at %#x: %w", va, err)
		}
		host := g.handle
		g.handle, g.host = h, false
		p.releaseHostGranule(host)
		delete(v.spilled, va)
		p.stats.PromotedTotal += v.gran
		if p.obs != nil {
			p.obs.Promote(va, v.gran, TierPinned)
		}
		spare -= v.gran
	}
	return nil
}
