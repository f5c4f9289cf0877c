package simcudatest

// Tests of simcuda's driver contexts, device attributes and the entry points
// real driver-API clients bind, from testdata/contexts.c linked against
// libcuda alone.

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

func TestContexts(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/contexts.c"},
		ProjectHeaders: true,
		Flags:          []string{"-L", harness.SimcudaDir(t), "-lcuda"},
	})
	cases := []struct {
		name string
		env  []string
		why  string
	}{
		{"stack", nil, "push, pop, set, create, destroy, attach and detach follow CUDA's per-thread context stack"},
		{"per_thread", nil, "a new thread has no current context"},
		{"ownership", nil, "memory belongs to the context it was allocated in; destroying the context frees it"},
		{"free_without_context", nil, "cuMemFree_v2 finds the owner from the pointer, with no context current"},
		{"context_bytes", []string{"SIMCUDA_CONTEXT_BYTES=256MiB"}, "a created context takes its bytes and gives them back"},
		{"attributes", []string{"SIMCUDA_DEVICES=80GiB"}, "every CUdevice_attribute of CUDA 12.4 answers, nothing beyond"},
		{"not_supported", nil, "IPC handles are exported and refused with CUDA_ERROR_NOT_SUPPORTED"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Logf("expect: %s", c.why)
			stats := filepath.Join(t.TempDir(), "stats.json")
			cmd := harness.Command(t, bin, c.name)
			harness.SetEnv(cmd, append([]string{"SIMCUDA_STATS_FILE=" + stats}, c.env...)...)
			res := harness.Run(t, cmd)
			if res.ExitCode != 0 || !strings.Contains(res.Stdout, "PASS "+c.name) {
				t.Fatalf("contexts %s: exit %d\nstdout:\n%s\nstderr:\n%s", c.name, res.ExitCode, res.Stdout, res.Stderr)
			}
			dev := harness.ReadStats(t, stats).Devices[0]
			if dev.DeviceBytes != 0 || dev.LiveAllocations != 0 {
				t.Fatalf("device stats at exit %+v, want nothing left after every context is gone", dev)
			}
		})
	}
}
