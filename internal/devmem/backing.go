package devmem

import (
	"fmt"
	"slices"
	"sync"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/pool"
)

// perThreadBit marks a per-thread identity: the front passes the
// per-thread default stream (cudaStreamPerThread, a different stream in
// every thread) as this bit plus a number unique to the calling thread, so
// that the pool sees one stream per thread. Real stream handles are user
// addresses and never have it.
const perThreadBit = 1 << 63

// contextDefaultBit marks the default streams of a context: a free made on
// a default stream (0, legacy, per-thread) while another context than the
// memory's device's primary one is current is ordered, as CUDA orders it,
// on that context's default stream, which the pool knows as this bit plus
// the context. It cannot be a real stream handle (a user address), the
// default handles or a per-thread identity, so the device's own default
// streams never share its blocks. Its markers go on the context's legacy
// stream, which follows the work queued before on every blocking stream of
// the context, the per-thread ones included.
const contextDefaultBit = 1 << 62

// contextDefaultStream names the default streams of context ctx.
func contextDefaultStream(ctx uint64) interpose.Stream {
	return interpose.Stream(contextDefaultBit | ctx)
}

// defaultStreamContext returns the context whose default streams s names,
// if it names them.
func defaultStreamContext(s interpose.Stream) (uint64, bool) {
	if s&perThreadBit != 0 || s&contextDefaultBit == 0 {
		return 0, false
	}
	return uint64(s &^ contextDefaultBit), true
}

// backing is a pool.Backing (with stream-ordered and host reservation) over
// the real runtime for one device. The pool calls it with its lock held,
// from whichever thread made the call. Its runtime is bound to the device
// (interpose.Runtime.On): every call runs on the device, restores the
// caller's, and leaves the thread's last error as the application left it,
// so the failures the pool recovers from (a reservation refused before a
// spill, a marker not yet reached) never reach cudaGetLastError.
// It admits nothing: the pool takes every device byte from the device's
// ledger before it reserves it, and gives it back once released. The
// backing only keeps counted, with hold, the bytes of a stream-ordered
// free the device has not reached yet.
type backing struct {
	rt      realRuntime
	ordinal int
	ledger  *deviceLedger
	dev     *device
	index   *addrIndex // where the ranges it reserves are found by address
	// releaseFailed reports memory the runtime refused to free; deferred
	// says the pool did not ask for this release and so does not count it.
	releaseFailed func(err error, deferred bool)
	// pinned maps the device pointer of a pinned spill to its host pointer,
	// which cudaFreeHost needs.
	pinned map[uint64]uint64
	// promoted are the managed blocks moved to the device: device bytes.
	promoted map[uint64]uint64
	spare    []interpose.Event // markers destroyed, ready for reuse
	// contexts finds a stream's context and marks foreign streams; nil
	// (a fake runtime) counts every stream as the device's own. ctx is
	// the context the device's calls run in, as it names it; 0: unknown.
	contexts streamContexts
	ctx      uint64
	streams  *streamSet // the application's streams, with their contexts
	calls    *apiCalls  // the names of the functions rt calls, for errors

	// mu guards what the core also reaches outside the pool's lock.
	mu sync.Mutex
	// inflight are stream-ordered frees the device has not reached yet: the
	// device still holds their bytes, so the ledger keeps them.
	inflight []inflightFree
	// foreignMarkers are the pool's markers on foreign streams, with the
	// context each was recorded in: they die with it (markersOf).
	foreignMarkers map[pool.Marker]uint64
}

// maxInflight is how many frees in flight are kept before the completed
// ones are collected.
const maxInflight = 64

type inflightFree struct {
	done    interpose.Event
	size    uint64                 // device bytes the ledger keeps until done
	release func() interpose.Error // the free to make once done; nil: made already
	// foreign: ordered on a stream of another device or context, which
	// the device's synchronization does not wait for: only done settles it.
	foreign bool
	// ctx is the context done was recorded in, for a foreign free (0:
	// unknown): destroying or resetting it destroys done (contextGone).
	ctx uint64
}

// streamContexts is a runtime that can tell the context a stream was made
// in and record an event there (*interpose.Runtime, *interpose.Driver).
type streamContexts interface {
	Context() uint64
	StreamContext(s interpose.Stream) (uint64, interpose.Error)
	RecordInStreamContext(s interpose.Stream) (interpose.Event, interpose.Error)
	RecordInContext(ctx uint64) (interpose.Event, interpose.Error)
	FreeAsyncInContext(ctx uint64, p interpose.DevicePtr) interpose.Error
}

func newBacking(rt realRuntime, d *device, index *addrIndex, calls *apiCalls) *backing {
	return &backing{rt: rt, ordinal: d.ordinal, ledger: d.ledger, dev: d, index: index, calls: calls,
		pinned: map[uint64]uint64{}, promoted: map[uint64]uint64{}}
}

// cudaErr wraps a failed call; running out of memory wraps
// pool.ErrOutOfMemory, so the pool releases its cache and retries.
func cudaErr(call string, rc interpose.Error) error {
	if rc == interpose.ErrorMemoryAllocation {
		return fmt.Errorf("%s: %w: %w", call, rc, pool.ErrOutOfMemory)
	}
	return fmt.Errorf("%s: %w", call, rc)
}

// Reserve calls cudaMalloc (cuMemAlloc_v2 over the driver).
func (b *backing) Reserve(size uint64) (uint64, error) {
	p, rc := b.rt.Malloc(size)
	if rc != interpose.Success {
		return 0, cudaErr(fmt.Sprintf("%s of %d bytes on device %d", b.calls.malloc[kindDevice], size, b.ordinal), rc)
	}
	b.index.add(uint64(p), size, b.dev)
	return uint64(p), nil
}

// Release calls cudaFree (cuMemFree_v2 over the driver).
func (b *backing) Release(base, size uint64) error {
	if rc := b.rt.Free(interpose.DevicePtr(base)); rc != interpose.Success {
		err := cudaErr(fmt.Sprintf("%s(%#x) on device %d", b.calls.free, base, b.ordinal), rc)
		b.releaseFailed(err, false)
		return err
	}
	b.index.remove(base, b.dev)
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
	p, rc := b.rt.MallocAsync(size, asyncStream(s))
	if rc != interpose.Success {
		return 0, cudaErr(fmt.Sprintf("%s of %d bytes on device %d", b.calls.malloc[kindAsync], size, b.ordinal), rc)
	}
	b.index.add(uint64(p), size, b.dev)
	return uint64(p), nil
}

// ReleaseAsync calls cudaFreeAsync (pass-through mode only). The bytes,
// which the pool gives back when this returns, stay held in the ledger
// until an event recorded after the free completes.
func (b *backing) ReleaseAsync(base, size uint64, s pool.Stream) error {
	on := asyncStream(s)
	var rc interpose.Error
	call := b.calls.freeAsync
	if ctx, ok := defaultStreamContext(on); ok && b.contexts != nil {
		rc, call = b.contexts.FreeAsyncInContext(ctx, interpose.DevicePtr(base)), apiCallNames[DriverAPI].freeAsync // the driver's, in either mode
	} else {
		rc = b.rt.FreeAsync(interpose.DevicePtr(base), on)
	}
	if rc != interpose.Success {
		err := cudaErr(fmt.Sprintf("%s(%#x) on device %d", call, base, b.ordinal), rc)
		b.releaseFailed(err, false)
		return err
	}
	b.index.remove(base, b.dev)
	b.ledger.hold(size)
	b.afterStream(on, inflightFree{size: size}) // nothing to release: no failure
	return nil
}

// afterStream settles f once the device reaches the work queued on stream
// on so far: at an event recorded there (in the stream's context, for a
// stream of another device or context), or at once after synchronizing the
// stream if no event can be recorded, returning then how f's release went.
func (b *backing) afterStream(on interpose.Stream, f inflightFree) interpose.Error {
	var done interpose.Event
	var rc interpose.Error
	if f.foreign = b.foreignStream(on); f.foreign {
		done, rc = b.recordForeign(on)
		f.ctx = b.streamContext(on)
	} else if done, rc = b.rt.EventCreate(interpose.EventDisableTiming); rc == interpose.Success {
		if rc = b.rt.EventRecord(done, on); rc != interpose.Success {
			b.rt.EventDestroy(done)
		}
	}
	if rc != interpose.Success {
		b.synchronizeStream(on) // the free is complete when this returns
		if f.release != nil {
			if rc := f.release(); rc != interpose.Success {
				return rc
			}
		}
		b.ledger.Give(f.size)
		return interpose.Success
	}
	f.done = done
	b.queue(f)
	return interpose.Success
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

// inflightDone settles the stream-ordered frees the device has reached, and
// returns how many device bytes they gave back; b.mu is held. A spilled
// block's free holds no device bytes: settling it gives back nothing.
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

// makeRoom gives back device bytes that the stream-ordered frees in flight
// hold: the completed ones, or else the oldest holding any, waited for. It
// reports whether any device bytes were given back.
func (b *backing) makeRoom() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inflightDone() > 0 {
		return true
	}
	i := slices.IndexFunc(b.inflight, func(f inflightFree) bool { return f.size > 0 })
	if i < 0 {
		return false
	}
	f := b.inflight[i]
	b.rt.EventSynchronize(f.done)
	b.settle(f)
	b.inflight = slices.Delete(b.inflight, i, i+1)
	return true
}

// settle finishes a free the device has reached. A release the runtime
// refuses leaves the memory allocated: its device bytes stay counted.
func (b *backing) settle(f inflightFree) {
	if f.done != 0 { // 0: destroyed with its context
		b.rt.EventDestroy(f.done)
	}
	if f.release != nil {
		if rc := f.release(); rc != interpose.Success {
			b.releaseFailed(cudaErr(fmt.Sprintf("freeing a spilled block in stream order on device %d", b.ordinal), rc), true)
			return
		}
	}
	b.ledger.Give(f.size)
}

// settleAll finishes every free in flight on the device's own streams, the
// device having been synchronized, and with foreign those on streams of
// other devices or contexts too, the device's memory being freed by a reset.
func (b *backing) settleAll(foreign bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	kept := b.inflight[:0]
	for _, f := range b.inflight {
		if f.foreign && !foreign {
			kept = append(kept, f)
			continue
		}
		b.settle(f)
	}
	clear(b.inflight[len(kept):])
	b.inflight = kept
}

// capturing reports whether stream s (0: the legacy stream, which a
// capture in global mode on any blocking stream forbids too) is capturing
// a graph, when synchronizing or recording on it is not allowed. It asks
// cudaStreamGetCaptureInfo, which is allowed during capture; a runtime
// without it captures nothing the shim could see.
func (b *backing) capturing(s interpose.Stream) bool {
	status, _, rc := b.rt.StreamCapture(s)
	switch {
	case rc == interpose.Success:
		return status != interpose.CaptureNone
	case captureForbids(rc):
		return true // the legacy stream during another stream's capture
	}
	return false
}

// captureForbids reports whether rc is one of cudaErrorStreamCapture*
// (900-908): the call is not allowed while a stream captures.
func captureForbids(rc interpose.Error) bool {
	return rc >= interpose.ErrorStreamCaptureUnsupported && rc <= interpose.ErrorStreamCaptureUnsupported+8
}

// Synchronize calls cudaDeviceSynchronize, unless a capture forbids it.
func (b *backing) Synchronize() error {
	if b.capturing(0) {
		return fmt.Errorf("synchronizing device %d: %w", b.ordinal, pool.ErrStreamCapture)
	}
	if rc := b.rt.DeviceSynchronize(); rc != interpose.Success {
		return cudaErr(fmt.Sprintf("%s on device %d", b.calls.synchronize, b.ordinal), rc)
	}
	b.settleAll(false)
	return nil
}

// RecordMarker records an event without timing. A per-thread stream may be
// polled from another thread, where cudaStreamPerThread names another
// stream: its marker goes on the legacy stream, which completes only after
// the work queued before it on every blocking stream, per-thread ones
// included (and which every blocking stream then waits for).
func (b *backing) RecordMarker(s pool.Stream) (pool.Marker, error) {
	on := interpose.Stream(s)
	if s&perThreadBit != 0 {
		on = 0
	}
	return b.recordMarkerOn(s, on)
}

// RecordMarkerAtFree is RecordMarker in the thread that freed on s: there
// cudaStreamPerThread names the per-thread stream s stands for, so its
// marker goes on that stream alone, and the other threads' streams keep
// the order, or the freedom from it, that the program gave them.
func (b *backing) RecordMarkerAtFree(s pool.Stream) (pool.Marker, error) {
	on := interpose.Stream(s)
	if s&perThreadBit != 0 {
		on = interpose.StreamPerThread
	}
	return b.recordMarkerOn(s, on)
}

// recordMarkerOn records the marker of pool stream s on real stream on.
func (b *backing) recordMarkerOn(s pool.Stream, on interpose.Stream) (pool.Marker, error) {
	if b.capturing(on) {
		return 0, fmt.Errorf("recording an event on stream %#x of device %d: %w", uint64(s), b.ordinal, pool.ErrStreamCapture)
	}
	var e interpose.Event
	rc := interpose.Success
	if n := len(b.spare); n > 0 {
		e, b.spare = b.spare[n-1], b.spare[:n-1]
	} else {
		e, rc = b.rt.EventCreate(interpose.EventDisableTiming)
	}
	if rc == interpose.Success {
		if rc = b.rt.EventRecord(e, on); rc != interpose.Success {
			b.rt.EventDestroy(e)
		}
	}
	if rc != interpose.Success {
		return 0, cudaErr(fmt.Sprintf("recording an event on stream %#x of device %d", uint64(s), b.ordinal), rc)
	}
	return pool.Marker(e), nil
}

// foreign reports whether a stream made in context ctx (0: unknown) is
// foreign to the device: one its synchronization does not wait for, whose
// frees the pool must not take as complete at the device's next
// synchronization.
func (b *backing) foreign(ctx uint64) bool {
	return ctx != 0 && b.ctx != 0 && ctx != b.ctx
}

// foreignStream reports whether stream on, one the application's streams
// were checked for, is foreign to the device.
func (b *backing) foreignStream(on interpose.Stream) bool {
	if ctx, ok := defaultStreamContext(on); ok {
		return b.foreign(ctx)
	}
	if b.streams == nil {
		return false
	}
	ctx, ok := b.streams.context(on)
	return ok && b.foreign(ctx)
}

// streamContext is the context stream on was made in, as far as the core
// knows it (0: unknown).
func (b *backing) streamContext(on interpose.Stream) uint64 {
	if ctx, ok := defaultStreamContext(on); ok {
		return ctx
	}
	if b.streams == nil {
		return 0
	}
	ctx, _ := b.streams.context(on)
	return ctx
}

// contextGone settles the frees in flight whose events were recorded in
// context ctx, destroyed or reset: it waited for their work, and destroyed
// their events, whose handles the driver may already have given to the
// application's new events, so they are neither queried nor destroyed.
func (b *backing) contextGone(ctx uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	kept := b.inflight[:0]
	for _, f := range b.inflight {
		if !f.foreign || f.ctx != ctx {
			kept = append(kept, f)
			continue
		}
		f.done = 0
		b.settle(f)
	}
	clear(b.inflight[len(kept):])
	b.inflight = kept
}

// recordForeign creates an event in the context of foreign stream on and
// records it there.
func (b *backing) recordForeign(on interpose.Stream) (interpose.Event, interpose.Error) {
	if ctx, ok := defaultStreamContext(on); ok {
		return b.contexts.RecordInContext(ctx)
	}
	return b.contexts.RecordInStreamContext(on)
}

// synchronizeStream waits for stream on; a context's default streams are
// waited for at an event recorded on its legacy stream.
func (b *backing) synchronizeStream(on interpose.Stream) {
	if _, ok := defaultStreamContext(on); !ok {
		b.rt.StreamSynchronize(on)
		return
	}
	if e, rc := b.recordForeign(on); rc == interpose.Success {
		b.rt.EventSynchronize(e)
		b.rt.EventDestroy(e)
	}
}

// RecordForeignMarker records a marker on a stream of another device or
// context, with an event made in the stream's context, since one of the
// device's own cannot be recorded there. It costs an event created and
// destroyed per marker, on this rare path only.
func (b *backing) RecordForeignMarker(s pool.Stream) (pool.Marker, error) {
	on := interpose.Stream(s)
	if b.contexts == nil {
		return 0, fmt.Errorf("recording an event on stream %#x for device %d: the runtime cannot find a stream's context", uint64(s), b.ordinal)
	}
	if ctx, ok := defaultStreamContext(on); ok {
		e, rc := b.contexts.RecordInContext(ctx)
		if captureForbids(rc) {
			return 0, fmt.Errorf("recording an event on the legacy stream of context %#x for device %d: %w", ctx, b.ordinal, pool.ErrStreamCapture)
		}
		if rc != interpose.Success {
			return 0, cudaErr(fmt.Sprintf("recording an event on the legacy stream of context %#x for device %d", ctx, b.ordinal), rc)
		}
		b.keepForeignMarker(pool.Marker(e), ctx)
		return pool.Marker(e), nil
	}
	if b.capturing(on) {
		return 0, fmt.Errorf("recording an event on stream %#x for device %d: %w", uint64(s), b.ordinal, pool.ErrStreamCapture)
	}
	e, rc := b.contexts.RecordInStreamContext(on)
	if rc != interpose.Success {
		return 0, cudaErr(fmt.Sprintf("recording an event in the context of stream %#x for device %d", uint64(s), b.ordinal), rc)
	}
	if ctx, ok := b.streams.context(on); ok {
		b.keepForeignMarker(pool.Marker(e), ctx)
	}
	return pool.Marker(e), nil
}

// keepForeignMarker files marker m under context ctx, which it dies with.
func (b *backing) keepForeignMarker(m pool.Marker, ctx uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.foreignMarkers == nil {
		b.foreignMarkers = map[pool.Marker]uint64{}
	}
	b.foreignMarkers[m] = ctx
}

// DestroyForeignMarker destroys the event: it belongs to another context
// than the device's, so it is not kept for the device's markers.
func (b *backing) DestroyForeignMarker(m pool.Marker) {
	b.mu.Lock()
	delete(b.foreignMarkers, m)
	b.mu.Unlock()
	b.rt.EventDestroy(interpose.Event(m))
}

// markersOf forgets the foreign markers recorded in context ctx, gone with
// it, and returns them: the pool drops them without destroying them.
func (b *backing) markersOf(ctx uint64) map[pool.Marker]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	gone := map[pool.Marker]bool{}
	for m, c := range b.foreignMarkers {
		if c == ctx {
			gone[m] = true
			delete(b.foreignMarkers, m)
		}
	}
	return gone
}

// StreamIdle calls cudaStreamQuery. A per-thread identity names another
// thread's stream, which this thread cannot query, a context's default
// streams are not the device's to query, and a capturing stream has no
// answer: none is known idle.
func (b *backing) StreamIdle(s pool.Stream) (bool, error) {
	on := interpose.Stream(s)
	if _, ok := defaultStreamContext(on); ok || s&perThreadBit != 0 || b.capturing(on) {
		return false, nil
	}
	switch rc := b.rt.StreamQuery(on); rc {
	case interpose.Success:
		return true, nil
	case interpose.ErrorNotReady:
		return false, nil
	default:
		return false, cudaErr(fmt.Sprintf("%s of stream %#x on device %d", b.calls.streamQuery, uint64(s), b.ordinal), rc)
	}
}

// MarkerDone calls cudaEventQuery.
func (b *backing) MarkerDone(m pool.Marker) (bool, error) {
	switch rc := b.rt.EventQuery(interpose.Event(m)); rc {
	case interpose.Success:
		return true, nil
	case interpose.ErrorNotReady:
		return false, nil
	default:
		return false, cudaErr(b.calls.eventQuery, rc)
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
	how, reserve := b.calls.managedSpill, b.reserveManaged
	if tier == pool.TierPinned {
		how, reserve = b.calls.pinnedSpill, b.reservePinned
	}
	b.mu.Lock()
	b.inflightDone() // spilled blocks freed in stream order, now reached
	b.mu.Unlock()
	p, rc := reserve(size)
	if rc != interpose.Success {
		return 0, &spillError{cudaErr(fmt.Sprintf("spilling %d bytes to %s for device %d", size, how, b.ordinal), rc)}
	}
	b.index.add(p, size, b.dev)
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

// ReleaseHost frees a spilled block. Freed by cudaFreeAsync (s names the
// stream), it is freed once the device reaches an event recorded on that
// stream, since cudaFree of managed memory and cudaFreeHost would wait for
// the device; by cudaFree, at once. The device bytes of a promoted block,
// which the pool gives back when this returns, stay held in the ledger
// until then.
func (b *backing) ReleaseHost(base, size uint64, tier pool.Tier, s *pool.Stream) error {
	var release func() interpose.Error
	call := fmt.Sprintf("%s(%#x) of a spilled block", b.calls.free, base)
	if tier == pool.TierPinned {
		host, ok := b.pinned[base]
		if !ok {
			return fmt.Errorf("no pinned spill at %#x", base)
		}
		release, call = func() interpose.Error { return b.rt.FreeHost(host) }, b.calls.freeHost
	} else {
		release = func() interpose.Error { return b.rt.Free(interpose.DevicePtr(base)) }
	}
	b.mu.Lock() // Promote runs outside the pool's lock
	deviceBytes := b.promoted[base]
	b.mu.Unlock()
	if s != nil {
		b.ledger.hold(deviceBytes)
		if rc := b.afterStream(asyncStream(*s), inflightFree{size: deviceBytes, release: release}); rc != interpose.Success {
			b.ledger.Give(deviceBytes) // still live: the pool keeps it counted
			err := cudaErr(call, rc)
			b.releaseFailed(err, false)
			return err
		}
	} else {
		if rc := release(); rc != interpose.Success {
			err := cudaErr(call, rc)
			b.releaseFailed(err, false)
			return err
		}
	}
	b.index.remove(base, b.dev)
	delete(b.pinned, base)
	b.mu.Lock()
	delete(b.promoted, base)
	b.mu.Unlock()
	return nil
}

// Promote moves a managed block to the device: preferred location the
// device, prefetched there on the legacy stream (ordered after the work
// queued on every blocking stream), and waits for the move.
func (b *backing) Promote(base, size uint64) error {
	if b.capturing(0) {
		return fmt.Errorf("promoting %#x to device %d: %w", base, b.ordinal, pool.ErrStreamCapture)
	}
	// The pool took the device bytes from the ledger before the call.
	b.mu.Lock() // Promote runs outside the pool's lock
	b.promoted[base] = size
	b.mu.Unlock()
	p := interpose.DevicePtr(base)
	rc := b.rt.MemAdvise(p, size, interpose.AdviseSetPreferredLocation, b.ordinal)
	moving := false
	if rc == interpose.Success {
		rc = b.rt.MemPrefetchAsync(p, size, b.ordinal, 0)
		moving = rc == interpose.Success
	}
	if rc == interpose.Success {
		rc = b.rt.StreamSynchronize(0)
	}
	if rc == interpose.Success {
		return nil
	}
	err := cudaErr(fmt.Sprintf("promoting %#x (%d bytes) to device %d", base, size, b.ordinal), rc)
	// Back to the host's preference and the host, so the block is where the
	// pool thinks. If it may have reached the device and cannot be moved
	// back, the pool counts it on the device until it is freed
	// (pool.HostBacking): the quota holds.
	mayBeOnDevice := moving
	back := b.rt.MemAdvise(p, size, interpose.AdviseSetPreferredLocation, interpose.CPUDevice)
	if mayBeOnDevice && back == interpose.Success {
		back = b.rt.MemPrefetchAsync(p, size, interpose.CPUDevice, 0)
		if back == interpose.Success {
			back = b.rt.StreamSynchronize(0)
		}
	}
	if mayBeOnDevice && back != interpose.Success {
		// Not wrapping ErrOutOfMemory, which would tell the pool that
		// nothing moved.
		return fmt.Errorf("%v; moving it back to the host: %w", err, back)
	}
	b.mu.Lock()
	delete(b.promoted, base)
	b.mu.Unlock()
	return fmt.Errorf("%w: %w", err, pool.ErrNotMoved)
}

// observer fires the probe points for a device's pool. The pool calls it
// with its lock held, at each event, so the probe points fire in the order
// the events happen: a block's free before its memory is released (a
// spilled block's host memory included), hence before any thread can be
// handed the same address again. Without a tracer attached each event costs
// the probes' one load of the semaphore.
type observer struct {
	d      *device
	probes probeSink
	failed func(error) // counts nothing (the pool does), warns rate-limited
}

func (o *observer) Alloc(ptr, size uint64, tier pool.Tier, source pool.Source) {
	o.probes.Alloc(interpose.DevicePtr(ptr), size, o.d.ordinal, interpose.Tier(tier), interpose.Source(source))
}

func (o *observer) Free(ptr, size uint64, tier pool.Tier) {
	o.probes.Free(interpose.DevicePtr(ptr), size, o.d.ordinal, interpose.Tier(tier))
}

func (o *observer) Sync(madeReusable uint64) { o.probes.Sync(o.d.ordinal, madeReusable) }

func (o *observer) Spill(ptr, size uint64, tier pool.Tier) {
	o.probes.Spill(interpose.DevicePtr(ptr), size, o.d.ordinal, interpose.Tier(tier))
}

func (o *observer) Promote(ptr, size uint64, tier pool.Tier) {
	o.probes.Promote(interpose.DevicePtr(ptr), size, o.d.ordinal, interpose.Tier(tier))
}

func (o *observer) Refuse(size, _, quota uint64) {
	if o.probes.Enabled() { // the ledger's figure takes its lock
		o.probes.Refuse(size, o.d.ordinal, o.d.ledger.used(), quota)
	}
}

// BackingFailed warns of a failure the call that met it recovered from (a
// promotion after a free); the pool counts it in its stats.
func (o *observer) BackingFailed(err error) { o.failed(err) }
