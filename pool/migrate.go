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
	// order lists the host granules in the order they were spilled; an
	// entry whose granule went back to the host or to the device since (its
	// spill number differs) is skipped, and dropped when the list is
	// compacted.
	order []spillEntry
}

// spillEntry is the n-th Spill, reported for granule g.
type spillEntry struct {
	g *granule
	n uint64
}

// current reports whether s is the granule's Spill still in force.
func (s spillEntry) current() bool { return s.g.spillN == s.n }

// spilledGranule counts the host granule g, now holding the application's
// bytes, as spilled and reports it to the Observer. A host granule made for
// a placement or a move that then fails never comes here: it was never
// spilled, only made and given back.
func (p *Pool) spilledGranule(g *granule) {
	v := p.virt
	p.stats.PeakSpilledBytes = max(p.stats.PeakSpilledBytes, p.stats.SpilledBytes)
	p.stats.SpilledTotal += v.gran
	v.spills++
	v.spilledNow++
	g.spillN = v.spills
	if m := p.migration; m != nil {
		if len(m.order) > 2*v.spilledNow+64 {
			m.order = slices.DeleteFunc(m.order, func(s spillEntry) bool { return !s.current() })
		}
		m.order = append(m.order, spillEntry{g, v.spills})
	}
	if p.obs != nil {
		p.obs.Spill(g.va, v.gran, TierPinned)
	}
}

// migrate runs after an announced synchronization and ends the interval
// since the previous one. The pool knows where blocks are handed out, not
// where queued work reads and writes, so a granule a block was handed out
// on in the interval counts as hot, and the others as cold, the longer the
// colder. In order:
//
//  1. Hot host granules are promoted, oldest spilled first, and the
//     device keeps room for the interval's short-lived blocks: the
//     granules the interval held at its peak and gave back by its end.
//     Where free and idle granules and the ledger's headroom fall short of
//     both, the coldest device granules holding live blocks are demoted.
//  2. While more room is left than that reserve, the other host granules
//     are promoted, oldest spilled first.
//
// Nothing moves if a block freed during the synchronization is still
// pending or stream-owned: another thread is at work, whose queued work
// could be using any block. A failed move ends the pass; it is counted and
// told to a FailureObserver.
func (p *Pool) migrate() {
	v := p.virt
	reserve := int(v.inUsePeak - v.inUse)
	v.inUsePeak = v.inUse
	epoch := v.epoch
	v.epoch++
	if p.pending.bytes > 0 || p.streamBytes() > 0 {
		return
	}
	var hot, cold []*granule
	for _, s := range p.migration.order {
		switch {
		case !s.current():
		case s.g.hot == epoch:
			hot = append(hot, s.g)
		default:
			cold = append(cold, s.g)
		}
	}
	moved := p.stats.DemotedTotal + p.stats.PromotedTotal
	var err error
	if short := reserve + len(hot) - p.deviceRoom(); short > 0 {
		err = p.demote(short, epoch)
	}
	if err == nil {
		err = p.promoteGranules(hot, 0)
	}
	if err == nil {
		err = p.promoteGranules(cold, reserve)
	}
	if p.stats.DemotedTotal+p.stats.PromotedTotal != moved {
		p.countHostLive()
	}
	if err != nil {
		p.tellFailure(err)
	}
}

// countHostLive counts the bytes of live blocks on host granules again, once
// granules have moved between device and host under live blocks.
func (p *Pool) countHostLive() {
	v := p.virt
	v.hostLive = 0
	for _, seg := range p.segs {
		if seg.granules == nil {
			continue
		}
		for b := seg.head; b != nil; b = b.nextPhys {
			if b.state == stateLive {
				v.hostLive += v.hostShare(seg, b.base, b.size)
			}
		}
	}
}

// deviceRoom is how many granules of device memory the pool can map without
// unmapping a used one: free and idle granules, and the ledger's headroom.
func (p *Pool) deviceRoom() int {
	v := p.virt
	return len(v.free) + v.idle.n + int(p.ledger.Headroom()>>v.shift)
}

// demote moves n device granules holding live blocks to host memory,
// coldest first (ties: lowest address), never one that is hot in the
// interval that just ended, and stops early at the host limit.
func (p *Pool) demote(n int, epoch uint64) error {
	v := p.virt
	var cands []*granule
	for _, seg := range p.segs {
		if seg.granules == nil {
			continue
		}
		// Blocks lie in address order, so a granule shared by consecutive
		// live blocks comes up twice in a row.
		var last *granule
		for b := seg.head; b != nil; b = b.nextPhys {
			if b.state != stateLive {
				continue
			}
			first, end := v.granuleRange(seg, b.base, b.size)
			for i := first; i <= end; i++ {
				if g := &seg.granules[i]; g != last && !g.host && g.hot != epoch {
					cands = append(cands, g)
					last = g
				}
			}
		}
	}
	slices.SortFunc(cands, func(a, b *granule) int {
		return cmp.Or(cmp.Compare(a.hot, b.hot), cmp.Compare(a.va, b.va))
	})
	for _, g := range cands[:min(n, len(cands))] {
		if err := p.demoteGranule(g); errors.Is(err, errNoPhysical) {
			return nil // the host limit is reached
		} else if err != nil {
			return err
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
		p.releaseHostGranule(h)
		return fmt.Errorf("pool: demoting the granule at %#x: %w", g.va, err)
	}
	v.free = append(v.free, g.handle)
	g.handle, g.host = h, true
	p.stats.DemotedTotal += v.gran
	p.spilledGranule(g)
	return nil
}

// promoteGranules moves host granules back to device memory, in order, while the
// device has more than keep granules of room.
func (p *Pool) promoteGranules(granules []*granule, keep int) error {
	v := p.virt
	for _, g := range granules {
		if p.deviceRoom() <= keep {
			return nil
		}
		h, err := p.takePhysical()
		if errors.Is(err, errNoPhysical) {
			return nil // the ledger is shared: its headroom shrank
		}
		if err != nil {
			return fmt.Errorf("pool: promoting the granule at %#x: %w", g.va, err)
		}
		if err := p.migration.mover.MoveGranule(g.va, v.gran, g.handle, h); err != nil {
			p.stats.BackingErrors++
			v.free = append(v.free, h)
			return fmt.Errorf("pool: promoting the granule at %#x: %w", g.va, err)
		}
		host := g.handle
		g.handle, g.host = h, false
		p.releaseHostGranule(host)
		g.spillN = 0
		v.spilledNow--
		p.stats.PromotedTotal += v.gran
		if p.obs != nil {
			p.obs.Promote(g.va, v.gran, TierPinned)
		}
	}
	return nil
}
