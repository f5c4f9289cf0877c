package shimtest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// TestPooledIPC: cuIpcGetMemHandle of a pooled block is refused with
// CUDA_ERROR_INVALID_VALUE and one log line that says to run with
// SPILLWAY_POOL=0, however the program reaches it (linked, cuGetProcAddress,
// dlsym) and wherever the block lies in the pool's memory, and the block's
// CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE says so. CUDA's handle
// names the whole allocation behind a pointer, which for a pooled block is
// the pool's segment: the importer would open it at the segment's start and
// read another block's bytes. With SPILLWAY_POOL=0 the allocation is CUDA's
// own, and another process (under the shim too) opens it and reads the
// block's bytes at the offset the exporter sends. Nor does
// cuMemRetainAllocationHandle give a pooled block the pool's handle.
func TestPooledIPC(t *testing.T) {
	const cuInvalidValue, block = 1, 4096
	prog := ipcShare(t)
	for _, tc := range ipcCases {
		t.Run(tc.name, func(t *testing.T) {
			env := append([]string{"SIMCUDA_STATE_DIR=" + t.TempDir()}, tc.env...)
			export, finish := startExporter(t, prog, env, "export")
			capable, offset, handle := export[5:7], export[7], export[8]
			imported := harness.Output{}
			if export[2] == "0" { // shared: what does another process read?
				importer := harness.Shimmed(t, env, prog, "import", offset, handle)
				_, imported = harness.RunOK(t, importer)
			}
			stderr := finish()

			// cuMemAlloc's memory, pooled or not, has no handle of its own:
			// a pooled block's would be the pool's granule (virtual memory).
			if retain := export[9]; retain != "1" {
				t.Errorf("cuMemRetainAllocationHandle of the second block: %s, want %d (CUDA_ERROR_INVALID_VALUE)",
					retain, cuInvalidValue)
			}
			if !tc.shared {
				if export[1] != "1" || export[2] != "1" || export[3] != "1" || export[4] != "1" {
					detail := ""
					if len(imported) > 0 {
						read := imported.Line(t, "import", 0)
						detail = fmt.Sprintf("; the importer read %s of the block's %d bytes and %s of "+
							"the other block's", read[2], block, read[3])
					}
					t.Errorf("cuIpcGetMemHandle of the first block, the second, and the second as "+
						"cuGetProcAddress and dlsym hand it out: %v, want %d (CUDA_ERROR_INVALID_VALUE) "+
						"for each%s", export[1:5], cuInvalidValue, detail)
				}
				if capable[0] != "0" || capable[1] != "0" {
					t.Errorf("CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE of a pooled block from "+
						"cuPointerGetAttribute and cuPointerGetAttributes: %v, want 0 for both", capable)
				}
				checkIPCRefusalLogged(t, stderr)
				return
			}
			if export[1] != "0" || export[2] != "0" || export[3] != "0" || export[4] != "0" {
				t.Fatalf("cuIpcGetMemHandle with the pool off: %v, want 0 (CUDA_SUCCESS) for each\nstderr:\n%s",
					export[1:5], stderr)
			}
			if capable[0] != "1" || capable[1] != "1" {
				t.Errorf("CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE with the pool off, from "+
					"cuPointerGetAttribute and cuPointerGetAttributes: %v, want 1 for both", capable)
			}
			if read := imported.Line(t, "import", 0); read[1] != "0" || read[2] != "4096" {
				t.Errorf("the importer: rc %s, read %s of the block's %d bytes, want 0 and all of them",
					read[1], read[2], block)
			}
			if strings.Contains(stderr, "cuIpcGetMemHandle") {
				t.Errorf("with the pool off nothing is logged of cuIpcGetMemHandle\nstderr:\n%s", stderr)
			}
		})
	}
}

// TestPooledRuntimeIPC: the runtime's cudaIpcGetMemHandle, which PyTorch
// calls, reaches the shim's cuIpcGetMemHandle through cuGetProcAddress, as
// NVIDIA's runtime does: a pooled block from cudaMalloc is refused with
// cudaErrorInvalidValue, left as the last error, and the same log line. With
// SPILLWAY_POOL=0 the handle is CUDA's, and another process opens it with
// cudaIpcOpenMemHandle and reads the block's bytes.
func TestPooledRuntimeIPC(t *testing.T) {
	const cudaInvalidValue, block = 1, 4096
	prog := ipcShare(t)
	for _, tc := range ipcCases {
		t.Run(tc.name, func(t *testing.T) {
			env := append([]string{"SIMCUDA_STATE_DIR=" + t.TempDir()}, tc.env...)
			export, finish := startExporter(t, prog, env, "rtexport")
			rc, last, offset, handle := export[1], export[2], export[3], export[4]
			imported := harness.Output{}
			if rc == "0" {
				importer := harness.Shimmed(t, env, prog, "rtimport", offset, handle)
				_, imported = harness.RunOK(t, importer)
			}
			stderr := finish()

			if !tc.shared {
				if rc != "1" || last != "1" {
					detail := ""
					if len(imported) > 0 {
						read := imported.Line(t, "rtimport", 0)
						detail = fmt.Sprintf("; the importer read %s of the block's %d bytes and %s of "+
							"the other block's", read[2], block, read[3])
					}
					t.Errorf("cudaIpcGetMemHandle of a pooled block: %s, last error %s, want %d "+
						"(cudaErrorInvalidValue) for both%s", rc, last, cudaInvalidValue, detail)
				}
				checkIPCRefusalLogged(t, stderr)
				return
			}
			if rc != "0" || last != "0" {
				t.Fatalf("cudaIpcGetMemHandle with the pool off: %s, last error %s, want 0 (cudaSuccess) "+
					"for both\nstderr:\n%s", rc, last, stderr)
			}
			read := imported.Line(t, "rtimport", 0)
			if read[1] != "0" || read[2] != "4096" || read[4] != "0" {
				t.Errorf("the importer: cudaIpcOpenMemHandle and the copy %s, read %s of the block's %d bytes, "+
					"cudaIpcCloseMemHandle %s; want 0, all of them, 0", read[1], read[2], block, read[4])
			}
			if strings.Contains(stderr, "cuIpcGetMemHandle") {
				t.Errorf("with the pool off nothing is logged of cuIpcGetMemHandle\nstderr:\n%s", stderr)
			}
		})
	}
}

// ipcCases: the pool's two layouts, which refuse IPC, and the pool off, which shares.
var ipcCases = []struct {
	name   string
	env    []string
	shared bool
}{
	{"segments", []string{"SPILLWAY_MEMORY_LIMIT=256MiB", "SPILLWAY_VMM=0"}, false},
	{"virtual", []string{"SPILLWAY_MEMORY_LIMIT=256MiB"}, false},
	{"pool off", []string{"SPILLWAY_MEMORY_LIMIT=256MiB", "SPILLWAY_POOL=0"}, true},
}

func ipcShare(t *testing.T) string {
	return harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ipcshare.c"}, ProjectHeaders: true,
		Cudart: true, Flags: []string{"-lcuda", "-ldl"}})
}

// startExporter runs prog's exporting mode under the shim and returns the
// fields of the line it prints, and finish, which ends its input, waits
// for it to free its blocks and exit, and returns its stderr.
func startExporter(t *testing.T, prog string, env []string, mode string) ([]string, func() string) {
	t.Helper()
	exporter := harness.Shimmed(t, env, prog, mode)
	stdin, lines, stderr := harness.StartPiped(t, exporter)
	if !lines.Scan() {
		stdin.Close()
		_ = exporter.Wait()
		t.Fatalf("%s printed nothing\nstderr:\n%s", mode, stderr.String())
	}
	fields := harness.ParseOutput(lines.Text()).Line(t, mode, 0)
	finish := func() string {
		t.Helper()
		stdin.Close()
		if err := exporter.Wait(); err != nil {
			t.Fatalf("%s: %v\nstderr:\n%s", mode, err, stderr.String())
		}
		return stderr.String()
	}
	return fields, finish
}

// checkIPCRefusalLogged: one log line names cuIpcGetMemHandle and says to
// run with SPILLWAY_POOL=0.
func checkIPCRefusalLogged(t *testing.T, stderr string) {
	t.Helper()
	var said []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, "cuIpcGetMemHandle") {
			said = append(said, l)
		}
	}
	if len(said) != 1 || !strings.Contains(said[0], "SPILLWAY_POOL=0") || !strings.Contains(said[0], "pool") {
		t.Errorf("log lines naming cuIpcGetMemHandle: %q, want one that says to run with "+
			"SPILLWAY_POOL=0\nstderr:\n%s", said, stderr)
	}
}
