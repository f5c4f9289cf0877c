package tracetest

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/bpf"
	"github.com/spillway-gpu/spillway/tests/harness"
)

// The shim fires its probe points only while a tracer holds the probe
// semaphore. A program running under the shim is traced, untraced and
// traced again between phases of allocations: the semaphore, read from the
// process's memory, is non-zero exactly while a session is attached, and
// every pair of a traced phase reaches the probe points.
func TestProbeSemaphoreFollowsSessions(t *testing.T) {
	harness.RequireBPF(t)
	front := filepath.Join(harness.LibDir(t), "libspillway.so")
	semOff, err := bpf.ProbeSemaphoreOffset(front)
	if err != nil {
		t.Fatal(err)
	}
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/phases.c"}, Cudart: true, ProjectHeaders: true})
	const pairs = 200
	p := startPhases(t, prog, pairs,
		"LD_PRELOAD="+front, "LD_LIBRARY_PATH="+harness.SimcudaDir(t), "SIMCUDA_STATE_DIR="+t.TempDir())

	p.phase(t) // loads the core; nobody traces it
	if n := p.semaphore(t, front, semOff); n != 0 {
		t.Fatalf("semaphore = %d before any session, want 0", n)
	}
	// The first session attaches one uprobe_multi link per file, the second a
	// link per probe point: both give the semaphore.
	for i, opts := range []bpf.Options{{}, {PerSymbolLinks: true}} {
		session := i + 1
		tr, err := bpf.New(opts)
		if err != nil {
			t.Fatalf("bpf.New: %v", err)
		}
		wait := collect(t, tr)
		if err := tr.Trace(p.cmd.Process.Pid); err != nil {
			tr.Close()
			t.Fatal(err)
		}
		if n := p.semaphore(t, front, semOff); n == 0 {
			t.Errorf("session %d: semaphore = 0 while attached", session)
		}
		p.phase(t)
		sum := wait()
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
		if sum.Pool.Allocs != pairs || sum.Pool.Frees != pairs || sum.Drops != 0 {
			t.Errorf("session %d: %d alloc and %d free probe records (%d drops), want %d each",
				session, sum.Pool.Allocs, sum.Pool.Frees, sum.Drops, pairs)
		}
		if n := p.semaphore(t, front, semOff); n != 0 {
			t.Errorf("session %d: semaphore = %d after detaching, want 0", session, n)
		}
		p.phase(t) // untraced again
	}
	p.finish(t)
}

// phases is a running testdata/phases.c.
type phases struct {
	cmd         *exec.Cmd
	start, done *os.File
}

func startPhases(t *testing.T, prog string, pairs int, env ...string) *phases {
	t.Helper()
	goR, goW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	doneR, doneW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(prog, strconv.Itoa(pairs))
	cmd.Env = append(os.Environ(), env...)
	cmd.ExtraFiles = []*os.File{goR, doneW}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	goR.Close()
	doneW.Close()
	p := &phases{cmd: cmd, start: goW, done: doneR}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
		p.start.Close()
		p.done.Close()
	})
	return p
}

// phase runs one phase of pairs and waits for its end.
func (p *phases) phase(t *testing.T) {
	t.Helper()
	if _, err := p.start.Write([]byte{1}); err != nil {
		t.Fatalf("start a phase: %v", err)
	}
	if _, err := p.done.Read(make([]byte, 1)); err != nil {
		t.Fatalf("the program did not finish its phase: %v", err)
	}
}

func (p *phases) finish(t *testing.T) {
	t.Helper()
	p.start.Close()
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("phases: %v", err)
	}
}

// semaphore reads the probe semaphore (at file offset off in lib) from the
// process's memory.
func (p *phases) semaphore(t *testing.T, lib string, off uint64) uint16 {
	t.Helper()
	pid := p.cmd.Process.Pid
	addr, err := mappedAddress(pid, lib, off)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	var b [2]byte
	if _, err := mem.ReadAt(b[:], int64(addr)); err != nil {
		t.Fatalf("read the semaphore at %#x in pid %d: %v", addr, pid, err)
	}
	return binary.NativeEndian.Uint16(b[:])
}

// mappedAddress returns where file offset off of lib is mapped in a process.
func mappedAddress(pid int, lib string, off uint64) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		// start-end perms offset dev inode path
		f := strings.Fields(line)
		if len(f) < 6 || f[5] != lib {
			continue
		}
		var start, end, mapOff uint64
		if _, err := fmt.Sscanf(f[0]+" "+f[2], "%x-%x %x", &start, &end, &mapOff); err != nil {
			return 0, fmt.Errorf("maps line %q: %v", line, err)
		}
		if off >= mapOff && off-mapOff < end-start {
			return start + off - mapOff, nil
		}
	}
	return 0, fmt.Errorf("offset %#x of %s is not mapped in pid %d", off, lib, pid)
}
