package devmem

import "sync"

// arrayLedger counts the application's CUDA arrays (cuArrayCreate_v2,
// cuArray3DCreate_v2, cudaMallocArray, cudaMalloc3DArray) and mipmapped
// arrays (cuMipmappedArrayCreate, cudaMallocMipmappedArray), by handle. An
// array's bytes are taken before the real call, from its footprint (the
// front's estimate, a mipmapped array's the sum of its levels: CUDA tells an
// array's size only for deferred-mapping arrays, which take no memory and
// are not counted), recorded once it exists, and given back when it is
// destroyed: by cuArrayDestroy, cudaFreeArray, cuMipmappedArrayDestroy or
// cudaFreeMipmappedArray, with the context the application created it in,
// or, made in a device's primary context, by the reset of that context.
// Arrays cannot spill to the host: one the quota refuses is refused.
type arrayLedger struct {
	mu     sync.Mutex
	arrays map[uint64]array // by handle
}

type array struct {
	ctx     uint64 // the created context it was made in; 0: its device's primary context
	ordinal int
	size    uint64
	ledger  *deviceLedger
}

// ArrayCreated records an array whose size bytes were taken on device.
func (c *Core) ArrayCreated(handle, ctx uint64, ordinal int, size uint64) {
	ledger := c.mem.ledgerAt(ordinal)
	if ledger == nil {
		return
	}
	a := &c.arrays
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.arrays == nil {
		a.arrays = map[uint64]array{}
	}
	// CUDA hands a live handle out once: one still recorded is an array
	// destroyed with its context, whose handle was reused before the
	// destruction was told (CtxDestroyed, after the real cuCtxDestroy).
	if old, ok := a.arrays[handle]; ok {
		old.ledger.giveOutside(charge(old.size))
	}
	a.arrays[handle] = array{ctx: ctx, ordinal: ordinal, size: size, ledger: ledger}
}

// ArrayDestroyed gives back the bytes of an array the application
// destroyed; a handle not recorded (made before the core ran, or not
// counted) changes nothing.
func (c *Core) ArrayDestroyed(handle uint64) {
	a := &c.arrays
	a.mu.Lock()
	defer a.mu.Unlock()
	if r, ok := a.arrays[handle]; ok {
		r.ledger.giveOutside(charge(r.size))
		delete(a.arrays, handle)
	}
}

// arraysGone gives back the arrays that destroying a context destroyed:
// those made in created context ctx, or, with ctx 0, in the primary
// context of device ordinal.
func (c *Core) arraysGone(ctx uint64, ordinal int) {
	a := &c.arrays
	a.mu.Lock()
	defer a.mu.Unlock()
	for h, r := range a.arrays {
		if r.ctx == ctx && (ctx != 0 || r.ordinal == ordinal) {
			r.ledger.giveOutside(charge(r.size))
			delete(a.arrays, h)
		}
	}
}
