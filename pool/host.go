package pool

import (
	"errors"
	"fmt"
)

func isOOM(err error) bool { return errors.Is(err, ErrOutOfMemory) }

// spill serves a request from host memory: the quota could not hold it, or
// with deviceFull the device could not, below the quota.
func (p *Pool) spill(size uint64, deviceFull bool) (uint64, error) {
	if p.hostBytes+size > p.opt.HostLimit {
		p.countRefusal(size)
		return 0, spillFailed(deviceFull, fmt.Errorf("pool: spilling %d bytes with %d of a %d-byte host limit used: %w: %w",
			size, p.hostBytes, p.opt.HostLimit, ErrHostLimit, ErrOutOfMemory))
	}
	tier := p.opt.SpillTier
	base, err := p.host.ReserveHost(size, tier)
	if err != nil {
		if isOOM(err) {
			p.countRefusal(size) // the host, not the host limit, is full
		} else {
			p.stats.BackingErrors++
		}
		return 0, spillFailed(deviceFull, fmt.Errorf("pool: spilling %d bytes to %v host memory: %w", size, tier, err))
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

// spillFailed is err, a spill's failure, wrapping ErrDeviceFull when the
// device, not the quota, had no room for the request.
func spillFailed(deviceFull bool, err error) error {
	if deviceFull {
		return fmt.Errorf("%w: %w", err, ErrDeviceFull)
	}
	return err
}

// TakeHost admits size bytes of host memory that the application holds
// outside the pool on this device's behalf (physical memory it asked on the
// device, placed on the host because the quota could not hold it) against
// the host limit the pool's own spills use (Stats.HostOutside counts them).
// It fails, counting nothing, without Options.Oversubscribe or when the host
// limit cannot hold them (ErrHostLimit, wrapping ErrOutOfMemory).
func (p *Pool) TakeHost(size uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return ErrClosed
	case !p.opt.Oversubscribe:
		return fmt.Errorf("pool: %d bytes on the host: oversubscription is off: %w", size, ErrOutOfMemory)
	case p.hostBytes+size > p.opt.HostLimit:
		return fmt.Errorf("pool: %d bytes on the host with %d of a %d-byte host limit used: %w: %w",
			size, p.hostBytes, p.opt.HostLimit, ErrHostLimit, ErrOutOfMemory)
	}
	p.hostBytes += size
	p.stats.HostOutside += size
	return nil
}

// GiveHost returns size bytes admitted by TakeHost, never more than are
// held: a caller that outlived the pool it took them from (Close forgets
// them) may give them to the pool made after it. After Close nothing is
// returned.
func (p *Pool) GiveHost(size uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	size = min(size, p.stats.HostOutside)
	p.hostBytes -= size
	p.stats.HostOutside -= size
}

// Promote runs a promotion pass (see promote) and returns how many bytes it
// moved. If a pass is running in another thread, it waits for that one to
// end and then runs its own. The shim calls it at points of its own where
// the calling thread may wait for the device.
func (p *Pool) Promote() (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.promoting && !p.closed {
		p.cond.Wait()
	}
	if p.closed {
		return 0, ErrClosed
	}
	before := p.stats.PromotedTotal
	err := p.promote()
	return p.stats.PromotedTotal - before, err
}

// promoteQuietly runs a promotion pass after an announced synchronization,
// which succeeded whatever the pass does: a failure is counted and told to
// a FailureObserver, never returned. If a pass is running already, it
// leaves the work to that one.
func (p *Pool) promoteQuietly() {
	if p.promoting {
		return
	}
	if err := p.promote(); err != nil {
		p.tellFailure(err)
	}
}

// promote applies the promotion policy: oldest spilled first, stopping at the
// first block that cannot fit even with every empty segment released, so a
// large old block is never overtaken by younger small ones. Each move
// (HostBacking.Promote) runs with the lock released, its device bytes
// counted beforehand so that no allocation takes the room meanwhile; a
// block freed during its move is released when the move returns. The pass
// stops at the first failure. A failure wrapping ErrNotMoved, ErrOutOfMemory
// or ErrStreamCapture moved nothing: the block stays first in line. Any other
// failure leaves the block where it may be on the device: it is counted
// there, as promoted, from then on, so the quota holds whatever happened.
// The caller holds the lock and no other pass is running.
func (p *Pool) promote() error {
	p.promoting = true
	defer func() {
		p.promoting = false
		p.cond.Broadcast()
	}()
	for !p.closed {
		b := p.spilled.head
		if b == nil || p.ledger.Headroom()+p.releasableBytes() < b.size {
			return nil
		}
		p.releaseEmptyWhile(func(uint64) bool { return p.ledger.Headroom() < b.size })
		if !p.ledger.Take(b.size) {
			return nil
		}
		p.spilled.remove(b)
		p.addDevice(b.size)
		b.moving = true
		p.mu.Unlock()
		err := p.host.Promote(b.base, b.size)
		p.mu.Lock()
		b.moving = false
		if err != nil && (errors.Is(err, ErrNotMoved) || isOOM(err) || errors.Is(err, ErrStreamCapture)) {
			p.subDevice(b.size)
			if errors.Is(err, ErrStreamCapture) {
				p.stats.CaptureSkips++
			} else {
				p.stats.BackingErrors++
			}
			if b.freedMoving {
				p.releaseFreedMoving(b)
			} else {
				p.spilled.pushFront(b)
			}
			return fmt.Errorf("pool: promoting the %d-byte block at %#x: %w", b.size, b.base, err)
		}
		b.promoted = true
		p.hostBytes -= b.size
		p.stats.SpilledBytes -= b.size
		p.stats.PromotedBytes += b.size
		if err == nil {
			p.stats.PromotedTotal += b.size
			if p.obs != nil {
				p.obs.Promote(b.base, b.size, b.tier)
			}
		} else {
			p.stats.BackingErrors++
		}
		if b.freedMoving {
			p.releaseFreedMoving(b)
		}
		if err != nil {
			return fmt.Errorf("pool: promoting the %d-byte block at %#x failed, counted on the device: %w", b.size, b.base, err)
		}
	}
	return nil
}

// releaseFreedMoving releases a block freed during its move. Nobody is left
// to retry a failed release: the block stays counted and Close tries again.
func (p *Pool) releaseFreedMoving(b *block) {
	var s *Stream
	if b.freedAsync {
		s = &b.freeStream
	}
	if err := p.releaseUnpooled(b, s); err != nil {
		p.tellFailure(err)
		p.unreleased = append(p.unreleased, b)
	}
}
