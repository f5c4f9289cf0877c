package devmem

import (
	"slices"
	"sync"
	"sync/atomic"
)

// addrIndex maps every address range the core holds for a device (the
// pool's segments, pass-through and spilled blocks, memory outside the
// pool) to that device, so that a free finds its device in one lookup
// instead of asking every device's pool. Reads are lock-free: writers
// replace the sorted list under mu, which happens when a range is reserved
// or released (a segment in pooled mode, every allocation without the pool).
type addrIndex struct {
	mu    sync.Mutex
	spans atomic.Pointer[[]span]
}

// span is one range [base, end) held for dev.
type span struct {
	base, end uint64
	dev       *device
}

func newAddrIndex() *addrIndex {
	x := &addrIndex{}
	x.spans.Store(&[]span{})
	return x
}

// find returns the device holding the range that contains p, or nil.
func (x *addrIndex) find(p uint64) *device {
	spans := *x.spans.Load()
	lo, hi := 0, len(spans)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if spans[mid].end <= p {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo < len(spans) && spans[lo].base <= p {
		return spans[lo].dev
	}
	return nil
}

// add records [base, base+size) as dev's. A range the runtime handed out
// cannot overlap a live one; one that does replaces what it overlaps (a
// range whose release the index missed).
func (x *addrIndex) add(base, size uint64, dev *device) {
	if size == 0 {
		size = 1
	}
	end := base + size
	if end < base {
		end = ^uint64(0)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	old := *x.spans.Load()
	spans := make([]span, 0, len(old)+1)
	for _, s := range old {
		if s.end > base && s.base < end {
			continue
		}
		spans = append(spans, s)
	}
	i, _ := slices.BinarySearchFunc(spans, base, func(s span, b uint64) int {
		switch {
		case s.base < b:
			return -1
		case s.base > b:
			return 1
		}
		return 0
	})
	spans = slices.Insert(spans, i, span{base, end, dev})
	x.spans.Store(&spans)
}

// remove forgets the range starting at base, if dev holds it.
func (x *addrIndex) remove(base uint64, dev *device) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := *x.spans.Load()
	i := slices.IndexFunc(old, func(s span) bool { return s.base == base && s.dev == dev })
	if i < 0 {
		return
	}
	spans := slices.Delete(slices.Clone(old), i, i+1)
	x.spans.Store(&spans)
}

// removeDevice forgets every range of dev (its pool was closed and the
// device reset: the runtime freed them all).
func (x *addrIndex) removeDevice(dev *device) {
	x.mu.Lock()
	defer x.mu.Unlock()
	spans := slices.DeleteFunc(slices.Clone(*x.spans.Load()), func(s span) bool { return s.dev == dev })
	x.spans.Store(&spans)
}
