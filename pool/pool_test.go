package pool_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

const (
	kiB = 1 << 10
	miB = 1 << 20
	giB = 1 << 30
)

func TestAlignmentAndNoOverlap(t *testing.T) {
	h := newHarness(t, pooltest.New(0), pool.DefaultOptions(64*giB))
	rng := rand.New(rand.NewPCG(1, 2))
	var ptrs []uint64
	for range 3000 {
		if len(ptrs) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(ptrs))
			h.mustFree(ptrs[i])
			ptrs[i] = ptrs[len(ptrs)-1]
			ptrs = ptrs[:len(ptrs)-1]
			continue
		}
		size := uint64(1 + rng.IntN(4*miB))
		if rng.IntN(10) == 0 {
			size = uint64(1 + rng.IntN(64*miB))
		}
		ptrs = append(ptrs, h.mustAlloc(size)) // the harness checks alignment and overlap
	}
	h.close()
}

func TestCoalescingRebuildsTheSegment(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	a, b, c := h.mustAlloc(64*kiB), h.mustAlloc(64*kiB), h.mustAlloc(64*kiB)
	if b != a+64*kiB || c != b+64*kiB {
		t.Fatalf("blocks not packed in one segment: %#x %#x %#x", a, b, c)
	}
	// Free out of order so both merge directions are exercised.
	h.mustFree(a)
	h.mustFree(c)
	h.mustFree(b)
	h.appSync()
	if st := h.p.Stats(); st.LargestFreeBlock != 2*miB {
		t.Fatalf("largest free block after freeing everything = %d, want the whole 2 MiB segment", st.LargestFreeBlock)
	}
	if got := h.mustAlloc(2 * miB / 2); got != a {
		t.Fatalf("1 MiB after coalescing at %#x, want the segment start %#x", got, a)
	}
	if n := f.Counts().Reserves; n != 1 {
		t.Fatalf("%d segments reserved, want 1", n)
	}
	h.close()
}

func TestFreedMemoryWaitsForASynchronization(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	a := h.mustAlloc(miB)
	h.mustAlloc(miB) // the 2 MiB segment is full
	h.mustFree(a)
	// The freed block is the only fit in the cache: the pool must synchronize
	// before handing it out again (the harness checks the order).
	if got := h.mustAlloc(miB); got != a {
		t.Fatalf("got %#x, want the freed block %#x after a synchronization", got, a)
	}
	if n := f.Counts().Syncs; n != 1 {
		t.Fatalf("%d synchronizations, want 1", n)
	}
	h.close()
}

func TestOneSynchronizationServesABatchOfFrees(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	var ptrs []uint64
	for range 64 { // 64 × 32 KiB fills the 2 MiB segment exactly
		ptrs = append(ptrs, h.mustAlloc(32*kiB))
	}
	for _, p := range ptrs {
		h.mustFree(p)
	}
	for range 64 {
		h.mustAlloc(32 * kiB)
	}
	if c := f.Counts(); c.Syncs != 1 || c.Reserves != 1 {
		t.Fatalf("%d synchronizations and %d reservations, want 1 and 1", c.Syncs, c.Reserves)
	}
	h.close()
}

func TestApplicationSynchronizationSparesThePoolsOwn(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	a := h.mustAlloc(4 * kiB)
	h.mustFree(a)
	ticket := h.p.SyncBegin()
	if err := f.Synchronize(); err != nil { // the application's own cudaDeviceSynchronize
		t.Fatal(err)
	}
	if err := h.p.SyncEnd(ticket); err != nil {
		t.Fatal(err)
	}
	if got := h.mustAlloc(4 * kiB); got != a {
		t.Fatalf("got %#x, want %#x", got, a)
	}
	if st := h.p.Stats(); st.Syncs != 0 || st.ExternalSyncs != 1 {
		t.Fatalf("pool synchronized %d times with %d external synchronizations, want 0 and 1", st.Syncs, st.ExternalSyncs)
	}
	h.close()
}

func TestFreeDuringSynchronizationWaitsForTheNext(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	a := h.mustAlloc(4 * kiB)
	ticket := h.p.SyncBegin()
	h.mustFree(a) // freed after the synchronization began: not covered by it
	if err := h.p.SyncEnd(ticket); err != nil {
		t.Fatal(err)
	}
	if st := h.p.Stats(); st.PendingBytes != 4*kiB {
		t.Fatalf("pending bytes = %d after a synchronization that began before the free, want %d", st.PendingBytes, 4*kiB)
	}
	h.close()
}

func TestStreamOrderedReuse(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	const s1, s2 pool.Stream = 0x100, 0x200
	a, err := h.allocAsync(128*kiB, s1)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.freeAsync(a, s1); err != nil {
		t.Fatal(err)
	}
	if got, _ := h.allocAsync(128*kiB, s1); got != a {
		t.Fatalf("same stream: got %#x, want the block freed on it %#x", got, a)
	}
	if err := h.freeAsync(a, s1); err != nil {
		t.Fatal(err)
	}
	// Another stream and a plain cudaMalloc must not get it while s1 runs.
	b, _ := h.allocAsync(128*kiB, s2)
	c := h.mustAlloc(128 * kiB)
	if b == a || c == a {
		t.Fatalf("block freed on s1 reused before the free completed: %#x %#x", b, c)
	}
	if n := f.Counts().Syncs; n != 0 {
		t.Fatalf("stream-ordered frees forced %d synchronizations", n)
	}
	// s1 progresses; the pool learns it from the markers it records on s1,
	// which it polls when a request misses.
	found := false
	for range 200 {
		f.Complete(s1)
		p, err := h.allocAsync(128*kiB, s2)
		if err != nil {
			t.Fatal(err)
		}
		if p == a {
			found = true
			break
		}
	}
	if !found {
		t.Fatalf("block freed on s1 not reused on s2 after s1 completed")
	}
	if f.Counts().Syncs != 0 {
		t.Fatalf("stream-ordered reuse forced a synchronization")
	}
	h.close()
}

func TestForgetStreamTurnsItsBlocksIntoPendingFrees(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	a, _ := h.allocAsync(64*kiB, 7)
	if err := h.freeAsync(a, 7); err != nil {
		t.Fatal(err)
	}
	h.p.ForgetStream(7)
	if m := f.LiveMarkers(); m != 0 {
		t.Fatalf("%d markers left after ForgetStream", m)
	}
	// The harness still treats the block as busy on stream 7: a reuse before a
	// synchronization would fail the test.
	for range 40 {
		h.mustAlloc(64 * kiB)
	}
	h.close()
}

// TestForeignStreamFreeWaitsForItsStream: a block freed on a foreign stream
// (one of another device, which the device's synchronization does not wait
// for) is not handed out again after the application's synchronizations
// or under pressure; once the stream has run its work, the
// marker recorded there makes it reusable. No marker of the device is
// tried on the foreign stream.
func TestForeignStreamFreeWaitsForItsStream(t *testing.T) {
	f := pooltest.New(0)
	opt := pool.DefaultOptions(8 * miB)
	opt.ReleaseThreshold = 8 * miB
	h := newHarness(t, f, opt)
	const foreign pool.Stream = 0x900
	f.MakeForeign(foreign)
	a := h.mustAlloc(miB)
	if err := h.freeAsyncForeign(a, foreign); err != nil {
		t.Fatal(err)
	}
	h.appSync()
	var held []uint64
	for {
		p, err := h.alloc(miB) // the harness fails the test if a comes back
		if err != nil {
			break
		}
		held = append(held, p)
	}
	for _, p := range held {
		h.mustFree(p)
	}
	h.appSync()
	f.Complete(foreign)
	found := false
	for range 8 { // the quota: the last one only with a's memory
		found = found || h.mustAlloc(miB) == a
	}
	if !found {
		t.Fatalf("block freed on a foreign stream not reused once the stream completed")
	}
	if st := h.p.Stats(); st.BackingErrors != 0 {
		t.Fatalf("%d backing errors: a marker of the device tried on the foreign stream?", st.BackingErrors)
	}
	h.close()
}

// newFourBlockHarness returns a harness whose quota holds four blocks of
// the size it returns: 1 MiB in fixed segments, a granule with virtual
// memory; the pool keeps what is freed (no release threshold below it).
func newFourBlockHarness(t *testing.T, virtual bool) (*harness, *pooltest.Fake, uint64) {
	t.Helper()
	if virtual {
		vf := pooltest.NewVirtual(0)
		return newVirtualHarness(t, vf, virtualOptions(4*granule)), vf.Fake, granule
	}
	f := pooltest.New(0)
	opt := pool.DefaultOptions(4 * miB)
	opt.ReleaseThreshold = 4 * miB
	return newHarness(t, f, opt), f, miB
}

// TestForeignFreeForcesNoSync: under a quota full but for a block freed on
// a foreign stream whose work has not run, a request that needs its bytes
// is refused without a synchronization of the device, which could not
// complete that free; once the stream has run its work, the next request
// gets the block through its marker, still without a synchronization. So
// does ReleaseCached(true): it synchronizes in vain for nothing, and
// releases the block once its marker completed.
func TestForeignFreeForcesNoSync(t *testing.T) {
	const foreign pool.Stream = 0x900
	for _, virtual := range []bool{false, true} {
		t.Run(fmt.Sprintf("virtual=%v", virtual), func(t *testing.T) {
			h, f, block := newFourBlockHarness(t, virtual)
			f.MakeForeign(foreign)
			var held []uint64
			for range 4 {
				held = append(held, h.mustAlloc(block))
			}
			if err := h.freeAsyncForeign(held[0], foreign); err != nil {
				t.Fatal(err)
			}
			if _, err := h.alloc(block); !errors.Is(err, pool.ErrQuota) {
				t.Fatalf("Alloc(%d) with the quota full: %v, want a refusal", block, err)
			}
			if n := f.Counts().Syncs; n != 0 {
				t.Fatalf("%d synchronizations forced for a block only its foreign stream completes", n)
			}
			f.Complete(foreign)
			if ptr := h.mustAlloc(block); !virtual && ptr != held[0] {
				t.Fatalf("Alloc(%d) = %#x, want the block freed on the completed foreign stream, %#x", block, ptr, held[0])
			}
			if n := f.Counts().Syncs; n != 0 {
				t.Fatalf("%d synchronizations forced to reuse a block whose marker completed", n)
			}
			if err := h.freeAsyncForeign(held[1], foreign); err != nil {
				t.Fatal(err)
			}
			h.p.ReleaseCached(true)
			if n := f.Counts().Syncs; n != 0 {
				t.Fatalf("ReleaseCached(true) forced %d synchronizations for a block only its foreign stream completes", n)
			}
			f.Complete(foreign)
			if got := h.p.ReleaseCached(true); got != block {
				t.Fatalf("ReleaseCached(true) released %d bytes once the foreign stream completed, want its block's %d", got, block)
			}
			h.closeEither()
		})
	}
}

// TestPressurePollsForeignMarkers: a synchronization made under quota
// pressure for blocks of the device's own (too small to serve the
// request) lets the work of a foreign stream run meanwhile; the block
// freed there, its marker now complete, serves the request instead of a
// refusal.
func TestPressurePollsForeignMarkers(t *testing.T) {
	const foreign pool.Stream = 0x900
	f := pooltest.New(0)
	opt := pool.DefaultOptions(4 * miB)
	opt.ReleaseThreshold = 4 * miB
	h := newHarness(t, f, opt)
	f.MakeForeign(foreign)
	a := h.mustAlloc(miB)
	h.mustAlloc(miB)
	h.mustAlloc(miB)
	small := h.mustAlloc(miB / 2)
	h.mustAlloc(miB / 2)
	if err := h.freeAsyncForeign(a, foreign); err != nil {
		t.Fatal(err)
	}
	h.mustFree(small)
	f.FailSynchronize = func() error {
		f.Complete(foreign) // runs while the device synchronizes
		return nil
	}
	if ptr := h.mustAlloc(miB); ptr != a {
		t.Fatalf("Alloc(1 MiB) = %#x, want the block freed on the foreign stream that completed, %#x", ptr, a)
	}
	if n := f.Counts().Syncs; n != 1 {
		t.Fatalf("%d synchronizations, want the one for the block freed by Free", n)
	}
	f.FailSynchronize = nil
	h.close()
}

// TestPressureAsksIdleForeignStreams: under a quota full but for a block
// freed on a foreign stream whose marker could not be recorded, a request
// that needs its bytes gets the block once the stream has run its work (as
// cudaStreamQuery tells), without a synchronization, which could not
// complete that free, and without waiting for a marker that may never be.
func TestPressureAsksIdleForeignStreams(t *testing.T) {
	const foreign pool.Stream = 0x900
	for _, virtual := range []bool{false, true} {
		t.Run(fmt.Sprintf("virtual=%v", virtual), func(t *testing.T) {
			h, f, block := newFourBlockHarness(t, virtual)
			f.MakeForeign(foreign)
			f.FailRecordMarker = func(s pool.Stream) error {
				if s == foreign {
					return errors.New("out of events")
				}
				return nil
			}
			var held []uint64
			for range 4 {
				held = append(held, h.mustAlloc(block))
			}
			if err := h.freeAsyncForeign(held[0], foreign); err != nil {
				t.Fatal(err)
			}
			if _, err := h.alloc(block); !errors.Is(err, pool.ErrQuota) {
				t.Fatalf("Alloc(%d) with the foreign stream's work still queued: %v, want a refusal", block, err)
			}
			f.Complete(foreign)
			if ptr, err := h.alloc(block); err != nil {
				t.Fatalf("Alloc(%d) once the foreign stream ran its work: %v, want its block's memory", block, err)
			} else if !virtual && ptr != held[0] {
				t.Fatalf("Alloc(%d) = %#x, want the block freed on the idle foreign stream, %#x", block, ptr, held[0])
			}
			if n := f.Counts().Syncs; n != 0 {
				t.Fatalf("%d synchronizations forced for a block only its foreign stream completes", n)
			}
			f.FailRecordMarker = nil
			h.closeEither()
		})
	}
}

// TestMissAsksIdleForeignStreams: below the quota too, a request that
// misses is served by the block freed on a foreign stream whose marker
// cannot be recorded, once that stream has run its work, rather than by
// memory the pool grows for it.
func TestMissAsksIdleForeignStreams(t *testing.T) {
	const foreign pool.Stream = 0x900
	const block = uint64(miB)
	f := pooltest.New(0)
	opt := pool.DefaultOptions(64 * block)
	opt.ReleaseThreshold = 64 * block
	h := newHarness(t, f, opt)
	f.MakeForeign(foreign)
	f.FailRecordMarker = func(s pool.Stream) error {
		if s == foreign {
			return errors.New("out of events")
		}
		return nil
	}
	var held []uint64
	for h.p.Stats().CachedBytes > 0 || len(held) == 0 {
		held = append(held, h.mustAlloc(block))
	}
	if err := h.freeAsyncForeign(held[0], foreign); err != nil {
		t.Fatal(err)
	}
	f.Complete(foreign)
	reserved := h.p.Stats().ReservedBytes
	if ptr := h.mustAlloc(block); ptr != held[0] {
		t.Fatalf("Alloc(%d) = %#x, want the block freed on the idle foreign stream, %#x", block, ptr, held[0])
	}
	if got := h.p.Stats().ReservedBytes; got != reserved {
		t.Errorf("the pool grew from %d to %d bytes for a block its idle foreign stream gave back", reserved, got)
	}
	f.FailRecordMarker = nil
	h.close()
}

// TestMissQueriesNoStreamWithAMarker: where a stream's marker was recorded,
// a miss polls the marker and never queries the stream itself (a query per
// miss per stream would cost a driver call each), until the marker
// completes and gives the block back.
func TestMissQueriesNoStreamWithAMarker(t *testing.T) {
	const foreign pool.Stream = 0x900
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	f.MakeForeign(foreign)
	a := h.mustAlloc(miB)
	if err := h.freeAsyncForeign(a, foreign); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		h.mustAlloc(miB) // misses: the harness fails the test if a comes back
	}
	if n := f.Counts().StreamQueries; n != 0 {
		t.Fatalf("%d stream queries for misses while the stream's marker was pending", n)
	}
	f.Complete(foreign)
	found := false
	for range 8 {
		found = found || h.mustAlloc(miB) == a
	}
	if !found {
		t.Fatalf("block freed on the foreign stream not reused once its marker completed")
	}
	if n := f.Counts().StreamQueries; n != 0 {
		t.Fatalf("%d stream queries where a marker served", n)
	}
	h.close()
}

// TestForgetForeignStreamWaitsForItsMarker: a foreign stream destroyed
// with blocks freed on it (its work still runs) keeps them until a marker
// recorded before the destruction completes, not until the device's next
// synchronization; a new stream given the same handle meanwhile gets a
// cache of its own.
func TestForgetForeignStreamWaitsForItsMarker(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	const foreign pool.Stream = 0x900
	f.MakeForeign(foreign)
	a := h.mustAlloc(64 * kiB)
	if err := h.freeAsyncForeign(a, foreign); err != nil {
		t.Fatal(err)
	}
	h.p.ForgetStream(foreign)
	h.appSync()
	for range 40 {
		h.mustAlloc(64 * kiB) // the harness fails the test if a comes back
	}
	b := h.mustAlloc(64 * kiB)
	if err := h.freeAsyncForeign(b, foreign); err != nil { // the handle, reused
		t.Fatal(err)
	}
	f.Complete(foreign)
	h.appSync()
	found := false
	for range 200 {
		if h.mustAlloc(64*kiB) == a {
			found = true
			break
		}
	}
	if !found {
		t.Fatalf("block of a destroyed foreign stream not reused once its marker completed")
	}
	h.close()
}

// TestForgetFinishedContextFreesItsBlocks: once the context of foreign
// streams is gone (destroyed, or its device reset), what was freed on them
// is free at once: on a stream of it, covered by its marker or not, and on
// a stream of it already forgotten, whose blocks wait on a marker. Those
// markers went with the context: the pool neither queries nor destroys
// them (the fake fails the query and panics at the destruction). A stream
// of another context keeps its block and its marker.
func TestForgetFinishedContextFreesItsBlocks(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(8*miB))
	const ended, forgotten, other pool.Stream = 0x900, 0x901, 0x902
	for _, s := range []pool.Stream{ended, forgotten, other} {
		f.MakeForeign(s)
	}
	a, b, c, d := h.mustAlloc(2*miB), h.mustAlloc(2*miB), h.mustAlloc(2*miB), h.mustAlloc(2*miB)
	for _, free := range []struct {
		ptr uint64
		s   pool.Stream
	}{{a, ended}, {b, ended}, {c, forgotten}, {d, other}} {
		if err := h.freeAsyncForeign(free.ptr, free.s); err != nil {
			t.Fatal(err)
		}
	}
	h.forgetStream(forgotten)
	f.EndContext(ended, forgotten)
	h.p.ForgetFinishedContext(func(s pool.Stream) bool { return s == ended }, f.Lost)
	if st := h.p.Stats(); st.PendingBytes != 2*miB {
		t.Fatalf("%d bytes wait, want the 2 MiB freed on the other context's stream", st.PendingBytes)
	}
	if n := f.LiveMarkers(); n != 1 {
		t.Fatalf("%d markers live, want the other context's", n)
	}
	h.mustAlloc(6 * miB) // the quota, less the block still waiting
	h.p.TrimTo(0)        // queries the markers left
	if st := h.p.Stats(); st.BackingErrors != 0 {
		t.Fatalf("%d backing errors: a marker of the ended context queried?", st.BackingErrors)
	}
	h.close()
}

// TestForgetFinishedContextKeepsDestroyedStreamOfAnother: a stream
// destroyed while its work runs leaves its block waiting on its marker; its
// handle may then name a stream of another context. That context ending
// ends none of the destroyed stream's work: the block still waits, and
// comes back once the marker completes.
func TestForgetFinishedContextKeepsDestroyedStreamOfAnother(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(8*miB))
	const reused pool.Stream = 0x900
	f.MakeForeign(reused)
	if err := h.freeAsyncForeign(h.mustAlloc(2*miB), reused); err != nil {
		t.Fatal(err)
	}
	h.forgetStream(reused)
	h.p.ForgetFinishedContext(func(s pool.Stream) bool { return s == reused }, func(pool.Marker) bool { return false })
	if st := h.p.Stats(); st.PendingBytes != 2*miB {
		t.Fatalf("%d bytes wait after another context using the handle ended, want the destroyed stream's 2 MiB", st.PendingBytes)
	}
	f.Complete(reused)
	h.mustAlloc(8 * miB) // the quota: the block came back once its marker completed
	h.close()
}

func TestReleaseUnderQuotaPressure(t *testing.T) {
	f := pooltest.New(0)
	opt := pool.DefaultOptions(8 * miB)
	opt.ReleaseThreshold = 8 * miB // never by threshold: only the quota releases
	h := newHarness(t, f, opt)
	var ptrs []uint64
	for range 8 { // 8 × 1 MiB in four 2 MiB small segments
		ptrs = append(ptrs, h.mustAlloc(miB))
	}
	for _, p := range ptrs {
		h.mustFree(p)
	}
	// 6 MiB is medium: its 20 MiB segment cannot fit, the small segments
	// must be released and an exact segment reserved.
	h.mustAlloc(6 * miB)
	st := h.p.Stats()
	if st.SegmentsReleased < 3 || st.ReservedBytes > opt.Quota {
		t.Fatalf("after pressure: %d segments released, %d reserved", st.SegmentsReleased, st.ReservedBytes)
	}
	h.close()
}

// TestRefusalOnlyWhenTheQuotaIsFull churns near the quota; the harness fails
// the test if a request is refused while the pool could still reserve it
// exactly or holds a free block that fits.
func TestRefusalOnlyWhenTheQuotaIsFull(t *testing.T) {
	f := pooltest.New(0)
	opt := pool.DefaultOptions(256 * miB)
	h := newHarness(t, f, opt)
	rng := rand.New(rand.NewPCG(3, 4))
	var ptrs []uint64
	refused := 0
	for range 5000 {
		if len(ptrs) > 0 && (rng.IntN(2) == 0 || h.p.Stats().LiveBytes > opt.Quota*3/4) {
			i := rng.IntN(len(ptrs))
			if rng.IntN(2) == 0 {
				h.mustFree(ptrs[i])
			} else if err := h.freeAsync(ptrs[i], pool.Stream(1+rng.IntN(3))); err != nil {
				t.Fatal(err)
			}
			ptrs[i] = ptrs[len(ptrs)-1]
			ptrs = ptrs[:len(ptrs)-1]
			continue
		}
		p, err := h.allocAsync(uint64(1+rng.IntN(6*miB)), pool.Stream(1+rng.IntN(3)))
		if err != nil {
			refused++
			continue
		}
		ptrs = append(ptrs, p)
	}
	t.Logf("%d of 5000 operations refused", refused)
	h.close()
}

func TestRefusalWrapsQuotaAndOutOfMemory(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(16*miB))
	h.mustAlloc(12 * miB)
	_, err := h.alloc(8 * miB)
	if !errors.Is(err, pool.ErrQuota) || !errors.Is(err, pool.ErrOutOfMemory) {
		t.Fatalf("refusal error %v does not wrap ErrQuota and ErrOutOfMemory", err)
	}
	if st := h.p.Stats(); st.Refused != 1 {
		t.Fatalf("%d refusals counted, want 1", st.Refused)
	}
	h.close()
}

func TestDeviceOutOfMemoryReleasesCacheAndRetries(t *testing.T) {
	f := pooltest.New(24 * miB) // the device is smaller than the quota
	h := newHarness(t, f, pool.DefaultOptions(giB))
	a := h.mustAlloc(12 * miB) // huge: a 12 MiB segment
	h.mustFree(a)
	h.appSync()
	if _, err := h.alloc(20 * miB); err != nil {
		t.Fatalf("20 MiB after releasing the cached 12 MiB: %v", err)
	}
	h.close()
}

func TestReserveMode(t *testing.T) {
	f := pooltest.New(0)
	opt := pool.DefaultOptions(giB)
	opt.Reserve = 64 * miB
	opt.ReleaseThreshold = 0
	h := newHarness(t, f, opt)
	if f.Counts().Reserves != 0 {
		t.Fatal("reserved before the first allocation")
	}
	var ptrs []uint64
	for _, size := range []uint64{512, 100 * kiB, 3 * miB, 12 * miB, 8 * miB, 1} {
		ptrs = append(ptrs, h.mustAlloc(size))
	}
	if n := f.Counts().Reserves; n != 1 {
		t.Fatalf("%d reservations, want the single reserve segment", n)
	}
	for _, p := range ptrs {
		h.mustFree(p)
	}
	h.appSync()
	st := h.p.Stats()
	if st.ReservedBytes != 64*miB || st.SegmentsReleased != 0 {
		t.Fatalf("reserve segment released with threshold 0: %+v", st)
	}
	h.close()
}

func TestReserveLargerThanQuotaIsRejected(t *testing.T) {
	opt := pool.DefaultOptions(miB)
	opt.Reserve = 2 * miB
	if _, err := pool.New(pooltest.New(0), opt); err == nil {
		t.Fatal("reserve above the quota accepted")
	}
}

func TestStrictModeSynchronizesEveryFree(t *testing.T) {
	f := pooltest.New(0)
	opt := pool.DefaultOptions(giB)
	opt.StrictFree = true
	h := newHarness(t, f, opt)
	for i := range 10 {
		a := h.mustAlloc(8 * kiB)
		h.mustFree(a)
		if n := f.Counts().Syncs; n != i+1 {
			t.Fatalf("after %d frees: %d synchronizations", i+1, n)
		}
		if st := h.p.Stats(); st.PendingBytes != 0 {
			t.Fatalf("strict free left %d bytes pending", st.PendingBytes)
		}
	}
	h.close()
}

func TestPassThrough(t *testing.T) {
	f := pooltest.New(0)
	opt := pool.DefaultOptions(10 * miB)
	opt.Pooling = false
	h := newHarness(t, f, opt)
	a := h.mustAlloc(3 * miB)
	b, err := h.allocAsync(3*miB, 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.alloc(5 * miB); !errors.Is(err, pool.ErrQuota) {
		t.Fatalf("pass-through beyond the quota: %v, want ErrQuota", err)
	}
	h.mustFree(a)
	if err := h.freeAsync(b, 5); err != nil {
		t.Fatal(err)
	}
	c := f.Counts()
	if c.Reserves != 2 || c.Releases != 2 || c.AsyncReserves != 1 || c.AsyncReleases != 1 || c.Syncs != 0 {
		t.Fatalf("backing calls %+v, want one reservation and release per allocation, async ones stream-ordered", c)
	}
	if st := h.p.Stats(); st.PassThrough != 2 || st.ReservedBytes != 0 || st.CacheHits != 0 {
		t.Fatalf("stats %+v", st)
	}
	h.close()
}

func TestStats(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	a := h.mustAlloc(100 * kiB)
	b := h.mustAlloc(100 * kiB)
	h.mustFree(a)
	h.mustFree(b)
	h.appSync()
	h.mustAlloc(50 * kiB)
	st := h.p.Stats()
	const seg = 20 * 100 * kiB // the 2 MiB small segment, cut to whole blocks of its first request
	want := pool.Stats{
		LiveBytes: 50 * kiB, PeakLiveBytes: 200 * kiB, LiveBlocks: 1,
		ReservedBytes: seg, PeakReservedBytes: seg, Quota: giB,
		HighLiveBytes: 200 * kiB, HighReservedBytes: seg,
		CachedBytes: seg - 50*kiB, LargestFreeBlock: seg - 50*kiB, Segments: 1,
		CacheHits: 2, DeviceReservations: 1, Frees: 2, ExternalSyncs: 1,
	}
	if st != want {
		t.Fatalf("stats\n got %+v\nwant %+v", st, want)
	}
	h.close()
}

func TestBadFrees(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	a := h.mustAlloc(4 * kiB)
	h.mustAlloc(4 * kiB)
	if err := h.p.Free(0); err != nil {
		t.Fatalf("Free(0) = %v, want nil", err)
	}
	if p, err := h.p.Alloc(0); p != 0 || err != nil {
		t.Fatalf("Alloc(0) = %#x, %v; want 0, nil", p, err)
	}
	if err := h.p.Free(a + pool.Alignment); !errors.Is(err, pool.ErrInvalidFree) {
		t.Fatalf("interior free: %v, want ErrInvalidFree", err)
	}
	h.mustFree(a)
	before := h.p.Stats()
	if err := h.p.Free(a); !errors.Is(err, pool.ErrInvalidFree) {
		t.Fatalf("double free: %v, want ErrInvalidFree", err)
	}
	if err := h.p.FreeAsync(a, 3); !errors.Is(err, pool.ErrInvalidFree) {
		t.Fatalf("double async free: %v, want ErrInvalidFree", err)
	}
	if after := h.p.Stats(); after != before {
		t.Fatalf("a double free changed the stats:\n%+v\n%+v", before, after)
	}
	if err := h.p.Free(0x1000); !errors.Is(err, pool.ErrNotOwned) {
		t.Fatalf("foreign pointer: %v, want ErrNotOwned", err)
	}
	if _, err := h.p.Alloc(pool.MaxRequest + 1); !errors.Is(err, pool.ErrTooLarge) {
		t.Fatalf("oversized request: %v, want ErrTooLarge", err)
	}
	h.close()
	if _, err := h.p.Alloc(1); !errors.Is(err, pool.ErrClosed) {
		t.Fatalf("Alloc after Close: %v, want ErrClosed", err)
	}
}

func TestInvalidOptions(t *testing.T) {
	for name, mutate := range map[string]func(*pool.Options){
		"zero quota":              func(o *pool.Options) { o.Quota = 0 },
		"reserve without pooling": func(o *pool.Options) { o.Reserve = miB; o.Pooling = false },
		"bad spill tier":          func(o *pool.Options) { o.Oversubscribe = true; o.SpillTier = pool.TierDevice },
		"zero host limit":         func(o *pool.Options) { o.Oversubscribe = true; o.HostLimit = 0 },
	} {
		opt := pool.DefaultOptions(giB)
		mutate(&opt)
		if _, err := pool.New(pooltest.New(0), opt); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestReleaseThreshold(t *testing.T) {
	f := pooltest.New(0)
	opt := pool.DefaultOptions(giB)
	opt.ReleaseThreshold = 4 * miB
	h := newHarness(t, f, opt)
	var ptrs []uint64
	for range 5 {
		ptrs = append(ptrs, h.mustAlloc(20*miB)) // five dedicated 20 MiB segments
	}
	for _, p := range ptrs {
		h.mustFree(p)
	}
	h.appSync()
	st := h.p.Stats()
	if st.CachedBytes > opt.ReleaseThreshold || st.SegmentsReleased != 5 {
		t.Fatalf("after freeing 100 MiB with a 4 MiB threshold: %d cached, %d segments released", st.CachedBytes, st.SegmentsReleased)
	}
	h.close()
}

func TestHugeBlocksAreNotCarvedForSmallerHugeRequests(t *testing.T) {
	f := pooltest.New(0)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	a := h.mustAlloc(100 * miB)
	h.mustFree(a)
	h.appSync()
	b := h.mustAlloc(20 * miB)
	if b == a {
		t.Fatal("a cached 100 MiB block was handed out for 20 MiB")
	}
	if c := h.mustAlloc(95 * miB); c != a {
		t.Fatalf("95 MiB did not reuse the cached 100 MiB block (slack 5 MiB)")
	}
	h.close()
}

type recorder struct {
	allocs, frees, syncs, spills, promotes, refusals int
	sources                                          map[pool.Source]int
	reusable                                         uint64
}

func (r *recorder) Alloc(ptr, size uint64, tier pool.Tier, src pool.Source) {
	r.allocs++
	r.sources[src]++
}
func (r *recorder) Free(ptr, size uint64, tier pool.Tier) { r.frees++ }
func (r *recorder) Sync(made uint64)                      { r.syncs++; r.reusable += made }
func (r *recorder) Spill(ptr, size uint64, tier pool.Tier) {
	r.spills++
}
func (r *recorder) Promote(ptr, size uint64, tier pool.Tier) { r.promotes++ }
func (r *recorder) Refuse(size, used, quota uint64)          { r.refusals++ }

func TestObserverSeesEveryEvent(t *testing.T) {
	f := pooltest.New(0)
	rec := &recorder{sources: map[pool.Source]int{}}
	opt := pool.DefaultOptions(4 * miB)
	opt.Observer = rec
	h := newHarness(t, f, opt)
	a := h.mustAlloc(kiB)
	h.mustFree(a)
	h.mustAlloc(kiB) // synchronizes, then a cache hit
	h.alloc(8 * miB) // refused
	if rec.allocs != 2 || rec.sources[pool.SourceDevice] != 1 || rec.sources[pool.SourceCache] != 1 ||
		rec.frees != 1 || rec.syncs != 1 || rec.reusable != kiB || rec.refusals != 1 {
		t.Fatalf("observer saw %+v", rec)
	}
	h.close()
}

func TestDeviceFullIsNotAQuotaRefusal(t *testing.T) {
	f := pooltest.New(8 * miB)
	h := newHarness(t, f, pool.DefaultOptions(giB))
	h.mustAlloc(6 * miB)
	_, err := h.alloc(4 * miB)
	if !errors.Is(err, pool.ErrOutOfMemory) || errors.Is(err, pool.ErrQuota) {
		t.Fatalf("device out of memory below the quota: %v, want ErrOutOfMemory without ErrQuota", err)
	}
	if st := h.p.Stats(); st.BackingErrors != 0 || st.Refused != 1 {
		t.Fatalf("device out of memory: %d backing errors, %d refusals; want a refusal, no backing error", st.BackingErrors, st.Refused)
	}
	h.close()
}

func TestSameCallsGiveSameAddresses(t *testing.T) {
	// Blocks freed on several streams are reclaimed stream by stream; the
	// order must not depend on anything but the calls, or figures measured
	// on traces and failures found by fuzzing would not repeat.
	run := func() []uint64 {
		f := pooltest.New(0)
		p, err := pool.New(f, pool.DefaultOptions(64*giB))
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(3, 4))
		type alloc struct {
			ptr uint64
			s   pool.Stream
		}
		var live []alloc
		var got []uint64
		for i := range 4000 {
			if i%50 == 0 {
				for s := range pool.Stream(8) {
					f.Complete(s + 1)
				}
			}
			if len(live) > 0 && rng.IntN(2) == 0 {
				j := rng.IntN(len(live))
				if err := p.FreeAsync(live[j].ptr, live[j].s); err != nil {
					t.Fatal(err)
				}
				live[j] = live[len(live)-1]
				live = live[:len(live)-1]
				continue
			}
			s := pool.Stream(1 + rng.IntN(8))
			ptr, err := p.AllocAsync(uint64(1+rng.IntN(4*miB)), s)
			if err != nil {
				t.Fatal(err)
			}
			live = append(live, alloc{ptr, s})
			got = append(got, ptr)
		}
		return got
	}
	first := run()
	for range 5 {
		if again := run(); !slices.Equal(again, first) {
			t.Fatal("the same calls on the same device gave different addresses")
		}
	}
}

// While the caller or the stream captures a CUDA graph, the Backing refuses
// to synchronize or record markers: the pool tries each once, then grows or
// refuses as if nothing were pending, and no error of the capture reaches
// the caller.
func TestStreamCaptureGrowsOrRefusesInstead(t *testing.T) {
	f := pooltest.New(0)
	var syncs, markers int
	f.FailSynchronize = func() error { syncs++; return pool.ErrStreamCapture }
	f.FailRecordMarker = func(pool.Stream) error { markers++; return pool.ErrStreamCapture }
	opt := pool.DefaultOptions(8 * miB)
	opt.ReleaseThreshold = 8 * miB
	h := newHarness(t, f, opt)
	a := h.mustAlloc(4 * miB)
	h.mustFree(a)
	b := h.mustAlloc(4 * miB) // the pending block could serve it: grows instead
	if syncs != 1 || b == a {
		t.Fatalf("%d synchronizations tried, got %#x (freed %#x)", syncs, b, a)
	}
	if _, err := h.alloc(4 * miB); !errors.Is(err, pool.ErrQuota) || errors.Is(err, pool.ErrStreamCapture) {
		t.Fatalf("at the quota under capture: %v, want a quota refusal", err)
	}
	if syncs != 2 {
		t.Fatalf("%d synchronizations tried, want one per point", syncs)
	}
	if err := h.freeAsync(b, 5); err != nil {
		t.Fatalf("FreeAsync under capture: %v", err)
	}
	if markers != 1 {
		t.Fatalf("%d markers tried, want 1", markers)
	}
	st := h.p.Stats()
	if st.BackingErrors != 0 || st.CaptureSkips != 3 || !strings.Contains(st.String(), " capture_skips=3") {
		t.Fatalf("capture counted as a failure or not at all: %v", st)
	}
	f.FailSynchronize, f.FailRecordMarker = nil, nil
	h.appSync()
	h.mustAlloc(4 * miB) // the freed blocks, now reusable
	h.mustAlloc(4 * miB)
	h.close()
}

func TestStrictFreeUnderCaptureSucceeds(t *testing.T) {
	f := pooltest.New(0)
	f.FailSynchronize = func() error { return pool.ErrStreamCapture }
	opt := pool.DefaultOptions(8 * miB)
	opt.StrictFree = true
	h := newHarness(t, f, opt)
	h.mustFree(h.mustAlloc(miB))
	if st := h.p.Stats(); st.PendingBytes != miB {
		t.Fatalf("the block should wait for a later synchronization: %v", st)
	}
	f.FailSynchronize = nil
	h.close()
}

// A segment the Backing fails to release is counted, told to a
// FailureObserver and kept, never dropped silently.
func TestFailedSegmentReleaseIsCountedAndTold(t *testing.T) {
	f := pooltest.New(0)
	obs := &failures{recorder: recorder{sources: map[pool.Source]int{}}}
	opt := pool.DefaultOptions(64 * miB)
	opt.ReleaseThreshold = 0
	opt.Observer = obs
	h := newHarness(t, f, opt)
	broken := errors.New("cudaFree failed")
	f.FailRelease = func(uint64, uint64) error { return broken }
	h.mustFree(h.mustAlloc(miB))
	h.appSync() // the empty segment passes the threshold
	st := h.p.Stats()
	if st.ReleaseErrors != 1 || st.Segments != 1 || len(obs.errs) != 1 || !errors.Is(obs.errs[0], broken) {
		t.Fatalf("stats %v, observer told %v", st, obs.errs)
	}
	f.FailRelease = nil
	h.close()
}

// A stream identity used once (a thread's per-thread default stream, a
// stream created and destroyed) leaves nothing behind, whether it is
// forgotten or its blocks simply drain: 20,000 of them keep the Go heap
// flat.
func TestStreamsSeenOnceLeaveNothing(t *testing.T) {
	for _, forget := range []bool{true, false} {
		t.Run(fmt.Sprintf("forget=%v", forget), func(t *testing.T) {
			f := pooltest.New(0)
			p, err := pool.New(f, pool.DefaultOptions(giB))
			if err != nil {
				t.Fatal(err)
			}
			heap := func() uint64 {
				var m runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&m)
				return m.HeapAlloc
			}
			use := func(s pool.Stream) {
				ptr, err := p.AllocAsync(4*kiB, s)
				if err != nil {
					t.Fatal(err)
				}
				if err := p.FreeAsync(ptr, s); err != nil {
					t.Fatal(err)
				}
				f.Complete(s)
				if forget {
					p.ForgetStream(s)
				}
				f.DestroyStream(s)
			}
			for s := range pool.Stream(100) { // warm up: slabs, maps, segments
				use(1 + s)
			}
			before := heap()
			const streams, bound = 20000, 256 * kiB
			for s := range pool.Stream(streams) {
				use(1000 + s)
				if s%100 == 99 { // the application synchronizes now and then
					ticket := p.SyncBegin()
					_ = f.Synchronize()
					if err := p.SyncEnd(ticket); err != nil {
						t.Fatal(err)
					}
				}
				if s%1000 == 999 {
					if grown := int64(heap()) - int64(before); grown > bound {
						t.Fatalf("after %d streams the heap grew by %d bytes", s+1, grown)
					}
				}
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
