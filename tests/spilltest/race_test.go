package spilltest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// raceCore builds the core with Go's race detector into a folder of the
// test's. The race runtime keeps its shadow of a program's memory for
// addresses below 0xe000000000 only, and the loader puts a library near
// 0x7f0000000000, where the runtime fails to start; so the core is linked
// to load at 256 GiB, an address the loader takes as it is when nothing
// is mapped there (nothing is, in a fresh process).
func raceCore(t *testing.T) string {
	t.Helper()
	root := harness.Root(t)
	core := filepath.Join(t.TempDir(), "libspillway-core.so")
	build := exec.Command("go", "build", "-race", "-buildmode=c-shared",
		"-ldflags=-extldflags '-Wl,--version-script="+filepath.Join(root, "shim/core/exports.map")+
			" -Wl,-Ttext-segment=0x4000000000'",
		"-o", core, "./shim/core")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the core with the race detector: %v\n%s", err, out)
	}
	return core
}

// TestSoakRaceFree runs the soak, shorter, over a core built with Go's race
// detector, on fixed segments and on virtual memory: 8 threads come and go,
// allocate, free on their own streams, on per-thread default streams and
// on each other's, spill, promote and meet injected failures, and the
// detector must report no data race in the core. The unit tests of the
// pool and the core run under the detector too, but only a process that
// CUDA's callers drive from many threads exercises the core's entry points
// as they are used.
func TestSoakRaceFree(t *testing.T) {
	core := raceCore(t)
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/soak.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-pthread"}})
	for _, vmm := range []string{"0", "1"} {
		t.Run("vmm="+vmm, func(t *testing.T) {
			logs := filepath.Join(t.TempDir(), "race")
			env, _ := spillEnv(t, 64*miB, 256*miB, "SIMCUDA_FAIL="+soakFaults, "SPILLWAY_VMM="+vmm,
				"SPILLWAY_CORE="+core,
				// The detector writes each report to logs.PID, not to standard error.
				"GORACE=log_path="+logs+" atexit_sleep_ms=0")
			res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, "4"))
			if got := strings.Join(out.Line(t, "core", 0), " "); got != "core "+core {
				t.Fatalf("the soak ran over %q, not the race-detecting core %s", got, core)
			}
			if allocs, corrupt := out.Num(t, "done", 0, 1), out.Num(t, "done", 0, 3); allocs == 0 || corrupt != 0 {
				t.Errorf("%d allocations, %d blocks corrupt", allocs, corrupt)
			}
			reports, err := filepath.Glob(logs + ".*")
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range reports {
				text, err := os.ReadFile(r)
				if err != nil {
					t.Fatal(err)
				}
				t.Errorf("the race detector reported, in %s:\n%s", r, tail(string(text)))
			}
			if strings.Contains(res.Stderr, "DATA RACE") {
				t.Errorf("a data race on standard error:\n%s", tail(res.Stderr))
			}
		})
	}
}
