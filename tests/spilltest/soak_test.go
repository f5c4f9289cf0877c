package spilltest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// soakDuration is how long TestSoak runs: SPILLTEST_SOAK (a Go duration,
// e.g. 10m, with go test -timeout above it by two minutes), 20 s by default.
func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("SPILLTEST_SOAK")
	if v == "" {
		return 20 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 2*time.Second {
		t.Fatalf("SPILLTEST_SOAK=%q: want a duration of at least 2s, e.g. 10m", v)
	}
	if deadline, ok := t.Deadline(); ok && time.Until(deadline) < d+time.Minute {
		t.Fatalf("SPILLTEST_SOAK=%v does not fit go test's -timeout (%v left): give -timeout %v or more",
			d, time.Until(deadline).Round(time.Second), d+2*time.Minute)
	}
	return d
}

// soakFaults makes simcuda fail calls of every runtime function the shim
// uses beneath the application, at call numbers spread over a run (at most
// 32 items, simcuda's limit).
const soakFaults = "cudaMalloc:40,cudaMalloc:4000,cudaFree:30,cudaFree:3000," +
	"cudaMallocManaged:20,cudaMallocManaged:2000,cudaMemAdvise:10,cudaMemAdvise:1001," +
	"cudaMemPrefetchAsync:3,cudaMemPrefetchAsync:300,cudaStreamSynchronize:7,cudaStreamSynchronize:700," +
	"cudaEventCreateWithFlags:3,cudaEventCreateWithFlags:300,cudaEventRecord:50,cudaEventRecord:5000," +
	"cudaEventQuery:100,cudaEventQuery:10000,cudaEventSynchronize:2,cudaDeviceSynchronize:4," +
	"cudaDeviceSynchronize:400,cudaMallocAsync:6,cudaMallocAsync:6000,cudaFreeAsync:8,cudaFreeAsync:8000," +
	"cudaStreamQuery:9,cudaEventDestroy:11,cudaMallocPitch:13"

// TestSoak runs 8 threads of oversubscribed allocations with faults
// injected in every underlying call: no panic, the device never above the
// quota (simcuda's ground truth), resident memory flat, contents intact,
// and everything the pool holds accounted at the end.
func TestSoak(t *testing.T) {
	const quota = 64 * miB
	dur := soakDuration(t)
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/soak.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-pthread"}})
	env, statsFile := spillEnv(t, quota, 256*miB, "SIMCUDA_FAIL="+soakFaults, "SPILLWAY_POOL_RELEASE_THRESHOLD=0",
		"GODEBUG=gctrace=1") // the Go heap after each collection, on standard error
	cmd := harness.Shimmed(t, env, prog, fmt.Sprint(int(dur.Seconds())))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dur+2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("soak: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), tail(stderr.String()))
		}
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Fatalf("soak did not finish within %v\nstdout:\n%s\nstderr:\n%s", dur+2*time.Minute, stdout.String(), tail(stderr.String()))
	}
	out := harness.ParseOutput(stdout.String())
	if want := filepath.Join(harness.LibDir(t), "libspillway-core.so"); strings.Join(out.Line(t, "core", 0), " ") != "core "+want {
		t.Errorf("the soak ran over %v, not the core %s", out.Line(t, "core", 0), want)
	}
	if strings.Contains(stderr.String(), "internal error") {
		t.Errorf("the core panicked:\n%s", tail(stderr.String()))
	}
	allocs, failed, corrupt := out.Num(t, "done", 0, 1), out.Num(t, "done", 0, 2), out.Num(t, "done", 0, 3)
	if allocs == 0 || failed == allocs || corrupt != 0 {
		t.Errorf("%d allocations, %d failed, %d blocks corrupt", allocs, failed, corrupt)
	}
	checkFlat(t, out, stderr.String())
	r := harness.ReportFor(t, stderr.String(), 0)
	s := harness.ReadStats(t, statsFile).Devices[0]
	if s.DeviceBytesPeak > quota {
		t.Errorf("simcuda's device_bytes_peak %d is above the quota %d", s.DeviceBytesPeak, quota)
	}
	if r.Live != 0 || r.Spilled != 0 || r.Promoted != 0 {
		t.Errorf("after every block was freed: %+v", r)
	}
	if s.DeviceBytes != r.Reserved {
		t.Errorf("simcuda holds %d bytes on the device at exit, the pool %d", s.DeviceBytes, r.Reserved)
	}
	t.Logf("%v: %d allocations (%d refused or failed), device peak %d of %d, at exit %d bytes in %d allocations",
		dur, allocs, failed, s.DeviceBytesPeak, quota, s.DeviceBytes, s.LiveAllocations)
}

// soakSample is one "rss" line of the soak program.
type soakSample struct {
	rssKiB, cHeapKiB, allocs, threads uint64
}

// checkFlat compares the second quarter of the run (after a quarter of
// warm-up) with the last quarter: resident memory, the C heap (simcuda runs
// in the process), the threads and the Go heap live after each collection
// must not grow with the work done. A leak grows in proportion to the
// allocations made; noise does not, so growth is a failure only when it is
// both above a fixed allowance and above a few bytes per allocation made in
// between (the leaks fixed so far cost 30 to 50 bytes per allocation).
func checkFlat(t *testing.T, out harness.Output, stderr string) {
	t.Helper()
	var samples []soakSample
	for i := 0; i < out.Count("rss"); i++ {
		samples = append(samples, soakSample{out.Num(t, "rss", i, 2), out.Num(t, "rss", i, 3),
			out.Num(t, "rss", i, 4), out.Num(t, "rss", i, 5)})
	}
	n := len(samples)
	if n < 8 {
		t.Fatalf("%d memory samples, want at least 8", n)
	}
	early, late := samples[n/4:n/2], samples[3*n/4:]
	median := func(ss []soakSample, f func(soakSample) uint64) uint64 {
		v := make([]uint64, len(ss))
		for i := range ss {
			v[i] = f(ss[i])
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	allocs := median(late, func(s soakSample) uint64 { return s.allocs }) - median(early, func(s soakSample) uint64 { return s.allocs })
	for _, m := range []struct {
		what          string
		value         func(soakSample) uint64
		allowanceKiB  uint64
		bytesPerAlloc uint64
	}{
		{"resident memory", func(s soakSample) uint64 { return s.rssKiB }, 4 << 10, 16},
		{"the C heap", func(s soakSample) uint64 { return s.cHeapKiB }, 256, 4},
	} {
		from, to := median(early, m.value), median(late, m.value)
		t.Logf("%s: %d KiB in the second quarter, %d KiB in the last (%d allocations in between)", m.what, from, to, allocs)
		if to > from+m.allowanceKiB && (to-from)<<10 > m.bytesPerAlloc*allocs {
			t.Errorf("%s grew from %d KiB to %d KiB over %d allocations (%d bytes each)", m.what, from, to, allocs, (to-from)<<10/max(allocs, 1))
		}
	}
	threads := func(s soakSample) uint64 { return s.threads }
	if from, to := median(early, threads), median(late, threads); to > from+4 {
		t.Errorf("the process's threads grew from %d to %d", from, to)
	}
	// gctrace: "gc N @T.Ts ...: ..., A->B->C MB, ...": C is the heap live after the collection.
	gc := regexp.MustCompile(`(?m)^gc \d+ @([0-9.]+)s .*->(\d+) MB, `).FindAllStringSubmatch(stderr, -1)
	if len(gc) == 0 {
		t.Fatal("no garbage collection traced (GODEBUG=gctrace=1)")
	}
	end, _ := strconv.ParseFloat(gc[len(gc)-1][1], 64)
	var earlyMB, lateMB uint64
	for _, g := range gc {
		at, _ := strconv.ParseFloat(g[1], 64)
		live, _ := strconv.ParseUint(g[2], 10, 64)
		switch {
		case at >= end/4 && at < end/2:
			earlyMB = max(earlyMB, live)
		case at >= 3*end/4:
			lateMB = max(lateMB, live)
		}
	}
	t.Logf("Go heap live after collection: at most %d MB in the second quarter, %d MB in the last (%d collections)", earlyMB, lateMB, len(gc))
	if lateMB > earlyMB+2 {
		t.Errorf("the Go heap live after collection grew from %d MB to %d MB", earlyMB, lateMB)
	}
}

func tail(s string) string {
	if len(s) > 4000 {
		return "..." + s[len(s)-4000:]
	}
	return s
}
