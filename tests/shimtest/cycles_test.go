package shimtest

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// cyclesFew and cyclesMany are the two lengths of a run of cycles compared:
// what a cycle leaves behind shows 4,500 times over in the longer one.
const cyclesFew, cyclesMany = 500, 5000

// cyclesLeft runs testdata/cycles.c's mode for n cycles under the shim and
// returns simcuda's statistics at exit. Every call of every cycle must have
// succeeded: under a quota of a few cycles' memory, a cycle whose bytes the
// shim did not give back makes the next ones fail.
func cyclesLeft(t *testing.T, prog, mode string, n int, env []string) harness.Stats {
	t.Helper()
	stats := filepath.Join(t.TempDir(), "stats.json")
	_, out := harness.RunOK(t, harness.Shimmed(t, append(env, "SIMCUDA_STATS_FILE="+stats), prog, mode, strconv.Itoa(n)))
	if failed := out.Num(t, "end", 0, 1); failed != 0 {
		t.Fatalf("%s, %d cycles: %d calls failed: %v", mode, n, failed, out)
	}
	return harness.ReadStats(t, stats)
}

// Cycles a long-running program repeats (a server for weeks, a training job
// of millions of steps) leave nothing behind in CUDA: the events and streams
// the shim makes for its pool (stream markers, frees in flight) are
// destroyed or reused, however many cycles run, and the quota gets every
// byte back (cyclesLeft). Contexts and resets are left out: the streams and
// events made in a context go with its destruction or reset, not with a
// call counted here, so these counts say nothing of the shim there.
func TestCyclesLeaveNoCUDAObjects(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/cycles.c"}, Cudart: true, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lcuda", "-lnvidia-ml", "-ldl"}})
	small := []string{"SPILLWAY_MEMORY_LIMIT=8MiB"}
	for _, c := range []struct {
		mode string
		env  []string
	}{
		{"stream", small}, {"perthread", small}, {"mempool", small}, {"vmm", small}, {"host", small},
		{"graph", small}, {"nvml", small},
		{"spill", []string{"SPILLWAY_MEMORY_LIMIT=4MiB", "SPILLWAY_OVERSUBSCRIBE=1"}},
		{"churn", []string{"SPILLWAY_MEMORY_LIMIT=2GiB"}},
		{"churn", []string{"SPILLWAY_MEMORY_LIMIT=2GiB", "SPILLWAY_POOL=0"}},
		// Streams of another context or device destroyed, each with a
		// block freed on it, while every request hits the pool's cache.
		{"foreign", []string{"SPILLWAY_MEMORY_LIMIT=1GiB"}},
		{"otherdev", []string{"SPILLWAY_MEMORY_LIMIT=1GiB", "SIMCUDA_DEVICES=2x16GiB"}},
	} {
		t.Run(c.mode, func(t *testing.T) {
			live := func(s harness.Stats, create, destroy string) int64 {
				return int64(s.Calls[create]) - int64(s.Calls[destroy])
			}
			few := cyclesLeft(t, prog, c.mode, cyclesFew, c.env)
			many := cyclesLeft(t, prog, c.mode, cyclesMany, c.env)
			// The pool keeps up to 64 events aside for its next markers.
			if f, m := live(few, "cuEventCreate", "cuEventDestroy_v2"), live(many, "cuEventCreate", "cuEventDestroy_v2"); m > f+64 {
				t.Errorf("events left at exit: %d after %d cycles, %d after %d", f, cyclesFew, m, cyclesMany)
			}
			if f, m := live(few, "cuStreamCreate", "cuStreamDestroy_v2"), live(many, "cuStreamCreate", "cuStreamDestroy_v2"); m > f {
				t.Errorf("streams left at exit: %d after %d cycles, %d after %d", f, cyclesFew, m, cyclesMany)
			}
		})
	}
}

// Contexts created and destroyed, and devices reset, give the quota back
// every byte allocated in them, however many times: under a quota of a few
// cycles' memory, one cycle's bytes kept would fail the cycles after.
func TestContextAndResetCyclesGiveBackTheQuota(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/cycles.c"}, Cudart: true, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lcuda", "-lnvidia-ml", "-ldl"}})
	// A context cycle leaves 4 KiB allocated in it, which its destruction
	// frees: a quota that 256 cycles' 4 KiB would fill.
	for _, c := range []struct {
		mode   string
		cycles int
		quota  string
	}{{"ctx", 400, "1MiB"}, {"reset", 2000, "8MiB"}} {
		t.Run(c.mode, func(t *testing.T) {
			cyclesLeft(t, prog, c.mode, c.cycles, []string{"SPILLWAY_MEMORY_LIMIT=" + c.quota})
		})
	}
}
