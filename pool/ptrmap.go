package pool

import "math/bits"

// ptrMap maps the address of every live block to its descriptor: an
// open-addressing hash table with linear probing and backward-shift deletion
// (no tombstones), kept at most half full, so a lookup, insertion or deletion
// probes O(1) slots on average. It is cheaper than a built-in map on the hot
// path because keys are addresses aligned to Alignment that hash with one
// multiplication.
type ptrMap struct {
	slots []ptrSlot
	shift uint // 64 - log2(len(slots))
	count int
}

type ptrSlot struct {
	key uint64 // 0: empty; the pool never hands out address 0
	b   *block
}

const ptrMapMinSlots = 1024

func (m *ptrMap) home(key uint64) int {
	return int(((key >> granuleShift) * 0x9e3779b97f4a7c15) >> (m.shift & 63)) // below 64: spares the compiler's check
}

func (m *ptrMap) get(key uint64) *block {
	if m.count == 0 {
		return nil
	}
	mask := len(m.slots) - 1
	for i := m.home(key); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.key == key {
			return s.b
		}
		if s.key == 0 {
			return nil
		}
	}
}

func (m *ptrMap) put(key uint64, b *block) {
	if 2*(m.count+1) > len(m.slots) {
		m.resize(max(ptrMapMinSlots, 2*len(m.slots)))
	}
	mask := len(m.slots) - 1
	for i := m.home(key); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.key == 0 {
			s.key, s.b = key, b
			m.count++
			return
		}
		if s.key == key {
			s.b = b
			return
		}
	}
}

// del removes key and returns its block, or nil if key is absent, shifting
// back the entries of its probe run so lookups never need tombstones.
func (m *ptrMap) del(key uint64) *block {
	if m.count == 0 {
		return nil
	}
	slots := m.slots
	mask := len(slots) - 1
	i := m.home(key)
	for slots[i].key != key {
		if slots[i].key == 0 {
			return nil
		}
		i = (i + 1) & mask
	}
	b := slots[i].b
	m.count--
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := slots[j]
		if s.key == 0 {
			break
		}
		// The entry at j may move to the hole at i only if its home is not
		// in the cyclic range (i, j].
		if h := m.home(s.key); (j-h)&mask >= (j-i)&mask {
			slots[i] = s
			i = j
		}
	}
	slots[i] = ptrSlot{}
	return b
}

func (m *ptrMap) resize(n int) {
	old := m.slots
	m.slots = make([]ptrSlot, n)
	m.shift = uint(65 - bits.Len(uint(n))) // n is a power of two
	m.count = 0
	for _, s := range old {
		if s.key != 0 {
			m.put(s.key, s.b)
		}
	}
}

// each calls f for every entry.
func (m *ptrMap) each(f func(*block)) {
	for _, s := range m.slots {
		if s.key != 0 {
			f(s.b)
		}
	}
}

// liveMap maps the address of every live block to its descriptor, in two
// ptrMaps: the blocks handed out last (young) and the others (old). Most
// blocks die young (a framework's temporaries outlive only a few of its
// operations), and an insertion into a table of many live blocks writes a
// slot no recent operation touched: a cache miss, the largest single cost
// of a pair among 100,000 live blocks (a third of it in BenchmarkPair). The
// young table holds at most youngBlocks entries, small enough to stay in
// the processor's caches; a block still live when youngBlocks newer ones
// have been handed out moves to the old table, paying then the insertion
// that a block dying young never pays.
type liveMap struct {
	young, old ptrMap
	// order is a ring of the young blocks in hand-out order, oldest at
	// puts % youngBlocks; a block leaving young early (freed) leaves a nil
	// behind. A young block's ringSlot is one more than its index here.
	order [youngBlocks]*block
	puts  uint // blocks put so far; unsigned, so the ring's slot is a mask
}

// youngBlocks bounds the young table, which then never grows past its
// first 1,024 slots: 16 KiB, half a first-level data cache.
const youngBlocks = 256

func (m *liveMap) get(key uint64) *block {
	if b := m.young.get(key); b != nil {
		return b
	}
	return m.old.get(key)
}

// put adds b, which must not be in the map, at its address.
func (m *liveMap) put(b *block) {
	slot := m.puts % youngBlocks
	if aged := m.order[slot]; aged != nil {
		m.young.del(aged.base)
		aged.ringSlot = 0
		m.old.put(aged.base, aged)
	}
	m.order[slot] = b
	b.ringSlot = uint16(slot + 1)
	m.puts++
	m.young.put(b.base, b)
}

// take removes the block at key and returns it, or nil if there is none:
// one probe of each table where a lookup followed by a removal would make
// two.
func (m *liveMap) take(key uint64) *block {
	if b := m.young.del(key); b != nil {
		m.order[b.ringSlot-1] = nil
		b.ringSlot = 0
		return b
	}
	return m.old.del(key)
}

func (m *liveMap) each(f func(*block)) {
	m.young.each(f)
	m.old.each(f)
}
