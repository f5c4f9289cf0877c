package tracetest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/spillway-gpu/spillway/bpf"
	"github.com/spillway-gpu/spillway/tests/harness"
)

// fakeCUDA builds the stand-in CUDA library and the workload linked to it.
func fakeCUDA(t testing.TB) (lib, workload string) {
	t.Helper()
	lib = harness.Compile(t, harness.CBuild{Sources: []string{"testdata/fakecuda.c"}, Shared: true, Out: "libfakecuda.so"})
	dir := filepath.Dir(lib)
	workload = harness.Compile(t, harness.CBuild{
		Sources: []string{"testdata/workload.c"},
		Flags:   []string{"-L" + dir, "-lfakecuda", "-Wl,-rpath," + dir},
	})
	return lib, workload
}

// tracedFakeCUDA builds the stand-in CUDA library and its workload and opens
// a session, closed with the test, attached to the library. It requires eBPF.
func tracedFakeCUDA(t testing.TB, opts bpf.Options) (tr *bpf.Tracer, workload string) {
	t.Helper()
	harness.RequireBPF(t)
	lib, workload := fakeCUDA(t)
	tr = newTracer(t, opts)
	if err := tr.AttachFile(lib); err != nil {
		t.Fatal(err)
	}
	return tr, workload
}

// newTracer opens a session closed with the test.
func newTracer(t testing.TB, opts bpf.Options) *bpf.Tracer {
	t.Helper()
	tr, err := bpf.New(opts)
	if err != nil {
		t.Fatalf("bpf.New: %v", err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("close tracer: %v", err)
		}
	})
	return tr
}

// collect reads records into a summary until the tracer is flushed.
func collect(t testing.TB, tr *bpf.Tracer) (wait func() *bpf.Summary) {
	sum := bpf.NewSummary()
	done := make(chan error, 1)
	go func() {
		var e bpf.Event
		for {
			err := tr.ReadEvent(&e)
			if err != nil {
				if errors.Is(err, bpf.ErrFlushed) {
					err = nil
				}
				done <- err
				return
			}
			sum.Add(&e)
		}
	}()
	return func() *bpf.Summary {
		t.Helper()
		if err := tr.Flush(); err != nil {
			t.Fatalf("flush: %v", err)
		}
		if err := <-done; err != nil {
			t.Fatalf("read events: %v", err)
		}
		drops, err := tr.Drops()
		if err != nil {
			t.Fatal(err)
		}
		sum.Drops = drops
		return sum
	}
}

// gated is a workload started with -w: it waits for a byte on a pipe before
// any CUDA call, so that a tracer can attach to the running process.
type gated struct {
	cmd *exec.Cmd
	w   *os.File
}

// traceFakeWorkload runs the fake-CUDA workload with args, traced by a
// session of its own from its first call to its exit, and returns the
// session's summary and the workload's PID.
func traceFakeWorkload(t *testing.T, args ...string) (*bpf.Summary, int) {
	t.Helper()
	tr, workload := tracedFakeCUDA(t, bpf.Options{})
	wait := collect(t, tr)
	w := startGated(t, workload, args...)
	if err := tr.Trace(w.pid()); err != nil {
		t.Fatal(err)
	}
	w.release(t)
	return wait(), w.pid()
}

func startGated(t testing.TB, path string, args ...string) *gated {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, append([]string{"-w", "3"}, args...)...)
	cmd.ExtraFiles = []*os.File{r}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	r.Close()
	g := &gated{cmd: cmd, w: w}
	t.Cleanup(func() {
		if g.cmd.ProcessState == nil {
			_ = g.cmd.Process.Kill()
			_ = g.cmd.Wait()
		}
		g.w.Close()
	})
	return g
}

func (g *gated) pid() int { return g.cmd.Process.Pid }

// release lets the workload run and waits for it to exit successfully.
func (g *gated) release(t testing.TB) {
	t.Helper()
	if _, err := g.w.Write([]byte{1}); err != nil {
		t.Fatalf("release workload: %v", err)
	}
	if err := g.cmd.Wait(); err != nil {
		t.Fatalf("workload: %v", err)
	}
}

func pidKey(pid int) string { return strconv.Itoa(pid) }

func selfPID() int { return os.Getpid() }
