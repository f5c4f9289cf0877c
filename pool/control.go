package pool

import (
	"errors"
	"fmt"
)

// SyncTicket is handed out by SyncBegin and given back to SyncEnd.
type SyncTicket struct{ cut uint64 }

// SyncBegin and SyncEnd bracket a device synchronization the application
// makes (cudaDeviceSynchronize, or a cudaFree passed to the runtime): every
// block freed before SyncBegin becomes reusable at SyncEnd, sparing the pool a
// synchronization of its own. Call SyncEnd only if the synchronization
// succeeded.
func (p *Pool) SyncBegin() SyncTicket {
	p.mu.Lock()
	defer p.mu.Unlock()
	return SyncTicket{cut: p.seq}
}

// SyncEnd completes a synchronization begun with SyncBegin, then runs a
// promotion pass (unless one is running in another thread): the calling
// thread has just waited for the device, so waiting for a move costs it
// little, and the pass never holds the pool's lock while it waits. A failed
// promotion does not fail SyncEnd: it is counted and told to a
// FailureObserver.
func (p *Pool) SyncEnd(t SyncTicket) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.stats.ExternalSyncs++
	p.synced(t.cut)
	p.promoteQuietly()
	// The promotion pass may have released the lock, and Close begun.
	if p.migration != nil && !p.closed {
		p.migrate()
	}
	return nil
}

// ForgetStream is called before stream s is destroyed, and when a thread
// whose per-thread identity names s exits: the blocks freed on it are
// treated from then on like blocks freed by Free, its marker is destroyed,
// and nothing of it is left in the pool. The blocks of a foreign stream
// (FreeAsyncForeign), which no synchronization of the device covers, wait
// instead for a marker recorded now on s, unless none can be recorded.
func (p *Pool) ForgetStream(s Stream) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.streams[s]
	if c == nil {
		return
	}
	if c.foreign && c.queue.head != nil && p.detach(c) {
		return
	}
	for b := c.queue.head; b != nil; b = c.queue.head {
		c.queue.remove(b)
		c.idx[b.seg.class].remove(b)
		b.state, b.cache, b.seq = statePending, nil, p.seq
		p.pending.push(b)
		p.pendingBytes[b.seg.class] += b.size
	}
	p.seq++
	p.dropCache(c)
}

// ForgetFinishedContext is called once a context is gone (a device reset,
// or a context destroyed): no work queued in it can touch memory any more,
// and its markers, which are its events, are gone with it. The blocks
// waiting on a stream of it that finishedStream names (one not forgotten,
// or a name for its default streams), or on a marker of it that
// finishedMarker names (a forgotten stream's included), are free at once;
// those markers are dropped without being queried or destroyed again.
func (p *Pool) ForgetFinishedContext(finishedStream func(Stream) bool, finishedMarker func(Marker) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var made uint64
	for c := p.caches.head; c != nil; {
		next := c.next
		deadMarker := c.hasMarker && finishedMarker(c.marker)
		if deadMarker || (!c.detached && finishedStream(c.stream)) {
			c.hasMarker = false // its event went with its context
			made += p.drain(c, p.seq)
			p.dropCache(c)
		}
		c = next
	}
	if made > 0 {
		p.trim()
	}
}

// detach keeps the blocks of foreign stream cache c, whose stream is about
// to be destroyed while its work may still run, until a marker covering
// them all completes (pollMarkers), and frees the stream's name for a new
// stream. It reports false, having changed nothing, where no such marker
// can be recorded.
func (p *Pool) detach(c *streamCache) bool {
	if !c.hasMarker || c.queue.tail.seq >= c.markerCut {
		m, err := p.foreign.RecordForeignMarker(c.stream)
		if err != nil {
			p.backingFailed(fmt.Errorf("pool: recording a marker on stream %#x before it is destroyed: %w", uint64(c.stream), err))
			return false
		}
		if c.hasMarker {
			p.destroyMarker(c)
		}
		c.marker, c.markerCut, c.hasMarker = m, p.seq, true
		p.stats.Markers++
	}
	delete(p.streams, c.stream)
	if p.lastCache == c {
		p.lastCache = nil
	}
	c.detached = true
	p.detachedCaches++
	if p.detachedCaches >= 2*p.detachedPolled+maxDetachedUnpolled {
		p.pollDetached()
	}
	return true
}

// maxDetachedUnpolled is how many caches of destroyed streams may wait for
// their markers, beyond twice those left at the last poll, before the pool
// polls them.
const maxDetachedUnpolled = 64

// pollDetached frees the blocks of destroyed streams whose markers have
// completed and drops their caches. Markers are otherwise polled at a miss
// only, and a program whose requests all hit its cache while it makes and
// destroys a stream of another device or context per step would keep one
// cache and one marker (a CUDA event) per step. detach calls it once twice
// as many caches as the previous poll left, and 64 more, are detached: a
// poll queries the markers of destroyed streams only, a constant for each
// amortized, but walks every cache to find them, so each destroyed stream
// also pays 1/64 of a walk over the caches of live streams.
func (p *Pool) pollDetached() {
	var made uint64
	for c := p.caches.head; c != nil; {
		next := c.next
		if c.detached && c.hasMarker {
			done, err := p.back.MarkerDone(c.marker)
			if err != nil && !errors.Is(err, ErrStreamCapture) {
				p.backingFailed(fmt.Errorf("pool: querying a marker of destroyed stream %#x: %w", uint64(c.stream), err))
			}
			if done {
				p.destroyMarker(c)
				made += p.drain(c, c.markerCut)
				if c.queue.head == nil {
					p.dropCache(c)
				}
			}
		}
		c = next
	}
	p.detachedPolled = p.detachedCaches
	if made > 0 {
		p.trim()
	}
}

// ReleaseCached returns to the device the memory the pool holds that no
// block uses: every empty segment and every free and idle granule, whatever
// Options.ReleaseThreshold says. With synchronize, and if freed blocks wait
// for a synchronization, it first synchronizes the device through the
// Backing (not under stream capture), so that they are released too, and
// it releases the blocks of foreign streams whose markers have completed,
// which no synchronization of the device completes. A caller that cannot
// vouch that the Backing's synchronization covers the pool's work (a
// thread in another CUDA context) passes false; blocks freed on streams
// the Backing reports idle (IdleStreamBacking) are then released all the
// same. It returns how many device bytes it gave back to the ledger.
// Whoever shares the pool's Ledger calls it when a request of its own does
// not fit; it takes the pool's lock, so a Backing, Ledger or Observer
// method never calls it.
func (p *Pool) ReleaseCached(synchronize bool) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0
	}
	before := p.stats.BytesReleased
	if synchronize {
		if p.syncableBytes() > 0 {
			// A failure is counted in Stats; what is already free goes back.
			if err := p.synchronize(); errors.Is(err, ErrClosed) {
				return p.stats.BytesReleased - before
			}
		}
		p.pollMarkers() // foreign streams' blocks, which no synchronization completes
	} else {
		p.drainIdleStreams()
	}
	p.releaseEmptyWhile(func(uint64) bool { return true })
	return p.stats.BytesReleased - before
}

// TrimTo returns cached device memory that can be returned without waiting
// for the device while the pool holds more than keep bytes of device memory
// (ReservedBytes), but never so much that less than keep stays, as CUDA's
// cuMemPoolTrimTo guarantees: blocks freed on streams whose markers have
// completed or that have run all their work (IdleStreamBacking) are made
// free first, then empty segments and free or idle granules are released
// where keep bytes or more stay held. Blocks still waiting for a
// synchronization stay cached (a caller that wants them released
// synchronizes first, announced with SyncBegin and SyncEnd), and so does
// the reserve (Options.Reserve). It returns how many device bytes it gave
// back to the ledger.
func (p *Pool) TrimTo(keep uint64) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0
	}
	before := p.stats.BytesReleased
	p.pollMarkers()
	p.drainIdleStreams()
	p.releaseEmptyWhile(func(size uint64) bool { return p.devBytes > keep && p.devBytes-keep >= size })
	return p.stats.BytesReleased - before
}

// ResetHighLive sets Stats.HighLiveBytes to the bytes live now, as setting
// CUDA's cudaMemPoolAttrUsedMemHigh to 0 does.
func (p *Pool) ResetHighLive() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.HighLiveBytes = p.stats.LiveBytes
}

// ResetHighReserved sets Stats.HighReservedBytes to the device bytes held
// now, as setting CUDA's cudaMemPoolAttrReservedMemHigh to 0 does.
func (p *Pool) ResetHighReserved() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.HighReservedBytes = p.devBytes
}

// Allocation describes a live allocation.
type Allocation struct {
	Base, Size uint64 // Size is the aligned size accounted
	Tier       Tier
}

// Lookup returns the live allocation that starts at ptr.
func (p *Pool) Lookup(ptr uint64) (Allocation, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.live.get(ptr)
	if b == nil {
		return Allocation{}, false
	}
	return Allocation{Base: b.base, Size: b.used, Tier: b.tier}, true
}

// Containing returns the live allocation that holds ptr (its first
// Allocation.Size bytes, anywhere from its base), as CUDA's address-range
// queries describe an allocation. held says whether ptr lies in a segment,
// memory the pool cut into blocks; a block outside segments (passed
// through, or spilled whole) is an allocation of its own, which CUDA
// describes, so it is not held. A block's base is found in O(1); a pointer
// inside a block walks its segment's blocks.
func (p *Pool) Containing(ptr uint64) (a Allocation, live, held bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b := p.live.get(ptr); b != nil {
		if b.seg == nil {
			return Allocation{}, false, false
		}
		return Allocation{Base: b.base, Size: b.used, Tier: b.tier}, true, true
	}
	seg := p.segmentOf(ptr)
	if seg == nil {
		return Allocation{}, false, false
	}
	for b := seg.head; b != nil && b.base <= ptr; b = b.nextPhys {
		if ptr < b.base+b.used && p.live.get(b.base) == b {
			return Allocation{Base: b.base, Size: b.used, Tier: b.tier}, true, true
		}
	}
	return Allocation{}, false, true
}

// Close synchronizes the device and releases everything the pool holds, live
// allocations included; later calls fail with ErrClosed. Call it before the
// device is reset (cudaDeviceReset) or when the process stops using it. It
// waits for a synchronization or a promotion in flight, then holds the lock
// to the end: calls made meanwhile wait, then fail with ErrClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.closed = true
	for p.syncing || p.promoting {
		p.cond.Wait()
	}
	var errs []error
	if err := p.back.Synchronize(); err != nil {
		errs = append(errs, fmt.Errorf("pool: synchronizing before close: %w", err))
	}
	for c := p.caches.head; c != nil; c = c.next {
		if c.hasMarker {
			p.destroyMarker(c)
		}
	}
	for _, b := range p.unreleased {
		if err := p.releaseUnpooled(b, nil); err != nil {
			errs = append(errs, err)
		}
	}
	p.live.each(func(b *block) {
		if b.seg != nil {
			return
		}
		if b.tier == TierDevice {
			if err := p.back.Release(b.base, b.size); err != nil {
				errs = append(errs, fmt.Errorf("pool: releasing pass-through allocation %#x: %w", b.base, err))
			}
		} else if err := p.host.ReleaseHost(b.base, b.size, b.tier, nil); err != nil {
			errs = append(errs, fmt.Errorf("pool: releasing spilled allocation %#x: %w", b.base, err))
		}
	})
	if p.virt != nil {
		errs = append(errs, p.closeVirtual()...)
	}
	for _, seg := range p.segs {
		if err := p.back.Release(seg.base, seg.size); err != nil {
			errs = append(errs, fmt.Errorf("pool: releasing segment %#x: %w", seg.base, err))
		}
	}
	// Everything is forgotten, a failed release included: the device is
	// about to be reset, or no longer used.
	p.ledger.Give(p.devBytes)
	p.live, p.segs, p.streams, p.spare, p.lastCache = liveMap{}, nil, nil, nil, nil
	p.caches, p.unreleased = cacheList{}, nil
	p.detachedCaches, p.detachedPolled = 0, 0
	p.devBytes, p.hostBytes, p.segBytes, p.segLive = 0, 0, 0, 0
	p.idx = [numClasses]index{}
	p.pending, p.spilled, p.empty = queue{}, queue{}, segList{}
	return errors.Join(errs...)
}
