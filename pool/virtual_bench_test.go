package pool_test

import (
	"fmt"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
	"github.com/spillway-gpu/spillway/tests/traces"
)

// virtualBenchPool is benchPool on a device with virtual memory.
func virtualBenchPool(b *testing.B) (*pool.Pool, *pooltest.Fake) {
	f := pooltest.NewVirtual(0)
	p, err := pool.New(f, pool.DefaultOptions(1<<40))
	if err != nil {
		b.Fatal(err)
	}
	return p, f.Fake
}

// BenchmarkTraceVirtual replays each reference trace once on a fresh pool
// with an unbounded quota, with and without virtual memory on the same
// device, and reports peak reserved ÷ peak live for both, the granules
// mapped per allocation, the synchronizations the pool forced, the time per
// allocation+free pair, and the share of requests refused under quotas of
// 1.05 and 1.10 × the trace's peak live bytes.
func BenchmarkTraceVirtual(b *testing.B) {
	for _, ref := range traces.References {
		ops := loadTrace(b, ref.File)
		for _, virtual := range []bool{true, false} {
			// Replays on fresh pools of their own, once, not at each b.N.
			refused105, refused110 := traceRefusals(b, ops, 1.05, virtual), traceRefusals(b, ops, 1.10, virtual)
			b.Run(fmt.Sprintf("%s/virtual=%v", ref.File, virtual), func(b *testing.B) {
				var st pool.Stats
				for range b.N {
					f := pooltest.NewVirtual(0)
					opt := pool.DefaultOptions(1 << 40)
					opt.VirtualMemory = virtual
					p, err := pool.New(f, opt)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := traces.Replay(newReplayTarget(p, f.Fake), ops, nil); err != nil {
						b.Fatal(err)
					}
					st = p.Stats()
					if err := p.Close(); err != nil {
						b.Fatal(err)
					}
				}
				allocs := st.CacheHits + st.DeviceReservations
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(uint64(b.N)*allocs), "ns/pair")
				b.ReportMetric(float64(st.PeakReservedBytes)/float64(st.PeakLiveBytes), "reserved/live")
				b.ReportMetric(float64(st.GranuleMaps)/float64(allocs), "maps/alloc")
				b.ReportMetric(float64(st.Syncs), "forced-syncs")
				b.ReportMetric(refused105, "refused-%-at-1.05x")
				b.ReportMetric(refused110, "refused-%-at-1.1x")
			})
		}
	}
}

// BenchmarkPairVirtual is BenchmarkPair on a device with virtual memory.
func BenchmarkPairVirtual(b *testing.B) {
	for _, sizes := range []string{"fixed", "random"} {
		for _, mode := range []string{"sync", "stream"} {
			for _, live := range liveCounts {
				b.Run(fmt.Sprintf("%s/%s/live=%d", sizes, mode, live), func(b *testing.B) {
					benchPair(b, virtualBenchPool, sizes == "random", mode == "stream", live, false)
				})
			}
		}
	}
}

// BenchmarkSpillVirtual replays each reference trace with oversubscription
// under a quota of 60% of its peak live bytes, with and without virtual
// memory (page-granular spill, or whole blocks in managed memory), and with
// virtual memory and migration, and reports the peak spilled bytes ÷ peak
// live, the bytes ever spilled per free, how much of the quota the device
// held at its peak, refusals, and the bytes migration moved (demoted plus
// promoted) per synchronization.
func BenchmarkSpillVirtual(b *testing.B) {
	for _, ref := range traces.References {
		ops := loadTrace(b, ref.File)
		sum, err := traces.Summarize(ops)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range []struct{ virtual, migrate bool }{{true, false}, {true, true}, {false, false}} {
			b.Run(fmt.Sprintf("%s/virtual=%v/migrate=%v", ref.File, c.virtual, c.migrate), func(b *testing.B) {
				quota := sum.PeakLive * 6 / 10
				var st pool.Stats
				for range b.N {
					f := pooltest.NewVirtual(0)
					opt := pool.DefaultOptions(quota)
					opt.VirtualMemory = c.virtual
					opt.Migrate = c.migrate
					opt.Oversubscribe = true
					opt.HostLimit = sum.PeakLive
					p, err := pool.New(f, opt)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := traces.Replay(newReplayTarget(p, f.Fake), ops, nil); err != nil {
						b.Fatal(err)
					}
					st = p.Stats()
					if err := p.Close(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(st.PeakSpilledBytes)/float64(st.PeakLiveBytes), "peak-spilled/live")
				b.ReportMetric(float64(st.SpilledTotal)/float64(st.Frees), "spilled-B/free")
				b.ReportMetric(float64(st.PeakReservedBytes)/float64(quota), "peak-reserved/quota")
				b.ReportMetric(float64(st.Refused), "refused")
				b.ReportMetric(float64(st.DemotedTotal+st.PromotedTotal)/float64(max(st.ExternalSyncs, 1)), "moved-B/sync")
			})
		}
	}
}
