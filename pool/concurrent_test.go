package pool_test

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

// TestConcurrentUse runs many goroutines allocating and freeing through every
// entry point; a shared map of granules catches two live blocks sharing
// memory. Run it with -race.
func TestConcurrentUse(t *testing.T) {
	const workers, ops = 16, 2000
	fake := pooltest.New(0)
	// A quota the workers' peak exceeds, so spills and promotions run
	// concurrently with everything else.
	opt := pool.DefaultOptions(24 * miB)
	opt.Oversubscribe = true
	opt.HostLimit = giB
	p, err := pool.New(fake, opt)
	if err != nil {
		t.Fatal(err)
	}
	var (
		ownerMu sync.Mutex
		owner   = make(map[uint64]int) // granule address -> worker
	)
	claim := func(w int, ptr, size uint64, take bool) {
		ownerMu.Lock()
		defer ownerMu.Unlock()
		for g := ptr; g < ptr+size; g += pool.Alignment {
			if take {
				if o, busy := owner[g]; busy {
					t.Errorf("worker %d got %#x, still owned by worker %d", w, g, o)
					return
				}
				owner[g] = w
			} else {
				delete(owner, g)
			}
		}
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			stream := pool.Stream(w % 4)
			type alloc struct{ ptr, size uint64 }
			var mine []alloc
			for range ops {
				switch r := rng.IntN(10); {
				case r < 5 || len(mine) == 0:
					size := uint64(1 + rng.IntN(64*kiB))
					var ptr uint64
					var err error
					if r%2 == 0 {
						ptr, err = p.Alloc(size)
					} else {
						ptr, err = p.AllocAsync(size, stream)
					}
					if err != nil {
						t.Errorf("worker %d: allocation of %d: %v", w, size, err)
						return
					}
					size = alignUp(size)
					claim(w, ptr, size, true)
					mine = append(mine, alloc{ptr, size})
				case r < 9:
					i := rng.IntN(len(mine))
					a := mine[i]
					mine[i] = mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					claim(w, a.ptr, a.size, false)
					var err error
					if r%2 == 0 {
						err = p.Free(a.ptr)
					} else {
						err = p.FreeAsync(a.ptr, stream)
					}
					if err != nil {
						t.Errorf("worker %d: free of %#x: %v", w, a.ptr, err)
						return
					}
				default:
					ticket := p.SyncBegin()
					_ = fake.Synchronize()
					if err := p.SyncEnd(ticket); err != nil {
						t.Errorf("worker %d: SyncEnd: %v", w, err)
					}
					fake.Complete(stream)
					_ = p.Stats()
				}
			}
			for _, a := range mine {
				claim(w, a.ptr, a.size, false)
				if err := p.Free(a.ptr); err != nil {
					t.Errorf("worker %d: final free of %#x: %v", w, a.ptr, err)
				}
			}
		}()
	}
	wg.Wait()
	if st := p.Stats(); st.LiveBytes != 0 || st.LiveBlocks != 0 || st.ReservedBytes != fake.DeviceBytes() {
		t.Fatalf("after every free: %+v, device holds %d", st, fake.DeviceBytes())
	}
	t.Logf("%v", p.Stats())
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if fake.DeviceBytes() != 0 || fake.LiveMarkers() != 0 {
		t.Fatalf("after Close: %d device bytes, %d markers", fake.DeviceBytes(), fake.LiveMarkers())
	}
}

// returnsWhile runs call while a Backing call is held in flight and fails
// the test if it does not return: it would be waiting for the pool's lock,
// held across that Backing call.
func returnsWhile(t *testing.T, what string, call func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		call()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return while a Backing call was in flight: the pool's lock is held across it", what)
	}
}

// heldSyncs is a pool holding one 2 MiB block that waits for a
// synchronization, over a Backing that holds every synchronization until
// letGo, counting how many run at once.
type heldSyncs struct {
	f              *pooltest.Fake
	p              *pool.Pool
	entered        chan struct{}
	letGo          func()
	wg             sync.WaitGroup
	inFlight, most atomic.Int32
}

func newHeldSyncs(t *testing.T) *heldSyncs {
	h := &heldSyncs{f: pooltest.New(0), entered: make(chan struct{}, 4)}
	release := make(chan struct{})
	var releaseOnce sync.Once
	h.letGo = func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(h.letGo) // a failed test lets the held call return
	h.f.FailSynchronize = func() error {
		n := h.inFlight.Add(1)
		for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
		}
		h.entered <- struct{}{}
		<-release
		h.inFlight.Add(-1)
		return nil
	}
	var err error
	if h.p, err = pool.New(h.f, pool.DefaultOptions(64*miB)); err != nil {
		t.Fatal(err)
	}
	a, _ := h.p.Alloc(2 * miB) // a segment of its own
	if err := h.p.Free(a); err != nil {
		t.Fatal(err)
	}
	return h
}

// alloc allocates size bytes in a goroutine of its own.
func (h *heldSyncs) alloc(t *testing.T, size uint64) {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		if _, err := h.p.Alloc(size); err != nil {
			t.Errorf("Alloc(%d): %v", size, err)
		}
	}()
}

// awaitSync returns once a synchronization is held in the Backing.
func (h *heldSyncs) awaitSync(t *testing.T) {
	t.Helper()
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second): // a hang, not a speed goal
		t.Fatal("an allocation the pending block could serve started no synchronization")
	}
}

// finish lets the synchronizations go and waits for the allocations.
func (h *heldSyncs) finish() {
	h.letGo()
	h.wg.Wait()
}

// A forced synchronization runs with the pool's lock released, and only one
// runs at a time: a caller whose frees it covers waits for it, one whose
// frees came later starts the next once it ends.
func TestForcedSynchronizationReleasesTheLock(t *testing.T) {
	h := newHeldSyncs(t)
	p := h.p
	h.alloc(t, 2*miB) // the pending block could serve it: synchronizes
	h.awaitSync(t)
	returnsWhile(t, "Stats, Alloc, Free and FreeAsync", func() {
		_ = p.Stats()
		b, err := p.Alloc(kiB) // nothing of its class pending: grows
		if err != nil {
			t.Errorf("Alloc: %v", err)
		}
		c, _ := p.Alloc(kiB)
		if err := p.Free(b); err != nil {
			t.Errorf("Free: %v", err)
		}
		if err := p.FreeAsync(c, 1); err != nil {
			t.Errorf("FreeAsync: %v", err)
		}
		// Freed after the synchronization began, which cannot cover it.
		e, _ := p.Alloc(4 * miB)
		if err := p.Free(e); err != nil {
			t.Errorf("Free: %v", err)
		}
	})
	// Needs e: waits for the synchronization in flight, then starts the next.
	h.alloc(t, 4*miB)
	time.Sleep(20 * time.Millisecond)
	h.finish()
	if n, c := h.most.Load(), h.f.Counts().Syncs; n != 1 || c != 2 {
		t.Fatalf("%d synchronizations at once, %d in all; want 1 and 2", n, c)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// A caller whose frees the synchronization in flight covers waits for it
// and starts none of its own.
func TestCoveredCallerStartsNoSynchronization(t *testing.T) {
	h := newHeldSyncs(t)
	h.alloc(t, 2*miB) // the pending block could serve it: synchronizes
	h.awaitSync(t)
	h.alloc(t, 2*miB) // so could it serve this one, which the synchronization in flight covers
	time.Sleep(20 * time.Millisecond)
	h.finish()
	if n := h.f.Counts().Syncs; n != 1 {
		t.Fatalf("%d synchronizations, want 1", n)
	}
	if err := h.p.Close(); err != nil {
		t.Fatal(err)
	}
}

// heldPromotions is a pool with an 8 MiB quota, oversubscribed and without
// pooling, whose device is full: an 8 MiB block was freed after blocks of
// the given sizes spilled, so the next synchronization promotes them. Its
// first promotion after startSync waits until letGo; a promotion before
// startSync (inside a free) or one that begins while another is in flight
// fails the test, as a pool runs one promotion pass at a time, at
// synchronizations only.
type heldPromotions struct {
	f             *pooltest.Fake
	p             *pool.Pool
	spilled       []uint64
	entered       chan struct{}
	letGo         func()
	synced        chan error // SyncEnd's result
	armed, moving atomic.Bool
	promotions    atomic.Int32
}

func newHeldPromotions(t *testing.T, spills ...uint64) *heldPromotions {
	h := &heldPromotions{f: pooltest.New(0), entered: make(chan struct{}, 1), synced: make(chan error, 1)}
	release := make(chan struct{})
	var releaseOnce sync.Once
	h.letGo = func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(h.letGo) // a failed test lets the held call return
	h.f.FailPromote = func(uint64, uint64) error {
		switch {
		case !h.armed.Load():
			t.Error("a promotion ran before the synchronization")
		case h.promotions.Add(1) > 1:
			if h.moving.Load() {
				t.Error("a second promotion began while one was in flight")
			}
		default:
			h.moving.Store(true)
			h.entered <- struct{}{}
			<-release
			h.moving.Store(false)
		}
		return nil
	}
	opt := pool.DefaultOptions(8 * miB)
	opt.Oversubscribe = true
	opt.Pooling = false
	var err error
	if h.p, err = pool.New(h.f, opt); err != nil {
		t.Fatal(err)
	}
	dev, err := h.p.Alloc(8 * miB)
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range spills {
		ptr, err := h.p.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		h.spilled = append(h.spilled, ptr)
	}
	if err := h.p.Free(dev); err != nil {
		t.Fatal(err)
	}
	return h
}

// startSync announces a synchronization in a goroutine of its own and
// returns once its first promotion is held.
func (h *heldPromotions) startSync(t *testing.T) {
	t.Helper()
	h.armed.Store(true)
	go func() { h.synced <- h.p.SyncEnd(h.p.SyncBegin()) }()
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second): // a hang, not a speed goal
		t.Fatal("no promotion at SyncEnd")
	}
}

// A promotion runs with the pool's lock released: frees and allocations go
// on meanwhile, and a block freed during its own move is released when the
// move returns, leaving the accounting equal to what the device holds.
func TestPromotionReleasesTheLock(t *testing.T) {
	h := newHeldPromotions(t, 4*miB)
	h.startSync(t)
	returnsWhile(t, "Free of the moving block, Alloc and Stats", func() {
		if err := h.p.Free(h.spilled[0]); err != nil {
			t.Errorf("Free of the block being promoted: %v", err)
		}
		if _, err := h.p.Alloc(2 * miB); err != nil {
			t.Errorf("Alloc: %v", err)
		}
		if st := h.p.Stats(); st.ReservedBytes > st.Quota {
			t.Errorf("%d bytes reserved during the move, above the quota", st.ReservedBytes)
		}
	})
	h.letGo()
	if err := <-h.synced; err != nil {
		t.Fatal(err)
	}
	st := h.p.Stats()
	if st.ReservedBytes != h.f.DeviceBytes() || st.ReservedBytes != 2*miB || st.SpilledBytes != h.f.HostBytes() || st.PromotedBytes != 0 || st.LiveBytes != 2*miB {
		t.Fatalf("after the move: %v; device holds %d, host %d", st, h.f.DeviceBytes(), h.f.HostBytes())
	}
	if err := h.p.Close(); err != nil {
		t.Fatal(err)
	}
	if h.f.DeviceBytes() != 0 || h.f.HostBytes() != 0 {
		t.Fatalf("after Close: %d device bytes, %d host bytes", h.f.DeviceBytes(), h.f.HostBytes())
	}
}

// Close waits for a promotion in flight before it releases anything: the
// block being moved is released only once its move has returned, never
// under it.
func TestCloseWaitsForThePromotionInFlight(t *testing.T) {
	h := newHeldPromotions(t, 4*miB)
	h.f.FailReleaseHost = func(base, size uint64) error {
		if h.moving.Load() {
			t.Errorf("host block %#x released while its promotion was in flight", base)
		}
		return nil
	}
	h.startSync(t)
	closed := make(chan error, 1)
	go func() { closed <- h.p.Close() }()
	// Close has begun once calls fail with ErrClosed; it then waits for
	// the move, with the lock released.
	returnsWhile(t, "waiting for Close to begin", func() {
		for {
			ptr, err := h.p.Alloc(pool.Alignment)
			if errors.Is(err, pool.ErrClosed) {
				return
			}
			if err == nil {
				_ = h.p.Free(ptr)
			}
		}
	})
	h.letGo()
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-h.synced; err != nil && !errors.Is(err, pool.ErrClosed) {
		t.Fatalf("SyncEnd: %v", err)
	}
	if h.f.DeviceBytes() != 0 || h.f.HostBytes() != 0 {
		t.Fatalf("after Close: %d device bytes, %d host bytes", h.f.DeviceBytes(), h.f.HostBytes())
	}
}

// A synchronization announced while a promotion pass runs in another thread
// leaves the promotions to that pass: it starts none of its own, so one
// pass at most moves blocks, and Close, which waits for it, waits for all.
func TestOnePromotionPassAtATime(t *testing.T) {
	h := newHeldPromotions(t, 2*miB, 2*miB) // both fit once the device's block is freed
	h.startSync(t)
	returnsWhile(t, "a second SyncEnd", func() {
		if err := h.p.SyncEnd(h.p.SyncBegin()); err != nil {
			t.Errorf("SyncEnd: %v", err)
		}
	})
	h.letGo()
	if err := <-h.synced; err != nil {
		t.Fatal(err)
	}
	if st := h.p.Stats(); st.PromotedBytes != 4*miB || st.SpilledBytes != 0 {
		t.Fatalf("after the pass: %v; want both blocks promoted", st)
	}
	if err := h.p.Close(); err != nil {
		t.Fatal(err)
	}
}
