// Package harness builds and runs the C programs of Spillway's end-to-end
// tests against simcuda, the project's simulated CUDA stack.
//
// Every end-to-end test goes through the real dynamic linker: programs are
// compiled with gcc against build/simcuda and started as separate processes,
// so the shim and simcuda are exercised exactly as an application would
// exercise them.
//
// Besides building and starting programs, it holds what the suites that run
// programs under the shim share (tests/pooltest, tests/shimtest,
// tests/spilltest): the preloaded library, the scriptable ops program, the
// parsing of a program's output lines and of the shim's SPILLWAY_REPORT
// lines, and the CUDA error codes those suites expect.
//
// The harness only builds, starts and reads results; it must never decide a
// test's outcome on its own or hide a missing prerequisite (a missing build
// output fails the test, it is not skipped). The functions that take a test
// and fail it, such as RunOK or CheckConfigError, assert only what their
// caller asks of them.
package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// runTimeout bounds one child process. It is a watchdog against hangs, not
// a performance expectation: tests never assert on elapsed time.
const runTimeout = 2 * time.Minute

var (
	rootOnce sync.Once
	rootDir  string
	rootErr  error
)

// Root returns the repository root: the nearest directory above the
// harness's own source file that holds go.mod.
func Root(t testing.TB) string {
	t.Helper()
	rootOnce.Do(func() {
		_, file, _, ok := runtime.Caller(0)
		if !ok {
			rootErr = errors.New("harness: cannot locate its own source file")
			return
		}
		dir := filepath.Dir(file)
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				rootDir = dir
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				rootErr = errors.New("harness: no go.mod above " + filepath.Dir(file))
				return
			}
			dir = parent
		}
	})
	if rootErr != nil {
		t.Fatal(rootErr)
	}
	return rootDir
}

// NVMLReserved is the device memory simcuda's driver sets aside for itself
// on every device (SIMCUDA_DRIVER_RESERVED_BYTES in tests/simcuda/devices.h):
// NVML's total is a device's CUDA total (its SIMCUDA_DEVICES size) plus this,
// which nvmlDeviceGetMemoryInfo counts as used and _v2 reports as reserved.
const NVMLReserved = 456 << 20

// SimcudaDir returns build/simcuda, failing the test when simcuda is not built.
func SimcudaDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(Root(t), "build", "simcuda")
	mustExist(t, filepath.Join(dir, "libcudart.so.12"))
	return dir
}

// LibDir returns build/lib, where the shim's front and core are built.
func LibDir(t testing.TB) string {
	t.Helper()
	return filepath.Join(Root(t), "build", "lib")
}

// Bin returns build/bin/<name>, failing the test when it is not built.
func Bin(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join(Root(t), "build", "bin", name)
	mustExist(t, path)
	return path
}

// IncludeDir returns the folder holding the project's CUDA declarations.
func IncludeDir(t testing.TB) string {
	t.Helper()
	return filepath.Join(Root(t), "interpose", "include")
}

func mustExist(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s is missing (run `make` at the repository root first): %v", path, err)
	}
}

// CBuild describes one gcc invocation.
type CBuild struct {
	Sources        []string // relative to the test's package directory, or absolute
	Out            string   // output file name inside a temp dir (default: first source's base name)
	Shared         bool     // build a shared object (-shared -fPIC)
	Cudart         bool     // link the simcuda runtime dynamically (-lcudart)
	StaticCudart   bool     // link build/simcuda/libcudart_static.a
	ProjectHeaders bool     // -I interpose/include
	Flags          []string // extra compiler and linker flags
}

// Compile builds b with gcc and returns the path of the output.
func Compile(t testing.TB, b CBuild) string {
	t.Helper()
	if len(b.Sources) == 0 {
		t.Fatal("harness.Compile: no sources")
	}
	out := b.Out
	if out == "" {
		out = strings.TrimSuffix(filepath.Base(b.Sources[0]), filepath.Ext(b.Sources[0]))
		if b.Shared {
			out = "lib" + out + ".so"
		}
	}
	out = filepath.Join(t.TempDir(), out)

	args := []string{"-std=c11", "-D_GNU_SOURCE", "-O1", "-g", "-Wall", "-Werror", "-pthread", "-o", out}
	if b.Shared {
		args = append(args, "-shared", "-fPIC")
	}
	if b.ProjectHeaders {
		args = append(args, "-I", IncludeDir(t))
	}
	for _, src := range b.Sources {
		if !filepath.IsAbs(src) {
			abs, err := filepath.Abs(src)
			if err != nil {
				t.Fatalf("harness.Compile: %s: %v", src, err)
			}
			src = abs
		}
		args = append(args, src)
	}
	if b.Cudart {
		args = append(args, "-L", SimcudaDir(t), "-lcudart")
	}
	if b.StaticCudart {
		static := filepath.Join(SimcudaDir(t), "libcudart_static.a")
		mustExist(t, static)
		args = append(args, static, "-ldl", "-lrt")
	}
	args = append(args, b.Flags...)

	cmd := exec.Command("gcc", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// Command prepares path to run against simcuda with a clean environment:
// no inherited SPILLWAY_*, SIMCUDA_*, LD_PRELOAD or CUDA_VISIBLE_DEVICES
// (simcuda honours it), the simcuda libraries on LD_LIBRARY_PATH, and a
// state folder of its own.
func Command(t testing.TB, path string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(path, args...)
	env := make([]string, 0, len(os.Environ())+2)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "SPILLWAY_") || strings.HasPrefix(name, "SIMCUDA_") ||
			name == "LD_PRELOAD" || name == "LD_LIBRARY_PATH" || name == "CUDA_VISIBLE_DEVICES" {
			continue
		}
		env = append(env, kv)
	}
	cmd.Env = append(env,
		"LD_LIBRARY_PATH="+SimcudaDir(t),
		"SIMCUDA_STATE_DIR="+t.TempDir(),
	)
	return cmd
}

// SetEnv sets "K=V" entries on cmd, replacing earlier values of the same K.
func SetEnv(cmd *exec.Cmd, kv ...string) {
	for _, entry := range kv {
		name, _, _ := strings.Cut(entry, "=")
		kept := cmd.Env[:0]
		for _, old := range cmd.Env {
			if oldName, _, _ := strings.Cut(old, "="); oldName != name {
				kept = append(kept, old)
			}
		}
		cmd.Env = append(kept, entry)
	}
}

// Result is what a finished child process left behind.
type Result struct {
	Stdout, Stderr string
	ExitCode       int // -1 when killed by a signal
}

// Run starts cmd in a process group of its own, waits for it under a
// watchdog and returns its output. A child that outlives the watchdog is
// killed with its whole group and fails the test.
func Run(t testing.TB, cmd *exec.Cmd) Result {
	t.Helper()
	return RunWithin(t, cmd, runTimeout)
}

// RunWithin is Run with a watchdog of limit instead of runTimeout, for a
// child that does minutes of work by design (a trace replayed under
// tracing): a watchdog near its running time would fail it on a machine
// merely busier than usual.
func RunWithin(t testing.TB, cmd *exec.Cmd, limit time.Duration) Result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if cmd.Stdout == nil {
		cmd.Stdout = &stdout
	}
	if cmd.Stderr == nil {
		cmd.Stderr = &stderr
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	err := WaitWithin(t, cmd, limit)
	res := Result{Stdout: stdout.String(), Stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		res.ExitCode = exitErr.ExitCode()
	default:
		t.Fatalf("wait %s: %v", cmd.Path, err)
	}
	return res
}

// WaitWithin waits for a started cmd under a watchdog of limit and returns
// what cmd.Wait returns. A child that outlives the watchdog is killed, with
// its whole group when it leads one, and fails the test, showing what it
// wrote where its output is collected in memory (a bytes.Buffer, a
// strings.Builder).
func WaitWithin(t testing.TB, cmd *exec.Cmd, limit time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	if cmd.SysProcAttr != nil && cmd.SysProcAttr.Setpgid {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	} else {
		_ = cmd.Process.Kill()
	}
	<-done
	collected := func(w io.Writer) string {
		if s, ok := w.(fmt.Stringer); ok {
			return s.String()
		}
		return "(not collected)\n"
	}
	t.Fatalf("%s %v did not finish within %v\nstdout:\n%s\nstderr:\n%s",
		cmd.Path, cmd.Args[1:], limit, collected(cmd.Stdout), collected(cmd.Stderr))
	return nil
}

// StartPiped starts cmd for a conversation: it returns a pipe to its input,
// a scanner over its output lines and the stderr it collects. The caller
// closes stdin and waits for cmd.
func StartPiped(t testing.TB, cmd *exec.Cmd) (io.WriteCloser, *bufio.Scanner, *strings.Builder) {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &strings.Builder{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return stdin, bufio.NewScanner(stdout), stderr
}

// Stats is simcuda's ground truth, written at exit to SIMCUDA_STATS_FILE.
type Stats struct {
	Devices     []DeviceStats     `json:"devices"`
	Calls       map[string]uint64 `json:"calls"`
	MemcpyBytes map[string]uint64 `json:"memcpy_bytes"` // h2d, d2h, d2d, h2h
}

// DeviceStats is one device's part of Stats.
type DeviceStats struct {
	Ordinal             int    `json:"ordinal"`
	CapacityBytes       uint64 `json:"capacity_bytes"`
	DeviceBytes         uint64 `json:"device_bytes"`
	DeviceBytesPeak     uint64 `json:"device_bytes_peak"`
	ManagedDeviceBytes  uint64 `json:"managed_device_bytes"`
	ManagedHostBytes    uint64 `json:"managed_host_bytes"`
	HostPinnedBytes     uint64 `json:"host_pinned_bytes"`
	HostRegisteredBytes uint64 `json:"host_registered_bytes"`
	LiveAllocations     uint64 `json:"live_allocations"`
}

// ReadStats parses the stats file a simcuda process wrote at exit.
func ReadStats(t testing.TB, path string) Stats {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read simcuda stats: %v", err)
	}
	var s Stats
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("parse simcuda stats %s: %v\n%s", path, err, data)
	}
	return s
}
