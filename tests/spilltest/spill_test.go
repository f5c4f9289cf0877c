// Package spilltest checks oversubscription to host memory end to end:
// programs run under the shim against simcuda with a quota and
// SPILLWAY_OVERSUBSCRIBE=1, and what they read back, the shim's report and
// simcuda's ground truth (device-resident bytes, managed residency, pinned
// bytes, live allocations) must agree. It holds no code that other packages
// use.
package spilltest

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

const (
	miB   = 1 << 20
	chunk = 4 * miB // every test allocates in chunks of this size

	memoryTypeHost    = 1 // cudaMemoryTypeHost
	memoryTypeDevice  = 2 // cudaMemoryTypeDevice
	memoryTypeManaged = 3 // cudaMemoryTypeManaged
)

// spillEnv is the environment of a run with a quota, oversubscription, the
// report and simcuda's stats file, whose path it returns. extra comes last
// and so wins. The pool uses fixed segments: these tests are about the
// host tier (whole blocks spilled, managed or pinned, and promoted back);
// page-granular spill in virtual memory has its own (vmm_test.go).
func spillEnv(t *testing.T, quota, hostLimit uint64, extra ...string) ([]string, string) {
	stats := filepath.Join(t.TempDir(), "stats.json")
	env := []string{
		"SPILLWAY_VMM=0",
		"SIMCUDA_DEVICES=1GiB",
		"SIMCUDA_CONTEXT_BYTES=0", // device_bytes is then exactly what the process allocated
		"SIMCUDA_STATS_FILE=" + stats,
		fmt.Sprintf("SPILLWAY_MEMORY_LIMIT=%d", quota),
		"SPILLWAY_OVERSUBSCRIBE=1",
		fmt.Sprintf("SPILLWAY_HOST_LIMIT=%d", hostLimit),
		"SPILLWAY_REPORT=1",
	}
	return append(env, extra...), stats
}

func slots(from, to int) []string {
	var s []string
	for k := from; k < to; k++ {
		s = append(s, fmt.Sprint(k))
	}
	return s
}

// each repeats op for every slot in [from, to).
func each(op string, from, to int) []string {
	var s []string
	for _, k := range slots(from, to) {
		s = append(s, op, k)
	}
	return s
}

func script(parts ...[]string) []string {
	var s []string
	for _, p := range parts {
		s = append(s, p...)
	}
	return s
}

// consistent checks that simcuda's residency is what the report says and
// that the device never held more than the quota.
func consistent(t *testing.T, s harness.DeviceStats, r harness.Report, quota uint64) {
	t.Helper()
	if s.DeviceBytesPeak > quota {
		t.Errorf("simcuda's device_bytes_peak %d is above the quota %d", s.DeviceBytesPeak, quota)
	}
	if s.DeviceBytes != r.Reserved {
		t.Errorf("simcuda holds %d bytes on the device at exit, the pool %d", s.DeviceBytes, r.Reserved)
	}
	if s.ManagedDeviceBytes != r.Promoted {
		t.Errorf("simcuda has %d managed bytes on the device, the report %d promoted", s.ManagedDeviceBytes, r.Promoted)
	}
	if s.ManagedHostBytes+s.HostPinnedBytes != r.Spilled {
		t.Errorf("simcuda has %d managed and %d pinned bytes on the host, the report %d spilled",
			s.ManagedHostBytes, s.HostPinnedBytes, r.Spilled)
	}
}

func TestTwiceTheQuota(t *testing.T) {
	const quota, n = 64 * miB, 32
	env, statsFile := spillEnv(t, quota, 64*miB)
	res, out := harness.RunOK(t, harness.Shimmed(t, env, harness.Ops(t),
		script([]string{"N", fmt.Sprint(n), "4M", "V", "i"}, each("t", 0, n))...))
	if ok, failed := out.Num(t, "N", 0, 1), out.Num(t, "N", 0, 2); ok != n || failed != 0 {
		t.Fatalf("%d of %d chunks allocated and filled, %d failed\nstderr: %s", ok, n, failed, res.Stderr)
	}
	if checked, bad := out.Num(t, "V", 0, 1), out.Num(t, "V", 0, 2); checked != n || bad != 0 {
		t.Errorf("%d of %d chunks read back corrupt\nstderr: %s", bad, checked, res.Stderr)
	}
	if free, total := out.Num(t, "i", 0, 2), out.Num(t, "i", 0, 3); free != 0 || total != quota {
		t.Errorf("cudaMemGetInfo while spilled: free %d total %d, want 0 and %d", free, total, quota)
	}
	types := map[uint64]int{}
	for k := range n {
		if out.Code(t, "t", k) != 0 {
			t.Errorf("cudaPointerGetAttributes of chunk %d: %v", k, out.Line(t, "t", k))
		}
		types[out.Num(t, "t", k, 2)]++
	}
	if types[memoryTypeDevice] != quota/chunk || types[memoryTypeManaged] != n-quota/chunk {
		t.Errorf("memory types by count %v: want %d device chunks and %d managed", types, quota/chunk, n-quota/chunk)
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	if r.Live != n*chunk || r.Spilled != n*chunk-quota || r.SpilledTotal != r.Spilled || r.PromotedTotal != 0 {
		t.Errorf("report %+v: want live=%d spilled=spilled_total=%d, nothing promoted", r, n*chunk, n*chunk-quota)
	}
	s := harness.ReadStats(t, statsFile).Devices[0]
	consistent(t, s, r, quota)
	if s.ManagedHostBytes != n*chunk-quota {
		t.Errorf("simcuda has %d managed bytes on the host, want %d", s.ManagedHostBytes, n*chunk-quota)
	}
}

// TestPromotion frees device chunks while chunks are spilled: after the
// application's synchronization the oldest spilled chunks move back to the
// device, contents unchanged, and the quota still holds (a new chunk spills).
func TestPromotion(t *testing.T) {
	const quota = 64 * miB
	env, statsFile := spillEnv(t, quota, 64*miB)
	res, out := harness.RunOK(t, harness.Shimmed(t, env, harness.Ops(t), script(
		[]string{"N", "24", "4M"}, // 16 on the device, 8 spilled
		each("f", 0, 4),           // 16 MiB of the quota freed
		[]string{"s", "V", "i"},
		[]string{"m", "4M", "w", "24", "77", "s", "V", "i"}, // the quota is full again: this one spills
	)...))
	if out.Num(t, "N", 0, 1) != 24 || out.Code(t, "m", 0) != 0 {
		t.Fatalf("%v\nstderr: %s", out, res.Stderr)
	}
	for i := range 2 {
		if checked, bad := out.Num(t, "V", i, 1), out.Num(t, "V", i, 2); bad != 0 {
			t.Errorf("verification %d: %d of %d chunks corrupt\nstderr: %s", i, bad, checked, res.Stderr)
		}
		if free, total := out.Num(t, "i", i, 2), out.Num(t, "i", i, 3); free != 0 || total != quota {
			t.Errorf("cudaMemGetInfo #%d after promotion: free %d total %d, want 0 and %d", i, free, total, quota)
		}
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	if r.Promoted != 4*chunk || r.PromotedTotal != 4*chunk || r.Spilled != 5*chunk || r.SpilledTotal != 9*chunk {
		t.Errorf("report %+v: want promoted=promoted_total=%d spilled=%d spilled_total=%d", r, 4*chunk, 5*chunk, 9*chunk)
	}
	s := harness.ReadStats(t, statsFile).Devices[0]
	consistent(t, s, r, quota)
	if s.ManagedDeviceBytes != 4*chunk || s.ManagedHostBytes != 5*chunk {
		t.Errorf("simcuda residency: %d managed bytes on the device, %d on the host; want %d and %d",
			s.ManagedDeviceBytes, s.ManagedHostBytes, 4*chunk, 5*chunk)
	}
}

func TestHostLimit(t *testing.T) {
	const quota = 16 * miB
	env, statsFile := spillEnv(t, quota, 8*miB)
	res, out := harness.RunOK(t, harness.Shimmed(t, env, harness.Ops(t),
		"N", "6", "4M", // 4 on the device, 2 on the host: both limits reached
		"m", "4M", "m", "512", "f", "5", "m", "4M", "w", "6", "9", "m", "12M", "V", "i"))
	if out.Num(t, "N", 0, 1) != 6 {
		t.Fatalf("%v\nstderr: %s", out, res.Stderr)
	}
	for i, want := range []int{harness.ErrMemoryAllocation, harness.ErrMemoryAllocation, 0, harness.ErrMemoryAllocation} {
		if got := out.Code(t, "m", i); got != want {
			t.Errorf("allocation %d beyond the device quota returned %d, want %d", i, got, want)
		}
	}
	if out.Code(t, "f", 0) != 0 || out.Num(t, "V", 0, 2) != 0 {
		t.Errorf("%v", out)
	}
	if free, total := out.Num(t, "i", 0, 2), out.Num(t, "i", 0, 3); free != 0 || total != quota {
		t.Errorf("cudaMemGetInfo: free %d total %d, want 0 and %d", free, total, quota)
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	if r.Refused != 3 || r.Spilled != 8*miB || r.Live != 6*chunk {
		t.Errorf("report %+v: want refused=3 spilled=%d live=%d", r, 8*miB, 6*chunk)
	}
	s := harness.ReadStats(t, statsFile).Devices[0]
	consistent(t, s, r, quota)
	if s.ManagedHostBytes != 8*miB {
		t.Errorf("simcuda has %d managed bytes on the host, the host limit is %d", s.ManagedHostBytes, 8*miB)
	}
}

// TestHostLimitDefaultsToQuota: without SPILLWAY_HOST_LIMIT the host may
// hold as much as the quota, with fixed segments and with virtual memory
// (page-granular spill): a chunk beyond both gets cudaErrorMemoryAllocation.
func TestHostLimitDefaultsToQuota(t *testing.T) {
	const quota, n = 64 * miB, 2*64*miB/chunk + 1
	for _, vmm := range []string{"0", "1"} {
		t.Run("SPILLWAY_VMM="+vmm, func(t *testing.T) {
			env := []string{
				"SPILLWAY_VMM=" + vmm, "SIMCUDA_DEVICES=1GiB", "SIMCUDA_CONTEXT_BYTES=0",
				fmt.Sprintf("SPILLWAY_MEMORY_LIMIT=%d", quota), "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_REPORT=1",
			}
			res, out := harness.RunOK(t, harness.Shimmed(t, env, harness.Ops(t), "N", fmt.Sprint(n), "4M", "V"))
			ok, failed, rc := out.Num(t, "N", 0, 1), out.Num(t, "N", 0, 2), int(out.Num(t, "N", 0, 3))
			if ok != n-1 || failed != 1 || rc != harness.ErrMemoryAllocation {
				t.Fatalf("%d chunks of 4 MiB allocated, %d failed (last error %d); want %d on the device and the host, the last refused with %d\nstderr: %s",
					ok, failed, rc, n-1, harness.ErrMemoryAllocation, res.Stderr)
			}
			if bad := out.Num(t, "V", 0, 2); bad != 0 {
				t.Errorf("%d chunks read back corrupt", bad)
			}
			if r := harness.ReportFor(t, res.Stderr, 0); r.Spilled != quota || r.Refused != 1 {
				t.Errorf("report %+v: want spilled=%d (the quota) and refused=1", r, quota)
			}
		})
	}
}

// pinnedScript spills 4 of 8 chunks, frees two device chunks (pinned memory
// is never promoted), frees one spilled chunk, and checks everything.
var pinnedScript = script(
	[]string{"N", "8", "4M", "V"}, each("t", 0, 8),
	[]string{"f", "0", "f", "1", "s", "f", "4", "V", "i"})

func checkPinned(t *testing.T, res harness.Result, out harness.Output, statsFile string, quota uint64) {
	t.Helper()
	if ok := out.Num(t, "N", 0, 1); ok != 8 {
		t.Fatalf("%d of 8 chunks allocated\nstderr: %s", ok, res.Stderr)
	}
	for i := range 2 {
		if bad := out.Num(t, "V", i, 2); bad != 0 {
			t.Errorf("verification %d: %d chunks corrupt", i, bad)
		}
	}
	for k := range 8 {
		want := uint64(memoryTypeDevice)
		if k >= 4 {
			want = memoryTypeHost
		}
		if got := out.Num(t, "t", k, 2); got != want {
			t.Errorf("chunk %d has memory type %d, want %d", k, got, want)
		}
	}
	if free := out.Num(t, "i", 0, 2); free != 2*chunk {
		t.Errorf("cudaMemGetInfo free %d, want the two freed device chunks, %d", free, 2*chunk)
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	if r.Spilled != 3*chunk || r.PromotedTotal != 0 {
		t.Errorf("report %+v: want spilled=%d and nothing promoted (pinned memory stays)", r, 3*chunk)
	}
	s := harness.ReadStats(t, statsFile)
	consistent(t, s.Devices[0], r, quota)
	if d := s.Devices[0]; d.HostPinnedBytes != 3*chunk || d.ManagedHostBytes != 0 || d.ManagedDeviceBytes != 0 {
		t.Errorf("simcuda %+v: want %d pinned bytes and no managed memory", d, 3*chunk)
	}
}

func TestNoManagedFallsBackToPinned(t *testing.T) {
	const quota = 16 * miB
	env, statsFile := spillEnv(t, quota, 32*miB, "SIMCUDA_NO_MANAGED=1")
	res, out := harness.RunOK(t, harness.Shimmed(t, env, harness.Ops(t), pinnedScript...))
	checkPinned(t, res, out, statsFile, quota)
	var said []string
	for _, l := range harness.NonReportLines(res.Stderr) {
		if strings.Contains(strings.ToLower(l), "pinned") {
			said = append(said, l)
		}
	}
	if len(said) != 1 || !strings.Contains(strings.ToLower(said[0]), "managed") {
		t.Errorf("want one log line saying managed memory is unavailable and pinned memory is used, got %q\nstderr: %s",
			said, res.Stderr)
	}
}

func TestSpillPinned(t *testing.T) {
	const quota = 16 * miB
	env, statsFile := spillEnv(t, quota, 32*miB, "SPILLWAY_SPILL=pinned")
	res, out := harness.RunOK(t, harness.Shimmed(t, env, harness.Ops(t), pinnedScript...))
	checkPinned(t, res, out, statsFile, quota)
	if lines := harness.NonReportLines(res.Stderr); len(lines) != 0 {
		t.Errorf("unexpected log lines with SPILLWAY_SPILL=pinned: %q", lines)
	}
	if n := harness.ReadStats(t, statsFile).Calls["cuMemAllocManaged"]; n != 0 {
		t.Errorf("SPILLWAY_SPILL=pinned made %d managed allocations", n)
	}
}

// TestMemGetInfoWhileSpilled: host memory never shows as free device memory.
func TestMemGetInfoWhileSpilled(t *testing.T) {
	const quota = 16 * miB
	env, statsFile := spillEnv(t, quota, 16*miB)
	res, out := harness.RunOK(t, harness.Shimmed(t, env, harness.Ops(t),
		"N", "6", "4M", "i", "f", "5", "i", "f", "4", "s", "i", "f", "0", "s", "i"))
	for i, want := range []uint64{0, 0, 0, chunk} {
		if free, total := out.Num(t, "i", i, 2), out.Num(t, "i", i, 3); free != want || total != quota {
			t.Errorf("cudaMemGetInfo #%d: free %d total %d, want %d and %d", i, free, total, want, quota)
		}
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	if r.Spilled != 0 || r.Live != 3*chunk {
		t.Errorf("report %+v: want nothing spilled, %d live", r, 3*chunk)
	}
	consistent(t, harness.ReadStats(t, statsFile).Devices[0], r, quota)
}

// TestFreeSpilled frees spilled chunks with cudaFreeAsync (behind pending
// work on the stream) and cudaFree; second frees are refused. cudaFreeAsync
// is stream-ordered: it must not wait on the host for the stream's work.
func TestFreeSpilled(t *testing.T) {
	const quota = 8 * miB
	env, statsFile := spillEnv(t, quota, 16*miB)
	// Stream 1 is held by a host function until the gate opens (g, or the
	// opener 5 s after G); a write into spilled chunk 2 and a counter (k)
	// are queued behind it.
	res, out := harness.RunOK(t, harness.Shimmed(t, env, harness.Ops(t),
		"S", "N", "4", "4M", // chunks 2 and 3 spilled
		"b", "1", "z", "2", "171", "1", "k", "1", "G", "5000",
		"F", "2", "1", "K", "f", "3", "g", "y", "1", "s",
		"F", "2", "1", "f", "3", "V", "i"))
	if out.Num(t, "N", 0, 1) != 4 {
		t.Fatalf("%v\nstderr: %s", out, res.Stderr)
	}
	if out.Code(t, "F", 0) != 0 || out.Code(t, "f", 0) != 0 {
		t.Errorf("cudaFreeAsync and cudaFree of spilled chunks: %v", out)
	}
	if out.Num(t, "K", 0, 1) != 0 {
		t.Error("cudaFreeAsync of a spilled chunk waited on the host for the stream's queued work " +
			"(it returned only when the gate opener released the stream)")
	}
	if out.Code(t, "F", 1) != harness.ErrInvalidValue || out.Code(t, "f", 1) != harness.ErrInvalidValue {
		t.Errorf("second frees of spilled chunks: %v, want %d", out, harness.ErrInvalidValue)
	}
	if out.Num(t, "V", 0, 1) != 2 || out.Num(t, "V", 0, 2) != 0 {
		t.Errorf("the device chunks: %v", out)
	}
	if free := out.Num(t, "i", 0, 2); free != 0 {
		t.Errorf("cudaMemGetInfo free %d, want 0 (the device chunks fill the quota)", free)
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	if r.Spilled != 0 || r.SpilledTotal != 2*chunk || r.Live != 2*chunk {
		t.Errorf("report %+v: want spilled=0 spilled_total=%d live=%d", r, 2*chunk, 2*chunk)
	}
	s := harness.ReadStats(t, statsFile).Devices[0]
	consistent(t, s, r, quota)
	if s.ManagedHostBytes != 0 || s.LiveAllocations != 2 {
		t.Errorf("simcuda %+v: the spilled chunks were not freed", s)
	}
}

// TestSpillFaults injects failures into the calls the spill path makes.
// Allocation failures are clean errors; whatever fails, nothing leaks, the
// contents survive and the quota holds even when the advice that keeps
// spilled memory on the host could not be given.
func TestSpillFaults(t *testing.T) {
	const quota = 8 * miB
	for _, tc := range []struct {
		fail string
		// mustFail: the 3rd allocation (the first spill) must fail cleanly
		mustFail bool
	}{
		{"cudaMallocManaged:1", true},
		{"cuMemAllocManaged:1", true},
		{"cudaMemAdvise:1", false},
		{"cudaMemAdvise:2", false},
		{"cudaMemAdvise:5", false},        // the first promotion's advice (each spill gives two)
		{"cudaMemPrefetchAsync:1", false}, // the first promotion's prefetch
	} {
		t.Run(tc.fail, func(t *testing.T) {
			env, statsFile := spillEnv(t, quota, 16*miB, "SIMCUDA_FAIL="+tc.fail)
			// Chunks 0, 1 on the device; then spills; then a free and a
			// synchronization that let one spilled chunk be promoted.
			res, out := harness.RunOK(t, harness.Shimmed(t, env, harness.Ops(t),
				"N", "4", "4M", "V", "f", "0", "s", "V", "i"))
			ok, failed := out.Num(t, "N", 0, 1), out.Num(t, "N", 0, 2)
			if failed > 1 || (failed == 1 && out.Num(t, "N", 0, 3) != harness.ErrMemoryAllocation) {
				t.Errorf("allocations under %s: %v, want at most one cudaErrorMemoryAllocation\nstderr: %s", tc.fail, out, res.Stderr)
			}
			if tc.mustFail && failed != 1 {
				t.Errorf("the spill under %s did not fail: %v", tc.fail, out)
			}
			for i := range 2 {
				if bad := out.Num(t, "V", i, 2); bad != 0 {
					t.Errorf("verification %d: %d chunks corrupt\nstderr: %s", i, bad, res.Stderr)
				}
			}
			if f := out.Code(t, "f", 0); f != 0 {
				t.Errorf("cudaFree returned %d", f)
			}
			if total := out.Num(t, "i", 0, 3); total != quota {
				t.Errorf("cudaMemGetInfo total %d, want %d", total, quota)
			}
			r := harness.ReportFor(t, res.Stderr, 0)
			if r.Live != (ok-1)*chunk {
				t.Errorf("report %+v: want live=%d", r, (ok-1)*chunk)
			}
			stats := harness.ReadStats(t, statsFile)
			s := stats.Devices[0]
			consistent(t, s, r, quota)
			name, _, _ := strings.Cut(tc.fail, ":")
			if stats.Calls[name] == 0 {
				t.Errorf("%s was never called: the fault was not injected on the spill path (calls %v)", name, stats.Calls)
			}
			// Device segments are exactly one chunk each at this quota, so
			// every live allocation is a chunk the pool accounts for.
			if want := (s.DeviceBytes-s.ManagedDeviceBytes)/chunk + (r.Spilled+r.Promoted)/chunk; s.LiveAllocations != want {
				t.Errorf("simcuda has %d live allocations, the pool accounts for %d: %+v", s.LiveAllocations, want, s)
			}
			t.Logf("%s: %d chunks allocated, %d failed; report %+v", tc.fail, ok, failed, r)
		})
	}
}

// TestCachingAllocator runs a stand-in for PyTorch's caching allocator under
// a quota with oversubscription: it completes, its out-of-memory path (empty
// the cache, retry) is taken when the host limit is reached, and at the end,
// with only the weights left, every spilled weight is back on the device.
func TestCachingAllocator(t *testing.T) {
	const quota = 64 * miB
	env, statsFile := spillEnv(t, quota, 64*miB)
	runtime := filepath.Join(harness.SimcudaDir(t), "libcudart.so.12")
	res, out := harness.RunOK(t, harness.Shimmed(t, env, "python3", "testdata/caching.py", runtime))
	if out.Count("step") != 5 {
		t.Fatalf("%v\nstderr: %s", out, res.Stderr)
	}
	retries, weights := out.Num(t, "done", 0, 1), out.Num(t, "done", 0, 2)
	if retries == 0 {
		t.Error("the allocator never emptied its cache: the host limit was not reached, the test proves less than it should")
	}
	if free, total := out.Num(t, "done", 0, 3), out.Num(t, "done", 0, 4); total != quota || free != quota-weights {
		t.Errorf("cudaMemGetInfo at the end: free %d total %d, want %d and %d", free, total, quota-weights, quota)
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	// 10 activations of 4 MiB, then 12 weights of 4 MiB: 6 fit, 6 spill.
	if r.Live != weights || r.Spilled != 0 || r.Promoted != 6*chunk || r.SpilledTotal < 6*chunk {
		t.Errorf("report %+v: want live=%d, nothing spilled, the 6 spilled weights (%d bytes) promoted",
			r, weights, 6*chunk)
	}
	s := harness.ReadStats(t, statsFile).Devices[0]
	consistent(t, s, r, quota)
	if s.ManagedHostBytes != 0 || s.ManagedDeviceBytes != 6*chunk {
		t.Errorf("simcuda residency %+v: want every weight on the device", s)
	}
	t.Logf("%d retries after emptying the cache; report %+v", retries, r)
}

// TestBadSpillVariables: invalid oversubscription settings are one clear
// error line, and allocations fail.
func TestBadSpillVariables(t *testing.T) {
	prog := harness.Ops(t)
	for _, env := range []string{
		"SPILLWAY_OVERSUBSCRIBE=yes", "SPILLWAY_SPILL=disk", "SPILLWAY_SPILL=",
		"SPILLWAY_HOST_LIMIT=lots", "SPILLWAY_HOST_LIMIT=0", "SPILLWAY_HOST_LIMIT=-1GiB",
	} {
		t.Run(env, func(t *testing.T) {
			res, out := harness.RunOK(t, harness.Shimmed(t,
				[]string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_OVERSUBSCRIBE=1", env}, prog, "m", "4K"))
			if out.Code(t, "m", 0) != harness.ErrInitialization {
				t.Errorf("allocation returned %v, want %d (cudaErrorInitializationError)", out, harness.ErrInitialization)
			}
			harness.CheckConfigError(t, res.Stderr, env)
		})
	}
}
