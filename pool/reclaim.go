package pool

// Reclaiming freed blocks: synchronizations and stream markers.

import (
	"errors"
	"fmt"
)

// synchronize makes reusable every block freed before the call, through a
// device synchronization made with the lock released. Only one is in flight:
// a caller whose frees the one in flight covers waits for it; a caller whose
// frees came after it began waits for it to end and then starts the next,
// which covers every caller waiting by then. A failed synchronization is
// tried again only by a caller that did not start it, once. It returns an
// error wrapping ErrStreamCapture when the Backing refused because of stream
// capture, and ErrClosed when the pool was closed meanwhile.
func (p *Pool) synchronize() error {
	cut := p.seq
	for {
		if p.closed {
			return ErrClosed
		}
		if p.syncedCut >= cut {
			return nil
		}
		if !p.syncing {
			break
		}
		p.cond.Wait()
	}
	cut = p.seq // a synchronization beginning now covers every free so far
	p.syncing = true
	p.mu.Unlock()
	err := p.back.Synchronize()
	p.mu.Lock()
	p.syncing = false
	p.cond.Broadcast()
	if p.closed {
		return ErrClosed
	}
	if err != nil {
		if errors.Is(err, ErrStreamCapture) {
			p.stats.CaptureSkips++
		} else {
			p.stats.BackingErrors++
		}
		return fmt.Errorf("pool: synchronizing the device: %w", err)
	}
	p.stats.Syncs++
	p.synced(cut)
	return nil
}

// synced completes a synchronization that began at cut: it makes reusable
// every pending or stream-owned block freed with seq < cut, except those of
// foreign streams, reports them and applies the release threshold.
func (p *Pool) synced(cut uint64) {
	p.syncedCut = max(p.syncedCut, cut)
	var made uint64
	for b := p.pending.head; b != nil && b.seq < cut; b = p.pending.head {
		p.pending.remove(b)
		p.pendingBytes[b.seg.class] -= b.size
		made += b.size
		p.makeFree(b)
	}
	for c := p.caches.head; c != nil; {
		next := c.next
		if !c.foreign {
			made += p.drain(c, cut)
			if c.hasMarker && c.markerCut <= cut {
				p.destroyMarker(c)
			}
		}
		p.dropIfDrained(c)
		c = next
	}
	if p.obs != nil {
		p.obs.Sync(made)
	}
	p.trim()
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

// drainIdleStreams makes free the blocks freed on streams that have run all
// the work queued on them, as the Backing says without waiting: what the
// application's own cudaStreamSynchronize or event wait completed, which
// the pool does not see.
func (p *Pool) drainIdleStreams() {
	for c := p.caches.head; c != nil; c = c.next {
		if c.queue.head != nil && !c.detached {
			p.drainIfIdle(c)
		}
	}
}

// drainIfIdle makes free the blocks of c if its stream has run all the work
// queued on it, and returns the bytes it made free.
func (p *Pool) drainIfIdle(c *streamCache) uint64 {
	ib, ok := p.back.(IdleStreamBacking)
	if !ok {
		return 0
	}
	idle, err := ib.StreamIdle(c.stream)
	if err != nil {
		p.backingFailed(fmt.Errorf("pool: querying stream %#x: %w", uint64(c.stream), err))
		return 0
	}
	if !idle {
		return 0
	}
	return p.drain(c, p.seq)
}

// dropIfDrained drops a stream cache found with no block and no marker at
// two reclaims in a row: a stream in use, refilled between reclaims, keeps
// its cache instead of making a new one at every free.
func (p *Pool) dropIfDrained(c *streamCache) {
	if c.queue.head != nil || c.hasMarker {
		c.idle = false
	} else if c.idle {
		p.dropCache(c)
	} else {
		c.idle = true
	}
}

// syncableBytes is what a synchronization of the device can make reusable:
// the bytes freed by Free and those freed on streams the synchronization
// covers. The blocks of foreign streams wait for their markers whatever it
// does, so a synchronization for them alone waits for the device in vain.
func (p *Pool) syncableBytes() uint64 {
	n := p.pending.bytes
	for c := p.caches.head; c != nil; c = c.next {
		if !c.foreign {
			n += c.queue.bytes
		}
	}
	return n
}

func (p *Pool) streamBytes() uint64 {
	var n uint64
	for c := p.caches.head; c != nil; c = c.next {
		n += c.queue.bytes
	}
	return n
}

// recordMarker records a marker for what c holds; atFree says it is called
// from the FreeAsync that freed on c's stream (FreeMarkerBacking). A
// failure leaves the blocks to a later marker or synchronization: it is
// counted, and told to a FailureObserver unless it is stream capture, where
// CUDA forbids the marker.
func (p *Pool) recordMarker(c *streamCache, atFree bool) {
	var m Marker
	var err error
	switch {
	case c.foreign:
		m, err = p.foreign.RecordForeignMarker(c.stream)
	case atFree && p.atFree != nil:
		m, err = p.atFree.RecordMarkerAtFree(c.stream)
	default:
		m, err = p.back.RecordMarker(c.stream)
	}
	if err != nil {
		if errors.Is(err, ErrStreamCapture) {
			p.stats.CaptureSkips++
			return
		}
		p.backingFailed(fmt.Errorf("pool: recording a marker on stream %#x: %w", uint64(c.stream), err))
		return
	}
	c.marker, c.markerCut, c.hasMarker = m, p.seq, true
	p.stats.Markers++
}

// destroyMarker destroys c's marker through the Backing that recorded it.
func (p *Pool) destroyMarker(c *streamCache) {
	if c.foreign {
		p.foreign.DestroyForeignMarker(c.marker)
	} else {
		p.back.DestroyMarker(c.marker)
	}
	c.hasMarker = false
}

// pollMarkers moves the blocks covered by completed markers to the pool and
// records new markers for what remains; where a marker cannot be recorded,
// it asks whether the stream is idle instead, since that is the only other
// way a foreign stream's blocks come back. Drained caches are dropped. It
// reports whether any block moved. Backing errors leave the blocks where
// they are, to be reclaimed by the next synchronization.
func (p *Pool) pollMarkers() bool {
	moved := false
	for c := p.caches.head; c != nil; {
		next := c.next
		if c.hasMarker {
			done, err := p.back.MarkerDone(c.marker)
			if err != nil && !errors.Is(err, ErrStreamCapture) {
				p.backingFailed(fmt.Errorf("pool: querying a marker of stream %#x: %w", uint64(c.stream), err))
			}
			if done {
				p.destroyMarker(c)
				if p.drain(c, c.markerCut) > 0 {
					moved = true
				}
			}
		}
		if c.queue.head != nil && !c.hasMarker && !c.detached {
			p.recordMarker(c, false)
			if !c.hasMarker && p.drainIfIdle(c) > 0 {
				moved = true
			}
		}
		p.dropIfDrained(c)
		c = next
	}
	if moved {
		p.trim()
	}
	return moved
}

// backingFailed counts a Backing failure that fails no call and tells it to
// a FailureObserver.
func (p *Pool) backingFailed(err error) {
	p.stats.BackingErrors++
	p.tellFailure(err)
}

// tellFailure tells a FailureObserver of a failure that fails no call.
func (p *Pool) tellFailure(err error) {
	if f, ok := p.obs.(FailureObserver); ok {
		f.BackingFailed(err)
	}
}
