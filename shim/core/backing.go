package main

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/pool"
)

// perThreadBit marks a per-thread identity: the front passes the
// per-thread default stream (cudaStreamPerThread, a different stream in
// every thread) as this bit plus a number unique to the calling thread, so
// that the pool sees one stream per thread. Real stream handles are user
// addresses and never have it.
const perThreadBit = 1 << 63

// backing is a pool.Backing (with stream-ordered and host reservation) over
// the real runtime for one device. The pool calls it with its lock held,
// from whichever thread made the call; every method makes the device current
// for its calls and restores the caller's. Reservations are admitted by the
// device's account, which also holds the memory outside the pool, so the
// quota covers both.
type backing struct {
	rt      realRuntime
	ordinal int
	acct    *account
	// pinned maps the device pointer of a pinned spill to its host pointer,
	// which cudaFreeHost needs.
	pinned map[uint64]uint64
	// promoted are the managed blocks moved to the device: device bytes.
	promoted map[uint64]uint64
	spare    []interpose.Event // markers destroyed, ready for reuse
	// spilled is set once the pool has spilled: from then on a
	// cudaFreeAsync names its stream in asyncFrees before calling the pool,
	// so that ReleaseHost can free a spilled block in stream order instead
	// of waiting for the device.
	spilled atomic.Bool

	// mu guards what the core also reaches outside the pool's lock.
	mu sync.Mutex
	// inflight are stream-ordered frees the device has not reached yet: the
	// device still holds their bytes, so the account keeps them.
	inflight   []inflightFree
	asyncFrees map[uint64]pool.Stream
}

// maxInflight is how many frees in flight are kept before the completed
// ones are collected.
const maxInflight = 64

type inflightFree struct {
	done    interpose.Event
	size    uint64                 // device bytes the account keeps until done
	release func() interpose.Error // the free to make once done; nil: made already
}

func newBacking(rt realRuntime, ordinal int, acct *account) *backing {
	return &backing{rt: rt, ordinal: ordinal, acct: acct, pinned: map[uint64]uint64{}, promoted: map[uint64]uint64{}}
}

// cudaErr wraps a failed call; running out of memory wraps
// pool.ErrOutOfMemory, so the pool releases its cache and retries.
func cudaErr(call string, rc interpose.Error) error {
	if rc == interpose.ErrorMemoryAllocation {
		return fmt.Errorf("%s: %w: %w", call, rc, pool.ErrOutOfMemory)
	}
	return fmt.Errorf("%s: %w", call, rc)
}

func (b *backing) on(f func() (uint64, interpose.Error)) (uint64, interpose.Error) {
	return onDevice(b.rt, b.ordinal, f)
}

func (b *backing) do(f func() interpose.Error) interpose.Error {
	_, rc := onDevice(b.rt, b.ordinal, func() (uint64, interpose.Error) { return 0, f() })
	return rc
}

var errQuota = fmt.Errorf("the device quota is held by memory outside the pool: %w", pool.ErrOutOfMemory)

func (b *backing) reserve(size uint64, call string, f func() (interpose.DevicePtr, interpose.Error)) (uint64, error) {
	for !b.acct.take(size, false) {
		if !b.makeRoom() {
			return 0, errQuota
		}
	}
	p, rc := b.on(func() (uint64, interpose.Error) {
		p, rc := f()
		return uint64(p), rc
	})
	if rc != interpose.Success {
		b.acct.give(size, false)
		return 0, cudaErr(fmt.Sprintf("%s of %d bytes on device %d", call, size, b.ordinal), rc)
	}
	return p, nil
}

// Reserve calls cudaMalloc.
func (b *backing) Reserve(size uint64) (uint64, error) {
	return b.reserve(size, "cudaMalloc", func() (interpose.DevicePtr, interpose.Error) { return b.rt.Malloc(size) })
}

// Release calls cudaFree.
func (b *backing) Release(base, size uint64) error {
	if rc := b.do(func() interpose.Error { return b.rt.Free(interpose.DevicePtr(base)) }); rc != interpose.Success {
		return cudaErr(fmt.Sprintf("cudaFree(%#x) on device %d", base, b.ordinal), rc)
	}
	b.acct.give(size, false)
	return nil
}

// asyncStream is the stream a stream-ordered call of the owning thread uses.
func asyncStream(s pool.Stream) interpose.Stream {
	if s&perThreadBit != 0 {
		return interpose.StreamPerThread
	}
	return interpose.Stream(s)
}

// ReserveAsync calls cudaMallocAsync (pass-through mode only).
func (b *backing) ReserveAsync(size uint64, s pool.Stream) (uint64, error) {
	return b.reserve(size, "cudaMallocAsync", func() (interpose.DevicePtr, interpose.Error) {
		return b.rt.MallocAsync(size, asyncStream(s))
	})
}

// ReleaseAsync calls cudaFreeAsync (pass-through mode only). The bytes stay
// accounted until an event recorded after the free completes.
func (b *backing) ReleaseAsync(base, size uint64, s pool.Stream) error {
	var done interpose.Event
	rc := b.do(func() interpose.Error {
		on := asyncStream(s)
		if rc := b.rt.FreeAsync(interpose.DevicePtr(base), on); rc != interpose.Success {
			return rc
		}
		var rc interpose.Error
		if done, rc = b.rt.EventCreate(interpose.EventDisableTiming); rc == interpose.Success {
			if rc = b.rt.EventRecord(done, on); rc != interpose.Success {
				b.rt.EventDestroy(done)
			}
		}
		if rc != interpose.Success {
			done = 0
			b.rt.StreamSynchronize(on) // the free is complete when this returns
		}
		return interpose.Success
	})
	if rc != interpose.Success {
		return cudaErr(fmt.Sprintf("cudaFreeAsync(%#x) on device %d", base, b.ordinal), rc)
	}
	if done == 0 {
		b.acct.give(size, false)
		return nil
	}
	b.queue(inflightFree{done: done, size: size})
	return nil
}

// queue adds a free in flight, collecting those done when there are many.
func (b *backing) queue(f inflightFree) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflight = append(b.inflight, f)
	if len(b.inflight) > maxInflight {
		b.inflightDone()
	}
}

// inflightDone gives back the bytes of the stream-ordered frees the device
// has reached, and returns how many bytes that was; b.mu is held.
func (b *backing) inflightDone() uint64 {
	var given uint64
	kept := b.inflight[:0]
	for _, f := range b.inflight {
		if b.rt.EventQuery(f.done) == interpose.ErrorNotReady {
			kept = append(kept, f)
			continue
		}
		b.settle(f)
		given += f.size
	}
	clear(b.inflight[len(kept):])
	b.inflight = kept
	return given
}

// makeRoom gives back what the stream-ordered frees in flight hold: the
// completed ones, or else the oldest, waited for. It reports whether
// anything was given back.
func (b *backing) makeRoom() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.inflight) == 0 {
		return false
	}
	if b.inflightDone() > 0 {
		return true
	}
	f := b.inflight[0]
	b.rt.EventSynchronize(f.done)
	b.settle(f)
	b.inflight = b.inflight[1:]
	return true
}

// settle finishes a free the device has reached.
func (b *backing) settle(f inflightFree) {
	b.rt.EventDestroy(f.done)
	if f.release != nil {
		f.release() // the device is past every use; nothing is left to report
	}
	b.acct.give(f.size, false)
}

// settleAll finishes every free in flight; the device was synchronized.
func (b *backing) settleAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, f := range b.inflight {
		b.settle(f)
	}
	clear(b.inflight)
	b.inflight = b.inflight[:0]
}

// freeingOn names the stream of the cudaFreeAsync of p about to reach the
// pool; done forgets it after the pool returns.
func (b *backing) freeingOn(p uint64, s pool.Stream) {
	b.mu.Lock()
	if b.asyncFrees == nil {
		b.asyncFrees = map[uint64]pool.Stream{}
	}
	b.asyncFrees[p] = s
	b.mu.Unlock()
}

func (b *backing) done(p uint64) (pool.Stream, bool) {
	b.mu.Lock()
	s, ok := b.asyncFrees[p]
	delete(b.asyncFrees, p)
	b.mu.Unlock()
	return s, ok
}

// Synchronize calls cudaDeviceSynchronize.
func (b *backing) Synchronize() error {
	if rc := b.do(b.rt.DeviceSynchronize); rc != interpose.Success {
		return cudaErr(fmt.Sprintf("cudaDeviceSynchronize on device %d", b.ordinal), rc)
	}
	b.do(func() interpose.Error { b.settleAll(); return interpose.Success })
	return nil
}

// RecordMarker records an event without timing. A per-thread stream may be
// polled from another thread, where cudaStreamPerThread names another
// stream: its marker goes on the legacy stream, which completes only after
// the work queued before it on every blocking stream, per-thread ones
// included.
func (b *backing) RecordMarker(s pool.Stream) (pool.Marker, error) {
	on := interpose.Stream(s)
	if s&perThreadBit != 0 {
		on = 0
	}
	e, rc := b.on(func() (uint64, interpose.Error) {
		var e interpose.Event
		if n := len(b.spare); n > 0 {
			e, b.spare = b.spare[n-1], b.spare[:n-1]
		} else {
			var rc interpose.Error
			if e, rc = b.rt.EventCreate(interpose.EventDisableTiming); rc != interpose.Success {
				return 0, rc
			}
		}
		if rc := b.rt.EventRecord(e, on); rc != interpose.Success {
			b.rt.EventDestroy(e)
			return 0, rc
		}
		return uint64(e), interpose.Success
	})
	if rc != interpose.Success {
		return 0, cudaErr(fmt.Sprintf("recording an event on stream %#x of device %d", uint64(s), b.ordinal), rc)
	}
	return pool.Marker(e), nil
}

// MarkerDone calls cudaEventQuery.
func (b *backing) MarkerDone(m pool.Marker) (bool, error) {
	switch rc := b.rt.EventQuery(interpose.Event(m)); rc {
	case interpose.Success:
		return true, nil
	case interpose.ErrorNotReady:
		return false, nil
	default:
		return false, cudaErr("cudaEventQuery", rc)
	}
}

// maxSpareEvents bounds the events kept for reuse.
const maxSpareEvents = 64

// DestroyMarker keeps the event for the next marker, or destroys it.
func (b *backing) DestroyMarker(m pool.Marker) {
	if len(b.spare) < maxSpareEvents {
		b.spare = append(b.spare, interpose.Event(m))
		return
	}
	b.rt.EventDestroy(interpose.Event(m))
}

// ReserveHost makes host memory the device reads in place: managed memory
// preferred on the host and accessed by the device (so the driver maps it
// rather than migrating it, and the quota holds), or mapped pinned memory,
// whose device pointer is what the application gets.
func (b *backing) ReserveHost(size uint64, tier pool.Tier) (uint64, error) {
	call := fmt.Sprintf("spilling %d bytes to managed memory (cudaMallocManaged, cudaMemAdvise) for device %d", size, b.ordinal)
	reserve := b.reserveManaged
	if tier == pool.TierPinned {
		call = fmt.Sprintf("spilling %d bytes to pinned memory (cudaHostAlloc, cudaHostGetDevicePointer) for device %d", size, b.ordinal)
		reserve = b.reservePinned
	}
	p, rc := b.on(func() (uint64, interpose.Error) {
		b.mu.Lock()
		b.inflightDone() // spilled blocks freed in stream order, now reached
		b.mu.Unlock()
		return reserve(size)
	})
	if rc != interpose.Success {
		return 0, &spillError{cudaErr(call, rc)}
	}
	b.spilled.Store(true)
	return p, nil
}

// spillError is a failure to make host memory for a spill.
type spillError struct{ err error }

func (e *spillError) Error() string { return e.err.Error() }
func (e *spillError) Unwrap() error { return e.err }

func (b *backing) reservePinned(size uint64) (uint64, interpose.Error) {
	host, rc := b.rt.HostAlloc(size, interpose.HostAllocMapped)
	if rc != interpose.Success {
		return 0, rc
	}
	dev, rc := b.rt.HostGetDevicePointer(host)
	if rc != interpose.Success {
		b.rt.FreeHost(host)
		return 0, rc
	}
	b.pinned[uint64(dev)] = host
	return uint64(dev), interpose.Success
}

func (b *backing) reserveManaged(size uint64) (uint64, interpose.Error) {
	p, rc := b.rt.MallocManaged(size, interpose.AttachGlobal)
	if rc != interpose.Success {
		return 0, rc
	}
	if rc := b.rt.MemAdvise(p, size, interpose.AdviseSetPreferredLocation, interpose.CPUDevice); rc != interpose.Success {
		b.rt.Free(p)
		return 0, rc
	}
	if rc := b.rt.MemAdvise(p, size, interpose.AdviseSetAccessedBy, b.ordinal); rc != interpose.Success {
		b.rt.Free(p)
		return 0, rc
	}
	return uint64(p), interpose.Success
}

// ReleaseHost frees a spilled block; a promoted one gives its device bytes
// back. Freed by cudaFreeAsync, it is freed once the device reaches an event
// recorded on that stream (cudaFree of managed memory and cudaFreeHost would
// wait for the device); by cudaFree, at once.
func (b *backing) ReleaseHost(base, size uint64, tier pool.Tier) error {
	var release func() interpose.Error
	call := fmt.Sprintf("cudaFree(%#x) of a spilled block", base)
	if tier == pool.TierPinned {
		host, ok := b.pinned[base]
		if !ok {
			return fmt.Errorf("no pinned spill at %#x", base)
		}
		release, call = func() interpose.Error { return b.rt.FreeHost(host) }, "cudaFreeHost"
	} else {
		release = func() interpose.Error { return b.rt.Free(interpose.DevicePtr(base)) }
	}
	deviceBytes := b.promoted[base]
	if s, ok := b.done(base); ok {
		var done interpose.Event
		rc := b.do(func() interpose.Error {
			var rc interpose.Error
			if done, rc = b.rt.EventCreate(interpose.EventDisableTiming); rc == interpose.Success {
				if rc = b.rt.EventRecord(done, asyncStream(s)); rc != interpose.Success {
					b.rt.EventDestroy(done)
				}
			}
			return rc
		})
		if rc == interpose.Success {
			b.queue(inflightFree{done: done, size: deviceBytes, release: release})
			delete(b.pinned, base)
			delete(b.promoted, base)
			return nil
		}
	}
	if rc := b.do(release); rc != interpose.Success {
		return cudaErr(call, rc)
	}
	delete(b.pinned, base)
	delete(b.promoted, base)
	b.acct.give(deviceBytes, false)
	return nil
}

// promoteError is a promotion that failed; the free that ran it succeeded.
type promoteError struct{ err error }

func (e *promoteError) Error() string { return e.err.Error() }
func (e *promoteError) Unwrap() error { return e.err }

func isPromoteError(err error) bool {
	var p *promoteError
	return errors.As(err, &p)
}

// Promote moves a managed block to the device: preferred location the
// device, prefetched there on the legacy stream (ordered after the work
// queued on every blocking stream), and waits for the move.
func (b *backing) Promote(base, size uint64) error {
	if !b.acct.take(size, false) {
		return &promoteError{errQuota}
	}
	p := interpose.DevicePtr(base)
	rc := b.do(func() interpose.Error {
		if rc := b.rt.MemAdvise(p, size, interpose.AdviseSetPreferredLocation, b.ordinal); rc != interpose.Success {
			return rc
		}
		if rc := b.rt.MemPrefetchAsync(p, size, b.ordinal, 0); rc != interpose.Success {
			return rc
		}
		return b.rt.StreamSynchronize(0)
	})
	if rc != interpose.Success {
		b.acct.give(size, false)
		// Back to the host's preference, so the block is where the pool thinks.
		b.rt.MemAdvise(p, size, interpose.AdviseSetPreferredLocation, interpose.CPUDevice)
		return &promoteError{cudaErr(fmt.Sprintf("promoting %#x (%d bytes) to device %d", base, size, b.ordinal), rc)}
	}
	b.promoted[base] = size
	return nil
}

// observer fires the probe points for a device's pool. Alloc and free
// events go to the event slots, from which the call that caused them hands
// them to the front (which fires the probe in C); the others fire here.
type observer struct {
	d      *device
	probes probeSink
}

func (o *observer) Alloc(ptr, size uint64, tier pool.Tier, source pool.Source) {
	if !o.d.events.put(ptr, pack(eventAlloc, size, tier, source)) {
		o.probes.Alloc(interpose.DevicePtr(ptr), size, o.d.ordinal, interpose.Tier(tier), interpose.Source(source))
	}
}

func (o *observer) Free(ptr, size uint64, tier pool.Tier) {
	if !o.d.events.put(ptr, pack(eventFree, size, tier, 0)) {
		o.probes.Free(interpose.DevicePtr(ptr), size, o.d.ordinal, interpose.Tier(tier))
	}
}

func (o *observer) Sync(madeReusable uint64) { o.probes.Sync(o.d.ordinal, madeReusable) }

func (o *observer) Spill(ptr, size uint64, tier pool.Tier) {
	o.probes.Spill(interpose.DevicePtr(ptr), size, o.d.ordinal, interpose.Tier(tier))
}

func (o *observer) Promote(ptr, size uint64, tier pool.Tier) {
	o.probes.Promote(interpose.DevicePtr(ptr), size, o.d.ordinal, interpose.Tier(tier))
}

func (o *observer) Refuse(size, _, quota uint64) {
	o.probes.Refuse(size, o.d.ordinal, o.d.acct.used(), quota)
}

// Event kinds in the slots.
const (
	eventAlloc = 1
	eventFree  = 2
)

// pack encodes an event: size in the low 48 bits (the pool's sizes are at
// most 2^46), then tier, source and kind.
func pack(kind int, size uint64, tier pool.Tier, source pool.Source) uint64 {
	return size&(1<<48-1) | uint64(tier&0xf)<<48 | uint64(source&0xf)<<52 | uint64(kind)<<56
}

// eventSlots hand the pool's alloc and free events, reported under the
// pool's lock, to the call that caused them, without a lock: an event waits
// in the slot its pointer hashes to until that call takes it. An event
// whose slot is taken is fired from Go at once instead, so none is lost.
type eventSlots [256]struct {
	ptr  atomic.Uint64 // 0: empty
	info atomic.Uint64
}

func slotOf(ptr uint64) int { return int((ptr >> 9) * 0x9E3779B97F4A7C15 >> 56) }

// put is called with the pool's lock held, so puts never race each other.
func (e *eventSlots) put(ptr, info uint64) bool {
	s := &e[slotOf(ptr)]
	if s.ptr.Load() != 0 {
		return false
	}
	s.info.Store(info)
	s.ptr.Store(ptr)
	return true
}

// take returns the event of the given kind waiting for ptr, if any.
func (e *eventSlots) take(ptr uint64, kind int, device int) block {
	s := &e[slotOf(ptr)]
	if ptr == 0 || s.ptr.Load() != ptr {
		return block{}
	}
	info := s.info.Load()
	if int(info>>56) != kind || !s.ptr.CompareAndSwap(ptr, 0) {
		return block{}
	}
	return block{size: info & (1<<48 - 1), device: device, tier: interpose.Tier(info >> 48 & 0xf),
		source: interpose.Source(info >> 52 & 0xf), ok: true}
}
