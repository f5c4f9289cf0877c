package simcudatest

import (
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// TestCapture runs testdata/capture.c, one case per run: stream capture
// with CUDA's rules, graph replay, and the runtime's driver entry points.
func TestCapture(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/capture.c"},
		Cudart:         true,
		ProjectHeaders: true,
		Flags:          []string{"-lcuda", "-ldl"},
	})
	cases := []struct {
		name string
		why  string
	}{
		{"replay", "captured copies, memsets and host functions run only when the graph is launched, in order, reading their sources at launch"},
		{"forbidden", "each call CUDA forbids during a global capture fails with its documented code and invalidates the capture"},
		{"relaxed", "relaxed captures and threads in relaxed mode allow potentially unsafe calls; thread-local captures ignore other threads"},
		{"malloc_async", "cudaMallocAsync in a capture gives memory the graph uses and owns until its last handle goes"},
		{"status", "capture status, the legacy stream beside a capture, wrong thread, fork/join, unjoined and merged captures"},
		{"driver", "the driver's capture entry points, reached through cuGetProcAddress, enforce the same rules"},
		{"entry_points", "cudaGetDriverEntryPoint[ByVersion] return the driver's own pointers and report misses in driverStatus"},
		{"graph_cycles", "destroying a graph and its executable graph frees everything the capture made: capturing per step holds bounded memory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Logf("expect: %s", c.why)
			_, stats := runCase(t, bin, c.name)
			// Everything each case allocates is freed by its end, graphs' memory included.
			if dev := stats.Devices[0]; dev.LiveAllocations != 0 {
				t.Fatalf("%d allocations still live at exit: %+v", dev.LiveAllocations, dev)
			}
		})
	}
}
