package shimtest

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// reportKeys are the fields of a SPILLWAY_REPORT line, in order.
var reportKeys = []string{"live", "peak_live", "reserved", "peak_reserved", "quota", "cached", "largest_free",
	"cache_hits", "device_reservations", "pass_through", "syncs", "external_syncs", "segments_released",
	"refused", "spilled", "spilled_total", "promoted", "promoted_total", "demoted_total", "host_outside", "backing_errors", "release_errors", "capture_skips", "deferred_release_errors"}

// reportOf parses the SPILLWAY_REPORT line of a device from a run's log output.
func reportOf(t testing.TB, log string, device int) map[string]uint64 {
	t.Helper()
	prefix := fmt.Sprintf("spillway: device %d: ", device)
	var found []string
	for _, l := range strings.Split(log, "\n") {
		if rest, ok := strings.CutPrefix(l, prefix); ok {
			found = append(found, rest)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one line starting %q, got %d in:\n%s", prefix, len(found), log)
	}
	fields := strings.Fields(found[0])
	if len(fields) != len(reportKeys) {
		t.Fatalf("report %q has %d fields, want %d", found[0], len(fields), len(reportKeys))
	}
	rep := map[string]uint64{}
	for i, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		n, err := strconv.ParseUint(v, 10, 64)
		if k != reportKeys[i] || err != nil {
			t.Fatalf("report field %d is %q, want %s=<number>", i, f, reportKeys[i])
		}
		rep[k] = n
	}
	return rep
}

func TestPoolServesFromCache(t *testing.T) {
	prog := cudaops(t)
	ops := []string{"m", "4K", "f", "0", "s", "m", "4K", "a", "4K", "F", "2", "a", "4K", "A", "4K", "G", "4", "A", "4K"}
	res, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_REPORT=1"}, prog, ops...))
	for _, op := range []string{"m", "a", "A"} {
		for i := range 2 {
			if out.Code(t, op, i) != 0 {
				t.Fatalf("%s #%d failed: %v", op, i, out)
			}
		}
	}
	rep := reportOf(t, res.Stderr, 0)
	// One segment; everything after it comes from the pool, and the
	// application's cudaDeviceSynchronize is announced to it.
	want := map[string]uint64{"device_reservations": 1, "cache_hits": 5, "pass_through": 0, "external_syncs": 1,
		"syncs": 0, "live": 3 * 4096}
	for k, v := range want {
		if rep[k] != v {
			t.Errorf("%s = %d, want %d (report %v)", k, rep[k], v, rep)
		}
	}

	// With the pool off every allocation is a pass-through.
	res, _ = harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_REPORT=1", "SPILLWAY_POOL=0"}, prog, ops...))
	if rep := reportOf(t, res.Stderr, 0); rep["pass_through"] != 6 || rep["cache_hits"] != 0 || rep["live"] != 3*4096 {
		t.Errorf("SPILLWAY_POOL=0: %v", rep)
	}
	// No report unless asked.
	if res, _ := harness.RunOK(t, harness.Shimmed(t, nil, prog, ops...)); res.Stderr != "" {
		t.Errorf("a report without SPILLWAY_REPORT=1: %q", res.Stderr)
	}
}

func TestReportPerDevice(t *testing.T) {
	cmd := harness.Shimmed(t, []string{"SPILLWAY_REPORT=1", "SIMCUDA_DEVICES=2x1GiB", "SPILLWAY_MEMORY_LIMIT_1=256MiB"},
		cudaops(t), "d", "0", "m", "1M", "d", "1", "m", "3M", "m", "5M")
	res, _ := harness.RunOK(t, cmd)
	if rep := reportOf(t, res.Stderr, 0); rep["live"] != 1<<20 || rep["quota"] != 1<<30 {
		t.Errorf("device 0: %v", rep)
	}
	if rep := reportOf(t, res.Stderr, 1); rep["live"] != 8<<20 || rep["quota"] != 256<<20 {
		t.Errorf("device 1: %v", rep)
	}
}

func TestPoolSettings(t *testing.T) {
	prog := cudaops(t)
	// The settings of the fixed-segment design (SPILLWAY_VMM=0), whose
	// segments the report counts.
	report := func(env []string, ops ...string) map[string]uint64 {
		t.Helper()
		res, _ := harness.RunOK(t, harness.Shimmed(t, append(env, "SPILLWAY_REPORT=1", "SPILLWAY_VMM=0"), prog, ops...))
		return reportOf(t, res.Stderr, 0)
	}
	// Strict mode: the free synchronizes, as cudaFree does.
	if rep := report([]string{"SPILLWAY_FREE_SYNC=1"}, "m", "4K", "f", "0", "m", "4K"); rep["syncs"] != 1 {
		t.Errorf("SPILLWAY_FREE_SYNC=1: %v", rep)
	}
	if rep := report(nil, "m", "4K", "f", "0", "m", "4K"); rep["syncs"] != 0 {
		t.Errorf("batched mode synchronized: %v", rep)
	}
	// A release threshold of zero returns an empty segment at once.
	if rep := report([]string{"SPILLWAY_POOL_RELEASE_THRESHOLD=0"}, "m", "64M", "f", "0", "s"); rep["reserved"] != 0 || rep["segments_released"] != 1 {
		t.Errorf("SPILLWAY_POOL_RELEASE_THRESHOLD=0: %v", rep)
	}
	if rep := report(nil, "m", "64M", "f", "0", "s"); rep["reserved"] != 64<<20 || rep["cached"] != 64<<20 {
		t.Errorf("the default threshold keeps the segment: %v", rep)
	}
	// A reserve is one segment from the first allocation on, serving every
	// class: its allocations count as cache hits.
	stats := filepath.Join(t.TempDir(), "stats.json")
	rep := report([]string{"SPILLWAY_POOL_RESERVE=32MiB", "SIMCUDA_STATS_FILE=" + stats}, "m", "4K", "m", "3M", "m", "12M")
	if rep["reserved"] != 32<<20 || rep["device_reservations"] != 0 || rep["cache_hits"] != 3 {
		t.Errorf("SPILLWAY_POOL_RESERVE=32MiB: %v", rep)
	}
	if s := harness.ReadStats(t, stats); s.Devices[0].DeviceBytes != 32<<20 {
		t.Errorf("simcuda holds %d bytes, want the 32 MiB reserve", s.Devices[0].DeviceBytes)
	}
	// A reserve larger than the quota is an invalid setting for that device.
	res, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB", "SPILLWAY_POOL_RESERVE=2MiB"}, prog, "m", "4K", "M", "4K"))
	if out.Code(t, "m", 0) != harness.ErrInitialization || out.Code(t, "M", 0) != harness.ErrInitialization {
		t.Errorf("a reserve above the quota: %v", out)
	}
	if lines := nonEmptyLines(res.Stderr); len(lines) != 1 || !strings.Contains(lines[0], "SPILLWAY_POOL_RESERVE") || !strings.Contains(lines[0], "valid example") {
		t.Errorf("want one error line naming SPILLWAY_POOL_RESERVE, got %q", res.Stderr)
	}
}

func spilldemo(t testing.TB) string {
	return harness.Compile(t, harness.CBuild{Sources: []string{"testdata/spilldemo.c"}, Cudart: true, ProjectHeaders: true})
}

func TestOversubscription(t *testing.T) {
	prog := spilldemo(t)
	for _, tc := range []struct {
		name   string
		env    []string
		pinned bool
		warn   bool
	}{
		{"managed", nil, false, false},
		{"pinned", []string{"SPILLWAY_SPILL=pinned"}, true, false},
		{"no managed memory", []string{"SIMCUDA_NO_MANAGED=1"}, true, true},
		{"pool off", []string{"SPILLWAY_POOL=0"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stats := filepath.Join(t.TempDir(), "stats.json")
			env := append([]string{"SPILLWAY_MEMORY_LIMIT=16MiB", "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_REPORT=1",
				"SIMCUDA_STATS_FILE=" + stats}, tc.env...)
			// 8 chunks of 4 MiB: twice the quota; the program checks every word.
			res, _ := harness.RunOK(t, harness.Shimmed(t, env, prog, "8", "4"))
			rep := reportOf(t, res.Stderr, 0)
			dev := harness.ReadStats(t, stats).Devices[0]
			if dev.DeviceBytesPeak > 16<<20 || rep["peak_reserved"] > 16<<20 {
				t.Errorf("the quota did not hold: simcuda peak %d, report %v", dev.DeviceBytesPeak, rep)
			}
			if rep["spilled_total"] < 16<<20 || rep["refused"] != 0 {
				t.Errorf("spilling: %v", rep)
			}
			if tc.pinned {
				if dev.HostPinnedBytes != rep["spilled"] || rep["promoted_total"] != 0 {
					t.Errorf("pinned spill: simcuda %+v, report %v", dev, rep)
				}
			} else if rep["promoted"] == 0 || dev.ManagedDeviceBytes != rep["promoted"] || dev.ManagedHostBytes != rep["spilled"] {
				t.Errorf("promotion after the frees: simcuda %+v, report %v", dev, rep)
			}
			warned := strings.Contains(res.Stderr, "does not support managed memory")
			if warned != tc.warn || strings.Count(res.Stderr, "does not support managed memory") > 1 {
				t.Errorf("fallback warning: %q", res.Stderr)
			}
		})
	}
}

func TestHostLimit(t *testing.T) {
	res := harness.Run(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=16MiB", "SPILLWAY_OVERSUBSCRIBE=1",
		"SPILLWAY_HOST_LIMIT=8MiB", "SPILLWAY_LOG_LEVEL=error"}, spilldemo(t), "8", "4"))
	if res.ExitCode != 1 || !strings.Contains(res.Stderr, "cudaMalloc(&chunk[i], bytes) failed: cudaErrorMemoryAllocation") {
		t.Errorf("past the host limit: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
}

func TestSpillwayRunOversubscribe(t *testing.T) {
	cmd := harness.Command(t, harness.Bin(t, "spillway"), "run", "--memory-limit", "16MiB", "--oversubscribe",
		"--spill", "pinned", "--host-limit", "64MiB", "--report", "--", spilldemo(t), "8", "4")
	res, _ := harness.RunOK(t, cmd)
	if rep := reportOf(t, res.Stderr, 0); rep["spilled"] == 0 || rep["promoted_total"] != 0 {
		t.Errorf("spillway run --oversubscribe --spill pinned: %v", rep)
	}
	cmd = harness.Command(t, harness.Bin(t, "spillway"), "run", "--pool=true", "--free-sync", "--pool-reserve", "1GiB",
		"--pool-release-threshold", "10%", "--", "sh", "-c", `echo "$SPILLWAY_POOL $SPILLWAY_FREE_SYNC $SPILLWAY_POOL_RESERVE $SPILLWAY_POOL_RELEASE_THRESHOLD $SPILLWAY_OVERSUBSCRIBE"`)
	if res, _ := harness.RunOK(t, cmd); strings.TrimSpace(res.Stdout) != "1 1 1GiB 10%" {
		t.Errorf("flags became %q", res.Stdout)
	}
	for _, args := range [][]string{{"--spill", "disk"}, {"--host-limit", "lots"}, {"--pool-release-threshold", "150%"}} {
		res := harness.Run(t, harness.Command(t, harness.Bin(t, "spillway"), append(append([]string{"run"}, args...), "--", "/bin/true")...))
		if res.ExitCode != 2 || !strings.Contains(res.Stderr, args[1]) || !strings.Contains(res.Stderr, "valid example") {
			t.Errorf("spillway run %v: exit %d, stderr %q", args, res.ExitCode, res.Stderr)
		}
	}
}

// TestManagedTakesPoolCache: what the pool holds cached goes back to the
// device when memory counted outside the pool (here the application's
// managed memory) does not fit beside it, whether the cache was freed and
// synchronized, freed and waiting for a synchronization, or freed in
// stream order; simcuda's figures are the ground truth.
func TestManagedTakesPoolCache(t *testing.T) {
	prog := cudaops(t)
	for _, tc := range []struct {
		name string
		free []string
	}{
		{"synchronized", []string{"f", "0", "s"}},
		{"pending", []string{"f", "0"}},
		{"stream-ordered", []string{"F", "0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stats := filepath.Join(t.TempDir(), "stats.json")
			env := []string{"SPILLWAY_MEMORY_LIMIT=16MiB", "SPILLWAY_POOL_RELEASE_THRESHOLD=100%", "SPILLWAY_REPORT=1",
				"SIMCUDA_STATS_FILE=" + stats}
			// 12 MiB of the pool's, cached once freed; then 8 MiB of managed memory.
			ops := append(append([]string{"m", "12M"}, tc.free...), "i", "M", "8M", "i")
			res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, ops...))
			if out.Code(t, "m", 0) != 0 || out.Num(t, "i", 0, 2) != 16<<20 {
				t.Fatalf("the pool's block, freed, must be cached and reported free: %v", out)
			}
			if out.Code(t, "M", 0) != 0 {
				t.Fatalf("managed memory that fits once the pool's cache is returned was refused: %v\n%s", out, res.Stderr)
			}
			dev := harness.ReadStats(t, stats).Devices[0]
			held := dev.DeviceBytes + dev.ManagedDeviceBytes + dev.ManagedHostBytes
			rep := reportOf(t, res.Stderr, 0)
			if held != 8<<20 || rep["reserved"] != 0 || rep["segments_released"] != 1 {
				t.Errorf("the device holds %d bytes (simcuda %+v), want the managed block's %d; report %v", held, dev, 8<<20, rep)
			}
			if free := out.Num(t, "i", 1, 2); free != 16<<20-held {
				t.Errorf("cudaMemGetInfo reports %d free, want %d", free, 16<<20-held)
			}
		})
	}
}

// TestReportCountsRefusalsOutsideThePool: a request the quota refuses
// outside the pool (the program's own managed memory, its cuMemCreate, an
// allocation in a context it created) counts in the report's refused, as
// the pool's own refusals do: spillway trace's pool.refusals and spillway
// stat's refusals say refused requests, and count each of them.
func TestReportCountsRefusalsOutsideThePool(t *testing.T) {
	env := []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_REPORT=1", "SPILLWAY_VMM=0"}
	for _, run := range []struct {
		name string
		prog string
		ops  []string
		// refused are the steps the quota refuses, after the first, which
		// fills it.
		refused []string
	}{
		{"managed memory", drvops(t, "dynamic"), []string{"m", "64M", "M", "4K", "m", "4K"}, []string{"M", "m"}},
		{"cuMemCreate and a created context", ctxvmm(t, false), []string{"m", "64M", "c", "2M", "C", "m", "4K"}, []string{"c", "m"}},
	} {
		t.Run(run.name, func(t *testing.T) {
			res, out := harness.RunOK(t, harness.Shimmed(t, env, run.prog, run.ops...))
			if out.Code(t, "m", 0) != 0 {
				t.Fatalf("the first allocation failed: %v", out)
			}
			for _, op := range run.refused {
				n := out.Count(op) - 1
				if got := out.Code(t, op, n); got != cuOutOfMemory {
					t.Fatalf("%s #%d returned %d, want CUDA_ERROR_OUT_OF_MEMORY: %v", op, n, got, out)
				}
			}
			if got := reportOf(t, res.Stderr, 0)["refused"]; got != uint64(len(run.refused)) {
				t.Errorf("report: refused=%d, want %d (every refusal for the quota)\n%s", got, len(run.refused), res.Stderr)
			}
		})
	}
}
