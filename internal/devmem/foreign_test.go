package devmem

import (
	"testing"

	"github.com/spillway-gpu/spillway/interpose"
)

// contextsRuntime is fakeRuntime with streams of other contexts than the
// device's (context 1): a stream made in another context (contexts) is
// foreign to the device, and a held stream has not yet run its work, so an
// event recorded there is not complete until release.
type contextsRuntime struct {
	*fakeRuntime
	contexts map[interpose.Stream]uint64
	held     map[interpose.Stream]bool
	pending  map[interpose.Event]interpose.Stream // events recorded on a held stream
}

func newContextsRuntime(capacity uint64) *contextsRuntime {
	return &contextsRuntime{fakeRuntime: newFake(capacity), contexts: map[interpose.Stream]uint64{},
		held: map[interpose.Stream]bool{}, pending: map[interpose.Event]interpose.Stream{}}
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
	e, rc := r.EventCreate(interpose.EventDisableTiming)
	if rc != interpose.Success {
		return 0, rc
	}
	r.EventRecord(e, s)
	return e, interpose.Success
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
	if _, ok := r.pending[e]; ok {
		return interpose.ErrorNotReady
	}
	return interpose.Success
}

// release lets held stream s run its work: the events recorded there complete.
func (r *contextsRuntime) release(s interpose.Stream) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.held, s)
	for e, on := range r.pending {
		if on == s {
			delete(r.pending, e)
		}
	}
}

// TestDeviceResetSettlesForeignFreesInFlight: without pooling, a
// stream-ordered free on a stream of another context keeps its bytes
// counted until that stream reaches it; a reset of the device frees all
// its memory, so the bytes come back then, and the quota is whole again
// for the new context, even while the other stream is still held.
func TestDeviceResetSettlesForeignFreesInFlight(t *testing.T) {
	rt := newContextsRuntime(1 << 30)
	const other = interpose.Stream(0x500)
	rt.contexts[other], rt.held[other] = 2, true
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_POOL=0")
	a, rc := m.malloc(request{size: 40 << 20})
	if rc != interpose.Success {
		t.Fatal(rc)
	}
	if rc := m.free(a, other, true); rc != interpose.Success {
		t.Fatal(rc)
	}
	if rc := m.deviceReset(0, rt.DeviceReset); rc != interpose.Success {
		t.Fatal(rc)
	}
	if _, rc := m.malloc(request{size: 40 << 20}); rc != interpose.Success {
		t.Fatalf("40 MiB of a 64 MiB quota after a reset of the device: %v", rc)
	}
}
