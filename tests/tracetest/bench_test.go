package tracetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-gpu/spillway/bpf"
	"github.com/spillway-gpu/spillway/tests/harness"
)

// timePerPair runs `workload pairs n` and returns the nanoseconds per pair
// the workload measured around its loop (so process start-up is left out).
func timePerPair(b *testing.B, workload string, n int, env ...string) float64 {
	return timePerOp(b, workload, "pairs", n, env...)
}

// timePerOp runs `workload mode n`, which prints the nanoseconds its loop
// of n operations took, and returns the nanoseconds per operation.
func timePerOp(b *testing.B, workload, mode string, n int, env ...string) float64 {
	b.Helper()
	cmd := exec.Command(workload, mode, strconv.Itoa(n))
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("workload: %v", err)
	}
	ns, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	if err != nil {
		b.Fatalf("workload printed %q, want nanoseconds", out)
	}
	return ns / float64(n)
}

// The cost of a cudaMalloc+cudaFree pair with no session, the baseline.
func BenchmarkAllocFreePairUntraced(b *testing.B) {
	_, workload := fakeCUDA(b)
	b.ResetTimer()
	ns := timePerPair(b, workload, max(b.N, 1000))
	b.ReportMetric(ns, "ns/pair")
}

// The same pair while a session traces the process: cudaMalloc and cudaFree
// each enter the runtime and the driver (two uprobes, two uretprobes) and emit
// one record.
func BenchmarkAllocFreePairTraced(b *testing.B) {
	tr, workload := tracedFakeCUDA(b, bpf.Options{})
	// Trace every workload this benchmark starts: they are children of this
	// process.
	if err := tr.Follow(selfPID()); err != nil {
		b.Fatal(err)
	}
	wait := collect(b, tr)
	b.ResetTimer()
	n := max(b.N, 1000)
	ns := timePerPair(b, workload, n)
	b.StopTimer()
	sum := wait()
	if got := sum.Calls["cudaMalloc"]; got != uint64(n) {
		b.Fatalf("traced %d cudaMalloc calls, want %d", got, n)
	}
	b.ReportMetric(ns, "ns/pair")
	b.ReportMetric(float64(sum.Drops), "drops")
}

// The rate of records the session takes without drops: a process faulting on
// fresh pages as fast as it can, one record per fault.
func BenchmarkFaultRecordRate(b *testing.B) {
	tr, workload := tracedFakeCUDA(b, bpf.Options{})
	if err := tr.Follow(selfPID()); err != nil {
		b.Fatal(err)
	}
	wait := collect(b, tr)
	pages := max(b.N, 20000)
	b.ResetTimer()
	start := time.Now()
	if out, err := exec.Command(workload, "spill", strconv.Itoa(pages)).CombinedOutput(); err != nil {
		b.Fatalf("workload: %v\n%s", err, out)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	sum := wait()
	if sum.PageFaults.Spilled != uint64(pages) {
		b.Errorf("faults on spilled memory = %d, want %d", sum.PageFaults.Spilled, pages)
	}
	b.ReportMetric(float64(sum.PageFaults.Total)/elapsed.Seconds(), "records/s")
	b.ReportMetric(float64(sum.Drops), "drops")
}

// The rate of records the session takes without drops from a process firing
// a probe point as fast as it can, one record per call: what the ring
// buffer and its reader sustain, with the cheapest kind of uprobe.
func BenchmarkProbeRecordRate(b *testing.B) {
	tr, workload := tracedFakeCUDA(b, bpf.Options{})
	if err := tr.Follow(selfPID()); err != nil {
		b.Fatal(err)
	}
	wait := collect(b, tr)
	n := max(b.N, 100000)
	b.ResetTimer()
	ns := timePerOp(b, workload, "probes", n)
	b.StopTimer()
	sum := wait()
	if sum.Pool.Syncs+sum.Drops != uint64(n) {
		b.Errorf("read %d records and dropped %d of %d", sum.Pool.Syncs, sum.Drops, n)
	}
	b.ReportMetric(1e9/ns, "records/s")
	b.ReportMetric(float64(sum.Drops), "drops")
}

// The same pair in a program running under the shim against the simulated
// CUDA, with and without a session: what an operator pays on a real stack,
// where the shim's cudaMalloc and cudaFree are the outermost layer and the
// pool answers most calls without reaching the runtime.
func BenchmarkShimAllocFreePair(b *testing.B) {
	workload := harness.Compile(b, harness.CBuild{
		Sources: []string{"testdata/simworkload.c"}, Cudart: true, ProjectHeaders: true, Flags: []string{"-lcuda"},
	})
	env := []string{
		"LD_PRELOAD=" + filepath.Join(harness.LibDir(b), "libspillway.so"),
		"LD_LIBRARY_PATH=" + harness.SimcudaDir(b),
		"SIMCUDA_STATE_DIR=" + b.TempDir(),
	}
	b.Run("untraced", func(b *testing.B) {
		b.ReportMetric(timePerPair(b, workload, max(b.N, 1000), env...), "ns/pair")
	})
	b.Run("traced", func(b *testing.B) {
		harness.RequireBPF(b)
		tr := newTracer(b, bpf.Options{})
		for _, lib := range []string{
			filepath.Join(harness.LibDir(b), "libspillway.so"),
			filepath.Join(harness.SimcudaDir(b), "libcudart.so.12"),
			filepath.Join(harness.SimcudaDir(b), "libcuda.so.1"),
		} {
			if err := tr.AttachFile(lib); err != nil {
				b.Fatal(err)
			}
		}
		if err := tr.Follow(selfPID()); err != nil {
			b.Fatal(err)
		}
		wait := collect(b, tr)
		n := max(b.N, 1000)
		ns := timePerPair(b, workload, n, env...)
		sum := wait()
		if got := sum.Calls["cudaMalloc"]; got != uint64(n) {
			b.Fatalf("traced %d cudaMalloc calls, want %d", got, n)
		}
		b.ReportMetric(ns, "ns/pair")
		b.ReportMetric(float64(sum.Drops), "drops")
	})
}
