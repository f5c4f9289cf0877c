package pool

// Reclaiming freed blocks: synchronizations and stream markers.

import "fmt"

// synchronize synchronizes the device and makes reusable every block freed
// before it began.
func (p *Pool) synchronize() error {
	cut := p.seq
	if err := p.back.Synchronize(); err != nil {
		p.stats.BackingErrors++
		return fmt.Errorf("pool: synchronizing the device: %w", err)
	}
	p.stats.Syncs++
	made := p.completeBefore(cut)
	if p.obs != nil {
		p.obs.Sync(made)
	}
	p.trim()
	return nil
}

// completeBefore makes reusable every pending or stream-owned block freed
// with seq < cut, and returns their bytes.
func (p *Pool) completeBefore(cut uint64) uint64 {
	var made uint64
	for b := p.pending.head; b != nil && b.seq < cut; b = p.pending.head {
		p.pending.remove(b)
		p.pendingBytes[b.seg.class] -= b.size
		made += b.size
		p.makeFree(b)
	}
	for _, c := range p.streamOrder {
		made += p.drain(c, cut)
		if c.hasMarker && c.markerCut <= cut {
			p.back.DestroyMarker(c.marker)
			c.hasMarker = false
		}
	}
	return made
}

// drain moves the blocks of a stream cache freed before cut to the pool.
func (p *Pool) drain(c *streamCache, cut uint64) uint64 {
	var made uint64
	for b := c.queue.head; b != nil && b.seq < cut; b = c.queue.head {
		c.queue.remove(b)
		c.idx[b.seg.class].remove(b)
		made += b.size
		p.makeFree(b)
	}
	return made
}

func (p *Pool) streamBytes() uint64 {
	var n uint64
	for _, c := range p.streamOrder {
		n += c.queue.bytes
	}
	return n
}

func (p *Pool) recordMarker(c *streamCache) error {
	m, err := p.back.RecordMarker(c.stream)
	if err != nil {
		p.stats.BackingErrors++
		return fmt.Errorf("pool: recording a marker on stream %#x: %w", uint64(c.stream), err)
	}
	c.marker, c.markerCut, c.hasMarker = m, p.seq, true
	p.stats.Markers++
	return nil
}

// pollMarkers moves the blocks covered by completed markers to the pool and
// records new markers for what remains. It reports whether any block moved.
// Backing errors leave the blocks where they are, to be reclaimed by the next
// synchronization, and are counted in the stats.
func (p *Pool) pollMarkers() bool {
	moved := false
	for _, c := range p.streamOrder {
		if c.hasMarker {
			done, err := p.back.MarkerDone(c.marker)
			if err != nil {
				p.stats.BackingErrors++
				continue
			}
			if !done {
				continue
			}
			p.back.DestroyMarker(c.marker)
			c.hasMarker = false
			if p.drain(c, c.markerCut) > 0 {
				moved = true
			}
		}
		if c.queue.head != nil {
			_ = p.recordMarker(c) // counted in BackingErrors
		}
	}
	if moved {
		p.trim()
	}
	return moved
}
