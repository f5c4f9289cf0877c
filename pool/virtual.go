package pool

// Virtual memory: blocks live in large reserved address ranges (arenas) and
// physical memory is mapped under them one granule at a time, only where
// blocks that are not free lie. See "Virtual memory" in the package
// documentation.

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// VirtualBacking is implemented by a Backing that separates addresses from
// physical memory (CUDA's cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess, cuMemUnmap, cuMemRelease). When the Backing has it and
// Options.VirtualMemory is set, the pool reserves address ranges and maps
// physical granules under them instead of reserving fixed segments.
type VirtualBacking interface {
	// Granularity is the size of every physical allocation and the alignment
	// of every address range and mapping, in bytes: a power of two, at least
	// Alignment (cuMemGetAllocationGranularity, 2 MiB on current devices).
	Granularity() uint64
	// ReserveAddress reserves size bytes of address space with no memory
	// behind it, aligned to the granularity.
	ReserveAddress(size uint64) (uint64, error)
	// FreeAddress returns a range from ReserveAddress, with the same size;
	// nothing is mapped in it any more.
	FreeAddress(va, size uint64) error
	// CreatePhysical allocates size bytes (one granule) of physical memory
	// and returns its handle: device memory for TierDevice, host memory the
	// device reads and writes in place for TierPinned (a host-located
	// allocation). A failure caused by lack of memory must wrap
	// ErrOutOfMemory.
	CreatePhysical(size uint64, tier Tier) (uint64, error)
	// ReleasePhysical frees physical memory that is mapped nowhere.
	ReleasePhysical(handle, size uint64) error
	// Map maps the physical memory of handle at va, inside a reserved range,
	// and makes it readable and writable by the device.
	Map(va, size, handle uint64) error
	// Unmap removes the mapping at va; the physical memory stays allocated.
	Unmap(va, size uint64) error
}

// arenaMin and arenaMax bound the address range an arena reserves: twice the
// quota, so one arena per class usually serves the whole pool.
const (
	arenaMin = 1 << 30
	arenaMax = 64 << 30
)

// errNoPhysical says that the quota (or the device, then wrapped with the
// Backing's ErrOutOfMemory) cannot hold the granules a placement needs; the
// caller tries harder before spilling or refusing.
var errNoPhysical = errors.New("no physical granule available")

// granule is one granularity-sized piece of an arena's address range.
type granule struct {
	va      uint64
	handle  uint64 // physical memory mapped here, when mapped
	mapped  bool
	host    bool   // the memory mapped here is host-located (spilled)
	newHost bool   // host memory mapped by the placement in progress, not yet reported
	hot     uint64 // the last interval (virtualMemory.epoch) a block was handed out on it
	// spillN is the number of the Spill reported for this host granule
	// (virtualMemory.spills) while no Free or Promote has ended it; else 0.
	spillN   uint64
	inIdle   bool
	prevIdle *granule
	nextIdle *granule
}

// idleList holds mapped granules with no used bytes, oldest first: the first
// taken when physical memory is needed elsewhere or released.
type idleList struct {
	head, tail *granule
	n          int
}

func (l *idleList) push(g *granule) {
	g.prevIdle, g.nextIdle, g.inIdle = l.tail, nil, true
	if l.tail != nil {
		l.tail.nextIdle = g
	} else {
		l.head = g
	}
	l.tail = g
	l.n++
}

func (l *idleList) remove(g *granule) {
	if g.prevIdle != nil {
		g.prevIdle.nextIdle = g.nextIdle
	} else {
		l.head = g.nextIdle
	}
	if g.nextIdle != nil {
		g.nextIdle.prevIdle = g.prevIdle
	} else {
		l.tail = g.prevIdle
	}
	g.prevIdle, g.nextIdle, g.inIdle = nil, nil, false
	l.n--
}

// virtualMemory is the pool's state for the virtual-memory design.
type virtualMemory struct {
	back    VirtualBacking
	gran    uint64
	shift   uint
	free    []uint64 // physical granules mapped nowhere
	idle    idleList
	granule uint64 // physical granules held: mapped or free
	// inUse counts the granules holding used bytes, device or host, and
	// inUsePeak its peak since migration last looked (see migrate).
	inUse, inUsePeak uint64
	// epoch numbers the synchronization intervals migration has ended;
	// a granule a block is handed out on is stamped with it (granule.hot).
	epoch  uint64
	arenas [numClasses]int
	// spills numbers the Spills reported (granule.spillN), and spilledNow
	// counts the granules whose Spill is in force.
	spills     uint64
	spilledNow int
	// hostGranules counts the host granules held (their bytes are in
	// segBytes), and hostLive the bytes of live blocks on them (in
	// segLive): what they hold and no live block uses is host memory,
	// which cachedBytes leaves out.
	hostGranules, hostLive uint64
	// unreleasedHost are the host granules the host failed to free,
	// still held (in hostBytes) until Close.
	unreleasedHost []uint64
}

func newVirtualMemory(back VirtualBacking) (*virtualMemory, error) {
	g := back.Granularity()
	if g < Alignment || g&(g-1) != 0 {
		return nil, fmt.Errorf("pool: virtual memory granularity of %d bytes; it must be a power of two of at least %d", g, Alignment)
	}
	shift := uint(0)
	for 1<<shift < g {
		shift++
	}
	return &virtualMemory{back: back, gran: g, shift: shift}, nil
}

// allocateVirtual serves a pooled request of size aligned bytes with virtual
// memory that found, the cached block fromClass found for it (or nil), cannot
// serve as it lies (allocate hands out a block on device granules mapped and
// in use, useMapped). It follows allocate, except that what counts as a miss
// is a placement that needs new physical memory (free address space is
// always found): then completed markers, and a synchronization when anything
// is pending, may give granules back before the pool creates more. Only when
// the quota cannot provide the granules does the pressure path run. A
// failure to map a granule ends the request with its error wherever it
// occurs: it is counted, and no other placement hides it.
func (p *Pool) allocateVirtual(size uint64, class int, c *streamCache, found *block) (uint64, error) {
	b, short, src, captured, err := p.placeVirtual(size, class, c, found)
	if err != nil {
		return 0, err
	}
	off, short := p.spotIn(b, size, short)
	if err = p.commit(b, off, size, short, false); err == nil {
		return p.handAt(b, off, size, src), nil
	}
	if !errors.Is(err, errNoPhysical) {
		return 0, err
	}
	// Quota pressure: synchronize for everything that would complete (a
	// placement polls the markers of foreign streams, which no
	// synchronization completes), then place the block where it needs the
	// fewest granules, in an arena of its own. Under stream capture, tried
	// once per request, the pool goes on as if nothing were pending.
	if !captured && p.syncableBytes() > 0 {
		err := p.synchronize()
		if err != nil && !errors.Is(err, ErrStreamCapture) {
			return 0, err
		}
		if err == nil {
			if b, short, src, _, err = p.placeVirtual(size, class, c, p.fromClass(size, class, c, ownClass)); err != nil {
				return 0, err
			}
			off, short = p.spotIn(b, size, short)
			if err = p.commit(b, off, size, short, false); err == nil {
				return p.handAt(b, off, size, src), nil
			} else if !errors.Is(err, errNoPhysical) {
				return 0, err
			}
		}
	}
	if b := p.fewestGranules(size); b != nil {
		off, short := p.spotIn(b, size, p.virt.shortOf(b, 0, size))
		if err = p.commit(b, off, size, short, false); err == nil {
			return p.handAt(b, off, size, SourceCache), nil
		} else if !errors.Is(err, errNoPhysical) {
			return 0, err
		}
	}
	if b, err = p.growVirtual(size, class, true); err != nil {
		return 0, err
	}
	if err = p.commit(b, 0, size, p.virt.shortOf(b, 0, size), false); err == nil {
		return p.hand(b, size, SourceDevice), nil
	}
	return p.spillOrRefuse(b, size, err)
}

// spillOrRefuse ends a request whose new arena, b, commit could not give its
// granules (err): the block spills to the host under oversubscription, and
// is refused otherwise; the arena goes if nothing was placed in it. (A
// function of its own because Go open-codes a deferred call only in a
// function with few returns: in allocateVirtual, every return, whichever the
// request took, would call into the runtime, 20 instructions a pair on
// random churn.)
func (p *Pool) spillOrRefuse(b *block, size uint64, err error) (uint64, error) {
	defer p.arenaEmptied(b) // if nothing was placed in it
	if !errors.Is(err, errNoPhysical) {
		return 0, err
	}
	// The device, not the quota, had no granule left.
	deviceFull := errors.Is(err, ErrOutOfMemory)
	if p.opt.Oversubscribe {
		// Page-granular spill: the granules the quota cannot hold are
		// host-located, behind the same range as the device ones.
		if err = p.commit(b, 0, size, p.virt.shortOf(b, 0, size), true); err == nil {
			return p.hand(b, size, SourceDevice), nil
		} else if !errors.Is(err, errNoPhysical) && !errors.Is(err, ErrOutOfMemory) {
			return 0, err // not the host's lack of memory, which spills whole
		}
	}
	if p.opt.Oversubscribe {
		base, err := p.spill(size, deviceFull)
		if err != nil && deviceFull {
			// Refused after all: the device gets its granules back, as
			// without oversubscription (below).
			p.releaseGranulesWhile(func() bool { return true })
		}
		return base, err
	}
	if errors.Is(err, errNoPhysical) && !deviceFull {
		return 0, p.refuse(size, nil) // the quota's refusal
	}
	if deviceFull {
		// The device itself is full: the granules mapped trying, and the
		// rest of the cache, go back to it for the GPU's other processes,
		// as every empty segment does under pressure without virtual memory.
		p.releaseGranulesWhile(func() bool { return true })
	}
	return 0, p.refuse(size, err)
}

// placeVirtual chooses the address of a block: found, the cached block
// fromClass found for the request (or nil), if its memory is mapped or can
// be from free and idle granules; otherwise, after moving the blocks of
// completed markers and synchronizing when any bytes are pending, the best
// cached block, the static reserve, or the start of a new arena. A
// cached block that would map granules gives way to one that maps fewer
// (preferDeviceMapped). It returns the block's shortOf, for commit, and
// whether a synchronization was refused for stream capture (the placement
// then goes on as if nothing were pending).
//
// It synchronizes whatever the pending bytes, not only when they could
// serve the request: a pending block, once free, merges with its free
// neighbours and may leave a granule idle, either of which can spare the
// granule the request would create. On random churn this takes peak
// reserved ÷ peak live from 1.146 to 1.137 and maps per allocation from
// 0.049 to 0.058, for 18% more synchronizations (1,378 to 1,625 forced;
// over 12 seeds of the trace, 1.150 to 1.145 on average). Near the quota
// it also synchronizes before a placement that would leave few granules
// within reach (runsShort). It synchronizes only while a Free is pending,
// so never more often than the driver's cudaFree, which waits at every
// free.
func (p *Pool) placeVirtual(size uint64, class int, c *streamCache, found *block) (b *block, short shortage, src Source, captured bool, err error) {
	if b = found; b != nil {
		if short = p.virt.shortOf(b, 0, size); !p.runsShort(short) {
			// A block on device granules already mapped (some idle)
			// skips the search for a better one, and its call.
			if short.unmapped+short.host > 0 {
				b, short = p.preferDeviceMapped(b, size, short)
			}
			return b, short, SourceCache, false, nil
		}
	}
	if p.pollMarkers() {
		b = p.fromClass(size, class, c, ownClass)
	}
	if (b == nil || p.runsShort(p.virt.shortOf(b, 0, size))) && p.pending.bytes > 0 {
		switch err = p.synchronize(); {
		case errors.Is(err, ErrStreamCapture):
			captured = true
		case err != nil:
			return nil, shortage{}, 0, false, err
		}
		// The lock was released, refused or not: b may be handed out.
		b = p.fromClass(size, class, c, ownClass)
	}
	if b != nil {
		if short = p.virt.shortOf(b, 0, size); short.unmapped+short.host > 0 {
			b, short = p.preferDeviceMapped(b, size, short)
		}
		return b, short, SourceCache, captured, nil
	}
	if p.opt.Reserve > 0 {
		// A static reserve (a fixed segment) serves every class first.
		if b := p.fromCache(size, class, c, anyClass); b != nil {
			return b, p.virt.shortOf(b, 0, size), SourceCache, captured, nil
		}
	}
	if b, err = p.growVirtual(size, class, false); err != nil {
		return nil, shortage{}, 0, captured, err
	}
	return b, p.virt.shortOf(b, 0, size), SourceDevice, captured, nil
}

// placementScan is how many free blocks of each class preferDeviceMapped visits:
// enough to find one on mapped granules most of the time (on random churn, 4
// take the granules mapped per allocation from 0.098 to 0.058 and peak
// reserved ÷ peak live from 1.158 to 1.137; 16 do no better: 1.152), few
// enough to keep a placement O(1).
const placementScan = 4

// preferDeviceMapped returns b, the cached block chosen to serve size bytes,
// whose first size bytes lie on the granules short counts, or, when some of
// them are not device memory already mapped (unmapped ones, which need
// memory, and host ones, on which a block is spilled from its first
// access), the free block of any class that lies on fewer, the fewest among placementScan visited in
// each class, smallest first. The free bytes of partly used granules serve
// any class, and each granule not mapped is physical memory the pool need
// not hold, or take from under another free range, and a driver call it
// does not make. (A class with no arena yet still reserves one: trying the
// other classes' free blocks first was measured worse, 1.156 on random
// churn, since the class's requests then miss its empty index every time.
// Counting a host granule as more than any number of unmapped ones kept as
// many accesses on the device on the Qwen2.5-32B trace at 60% of its peak,
// tests/tracetest, and spilled more of random churn, BenchmarkSpillVirtual:
// 0.633 of its peak live bytes at the peak against 0.607 when measured
// (0.588 with the placements of today), new host granules being made where
// free bytes of those already made would have done.)
// The block chosen comes with its shortOf.
func (p *Pool) preferDeviceMapped(b *block, size uint64, short shortage) (*block, shortage) {
	cost := short.unmapped + short.host
	for k := 0; k < numClasses && cost > 0; k++ {
		p.idx[k].scan(size, placementScan, func(c *block) bool {
			if c == b {
				return true
			}
			if s := p.virt.shortOf(c, 0, size); s.unmapped+s.host < cost {
				b, short, cost = c, s, s.unmapped+s.host
			}
			return cost > 0
		})
	}
	return b, short
}

// runsShort reports whether mapping the granules short finds unmapped
// under a block, with its idle ones, would create physical memory (there
// are fewer free granules and idle ones elsewhere), or, while a Free is
// pending, leave fewer than lowGranules within reach: free, idle, or
// within the quota's headroom. A synchronization then comes first: a
// refusal fails the application, which a wait for the device does not.
func (p *Pool) runsShort(short shortage) bool {
	v := p.virt
	if short.unmapped == 0 {
		return false
	}
	left := len(v.free) + v.idle.n - short.idle - short.unmapped
	if left < 0 {
		return true
	}
	return left < lowGranules && p.pending.bytes > 0 && uint64(left)+p.ledger.Headroom()>>v.shift < lowGranules
}

// lowGranules is how few granules within reach a placement may leave while
// a Free is pending before the pool synchronizes first (runsShort). On
// random churn under a quota of 1.10 × its peak live bytes, 16 (32 MiB)
// take the requests refused from 545 to 120 over eight seeds of the trace
// (from 7,407 to 7,130 under 1.05 ×), for three times the synchronizations
// forced (27,668 to 87,218 in 800,000 operations, 198,847 of them
// cudaFree; 8 refuse 210); with an unbounded quota, as where the pool's
// fragmentation is measured, nothing changes. Counting only the free and
// idle granules, whatever the quota, 8 would take peak reserved ÷ peak live
// from 1.131 to 1.115, for five to seven times the synchronizations of a
// steady-state pair among 1,000 or 10,000 live blocks (BenchmarkPairVirtual
// in cudaFree order: one every 6 to 9 pairs where one every 41 to 48):
// memory for waits the quota does not ask for.
const lowGranules = 16

// growVirtual reserves an arena for class large enough for size bytes (of
// exactly that, rounded up to the granularity, when exact) and returns its
// single free block, already in the class index. An arena holds no physical
// memory until blocks are handed out in it.
func (p *Pool) growVirtual(size uint64, class int, exact bool) (*block, error) {
	v := p.virt
	arena := alignUp(size, v.gran)
	if !exact {
		arena = max(arena, min(max(alignUp(2*p.opt.Quota, v.gran), arenaMin), arenaMax))
	}
	base, err := v.back.ReserveAddress(arena)
	if err != nil {
		if !isOOM(err) {
			p.stats.BackingErrors++
		}
		return nil, fmt.Errorf("pool: reserving %d bytes of address space: %w", arena, err)
	}
	if base%v.gran != 0 || base == 0 {
		p.stats.BackingErrors++
		freeErr := v.back.FreeAddress(base, arena)
		return nil, fmt.Errorf("pool: backing returned address range %#x, not aligned to %d bytes (free: %v)", base, v.gran, freeErr)
	}
	seg := &segment{base: base, size: arena, class: class, granules: make([]granule, arena>>v.shift)}
	for i := range seg.granules {
		seg.granules[i].va = base + uint64(i)<<v.shift
	}
	b := p.newBlock()
	b.base, b.size, b.seg, b.state = base, arena, seg, stateFree
	seg.head = b
	i, _ := slices.BinarySearchFunc(p.segs, base, bySegmentBase)
	p.segs = slices.Insert(p.segs, i, seg)
	p.idx[class].insert(b)
	p.stats.Segments++
	v.arenas[class]++
	return b, nil
}

// arenaEmptied frees the arena of b if b, a free block, now spans all of it
// and its class has another arena: address space is not held for nothing,
// while a class's last arena stays, so a pool that empties and fills again
// does not remap.
func (p *Pool) arenaEmptied(b *block) {
	seg := b.seg
	v := p.virt
	if seg.granules == nil || b.state != stateFree || b.prevPhys != nil || b.nextPhys != nil || v.arenas[seg.class] < 2 {
		return
	}
	for i := range seg.granules {
		if g := &seg.granules[i]; g.mapped && p.unmapGranule(g) != nil {
			return // counted and told; the arena stays
		}
	}
	if err := v.back.FreeAddress(seg.base, seg.size); err != nil {
		p.backingFailed(fmt.Errorf("pool: freeing the emptied arena at %#x: %w", seg.base, err))
		return // the arena stays, until Close
	}
	p.idx[seg.class].remove(b)
	p.recycle(b)
	i, _ := slices.BinarySearchFunc(p.segs, seg.base, bySegmentBase)
	p.segs = slices.Delete(p.segs, i, i+1)
	p.stats.Segments--
	v.arenas[seg.class]--
}

// granuleRange returns the indexes of the first and last granules of seg that
// [base, base+size) touches.
func (v *virtualMemory) granuleRange(seg *segment, base, size uint64) (first, last uint64) {
	shift := v.shift & 63 // always below 64: spares the compiler's check
	return (base - seg.base) >> shift, (base + size - 1 - seg.base) >> shift
}

// wholeSpan returns the addresses [lo, hi) of the granules that b, a free
// block of an arena, covers whole (none when lo >= hi). Granules are not
// counted byte by byte: blocks tile an arena and free neighbours always
// merge, so a granule holds bytes of blocks that are not free (live, pending,
// stream-owned) exactly when no free block covers it whole. Carving a block
// out of b can therefore put used bytes only on these granules, and freeing
// bytes can leave a granule unused only where the free block they merge
// into covers it whole.
func (v *virtualMemory) wholeSpan(b *block) (lo, hi uint64) {
	m := v.gran - 1
	return (b.base + m) &^ m, (b.base + b.size) &^ m
}

// wholeGranules returns wholeSpan(b) as indexes of granules of b's arena.
func (v *virtualMemory) wholeGranules(b *block) (lo, hi uint64) {
	lo, hi = v.wholeSpan(b)
	shift := v.shift & 63 // always below 64: spares the compiler's check
	return (lo - b.seg.base) >> shift, (hi - b.seg.base) >> shift
}

// onShared reports whether the size bytes off bytes into b, a free block of
// an arena, lie only on granules b shares with the blocks around it
// (newlyUsed finds none), which are mapped and in use: they end before b's
// first whole granule, start after its last, or b has no whole granule.
func (v *virtualMemory) onShared(b *block, off, size uint64) bool {
	lo, hi := v.wholeSpan(b)
	at := b.base + off
	return at+size <= lo || hi <= lo || at >= hi
}

// leftWhole reports whether b, a free block of an arena, covers whole a
// granule that the bytes [base, base+size), just made free and merged into
// it, lie on (granulesLeft has work to do).
func (v *virtualMemory) leftWhole(b *block, base, size uint64) bool {
	lo, hi := v.wholeSpan(b)
	return max(base, lo) < min(base+size, hi)
}

// newlyUsed returns the indexes [from, to) of the granules under the size
// bytes off bytes into b, a free block of an arena, that b covers whole:
// those the bytes would be the first to use (none when from >= to).
func (v *virtualMemory) newlyUsed(b *block, off, size uint64) (from, to uint64) {
	first, last := v.granuleRange(b.seg, b.base+off, size)
	lo, hi := v.wholeGranules(b)
	return max(first, lo), min(last+1, hi)
}

// spotIn returns where in b, a cached block of at least size bytes, the
// block is best carved (off bytes into it), with its shortOf. In a free block
// of an arena it tries six places: either end of b, and a start or an end
// on the granule boundary nearest either end; it takes the one that puts
// used bytes on the fewest granules holding none, then, for a block of a
// granule or more, the one that covers the most granules whole (so that,
// once free, the block leaves them unused but for its remainder), then the
// one that leaves the fewest free bytes beside the block in its own first
// and last granules (a free byte there is held memory that only a block
// fitting beside it can use), then the lowest.
func (p *Pool) spotIn(b *block, size uint64, short shortage) (uint64, shortage) {
	v := p.virt
	if b.state != stateFree || b.seg.granules == nil || b.size == size {
		return 0, short
	}
	m := v.gran - 1
	r := spotRanker{b: b.base, end: b.base + b.size, size: size, m: m, shift: v.shift & 63}
	r.wholeLo, r.wholeHi = v.wholeSpan(b)
	first, last := r.b, r.end-size // the lowest and highest starts
	bestAt, best := first, r.rank(first)
	try := func(at uint64) {
		if at <= first || at > last {
			return // the start of b, ranked already, or outside b
		}
		if k := r.rank(at); k.less(best) || k == best && at < bestAt {
			best, bestAt = k, at
		}
	}
	try(last)
	try((first + m) &^ m)
	try((first+size+m)&^m - size)
	try(last &^ m)
	try((last+size)&^m - size)
	if bestAt == first {
		return 0, short
	}
	off := bestAt - first
	if s := v.shortOf(b, off, size); s.unmapped+s.host <= short.unmapped+short.host {
		return off, s
	}
	return 0, short // the block was chosen for no more granules to map than that
}

// spotKey ranks the places spotIn tries, smallest first: fresh granules
// (covered whole by the free block, used by none), then whole ones under
// the block (negated), then free bytes left beside it in its end granules.
type spotKey struct {
	fresh, whole, beside uint64
}

func (k spotKey) less(o spotKey) bool {
	if k.fresh != o.fresh {
		return k.fresh < o.fresh
	}
	if k.whole != o.whole {
		return k.whole > o.whole
	}
	return k.beside < o.beside
}

// spotRanker ranks the places of size bytes inside a free block of an arena,
// [b, end), whose whole granules span [wholeLo, wholeHi); m is the
// granularity less one, and 1<<shift the granularity.
type spotRanker struct {
	b, end, wholeLo, wholeHi, size, m uint64
	shift                             uint
}

// rank returns the spotKey of the block's bytes at [at, at+size).
func (r *spotRanker) rank(at uint64) (k spotKey) {
	hi := at + r.size
	atDown, hiUp := at&^r.m, (hi+r.m)&^r.m
	// The granules under the block that the free block covers whole.
	if a, z := max(atDown, r.wholeLo), min(hiUp, r.wholeHi); z > a {
		k.fresh = (z - a) >> r.shift
	}
	if atUp, hiDown := (at+r.m)&^r.m, hi&^r.m; r.size > r.m && hiDown > atUp {
		k.whole = (hiDown - atUp) >> r.shift
	}
	if at > r.b && at != atDown {
		k.beside = at - max(r.b, atDown)
	}
	if hi < r.end && hi != hiUp {
		k.beside += min(r.end, hiUp) - hi
	}
	return k
}

// shortage counts the granules under bytes of a block that are not device
// memory mapped and in use (shortOf).
type shortage struct {
	unmapped, idle, host int
}

// shortOf returns how many granules under the size bytes off bytes into b
// are not mapped, how many are idle and how many are mapped to host memory,
// for a free block of an arena; a stream-owned block's memory is mapped and
// used, and the reserve is a fixed segment.
func (v *virtualMemory) shortOf(b *block, off, size uint64) (s shortage) {
	if b.state != stateFree || b.seg.granules == nil {
		return s
	}
	if v.hostGranules == 0 && v.onShared(b, off, size) {
		return s // on granules in use, none of them host memory
	}
	first, last := v.granuleRange(b.seg, b.base+off, size)
	for i := first; i <= last; i++ {
		switch g := &b.seg.granules[i]; {
		case !g.mapped:
			s.unmapped++
		case g.inIdle:
			s.idle++
		case g.host:
			s.host++
		}
	}
	return s
}

// commit maps physical memory under the size bytes off bytes into b, which
// are about to be handed out, and counts the granules they newly use
// (granulesTaken); short is shortOf(b, off, size), taken since the last
// change to the granules. A stream-owned block's granules are in use
// already, and the reserve is a fixed segment. It fails with errNoPhysical,
// changing nothing, when the granules free, idle or within the quota cannot
// cover the block.
func (p *Pool) commit(b *block, off, size uint64, short shortage, spill bool) error {
	if b.state != stateFree || b.seg.granules == nil {
		return nil
	}
	v := p.virt
	seg := b.seg
	first, last := v.granuleRange(seg, b.base+off, size)
	need, idleHere := short.unmapped, short.idle
	if need == 0 && idleHere == 0 {
		// The common case: every granule under the block is mapped and in
		// use, so there is nothing to find, take or map (nor to ask the
		// ledger, whose lock costs more than the rest).
		p.granulesTaken(b, off, size)
		return nil
	}
	if spare := uint64(len(v.free) + v.idle.n - idleHere); uint64(need) > spare {
		// New granules are needed: only then is the ledger asked.
		headroom := p.ledger.Headroom() >> v.shift
		if spill && p.hostBytes < p.opt.HostLimit {
			headroom += (p.opt.HostLimit - p.hostBytes) >> v.shift
		}
		if uint64(need) > spare+headroom {
			return fmt.Errorf("pool: %d granules needed for %d bytes: %w", need, size, errNoPhysical)
		}
	}
	// The idle granules under the block are taken first, so that finding
	// physical memory for the others never unmaps them.
	for i := first; i <= last; i++ {
		if g := &seg.granules[i]; g.inIdle {
			v.idle.remove(g)
		}
	}
	hostMapped := false // host granules mapped for this block, to report
	for i := first; i <= last; i++ {
		g := &seg.granules[i]
		if g.mapped {
			continue
		}
		if err := p.mapGranule(g, spill); err != nil {
			// The block is not handed out: what is mapped so far stays
			// mapped, idle, except spilled memory, which goes back.
			from, to := v.newlyUsed(b, off, size)
			for j := first; j <= last; j++ {
				g := &seg.granules[j]
				g.newHost = false
				if j >= from && j < to && g.mapped && !g.inIdle {
					p.granuleUnused(g)
				}
			}
			return err
		}
		g.newHost = g.host
		hostMapped = hostMapped || g.host
	}
	p.granulesTaken(b, off, size)
	if hostMapped {
		p.reportSpill(seg, first, last)
	}
	return nil
}

// reportSpill tells the Observer where the host granules just mapped
// between granules first and last of seg lie (their newHost is set, and
// cleared here): one Spill per granule, so that a tracer classifies accesses
// by the ranges that really are on the host, and each granule can go back
// to the host (a Free of its range, in granuleUnused) or be promoted
// (migration) on its own.
func (p *Pool) reportSpill(seg *segment, first, last uint64) {
	for i := first; i <= last; i++ {
		if g := &seg.granules[i]; g.newHost {
			g.newHost = false
			p.spilledGranule(g)
		}
	}
}

// mapGranule maps physical memory at g: a free granule, a new one within the
// quota, or the oldest idle granule unmapped from where it was. Unmapping an
// idle granule is safe: none of its bytes belongs to a block that queued work
// may still use.
func (p *Pool) mapGranule(g *granule, spill bool) error {
	v := p.virt
	host := false
	h, err := p.takePhysical()
	if err != nil && spill && errors.Is(err, errNoPhysical) {
		h, err = p.createHostGranule()
		host = true
	}
	if err != nil {
		return err
	}
	if err := v.back.Map(g.va, v.gran, h); err != nil {
		p.stats.BackingErrors++
		if host {
			p.releaseHostGranule(h)
		} else {
			v.free = append(v.free, h)
		}
		return fmt.Errorf("pool: mapping a granule at %#x: %w", g.va, err)
	}
	g.handle, g.mapped, g.host = h, true, host
	p.stats.GranuleMaps++
	return nil
}

func (p *Pool) takePhysical() (uint64, error) {
	v := p.virt
	if n := len(v.free); n > 0 {
		h := v.free[n-1]
		v.free = v.free[:n-1]
		return h, nil
	}
	if g := v.idle.head; g != nil {
		if err := p.unmapGranule(g); err == nil {
			h := v.free[len(v.free)-1]
			v.free = v.free[:len(v.free)-1]
			return h, nil
		}
	}
	if !p.ledger.Take(v.gran) {
		return 0, fmt.Errorf("pool: no granule within the quota: %w", errNoPhysical)
	}
	h, err := v.back.CreatePhysical(v.gran, TierDevice)
	if err != nil {
		p.ledger.Give(v.gran)
		if errors.Is(err, ErrOutOfMemory) {
			// The device is full below the quota (other processes hold the
			// rest): short of granules as a full quota is, so the caller
			// spills or refuses the same way.
			return 0, fmt.Errorf("pool: creating a %d-byte granule: %w: %w", v.gran, err, errNoPhysical)
		}
		p.stats.BackingErrors++
		return 0, fmt.Errorf("pool: creating a %d-byte granule: %w", v.gran, err)
	}
	v.granule++
	p.segBytes += v.gran
	p.addDevice(v.gran)
	p.stats.Granules = v.granule
	return h, nil
}

// createHostGranule creates a host-located granule within the host limit.
func (p *Pool) createHostGranule() (uint64, error) {
	v := p.virt
	if p.hostBytes+v.gran > p.opt.HostLimit {
		return 0, fmt.Errorf("pool: no host granule within the host limit: %w", errNoPhysical)
	}
	h, err := v.back.CreatePhysical(v.gran, TierPinned)
	if err != nil {
		if !isOOM(err) {
			p.stats.BackingErrors++
		}
		return 0, fmt.Errorf("pool: creating a %d-byte host granule: %w", v.gran, err)
	}
	p.hostBytes += v.gran
	p.segBytes += v.gran // live bytes on it count in segLive
	v.hostGranules++
	// In the peak and the total only once it holds the application's bytes
	// (spilledGranule): a placement that fails gives it back unspilled.
	p.stats.SpilledBytes += v.gran
	return h, nil
}

// releaseHostGranule frees a host granule mapped nowhere. One the host
// fails to free stays held and counted, until Close tries again.
func (p *Pool) releaseHostGranule(h uint64) {
	v := p.virt
	if err := v.back.ReleasePhysical(h, v.gran); err != nil {
		v.unreleasedHost = append(v.unreleasedHost, h)
		p.backingFailed(fmt.Errorf("pool: releasing host granule %#x: %w", h, err))
		return
	}
	p.hostBytes -= v.gran
	p.segBytes -= v.gran
	v.hostGranules--
	p.stats.SpilledBytes -= v.gran
}

// hostShare is how many of the bytes of [base, base+size) of seg lie on
// host granules.
func (v *virtualMemory) hostShare(seg *segment, base, size uint64) uint64 {
	if seg.granules == nil {
		return 0
	}
	var n uint64
	first, last := v.granuleRange(seg, base, size)
	for i := first; i <= last; i++ {
		if g := &seg.granules[i]; g.host {
			n += min(base+size, g.va+v.gran) - max(base, g.va)
		}
	}
	return n
}

// unmapGranule unmaps an idle granule and keeps its physical memory free.
func (p *Pool) unmapGranule(g *granule) error {
	v := p.virt
	v.idle.remove(g)
	if err := v.back.Unmap(g.va, v.gran); err != nil {
		// Its state is unknown: never use this granule again. No caller
		// fails for it: each goes without the granule.
		err = fmt.Errorf("pool: unmapping the granule at %#x: %w", g.va, err)
		p.backingFailed(err)
		return err
	}
	g.mapped = false
	v.free = append(v.free, g.handle)
	p.stats.GranuleUnmaps++
	return nil
}

// useMapped reports whether the first size bytes of b, a cached block about
// to be handed out, lie on device granules mapped and in use, and then stamps
// them hot for migration; otherwise it changes nothing. It reports true for a
// stream-owned block, whose memory is mapped and used, and for the reserve,
// a fixed segment. It is shortOf and commit at once, for the block most
// placements find: when the bytes lie only on the granules b shares with the
// blocks around it (wholeGranules), not one granule is read.
func (p *Pool) useMapped(b *block, size uint64) bool {
	seg := b.seg
	if b.state != stateFree || seg.granules == nil {
		return true
	}
	v := p.virt
	if !v.onShared(b, 0, size) {
		return false // on a granule with no used byte: idle or not mapped
	}
	if v.hostGranules != 0 {
		first, last := v.granuleRange(seg, b.base, size)
		for i := first; i <= last; i++ {
			if seg.granules[i].host {
				return false
			}
		}
	}
	if p.migration != nil {
		v.stampHot(seg, b.base, size)
	}
	return true
}

// granulesTaken is called when the size bytes off bytes into b, a free
// block, are about to be handed out with every granule under them mapped:
// those that b covered whole now hold used bytes. With migration, every
// granule under them is stamped hot.
func (p *Pool) granulesTaken(b *block, off, size uint64) {
	v := p.virt
	if from, to := v.newlyUsed(b, off, size); from < to {
		v.inUse += to - from
		v.inUsePeak = max(v.inUsePeak, v.inUse)
	}
	if p.migration != nil {
		v.stampHot(b.seg, b.base+off, size)
	}
}

// stampHot marks the granules under [base, base+size) of seg as handed out
// on in the current interval (see migrate).
func (v *virtualMemory) stampHot(seg *segment, base, size uint64) {
	if seg.granules == nil {
		return
	}
	first, last := v.granuleRange(seg, base, size)
	for i := first; i <= last; i++ {
		seg.granules[i].hot = v.epoch
	}
}

// granulesLeft is called when the bytes [base, base+size) of an arena have
// become free and merged into the free block b: the granules they lie on
// that b covers whole hold no used byte any more.
func (p *Pool) granulesLeft(b *block, base, size uint64) {
	v := p.virt
	first, last := v.granuleRange(b.seg, base, size)
	lo, hi := v.wholeGranules(b)
	for i := max(first, lo); i <= last && i < hi; i++ {
		v.inUse--
		p.granuleUnused(&b.seg.granules[i])
	}
}

// granuleUnused is called when no used byte is left on a mapped granule: a
// device granule becomes idle; spilled memory goes back at once, and device
// memory is mapped in its place when the address is used again.
func (p *Pool) granuleUnused(g *granule) {
	v := p.virt
	if !g.host {
		v.idle.push(g)
		return
	}
	if err := v.back.Unmap(g.va, v.gran); err != nil {
		// Its state is unknown: left as it is, until Close.
		p.backingFailed(fmt.Errorf("pool: unmapping the host granule at %#x: %w", g.va, err))
		return
	}
	g.mapped, g.host = false, false
	p.stats.GranuleUnmaps++
	p.releaseHostGranule(g.handle)
	p.reportHostFree(g)
}

// reportHostFree tells the Observer that the host granule g, reported by
// Spill, has gone back to the host.
func (p *Pool) reportHostFree(g *granule) {
	v := p.virt
	if g.spillN == 0 {
		return
	}
	g.spillN = 0
	v.spilledNow--
	if p.obs != nil {
		p.obs.Free(g.va, v.gran, TierPinned)
	}
}

// releaseGranulesWhile returns free then idle granules to the device while
// cond holds.
func (p *Pool) releaseGranulesWhile(cond func() bool) {
	v := p.virt
	if v == nil {
		return
	}
	for cond() {
		if len(v.free) == 0 {
			g := v.idle.head
			if g == nil || p.unmapGranule(g) != nil {
				return
			}
		}
		h := v.free[len(v.free)-1]
		if err := v.back.ReleasePhysical(h, v.gran); err != nil {
			// The granule stays free and counted; a later release tries again.
			p.backingFailed(fmt.Errorf("pool: releasing physical granule %#x: %w", h, err))
			return
		}
		v.free = v.free[:len(v.free)-1]
		v.granule--
		p.stats.Granules = v.granule
		p.segBytes -= v.gran
		p.subDevice(v.gran)
		p.stats.BytesReleased += v.gran
	}
}

// releasableBytes is the device memory the pool could return at once without
// touching a block: empty segments, free and idle granules.
func (p *Pool) releasableBytes() uint64 {
	n := p.empty.bytes
	if v := p.virt; v != nil {
		n += uint64(len(v.free)+v.idle.n) << v.shift
	}
	return n
}

// closeVirtual unmaps and releases every granule and frees every arena.
func (p *Pool) closeVirtual() []error {
	v := p.virt
	var errs []error
	for _, seg := range p.segs {
		if seg.granules == nil {
			continue
		}
		for i := range seg.granules {
			g := &seg.granules[i]
			if !g.mapped {
				continue
			}
			if err := v.back.Unmap(g.va, v.gran); err != nil {
				errs = append(errs, fmt.Errorf("pool: unmapping the granule at %#x: %w", g.va, err))
				continue
			}
			if g.host {
				if err := v.back.ReleasePhysical(g.handle, v.gran); err != nil {
					errs = append(errs, fmt.Errorf("pool: releasing host granule %#x: %w", g.handle, err))
				}
				p.reportHostFree(g)
				continue
			}
			v.free = append(v.free, g.handle)
		}
		if err := v.back.FreeAddress(seg.base, seg.size); err != nil {
			errs = append(errs, fmt.Errorf("pool: freeing the address range %#x: %w", seg.base, err))
		}
	}
	for _, h := range v.free {
		if err := v.back.ReleasePhysical(h, v.gran); err != nil {
			errs = append(errs, fmt.Errorf("pool: releasing physical granule %#x: %w", h, err))
		}
	}
	for _, h := range v.unreleasedHost {
		if err := v.back.ReleasePhysical(h, v.gran); err != nil {
			errs = append(errs, fmt.Errorf("pool: releasing host granule %#x: %w", h, err))
		}
	}
	p.segs = slices.DeleteFunc(p.segs, func(s *segment) bool { return s.granules != nil })
	v.free, v.idle, v.granule, v.arenas, v.inUse, v.inUsePeak = nil, idleList{}, 0, [numClasses]int{}, 0, 0
	v.spilledNow, v.unreleasedHost, v.hostGranules, v.hostLive = 0, nil, 0, 0
	return errs
}

// fewestGranules returns the free block, of any class, whose first size
// bytes lie on the fewest unmapped granules (then the smallest, then the
// lowest), or nil if none is large enough: under quota pressure, the free
// parts of partly used granules, and the reserve's free blocks, which lie on
// none, are used before new granules are needed.
// (preferDeviceMapped is the same search, bounded, off the pressure path.)
func (p *Pool) fewestGranules(size uint64) *block {
	var best *block
	bestN := 0
	for k := range numClasses {
		p.idx[k].scan(size, math.MaxInt, func(b *block) bool {
			n := p.virt.shortOf(b, 0, size).unmapped
			if best == nil || n < bestN || n == bestN && (b.size < best.size || b.size == best.size && b.base < best.base) {
				best, bestN = b, n
			}
			return true
		})
	}
	return best
}
