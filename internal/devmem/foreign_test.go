package devmem

import (
	"testing"

	"github.com/spillway-gpu/spillway/interpose"
)

// contextsRuntime is fakeRuntime with streams of other contexts than the
// device's (context 1): a stream made in another context (contexts) is
// foreign to the device, and a held stream has not yet run its work, so an
// event recorded there is not complete until release. An event made in
// another context (on one of its streams, or on its legacy stream, named
// here as the core names its default streams) dies with the context, as
// with CUDA: querying it fails, and destroying it is counted in
// deadDestroyed, since its handle may already name another event.
type contextsRuntime struct {
	*fakeRuntime
	contexts      map[interpose.Stream]uint64
	held          map[interpose.Stream]bool
	pending       map[interpose.Event]interpose.Stream // events recorded on a held stream
	eventContext  map[interpose.Event]uint64           // events made in another context
	destroyed     map[uint64]bool                      // contexts destroyed
	lastEvent     interpose.Event
	deadDestroyed int
	recordFails   interpose.Error // RecordInContext fails with it, as on a capturing legacy stream
}

var _ streamContexts = (*contextsRuntime)(nil)

func newContextsRuntime(capacity uint64) *contextsRuntime {
	return &contextsRuntime{fakeRuntime: newFake(capacity), contexts: map[interpose.Stream]uint64{},
		held: map[interpose.Stream]bool{}, pending: map[interpose.Event]interpose.Stream{},
		eventContext: map[interpose.Event]uint64{}, destroyed: map[uint64]bool{}, lastEvent: 0x10000}
}

func (r *contextsRuntime) Context() uint64 { return 1 }

func (r *contextsRuntime) StreamContext(s interpose.Stream) (uint64, interpose.Error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.invalid[s] {
		return 0, interpose.ErrorInvalidResourceHandle
	}
	if ctx, ok := r.contexts[s]; ok {
		return ctx, interpose.Success
	}
	return 1, interpose.Success
}

func (r *contextsRuntime) RecordInStreamContext(s interpose.Stream) (interpose.Event, interpose.Error) {
	ctx, rc := r.StreamContext(s)
	if rc != interpose.Success {
		return 0, rc
	}
	return r.recordIn(ctx, s), interpose.Success
}

func (r *contextsRuntime) RecordInContext(ctx uint64) (interpose.Event, interpose.Error) {
	if r.recordFails != interpose.Success {
		return 0, r.recordFails
	}
	return r.recordIn(ctx, contextDefaultStream(ctx)), interpose.Success
}

func (r *contextsRuntime) FreeAsyncInContext(_ uint64, p interpose.DevicePtr) interpose.Error {
	return r.fakeRuntime.release(p, "device")
}

// recordIn makes an event in context ctx and records it on stream s.
func (r *contextsRuntime) recordIn(ctx uint64, s interpose.Stream) interpose.Event {
	r.mu.Lock()
	r.lastEvent++
	e := r.lastEvent
	r.eventContext[e] = ctx
	r.mu.Unlock()
	r.EventRecord(e, s)
	return e
}

func (r *contextsRuntime) EventRecord(e interpose.Event, s interpose.Stream) interpose.Error {
	r.fakeRuntime.EventRecord(e, s)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held[s] {
		r.pending[e] = s
	}
	return interpose.Success
}

func (r *contextsRuntime) EventQuery(e interpose.Event) interpose.Error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx, ok := r.eventContext[e]; ok && r.destroyed[ctx] {
		return interpose.ErrorInvalidResourceHandle
	}
	if _, ok := r.pending[e]; ok {
		return interpose.ErrorNotReady
	}
	return interpose.Success
}

func (r *contextsRuntime) EventDestroy(e interpose.Event) interpose.Error {
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx, ok := r.eventContext[e]
	if !ok {
		r.events--
		return interpose.Success
	}
	if r.destroyed[ctx] {
		r.deadDestroyed++
		return interpose.ErrorInvalidResourceHandle
	}
	delete(r.eventContext, e)
	return interpose.Success
}

// releaseLocked lets held stream s run its work: the events recorded there
// complete. r.mu is held.
func (r *contextsRuntime) releaseLocked(s interpose.Stream) {
	delete(r.held, s)
	for e, on := range r.pending {
		if on == s {
			delete(r.pending, e)
		}
	}
}

// destroyContext destroys context ctx, as cuCtxDestroy does once its work
// is done: its streams are no longer valid, and its events are gone.
func (r *contextsRuntime) destroyContext(ctx uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.destroyed[ctx] = true
	r.releaseLocked(contextDefaultStream(ctx))
	for s, c := range r.contexts {
		if c == ctx {
			r.releaseLocked(s)
			r.invalid[s] = true
		}
	}
}

// freedOnHeldStream makes 40 MiB without pooling under a 64 MiB quota and
// frees them in stream order on a held stream of context ctx, whose work
// has not reached the free.
func freedOnHeldStream(t *testing.T, ctx uint64) (*contextsRuntime, testMemory) {
	t.Helper()
	rt := newContextsRuntime(1 << 30)
	const held = interpose.Stream(0x500)
	rt.contexts[held], rt.held[held] = ctx, true
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_POOL=0")
	a, rc := m.malloc(request{size: 40 << 20})
	if rc != interpose.Success {
		t.Fatal(rc)
	}
	if rc := m.free(a, held, true); rc != interpose.Success {
		t.Fatal(rc)
	}
	return rt, m
}

// TestDeviceResetSettlesForeignFreesInFlight: without pooling, a
// stream-ordered free on a stream of another context keeps its bytes
// counted until that stream reaches it; a reset of the device frees all
// its memory, so the bytes come back then, and the quota is whole again
// for the new context, even while the other stream is still held.
func TestDeviceResetSettlesForeignFreesInFlight(t *testing.T) {
	rt, m := freedOnHeldStream(t, 2)
	if rc := m.deviceReset(0, rt.DeviceReset); rc != interpose.Success {
		t.Fatal(rc)
	}
	if _, rc := m.malloc(request{size: 40 << 20}); rc != interpose.Success {
		t.Fatalf("40 MiB of a 64 MiB quota after a reset of the device: %v", rc)
	}
}

// TestDeviceSynchronizeKeepsForeignFreesInFlight: without pooling, a
// stream-ordered free on a held stream of another context keeps its bytes
// counted while that stream has not reached it: the program's
// synchronization of the device covers none of that context's work, so
// cudaMemGetInfo still counts the 40 MiB until the stream runs.
func TestDeviceSynchronizeKeepsForeignFreesInFlight(t *testing.T) {
	_, m := freedOnHeldStream(t, 2)
	if rc := m.deviceSynchronize(0); rc != interpose.Success {
		t.Fatal(rc)
	}
	if free, _, rc := m.memGetInfo(0); rc != interpose.Success || free != 24<<20 {
		t.Errorf("cudaMemGetInfo after the device was synchronized: %d bytes free (%v), want 24 MiB: the other context's stream has yet to free 40 MiB", free, rc)
	}
}

// TestContextDestroyedFreesWhatWaitsOnIt: blocks freed in stream order in a
// created context, on a stream of it, on a stream of it destroyed before
// the context (its block waits on a marker recorded then), and on the
// context's default stream while it was current, are reused once the
// context is destroyed, though its work held them until then: the
// destruction ended that work, and the markers died with the context, so
// none is queried or destroyed after it.
func TestContextDestroyedFreesWhatWaitsOnIt(t *testing.T) {
	rt := newContextsRuntime(1 << 30)
	const created = 2
	const kept, destroyed = interpose.Stream(0x500), interpose.Stream(0x600)
	for _, s := range []interpose.Stream{kept, destroyed} {
		rt.contexts[s], rt.held[s] = created, true
	}
	rt.held[contextDefaultStream(created)] = true
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=64MiB")
	c := &Core{mem: m.memory}
	var blocks []interpose.DevicePtr
	for range 3 {
		p, rc := m.malloc(request{size: 20 << 20})
		if rc != interpose.Success {
			t.Fatal(rc)
		}
		blocks = append(blocks, p)
	}
	if rc := m.free(blocks[0], kept, true); rc != interpose.Success {
		t.Fatal(rc)
	}
	if rc := m.free(blocks[1], destroyed, true); rc != interpose.Success {
		t.Fatal(rc)
	}
	if rc := m.streamDestroy(destroyed); rc != interpose.Success {
		t.Fatal(rc)
	}
	if rc := m.freeIn(blocks[2], 0, true, created); rc != interpose.Success {
		t.Fatal(rc)
	}
	rt.destroyContext(created)
	c.CtxDestroyed(created)
	if _, rc := m.malloc(request{size: 60 << 20}); rc != interpose.Success {
		t.Fatalf("60 MiB of a 64 MiB quota once the context the blocks waited on is destroyed: %v", rc)
	}
	if st := m.existing(0).pool.Stats(); st.BackingErrors != 0 {
		t.Errorf("%d backing errors: a marker of the destroyed context queried?", st.BackingErrors)
	}
	if rt.deadDestroyed != 0 {
		t.Errorf("%d events of the destroyed context destroyed after it", rt.deadDestroyed)
	}
}

// TestContextDestroyedSettlesFreesInFlight: without pooling, a
// stream-ordered free on a stream of a created context keeps its bytes
// counted until its event completes; destroying the context ends its work
// and its events, so the bytes come back then, and the event, whose handle
// CUDA may already have given to another, is neither queried nor destroyed.
func TestContextDestroyedSettlesFreesInFlight(t *testing.T) {
	const created = 2
	rt, m := freedOnHeldStream(t, created)
	c := &Core{mem: m.memory}
	rt.destroyContext(created)
	c.CtxDestroyed(created)
	if _, rc := m.malloc(request{size: 60 << 20}); rc != interpose.Success {
		t.Fatalf("60 MiB of a 64 MiB quota once the context the free waited on is destroyed: %v", rc)
	}
	if rt.deadDestroyed != 0 {
		t.Errorf("%d events of the destroyed context destroyed after it", rt.deadDestroyed)
	}
}

// TestContextDestroyedFreesDefaultStreamWithoutMarker: a block freed in
// stream order on a created context's default stream while no marker can
// be recorded there waits for that context's work; destroying the context
// ends it, and the block comes back.
func TestContextDestroyedFreesDefaultStreamWithoutMarker(t *testing.T) {
	rt := newContextsRuntime(1 << 30)
	const created = 2
	rt.held[contextDefaultStream(created)] = true
	rt.recordFails = interpose.ErrorStreamCaptureUnsupported
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=64MiB")
	c := &Core{mem: m.memory}
	a, rc := m.malloc(request{size: 40 << 20})
	if rc != interpose.Success {
		t.Fatal(rc)
	}
	if rc := m.freeIn(a, 0, true, created); rc != interpose.Success {
		t.Fatal(rc)
	}
	if _, rc := m.malloc(request{size: 40 << 20}); rc == interpose.Success {
		t.Fatal("a block freed on a held stream of a created context was handed out again before that context's work ran")
	}
	rt.destroyContext(created)
	c.CtxDestroyed(created)
	if _, rc := m.malloc(request{size: 60 << 20}); rc != interpose.Success {
		t.Fatalf("60 MiB of a 64 MiB quota once the context the block waited on is destroyed: %v", rc)
	}
}
