// Package pooltest checks Spillway's pooled allocator end to end: C programs
// run under the preloaded shim against simcuda, and their observations, the
// shim's SPILLWAY_REPORT line and simcuda's ground truth are compared. It
// holds no code that other packages use.
package pooltest

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

const (
	kiB = 1 << 10
	miB = 1 << 20
)

// limit is the SPILLWAY_MEMORY_LIMIT entry for a quota of n bytes.
func limit(n uint64) string { return fmt.Sprintf("SPILLWAY_MEMORY_LIMIT=%d", n) }

// withStats adds a stats file and the report to env and returns the file's path.
func withStats(t *testing.T, env []string) ([]string, string) {
	stats := filepath.Join(t.TempDir(), "stats.json")
	// The caller's entries come last so that they win (SIMCUDA_DEVICES).
	return append([]string{"SIMCUDA_DEVICES=1GiB", "SIMCUDA_STATS_FILE=" + stats, "SPILLWAY_REPORT=1"}, env...), stats
}

// TestFreedBlockStillWritten frees a block while a stream still has a write
// into it queued (held back by a host function), then asks for a block of
// the same size. Under a quota that holds one block, the pool can only serve
// it with the freed block's memory, so it must first wait for the queued
// write; otherwise the write lands in the new owner's data.
func TestFreedBlockStillWritten(t *testing.T) {
	prog := harness.Ops(t)
	writes := map[string][]string{
		"memset": {"z", "0", "170", "1"}, // cudaMemsetAsync(0xAA) on stream 1
		"copy":   {"W", "0", "7", "1"},   // cudaMemcpyAsync of seed 7's pattern on stream 1
	}
	frees := map[string][]string{
		"cudaFree":      {"f", "0"},
		"cudaFreeAsync": {"F", "0", "1"},
	}
	for _, mode := range []string{"default", "strict"} {
		for wname, write := range writes {
			for fname, free := range frees {
				for _, quota := range []uint64{1 * miB, 64 * miB} {
					name := fmt.Sprintf("%s/%s/%s/quota=%dMiB", mode, wname, fname, quota/miB)
					t.Run(name, func(t *testing.T) {
						t.Parallel() // most of each run is waiting for the gate opener
						env := []string{limit(quota), "SIMCUDA_DEVICES=1GiB"}
						if mode == "strict" {
							env = append(env, "SPILLWAY_FREE_SYNC=1")
						}
						script := []string{"S", "m", "1M", "b", "1"}
						script = append(script, write...)
						script = append(script, "k", "1", "G", "1000")
						script = append(script, free...)
						// K #0: after the free; the new owner (on the legacy
						// stream, which does not wait for stream 1) then writes
						// seed 9 before the gate opens.
						script = append(script, "K", "m", "1M", "K", "w", "1", "9", "g", "y", "1", "v", "1", "9")
						res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, script...))
						checkFreedBlockStillWritten(t, out, res.Stderr, mode, fname, quota)
					})
				}
			}
		}
	}
}

func checkFreedBlockStillWritten(t *testing.T, out harness.Output, stderr, mode, free string, quota uint64) {
	t.Helper()
	if out.Code(t, "m", 0) != 0 || out.Code(t, "m", 1) != 0 {
		t.Fatalf("allocations failed: %v\nstderr: %s", out, stderr)
	}
	op := "f"
	if free == "cudaFreeAsync" {
		op = "F"
	}
	if out.Code(t, op, 0) != 0 {
		t.Fatalf("%s returned %d", free, out.Code(t, op, 0))
	}
	old, reused := out.Num(t, "m", 0, 3), out.Num(t, "m", 1, 3)
	doneAtFree, doneAtReuse := out.Num(t, "K", 0, 1), out.Num(t, "K", 1, 1)
	if mode == "strict" && free == "cudaFree" && doneAtFree != 1 {
		t.Errorf("SPILLWAY_FREE_SYNC=1: cudaFree returned before the queued write into the block was done")
	}
	if quota == 1*miB && doneAtReuse != 1 {
		t.Errorf("under a 1 MiB quota a second 1 MiB block was handed out (at %#x, the freed one at %#x) "+
			"while the freed block's queued write was not done", reused, old)
	}
	if reused == old && doneAtReuse != 1 {
		t.Errorf("the freed block %#x was handed out again before its queued write was done", old)
	}
	if out.Code(t, "v", 0) != 0 || out.Num(t, "v", 0, 2) != 1 {
		t.Errorf("the new owner's data was overwritten (same address: %v): %v", reused == old, out)
	}
	t.Logf("freed %#x, new block %#x; write done at free: %d, at reuse: %d", old, reused, doneAtFree, doneAtReuse)
}

// TestStreamOrderedReuse frees a block with cudaFreeAsync on a stream that is
// held back, then allocates on the same stream: the block is reusable at
// once (stream order protects it), without waiting for the stream; on
// another stream it is not.
func TestStreamOrderedReuse(t *testing.T) {
	prog := harness.Ops(t)
	env, statsFile := withStats(t, []string{limit(1 * miB)})
	// Stream 1 is held; the old owner's memset and the free are queued
	// behind the gate; the new owner's copy is queued after them.
	res, out := harness.RunOK(t, harness.Shimmed(t, env, prog,
		"S", "a", "1M", "1", "b", "1", "z", "0", "170", "1", "k", "1", "F", "0", "1", "G", "5000",
		"a", "1M", "1", "K", "W", "1", "9", "1", "g", "y", "1", "v", "1", "9", "F", "1", "1", "y", "1"))
	if out.Code(t, "a", 0) != 0 || out.Code(t, "a", 1) != 0 || out.Code(t, "F", 0) != 0 {
		t.Fatalf("%v\nstderr: %s", out, res.Stderr)
	}
	if first, second := out.Num(t, "a", 0, 3), out.Num(t, "a", 1, 3); first != second {
		t.Errorf("a block freed on stream 1 was not reused by the next allocation on stream 1 under a quota "+
			"holding one block: %#x, then %#x", first, second)
	}
	if out.Num(t, "K", 0, 1) != 0 {
		t.Error("the allocation on the freeing stream waited for the stream (the gate opener released it)")
	}
	if out.Code(t, "v", 0) != 0 || out.Num(t, "v", 0, 2) != 1 {
		t.Errorf("the new owner's data is not intact: %v", out)
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	if r.CacheHits < 1 || r.Live != 0 {
		t.Errorf("report %+v: want a cache hit and nothing live", r)
	}
	s := harness.ReadStats(t, statsFile)
	if s.Devices[0].DeviceBytesPeak > 1*miB {
		t.Errorf("simcuda saw %d bytes on the device under a 1 MiB quota", s.Devices[0].DeviceBytesPeak)
	}

	// On another stream the block is not reusable before stream 1 reaches
	// the free: under a roomy quota the pool grows rather than wait.
	_, out = harness.RunOK(t, harness.Shimmed(t, []string{limit(64 * miB)}, prog,
		"S", "S", "a", "1M", "1", "b", "1", "z", "0", "170", "1", "k", "1", "F", "0", "1", "G", "5000",
		"a", "1M", "2", "K", "W", "1", "9", "2", "y", "2", "g", "y", "1", "v", "1", "9"))
	if out.Code(t, "a", 1) != 0 {
		t.Fatalf("%v", out)
	}
	if out.Num(t, "a", 0, 3) == out.Num(t, "a", 1, 3) && out.Num(t, "K", 0, 1) != 1 {
		t.Errorf("a block freed on held stream 1 was handed to stream 2 before stream 1 reached the free")
	}
	if out.Code(t, "v", 0) != 0 || out.Num(t, "v", 0, 2) != 1 {
		t.Errorf("stream 2's data is not intact: %v", out)
	}
}

// TestManyThreads runs 8 threads of random allocations with data checks.
func TestManyThreads(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/threads.c"}, Cudart: true,
		ProjectHeaders: true})
	const quota = 128 * miB // twice the most the threads can hold: 8 threads x 8 blocks x 1 MiB
	env, statsFile := withStats(t, []string{limit(quota)})
	res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, "8", "1500", strconv.Itoa(miB)))
	allocs := out.Num(t, "threads", 0, 1)
	refused, failed := out.Num(t, "threads", 0, 2), out.Num(t, "threads", 0, 3)
	overlaps, corrupt := out.Num(t, "threads", 0, 4), out.Num(t, "threads", 0, 5)
	t.Logf("%d allocations, %d refused", allocs, refused)
	if allocs < 1000 {
		t.Fatalf("only %d allocations succeeded: %v\nstderr: %s", allocs, out, res.Stderr)
	}
	if overlaps != 0 || corrupt != 0 {
		t.Errorf("%d overlapping live blocks, %d corrupt blocks\nstderr: %s", overlaps, corrupt, res.Stderr)
	}
	if failed != 0 {
		t.Errorf("%d calls failed other than with cudaErrorMemoryAllocation", failed)
	}
	if refused != 0 {
		t.Errorf("%d requests refused with at most half of the quota live", refused)
	}
	if free, total := out.Num(t, "info", 0, 2), out.Num(t, "info", 0, 3); free != quota || total != quota {
		t.Errorf("after every block was freed cudaMemGetInfo says free %d of %d, want all of %d", free, total, quota)
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	if r.Live != 0 || r.Cached != r.Reserved || r.PeakReserved > quota || r.PeakLive > 64*miB {
		t.Errorf("report at exit %+v: want live=0, cached=reserved, peaks within the quota and 64 MiB", r)
	}
	if r.CacheHits == 0 {
		t.Errorf("no request was served from the pool's cache: %+v", r)
	}
	s := harness.ReadStats(t, statsFile).Devices[0]
	if s.DeviceBytesPeak > quota {
		t.Errorf("simcuda's device_bytes_peak %d is above the quota %d", s.DeviceBytesPeak, quota)
	}
	// What remains on the device is the pool's cache and nothing else.
	if s.DeviceBytes != r.Reserved || s.ManagedDeviceBytes != 0 || s.ManagedHostBytes != 0 || s.HostPinnedBytes != 0 {
		t.Errorf("simcuda at exit %+v; the pool reports %d bytes reserved", s, r.Reserved)
	}
}

// TestChurnRefusals measures requests refused although the live bytes plus
// the request fit in the quota, under random churn holding about 75% of
// the quota live. Goal: below 0.5%.
func TestChurnRefusals(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/churn.c"}, Cudart: true,
		ProjectHeaders: true})
	const quota = 256 * miB
	for _, tc := range []struct {
		name  string
		async string
	}{{"cudaMalloc", "0"}, {"mixed-streams", "1"}} {
		t.Run(tc.name, func(t *testing.T) {
			var requests, unjustified uint64
			for seed := 1; seed <= 3; seed++ {
				env, statsFile := withStats(t, []string{limit(quota)})
				res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, strconv.Itoa(seed), "50000", strconv.Itoa(4*miB), "75", tc.async))
				if got := out.Num(t, "churn", 0, 6); got != quota {
					t.Fatalf("the program sees a quota of %d, want %d", got, quota)
				}
				if failed := out.Num(t, "churn", 0, 4); failed != 0 {
					t.Errorf("seed %d: %d calls failed other than with cudaErrorMemoryAllocation\nstderr: %s", seed, failed, res.Stderr)
				}
				req, refused, unj := out.Num(t, "churn", 0, 1), out.Num(t, "churn", 0, 2), out.Num(t, "churn", 0, 3)
				r := harness.ReportFor(t, res.Stderr, 0)
				if r.Refused != refused {
					t.Errorf("seed %d: the program saw %d refusals, the report %d", seed, refused, r.Refused)
				}
				if r.PeakReserved > quota || r.Live != 0 {
					t.Errorf("seed %d: report %+v", seed, r)
				}
				if peak := harness.ReadStats(t, statsFile).Devices[0].DeviceBytesPeak; peak > quota {
					t.Errorf("seed %d: simcuda's device_bytes_peak %d is above the quota", seed, peak)
				}
				t.Logf("seed %d: %d requests, %d refused, %d of them with live+request within the quota; "+
					"peak live %.1f%% of the quota, peak reserved %.1f%%", seed, req, refused, unj,
					100*float64(out.Num(t, "churn", 0, 5))/quota, 100*float64(r.PeakReserved)/quota)
				requests += req
				unjustified += unj
			}
			rate := float64(unjustified) / float64(requests)
			t.Logf("refusal rate with live+request within the quota: %d of %d requests = %.3f%% (goal < 0.5%%)",
				unjustified, requests, 100*rate)
			if rate >= 0.005 {
				t.Errorf("%.3f%% of requests refused although live bytes plus the request fit the quota (goal < 0.5%%)", 100*rate)
			}
		})
	}
}

// TestFreeEdgeCases: cudaFree(NULL), a double free, an interior pointer and
// a driver allocation (cuMemAlloc_v2, interposed and pooled like the
// runtime's) freed through the runtime.
func TestFreeEdgeCases(t *testing.T) {
	const quota = 4 * miB
	env, statsFile := withStats(t, []string{limit(quota)})
	res, out := harness.RunOK(t, harness.Shimmed(t, env, harness.Ops(t),
		"n", "m", "1M", "D", "1M", "i", // slot 0 from the runtime, slot 1 from the driver
		"w", "0", "5", "f", "0", "i", "f", "0", "i", // free, then double free
		"m", "1M", "w", "2", "6", "I", "2", "4K", "i", // slot 2; free of an interior pointer
		"f", "1", "f", "1", // the driver's block through the runtime, twice
		"v", "2", "6", "f", "2", "m", "4M", "f", "3", "i"))
	if out.Code(t, "n", 0) != 0 {
		t.Errorf("cudaFree(NULL) returned %d", out.Code(t, "n", 0))
	}
	if out.Code(t, "m", 0) != 0 || out.Code(t, "D", 0) != 0 || out.Code(t, "m", 1) != 0 {
		t.Fatalf("allocations failed: %v\nstderr: %s", out, res.Stderr)
	}
	for _, c := range []struct {
		what     string
		op       string
		i, wantC int
	}{
		{"the first free", "f", 0, 0},
		{"a double free", "f", 1, harness.ErrInvalidValue},
		{"the free of an interior pointer", "I", 0, harness.ErrInvalidValue},
		{"the free of a driver allocation", "f", 2, 0},
		{"the second free of a driver allocation", "f", 3, harness.ErrInvalidValue},
		{"the last free", "f", 4, 0},
	} {
		if got := out.Code(t, c.op, c.i); got != c.wantC {
			t.Errorf("%s returned %d, want %d", c.what, got, c.wantC)
		}
	}
	// The driver's block counts against the quota like the runtime's.
	if free := out.Num(t, "i", 0, 2); free != quota-2*miB {
		t.Errorf("with 1 MiB allocated through the runtime and 1 MiB through the driver, free = %d, want %d", free, quota-2*miB)
	}
	if f1, f2 := out.Num(t, "i", 1, 2), out.Num(t, "i", 2, 2); f1 != quota-1*miB || f2 != f1 {
		t.Errorf("free after the free %d, after the double free %d; want %d both times", f1, f2, quota-1*miB)
	}
	if f := out.Num(t, "i", 3, 2); f != quota-2*miB {
		t.Errorf("an interior free changed the accounting: free %d, want %d", f, quota-2*miB)
	}
	if out.Code(t, "v", 0) != 0 || out.Num(t, "v", 0, 2) != 1 {
		t.Error("a block was damaged by the invalid frees around it")
	}
	if out.Code(t, "m", 2) != 0 {
		t.Errorf("the whole quota is not available after the invalid frees: %v", out)
	}
	if f := out.Num(t, "i", 4, 2); f != quota {
		t.Errorf("at the end free = %d, want %d", f, quota)
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	if r.Live != 0 || r.PeakLive != 4*miB || r.Refused != 0 {
		t.Errorf("report %+v: want live=0, peak_live=4MiB, nothing refused", r)
	}
	if s := harness.ReadStats(t, statsFile).Devices[0]; s.DeviceBytes != r.Reserved {
		t.Errorf("simcuda holds %d bytes at exit, the pool %d: the driver's block leaked or the pool lost one", s.DeviceBytes, r.Reserved)
	}
}

// TestDeviceReset: cudaDeviceReset drops the device's pool (simcuda frees
// every allocation of the device), and only that device's.
func TestDeviceReset(t *testing.T) {
	const quota = 4 * miB
	env, statsFile := withStats(t, []string{limit(quota), "SIMCUDA_DEVICES=2x1GiB"})
	res, out := harness.RunOK(t, harness.Shimmed(t, env, harness.Ops(t),
		"d", "1", "m", "1M", "w", "0", "3", // slot 0 on device 1, kept across device 0's reset
		"d", "0", "m", "2M", "m", "2M", "m", "1M", "f", "1", // slots 1, 2; a refusal; slot 1 pending
		"r", "i", "f", "2", "m", "4M", // reset; the old pointer; the whole quota again
		"d", "1", "v", "0", "3", "i", "f", "0"))
	if out.Code(t, "m", 3) != harness.ErrMemoryAllocation {
		t.Fatalf("the quota was not full before the reset: %v\nstderr: %s", out, res.Stderr)
	}
	if out.Code(t, "r", 0) != 0 {
		t.Fatalf("cudaDeviceReset returned %d", out.Code(t, "r", 0))
	}
	if free, total := out.Num(t, "i", 0, 2), out.Num(t, "i", 0, 3); free != quota || total != quota {
		t.Errorf("after cudaDeviceReset: free %d of %d, want all of %d", free, total, quota)
	}
	if got := out.Code(t, "f", 1); got != harness.ErrInvalidValue {
		t.Errorf("freeing a pointer destroyed by cudaDeviceReset returned %d, want %d", got, harness.ErrInvalidValue)
	}
	if out.Code(t, "m", 4) != 0 {
		t.Errorf("the whole quota could not be allocated after the reset: %v", out)
	}
	if out.Code(t, "v", 0) != 0 || out.Num(t, "v", 0, 2) != 1 || out.Code(t, "f", 2) != 0 {
		t.Errorf("device 1's block did not survive device 0's reset: %v", out)
	}
	if free := out.Num(t, "i", 1, 2); free != quota-1*miB {
		t.Errorf("device 1's accounting changed with device 0's reset: free %d, want %d", free, quota-1*miB)
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	if r.Live != 4*miB {
		t.Errorf("device 0's report %+v: want live = the 4 MiB allocated after the reset", r)
	}
	s := harness.ReadStats(t, statsFile).Devices[0]
	if s.DeviceBytes != r.Reserved || s.DeviceBytesPeak > quota {
		t.Errorf("simcuda device 0 at exit %+v; the pool reserves %d", s, r.Reserved)
	}
}

// TestPoolingOff: SPILLWAY_POOL=0 passes every request through and keeps the
// quota. The same script pooled, with a release threshold that keeps freed
// segments cached, reuses the freed blocks instead of reserving new ones;
// with a threshold of 0 it returns them to the device.
func TestPoolingOff(t *testing.T) {
	const quota = 4 * miB
	prog := harness.Ops(t)
	script := []string{"m", "1M", "m", "1M", "m", "1M", "m", "1M", "m", "1M", "f", "0", "m", "1M", "f", "1",
		"m", "1M", "i"}
	for _, tc := range []struct {
		name string
		env  []string
		// want: the report's pass_through, cache_hits, and cuMemAlloc_v2 calls (simcuda)
		passThrough, cacheHits, reservations uint64
		released                             bool
	}{
		{"SPILLWAY_POOL=0", []string{"SPILLWAY_POOL=0"}, 6, 0, 6, false},
		{"cached", []string{fmt.Sprintf("SPILLWAY_POOL_RELEASE_THRESHOLD=%d", quota)}, 0, 2, 4, false},
		{"released", []string{"SPILLWAY_POOL_RELEASE_THRESHOLD=0"}, 0, 0, 6, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, statsFile := withStats(t, append([]string{limit(quota)}, tc.env...))
			res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, script...))
			for i, want := range []int{0, 0, 0, 0, harness.ErrMemoryAllocation, 0, 0} {
				if got := out.Code(t, "m", i); got != want {
					t.Errorf("allocation %d returned %d, want %d", i, got, want)
				}
			}
			if free := out.Num(t, "i", 0, 2); free != 0 {
				t.Errorf("free %d with the quota in use", free)
			}
			r := harness.ReportFor(t, res.Stderr, 0)
			s := harness.ReadStats(t, statsFile)
			if s.Devices[0].DeviceBytesPeak > quota {
				t.Errorf("simcuda's device_bytes_peak %d is above the quota", s.Devices[0].DeviceBytesPeak)
			}
			if r.PassThrough != tc.passThrough || r.CacheHits != tc.cacheHits || r.Refused != 1 || r.Live != quota {
				t.Errorf("report %+v: want pass_through=%d cache_hits=%d refused=1 live=%d", r, tc.passThrough, tc.cacheHits, quota)
			}
			if n := s.Calls["cuMemAlloc_v2"]; n != tc.reservations {
				t.Errorf("%d device allocations (cuMemAlloc_v2) for 6 requests, want %d", n, tc.reservations)
			}
			if tc.released != (r.SegmentsReleased > 0) {
				t.Errorf("segments_released=%d", r.SegmentsReleased)
			}
		})
	}
}

// TestPoolReserve: SPILLWAY_POOL_RESERVE reserves one segment at the first
// allocation, serves what fits in it, and keeps it.
func TestPoolReserve(t *testing.T) {
	const quota = 64 * miB
	prog := harness.Ops(t)
	env, statsFile := withStats(t, []string{limit(quota), "SPILLWAY_POOL_RESERVE=32MiB"})
	res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, "m", "1K", "i", "N", "15", "1M", "i", "f", "0", "s", "i"))
	if out.Code(t, "m", 0) != 0 || out.Num(t, "N", 0, 1) != 15 {
		t.Fatalf("%v\nstderr: %s", out, res.Stderr)
	}
	// free = quota - reserved + cached; 1K is one 1 KiB block (512-byte alignment)
	for i, want := range []uint64{quota - 1*kiB, quota - 1*kiB - 15*miB, quota - 15*miB} {
		if free := out.Num(t, "i", i, 2); free != want {
			t.Errorf("cudaMemGetInfo #%d: free %d, want %d", i, free, want)
		}
	}
	s := harness.ReadStats(t, statsFile)
	if n := s.Calls["cuMemAlloc_v2"]; n != 1 {
		t.Errorf("%d device allocations; the 32 MiB reserve should have served all 16 requests", n)
	}
	if d := s.Devices[0]; d.DeviceBytesPeak != 32*miB || d.DeviceBytes != 32*miB {
		t.Errorf("simcuda %+v: want exactly the 32 MiB reserve on the device", d)
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	if r.Reserved != 32*miB || r.Live != 15*miB {
		t.Errorf("report %+v: want reserved=32MiB live=15MiB", r)
	}

	res = harness.Run(t, harness.Shimmed(t, []string{limit(quota), "SPILLWAY_POOL_RESERVE=128MiB"}, prog, "m", "1K"))
	out = harness.ParseOutput(res.Stdout)
	if out.Code(t, "m", 0) == 0 {
		t.Error("a reserve above the quota was accepted")
	}
	if !strings.Contains(res.Stderr, "SPILLWAY_POOL_RESERVE") {
		t.Errorf("a reserve above the quota: the error does not name SPILLWAY_POOL_RESERVE: %q", res.Stderr)
	}
}

// TestBadPoolVariables: an invalid pool setting is one clear error line and
// every allocation fails, as for the quota.
func TestBadPoolVariables(t *testing.T) {
	prog := harness.Ops(t)
	for _, env := range []string{
		"SPILLWAY_POOL=maybe", "SPILLWAY_POOL=2", "SPILLWAY_FREE_SYNC=yes",
		"SPILLWAY_POOL_RELEASE_THRESHOLD=lots", "SPILLWAY_POOL_RELEASE_THRESHOLD=-1MiB",
		"SPILLWAY_POOL_RESERVE=8GiBs", "SPILLWAY_POOL_RESERVE=", "SPILLWAY_REPORT=yes",
	} {
		t.Run(env, func(t *testing.T) {
			res, out := harness.RunOK(t, harness.Shimmed(t, []string{limit(64 * miB), env}, prog, "m", "4K", "a", "4K", "0"))
			if out.Code(t, "m", 0) != harness.ErrInitialization || out.Code(t, "a", 0) != harness.ErrInitialization {
				t.Errorf("allocations returned %v, want %d (cudaErrorInitializationError)", out, harness.ErrInitialization)
			}
			harness.CheckConfigError(t, res.Stderr, env)
		})
	}
	// Valid settings are accepted.
	for _, env := range []string{"SPILLWAY_POOL_RELEASE_THRESHOLD=0", "SPILLWAY_POOL_RELEASE_THRESHOLD=1GiB",
		"SPILLWAY_POOL=1", "SPILLWAY_FREE_SYNC=0", "SPILLWAY_REPORT=0"} {
		res, out := harness.RunOK(t, harness.Shimmed(t, []string{limit(64 * miB), env}, prog, "m", "4K", "f", "0"))
		if out.Code(t, "m", 0) != 0 || out.Code(t, "f", 0) != 0 || len(harness.NonReportLines(res.Stderr)) != 0 {
			t.Errorf("%s: %v, stderr %q", env, out, res.Stderr)
		}
	}
}

// TestPerThreadStreamsStayIndependent: a block freed with cudaFreeAsync on
// one thread's cudaStreamPerThread, behind work held back there, leaves
// another thread's cudaStreamPerThread as CUDA leaves it: free of any order
// with the first. What the pool records to learn when the free is reached
// must not make the second thread's stream wait for the first's work
// (simcuda, as CUDA, orders the legacy default stream after every blocking
// stream, and every blocking stream after the legacy one), and the block
// is not handed to the second thread before the first's work is done.
func TestPerThreadStreamsStayIndependent(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/perthread.c"}, Cudart: true,
		ProjectHeaders: true})
	for _, vmm := range []string{"SPILLWAY_VMM=0", "SPILLWAY_VMM=1"} {
		t.Run(vmm, func(t *testing.T) {
			res, out := harness.RunOK(t, harness.Shimmed(t, []string{limit(64 * miB), vmm}, prog, "3000"))
			if out.Code(t, "free", 0) != 0 || out.Code(t, "alloc", 0) != 0 || out.Code(t, "sync", 0) != 0 {
				t.Fatalf("%v\nstderr: %s", out, res.Stderr)
			}
			if out.Num(t, "sync", 0, 2) != 0 {
				t.Error("cudaStreamSynchronize(cudaStreamPerThread) in the main thread waited for work held on another thread's per-thread stream")
			}
			if out.Num(t, "alloc", 0, 2) == 1 && out.Num(t, "sync", 0, 2) == 0 {
				t.Error("the block freed behind held work on another thread's per-thread stream was handed out before that work ran")
			}
			if out.Num(t, "intact", 0, 1) != 1 {
				t.Errorf("the main thread's block was overwritten by the other thread's memset: %v", out)
			}
		})
	}
}
