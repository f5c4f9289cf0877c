package shimtest

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// TestPerThreadDefaultStream: a program built with --default-stream
// per-thread calls the runtime's _ptsz/_ptds entry points, which the shim
// does not interpose; the runtime makes them through the driver's
// per-thread entry points, which it does. Its stream-ordered allocations
// are thus counted against the quota and refused beyond it (in every
// thread), freed memory is reused on the thread's stream with the order
// kept, cudaMemGetInfo reports the quota, and simcuda never holds more.
func TestPerThreadDefaultStream(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ptsz.c"}, ProjectHeaders: true,
		Cudart: true, Flags: []string{"-pthread"}})
	undefined, err := exec.Command("nm", "-D", "--undefined-only", prog).Output()
	if err != nil {
		t.Fatal(err)
	}
	if s := string(undefined); !strings.Contains(s, "cudaMallocAsync_ptsz") || strings.Contains(s, " cudaMallocAsync\n") {
		t.Fatalf("the program does not call the per-thread entry points:\n%s", s)
	}
	stats := filepath.Join(t.TempDir(), "stats.json")
	_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SIMCUDA_STATS_FILE=" + stats}, prog))
	checkSteps(t, out, []step{
		{"A", 0, 0}, {"A", 1, 0}, {"A", 2, 0}, {"B", 0, harness.ErrMemoryAllocation}, {"I", 0, 0},
		{"R", 0, 0}, {"V", 0, 0}, {"A", 3, 0}, {"T", 0, harness.ErrMemoryAllocation}, {"F", 0, 0}, {"E", 0, 0},
	})
	if free := out.Num(t, "I", 0, 2); free != 16<<20 {
		t.Errorf("cudaMemGetInfo with 48 MiB allocated: %d bytes free, want 16 MiB of the 64 MiB quota", free)
	}
	if wrong := out.Num(t, "V", 0, 2); wrong != 0 {
		t.Errorf("%d of 4096 bytes read back wrong from a block reused on the thread's stream", wrong)
	}
	if free := out.Num(t, "E", 0, 2); free != 64<<20 {
		t.Errorf("cudaMemGetInfo after every free: %d bytes free, want the 64 MiB quota", free)
	}
	s := harness.ReadStats(t, stats)
	if n := s.Calls["cudaMallocAsync_ptsz"]; n != 7 {
		t.Errorf("simcuda saw %d cudaMallocAsync_ptsz calls, want the program's 7", n)
	}
	if peak := s.Devices[0].DeviceBytesPeak; peak > 64<<20 {
		t.Errorf("simcuda held %d bytes at its peak, above the 64 MiB quota", peak)
	}
}
