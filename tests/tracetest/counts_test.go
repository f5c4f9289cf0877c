package tracetest

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"testing"

	"github.com/spillway-gpu/spillway/bpf"
	"github.com/spillway-gpu/spillway/tests/harness"
)

const rounds = 50

// wantCounts is what `workload counts rounds` does, counted once per call at
// the layer the program called: the runtime's calls into the driver are
// nested and not counted.
func checkCounts(t *testing.T, sum *bpf.Summary, pid int) {
	t.Helper()
	wantCalls := map[string]uint64{
		"cudaMalloc":      2 * rounds,
		"cudaFree":        2 * rounds,
		"cudaMemcpy":      3 * rounds,
		"cudaMemcpyAsync": rounds,
		"cuMemAlloc_v2":   rounds,
		"cuMemcpyHtoD_v2": rounds,
		"cuMemFree_v2":    rounds,
	}
	if !maps.Equal(sum.Calls, wantCalls) {
		t.Errorf("calls = %v, want %v", sum.Calls, wantCalls)
	}
	wantBytes := map[string]uint64{
		"h2d":     rounds * (1000 + 64),
		"d2h":     rounds * 700,
		"d2d":     rounds * 300,
		"default": rounds * 50,
		"h2h":     0,
	}
	if !maps.Equal(sum.MemcpyBytes, wantBytes) {
		t.Errorf("memcpy_bytes = %v, want %v", sum.MemcpyBytes, wantBytes)
	}
	if want := uint64(rounds * (2*4096 + 8192)); sum.AllocBytes != want {
		t.Errorf("alloc_bytes = %d, want %d", sum.AllocBytes, want)
	}
	wantPool := bpf.PoolCounts{
		Allocs: 2 * rounds, CacheHits: rounds, DeviceReservations: rounds,
		Frees: rounds, Syncs: rounds, SyncReusableBytes: rounds * 4096,
		Refusals: rounds, RefusedBytes: rounds << 20,
	}
	if sum.Pool != wantPool {
		t.Errorf("pool = %+v, want %+v", sum.Pool, wantPool)
	}
	if len(sum.Errors) != 0 || sum.Unpaired != 0 {
		t.Errorf("errors = %v, unpaired = %d, want none", sum.Errors, sum.Unpaired)
	}
	if sum.Drops != 0 {
		t.Errorf("drops = %d, want 0", sum.Drops)
	}
	for key, p := range sum.Processes {
		if key != pidKey(pid) && p.Calls != 0 {
			t.Errorf("process %s (not the workload %d) has %d calls", key, pid, p.Calls)
		}
	}
}

// A process traced from before its first call: every call is counted once,
// whether the probes are attached with a link per file or per function.
func TestCountsExact(t *testing.T) {
	harness.RequireBPF(t)
	lib, workload := fakeCUDA(t)
	for _, perSymbol := range []bool{false, true} {
		t.Run(fmt.Sprintf("PerSymbolLinks=%v", perSymbol), func(t *testing.T) {
			testCounts(t, lib, workload, bpf.Options{PerSymbolLinks: perSymbol})
		})
	}
}

func testCounts(t *testing.T, lib, workload string, opts bpf.Options) {
	tr := newTracer(t, opts)
	if err := tr.AttachFile(lib); err != nil {
		t.Fatal(err)
	}
	wait := collect(t, tr)
	w := startGated(t, workload, "counts", "50")
	if err := tr.Trace(w.pid()); err != nil {
		t.Fatal(err)
	}
	w.release(t)
	checkCounts(t, wait(), w.pid())
}

// A process already running when the session starts (it waits on a pipe) is
// found through /proc/PID/maps, with no file named in advance.
func TestAttachRunning(t *testing.T) {
	harness.RequireBPF(t)
	_, workload := fakeCUDA(t)
	w := startGated(t, workload, "counts", "50")
	tr := newTracer(t, bpf.Options{})
	wait := collect(t, tr)
	if err := tr.Trace(w.pid()); err != nil {
		t.Fatal(err)
	}
	if len(tr.Files()) == 0 {
		t.Fatalf("no probed file found in the maps of pid %d", w.pid())
	}
	w.release(t)
	checkCounts(t, wait(), w.pid())
}

// Records that do not fit in the ring buffer are counted in the kernel, not
// lost silently: with a one-page buffer read only after the workload ends,
// what was read and what was dropped add up to at least its 800 call and
// probe-point records.
func TestDropsCounted(t *testing.T) {
	tr, workload := tracedFakeCUDA(t, bpf.Options{RingBufferSize: os.Getpagesize()})
	w := startGated(t, workload, "counts", "50")
	if err := tr.Trace(w.pid()); err != nil {
		t.Fatal(err)
	}
	w.release(t)
	sum := collect(t, tr)()
	var read uint64
	for _, n := range sum.Calls {
		read += n
	}
	read += sum.Pool.Allocs + sum.Pool.Frees + sum.Pool.Syncs + sum.Pool.Refusals + sum.PageFaults.Total
	if sum.Drops == 0 {
		t.Fatalf("no drops counted although %d records were read from a one-page buffer", read)
	}
	if want := uint64(50 * 16); read+sum.Drops < want {
		t.Errorf("read %d + dropped %d records, want at least %d", read, sum.Drops, want)
	}
	if most := uint64(os.Getpagesize() / bpf.EventSize); read > most {
		t.Errorf("read %d records from a buffer holding at most %d", read, most)
	}
}

// A library loaded with dlopen after the session attached (as the runtime
// loads the driver) is found by a rescan of the process's maps.
func TestRescanFindsDlopenedLibrary(t *testing.T) {
	harness.RequireBPF(t)
	lib, _ := fakeCUDA(t)
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/dlworkload.c"}, Flags: []string{"-ldl"}})
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cmd := exec.Command(prog, "3", lib, "25")
	cmd.ExtraFiles = []*os.File{r}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()

	tr := newTracer(t, bpf.Options{})
	wait := collect(t, tr)
	if err := tr.Trace(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if files := tr.Files(); len(files) != 0 {
		t.Fatalf("probed %v before the library was loaded", files)
	}
	w.Write([]byte{1})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "loaded\n" {
		t.Fatalf("dlworkload said %q, %v", line, err)
	}
	if err := tr.Rescan(); err != nil {
		t.Fatal(err)
	}
	if files := tr.Files(); len(files) != 1 {
		t.Fatalf("probed files after the rescan: %v, want the library", files)
	}
	w.Write([]byte{1})
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dlworkload: %v", err)
	}
	sum := wait()
	if sum.Calls["cudaMalloc"] != 25 || sum.Calls["cudaFree"] != 25 || sum.Drops != 0 {
		t.Errorf("calls %v, drops %d; want 25 cudaMalloc and 25 cudaFree", sum.Calls, sum.Drops)
	}
}
