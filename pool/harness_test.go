package pool_test

import (
	"errors"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

// harness drives a pool on a fake device and checks, after every call, what
// the pool promises: alignment, no overlap between live allocations, no reuse
// of freed memory before the free is known complete for the new owner, and
// exact accounting.
type harness struct {
	t     testing.TB
	f     *pooltest.Fake
	p     *pool.Pool
	opt   pool.Options
	live  map[uint64]uint64 // base -> aligned size
	dirty []dirtyRange
	vmm   *pooltest.VirtualFake // the device, when it has virtual memory
	// ledger is the pool's own ledger, when the test gave it none: what it
	// has taken must be what the pool holds.
	ledger *pool.QuotaLedger
	// unmappedLive are the live blocks the pool unmapped granules under
	// during the current call: a defect unless the call freed them.
	unmappedLive []uint64
}

// dirtyRange is memory freed at time at that queued work may still use: on
// stream only, or on every stream (a Free).
type dirtyRange struct {
	lo, hi    uint64
	at        uint64
	stream    pool.Stream
	anyStream bool
	// gone: its stream was forgotten (destroyed); a new stream given the
	// same handle is another stream, whose order does not follow the free.
	gone bool
}

func newHarness(t testing.TB, f *pooltest.Fake, opt pool.Options) *harness {
	t.Helper()
	var ledger *pool.QuotaLedger
	if opt.Ledger == nil {
		ledger = pool.NewQuotaLedger(opt.Quota)
		opt.Ledger = ledger
	}
	p, err := pool.New(f, opt)
	if err != nil {
		t.Fatalf("pool.New: %v", err)
	}
	return &harness{t: t, f: f, p: p, opt: opt, live: make(map[uint64]uint64), ledger: ledger}
}

func alignUp(v uint64) uint64 { return (v + pool.Alignment - 1) &^ (pool.Alignment - 1) }

func (h *harness) alloc(size uint64) (uint64, error) {
	h.t.Helper()
	ptr, err := h.p.Alloc(size)
	h.admit(ptr, size, err, false, 0)
	return ptr, err
}

func (h *harness) allocAsync(size uint64, s pool.Stream) (uint64, error) {
	h.t.Helper()
	ptr, err := h.p.AllocAsync(size, s)
	h.admit(ptr, size, err, true, s)
	return ptr, err
}

func (h *harness) mustAlloc(size uint64) uint64 {
	h.t.Helper()
	ptr, err := h.alloc(size)
	if err != nil {
		h.t.Fatalf("Alloc(%d): %v", size, err)
	}
	return ptr
}

func (h *harness) admit(ptr, size uint64, err error, async bool, s pool.Stream) {
	h.t.Helper()
	if err != nil {
		if ptr != 0 {
			h.t.Fatalf("failed allocation of %d returned %#x", size, ptr)
		}
		if errors.Is(err, pool.ErrQuota) && h.vmm != nil {
			h.checkVirtualRefusal(size)
		} else if errors.Is(err, pool.ErrQuota) {
			st := h.p.Stats()
			if st.ReservedBytes+alignUp(size) <= h.opt.Quota {
				h.t.Fatalf("refused %d bytes with only %d of %d reserved: %v", size, st.ReservedBytes, h.opt.Quota, err)
			}
			if st.LargestFreeBlock >= alignUp(size) {
				h.t.Fatalf("refused %d bytes with a free block of %d: %v", size, st.LargestFreeBlock, err)
			}
		}
		h.check()
		return
	}
	if size == 0 {
		if ptr != 0 {
			h.t.Fatalf("Alloc(0) = %#x, want 0", ptr)
		}
		return
	}
	if ptr%pool.Alignment != 0 {
		h.t.Fatalf("allocation %#x of %d bytes is not aligned to %d", ptr, size, pool.Alignment)
	}
	n := alignUp(size)
	for base, sz := range h.live {
		if ptr < base+sz && base < ptr+n {
			h.t.Fatalf("allocation [%#x,%#x) overlaps live [%#x,%#x)", ptr, ptr+n, base, base+sz)
		}
	}
	kept := make([]dirtyRange, 0, len(h.dirty))
	for _, d := range h.dirty {
		if h.f.SafeSince(d.at, d.stream, d.anyStream) {
			continue
		}
		overlaps := ptr < d.hi && d.lo < ptr+n
		if overlaps && async && !d.anyStream && !d.gone && d.stream == s {
			// Reuse in the order of the same stream: the new owner's work
			// follows the old, and its own free must be ordered after its
			// work, so this range is now the new owner's concern. What lies
			// outside the new block stays dirty.
			if d.lo < ptr {
				kept = append(kept, dirtyRange{lo: d.lo, hi: ptr, at: d.at, stream: d.stream})
			}
			if d.hi > ptr+n {
				kept = append(kept, dirtyRange{lo: ptr + n, hi: d.hi, at: d.at, stream: d.stream})
			}
			continue
		}
		kept = append(kept, d)
		if overlaps {
			h.t.Fatalf("allocation [%#x,%#x) (async %v on %d) reuses [%#x,%#x) freed at %d (stream %d, any %v) before the free completed",
				ptr, ptr+n, async, s, d.lo, d.hi, d.at, d.stream, d.anyStream)
		}
	}
	h.dirty = kept
	h.live[ptr] = n
	if a, _ := h.p.Lookup(ptr); h.vmm != nil && h.opt.VirtualMemory && a.Tier == pool.TierDevice && !h.vmm.Mapped(ptr, ptr+n) {
		h.t.Fatalf("allocation [%#x,%#x) is not wholly mapped", ptr, ptr+n)
	}
	h.check()
}

func (h *harness) free(ptr uint64) error {
	h.t.Helper()
	at := h.f.Tick()
	err := h.p.Free(ptr)
	h.forget(ptr, err, at, 0, true)
	return err
}

func (h *harness) freeAsync(ptr uint64, s pool.Stream) error {
	h.t.Helper()
	at := h.f.Enqueue(s)
	err := h.p.FreeAsync(ptr, s)
	h.forget(ptr, err, at, s, false)
	return err
}

// freeAsyncForeign frees on a foreign stream (pooltest.Fake.MakeForeign).
func (h *harness) freeAsyncForeign(ptr uint64, s pool.Stream) error {
	h.t.Helper()
	at := h.f.Enqueue(s)
	err := h.p.FreeAsyncForeign(ptr, s)
	h.forget(ptr, err, at, s, false)
	return err
}

// forgetStream destroys stream s: the pool forgets it, and the ranges
// freed on it are no longer in the order of whatever stream takes its
// handle next.
func (h *harness) forgetStream(s pool.Stream) {
	h.t.Helper()
	for i := range h.dirty {
		if !h.dirty[i].anyStream && h.dirty[i].stream == s {
			h.dirty[i].gone = true
		}
	}
	h.p.ForgetStream(s)
	h.check()
}

func (h *harness) mustFree(ptr uint64) {
	h.t.Helper()
	if err := h.free(ptr); err != nil {
		h.t.Fatalf("Free(%#x): %v", ptr, err)
	}
}

func (h *harness) forget(ptr uint64, err error, at uint64, s pool.Stream, anyStream bool) {
	h.t.Helper()
	n, ok := h.live[ptr]
	switch {
	case ptr == 0 && err != nil:
		h.t.Fatalf("free of 0: %v", err)
	case ptr != 0 && ok && err != nil:
		h.t.Fatalf("free of live %#x: %v", ptr, err)
	case ptr != 0 && !ok && err == nil:
		h.t.Fatalf("free of %#x, not live, succeeded", ptr)
	}
	if ok {
		delete(h.live, ptr)
		h.dirty = append(h.dirty, dirtyRange{lo: ptr, hi: ptr + n, at: at, stream: s, anyStream: anyStream})
	}
	h.check()
}

// check compares the pool's accounting with the model and the fake device.
func (h *harness) check() {
	h.t.Helper()
	st := h.p.Stats()
	var live uint64
	for _, n := range h.live {
		live += n
	}
	if st.LiveBytes != live || st.LiveBlocks != uint64(len(h.live)) {
		h.t.Fatalf("stats: %d live bytes in %d blocks, model has %d in %d", st.LiveBytes, st.LiveBlocks, live, len(h.live))
	}
	if dev := h.f.DeviceBytes(); st.ReservedBytes != dev {
		h.t.Fatalf("stats: %d bytes reserved, device has %d", st.ReservedBytes, dev)
	}
	if h.ledger != nil && h.ledger.Taken() != st.ReservedBytes {
		h.t.Fatalf("stats: %d bytes reserved, the ledger has %d taken", st.ReservedBytes, h.ledger.Taken())
	}
	if st.ReservedBytes > h.opt.Quota {
		h.t.Fatalf("stats: %d bytes reserved, above the quota of %d", st.ReservedBytes, h.opt.Quota)
	}
	if st.SpilledBytes != h.f.HostBytes() {
		h.t.Fatalf("stats: %d bytes spilled, host holds %d", st.SpilledBytes, h.f.HostBytes())
	}
	if st.PeakLiveBytes < st.LiveBytes || st.PeakReservedBytes < st.ReservedBytes {
		h.t.Fatalf("stats: peaks below current values: %+v", st)
	}
	if h.vmm != nil {
		h.checkPhysical()
	}
}

// close closes the pool and checks that nothing is left on the device.
func (h *harness) close() {
	h.t.Helper()
	if err := h.p.Close(); err != nil {
		h.t.Fatalf("Close: %v", err)
	}
	if dev, host, m := h.f.DeviceBytes(), h.f.HostBytes(), h.f.LiveMarkers(); dev != 0 || host != 0 || m != 0 {
		h.t.Fatalf("after Close: %d device bytes, %d host bytes, %d markers left", dev, host, m)
	}
	if h.vmm != nil {
		h.checkVirtualClosed()
	}
	if h.ledger != nil && h.ledger.Taken() != 0 {
		h.t.Fatalf("after Close: the ledger has %d bytes taken", h.ledger.Taken())
	}
}

// appSync is a synchronization made by the application, announced to the pool.
func (h *harness) appSync() {
	h.t.Helper()
	ticket := h.p.SyncBegin()
	if err := h.f.Synchronize(); err != nil {
		h.t.Fatal(err)
	}
	if err := h.p.SyncEnd(ticket); err != nil {
		h.t.Fatalf("SyncEnd: %v", err)
	}
	h.check()
}
