package devmem

import (
	"sync"
	"sync/atomic"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/pool"
)

// deviceLedger is one device's bytes against its quota, and the only place
// where they are admitted. The pool takes and gives its device memory here
// (it is the pool's pool.Ledger: segments, granules, pass-through
// allocations, promotions); so does every path that counts memory outside
// the pool: the application's managed memory, allocations in contexts it
// created, its cuMemCreate handles, and allocations made while the core
// started. cudaMemGetInfo, cuDeviceTotalMem, NVML and spillway stat report
// its figures. Without a configured quota, memory outside the pool is
// recorded but never refused nor counted against the pool: managed memory
// may exceed the device.
//
// There is one per device ordinal for the life of the process
// (memory.ledgerOf), so that memory which outlives a reset of the primary
// context (created contexts, cuMemCreate handles) stays counted against
// the pool built after the reset.
//
// A quota shared by the processes of a node would keep this interface and
// move the two counters into memory the processes share (a file per device
// named by its PCI location, as CUDA_VISIBLE_DEVICES renumbers ordinals),
// updated with compare-and-swap: takeLocked and headroomLocked are the only
// places that read the limit, and the pool's reclaim hook is how another
// process's refusal would ask this one for its cache.
type deviceLedger struct {
	quota   uint64
	limited bool
	mu      sync.Mutex
	pool    uint64 // bytes the pool holds, and its stream-ordered frees in flight
	outside uint64 // bytes held outside the pool
	// blocks are the allocations outside the pool that cudaFree frees:
	// managed memory, and allocations made while the core started.
	blocks map[interpose.DevicePtr]extBlock
	// reclaim gives bytes back to the ledger when a request does not fit;
	// nil while the device has no pool.
	reclaim atomic.Pointer[reclaimers]
	host    hostAccount
}

// giveTaken returns size bytes taken outside the pool: to the host account
// for a handle placed on the host, else to the quota.
func (l *deviceLedger) giveTaken(size uint64, onHost bool) {
	if onHost {
		l.host.give(size)
	} else {
		l.giveOutside(charge(size))
	}
}

// hostAccount is the host memory the program's own cuMemCreate holds on
// this device's behalf (TakeVMMHost): admitted against the host limit of
// the device's pool, the limit its spills use, and carried from a pool a
// reset closes to the pool made after it, since the handles outlive the
// reset. It has a lock of its own, taken before the pool's (the pool takes
// the ledger's mu under its own).
type hostAccount struct {
	mu    sync.Mutex
	bytes uint64
	pool  *pool.Pool // the pool admitting them; nil while the device has none
}

// take admits size bytes against the host limit of the current pool.
func (h *hostAccount) take(size uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pool == nil || h.pool.TakeHost(size) != nil {
		return false
	}
	h.bytes += size
	return true
}

// give returns size bytes admitted by take, to whichever pool holds them now.
func (h *hostAccount) give(size uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	size = min(size, h.bytes)
	h.bytes -= size
	if h.pool != nil {
		h.pool.GiveHost(size)
	}
}

// attach makes p the pool that admits host bytes, counting in it those
// still held; detach leaves the account without one (before a reset
// closes it).
func (h *hostAccount) attach(p *pool.Pool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pool = p
	if h.bytes == 0 {
		return nil
	}
	return p.TakeHost(h.bytes)
}

func (h *hostAccount) detach() {
	h.mu.Lock()
	h.pool = nil
	h.mu.Unlock()
}

// reclaimers are how a device's pool and backing give bytes back.
type reclaimers struct {
	// inflight gives back the bytes of stream-ordered frees in flight,
	// waiting for the oldest if none is complete; it reports whether it
	// gave back any. It takes no lock of the pool's.
	inflight func() bool
	// cache makes the pool return its releasable cache, synchronizing
	// first if asked (pool.Pool.ReleaseCached); it takes the pool's lock.
	cache func(synchronize bool) uint64
}

type extBlock struct {
	size uint64 // charged
	tier interpose.Tier
}

func newDeviceLedger(quota uint64, limited bool) *deviceLedger {
	return &deviceLedger{quota: quota, limited: limited, blocks: map[interpose.DevicePtr]extBlock{}}
}

// headroomLocked is what the quota still admits; l.mu is held. Memory
// outside the pool counts only under a configured quota.
func (l *deviceLedger) headroomLocked() uint64 {
	held := l.pool
	if l.limited {
		held += l.outside
	}
	if held >= l.quota {
		return 0
	}
	return l.quota - held
}

// takeLocked admits n bytes for the pool or outside it; l.mu is held.
func (l *deviceLedger) takeLocked(n uint64, outside bool) bool {
	if outside && !l.limited {
		l.outside += n
		return true
	}
	if n > l.headroomLocked() {
		return false
	}
	if outside {
		l.outside += n
	} else {
		l.pool += n
	}
	return true
}

func (l *deviceLedger) take(n uint64, outside bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.takeLocked(n, outside)
}

// Take admits n bytes for the pool, giving back what its stream-ordered
// frees in flight hold if the quota needs it. The pool calls it with its
// lock held: it never asks the pool for its cache.
func (l *deviceLedger) Take(n uint64) bool {
	for !l.take(n, false) {
		r := l.reclaim.Load()
		if r == nil || !r.inflight() {
			return false
		}
	}
	return true
}

// Give returns n bytes of the pool's.
func (l *deviceLedger) Give(n uint64) {
	l.mu.Lock()
	l.pool -= n
	l.mu.Unlock()
}

// Headroom is what Take would admit now without reclaiming anything.
func (l *deviceLedger) Headroom() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.headroomLocked()
}

// hold counts n bytes the pool has released but the device still holds (a
// stream-ordered free the device has not reached), whatever the quota; they
// are given back with Give once the device reaches the free.
func (l *deviceLedger) hold(n uint64) {
	l.mu.Lock()
	l.pool += n
	l.mu.Unlock()
}

// usePool makes back and p (nil when the device has no pool) what the
// ledger reclaims from, from now on, and p what admits the host account's
// bytes; it fails if p cannot hold those the account carries over a reset.
func (l *deviceLedger) usePool(back *backing, p *pool.Pool) error {
	r := &reclaimers{inflight: back.makeRoom, cache: func(bool) uint64 { return 0 }}
	if p == nil {
		l.reclaim.Store(r)
		return nil
	}
	r.cache = p.ReleaseCached
	l.reclaim.Store(r)
	return l.host.attach(p)
}

// takeOutside admits n bytes outside the pool. If the quota cannot hold
// them, the pool's stream-ordered frees in flight and then its cache go
// back to the device first, and the take is tried once more. inPrimary
// says that the calling thread is in the device's primary context, the
// pool's, so that the pool may synchronize to release what waits for a
// synchronization; elsewhere a synchronization would wait for the wrong
// context, and only what is known free goes back. The caller holds no
// lock of the pool's.
func (l *deviceLedger) takeOutside(n uint64, inPrimary bool) bool {
	if l.take(n, true) {
		return true
	}
	r := l.reclaim.Load()
	if r == nil {
		return false
	}
	for r.inflight() {
		// each call settles at least one free in flight
	}
	r.cache(inPrimary)
	return l.take(n, true)
}

// giveOutside returns n bytes taken outside the pool.
func (l *deviceLedger) giveOutside(n uint64) {
	l.mu.Lock()
	l.outside -= n
	l.mu.Unlock()
}

// addBlock counts an allocation outside the pool that cudaFree frees,
// whose bytes were taken (or, for an early allocation, are taken now,
// whatever the quota).
func (l *deviceLedger) addBlock(p interpose.DevicePtr, e extBlock, taken bool) {
	l.mu.Lock()
	if !taken {
		l.outside += e.size
	}
	l.blocks[p] = e
	l.mu.Unlock()
}

// removeBlock forgets an allocation outside the pool; its bytes stay taken.
func (l *deviceLedger) removeBlock(p interpose.DevicePtr) (extBlock, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.blocks[p]
	delete(l.blocks, p)
	return e, ok
}

// primaryReset gives back what the reset of the primary context freed
// outside the pool (the pool gives its own back when it is closed), and
// forgets the pool: its reclaimers, and the host account's admitting pool.
func (l *deviceLedger) primaryReset() {
	l.reclaim.Store(nil)
	l.host.detach()
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, e := range l.blocks {
		l.outside -= e.size
		delete(l.blocks, p)
	}
}

// used is what the device holds against the quota: the pool's bytes and
// those outside it.
func (l *deviceLedger) used() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pool + l.outside
}

// left is what the quota leaves to allocate, outside memory counted.
func (l *deviceLedger) left() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if used := l.pool + l.outside; used < l.quota {
		return l.quota - used
	}
	return 0
}

// ledgerAt returns the ledger of device ordinal, or nil before its first
// use. Memory counted outside the pool is given back to it even while a
// reset has dropped the device.
func (m *memory) ledgerAt(ordinal int) *deviceLedger {
	if d := m.existing(ordinal); d != nil {
		return d.ledger
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ledgers[ordinal]
}

// ledgerOf returns the ledger of device ordinal, made at its first use;
// m.mu is held.
func (m *memory) ledgerOf(ordinal int, quota uint64, limited bool) *deviceLedger {
	if l := m.ledgers[ordinal]; l != nil {
		return l
	}
	if m.ledgers == nil {
		m.ledgers = map[int]*deviceLedger{}
	}
	l := newDeviceLedger(quota, limited)
	m.ledgers[ordinal] = l
	return l
}
