package spilltest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// soakDuration is how long TestSoak runs: SPILLTEST_SOAK (a Go duration,
// e.g. 10m), 20 s by default.
func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("SPILLTEST_SOAK")
	if v == "" {
		return 20 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 2*time.Second {
		t.Fatalf("SPILLTEST_SOAK=%q: want a duration of at least 2s, e.g. 10m", v)
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
	env, statsFile := spillEnv(t, quota, 256*miB, "SIMCUDA_FAIL="+soakFaults, "SPILLWAY_POOL_RELEASE_THRESHOLD=0")
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
	if strings.Contains(stderr.String(), "internal error") {
		t.Errorf("the core panicked:\n%s", tail(stderr.String()))
	}
	allocs, failed, corrupt := out.Num(t, "done", 0, 1), out.Num(t, "done", 0, 2), out.Num(t, "done", 0, 3)
	if allocs == 0 || failed == allocs || corrupt != 0 {
		t.Errorf("%d allocations, %d failed, %d blocks corrupt", allocs, failed, corrupt)
	}
	// Resident memory after the first quarter of the run against the end.
	var rss []uint64
	for i := range out {
		if out[i][0] == "rss" {
			rss = append(rss, out.Num(t, "rss", len(rss), 2))
		}
	}
	if len(rss) < 4 {
		t.Fatalf("%d resident-memory samples", len(rss))
	}
	settled, last := rss[len(rss)/4], rss[len(rss)-1]
	if last > settled+32<<10 {
		t.Errorf("resident memory grew from %d KiB to %d KiB", settled, last)
	}
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
	t.Logf("%v: %d allocations (%d refused or failed), resident %d -> %d KiB, device peak %d of %d, at exit %d bytes in %d allocations",
		dur, allocs, failed, settled, last, s.DeviceBytesPeak, quota, s.DeviceBytes, s.LiveAllocations)
}

func tail(s string) string {
	if len(s) > 4000 {
		return "..." + s[len(s)-4000:]
	}
	return s
}
