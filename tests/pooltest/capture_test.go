package pooltest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// TestGraphCapture captures a CUDA graph as PyTorch and vLLM do while the
// pool is under pressure (testdata/capture.c): in every capture mode, on a
// non-blocking and on a blocking stream, alone and with other threads
// allocating meanwhile. The pool must make no call the capture forbids
// (simcuda invalidates the capture on any, and cudaStreamEndCapture then
// fails), grow or refuse instead of synchronizing, keep the quota by
// simcuda's ground truth, and hold nothing live at the end.
func TestGraphCapture(t *testing.T) {
	const quota = 32 * miB
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/capture.c"}, Cudart: true,
		ProjectHeaders: true})
	for _, mode := range []string{"global", "thread_local", "relaxed"} {
		for _, stream := range []string{"nonblocking", "blocking"} {
			for _, threads := range []int{0, 3} {
				t.Run(fmt.Sprintf("%s/%s/threads=%d", mode, stream, threads), func(t *testing.T) {
					env, statsFile := withStats(t, []string{limit(quota), "SIMCUDA_CONTEXT_BYTES=0"})
					res := harness.Run(t, harness.Shimmed(t, env, prog, mode, stream, fmt.Sprint(threads)))
					out := harness.ParseOutput(res.Stdout)
					if res.ExitCode != 0 || out.Count("PASS") != 1 {
						t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
					}
					if rc, status := out.Num(t, "capture", 0, 1), out.Num(t, "capture", 0, 2); rc != 0 || status != 1 {
						t.Errorf("cudaStreamEndCapture returned %d with the capture status %d before it, want 0 and 1 (active)", rc, status)
					}
					if churn := out.Line(t, "churn", 0); threads > 0 && (churn[1] == "0" || churn[3] != "0") {
						t.Errorf("other threads: %v, want allocations and no corrupt block", churn)
					}
					if free, total := out.Num(t, "info", 0, 1), out.Num(t, "info", 0, 2); free != quota || total != quota {
						t.Errorf("at the end cudaMemGetInfo says free %d of %d, want all of %d", free, total, quota)
					}
					r := harness.ReportFor(t, res.Stderr, 0)
					if r.Live != 0 || r.PeakReserved > quota || r.BackingErrors != 0 {
						t.Errorf("report %+v: want nothing live, the quota kept, no backing error", r)
					}
					if r.Refused == 0 {
						t.Errorf("report %+v: nothing was refused; the test no longer puts the pool under pressure", r)
					}
					// Live, cached and pending blocks fill all but 4 MiB of the
					// quota before the capture.
					if r.PeakReserved+4*miB < quota {
						t.Errorf("report %+v: peak_reserved %d is more than 4 MiB under the quota %d; the test no longer puts the pool under pressure",
							r, r.PeakReserved, quota)
					}
					// A capture on a blocking stream forbids the synchronizations
					// and markers that would make the cached and pending blocks
					// reusable: under this pressure the pool must have wanted one.
					if stream == "blocking" && r.CaptureSkips == 0 {
						t.Errorf("report %+v: capture_skips 0 on a blocking stream; the pool never wanted a synchronization or marker the capture forbids", r)
					}
					t.Logf("peak_reserved %d MiB of %d, capture_skips %d, refused %d",
						r.PeakReserved/miB, uint64(quota)/miB, r.CaptureSkips, r.Refused)
					s := harness.ReadStats(t, statsFile).Devices[0]
					if s.DeviceBytesPeak > quota {
						t.Errorf("simcuda's device_bytes_peak %d is above the quota %d", s.DeviceBytesPeak, quota)
					}
					if s.DeviceBytes != r.Reserved {
						t.Errorf("simcuda holds %d bytes at exit, the pool %d", s.DeviceBytes, r.Reserved)
					}
					if strings.Contains(res.Stderr, "internal error") {
						t.Errorf("the core panicked:\n%s", res.Stderr)
					}
				})
			}
		}
	}
}

// TestGraphKeepsCapturedFrees: a block allocated and freed in a capture is
// the graph's (testdata/graphfree.c): an allocation made after the capture
// never gets its address while the graph or its executable graph exists, so
// launching the graph never overwrites it; once both are destroyed the
// block is free again. Through the runtime and the driver; and a capture
// that fails ("invalidated") destroys its graph: what was freed into it is
// free again. Nothing stays live, and simcuda holds at exit what the pool
// reserves.
func TestGraphKeepsCapturedFrees(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/graphfree.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-lcuda"}})
	for _, c := range []string{"runtime", "driver", "invalidated"} {
		t.Run(c, func(t *testing.T) {
			env, statsFile := withStats(t, []string{limit(64 * miB), "SIMCUDA_CONTEXT_BYTES=0"})
			res := harness.Run(t, harness.Shimmed(t, env, prog, c))
			out := harness.ParseOutput(res.Stdout)
			if res.ExitCode != 0 || out.Count("PASS") != 1 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
			}
			if c == "invalidated" {
				if end := out.Num(t, "end", 0, 1); end != 901 { // cudaErrorStreamCaptureInvalidated
					t.Errorf("cudaStreamEndCapture returned %d, want 901 (invalidated)", end)
				}
				if out.Num(t, "reused", 0, 1) != 1 {
					t.Errorf("the block freed in the failed capture was not free again")
				}
			} else {
				if same, intact := out.Num(t, "same_address", 0, 1), out.Num(t, "intact", 0, 1); same != 0 || intact != 1 {
					t.Errorf("the block allocated after the capture: same address as the graph's %d, intact %d; want 0 and 1", same, intact)
				}
				if out.Num(t, "reused", 0, 1) != 1 {
					t.Errorf("the graph's block was not reused once the graphs were destroyed")
				}
			}
			r := harness.ReportFor(t, res.Stderr, 0)
			if r.Live != 0 {
				t.Errorf("report %+v: want nothing live at the end", r)
			}
			if s := harness.ReadStats(t, statsFile).Devices[0]; s.DeviceBytes != r.Reserved {
				t.Errorf("simcuda holds %d bytes at exit, the pool %d", s.DeviceBytes, r.Reserved)
			}
		})
	}
}
