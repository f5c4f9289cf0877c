package pool_test

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
	"github.com/spillway-gpu/spillway/tests/traces"
)

// Two models of placement over 2 MiB granules, to read the pool's peak
// reserved ÷ peak live against: how little physical memory a placement that
// never moves a live block could hold on a trace. Both are freer than the
// pool: every free is complete at once (no pending or stream-owned bytes;
// or, replayed by replayWaiting, reusable once the work queued before it
// retires, sooner than the pool's), and each request searches every granule
// or free range, where the pool looks at a few blocks. Their choices are greedy (a request takes the
// fewest granules with no used byte, then leaves the fewest bytes free in
// partly used ones; each model also has a rule with the partly used
// granules' fragments in view, placeFragments), so no figure is a proven
// bound, but each shows how far placement alone gets under its mapping
// rule.
//
// The stitching model (stitchModel) may map a granule at any number of
// addresses: a block may take any granule's free tail as its first bytes
// and any other granule's free head as its last (a block is contiguous in
// addresses only, and an address range maps whole granules, so only its
// first and last granules may be shared). What it cannot do is what the
// mapping rules forbid: use a free range inside a granule for anything but a
// block that fits in it.
//
// The one-address model (addressModel) maps each granule at one address, as
// the pool does: a block is a free range of address space, and only the
// granules under it that hold no used byte need memory.

// modelGranule is a physical granule of the model: its free byte ranges, in
// address order, merged.
type modelGranule struct {
	id   int // creation order: ties go to the newest, so replays repeat
	free [][2]uint64
	used uint64
}

// newer reports whether a was created after b; nil (a granule yet to be
// made) loses every tie.
func newer(a, b *modelGranule) bool {
	return a != nil && (b == nil || a.id > b.id)
}

// piece is the part of a granule a block uses.
type piece struct {
	g      *modelGranule
	lo, hi uint64
}

type stitchModel struct {
	// repack: at every synchronization, live bytes move to as few
	// granules as CUDA's mappings allow (see repackLive): the most a pool
	// could do by moving live bytes where the application waits for the
	// device.
	repack bool
	// fragments: place with the partly used granules' fragments in view
	// (placeFragments) rather than taking whole free tails.
	fragments      bool
	partial        map[*modelGranule]bool // granules with used and free bytes
	spare          []*modelGranule        // granules with no used byte
	held, peakHeld uint64
	blocks         map[uint32][]piece
}

func newStitchModel(repack, fragments bool) *stitchModel {
	return &stitchModel{repack: repack, fragments: fragments, partial: map[*modelGranule]bool{}, blocks: map[uint32][]piece{}}
}

// repackLive moves the live bytes to as few granules as hold them without
// changing an address. A block's address fixes where in a granule each of
// its bytes lies, so moving can only gather onto one granule pieces of
// different granules that lie at disjoint offsets (the granule then mapped
// at each of their addresses). Gathering intervals into the fewest groups
// of disjoint ones is interval partitioning: by increasing start, each
// piece joins the group whose last piece ended first, if it ended by the
// piece's start; this needs as many groups as the most pieces covering one
// offset, the minimum.
func (m *stitchModel) repackLive() {
	ids := slices.Sorted(maps.Keys(m.blocks))
	type partialPiece struct {
		id     uint32
		i      int // index among the block's pieces
		lo, hi uint64
	}
	var pieces []partialPiece
	m.partial, m.spare, m.held = map[*modelGranule]bool{}, nil, 0
	for _, id := range ids {
		for i, p := range m.blocks[id] {
			if p.lo == 0 && p.hi == granule {
				m.blocks[id][i] = m.take(m.granule(), 0, granule)
				continue
			}
			pieces = append(pieces, partialPiece{id, i, p.lo, p.hi})
		}
	}
	slices.SortStableFunc(pieces, func(a, b partialPiece) int { return cmp.Compare(a.lo, b.lo) })
	var groups []*modelGranule // each ends where its last piece ends
	ends := map[*modelGranule]uint64{}
	for _, p := range pieces {
		var g *modelGranule
		for _, c := range groups {
			if ends[c] <= p.lo && (g == nil || ends[c] < ends[g]) {
				g = c
			}
		}
		if g == nil {
			g = m.granule()
			groups = append(groups, g)
		}
		m.blocks[p.id][p.i] = m.take(g, p.lo, p.hi)
		ends[g] = p.hi
	}
}

func (m *stitchModel) granule() *modelGranule {
	if n := len(m.spare); n > 0 {
		g := m.spare[n-1]
		m.spare = m.spare[:n-1]
		return g
	}
	m.held += granule
	m.peakHeld = max(m.peakHeld, m.held)
	return &modelGranule{id: int(m.held / granule), free: [][2]uint64{{0, granule}}}
}

func (m *stitchModel) take(g *modelGranule, lo, hi uint64) piece {
	for i, f := range g.free {
		if f[0] <= lo && hi <= f[1] {
			rest := append([][2]uint64{}, g.free[:i]...)
			if f[0] < lo {
				rest = append(rest, [2]uint64{f[0], lo})
			}
			if hi < f[1] {
				rest = append(rest, [2]uint64{hi, f[1]})
			}
			g.free = append(rest, g.free[i+1:]...)
			g.used += hi - lo
			m.partial[g] = g.used < granule
			if g.used == granule {
				delete(m.partial, g)
			}
			return piece{g, lo, hi}
		}
	}
	panic(fmt.Sprintf("stitch model: [%d, %d) is not free", lo, hi))
}

func (m *stitchModel) give(p piece) {
	g := p.g
	i := 0
	for i < len(g.free) && g.free[i][0] < p.lo {
		i++
	}
	g.free = append(g.free[:i], append([][2]uint64{{p.lo, p.hi}}, g.free[i:]...)...)
	merged := g.free[:1]
	for _, f := range g.free[1:] {
		if last := &merged[len(merged)-1]; last[1] == f[0] {
			last[1] = f[1]
		} else {
			merged = append(merged, f)
		}
	}
	g.free = merged
	g.used -= p.hi - p.lo
	delete(m.partial, g)
	if g.used == 0 {
		m.spare = append(m.spare, g)
	} else {
		m.partial[g] = true
	}
}

// freeTail and freeHead are the free bytes of g at its end and its start.
func freeTail(g *modelGranule) uint64 {
	if n := len(g.free); n > 0 && g.free[n-1][1] == granule {
		return granule - g.free[n-1][0]
	}
	return 0
}

func freeHead(g *modelGranule) uint64 {
	if len(g.free) > 0 && g.free[0][0] == 0 {
		return g.free[0][1]
	}
	return 0
}

// place puts size bytes where they take the fewest granules with no used
// byte, then leave the fewest bytes free in granules that also hold used
// bytes: inside one free range (best fit), or as a free tail, whole spare or
// new granules, and a free head (or the head of a new granule, whose rest is
// then left over).
func (m *stitchModel) place(size uint64) []piece {
	if m.fragments {
		return m.placeFragments(size)
	}
	var inG *modelGranule
	var inRange [2]uint64
	inLeft := ^uint64(0)
	if size <= granule {
		for g := range m.partial {
			for _, f := range g.free {
				n := f[1] - f[0]
				if n >= size && (n-size < inLeft || n-size == inLeft && (g.id > inG.id || g == inG && f[0] < inRange[0])) {
					inG, inRange, inLeft = g, f, n-size
				}
			}
		}
	}
	tails := []*modelGranule{nil}
	heads := []*modelGranule{nil}
	for g := range m.partial {
		if freeTail(g) > 0 {
			tails = append(tails, g)
		}
		if freeHead(g) > 0 {
			heads = append(heads, g)
		}
	}
	var bestTail, bestHead *modelGranule
	stitchNew, stitchLeft := ^uint64(0), ^uint64(0)
	for _, t := range tails {
		x := uint64(0)
		if t != nil {
			x = freeTail(t)
		}
		if x > size {
			continue
		}
		r := (size - x) % granule
		for _, h := range heads {
			made, left := (size-x)/granule, uint64(0)
			switch {
			case h == nil && r > 0:
				made, left = made+1, granule-r
			case h != nil && (h == t || freeHead(h) < r):
				continue
			case h != nil:
				left = freeHead(h) - r
			}
			better := made < stitchNew || made == stitchNew && left < stitchLeft
			tie := made == stitchNew && left == stitchLeft && (newer(t, bestTail) || t == bestTail && newer(h, bestHead))
			if better || tie {
				bestTail, bestHead, stitchNew, stitchLeft = t, h, made, left
			}
		}
	}
	if inG != nil && (stitchNew > 0 || inLeft <= stitchLeft) {
		lo := inRange[0]
		if lo == 0 && inRange[1] != granule {
			lo = inRange[1] - size // against the used bytes after it
		}
		return []piece{m.take(inG, lo, lo+size)}
	}
	var ps []piece
	rest := size
	if bestTail != nil {
		x := freeTail(bestTail)
		ps = append(ps, m.take(bestTail, granule-x, granule))
		rest -= x
	}
	for ; rest >= granule; rest -= granule {
		ps = append(ps, m.take(m.granule(), 0, granule))
	}
	if rest > 0 {
		h := bestHead
		if h == nil {
			h = m.granule()
		}
		ps = append(ps, m.take(h, 0, rest))
	}
	return ps
}

// placeFragments puts size bytes where they take the fewest granules with
// no used byte, then leave the fewest bytes free beside them in the granules
// they share, then in the newest granules, as place does, but with more
// positions in view. A stitched block may take only part of a free tail or
// head: as much as it can of either, with its other bytes covering whole
// granules, so that one end lies on a granule boundary, or not (the tail
// and head then together hold size mod 2 MiB and another 2 MiB). A block
// under a granule inside a free range lies against the granule's boundary
// where the range has one (at the start of a free head, at the end of a
// free tail), else at the range's start.
//
// On random churn this takes peak reserved ÷ peak live from 1.058 to 1.045
// (four other seeds of the trace: 1.057 to 1.046 on average), the other
// traces staying at 1.000. The gain is the small blocks' position: with
// them against the used bytes beside their range, as place puts them, 1.058
// (seeds 1.061), 54 MiB rather than 19 MiB of the waste at the peak lying in
// holes inside granules. Taking only whole free tails, as place does, gives
// 1.049 (seeds 1.046 too). The keys of the one-address rule that this one
// lacks, the most whole granules and a best fit on the free ranges a block
// takes bytes from, choose the same places here (the same figures on nine
// seeds). At the peak, 26 of the 46 MiB of waste lie in 43 free tails that
// no block ends in (free heads are rare: 1 MiB), 19 MiB in 260 holes inside
// granules, 9 MiB of it in holes under 256 KiB.
func (m *stitchModel) placeFragments(size uint64) []piece {
	age := func(g *modelGranule) int64 {
		if g == nil {
			return 0
		}
		return int64(g.id)
	}
	// A block goes inside a free range of hole at lo, or takes the last a
	// bytes of tail (none if nil), whole granules, and the first b bytes of
	// head (a new granule where nil).
	var best struct {
		hole, tail, head *modelGranule
		lo, a, b, whole  uint64
	}
	bestKey := [4]int64{math.MaxInt64} // granules with no used byte, bytes free beside, then the newest
	better := func(key [4]int64) bool {
		if slices.Compare(key[:], bestKey[:]) < 0 {
			bestKey = key
			return true
		}
		return false
	}
	if size < granule {
		for g := range m.partial {
			for _, f := range g.free {
				if f[1]-f[0] < size {
					continue
				}
				lo := f[0]
				if f[1] == granule {
					lo = granule - size
				}
				if better([4]int64{0, int64(f[1] - f[0] - size), -age(g), -age(g)}) {
					best.hole, best.lo = g, lo
				}
			}
		}
	}
	type end struct {
		g     *modelGranule // nil: none, or a new granule where fresh
		free  uint64        // the bytes it can give
		fresh bool
	}
	tails := []end{{}}
	heads := []end{{}, {free: granule, fresh: true}}
	for g := range m.partial {
		if x := freeTail(g); x > 0 {
			tails = append(tails, end{g: g, free: x})
		}
		if x := freeHead(g); x > 0 {
			heads = append(heads, end{g: g, free: x})
		}
	}
	for _, t := range tails {
		for _, h := range heads {
			if t.g != nil && t.g == h.g {
				continue
			}
			for _, ends := range []uint64{size % granule, size%granule + granule} {
				if ends > size || ends == 0 && (t.free > 0 || h.free > 0) {
					continue
				}
				for _, a := range []uint64{min(t.free, ends), ends - min(ends, h.free)} {
					b := ends - a
					if a > t.free || b > h.free || (a > 0) != (t.g != nil) || (b > 0) != (h.free > 0) || h.fresh && b == granule {
						continue
					}
					whole := (size - ends) / granule
					made := whole
					if h.fresh {
						made++
					}
					if better([4]int64{int64(made), int64(t.free - a + h.free - b), -age(t.g), -age(h.g)}) {
						best.hole, best.tail, best.head, best.a, best.b, best.whole = nil, t.g, h.g, a, b, whole
					}
				}
			}
		}
	}
	if best.hole != nil {
		return []piece{m.take(best.hole, best.lo, best.lo+size)}
	}
	var ps []piece
	if best.tail != nil {
		ps = append(ps, m.take(best.tail, granule-best.a, granule))
	}
	for range best.whole {
		ps = append(ps, m.take(m.granule(), 0, granule))
	}
	if best.b > 0 {
		h := best.head
		if h == nil {
			h = m.granule()
		}
		ps = append(ps, m.take(h, 0, best.b))
	}
	return ps
}

func (m *stitchModel) alloc(id uint32, size uint64) { m.blocks[id] = m.place(size) }

func (m *stitchModel) release(id uint32) {
	for _, p := range m.blocks[id] {
		m.give(p)
	}
	delete(m.blocks, id)
}

func (m *stitchModel) sync() {
	if m.repack {
		m.repackLive()
	}
}

func (m *stitchModel) peakReserved() uint64 { return m.peakHeld }

// allocWithin places block id only where it needs no granule more than the
// model holds; else it takes the placement back, the granules it made (the
// newest, spare once the block is gone) dropped, and reports false.
func (m *stitchModel) allocWithin(id uint32, size uint64) bool {
	held, peak := m.held, m.peakHeld
	m.alloc(id, size)
	if m.held == held {
		return true
	}
	m.release(id)
	m.spare = slices.DeleteFunc(m.spare, func(g *modelGranule) bool { return uint64(g.id) > held/granule })
	m.held, m.peakHeld = held, peak
	return false
}

// addressModel is the one-address model: free address ranges (sorted,
// merged; the address space is unbounded) and the used bytes of each
// granule, by index, that holds any.
type addressModel struct {
	// fragments: place with the partly used granules in view
	// (placeFragments) rather than at the start of a free range.
	fragments      bool
	free           [][2]uint64
	used           map[uint64]uint64
	held, peakHeld uint64
	blocks         map[uint32][2]uint64
}

func newAddressModel(fragments bool) *addressModel {
	return &addressModel{fragments: fragments, free: [][2]uint64{{0, 1 << 50}}, used: map[uint64]uint64{}, blocks: map[uint32][2]uint64{}}
}

// unused counts the granules under [lo, hi) that hold no used byte.
func (m *addressModel) unused(lo, hi uint64) uint64 {
	n := uint64(0)
	for g := lo / granule; g <= (hi-1)/granule; g++ {
		if m.used[g] == 0 {
			n++
		}
	}
	return n
}

// use adds (or, with take false, removes) [lo, hi) to the used bytes of the
// granules under it; a granule holds memory while it holds a used byte.
func (m *addressModel) use(lo, hi uint64, take bool) {
	for g := lo / granule; g <= (hi-1)/granule; g++ {
		n := min(hi, (g+1)*granule) - max(lo, g*granule)
		switch {
		case take && m.used[g] == 0:
			m.held += granule
			m.peakHeld = max(m.peakHeld, m.held)
			m.used[g] = n
		case take:
			m.used[g] += n
		case m.used[g] == n:
			m.held -= granule
			delete(m.used, g)
		default:
			m.used[g] -= n
		}
	}
}

// place takes size bytes at the start of the free range where they need
// the fewest unused granules, then of the smallest such range, then of the
// lowest.
func (m *addressModel) place(size uint64) [2]uint64 {
	if m.fragments {
		return m.placeFragments(size)
	}
	best, bestNew := -1, ^uint64(0)
	for i, f := range m.free {
		if f[1]-f[0] < size {
			continue
		}
		n := m.unused(f[0], f[0]+size)
		if n < bestNew || n == bestNew && f[1]-f[0] < m.free[best][1]-m.free[best][0] {
			best, bestNew = i, n
		}
	}
	f := m.free[best]
	if f[1]-f[0] == size {
		m.free = slices.Delete(m.free, best, best+1)
	} else {
		m.free[best][0] += size
	}
	m.use(f[0], f[0]+size, true)
	return [2]uint64{f[0], f[0] + size}
}

// placeFragments takes size bytes where, first, they need the fewest
// unused granules; then, for a block of a granule or more, where they cover
// the most whole granules (one end on a granule boundary, so that the block,
// once free, leaves its granules unmapped but for its remainder); then in the
// free range with the fewest free bytes on partly used granules (a best fit
// on the granules' fragments, where the smallest range would be a best fit on
// address space); then where they leave the fewest free bytes beside them in
// their own first and last granules; then in the smallest range, lowest. A
// block may lie at either end of its range, or with either end on the
// granule boundary nearest either end of the range.
//
// On random churn this takes peak reserved ÷ peak live from 1.105 to 1.076
// (four other seeds of the trace: 1.112 to 1.079 on average), the other
// traces staying at 1.000. Each part counts: without the whole granules,
// 1.086 (seeds 1.090); without the fragment best fit (range length
// instead), 1.094; with the range's start or either end only, 1.135 and
// 1.094. The peak is a plateau, not one moment (held stays within 8 MiB of
// it for some 2,000 operations): of its 78 MiB of waste, 44 MiB lies in 274
// holes under 2 MiB between live blocks, about one for every two live
// blocks, as the fifty-percent rule has it, and 32 MiB at the ends of larger
// free ranges. Giving blocks up to 1 MiB and larger ones address ranges of
// their own takes it back to 1.103. It needs a search by fragments: among
// only the 4 smallest ranges that fit and the highest, 1.117; among the 4
// first of each of four lists (holes on used granules by size, ranges by the
// smallest end fragment of at least size mod 2 MiB, by their free bytes on
// used granules, and by length), and the highest, 1.080.
func (m *addressModel) placeFragments(size uint64) [2]uint64 {
	down := func(x uint64) uint64 { return x &^ (granule - 1) }
	up := func(x uint64) uint64 { return down(x + granule - 1) }
	best, bestLo := -1, uint64(0)
	var bestKey [6]int64
	for i, f := range m.free {
		if f[1]-f[0] < size {
			continue
		}
		// The free bytes of the range on granules holding used bytes: only
		// its first and last granules can hold any.
		mapped := int64(0)
		for _, g := range []uint64{f[0] / granule, (f[1] - 1) / granule} {
			if m.used[g] > 0 {
				mapped += int64(min(f[1], (g+1)*granule) - max(f[0], g*granule))
			}
			if f[0]/granule == (f[1]-1)/granule {
				break
			}
		}
		for _, lo := range []uint64{f[0], f[1] - size, up(f[0]), up(f[0]+size) - size, down(f[1] - size), down(f[1]) - size} {
			hi := lo + size
			if lo < f[0] || hi > f[1] || hi < lo {
				continue
			}
			whole := int64(0)
			if down(hi) > up(lo) {
				whole = int64(down(hi)-up(lo)) / granule
			}
			beside := uint64(0)
			if f[0] < lo && lo%granule != 0 {
				beside += lo - max(f[0], down(lo))
			}
			if hi < f[1] && hi%granule != 0 {
				beside += min(f[1], up(hi)) - hi
			}
			key := [6]int64{int64(m.unused(lo, hi)), -whole, mapped, int64(beside), int64(f[1] - f[0]), int64(lo)}
			if best < 0 || slices.Compare(key[:], bestKey[:]) < 0 {
				best, bestLo, bestKey = i, lo, key
			}
		}
	}
	f := m.free[best]
	var rest [][2]uint64
	if f[0] < bestLo {
		rest = append(rest, [2]uint64{f[0], bestLo})
	}
	if bestLo+size < f[1] {
		rest = append(rest, [2]uint64{bestLo + size, f[1]})
	}
	m.free = slices.Replace(m.free, best, best+1, rest...)
	m.use(bestLo, bestLo+size, true)
	return [2]uint64{bestLo, bestLo + size}
}

func (m *addressModel) give(r [2]uint64) {
	m.use(r[0], r[1], false)
	i, _ := slices.BinarySearchFunc(m.free, r[0], func(f [2]uint64, lo uint64) int { return cmp.Compare(f[0], lo) })
	m.free = slices.Insert(m.free, i, r)
	if i+1 < len(m.free) && m.free[i][1] == m.free[i+1][0] {
		m.free[i][1] = m.free[i+1][1]
		m.free = slices.Delete(m.free, i+1, i+2)
	}
	if i > 0 && m.free[i-1][1] == m.free[i][0] {
		m.free[i-1][1] = m.free[i][1]
		m.free = slices.Delete(m.free, i, i+1)
	}
}

func (m *addressModel) alloc(id uint32, size uint64) { m.blocks[id] = m.place(size) }

func (m *addressModel) release(id uint32) {
	m.give(m.blocks[id])
	delete(m.blocks, id)
}

func (m *addressModel) sync() {}

func (m *addressModel) peakReserved() uint64 { return m.peakHeld }

// allocWithin places block id only where the granules holding used bytes
// stay within their peak so far, the granules a pool that keeps what it
// empties (as the pool does) would hold; else it takes the placement back
// and reports false.
func (m *addressModel) allocWithin(id uint32, size uint64) bool {
	peak := m.peakHeld
	m.alloc(id, size)
	if m.held <= peak {
		return true
	}
	m.release(id)
	m.peakHeld = peak
	return false
}

// placementModel is a model of placement that replayModel drives.
type placementModel interface {
	alloc(id uint32, size uint64) // a request, rounded to Alignment
	release(id uint32)
	sync()
	peakReserved() uint64
}

// replayModel replays ops on m and returns its peak reserved ÷ peak live.
func replayModel(m placementModel, ops []traces.Op) float64 {
	var live, peakLive uint64
	sizes := map[uint32]uint64{}
	for _, op := range ops {
		switch op.Kind {
		case traces.Alloc, traces.AllocAsync:
			size := (op.Size + pool.Alignment - 1) &^ (pool.Alignment - 1)
			m.alloc(op.ID, size)
			sizes[op.ID] = size
			live += size
			peakLive = max(peakLive, live)
		case traces.Free, traces.FreeAsync:
			m.release(op.ID)
			live -= sizes[op.ID]
		case traces.Sync:
			m.sync()
		}
	}
	return float64(m.peakReserved()) / float64(peakLive)
}

// waitingModel is a placement model that can try a placement without
// growing (replayWaiting).
type waitingModel interface {
	placementModel
	allocWithin(id uint32, size uint64) bool
}

// replayWaiting replays ops on m with frees that wait for the device, and
// returns its peak reserved ÷ peak live: a free's bytes are reusable once
// the work queued before it retires, which replayTarget's streams do every
// replayLag operations, or at a synchronization; before a placement that
// would need a granule more while frees wait, the model synchronizes, as
// the pool does (allocateVirtual). The frees of the kind atOnce (Free or
// FreeAsync, or none with 0) are reusable at once instead: a cudaFree's as
// a synchronization in each would make them, a cudaFreeAsync's by every
// stream, sooner than CUDA allows (the pool reuses them at once on their own
// stream only). The pool's cudaFree waits longer than the model's, for a
// synchronization, and its cudaFreeAsync's bytes reach other streams once
// a marker recorded after it is seen complete.
func replayWaiting(m waitingModel, ops []traces.Op, atOnce traces.Kind) float64 {
	var live, peakLive uint64
	var n int
	var serial uint32             // the model's block names: a trace reuses its IDs once freed
	blocks := map[uint32]uint32{} // trace ID -> serial
	sizes := map[uint32]uint64{}
	var waiting []uint32
	retire := func() {
		for _, id := range waiting {
			m.release(id)
		}
		waiting = waiting[:0]
	}
	for _, op := range ops {
		if op.Kind != traces.Sync {
			if n++; n%replayLag == 0 {
				retire()
			}
		}
		switch op.Kind {
		case traces.Alloc, traces.AllocAsync:
			size := (op.Size + pool.Alignment - 1) &^ (pool.Alignment - 1)
			serial++
			blocks[op.ID], sizes[op.ID] = serial, size
			if len(waiting) == 0 || !m.allocWithin(serial, size) {
				retire()
				m.alloc(serial, size)
			}
			live += size
			peakLive = max(peakLive, live)
		case traces.Free, traces.FreeAsync:
			if op.Kind == atOnce {
				m.release(blocks[op.ID])
			} else {
				waiting = append(waiting, blocks[op.ID])
			}
			live -= sizes[op.ID]
		case traces.Sync:
			retire()
			m.sync()
		}
	}
	return float64(m.peakReserved()) / float64(peakLive)
}

// freesAtOnceTarget replays a trace on the pool with the frees of one kind
// or both complete at once, as in the models: the application synchronizes
// after each cudaFree (free), each cudaFreeAsync (async), or both.
type freesAtOnceTarget struct {
	replayTarget
	free, async bool
}

func (t freesAtOnceTarget) Free(ptr uint64) error {
	if err := t.replayTarget.Free(ptr); err != nil || !t.free {
		return err
	}
	return t.Sync()
}

func (t freesAtOnceTarget) FreeAsync(ptr, s uint64) error {
	if err := t.replayTarget.FreeAsync(ptr, s); err != nil || !t.async {
		return err
	}
	return t.Sync()
}

// BenchmarkStitchFloor reports the models' peak reserved ÷ peak live on each
// reference trace, beside which BenchmarkTraceVirtual's figures can be read:
// the stitching model without moving live bytes and (repacked) moving all of
// them at every synchronization of the trace, the one-address model, and the
// pool itself (virtual memory, unbounded quota) with every free complete at
// once, as in the models: what its placement does without the frees that wait
// for the device; and the pool with only its cudaFrees, or only its
// cudaFreeAsyncs, complete at once (a synchronization after a cudaFreeAsync
// also completes the cudaFrees before it): how much of the distance from
// BenchmarkTraceVirtual's figure each kind of free makes. The best model of
// each mapping rule is also replayed with frees that wait for the device
// (replayWaiting; frees-wait), and with those of one kind at once: what
// each rule gets with the pool's frees.
func BenchmarkStitchFloor(b *testing.B) {
	for _, ref := range traces.References {
		ops := loadTrace(b, ref.File)
		for _, at := range []struct {
			name        string
			free, async bool
		}{{"pool-frees-at-once", true, true}, {"pool-cudaFree-at-once", true, false}, {"pool-cudaFreeAsync-at-once", false, true}} {
			b.Run(ref.File+"/"+at.name, func(b *testing.B) {
				var st pool.Stats
				for range b.N {
					f := pooltest.NewVirtual(0)
					p, err := pool.New(f, pool.DefaultOptions(1<<40))
					if err != nil {
						b.Fatal(err)
					}
					target := freesAtOnceTarget{newReplayTarget(p, f.Fake), at.free, at.async}
					if _, err := traces.Replay(target, ops, nil); err != nil {
						b.Fatal(err)
					}
					st = p.Stats()
					if err := p.Close(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(st.PeakReservedBytes)/float64(st.PeakLiveBytes), "reserved/live")
			})
		}
		for _, repack := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/repacked=%t", ref.File, repack), func(b *testing.B) {
				var ratio float64
				for range b.N {
					ratio = replayModel(newStitchModel(repack, false), ops)
				}
				b.ReportMetric(ratio, "reserved/live")
			})
		}
		b.Run(ref.File+"/fragments=true", func(b *testing.B) {
			var ratio float64
			for range b.N {
				ratio = replayModel(newStitchModel(false, true), ops)
			}
			b.ReportMetric(ratio, "reserved/live")
		})
		for _, fragments := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/one-address/fragments=%t", ref.File, fragments), func(b *testing.B) {
				var ratio float64
				for range b.N {
					ratio = replayModel(newAddressModel(fragments), ops)
				}
				b.ReportMetric(ratio, "reserved/live")
			})
		}
		for _, wait := range []struct {
			name   string
			atOnce traces.Kind
		}{{"frees-wait", 0}, {"frees-wait/cudaFree-at-once", traces.Free}, {"frees-wait/cudaFreeAsync-at-once", traces.FreeAsync}} {
			for _, model := range []struct {
				name string
				new  func() waitingModel
			}{
				{"fragments=true", func() waitingModel { return newStitchModel(false, true) }},
				{"one-address/fragments=true", func() waitingModel { return newAddressModel(true) }},
			} {
				b.Run(ref.File+"/"+model.name+"/"+wait.name, func(b *testing.B) {
					var ratio float64
					for range b.N {
						ratio = replayWaiting(model.new(), ops, wait.atOnce)
					}
					b.ReportMetric(ratio, "reserved/live")
				})
			}
		}
	}
}

// TestPlacementModels replays the training trace (small enough for every
// run) on each model: a model that held less than the live bytes, or
// placed a block on bytes in use (take panics), would be wrong.
func TestPlacementModels(t *testing.T) {
	ops := loadTrace(t, "training-step.trace.gz")
	for name, m := range map[string]placementModel{
		"stitching": newStitchModel(false, false), "stitching, repacked": newStitchModel(true, false),
		"stitching, fragments": newStitchModel(false, true), "one-address": newAddressModel(false),
		"one-address, fragments": newAddressModel(true),
	} {
		if ratio := replayModel(m, ops); ratio < 1 {
			t.Errorf("%s model: peak reserved ÷ peak live %.3f, below 1", name, ratio)
		}
	}
	for name, m := range map[string]func() waitingModel{
		"stitching, fragments":   func() waitingModel { return newStitchModel(false, true) },
		"one-address, fragments": func() waitingModel { return newAddressModel(true) },
	} {
		for _, atOnce := range []traces.Kind{0, traces.Free, traces.FreeAsync} {
			if ratio := replayWaiting(m(), ops, atOnce); ratio < 1 {
				t.Errorf("%s model, frees waiting (at once: %q): peak reserved ÷ peak live %.3f, below 1", name, atOnce, ratio)
			}
		}
	}
}

// TestAllocWithin checks that a placement that would need more memory is
// taken back whole: the model holds what it held, and places the next
// request as if the refused one had never been tried.
func TestAllocWithin(t *testing.T) {
	for name, m := range map[string]waitingModel{
		"stitching": newStitchModel(false, true), "one-address": newAddressModel(true),
	} {
		m.alloc(1, granule)
		m.release(1)
		if m.allocWithin(2, 2*granule) {
			t.Errorf("%s model: two granules placed within a peak of one", name)
			continue
		}
		if got := m.peakReserved(); got != granule {
			t.Errorf("%s model: peak %d after a refused placement, want %d", name, got, granule)
		}
		if !m.allocWithin(3, granule) {
			t.Errorf("%s model: one granule refused within a peak of one", name)
		}
		m.alloc(4, granule)
		if got := m.peakReserved(); got != 2*granule {
			t.Errorf("%s model: peak %d with two granules in use, want %d", name, got, 2*granule)
		}
	}
	m := newStitchModel(false, true)
	m.alloc(1, granule)
	m.release(1)
	m.allocWithin(2, 2*granule)
	if m.held != granule || len(m.spare) != 1 {
		t.Errorf("stitching model: %d bytes held and %d spare granules after a refused placement, want %d and 1", m.held, len(m.spare), granule)
	}
}
