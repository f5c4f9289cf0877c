package tracetest

import (
	"bufio"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-gpu/spillway/bpf"
	"github.com/spillway-gpu/spillway/tests/harness"
)

const simRounds = 40

// simWorkload builds simworkload against the simulated CUDA.
func simWorkload(t *testing.T) string {
	t.Helper()
	return harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/simworkload.c"},
		Cudart:         true,
		ProjectHeaders: true,
		Flags:          []string{"-lcuda", "-ldl"},
	})
}

// wantSimCounts is what `simworkload simRounds` does, as the application
// called it.
func checkSimSummary(t *testing.T, sum *bpf.Summary) {
	t.Helper()
	wantCalls := map[string]uint64{
		"cudaMalloc":      2 * simRounds,
		"cudaFree":        2 * simRounds,
		"cudaMemcpy":      3 * simRounds,
		"cudaMemcpyAsync": simRounds,
		"cuMemAlloc_v2":   simRounds,
		"cuMemcpyHtoD_v2": simRounds,
		"cuMemcpyDtoH_v2": simRounds,
		"cuMemFree_v2":    simRounds,
		// Probed so that what a layer below does inside it is not counted
		// as the application's.
		"cudaDeviceSynchronize": simRounds,
	}
	if !maps.Equal(sum.Calls, wantCalls) {
		t.Errorf("calls = %v, want %v", sum.Calls, wantCalls)
	}
	wantBytes := map[string]uint64{
		"h2d": simRounds * (1000 + 64), "d2h": simRounds * (700 + 32),
		"d2d": simRounds * 300, "default": simRounds * 50, "h2h": 0,
	}
	if !maps.Equal(sum.MemcpyBytes, wantBytes) {
		t.Errorf("memcpy_bytes = %v, want %v", sum.MemcpyBytes, wantBytes)
	}
	if len(sum.Errors) != 0 {
		t.Errorf("errors = %v, want none", sum.Errors)
	}
	if sum.Drops != 0 {
		t.Errorf("drops = %d, want 0", sum.Drops)
	}
}

func readSummary(t *testing.T, path string) *bpf.Summary {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("summary: %v", err)
	}
	var sum bpf.Summary
	if err := json.Unmarshal(data, &sum); err != nil {
		t.Fatalf("summary %s: %v", data, err)
	}
	return &sum
}

// `spillway trace -- CMD` runs CMD under the shim, traced from its first
// call, and exits with its status.
func TestTraceCommand(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	workload := simWorkload(t)
	summary := filepath.Join(t.TempDir(), "summary.json")
	cmd := harness.Command(t, spillway, "trace", "--interval", "200ms", "--summary-json", summary, "--", workload, "40")
	res := harness.Run(t, cmd)
	if res.ExitCode != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	checkSimSummary(t, readSummary(t, summary))

	// The exit status is the command's.
	res = harness.Run(t, harness.Command(t, spillway, "trace", "--", "sh", "-c", "exit 7"))
	if res.ExitCode != 7 {
		t.Errorf("traced `exit 7` exited %d, want 7\nstderr:\n%s", res.ExitCode, res.Stderr)
	}
}

// A program that finds the runtime through its own run path, as a wheel's
// bundled libraries are found, not through LD_LIBRARY_PATH or the loader's
// cache, is traced from its first call: the libraries its loader will map
// are probed before it starts, however soon it makes its calls and exits.
func TestTraceCommandRunpath(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	workload := harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/simworkload.c"},
		Cudart:         true,
		ProjectHeaders: true,
		Flags:          []string{"-lcuda", "-ldl", "-Wl,-rpath," + harness.SimcudaDir(t)},
	})
	summary := filepath.Join(t.TempDir(), "summary.json")
	cmd := harness.Command(t, spillway, "trace", "--summary-json", summary, "--", workload, "40")
	harness.SetEnv(cmd, "LD_LIBRARY_PATH=")
	res := harness.Run(t, cmd)
	if res.ExitCode != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	checkSimSummary(t, readSummary(t, summary))
}

// A library CMD is linked with that cannot be probed (its section headers
// unreadable, which the loader does not need) is named, as a rescan would
// name it, and CMD runs and is traced all the same.
func TestTraceCommandUnprobedLibrary(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	src := filepath.Join(t.TempDir(), "plain.c")
	if err := os.WriteFile(src, []byte("int plain(void) { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := harness.Compile(t, harness.CBuild{Sources: []string{src}, Shared: true})
	prog := harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/simworkload.c"},
		Cudart:         true,
		ProjectHeaders: true,
		Flags:          []string{"-lcuda", "-ldl", "-L", filepath.Dir(lib), "-Wl,--no-as-needed", "-lplain", "-Wl,-rpath," + filepath.Dir(lib)},
	})
	elfHeader, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	elfHeader[62], elfHeader[63] = 0xf0, 0xff // e_shstrndx out of range
	if err := os.WriteFile(lib, elfHeader, 0o755); err != nil {
		t.Fatal(err)
	}
	summary := filepath.Join(t.TempDir(), "summary.json")
	res := harness.Run(t, harness.Command(t, spillway, "trace", "--summary-json", summary, "--", prog, "40"))
	if res.ExitCode != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	if !strings.Contains(res.Stderr, "read symbols of "+lib) {
		t.Errorf("stderr does not name %s, which cannot be probed:\n%s", lib, res.Stderr)
	}
	checkSimSummary(t, readSummary(t, summary))
}

// Through the command and the shim's own probe points: faults on memory the
// shim reports spilled are counted, all in the traced process. (The workload
// fires spillway_probe_spill itself on host pages, as the shim's
// oversubscription will.)
func TestTraceSpilledFaults(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	workload := simWorkload(t)
	summary := filepath.Join(t.TempDir(), "summary.json")
	res := harness.Run(t, harness.Command(t, spillway, "trace", "--summary-json", summary, "--", workload, "spill", "100"))
	if res.ExitCode != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.ExitCode, res.Stderr)
	}
	sum := readSummary(t, summary)
	if sum.PageFaults.Spilled != 100 || sum.SpillBytes != 100*4096 {
		t.Errorf("faults on spilled memory = %d after spilling %d bytes, want 100 after %d",
			sum.PageFaults.Spilled, sum.SpillBytes, 100*4096)
	}
	if len(sum.Processes) != 1 {
		t.Errorf("faults in %d processes, want only the workload's: %v", len(sum.Processes), sum.Processes)
	}
	for pid, p := range sum.Processes {
		if p.PageFaults != sum.PageFaults || !p.Exited {
			t.Errorf("process %s: %+v, want all faults %+v and its exit", pid, p, sum.PageFaults)
		}
	}
}

// The command's children are traced too: a shell running the workload twice
// gives twice the counts, in two processes.
func TestTraceFollowsChildren(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	workload := simWorkload(t)
	summary := filepath.Join(t.TempDir(), "summary.json")
	script := workload + " 20 && " + workload + " 20"
	res := harness.Run(t, harness.Command(t, spillway, "trace", "--summary-json", summary, "--", "sh", "-c", script))
	if res.ExitCode != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.ExitCode, res.Stderr)
	}
	sum := readSummary(t, summary)
	if sum.Calls["cudaMalloc"] != 2*2*20 || sum.Calls["cuMemAlloc_v2"] != 2*20 {
		t.Errorf("calls %v, want those of two runs of 20 rounds", sum.Calls)
	}
	var withCalls int
	for _, p := range sum.Processes {
		if p.Calls > 0 {
			withCalls++
		}
	}
	if withCalls != 2 {
		t.Errorf("calls in %d processes, want 2: %v", withCalls, sum.Processes)
	}
}

// --events --json prints one JSON object per record.
func TestTraceEventsJSON(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	workload := simWorkload(t)
	res := harness.Run(t, harness.Command(t, spillway, "trace", "--events", "--json", "--", workload, "3"))
	if res.ExitCode != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.ExitCode, res.Stderr)
	}
	kinds := map[string]int{}
	bytes := map[string]uint64{}
	for _, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
		var rec struct {
			Kind, Func, Direction string
			Size                  uint64
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		kinds[rec.Kind]++
		if rec.Direction != "" {
			bytes[rec.Direction] += rec.Size
		}
	}
	// 3 rounds of 13 probed calls; one exit.
	if kinds["call"] != 3*13 || kinds["exit"] != 1 || kinds["fault"] == 0 {
		t.Errorf("records by kind %v, want 39 calls, 1 exit and some faults", kinds)
	}
	if bytes["h2d"] != 3*(1000+64) || bytes["d2h"] != 3*(700+32) {
		t.Errorf("bytes by direction %v", bytes)
	}
}

// A program linked with the static runtime defines cudaMalloc itself: the
// executable is probed, and its calls are counted like the shared runtime's.
func TestTraceStaticRuntime(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	workload := harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/simworkload.c"},
		StaticCudart:   true,
		ProjectHeaders: true,
		Flags:          []string{"-L", harness.SimcudaDir(t), "-lcuda", "-ldl"},
	})
	summary := filepath.Join(t.TempDir(), "summary.json")
	res := harness.Run(t, harness.Command(t, spillway, "trace", "--summary-json", summary, "--", workload, "40"))
	if res.ExitCode != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.ExitCode, res.Stderr)
	}
	checkSimSummary(t, readSummary(t, summary))
}

// `spillway trace -p PID` attaches to a process already running (waiting on
// a pipe before its first CUDA call) and ends when it exits.
func TestTraceAttachRunning(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	workload := simWorkload(t)

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	target := harness.Command(t, workload, "-w", "3", "40")
	target.ExtraFiles = []*os.File{r}
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	defer func() {
		if target.ProcessState == nil {
			target.Process.Kill()
			target.Wait()
		}
	}()

	summary := filepath.Join(t.TempDir(), "summary.json")
	tracer := exec.Command(spillway, "trace", "-p", pidKey(target.Process.Pid), "--json", "--summary-json", summary)
	stderr, err := tracer.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	tracer.Stdout = nil
	if err := tracer.Start(); err != nil {
		t.Fatal(err)
	}
	// The tracer says when it is attached.
	ready := make(chan string, 1)
	go func() {
		var seen strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := stderr.Read(buf)
			seen.Write(buf[:n])
			if strings.Contains(seen.String(), "tracing pid") {
				ready <- seen.String()
				seen.Reset()
			}
			if err != nil {
				close(ready)
				return
			}
		}
	}()
	select {
	case msg, ok := <-ready:
		if !ok {
			tracer.Wait()
			t.Fatalf("tracer ended before attaching")
		}
		t.Logf("tracer: %s", strings.TrimSpace(msg))
	case <-time.After(time.Minute):
		tracer.Process.Kill()
		t.Fatal("tracer did not attach within a minute")
	}
	if _, err := w.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	if err := target.Wait(); err != nil {
		t.Fatalf("workload: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- tracer.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("tracer: %v", err)
		}
	case <-time.After(time.Minute):
		tracer.Process.Kill()
		t.Fatal("tracer did not end within a minute of its target")
	}
	checkSimSummary(t, readSummary(t, summary))
}

// `spillway trace -p PID` of a launcher that forks its worker and exits goes
// on while the worker, traced as its child, runs: the session ends when the
// last traced process exits, not the last -p target.
func TestTraceAttachOutlivedByChild(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	forker := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/forker.c"}, Cudart: true, ProjectHeaders: true})
	launchR, launchW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer launchW.Close()
	workR, workW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer workW.Close() // the worker, if still waiting, then fails and exits
	launcher := harness.Command(t, forker, "25")
	launcher.ExtraFiles = []*os.File{launchR, workR}
	launcher.Stderr = os.Stderr
	if err := launcher.Start(); err != nil {
		t.Fatal(err)
	}
	launchR.Close()
	workR.Close()
	defer func() {
		if launcher.ProcessState == nil {
			launcher.Process.Kill()
			launcher.Wait()
		}
	}()

	summary := filepath.Join(t.TempDir(), "summary.json")
	tracer := exec.Command(spillway, "trace", "-p", pidKey(launcher.Process.Pid), "--json", "--interval", "50ms",
		"--summary-json", summary)
	stdout, err := tracer.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := tracer.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := tracer.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if tracer.ProcessState == nil {
			tracer.Process.Kill()
			tracer.Wait()
		}
	}()
	var log strings.Builder
	attached := make(chan bool, 1)
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(stderr)
		said := false
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if !said && strings.HasPrefix(sc.Text(), "spillway trace: tracing pid") {
				attached <- true
				said = true
			}
		}
		if !said {
			attached <- false
		}
	}()
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	if !<-attached {
		tracer.Wait()
		<-logDone
		t.Fatalf("the tracer did not attach:\n%s", log.String())
	}

	if _, err := launchW.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	if err := launcher.Wait(); err != nil {
		t.Fatalf("launcher: %v", err)
	}
	// The launcher has exited, its worker has not started: the session
	// must go on drawing intervals.
	for drained := false; !drained; {
		select {
		case <-lines:
		default:
			drained = true
		}
	}
	for range 3 {
		select {
		case l, ok := <-lines:
			if !ok || strings.Contains(l, `"final":true`) {
				tracer.Wait()
				<-logDone
				t.Fatalf("the session ended with the launcher, its worker still running:\n%s", log.String())
			}
		case <-time.After(time.Minute):
			t.Fatal("no interval line within a minute")
		}
	}
	if _, err := workW.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for range lines {
		}
	}()
	done := make(chan error, 1)
	go func() { done <- tracer.Wait() }()
	select {
	case err := <-done:
		<-logDone
		if err != nil {
			t.Fatalf("tracer: %v\n%s", err, log.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("the session did not end within a minute of the worker")
	}
	sum := readSummary(t, summary)
	if sum.Calls["cudaMalloc"] != 25 || sum.Calls["cudaFree"] != 25 || len(sum.Errors) != 0 {
		t.Errorf("calls %v, errors %v; want the worker's 25 cudaMalloc and cudaFree", sum.Calls, sum.Errors)
	}
	var worker []string
	for pid, p := range sum.Processes {
		if p.Calls > 0 {
			worker = append(worker, pid)
			if p.Calls != 50 || !p.Exited || pid == pidKey(launcher.Process.Pid) {
				t.Errorf("process %s: %+v, want the worker's 50 calls and its exit", pid, p)
			}
		}
	}
	if len(worker) != 1 {
		t.Errorf("calls in processes %v, want the worker's only: %v", worker, sum.Processes)
	}
}

// Without the privileges, the command says which are missing and fails,
// without running anything.
func TestTraceUnprivileged(t *testing.T) {
	harness.RequireBPF(t) // root, to run the command as another user
	spillway := harness.Bin(t, "spillway")
	dir, err := os.MkdirTemp("", "tracetest-unprivileged-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil { // writable by the unprivileged user
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "ran")
	cmd := exec.Command(spillway, "trace", "--", "touch", marker)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	res := harness.Run(t, cmd)
	if res.ExitCode == 0 {
		t.Fatalf("unprivileged trace exited 0\nstderr:\n%s", res.Stderr)
	}
	for _, want := range []string{"root", "CAP_BPF", "CAP_PERFMON", "uid 65534"} {
		if !strings.Contains(res.Stderr, want) {
			t.Errorf("stderr %q does not mention %q", res.Stderr, want)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran although tracing could not start")
	}
}

// A session that fails before it starts (here, -p of a process that does
// not exist, or a CMD that cannot be run) leaves its files as they were: an
// existing --output is not truncated and a --summary-json or --output that
// did not exist is not created. This holds with or without eBPF: either
// way nothing is traced.
func TestTraceFailedStartLeavesFiles(t *testing.T) {
	spillway := harness.Bin(t, "spillway")
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	output, summary := filepath.Join(dir, "view.txt"), filepath.Join(dir, "summary.json")
	const kept = "the last session's view\n"
	if err := os.WriteFile(output, []byte(kept), 0o644); err != nil {
		t.Fatal(err)
	}
	res := harness.Run(t, harness.Command(t, spillway, "trace", "-p", pidKey(gone.Process.Pid),
		"--output", output, "--summary-json", summary))
	if res.ExitCode == 0 {
		t.Fatalf("tracing a process that has exited: exit 0\nstderr:\n%s", res.Stderr)
	}
	if data, err := os.ReadFile(output); err != nil || string(data) != kept {
		t.Errorf("--output after a session that did not start: %q, %v; want it unchanged, %q", data, err, kept)
	}
	if _, err := os.Stat(summary); !os.IsNotExist(err) {
		t.Errorf("--summary-json after a session that did not start: %v; want no file", err)
	}
	// Nor does a command that cannot be run (127, as a shell says).
	res = harness.Run(t, harness.Command(t, spillway, "trace", "--output", output, "--summary-json", summary,
		"--", filepath.Join(dir, "no-such-command")))
	if res.ExitCode != 127 {
		t.Errorf("tracing a command that does not exist: exit %d, want 127\nstderr:\n%s", res.ExitCode, res.Stderr)
	}
	if data, err := os.ReadFile(output); err != nil || string(data) != kept {
		t.Errorf("--output after a command that could not run: %q, %v; want it unchanged", data, err)
	}
	if _, err := os.Stat(summary); !os.IsNotExist(err) {
		t.Errorf("--summary-json after a command that could not run: %v; want no file", err)
	}
	// Nor does one that is found but that exec refuses, once the probes are
	// attached: a script whose interpreter does not exist (127) and an
	// executable file that is neither ELF nor #! (126), as a shell says.
	harness.RequireBPF(t)
	for _, c := range []struct {
		name, text string
		status     int
	}{
		{"bad-interpreter", "#!/nonexistent/interpreter\n", 127},
		{"no-format", "echo hello\n", 126},
	} {
		prog := filepath.Join(dir, c.name)
		if err := os.WriteFile(prog, []byte(c.text), 0o755); err != nil {
			t.Fatal(err)
		}
		res = harness.Run(t, harness.Command(t, spillway, "trace", "--output", output, "--summary-json", summary, "--", prog))
		if res.ExitCode != c.status {
			t.Errorf("tracing %s: exit %d, want %d\nstderr:\n%s", c.name, res.ExitCode, c.status, res.Stderr)
		}
		if data, err := os.ReadFile(output); err != nil || string(data) != kept {
			t.Errorf("--output after %s could not run: %q, %v; want it unchanged", c.name, data, err)
		}
		if _, err := os.Stat(summary); !os.IsNotExist(err) {
			t.Errorf("--summary-json after %s could not run: %v; want no file", c.name, err)
		}
		fresh := filepath.Join(dir, "fresh-view.txt")
		res = harness.Run(t, harness.Command(t, spillway, "trace", "--output", fresh, "--", prog))
		if _, err := os.Stat(fresh); !os.IsNotExist(err) {
			t.Errorf("--output %s after %s could not run: %v; want no file left", fresh, c.name, err)
		}
	}
	// A session that starts replaces the output and writes the summary.
	res = harness.Run(t, harness.Command(t, spillway, "trace", "--output", output, "--summary-json", summary, "--", "true"))
	if res.ExitCode != 0 {
		t.Fatalf("tracing true: exit %d\nstderr:\n%s", res.ExitCode, res.Stderr)
	}
	if data, err := os.ReadFile(output); err != nil || strings.Contains(string(data), kept) || len(data) == 0 {
		t.Errorf("--output after a session: %q, %v; want the session's view alone", data, err)
	}
	readSummary(t, summary)
}
