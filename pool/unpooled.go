package pool

// Allocations outside segments: pass-through reservations and the bookkeeping
// shared with spilled blocks.

import "fmt"

// passThrough reserves one allocation directly from the backing.
func (p *Pool) passThrough(size uint64, async bool, s Stream) (uint64, error) {
	if !p.ledger.Take(size) {
		if p.opt.Oversubscribe {
			return p.spill(size, false)
		}
		return 0, p.refuse(size, nil)
	}
	var base uint64
	var err error
	if async && p.ordered != nil {
		base, err = p.ordered.ReserveAsync(size, s)
	} else {
		base, err = p.back.Reserve(size)
	}
	if err != nil {
		p.ledger.Give(size)
		if p.opt.Oversubscribe && isOOM(err) {
			return p.spill(size, true)
		}
		if isOOM(err) {
			return 0, p.refuse(size, err)
		}
		p.stats.BackingErrors++
		return 0, fmt.Errorf("pool: pass-through reservation of %d bytes: %w", size, err)
	}
	b := p.newBlock()
	b.base, b.size, b.used, b.state = base, size, size, stateLive
	p.addDevice(size)
	p.stats.PassThrough++
	p.addLive(b, SourcePassThrough)
	return base, nil
}

func (p *Pool) addLive(b *block, src Source) {
	p.live.put(b)
	p.stats.LiveBytes += b.used
	p.stats.LiveBlocks++
	p.stats.PeakLiveBytes = max(p.stats.PeakLiveBytes, p.stats.LiveBytes)
	p.stats.HighLiveBytes = max(p.stats.HighLiveBytes, p.stats.LiveBytes)
	if p.obs != nil {
		p.obs.Alloc(b.base, b.used, b.tier, src)
	}
}

// freeUnpooled frees a pass-through or spilled block takeLive has taken; s
// is the stream of FreeAsync, or nil for Free. A block whose release fails
// stays live, so that the application's retry releases it. A block being
// promoted is released when its move returns.
func (p *Pool) freeUnpooled(b *block, s *Stream) error {
	if b.moving {
		b.freedMoving = true
		if s != nil {
			b.freedAsync, b.freeStream = true, *s
		}
		return nil
	}
	if err := p.releaseUnpooled(b, s); err != nil {
		p.revive(b)
		return err
	}
	return nil
}

// releaseUnpooled releases a block outside segments and forgets it. A
// failure is counted and changes nothing else.
func (p *Pool) releaseUnpooled(b *block, s *Stream) error {
	var err error
	switch {
	case b.tier == TierDevice:
		if s != nil && p.ordered != nil {
			err = p.ordered.ReleaseAsync(b.base, b.size, *s)
		} else {
			err = p.back.Release(b.base, b.size)
		}
	default:
		err = p.host.ReleaseHost(b.base, b.size, b.tier, s)
	}
	if err != nil {
		p.stats.ReleaseErrors++
		return fmt.Errorf("pool: releasing the %d-byte %v allocation at %#x: %w", b.size, b.tier, b.base, err)
	}
	switch {
	case b.tier == TierDevice:
		p.subDevice(b.size)
	case b.promoted:
		p.subDevice(b.size)
		p.stats.PromotedBytes -= b.size
	default:
		if b.tier == TierManaged && !b.freedMoving {
			p.spilled.remove(b)
		}
		p.hostBytes -= b.size
		p.stats.SpilledBytes -= b.size
	}
	p.recycle(b)
	return nil
}
