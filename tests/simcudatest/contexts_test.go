package simcudatest

// Tests of simcuda's driver contexts, device attributes and the entry points
// real driver-API clients bind, from testdata/contexts.c linked against
// libcuda alone.

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

func TestContexts(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/contexts.c"},
		ProjectHeaders: true,
		Flags:          []string{"-L", harness.SimcudaDir(t), "-lcuda"},
	})
	cases := []struct {
		name string
		env  []string
		why  string
	}{
		{"stack", nil, "push, pop, set, create, destroy, attach and detach follow CUDA's per-thread context stack"},
		{"per_thread", nil, "a new thread has no current context"},
		{"ownership", nil, "memory belongs to the context it was allocated in; destroying the context frees it"},
		{"free_without_context", nil, "cuMemFree_v2 and cuMemFreeHost find the owner from the pointer, with no context current"},
		{"context_bytes", []string{"SIMCUDA_CONTEXT_BYTES=256MiB"}, "a created context takes its bytes and gives them back"},
		{"attributes", []string{"SIMCUDA_DEVICES=80GiB"}, "every CUdevice_attribute of CUDA 12.4 answers, nothing beyond"},
		{"synchronize", nil, "cuCtxSynchronize waits for the current context's streams, not another context's"},
		{"stream_context", []string{"SIMCUDA_DEVICES=2x1GiB"}, "cuStreamGetCtx names a stream's context; cuMemAllocAsync allocates on the stream's device, an explicit pool on its own"},
		{"create_forms", nil, "cuCtxCreate_v3 and _v4 make regular contexts without affinity, refuse affinity and CIG; cuGetProcAddress gives _v3 from CUDA 11.4"},
		{"reset_lifetimes", nil, "a primary context reset destroys the streams and events made in it, not those of a created context"},
		{"destroy_lifetimes", nil, "cuCtxDestroy destroys the streams and events made in the context, ending a capture begun on one; the primary context's stay"},
		{"context_reuse", nil, "destroyed contexts are reused, so a program that creates and destroys them for ever holds bounded memory"},
		{"pool_memory_outlives", nil, "cuCtxDestroy leaves memory from cuMemAllocAsync, cuMemAllocFromPoolAsync and cuMemCreate made in the context: it keeps its bytes and contents until freed from another context; a primary context reset frees the pool memory left"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Logf("expect: %s", c.why)
			stats := filepath.Join(t.TempDir(), "stats.json")
			cmd := harness.Command(t, bin, c.name)
			harness.SetEnv(cmd, append([]string{"SIMCUDA_STATS_FILE=" + stats}, c.env...)...)
			res := harness.Run(t, cmd)
			if res.ExitCode != 0 || !strings.Contains(res.Stdout, "PASS "+c.name) {
				t.Fatalf("contexts %s: exit %d\nstdout:\n%s\nstderr:\n%s", c.name, res.ExitCode, res.Stdout, res.Stderr)
			}
			dev := harness.ReadStats(t, stats).Devices[0]
			if dev.DeviceBytes != 0 || dev.LiveAllocations != 0 {
				t.Fatalf("device stats at exit %+v, want nothing left after every context is gone", dev)
			}
		})
	}
}

// TestIPC: a device allocation exported with cuIpcGetMemHandle is opened by
// another process, which reads and writes the same bytes; once the exporter
// frees it, the handle is refused. The handle exported is that of a pointer
// inside the allocation, which is the base's, and opens at the base.
func TestIPC(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/ipc.c"},
		ProjectHeaders: true,
		Flags:          []string{"-L", harness.SimcudaDir(t), "-lcuda"},
	})
	if d := ipcExchange(t, bin).Devices[0]; d.DeviceBytesPeak != 8<<20 || d.DeviceBytes != 0 {
		t.Errorf("exporter's device stats %+v, want an 8 MiB peak and nothing left", d)
	}
}

// TestRuntimeIPC: the same exchange through the runtime's cudaIpcGetMemHandle,
// cudaIpcOpenMemHandle and cudaIpcCloseMemHandle, with the runtime's error
// codes and last error for NULL, freed and stream-ordered memory, a handle
// opened in its own process, a wrong or stale handle and a second close.
// Each call reaches the driver's function, as NVIDIA's runtime does, so an
// interposer of the driver sees it.
func TestRuntimeIPC(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ipc_runtime.c"}, Cudart: true,
		ProjectHeaders: true})
	exported := ipcExchange(t, bin)
	if d := exported.Devices[0]; d.DeviceBytes != 0 || d.LiveAllocations != 0 {
		t.Errorf("exporter's device stats %+v, want nothing left", d)
	}
	calls := exported.Calls
	for rt, driver := range map[string]string{"cudaIpcGetMemHandle": "cuIpcGetMemHandle",
		"cudaIpcOpenMemHandle": "cuIpcOpenMemHandle_v2"} {
		if calls[rt] == 0 || calls[driver] != calls[rt] {
			t.Errorf("the exporter called %s %d times and the driver's %s %d times, want one driver "+
				"call for each", rt, calls[rt], driver, calls[driver])
		}
	}
}

// ipcExchange runs bin's three roles (ipc.c's): the exporter prints a
// handle, an importer opens it and writes, the exporter checks the bytes
// and frees, and a late importer finds the handle gone. It returns the
// exporter's statistics.
func ipcExchange(t *testing.T, bin string) harness.Stats {
	t.Helper()
	state := t.TempDir()
	stats := filepath.Join(t.TempDir(), "stats.json")
	exporter := harness.Command(t, bin, "export")
	harness.SetEnv(exporter, "SIMCUDA_STATE_DIR="+state, "SIMCUDA_STATS_FILE="+stats)
	stdin, lines, stderr := harness.StartPiped(t, exporter)
	defer func() {
		stdin.Close()
		_ = exporter.Wait()
	}()
	next := func(prefix string) string {
		t.Helper()
		if !lines.Scan() || !strings.HasPrefix(lines.Text(), prefix) {
			stdin.Close()
			_ = exporter.Wait()
			t.Fatalf("exporter: want a line %q, got %q\nstderr:\n%s", prefix, lines.Text(), stderr.String())
		}
		return strings.TrimPrefix(lines.Text(), prefix)
	}
	handle := next("handle ")

	importer := harness.Command(t, bin, "import", handle)
	harness.SetEnv(importer, "SIMCUDA_STATE_DIR="+state)
	if res := harness.Run(t, importer); res.ExitCode != 0 || !strings.Contains(res.Stdout, "PASS import") {
		t.Fatalf("importer: exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	fmt.Fprintln(stdin, "check")
	next("checked")
	stdin.Close()
	if err := exporter.Wait(); err != nil {
		t.Fatalf("exporter: %v\nstderr:\n%s", err, stderr.String())
	}

	late := harness.Command(t, bin, "gone", handle)
	harness.SetEnv(late, "SIMCUDA_STATE_DIR="+state)
	if res := harness.Run(t, late); res.ExitCode != 0 || !strings.Contains(res.Stdout, "PASS gone") {
		t.Fatalf("late importer: exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	return harness.ReadStats(t, stats)
}
