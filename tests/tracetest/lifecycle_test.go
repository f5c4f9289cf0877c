package tracetest

import (
	"bufio"
	"path/filepath"
	"testing"

	"github.com/spillway-gpu/spillway/bpf"
	"github.com/spillway-gpu/spillway/tests/harness"
)

// startCopying starts `simworkload copies` under the shim and returns once
// it is calling, again and again until the test ends.
func startCopying(t *testing.T, workload string) int {
	t.Helper()
	cmd := harness.Command(t, workload, "copies")
	harness.SetEnv(cmd, "LD_PRELOAD="+filepath.Join(harness.LibDir(t), "libspillway.so"))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if !bufio.NewScanner(stdout).Scan() {
		t.Fatal("simworkload copies ended before its first round")
	}
	return cmd.Process.Pid
}

// A session attached to a program that calls through the shim all the while
// counts each call once, where the program makes it: the shim, the runtime
// and the driver it maps are all probed before its calls are recorded, so
// that no call is counted at a layer below (what the shim or the runtime
// calls while serving it) or lost while only some layers are probed. Only
// the call under way on its one thread when the session attached may be
// seen at a layer below.
func TestAttachWhileCallingCountsOutermostLayer(t *testing.T) {
	harness.RequireBPF(t)
	pid := startCopying(t, simWorkload(t))
	// Each session's probing takes milliseconds, while which calls fall
	// in between is up to the scheduler: three make a miss unlikely.
	for session := range 3 {
		tr, err := bpf.New(bpf.Options{})
		if err != nil {
			t.Fatal(err)
		}
		wait := collect(t, tr)
		if err := tr.Trace(pid); err != nil {
			t.Fatal(err)
		}
		sum := wait()
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
		mallocs, copies, frees := sum.Calls["cudaMalloc"], sum.Calls["cudaMemcpy"], sum.Calls["cudaFree"]
		var others uint64
		for fn, n := range sum.Calls {
			if fn != "cudaMalloc" && fn != "cudaMemcpy" && fn != "cudaFree" {
				others += n
			}
		}
		near := func(a, b uint64) bool { return a <= b+2 && b <= a+2 }
		if others > 1 || !near(copies, mallocs) || !near(frees, mallocs) || sum.Unpaired != 0 {
			t.Errorf("session %d: calls = %v, unpaired %d; the program calls only cudaMalloc, cudaMemcpy and cudaFree in turn (drops %d)",
				session, sum.Calls, sum.Unpaired, sum.Drops)
		}
	}
}
