package pool_test

import (
	"errors"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

// A synchronization the pool forces is counted in Stats.Syncs, and one the
// Backing fails in Stats.BackingErrors, not as a synchronization.
func TestForcedSynchronizationsAreCounted(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	a := h.mustAlloc(miB)
	h.mustAlloc(miB) // the 2 MiB segment is full
	h.mustFree(a)
	broken := errors.New("cudaDeviceSynchronize failed")
	f.FailSynchronize = func() error { return broken }
	if _, err := h.alloc(miB); !errors.Is(err, broken) {
		t.Fatalf("Alloc needing a failed synchronization: %v, want the failure", err)
	}
	if st := h.p.Stats(); st.Syncs != 0 || st.BackingErrors != 1 {
		t.Fatalf("after a failed synchronization: %d synchronizations, %d backing errors; want 0 and 1", st.Syncs, st.BackingErrors)
	}
	f.FailSynchronize = nil
	if got := h.mustAlloc(miB); got != a {
		t.Fatalf("got %#x, want the freed block %#x", got, a)
	}
	if st := h.p.Stats(); st.Syncs != 1 || st.BackingErrors != 1 {
		t.Fatalf("after a synchronization: %d synchronizations, %d backing errors; want 1 and 1", st.Syncs, st.BackingErrors)
	}
	h.close()
}

// Frees a synchronization completed are no longer pending: a later miss of
// their class grows instead of waiting for the device again.
func TestCompletedFreesForceNoSynchronization(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	a := h.mustAlloc(miB)
	h.mustAlloc(miB)
	medium := h.mustAlloc(4 * miB)
	h.mustFree(a)
	h.appSync()
	h.mustFree(medium) // pending, of another class
	h.mustAlloc(miB)   // a, from the cache
	h.mustAlloc(miB)   // a miss with nothing of its class pending
	if st := h.p.Stats(); st.Syncs != 0 || st.PendingBytes != 4*miB {
		t.Fatalf("%d synchronizations forced, %d bytes pending; want none, and the medium block pending", st.Syncs, st.PendingBytes)
	}
	h.close()
}

// A synchronization that covers a stream's marker destroys it, and the
// stream's cache, drained, goes at the next one: nothing of the stream is
// left, its CUDA event included.
func TestSynchronizationDestroysTheMarkersItCovers(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	const s pool.Stream = 5
	a, _ := h.allocAsync(64*kiB, s)
	if err := h.freeAsync(a, s); err != nil {
		t.Fatal(err)
	}
	if m := f.LiveMarkers(); m != 1 {
		t.Fatalf("%d markers after a free on a stream, want 1", m)
	}
	h.appSync()
	if m := f.LiveMarkers(); m != 0 {
		t.Fatalf("%d markers after a synchronization covering the only one, want 0", m)
	}
	h.close()
}

// Blocks made free by a completed marker count toward the release
// threshold as soon as a miss reclaims them.
func TestMarkerReclaimAppliesTheReleaseThreshold(t *testing.T) {
	f := pooltest.New(0)
	opt := pool.DefaultOptions(giB)
	opt.ReleaseThreshold = 0
	h := newHarness(t, f, opt)
	const s pool.Stream = 5
	a, _ := h.allocAsync(20*miB, s) // a huge segment of its own
	if err := h.freeAsync(a, s); err != nil {
		t.Fatal(err)
	}
	f.Complete(s)
	h.mustAlloc(4 * kiB) // a miss of another class: polls the marker
	if st := h.p.Stats(); st.SegmentsReleased != 1 || st.Segments != 1 {
		t.Fatalf("after the marker completed: %d segments released, %d held; want the empty one released, the small one held", st.SegmentsReleased, st.Segments)
	}
	h.close()
}

// failingMarkerQuery is a device whose marker queries fail.
type failingMarkerQuery struct {
	*pooltest.Fake
	err error
}

func (f *failingMarkerQuery) MarkerDone(pool.Marker) (bool, error) { return false, f.err }

// A marker query that fails fails no call: it is counted and told to a
// FailureObserver, and the blocks wait for a synchronization.
func TestFailedMarkerQueryIsCountedAndTold(t *testing.T) {
	broken := errors.New("cudaEventQuery failed")
	obs := &failures{recorder: recorder{sources: map[pool.Source]int{}}}
	opt := pool.DefaultOptions(giB)
	opt.Observer = obs
	p, err := pool.New(&failingMarkerQuery{Fake: pooltest.New(0), err: broken}, opt)
	if err != nil {
		t.Fatal(err)
	}
	const s pool.Stream = 5
	a, _ := p.AllocAsync(64*kiB, s)
	if err := p.FreeAsync(a, s); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Alloc(4 * miB); err != nil { // a miss: queries the marker
		t.Fatal(err)
	}
	if st := p.Stats(); st.BackingErrors != 1 || len(obs.errs) != 1 || !errors.Is(obs.errs[0], broken) || st.PendingBytes != 64*kiB {
		t.Fatalf("stats %v, observer told %v; want the failure counted and told, the block still waiting", st, obs.errs)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// The release threshold bounds the cached bytes (segments less live
// blocks), not the segments: an empty segment is kept while the cached
// bytes, its own included, do not exceed it.
func TestReleaseThresholdCountsCachedBytesOnly(t *testing.T) {
	f := pooltest.New(0)
	opt := pool.DefaultOptions(giB)
	opt.ReleaseThreshold = 2 * miB
	h := newHarness(t, f, opt)
	h.mustAlloc(20 * miB) // a live segment, above the threshold by itself
	h.mustFree(h.mustAlloc(miB))
	h.appSync() // a 2 MiB small segment is empty: exactly the threshold
	if st := h.p.Stats(); st.SegmentsReleased != 0 || st.CachedBytes != 2*miB {
		t.Fatalf("%d segments released, %d bytes cached; want the empty 2 MiB segment kept under a 2 MiB threshold", st.SegmentsReleased, st.CachedBytes)
	}
	h.close()
}

// The reserve (Options.Reserve) is never released before Close, even when
// the first request does not fit in it and ReleaseCached returns everything
// else.
func TestReserveOutlivesReleaseCached(t *testing.T) {
	f := pooltest.New(0)
	opt := pool.DefaultOptions(giB)
	opt.Reserve = 4 * miB
	h := newHarness(t, f, opt)
	h.mustFree(h.mustAlloc(8 * miB)) // larger than the reserve: a segment of its own
	h.appSync()
	h.p.ReleaseCached(true)
	if st := h.p.Stats(); st.ReservedBytes != 4*miB || st.Segments != 1 {
		t.Fatalf("after ReleaseCached: %d bytes reserved in %d segments; want the 4 MiB reserve alone", st.ReservedBytes, st.Segments)
	}
	h.close()
}

// idleStreams is a device on which every stream handle names an idle stream
// now, as a new stream given a destroyed one's handle does.
type idleStreams struct{ *pooltest.Fake }

func (idleStreams) StreamIdle(pool.Stream) (bool, error) { return true, nil }

// The blocks of a destroyed foreign stream wait for the marker recorded
// when it was forgotten: the stream now named by its handle is another,
// whose idleness says nothing of the old one's work.
func TestForgottenForeignStreamIsNotAskedIfIdle(t *testing.T) {
	f := pooltest.New(0)
	p, err := pool.New(idleStreams{f}, pool.DefaultOptions(giB))
	if err != nil {
		t.Fatal(err)
	}
	const foreign pool.Stream = 0x900
	f.MakeForeign(foreign)
	a, _ := p.Alloc(64 * kiB)
	if err := p.FreeAsyncForeign(a, foreign); err != nil {
		t.Fatal(err)
	}
	p.ForgetStream(foreign)
	p.ReleaseCached(false) // asks the streams it holds blocks of whether they are idle
	p.TrimTo(0)
	if st := p.Stats(); st.PendingBytes != 64*kiB {
		t.Fatalf("%d bytes pending; want the block of the destroyed stream still waiting for its marker", st.PendingBytes)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// A stream freed on as foreign stays foreign: a later free on it through
// FreeAsync does not make the device's synchronization complete the
// earlier one.
func TestForeignStreamStaysForeign(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	const foreign pool.Stream = 0x900
	f.MakeForeign(foreign)
	a := h.mustAlloc(64 * kiB)
	b := h.mustAlloc(64 * kiB)
	if err := h.freeAsyncForeign(a, foreign); err != nil {
		t.Fatal(err)
	}
	if err := h.freeAsync(b, foreign); err != nil {
		t.Fatal(err)
	}
	h.appSync()
	if st := h.p.Stats(); st.PendingBytes != 128*kiB {
		t.Fatalf("%d bytes pending after a synchronization of the device; want both blocks of the foreign stream", st.PendingBytes)
	}
	for range 40 {
		h.mustAlloc(64 * kiB) // the harness fails the test if a or b comes back
	}
	h.close()
}

// Neighbours freed on one stream merge, and the merged block waits for its
// latest part: a marker recorded before the later free does not release it.
func TestMergedStreamBlockWaitsForItsLatestPart(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	const s pool.Stream = 5
	a, _ := h.allocAsync(64*kiB, s)
	b, _ := h.allocAsync(64*kiB, s)
	if b != a+64*kiB {
		t.Fatalf("blocks not adjacent: %#x %#x", a, b)
	}
	if err := h.freeAsync(a, s); err != nil { // records a marker covering a
		t.Fatal(err)
	}
	f.Complete(s)                             // the marker completes
	if err := h.freeAsync(b, s); err != nil { // merges with a; queued after the marker
		t.Fatal(err)
	}
	for range 40 {
		h.mustAlloc(128 * kiB) // the harness fails the test if b's range comes back
	}
	h.close()
}

// TestDestroyedForeignStreamsLeaveNothingBehind: a program that makes a
// stream of another device or context for each step, frees a block on it
// and destroys it, while every request of its hits the cache (so no miss
// polls the markers), keeps only a bounded number of the destroyed
// streams' caches and markers (CUDA events) once their work completed, not
// one per step: a server or a training loop runs millions of steps. The
// markers are polled once twice as many wait as the last poll left (here
// the step's own, not yet complete), and 64 more: at no step do more than
// 65 live.
func TestDestroyedForeignStreamsLeaveNothingBehind(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	// A cache warm enough that none of the steps below misses.
	var warm []uint64
	for range 2048 {
		warm = append(warm, h.mustAlloc(64*kiB))
	}
	for _, p := range warm {
		h.mustFree(p)
	}
	h.appSync()
	warmed := h.p.Stats().DeviceReservations
	const steps = 2000
	most, mostAt := 0, 0
	for i := range steps {
		s := pool.Stream(0x1000 + i)
		f.MakeForeign(s)
		if err := h.freeAsyncForeign(h.mustAlloc(64*kiB), s); err != nil {
			t.Fatal(err)
		}
		h.forgetStream(s)
		f.Complete(s)
		if live := f.LiveMarkers(); live > most {
			most, mostAt = live, i
		}
	}
	if misses := h.p.Stats().DeviceReservations - warmed; misses > 0 {
		t.Fatalf("%d requests missed the cache after the warm-up: the test needs none", misses)
	}
	if most > 65 {
		t.Errorf("%d markers of destroyed streams whose work completed lived after step %d of %d, want at most 65", most, mostAt, steps)
	}
	h.close()
}
