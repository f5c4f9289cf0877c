package tracetest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-gpu/spillway/bpf"
	"github.com/spillway-gpu/spillway/tests/harness"
)

// startCopying starts `simworkload copies`, under the shim or not, and
// returns once it is calling, again and again until the test ends.
func startCopying(t *testing.T, workload string, underShim bool) int {
	t.Helper()
	cmd := harness.Command(t, workload, "copies")
	if underShim {
		harness.SetEnv(cmd, "LD_PRELOAD="+filepath.Join(harness.LibDir(t), "libspillway.so"))
	}
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

// otherCalls counts the calls of sum that `simworkload copies` does not
// make: any is a call of a layer below counted as the program's.
func otherCalls(sum *bpf.Summary) uint64 {
	var others uint64
	for fn, n := range sum.Calls {
		if fn != "cudaMalloc" && fn != "cudaMemcpy" && fn != "cudaFree" {
			others += n
		}
	}
	return others
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
	pid := startCopying(t, simWorkload(t), true)
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
		time.Sleep(200 * time.Millisecond) // for rounds made with every layer probed
		sum := wait()
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
		mallocs, copies, frees := sum.Calls["cudaMalloc"], sum.Calls["cudaMemcpy"], sum.Calls["cudaFree"]
		near := func(a, b uint64) bool { return a <= b+2 && b <= a+2 }
		if mallocs == 0 || otherCalls(sum) > 1 || !near(copies, mallocs) || !near(frees, mallocs) || sum.Unpaired != 0 {
			t.Errorf("session %d: calls = %v, unpaired %d; the program calls only cudaMalloc, cudaMemcpy and cudaFree in turn (drops %d)",
				session, sum.Calls, sum.Unpaired, sum.Drops)
		}
	}
}

// tracerLog is what a tracer started by startTracer writes on standard
// error, read on to its end.
type tracerLog struct {
	mu   sync.Mutex
	text strings.Builder
	done chan struct{} // closed once standard error has ended
}

func (l *tracerLog) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.text.WriteString(line + "\n")
}

// String is what the tracer has written so far.
func (l *tracerLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.text.String()
}

// whole is all the tracer wrote, once it has exited.
func (l *tracerLog) whole() string {
	<-l.done
	return l.String()
}

// startTracer starts `spillway trace ARGS` and returns once it says it is
// tracing, with what it writes on standard error. Its standard error is a
// pipe of the test's own, read to its end whether or not the tracer has
// been waited for: Wait closes only the pipes exec makes.
func startTracer(t *testing.T, args ...string) (*exec.Cmd, *tracerLog) {
	t.Helper()
	return startTracerEnv(t, nil, args...)
}

// startTracerEnv is startTracer with the "K=V" entries of env set in the
// tracer's environment, which a CMD it starts inherits.
func startTracerEnv(t *testing.T, env []string, args ...string) (*exec.Cmd, *tracerLog) {
	t.Helper()
	cmd := harness.Command(t, harness.Bin(t, "spillway"), append([]string{"trace"}, args...)...)
	harness.SetEnv(cmd, env...)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	log := &tracerLog{done: make(chan struct{})}
	tracing := make(chan struct{})
	go func() {
		defer close(log.done)
		defer r.Close()
		said := false
		for sc := bufio.NewScanner(r); sc.Scan(); {
			log.add(sc.Text())
			if !said && strings.HasPrefix(sc.Text(), "spillway trace: tracing pid") {
				said = true
				close(tracing)
			}
		}
	}()
	select {
	case <-tracing:
		return cmd, log
	case <-log.done:
		select {
		case <-tracing: // said so, then ended
			return cmd, log
		default:
		}
	}
	_ = cmd.Wait()
	t.Fatalf("spillway trace %v ended before tracing:\n%s", args, log.whole())
	return nil, nil
}

// checkSessionFiles checks that --summary-json and --output (with --json)
// were written whole: the summary with its documented keys and the view
// down to its final interval.
func checkSessionFiles(t *testing.T, summary, output string) {
	t.Helper()
	data, err := os.ReadFile(summary)
	if err != nil {
		t.Fatalf("summary: %v", err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("summary is not JSON: %v\n%s", err, data)
	}
	for _, key := range []string{"calls", "memcpy_bytes", "pool", "processes", "drops", "moved_bytes_per_step", "uvm_traced"} {
		if _, ok := doc[key]; !ok {
			t.Errorf("summary has no %q:\n%s", key, data)
		}
	}
	view, err := os.ReadFile(output)
	if err != nil {
		t.Fatalf("output: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(view)), "\n")
	var last map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last["final"] != true {
		t.Errorf("the output's last line is not the final interval (%v):\n%s", err, view)
	}
}

// SIGTERM, and SIGHUP (the terminal the session was started from has
// closed), end a session as SIGINT does: the probes are detached, the
// summary and the output are written whole, the status is 0, and the
// traced process runs on.
func TestTraceEndsOnSignals(t *testing.T) {
	harness.RequireBPF(t)
	pid := startCopying(t, simWorkload(t), true)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			summary, output := filepath.Join(dir, "summary.json"), filepath.Join(dir, "view.json")
			tracer, log := startTracer(t, "-p", pidKey(pid), "--json", "--summary-json", summary, "--output", output)
			if err := tracer.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if err := harness.WaitWithin(t, tracer, time.Minute); err != nil {
				t.Fatalf("spillway trace, sent %v: %v\n%s", sig, err, log.whole())
			}
			checkSessionFiles(t, summary, output)
			if !bpf.Running(pid) {
				t.Fatalf("the traced process %d ended with the session, sent %v; want it left running", pid, sig)
			}
		})
	}
}

// Two sessions at once, on one process or on one each, count every call
// each exactly, neither taking the other's records nor counting twice.
func TestTwoSessionsCountExactly(t *testing.T) {
	harness.RequireBPF(t)
	_, workload := fakeCUDA(t)
	t.Run("same process", func(t *testing.T) {
		w := startGated(t, workload, "counts", "50")
		var waits []func() *bpf.Summary
		for range 2 {
			tr := newTracer(t, bpf.Options{})
			waits = append(waits, collect(t, tr))
			if err := tr.Trace(w.pid()); err != nil {
				t.Fatal(err)
			}
		}
		w.release(t)
		for _, wait := range waits {
			checkCounts(t, wait(), w.pid())
		}
	})
	t.Run("one process each", func(t *testing.T) {
		var (
			workloads []*gated
			waits     []func() *bpf.Summary
		)
		for range 2 {
			w := startGated(t, workload, "counts", "50")
			tr := newTracer(t, bpf.Options{})
			waits = append(waits, collect(t, tr))
			if err := tr.Trace(w.pid()); err != nil {
				t.Fatal(err)
			}
			workloads = append(workloads, w)
		}
		for _, w := range workloads {
			w.release(t)
		}
		for i, wait := range waits {
			sum := wait()
			checkCounts(t, sum, workloads[i].pid())
			if _, ok := sum.Processes[pidKey(workloads[1-i].pid())]; ok {
				t.Errorf("session %d has records of the other session's process %d", i, workloads[1-i].pid())
			}
		}
	})
}

// `spillway trace -p PID` says when PID maps nothing that is probed (a
// launcher's pid given for its worker's), and when it maps CUDA without the
// shim, naming the pid: either way most figures stay zero.
func TestTraceSaysWhatPIDLacks(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	idle := exec.Command("sleep", "60")
	if err := idle.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = idle.Process.Kill()
		_ = idle.Wait()
	})
	workload := simWorkload(t)
	noShim := startCopying(t, workload, false)
	underShim := startCopying(t, workload, true)
	for _, c := range []struct {
		pid  int
		want string
	}{
		{idle.Process.Pid, "maps no CUDA runtime or driver and no libspillway.so"},
		{noShim, "is not running under Spillway"},
		{underShim, ""},
	} {
		res := harness.Run(t, exec.Command(spillway, "trace", "-p", pidKey(c.pid), "--duration", "100ms"))
		if res.ExitCode != 0 {
			t.Fatalf("pid %d: exit %d\n%s", c.pid, res.ExitCode, res.Stderr)
		}
		notice := fmt.Sprintf("spillway trace: pid %d %s", c.pid, c.want)
		if strings.Contains(res.Stderr, notice) != (c.want != "") {
			t.Errorf("pid %d: stderr\n%s\nwant %q said only when followed by what is missing", c.pid, res.Stderr, notice)
		}
	}
}

// A traced process that execs a CUDA program (a wrapper script's last
// step) is traced on: the runtime and driver it maps are found by a rescan,
// and attached from the layer the program calls down, so that the driver
// calls the runtime makes are never counted as the program's own while the
// runtime is not probed yet.
func TestTraceFollowsExec(t *testing.T) {
	harness.RequireBPF(t)
	workload := simWorkload(t)
	// The probing takes milliseconds, while which calls fall in between
	// is up to the scheduler: three sessions make a miss unlikely.
	for session := range 3 {
		sum := traceExec(t, workload)
		if otherCalls(sum) > 1 || sum.Calls["cudaMalloc"] == 0 {
			t.Errorf("session %d: calls = %v; the program calls only cudaMalloc, cudaMemcpy and cudaFree (drops %d)",
				session, sum.Calls, sum.Drops)
		}
	}
}

// traceExec traces a shell that execs `simworkload copies`, rescanning once
// it calls, and returns what the session counted.
func traceExec(t *testing.T, workload string) *bpf.Summary {
	t.Helper()
	cmd := harness.Command(t, "/bin/sh", "-c", `read go && exec "$0" copies`, workload)
	stdin, stdout, _ := harness.StartPiped(t, cmd)
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	tr, err := bpf.New(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	wait := collect(t, tr)
	if err := tr.Trace(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if !stdout.Scan() {
		t.Fatal("simworkload copies ended before its first round")
	}
	if err := tr.Rescan(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // for calls made with every layer probed
	return wait()
}

// Sessions opened and closed again and again on a running program leave
// nothing behind in the process that ran them (no descriptor of a probe,
// link, map or ring buffer), and the program runs on unharmed.
func TestRepeatedSessionsLeaveNothing(t *testing.T) {
	harness.RequireBPF(t)
	pid := startCopying(t, simWorkload(t), true)
	before := openFiles(t)
	for session := range 10 {
		tr, err := bpf.New(bpf.Options{})
		if err != nil {
			t.Fatal(err)
		}
		wait := collect(t, tr)
		if err := tr.Trace(pid); err != nil {
			t.Fatal(err)
		}
		wait()
		if err := tr.Close(); err != nil {
			t.Fatalf("session %d: close: %v", session, err)
		}
	}
	if after := openFiles(t); len(after) != len(before) {
		t.Errorf("%d descriptors open before the sessions, %d after: %v", len(before), len(after), after)
	}
	if !bpf.Running(pid) {
		t.Errorf("the traced program, pid %d, has ended", pid)
	}
}

// openFiles lists this process's open descriptors, with what each is.
func openFiles(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		target, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		out = append(out, e.Name()+" -> "+target)
	}
	return out
}

// `spillway trace -p PID` naming no process it could trace is refused as a
// usage error (exit status 2) before anything is loaded, saying why: a
// process that has exited but that its parent has not reaped (a zombie,
// where it waited for an exit that had already happened), a thread of a
// process rather than the process, a process that does not exist.
func TestTraceRefusesBadPIDFirst(t *testing.T) {
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	defer zombie.Wait()
	pid := zombie.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); bpf.Running(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d (true) still running after 10 s", pid)
		}
	}
	thread, gone := threadOfThisProcess(t), reapedProcess(t)
	for _, c := range []struct {
		pid  int
		want string
	}{
		{pid, fmt.Sprintf("invalid -p=%d: pid %d has exited", pid, pid)},
		{thread, fmt.Sprintf("invalid -p=%d: pid %d is a thread of process %d: give the process id", thread, thread, os.Getpid())},
		{gone, fmt.Sprintf("invalid -p=%d: pid %d: no such process", gone, gone)},
	} {
		res := harness.Run(t, exec.Command(harness.Bin(t, "spillway"), "trace", "-p", strconv.Itoa(c.pid), "--duration", "1s"))
		if res.ExitCode != 2 || !strings.Contains(res.Stderr, c.want) {
			t.Errorf("-p %d: exit %d, stderr:\n%s\nwant exit 2 and %q", c.pid, res.ExitCode, res.Stderr, c.want)
		}
	}
}

// threadOfThisProcess returns the id of a thread of this process other
// than its first.
func threadOfThisProcess(t *testing.T) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if id, err := strconv.Atoi(task.Name()); err == nil && id != os.Getpid() {
			return id
		}
	}
	t.Fatal("this process has no thread but its first")
	return 0
}

// reapedProcess returns the id of a process that has exited and been reaped.
func reapedProcess(t *testing.T) int {
	t.Helper()
	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Fatal(err)
	}
	return ended.Process.Pid
}

// Trace refuses a pid that names no process it could trace, saying why:
// zero or a negative number, a thread of a process rather than the process,
// a process that does not exist.
func TestTraceRefusesBadPIDs(t *testing.T) {
	harness.RequireBPF(t)
	tr := newTracer(t, bpf.Options{})
	thread, gone := threadOfThisProcess(t), reapedProcess(t)
	for _, c := range []struct {
		pid  int
		want string
	}{
		{0, "pid 0: want a positive process id"},
		{-1, "pid -1: want a positive process id"},
		{thread, fmt.Sprintf("pid %d is a thread of process %d: give the process id", thread, os.Getpid())},
		{gone, fmt.Sprintf("pid %d: no such process", gone)},
	} {
		if err := tr.Trace(c.pid); err == nil || err.Error() != c.want {
			t.Errorf("Trace(%d) = %v, want %q", c.pid, err, c.want)
		}
	}
}

// A session traces at most bpf.MaxTraced processes and threads at once: past
// that, Trace refuses a process with an error that names it and the limit,
// rather than the kernel's "key too big for map", and a place freed by an
// untraced one makes room again.
func TestTraceSaysTheSessionIsFull(t *testing.T) {
	harness.RequireBPF(t)
	tr := newTracer(t, bpf.Options{})
	// Ids above the kernel's pid_max (at most 2^22) name no process, so
	// nothing forks or exits under them while the set is full.
	const unreal = 1 << 30
	for i := range bpf.MaxTraced {
		if err := tr.Follow(unreal + i); err != nil {
			t.Fatalf("follow %d of %d: %v", i+1, bpf.MaxTraced, err)
		}
	}
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sleeper.Process.Kill()
		sleeper.Wait()
	}()
	pid := sleeper.Process.Pid

	err := tr.Trace(pid)
	want := fmt.Sprintf("cannot trace pid %d: the session already traces %d processes and threads, its limit", pid, bpf.MaxTraced)
	if !errors.Is(err, bpf.ErrTracedFull) || err.Error() != want {
		t.Fatalf("Trace(%d) with the set full = %v, want %q wrapping bpf.ErrTracedFull", pid, err, want)
	}
	if err := tr.Untrace(unreal); err != nil {
		t.Fatal(err)
	}
	if err := tr.Trace(pid); err != nil {
		t.Fatalf("Trace(%d) with one place free: %v", pid, err)
	}
}

// closeAfterFirstLine starts tracer with its standard output read by a pipe
// that is closed after the first line, as `| head -1` does, and returns
// what it writes on standard error.
func closeAfterFirstLine(t *testing.T, tracer *exec.Cmd) *strings.Builder {
	t.Helper()
	stdout, err := tracer.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := new(strings.Builder)
	tracer.Stderr = stderr
	if err := tracer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if tracer.ProcessState == nil {
			_ = tracer.Process.Kill()
			_ = tracer.Wait()
		}
	})
	if !bufio.NewScanner(stdout).Scan() {
		t.Fatal("no interval line")
	}
	stdout.Close()
	return stderr
}

// A session whose standard output is read by a command that stops reading
// early (`| head`) ends as on SIGINT, with its summary written whole.
func TestTraceEndsWhenOutputCloses(t *testing.T) {
	harness.RequireBPF(t)
	pid := startCopying(t, simWorkload(t), true)
	summary := filepath.Join(t.TempDir(), "summary.json")
	tracer := exec.Command(harness.Bin(t, "spillway"), "trace", "-p", pidKey(pid), "--json", "--interval", "50ms", "--summary-json", summary)
	stderr := closeAfterFirstLine(t, tracer)
	if err := harness.WaitWithin(t, tracer, time.Minute); err != nil {
		t.Fatalf("spillway trace, its output closed: %v\n%s", err, stderr.String())
	}
	sum := readSummary(t, summary)
	if sum.Calls["cudaMalloc"] == 0 {
		t.Errorf("summary calls %v, want the program's", sum.Calls)
	}
}

// With -- CMD, a reader of standard output that stops early (`| head`)
// ends the view only: CMD is neither killed with the session nor cut
// short, it is traced to its end, the summary is written whole, and the
// status is CMD's.
func TestTraceCommandOutlivesItsOutputReader(t *testing.T) {
	harness.RequireBPF(t)
	dir := t.TempDir()
	summary, started := filepath.Join(dir, "summary.json"), filepath.Join(dir, "started")
	// The job starts its calls once the reader has gone, and exits 5.
	script := fmt.Sprintf(`while [ ! -e %s ]; do sleep 0.01; done; %s %d; exit 5`, started, simWorkload(t), simRounds)
	tracer := harness.Command(t, harness.Bin(t, "spillway"), "trace", "--json", "--interval", "20ms",
		"--summary-json", summary, "--", "sh", "-c", script)
	stderr := closeAfterFirstLine(t, tracer)
	time.Sleep(100 * time.Millisecond) // an interval or more written to the closed pipe
	if err := os.WriteFile(started, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := harness.WaitWithin(t, tracer, time.Minute)
	if code := tracer.ProcessState.ExitCode(); code != 5 {
		t.Fatalf("spillway trace, its output closed: exit %d (%v), want the job's 5\n%s", code, err, stderr.String())
	}
	checkSimSummary(t, readSummary(t, summary))
}
