package pool

import (
	"errors"
	"fmt"
	"sort"
	"sync"
)

// Sizes that shape the pool; see the package documentation.
const (
	// Alignment of every address the pool hands out and of every size it
	// accounts.
	Alignment = 1 << granuleShift
	// MaxRequest is the largest request the pool accepts (64 TiB).
	MaxRequest = 1 << 46

	smallMax      = 1 << 20  // largest request of the small class
	mediumMax     = 10 << 20 // requests below this (and above smallMax) are medium
	smallSegment  = 2 << 20  // segment size of the small class
	mediumSegment = 20 << 20 // segment size of the medium class
	hugeRound     = 2 << 20  // huge segments are rounded up to this
)

// The three size classes; each has its own segments and free index, so small
// blocks never pin large segments.
const (
	classSmall = iota
	classMedium
	classHuge
	numClasses
)

func classOf(size uint64) int {
	switch {
	case size <= smallMax:
		return classSmall
	case size < mediumMax:
		return classMedium
	}
	return classHuge
}

// segmentSize is how much a class grows by for a request of size bytes. A
// shared segment is never more than 1/32 of the quota, so the memory a
// partly used segment can strand stays small against the quota; below that
// the request gets a segment of its own.
func (p *Pool) segmentSize(size uint64) uint64 {
	var seg uint64
	switch classOf(size) {
	case classSmall:
		seg = smallSegment
	case classMedium:
		seg = mediumSegment
	default:
		return alignUp(size, hugeRound)
	}
	if limit := p.opt.Quota / 32 &^ (Alignment - 1); seg > limit {
		seg = max(limit, size)
	}
	// A whole number of blocks of the request that made the segment: no
	// tail is left that the quota charges and cudaMemGetInfo reports free,
	// but that a request of that size cannot use.
	return seg - seg%size
}

// hugeSlack is the most a cached huge block may exceed a huge request by.
// Huge blocks are handed out whole (never split outside quota pressure), so
// this bounds their internal fragmentation to 1/8, or one rounding unit.
func hugeSlack(size uint64) uint64 {
	return max(size/8, hugeRound)
}

func alignUp(v, a uint64) uint64 { return (v + a - 1) &^ (a - 1) }

type blockState uint8

const (
	stateLive    blockState = iota
	stateFree               // in the pool's index of its class: reusable by anyone
	statePending            // freed by Free, waiting for a device synchronization
	stateStream             // freed by FreeAsync, reusable on its stream only
)

// block describes one range of memory: a piece of a segment (seg != nil), a
// pass-through reservation, or a spilled host allocation (seg == nil).
type block struct {
	base, size         uint64
	used               uint64 // live bytes accounted for it (its aligned request)
	seg                *segment
	prevPhys, nextPhys *block // address-ordered neighbours in the segment
	prevFree, nextFree *block // class list of an index
	prevQ, nextQ       *block // pending, stream or spill queue, oldest first
	cache              *streamCache
	seq                uint64 // value of Pool.seq when freed
	freeStream         Stream // the stream of a FreeAsync made while the block was moving
	tier               Tier
	state              blockState
	// promoted: a managed block counted on the device (moved there, or
	// maybe moved by a promotion that failed).
	promoted bool
	moving   bool // its promotion is in flight, the pool's lock released
	// freedMoving: freed while moving; the promotion releases it once the
	// move returns (freedAsync: by FreeAsync, on freeStream).
	freedMoving, freedAsync bool
	ringSlot                uint16 // see liveMap.order
	// listFl and listSl name the class list of the index holding it, so
	// that removing it does not classify its size again.
	listFl, listSl uint8
}

type segment struct {
	base, size           uint64
	class                int
	pinned               bool      // the reserve segment: never released before Close
	head                 *block    // lowest block
	granules             []granule // an arena's granules (virtual memory); nil for a fixed segment
	inEmpty              bool
	prevEmpty, nextEmpty *segment
}

// queue is an intrusive FIFO of blocks through prevQ/nextQ.
type queue struct {
	head, tail *block
	bytes      uint64
}

func (q *queue) push(b *block) {
	b.prevQ, b.nextQ = q.tail, nil
	if q.tail != nil {
		q.tail.nextQ = b
	} else {
		q.head = b
	}
	q.tail = b
	q.bytes += b.size
}

func (q *queue) pushFront(b *block) {
	b.prevQ, b.nextQ = nil, q.head
	if q.head != nil {
		q.head.prevQ = b
	} else {
		q.tail = b
	}
	q.head = b
	q.bytes += b.size
}

// splitOff puts r, split off the end of b, in b's place: b leaves the
// queue with its own bytes, r's having been counted with b's.
func (q *queue) splitOff(b, r *block) {
	r.prevQ, r.nextQ = b.prevQ, b.nextQ
	if r.prevQ != nil {
		r.prevQ.nextQ = r
	} else {
		q.head = r
	}
	if r.nextQ != nil {
		r.nextQ.prevQ = r
	} else {
		q.tail = r
	}
	b.prevQ, b.nextQ = nil, nil
	q.bytes -= b.size
}

func (q *queue) remove(b *block) {
	if b.prevQ != nil {
		b.prevQ.nextQ = b.nextQ
	} else {
		q.head = b.nextQ
	}
	if b.nextQ != nil {
		b.nextQ.prevQ = b.prevQ
	} else {
		q.tail = b.prevQ
	}
	b.prevQ, b.nextQ = nil, nil
	q.bytes -= b.size
}

// segList is the list of empty segments, oldest emptied first.
type segList struct {
	head, tail *segment
	bytes      uint64
}

func (l *segList) push(s *segment) {
	l.bytes += s.size
	s.prevEmpty, s.nextEmpty, s.inEmpty = l.tail, nil, true
	if l.tail != nil {
		l.tail.nextEmpty = s
	} else {
		l.head = s
	}
	l.tail = s
}

func (l *segList) remove(s *segment) {
	l.bytes -= s.size
	if s.prevEmpty != nil {
		s.prevEmpty.nextEmpty = s.nextEmpty
	} else {
		l.head = s.nextEmpty
	}
	if s.nextEmpty != nil {
		s.nextEmpty.prevEmpty = s.prevEmpty
	} else {
		l.tail = s.prevEmpty
	}
	s.prevEmpty, s.nextEmpty, s.inEmpty = nil, nil, false
}

// streamCache holds the blocks freed on one stream that are not yet known to
// be complete for other streams. It exists only while it holds blocks or a
// marker: a drained cache is dropped, so a stream seen once leaves nothing
// behind.
type streamCache struct {
	stream     Stream
	idx        [numClasses]*index // allocated at the class's first block
	queue      queue
	marker     Marker
	markerCut  uint64 // the marker covers blocks with seq < markerCut
	hasMarker  bool
	idle       bool         // found drained at the last reclaim
	prev, next *streamCache // Pool.caches, in creation order

	// foreign: the stream is one the device's synchronization does not
	// cover (FreeAsyncForeign): only its marker, or the stream found idle,
	// makes its blocks reusable by others.
	foreign bool
	// detached: its stream was destroyed (ForgetStream) while its work may
	// still run; the cache waits for its marker, which covers every block.
	detached bool
}

// index returns the cache's index of class k, allocating it at first use.
func (c *streamCache) index(k int) *index {
	if c.idx[k] == nil {
		c.idx[k] = new(index)
	}
	return c.idx[k]
}

// cacheList lists the stream caches in creation order, the order they are
// visited in, so that runs are repeatable.
type cacheList struct{ head, tail *streamCache }

// Pool is the allocator of one device. All its methods are safe for concurrent
// use; they serialize on one mutex per pool, released across the blocking
// Backing calls (Synchronize and HostBacking.Promote).
type Pool struct {
	mu sync.Mutex
	// cond is signalled, with mu, when a forced synchronization or a
	// promotion pass ends.
	cond    sync.Cond
	back    Backing
	host    HostBacking // nil when the Backing cannot spill
	ordered StreamOrderedBacking
	foreign ForeignStreamBacking // nil when the Backing cannot mark foreign streams
	atFree  FreeMarkerBacking    // nil when markers are recorded alike at a free and later
	virt    *virtualMemory       // nil without virtual memory
	// migration is nil unless Options.Migrate is set.
	migration *migration
	ledger    Ledger // admits every device byte (devBytes) the pool holds
	opt       Options
	obs       Observer
	closed    bool
	reserved  bool // the reserve segment exists (or none was asked)

	live    liveMap
	idx     [numClasses]index
	segs    []*segment // sorted by base, for ownership of freed pointers
	empty   segList
	pending queue
	// pendingBytes counts pending blocks per class, to decide whether a
	// synchronization could serve a miss.
	pendingBytes [numClasses]uint64
	streams      map[Stream]*streamCache
	streamsPeak  int // most entries p.streams held since it was made
	caches       cacheList
	lastCache    *streamCache // the stream cache used last; see cacheOf
	spilled      queue        // managed blocks on the host, oldest first: promotion order
	seq          uint64
	spare        *block // unused descriptors, linked through nextFree
	// detachedCaches counts the caches of destroyed streams (detach);
	// detachedPolled is how many were left at their last poll (pollDetached).
	detachedCaches, detachedPolled int

	syncing   bool   // a forced synchronization is in flight, the lock released
	syncedCut uint64 // every block freed with seq < syncedCut is known complete
	promoting bool   // a promotion pass is running
	// unreleased are blocks freed while moving whose release then failed:
	// still held, still counted, released again by Close.
	unreleased []*block

	segBytes  uint64 // bytes of all segments
	segLive   uint64 // bytes of live blocks in segments
	devBytes  uint64 // device bytes held: segments, pass-through, promoted
	hostBytes uint64 // host bytes held by spilled blocks not promoted
	stats     Stats
}

// New returns a pool for one device over back.
func New(back Backing, opt Options) (*Pool, error) {
	if back == nil {
		return nil, errors.New("pool: nil backing")
	}
	if err := opt.validate(); err != nil {
		return nil, err
	}
	p := &Pool{
		back:     back,
		opt:      opt,
		obs:      opt.Observer,
		ledger:   opt.Ledger,
		reserved: opt.Reserve == 0,
		streams:  make(map[Stream]*streamCache),
	}
	if p.ledger == nil {
		p.ledger = NewQuotaLedger(opt.Quota)
	}
	p.cond.L = &p.mu
	p.host, _ = back.(HostBacking)
	p.ordered, _ = back.(StreamOrderedBacking)
	p.foreign, _ = back.(ForeignStreamBacking)
	p.atFree, _ = back.(FreeMarkerBacking)
	if vb, ok := back.(VirtualBacking); ok && opt.VirtualMemory && opt.Pooling {
		v, err := newVirtualMemory(vb)
		if err != nil {
			return nil, err
		}
		p.virt = v
	}
	if opt.Oversubscribe && p.host == nil {
		return nil, errors.New("pool: oversubscription needs a backing that implements HostBacking")
	}
	if opt.Migrate {
		mover, ok := back.(GranuleMover)
		if !ok || p.virt == nil {
			return nil, errors.New("pool: migration needs a backing that implements VirtualBacking and GranuleMover")
		}
		p.migration = &migration{mover: mover}
	}
	return p, nil
}

// Alloc serves cudaMalloc: size bytes usable on any stream. A size of 0
// returns address 0 and no error, and nothing is recorded.
func (p *Pool) Alloc(size uint64) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allocate(size, false, 0)
}

// AllocAsync serves cudaMallocAsync: size bytes usable in the order of stream
// s. It may reuse memory freed on s by FreeAsync before that free completes.
func (p *Pool) AllocAsync(size uint64, s Stream) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allocate(size, true, s)
}

// Free serves cudaFree. The memory becomes reusable after a device
// synchronization that begins after this call (at once in strict mode).
// ErrNotOwned means the pointer is someone else's; ErrInvalidFree means a
// double free or an interior pointer, and nothing changed.
func (p *Pool) Free(ptr uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.takeLive(ptr)
	if err != nil || b == nil {
		return err
	}
	if b.seg == nil {
		return p.freeUnpooled(b, nil)
	}
	b.state = statePending
	b.seq = p.seq
	p.seq++
	p.pending.push(b)
	p.pendingBytes[b.seg.class] += b.size
	if p.opt.StrictFree {
		// Under stream capture the block waits for the next
		// synchronization; the free itself has succeeded.
		if err := p.synchronize(); err != nil && !errors.Is(err, ErrStreamCapture) {
			return err
		}
	}
	return nil
}

// FreeAsync serves cudaFreeAsync: the memory is reusable at once by AllocAsync
// on s, and by anyone once the free is known complete (a marker recorded on s
// has completed, or the device was synchronized).
func (p *Pool) FreeAsync(ptr uint64, s Stream) error { return p.freeAsync(ptr, s, false) }

// FreeAsyncForeign serves cudaFreeAsync on a foreign stream: one that the
// device's synchronization does not wait for (a stream of another device,
// or of another context than the one the pool's memory lives in). As
// FreeAsync, except that the memory becomes reusable by others only once a
// marker recorded on s has completed (ForeignStreamBacking) or s is found
// idle: a synchronization of the pool's device does not cover it, and if
// s is forgotten, its blocks wait for a marker recorded then. It needs a
// Backing that implements ForeignStreamBacking.
func (p *Pool) FreeAsyncForeign(ptr uint64, s Stream) error {
	if p.foreign == nil {
		return errors.New("pool: a free on a foreign stream needs a backing that implements ForeignStreamBacking")
	}
	return p.freeAsync(ptr, s, true)
}

func (p *Pool) freeAsync(ptr uint64, s Stream, foreign bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.takeLive(ptr)
	if err != nil || b == nil {
		return err
	}
	if b.seg == nil {
		// The stream escapes to the Backing: a copy made here keeps the
		// pooled path free of a heap allocation.
		stream := s
		return p.freeUnpooled(b, &stream)
	}
	c := p.cacheOf(s)
	if c == nil {
		c = p.newCache(s)
	}
	// A stream never changes context; once foreign, a cache stays so,
	// which only ever waits longer.
	c.foreign = c.foreign || foreign
	b.state = stateStream
	b.cache = c
	b.seq = p.seq
	p.seq++
	p.mergeStreamNeighbours(b)
	c.index(b.seg.class).insert(b)
	c.queue.push(b)
	if !c.hasMarker {
		// A failure leaves the block for the next synchronization; the free
		// itself has succeeded.
		p.recordMarker(c, true)
	}
	return nil
}

// newCache creates the cache of stream s.
func (p *Pool) newCache(s Stream) *streamCache {
	c := &streamCache{stream: s, prev: p.caches.tail}
	if p.caches.tail != nil {
		p.caches.tail.next = c
	} else {
		p.caches.head = c
	}
	p.caches.tail = c
	p.streams[s] = c
	p.streamsPeak = max(p.streamsPeak, len(p.streams))
	return c
}

// dropCache forgets a stream cache, which must hold no block.
func (p *Pool) dropCache(c *streamCache) {
	if c.hasMarker {
		p.destroyMarker(c)
	}
	if c.detached {
		p.detachedCaches--
	}
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		p.caches.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		p.caches.tail = c.prev
	}
	c.prev, c.next = nil, nil
	if p.streams[c.stream] == c { // a detached cache's stream may name a new one
		delete(p.streams, c.stream)
	}
	if p.lastCache == c {
		p.lastCache = nil
	}
	// A Go map never shrinks and its deleted slots slow its lookups: once it
	// holds far fewer streams than it once did, it is rebuilt, at a cost
	// amortized over those deletions.
	if n := len(p.streams); p.streamsPeak > 64 && n < p.streamsPeak/8 {
		fresh := make(map[Stream]*streamCache, n)
		for s, c := range p.streams {
			fresh[s] = c
		}
		p.streams, p.streamsPeak = fresh, n
	}
}

// cacheOf returns the cache of stream s, or nil. The last one found is kept
// aside: most programs free on one stream.
func (p *Pool) cacheOf(s Stream) *streamCache {
	if c := p.lastCache; c != nil && c.stream == s {
		return c
	}
	c := p.streams[s]
	if c != nil {
		p.lastCache = c
	}
	return c
}

// mergeStreamNeighbours absorbs into b (freed on its stream, not yet
// indexed) the neighbours freed on the same stream. The merged block takes b's
// sequence number, the latest, so it is never handed to another stream before
// all its parts may be.
func (p *Pool) mergeStreamNeighbours(b *block) {
	c := b.cache
	if prev := b.prevPhys; prev != nil && prev.state == stateStream && prev.cache == c {
		c.idx[prev.seg.class].remove(prev)
		c.queue.remove(prev)
		p.absorbPrev(b)
	}
	if next := b.nextPhys; next != nil && next.state == stateStream && next.cache == c {
		c.idx[next.seg.class].remove(next)
		c.queue.remove(next)
		p.absorbNext(b)
	}
}

// takeLive removes the live block at ptr from the pointer map, accounts its
// free and returns it, or (nil, nil) for ptr 0, as cudaFree(NULL) succeeds.
func (p *Pool) takeLive(ptr uint64) (*block, error) {
	if p.closed {
		return nil, ErrClosed
	}
	if ptr == 0 {
		return nil, nil
	}
	b := p.live.take(ptr)
	if b == nil {
		if p.segmentOf(ptr) != nil {
			return nil, fmt.Errorf("pool: free of %#x: %w", ptr, ErrInvalidFree)
		}
		return nil, fmt.Errorf("pool: free of %#x: %w", ptr, ErrNotOwned)
	}
	p.stats.LiveBytes -= b.used
	p.stats.LiveBlocks--
	p.stats.Frees++
	if b.seg != nil {
		p.segLive -= b.size
		if v := p.virt; v != nil && v.hostGranules != 0 {
			v.hostLive -= v.hostShare(b.seg, b.base, b.size)
		}
	}
	if p.obs != nil {
		p.obs.Free(b.base, b.used, b.tier)
	}
	return b, nil
}

// revive undoes takeLive for a block outside segments whose release failed:
// the memory is still held, so the block stays live and a retried free
// releases it.
func (p *Pool) revive(b *block) {
	p.live.put(b)
	p.stats.LiveBytes += b.used
	p.stats.LiveBlocks++
	p.stats.Frees--
}

// segmentOf returns the segment containing ptr, or nil: O(log segments).
func (p *Pool) segmentOf(ptr uint64) *segment {
	i := sort.Search(len(p.segs), func(i int) bool { return p.segs[i].base+p.segs[i].size > ptr })
	if i < len(p.segs) && p.segs[i].base <= ptr {
		return p.segs[i]
	}
	return nil
}

func (p *Pool) allocate(size uint64, async bool, s Stream) (uint64, error) {
	if p.closed {
		return 0, ErrClosed
	}
	if size == 0 {
		return 0, nil
	}
	if size > MaxRequest {
		return 0, fmt.Errorf("pool: request of %d bytes is larger than the largest supported (%d): %w", size, uint64(MaxRequest), ErrTooLarge)
	}
	size = alignUp(size, Alignment)
	if !p.opt.Pooling {
		return p.passThrough(size, async, s)
	}
	var c *streamCache
	if async {
		c = p.cacheOf(s)
	}
	if !p.reserved {
		if err := p.reserveAtFirstUse(); err != nil {
			return 0, err
		}
	}
	class := classOf(size)
	b := p.fromClass(size, class, c, ownClass)
	if p.virt != nil {
		// A cached block serves at once if it lies on device granules
		// mapped and in use; allocateVirtual places the others.
		if b != nil && p.useMapped(b, size) {
			return p.hand(b, size, SourceCache), nil
		}
		return p.allocateVirtual(size, class, c, b)
	}
	if b != nil {
		return p.hand(b, size, SourceCache), nil
	}
	// A miss. Blocks freed on other streams whose markers completed, then
	// blocks waiting for a synchronization, may serve it before the pool grows.
	if p.pollMarkers() {
		if b := p.fromClass(size, class, c, ownClass); b != nil {
			return p.hand(b, size, SourceCache), nil
		}
	}
	captured := false // stream capture forbids synchronizing: no second try
	if p.pendingBytes[class] >= size {
		// Under stream capture the pool grows or refuses instead.
		if err := p.synchronize(); errors.Is(err, ErrStreamCapture) {
			captured = true
		} else if err != nil {
			return 0, err
		}
		if async {
			c = p.cacheOf(s) // the lock was released
		}
		if b := p.fromClass(size, class, c, ownClass); b != nil {
			return p.hand(b, size, SourceCache), nil
		}
	}
	if p.opt.Reserve > 0 {
		// A static reserve serves every class before the pool grows.
		if b := p.fromCache(size, class, c, anyClass); b != nil {
			return p.hand(b, size, SourceCache), nil
		}
	}
	if b, err := p.grow(p.segmentSize(size), class); err == nil {
		return p.hand(b, size, SourceDevice), nil
	} else if !errors.Is(err, ErrOutOfMemory) {
		return 0, err
	}
	return p.allocUnderPressure(size, class, async, s, captured)
}

// allocUnderPressure serves a request when growing by a whole segment is
// impossible, trying in order: a synchronization for everything it can
// complete and the completed markers of the rest, any free block of any
// class, releasing every empty segment and growing by a segment or by
// exactly the request, spilling to the host.
func (p *Pool) allocUnderPressure(size uint64, class int, async bool, s Stream, captured bool) (uint64, error) {
	if !captured && p.syncableBytes() > 0 {
		// Under stream capture the pool grows or refuses instead.
		if err := p.synchronize(); err != nil && !errors.Is(err, ErrStreamCapture) {
			return 0, err
		}
	}
	p.pollMarkers() // foreign streams' blocks, which no synchronization completes
	var c *streamCache
	if async {
		c = p.cacheOf(s)
	}
	if b := p.fromCache(size, class, c, everything); b != nil {
		return p.hand(b, size, SourceCache), nil
	}
	p.releaseEmptyWhile(func(uint64) bool { return true })
	var deviceFull error // the device itself is out of memory, below the quota
	for _, grow := range [...]uint64{p.segmentSize(size), size} {
		b, err := p.grow(grow, class)
		if err == nil {
			return p.hand(b, size, SourceDevice), nil
		}
		if !errors.Is(err, ErrOutOfMemory) {
			return 0, err
		}
		if !errors.Is(err, errNoRoom) {
			deviceFull = err
		}
	}
	if p.opt.Oversubscribe {
		return p.spill(size, deviceFull != nil)
	}
	return 0, p.refuse(size, deviceFull)
}

// refuse counts and reports a refusal. deviceFull is the Backing's error when
// the device, not the quota, had no room.
func (p *Pool) refuse(size uint64, deviceFull error) error {
	p.countRefusal(size)
	if deviceFull != nil {
		return fmt.Errorf("pool: %d bytes requested with %d bytes reserved: %w", size, p.devBytes, deviceFull)
	}
	return fmt.Errorf("pool: %d bytes requested with %d of a %d-byte quota reserved (%d live) and %d more admitted by the ledger: %w: %w",
		size, p.devBytes, p.opt.Quota, p.stats.LiveBytes, p.ledger.Headroom(), ErrQuota, ErrOutOfMemory)
}

// countRefusal counts a refused request of size bytes and tells the
// Observer.
func (p *Pool) countRefusal(size uint64) {
	p.stats.Refused++
	if p.obs != nil {
		p.obs.Refuse(size, p.devBytes, p.opt.Quota)
	}
}

// How far fromClass and fromCache search.
type search int

const (
	ownClass   search = iota // bounded scans: the hot path (fromClass of the request's class)
	anyClass                 // every class, bounded scans: a static reserve
	everything               // every class, full scans of the request's size class, any slack: quota pressure
)

// fromCache finds a cached block for size bytes in any class, the request's
// first (a search the hot path, which looks in the request's class alone,
// makes with fromClass).
func (p *Pool) fromCache(size uint64, class int, c *streamCache, how search) *block {
	if b := p.fromClass(size, class, c, how); b != nil {
		return b
	}
	for k := range numClasses {
		if k != class {
			if b := p.fromClass(size, k, c, how); b != nil {
				return b
			}
		}
	}
	return nil
}

// fromClass finds a cached block for size bytes in class k, first among the
// blocks freed on the requesting stream, then among those reusable by
// anyone.
func (p *Pool) fromClass(size uint64, k int, c *streamCache, how search) *block {
	slack, scan := ^uint64(0), exactScan
	if how == everything {
		// Scanned in full, so a request is never refused while a free block
		// that fits exists.
		scan = int(^uint(0) >> 1)
	} else if k == classHuge && p.virt == nil {
		slack = hugeSlack(size)
	}
	if c != nil && c.idx[k] != nil {
		if b := c.idx[k].find(size, slack, scan); b != nil {
			return b
		}
	}
	return p.idx[k].find(size, slack, scan)
}

// handAt hands out size bytes off bytes into b, a free block: the first off
// bytes stay free, a block of their own in the index. b stays in the list
// it was inserted in, which it records, until hand takes it out.
func (p *Pool) handAt(b *block, off, size uint64, src Source) uint64 {
	if off > 0 {
		h := p.newBlock()
		h.base, h.size, h.seg, h.state = b.base, off, b.seg, stateFree
		h.prevPhys, h.nextPhys = b.prevPhys, b
		if b.prevPhys != nil {
			b.prevPhys.nextPhys = h
		} else {
			b.seg.head = h
		}
		b.prevPhys = h
		b.base += off
		b.size -= off
		p.idx[b.seg.class].insert(h)
	}
	return p.hand(b, size, src)
}

// hand turns a cached or fresh block into a live allocation of size bytes,
// splitting off the rest unless it is a huge block served outside pressure.
func (p *Pool) hand(b *block, size uint64, src Source) uint64 {
	switch b.state {
	case stateFree:
		p.idx[b.seg.class].remove(b)
		if b.seg.inEmpty {
			p.empty.remove(b.seg)
		}
	case stateStream:
		b.cache.idx[b.seg.class].remove(b)
		if p.virt != nil && p.migration != nil {
			// Its granules are used already, but it is handed out now.
			p.virt.stampHot(b.seg, b.base, size)
		}
	}
	var r *block // the rest, split off
	if rest := b.size - size; rest >= Alignment && (b.seg.class != classHuge || b.seg.granules != nil || rest > hugeSlack(size)) {
		r = p.newBlock()
		r.base, r.size, r.seg, r.state = b.base+size, rest, b.seg, b.state
		r.prevPhys, r.nextPhys = b, b.nextPhys
		if b.nextPhys != nil {
			b.nextPhys.prevPhys = r
		}
		b.nextPhys = r
		b.size = size
		if r.state == stateStream {
			r.cache, r.seq = b.cache, b.seq
			r.cache.idx[r.seg.class].insert(r)
		} else {
			p.idx[r.seg.class].insert(r)
		}
	}
	if b.state == stateStream {
		if r != nil {
			b.cache.queue.splitOff(b, r) // the rest keeps b's place
		} else {
			b.cache.queue.remove(b)
		}
		b.cache = nil
	}
	b.state = stateLive
	b.used = size
	p.live.put(b)
	p.segLive += b.size
	if v := p.virt; v != nil && v.hostGranules != 0 {
		v.hostLive += v.hostShare(b.seg, b.base, b.size)
	}
	p.stats.LiveBytes += size
	p.stats.LiveBlocks++
	p.stats.PeakLiveBytes = max(p.stats.PeakLiveBytes, p.stats.LiveBytes)
	p.stats.HighLiveBytes = max(p.stats.HighLiveBytes, p.stats.LiveBytes)
	if src == SourceCache {
		p.stats.CacheHits++
	} else {
		p.stats.DeviceReservations++
	}
	if p.obs != nil {
		p.obs.Alloc(b.base, size, TierDevice, src)
	}
	return b.base
}
