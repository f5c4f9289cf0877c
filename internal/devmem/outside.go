package devmem

import (
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/shim/config"
)

// Memory the core counts against a device's quota but never pools: what
// the application allocates in contexts it created itself (cuCtxCreate) or
// from memory pools it created (recorded like a created context's), and the
// physical memory of its virtual-memory calls (vmm.go). The front
// makes the real calls; the core admits the bytes first (take), so the
// device never holds more than the quota, and records what they became.

// TakeKind says what bytes taken outside the pool are for (abi.h's SPILLWAY_TAKE_*).
type TakeKind int32

const (
	TakeContext     TakeKind = 0
	TakeVMM         TakeKind = 1
	TakeRuntime     TakeKind = 2 // a runtime allocation in a created context
	TakePool        TakeKind = 3 // cuMemAllocFromPoolAsync: the application's own pool
	TakeRuntimePool TakeKind = 4 // cudaMallocFromPoolAsync
	// TakeVMMHost: a cuMemCreate the quota refused, to be made host-located
	// under oversubscription; its bytes count against the host limit.
	TakeVMMHost TakeKind = 5
	// TakeArray and TakeRuntimeArray: a CUDA array (arrays.go), the
	// driver's and the runtime's.
	TakeArray        TakeKind = 6
	TakeRuntimeArray TakeKind = 7
	// TakeMipmappedArray and TakeRuntimeMipmappedArray: a mipmapped array,
	// the sum of its levels, counted as an array is.
	TakeMipmappedArray        TakeKind = 8
	TakeRuntimeMipmappedArray TakeKind = 9
	// TakeQuiet, or'ed into a kind, keeps a refusal out of the log and the
	// probes: the caller has another way (TakeVMMHost), which reports.
	TakeQuiet TakeKind = 0x100
	// TakeInPrimary, or'ed into a kind, says that the calling thread is in
	// the device's primary context, the pool's: the pool may synchronize
	// to give back the blocks freed there, as for cudaMallocManaged.
	TakeInPrimary TakeKind = 0x200
)

func (k TakeKind) String() string {
	switch k {
	case TakeVMM:
		return "cuMemCreate"
	case TakeVMMHost:
		return "cuMemCreate (nor could the host limit hold it)"
	case TakePool, TakeRuntimePool:
		return "an allocation from an explicit memory pool"
	case TakeArray, TakeRuntimeArray:
		return "a CUDA array"
	case TakeMipmappedArray, TakeRuntimeMipmappedArray:
		return "a CUDA mipmapped array"
	}
	return "an allocation in a created context"
}

// Runtime says whether the answer is the runtime's (a cudaError_t that
// becomes the thread's last error) rather than a CUresult.
func (k TakeKind) Runtime() bool {
	k &^= TakeQuiet | TakeInPrimary
	return k == TakeRuntime || k == TakeRuntimePool || k == TakeRuntimeArray || k == TakeRuntimeMipmappedArray
}

// Take admits size bytes on device outside the pool, the pool returning
// what it holds known free first if they do not fit (with TakeInPrimary,
// also what waits for a synchronization), or refuses them for the quota
// (the refuse probe fires, and a rate-limited warning). On a device a
// setting leaves without a pool it fails with cudaErrorInitializationError.
func (c *Core) Take(ordinal int, size uint64, kind TakeKind) interpose.Error {
	if c.broken != nil {
		return interpose.ErrorInitialization
	}
	d, rc := c.mem.device(ordinal)
	if rc != interpose.Success {
		return rc
	}
	if d.pool == nil {
		// A setting invalid for this device: every allocation on it
		// fails alike, as cudaMalloc's does.
		return interpose.ErrorInitialization
	}
	quiet, inPrimary := kind&TakeQuiet != 0, kind&TakeInPrimary != 0
	kind &^= TakeQuiet | TakeInPrimary
	if kind == TakeVMMHost {
		if d.ledger.host.take(size) {
			return interpose.Success
		}
		if !c.mem.cfg.Oversubscribe {
			kind = TakeVMM // the host was never an option: the quota refused it
		}
	} else if d.ledger.takeOutside(charge(size), inPrimary) {
		// Outside the primary context (and for a cuMemCreate, whose
		// context the front cannot say) the pool returns only what is
		// known free, without synchronizing.
		return interpose.Success
	}
	if quiet {
		return interpose.ErrorMemoryAllocation
	}
	used := d.ledger.used()
	c.mem.refuseOutside(d, size, used)
	if suppressed, ok := c.refusals.allow(); ok {
		c.mem.log.WithFields(logrus.Fields{
			"device": ordinal, "requested": size, "used": used, "quota": d.quota, "suppressed": suppressed,
		}).Warnf("%s of %s refused on device %d: %s in use of a quota of %s", kind, config.FormatBytes(size),
			ordinal, config.FormatBytes(used), config.FormatBytes(d.quota))
	}
	return interpose.ErrorMemoryAllocation
}

// Give returns bytes taken on device for kind.
func (c *Core) Give(ordinal int, size uint64, kind TakeKind) {
	if l := c.mem.ledgerAt(ordinal); l != nil {
		l.giveTaken(size, kind == TakeVMMHost)
	}
}

// contextLedger is what the application allocated in contexts it created.
// Each entry keeps the ledger it was taken from.
type contextLedger struct {
	mu     sync.Mutex
	blocks map[interpose.DevicePtr]ContextBlock
	// dying holds, by context, the blocks of contexts being destroyed
	// (CtxDestroying): the real destroy frees their addresses for other
	// allocations, which must not be taken for theirs, before the front
	// can tell CtxDestroyed.
	dying map[uint64]map[interpose.DevicePtr]ContextBlock
}

// ContextBlock is an allocation in a created context, as the front
// recorded it. FromPool marks memory from a memory pool (cuMemAllocAsync,
// cuMemAllocFromPoolAsync), which CUDA associates with no context:
// destroying Ctx leaves it, and it becomes its device's primary context's
// (Ctx 0), whose reset frees pool memory.
type ContextBlock struct {
	Ctx      uint64
	Device   int
	Size     uint64
	FromPool bool
	ledger   *deviceLedger
}

// CtxRecord keeps an allocation whose bytes were taken on device.
func (c *Core) CtxRecord(ctx uint64, ordinal int, p interpose.DevicePtr, size uint64, fromPool bool) {
	ledger := c.mem.ledgerAt(ordinal)
	if ledger == nil {
		return
	}
	l := &c.contexts
	l.mu.Lock()
	if l.blocks == nil {
		l.blocks = map[interpose.DevicePtr]ContextBlock{}
	}
	l.blocks[p] = ContextBlock{Ctx: ctx, Device: ordinal, Size: size, FromPool: fromPool, ledger: ledger}
	l.mu.Unlock()
}

// CtxForget removes p's entry and returns it; its bytes stay taken.
func (c *Core) CtxForget(p interpose.DevicePtr) (ContextBlock, bool) {
	l := &c.contexts
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.blocks[p]
	delete(l.blocks, p)
	return b, ok
}

// CtxDestroying sets aside what was recorded in ctx before the real call
// that destroys it: once it has freed their addresses, another thread's
// allocation may be handed one, and its free must reach that allocation's
// owner, not be taken for ctx's. Their bytes stay taken until CtxDestroyed
// gives them back, or CtxKept records them again. Pool memory stays
// recorded: the destroy does not free it.
func (c *Core) CtxDestroying(ctx uint64) {
	l := &c.contexts
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, b := range l.blocks {
		if b.Ctx != ctx || b.FromPool {
			continue
		}
		// Added to what another thread destroying ctx at once set aside.
		aside := l.dying[ctx]
		if aside == nil {
			if l.dying == nil {
				l.dying = map[uint64]map[interpose.DevicePtr]ContextBlock{}
			}
			aside = map[interpose.DevicePtr]ContextBlock{}
			l.dying[ctx] = aside
		}
		aside[p] = b
		delete(l.blocks, p)
	}
}

// CtxKept records again what CtxDestroying set aside: ctx was not
// destroyed (the real call failed, or a detach was not the last).
func (c *Core) CtxKept(ctx uint64) {
	l := &c.contexts
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, b := range l.dying[ctx] {
		l.blocks[p] = b
	}
	delete(l.dying, ctx)
}

// CtxDestroyed gives back what ctx held: destroying a context frees its
// memory, except pool memory, and ends its streams, whose work it waited
// for.
func (c *Core) CtxDestroyed(ctx uint64) int {
	c.mem.forgetContextStreams(ctx)
	c.arraysGone(ctx, 0)
	return c.blocksGone(ctx, 0)
}

// blocksGone gives back the recorded allocations that destroying a context
// destroyed: those made in created context ctx, set aside by CtxDestroying
// or still recorded, or, with ctx 0, in the primary context of device
// ordinal (pool memory, left there by destroyed contexts too). Pool memory
// of ctx stays taken, now the primary context's. It returns how many it
// gave back.
func (c *Core) blocksGone(ctx uint64, ordinal int) int {
	l := &c.contexts
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for p, b := range l.blocks {
		if ctx != 0 && b.Ctx == ctx && b.FromPool {
			b.Ctx = 0
			l.blocks[p] = b
			continue
		}
		if b.Ctx == ctx && (ctx != 0 || b.Device == ordinal) {
			b.ledger.giveOutside(charge(b.Size))
			delete(l.blocks, p)
			n++
		}
	}
	if ctx != 0 {
		for _, b := range l.dying[ctx] {
			b.ledger.giveOutside(charge(b.Size))
			n++
		}
		delete(l.dying, ctx)
	}
	return n
}
