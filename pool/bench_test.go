package pool_test

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
	"github.com/spillway-gpu/spillway/tests/traces"
)

var liveCounts = []int{1000, 10000, 100000}

// randomSize is log-uniform between 512 bytes and 1 MiB, the range of most
// per-tensor requests an uncached framework makes.
func randomSize(rng *rand.Rand) uint64 {
	return uint64(512<<rng.IntN(12)) + uint64(rng.IntN(512<<rng.IntN(12)))
}

func benchPool(b *testing.B) (*pool.Pool, *pooltest.Fake) {
	f := pooltest.New(0)
	p, err := pool.New(f, pool.DefaultOptions(1<<40))
	if err != nil {
		b.Fatal(err)
	}
	return p, f
}

// BenchmarkPair measures one allocation and one free (the pair a framework
// makes per tensor) over a pool holding a given number of live blocks, with
// as many free holes between them. Each iteration allocates a block and frees
// the one allocated pairWindow iterations before, as tensors mostly die young.
// "sync" uses Alloc/Free (cudaFree semantics, synchronizing in batches),
// "stream" AllocAsync/FreeAsync on one stream.
func BenchmarkPair(b *testing.B) {
	for _, sizes := range []string{"fixed", "random"} {
		for _, mode := range []string{"sync", "stream"} {
			for _, live := range liveCounts {
				b.Run(fmt.Sprintf("%s/%s/live=%d", sizes, mode, live), func(b *testing.B) {
					benchPair(b, benchPool, sizes == "random", mode == "stream", live, false)
				})
			}
		}
	}
}

// BenchmarkPairRandomVictim is BenchmarkPair freeing a random live block each
// time instead of a young one: the worst case for the processor's caches, as
// every free touches a cold descriptor among all the live ones.
func BenchmarkPairRandomVictim(b *testing.B) {
	for _, live := range liveCounts {
		b.Run(fmt.Sprintf("random/stream/live=%d", live), func(b *testing.B) {
			benchPair(b, benchPool, true, true, live, true)
		})
	}
}

const pairWindow = 64

// pairAt makes one pair at slot j of ring: it frees the block there, if
// any, and allocates size bytes in its place, with the stream-ordered calls
// on s when stream is set.
func pairAt(p *pool.Pool, ring []uint64, j int, size uint64, stream bool, s pool.Stream) error {
	var err error
	switch {
	case ring[j] == 0:
	case stream:
		err = p.FreeAsync(ring[j], s)
	default:
		err = p.Free(ring[j])
	}
	if err != nil {
		return err
	}
	if stream {
		ring[j], err = p.AllocAsync(size, s)
	} else {
		ring[j], err = p.Alloc(size)
	}
	return err
}

func benchPair(b *testing.B, newPool func(*testing.B) (*pool.Pool, *pooltest.Fake), random, stream bool, live int, randomVictim bool) {
	p, f := newPool(b)
	rng := rand.New(rand.NewPCG(uint64(live), 1))
	const n = 1 << 16
	sizes := make([]uint64, n)
	victims := make([]int, n)
	for i := range n {
		sizes[i] = 4 * kiB
		if random {
			sizes[i] = randomSize(rng)
		}
		victims[i] = rng.IntN(live)
	}
	const s pool.Stream = 1
	// Allocate twice the live count and free every other block: the free
	// lists hold as many holes as there are live blocks.
	var background []uint64
	for i := range 2 * live {
		ptr, err := p.Alloc(sizes[(i*7)%n])
		if err != nil {
			b.Fatal(err)
		}
		if i%2 == 0 {
			background = append(background, ptr)
		} else if err := p.Free(ptr); err != nil {
			b.Fatal(err)
		}
	}
	ticket := p.SyncBegin()
	if err := f.Synchronize(); err != nil {
		b.Fatal(err)
	}
	if err := p.SyncEnd(ticket); err != nil {
		b.Fatal(err)
	}
	ring := background
	if !randomVictim {
		ring = make([]uint64, pairWindow)
	}
	syncs := f.Counts().Syncs
	maps := p.Stats().GranuleMaps
	b.ResetTimer()
	for i := range b.N {
		if i%pairWindow == 0 {
			f.Complete(s) // the stream runs the work queued so far
		}
		j := i % pairWindow
		if randomVictim {
			j = victims[i%n]
		}
		if err := pairAt(p, ring, j, sizes[i%n], stream, s); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	want := uint64(live)
	if !randomVictim {
		want += uint64(min(b.N, pairWindow))
	}
	if got := p.Stats().LiveBlocks; got != want {
		b.Fatalf("%d live blocks at the end, want %d", got, want)
	}
	b.ReportMetric(float64(f.Counts().Syncs-syncs)/float64(b.N), "syncs/pair")
	b.ReportMetric(float64(p.Stats().GranuleMaps-maps)/float64(b.N), "maps/pair")
}

// replayTarget replays a trace on a pool over the fake device. Streams retire
// their work replayLag operations after it is queued: a trace records no
// timing, and a device that never progressed would keep every stream-ordered
// free from other streams until the next synchronization.
type replayTarget struct {
	p       *pool.Pool
	f       *pooltest.Fake
	ops     *int
	streams *[]pool.Stream // in the order first used, so replays repeat
}

const replayLag = 64

func newReplayTarget(p *pool.Pool, f *pooltest.Fake) replayTarget {
	return replayTarget{p: p, f: f, ops: new(int), streams: new([]pool.Stream)}
}

func (t replayTarget) tick() {
	if *t.ops++; *t.ops%replayLag == 0 {
		for _, s := range *t.streams {
			t.f.Complete(s)
		}
	}
}

func (t replayTarget) Alloc(size uint64) (uint64, error) {
	t.tick()
	return t.p.Alloc(size)
}

func (t replayTarget) AllocAsync(size, s uint64) (uint64, error) {
	t.tick()
	if !slices.Contains(*t.streams, pool.Stream(s)) {
		*t.streams = append(*t.streams, pool.Stream(s))
	}
	return t.p.AllocAsync(size, pool.Stream(s))
}

func (t replayTarget) Free(ptr uint64) error {
	t.tick()
	return t.p.Free(ptr)
}

func (t replayTarget) FreeAsync(ptr, s uint64) error {
	t.tick()
	return t.p.FreeAsync(ptr, pool.Stream(s))
}

func (t replayTarget) Sync() error {
	ticket := t.p.SyncBegin()
	if err := t.f.Synchronize(); err != nil {
		return err
	}
	return t.p.SyncEnd(ticket)
}

// loadTrace loads a reference trace and appends frees of what it leaves
// live, so it can be replayed again and again.
func loadTrace(b testing.TB, file string) []traces.Op {
	ops, err := traces.Load(filepath.Join("..", "tests", "traces", file))
	if err != nil {
		b.Fatal(err)
	}
	live := map[uint32]bool{}
	for _, op := range ops {
		switch op.Kind {
		case traces.Alloc, traces.AllocAsync:
			live[op.ID] = true
		case traces.Free, traces.FreeAsync:
			delete(live, op.ID)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(live)) { // sorted, so replays repeat
		ops = append(ops, traces.Op{Kind: traces.Free, ID: id})
	}
	return ops
}

// BenchmarkTrace replays each reference trace on top of a given number of
// background live blocks and reports the time per allocation+free pair and,
// for replays on fresh pools, the trace's peak reserved ÷ peak live with an
// unbounded quota (how far the pool grows when nothing stops it) and the
// share of requests refused under a quota of 1.10 × the trace's peak live
// bytes (whether the pool fits in that much when it must).
func BenchmarkTrace(b *testing.B) {
	for _, ref := range traces.References {
		ops := loadTrace(b, ref.File)
		allocs := 0
		for _, op := range ops {
			if op.Kind == traces.Alloc || op.Kind == traces.AllocAsync {
				allocs++
			}
		}
		ratio := traceRatio(b, ops)
		refused := traceRefusals(b, ops, 1.10, false)
		for _, live := range liveCounts {
			b.Run(fmt.Sprintf("%s/live=%d", ref.File, live), func(b *testing.B) {
				p, f := benchPool(b)
				rng := rand.New(rand.NewPCG(uint64(live), 2))
				for range live {
					if _, err := p.Alloc(randomSize(rng)); err != nil {
						b.Fatal(err)
					}
				}
				target := newReplayTarget(p, f)
				var ids []uint64
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					var err error
					if ids, err = traces.Replay(target, ops, ids); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*allocs), "ns/pair")
				b.ReportMetric(ratio, "reserved/live")
				b.ReportMetric(refused, "refused-%-at-1.1x")
			})
		}
	}
}

func traceRatio(b *testing.B, ops []traces.Op) float64 {
	p, f := benchPool(b)
	if _, err := traces.Replay(newReplayTarget(p, f), ops, nil); err != nil {
		b.Fatal(err)
	}
	st := p.Stats()
	return float64(st.PeakReservedBytes) / float64(st.PeakLiveBytes)
}

// refusingTarget replays a trace under a quota, counting the requests the
// pool refuses instead of failing: a refused request gets an address no pool
// hands out, whose free is dropped.
type refusingTarget struct {
	replayTarget
	refused, requests *int
}

const refusedBase = 1 << 62

func (t refusingTarget) result(ptr uint64, err error) (uint64, error) {
	*t.requests++
	if errors.Is(err, pool.ErrQuota) {
		*t.refused++
		return refusedBase + uint64(*t.requests)*pool.Alignment, nil
	}
	return ptr, err
}

func (t refusingTarget) Alloc(size uint64) (uint64, error) {
	return t.result(t.replayTarget.Alloc(size))
}

func (t refusingTarget) AllocAsync(size, s uint64) (uint64, error) {
	return t.result(t.replayTarget.AllocAsync(size, s))
}

func (t refusingTarget) Free(ptr uint64) error {
	if ptr >= refusedBase {
		return nil
	}
	return t.replayTarget.Free(ptr)
}

func (t refusingTarget) FreeAsync(ptr, s uint64) error {
	if ptr >= refusedBase {
		return nil
	}
	return t.replayTarget.FreeAsync(ptr, s)
}

// traceRefusals replays ops on a fresh pool, with or without virtual
// memory, whose quota is ratio × the trace's peak live bytes and returns the
// percentage of requests refused. Every refusal there is one the live bytes
// alone would not justify.
func traceRefusals(b *testing.B, ops []traces.Op, ratio float64, virtual bool) float64 {
	st, err := traces.Summarize(ops)
	if err != nil {
		b.Fatal(err)
	}
	f := pooltest.NewVirtual(0)
	opt := pool.DefaultOptions(uint64(float64(st.PeakLive) * ratio))
	opt.VirtualMemory = virtual
	p, err := pool.New(f, opt)
	if err != nil {
		b.Fatal(err)
	}
	refused, requests := 0, 0
	target := refusingTarget{newReplayTarget(p, f.Fake), &refused, &requests}
	if _, err := traces.Replay(target, ops, nil); err != nil {
		b.Fatal(err)
	}
	return 100 * float64(refused) / float64(requests)
}

// BenchmarkChurnNearQuota keeps live bytes near 75% of the quota with random
// sizes up to 16 MiB, freed with Free and FreeAsync, and reports the share of
// requests refused although live bytes plus the request fit in the quota.
func BenchmarkChurnNearQuota(b *testing.B) {
	for _, quota := range []uint64{256 * miB, 4 * giB} {
		b.Run(fmt.Sprintf("quota=%dMiB", quota>>20), func(b *testing.B) {
			f := pooltest.New(0)
			p, err := pool.New(f, pool.DefaultOptions(quota))
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(7, 7))
			type alloc struct{ ptr, size uint64 }
			var live []alloc
			var liveBytes uint64
			requests, unjustified := 0, 0
			for i := range b.N {
				if i%replayLag == 0 {
					f.Complete(1)
				}
				if liveBytes > quota*3/4 || (len(live) > 0 && rng.IntN(2) == 0) {
					j := rng.IntN(len(live))
					if rng.IntN(2) == 0 {
						err = p.Free(live[j].ptr)
					} else {
						err = p.FreeAsync(live[j].ptr, 1)
					}
					if err != nil {
						b.Fatal(err)
					}
					liveBytes -= live[j].size
					live[j] = live[len(live)-1]
					live = live[:len(live)-1]
					continue
				}
				size := alignUp(uint64(1 + rng.IntN(16*miB)))
				requests++
				ptr, err := p.AllocAsync(size, 1)
				if err != nil {
					if !errors.Is(err, pool.ErrQuota) {
						b.Fatal(err)
					}
					if liveBytes+size <= quota {
						unjustified++
					}
					continue
				}
				live = append(live, alloc{ptr, size})
				liveBytes += size
			}
			if requests > 0 {
				b.ReportMetric(100*float64(unjustified)/float64(requests), "refused-fitting-%")
			}
		})
	}
}

// BenchmarkMissAfterStreams measures a miss (an allocation the pool's index
// cannot serve until a completed marker returns a block) after a number of
// other streams were each used once and drained. Its cost must not grow
// with the number of streams ever seen.
func BenchmarkMissAfterStreams(b *testing.B) {
	for _, seen := range []int{0, 1000, 20000} {
		b.Run(fmt.Sprintf("streams=%d", seen), func(b *testing.B) {
			p, f := benchPool(b)
			for s := range pool.Stream(seen) {
				ptr, err := p.AllocAsync(4*kiB, 100+s)
				if err != nil {
					b.Fatal(err)
				}
				if err := p.FreeAsync(ptr, 100+s); err != nil {
					b.Fatal(err)
				}
			}
			ticket := p.SyncBegin()
			_ = f.Synchronize()
			if err := p.SyncEnd(ticket); err != nil {
				b.Fatal(err)
			}
			const s pool.Stream = 1
			b.ResetTimer()
			for range b.N {
				// A huge block freed on s reaches the shared index only
				// through s's marker, polled at the next miss.
				ptr, err := p.Alloc(16 * miB)
				if err != nil {
					b.Fatal(err)
				}
				if err := p.FreeAsync(ptr, s); err != nil {
					b.Fatal(err)
				}
				f.Complete(s)
			}
		})
	}
}
