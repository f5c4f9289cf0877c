package pool

import (
	"fmt"
	"sync"
)

// Ledger counts the device bytes a Pool holds against a limit that others
// may share: the pool takes every byte before it reserves it (a segment, a
// granule, a pass-through allocation, a promotion) and gives it back once
// it is released. A Ledger is the only place where the pool's device bytes
// are admitted; Options.Quota only sizes segments, arenas and the release
// threshold. A Pool calls it with its lock held, so its methods must never
// call back into that Pool; they are safe for concurrent use by the pool and
// whoever else shares the ledger.
type Ledger interface {
	// Take admits n bytes if the limit holds them, all or nothing, and
	// reports whether it did.
	Take(n uint64) bool
	// Give returns n bytes taken before.
	Give(n uint64)
	// Headroom is how many bytes Take would admit now. It is a snapshot:
	// others sharing the ledger may take or give meanwhile, and Take may
	// admit more after reclaiming bytes of its own.
	Headroom() uint64
}

// QuotaLedger is the Ledger of a pool that is alone under its quota: a fixed
// number of bytes, taken and given under a mutex. A Pool whose
// Options.Ledger is nil uses one over Options.Quota.
type QuotaLedger struct {
	mu    sync.Mutex
	quota uint64
	taken uint64
}

// NewQuotaLedger returns a ledger admitting at most quota bytes at a time.
func NewQuotaLedger(quota uint64) *QuotaLedger {
	return &QuotaLedger{quota: quota}
}

// Take admits n bytes if taken+n stays within the quota.
func (l *QuotaLedger) Take(n uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n > l.quota-l.taken {
		return false
	}
	l.taken += n
	return true
}

// Give returns n bytes. Giving more than was taken is a bug of the caller's
// accounting, and panics rather than admitting more than the quota later.
func (l *QuotaLedger) Give(n uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n > l.taken {
		panic(fmt.Sprintf("pool: %d bytes given back to a ledger holding %d", n, l.taken))
	}
	l.taken -= n
}

// Headroom is the quota less what is taken.
func (l *QuotaLedger) Headroom() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.quota - l.taken
}

// Taken is what is taken now.
func (l *QuotaLedger) Taken() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.taken
}
