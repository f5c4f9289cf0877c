package pool

import (
	"errors"
	"fmt"
)

func isOOM(err error) bool { return errors.Is(err, ErrOutOfMemory) }

// spill serves a request from host memory.
func (p *Pool) spill(size uint64) (uint64, error) {
	if p.hostBytes+size > p.opt.HostLimit {
		p.stats.Refused++
		if p.obs != nil {
			p.obs.Refuse(size, p.devBytes, p.opt.Quota)
		}
		return 0, fmt.Errorf("pool: spilling %d bytes with %d of a %d-byte host limit used: %w: %w",
			size, p.hostBytes, p.opt.HostLimit, ErrHostLimit, ErrOutOfMemory)
	}
	tier := p.opt.SpillTier
	base, err := p.host.ReserveHost(size, tier)
	if err != nil {
		p.stats.BackingErrors++
		return 0, fmt.Errorf("pool: spilling %d bytes to %v host memory: %w", size, tier, err)
	}
	b := p.newBlock()
	b.base, b.size, b.used, b.state, b.tier = base, size, size, stateLive, tier
	if tier == TierManaged {
		p.spilled.push(b)
	}
	p.hostBytes += size
	p.stats.SpilledBytes += size
	p.stats.PeakSpilledBytes = max(p.stats.PeakSpilledBytes, p.stats.SpilledBytes)
	p.stats.SpilledTotal += size
	if p.obs != nil {
		p.obs.Spill(base, size, tier)
	}
	p.addLive(b, SourceDevice)
	return base, nil
}

// Promote moves spilled managed blocks back to the device while the quota
// holds them, releasing empty cached segments to make room, and returns how
// many bytes moved. The pool also runs it after every free.
func (p *Pool) Promote() (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	before := p.stats.PromotedTotal
	err := p.promote()
	return p.stats.PromotedTotal - before, err
}

// promoteAfterFree promotes after a free or an announced synchronization,
// which succeeded whatever the promotion does: a failure is counted in
// Stats.BackingErrors and told to a FailureObserver, never returned.
func (p *Pool) promoteAfterFree() {
	if err := p.promote(); err != nil {
		if f, ok := p.obs.(FailureObserver); ok {
			f.BackingFailed(err)
		}
	}
}

// promote applies the promotion policy: oldest spilled first, stopping at the
// first block that cannot fit even with every empty segment released, so a
// large old block is never overtaken by younger small ones.
func (p *Pool) promote() error {
	for b := p.spilled.head; b != nil; b = p.spilled.head {
		if p.devBytes-p.releasableBytes()+b.size > p.opt.Quota {
			return nil
		}
		p.releaseEmptyWhile(func() bool { return p.devBytes+b.size > p.opt.Quota })
		if p.devBytes+b.size > p.opt.Quota {
			return nil
		}
		if err := p.host.Promote(b.base, b.size); err != nil {
			p.stats.BackingErrors++
			return fmt.Errorf("pool: promoting the %d-byte block at %#x: %w", b.size, b.base, err)
		}
		p.spilled.remove(b)
		b.promoted = true
		p.hostBytes -= b.size
		p.stats.SpilledBytes -= b.size
		p.addDevice(b.size)
		p.stats.PromotedBytes += b.size
		p.stats.PromotedTotal += b.size
		if p.obs != nil {
			p.obs.Promote(b.base, b.size, b.tier)
		}
	}
	return nil
}
