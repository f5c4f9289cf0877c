package main

import (
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/shim/config"
)

// Memory the core counts against a device's quota but never pools: what
// the application allocates in contexts it created itself (cuCtxCreate),
// and the physical memory of its virtual-memory calls (vmm.go). The front
// makes the real calls; the core admits the bytes first (take), so the
// device never holds more than the quota, and records what they became.

// takeKind says what bytes taken outside the pool are for (abi.h's SPILLWAY_TAKE_*).
type takeKind int32

const (
	takeContext takeKind = 0
	takeVMM     takeKind = 1
	takeRuntime takeKind = 2 // a runtime allocation in a created context
)

func (k takeKind) String() string {
	if k == takeVMM {
		return "cuMemCreate"
	}
	return "an allocation in a created context"
}

// take admits size bytes on device outside the pool, the pool returning
// what it holds known free first if they do not fit, or refuses them for
// the quota (the refuse probe fires, and a rate-limited warning).
func (c *core) take(ordinal int, size uint64, kind takeKind) interpose.Error {
	if c.broken != nil {
		return interpose.ErrorInitialization
	}
	d, rc := c.mem.device(ordinal)
	if rc != interpose.Success {
		return rc
	}
	// The front cannot say which context a cuMemCreate runs in: the
	// pool returns only what is known free, without synchronizing.
	if d.ledger.takeOutside(charge(size), false) {
		return interpose.Success
	}
	used := d.ledger.used()
	c.mem.probes.Refuse(size, ordinal, used, d.quota)
	if suppressed, ok := c.refusals.allow(); ok {
		c.mem.log.WithFields(logrus.Fields{
			"device": ordinal, "requested": size, "used": used, "quota": d.quota, "suppressed": suppressed,
		}).Warnf("%s of %s refused on device %d: %s in use of a quota of %s", kind, config.FormatBytes(size),
			ordinal, config.FormatBytes(used), config.FormatBytes(d.quota))
	}
	return interpose.ErrorMemoryAllocation
}

// give returns bytes taken on device.
func (c *core) give(ordinal int, size uint64) {
	if l := c.mem.ledgerAt(ordinal); l != nil {
		l.giveOutside(charge(size))
	}
}

// contextLedger is what the application allocated in contexts it created.
// Each entry keeps the ledger it was taken from.
type contextLedger struct {
	mu     sync.Mutex
	blocks map[interpose.DevicePtr]contextBlock
}

type contextBlock struct {
	ctx    uint64
	device int
	size   uint64
	ledger *deviceLedger
}

// record keeps an allocation whose bytes were taken on device.
func (c *core) ctxRecord(ctx uint64, ordinal int, p interpose.DevicePtr, size uint64) {
	ledger := c.mem.ledgerAt(ordinal)
	if ledger == nil {
		return
	}
	l := &c.contexts
	l.mu.Lock()
	if l.blocks == nil {
		l.blocks = map[interpose.DevicePtr]contextBlock{}
	}
	l.blocks[p] = contextBlock{ctx: ctx, device: ordinal, size: size, ledger: ledger}
	l.mu.Unlock()
}

// ctxForget removes p's entry and returns it; its bytes stay taken.
func (c *core) ctxForget(p interpose.DevicePtr) (contextBlock, bool) {
	l := &c.contexts
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.blocks[p]
	delete(l.blocks, p)
	return b, ok
}

// ctxDestroyed gives back what ctx held: destroying a context frees its memory.
func (c *core) ctxDestroyed(ctx uint64) int {
	l := &c.contexts
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for p, b := range l.blocks {
		if b.ctx == ctx {
			b.ledger.giveOutside(charge(b.size))
			delete(l.blocks, p)
			n++
		}
	}
	return n
}
