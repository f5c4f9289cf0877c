package shimtest

// Real CUDA clients under the shim, unmodified: numba.cuda (the primary
// context, through ctypes), pycuda (contexts of its own), pynvml and gpustat
// (NVML), each under a 64 MiB quota on simcuda. .ci/run installs them;
// without them these tests skip, except where everything must run
// (harness.Unavailable).

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

const (
	clientMiB   = 1 << 20
	clientQuota = 64 * clientMiB
)

// limitedClient prepares Debian's python3 running testdata/clients/<script>
// under the shim with a 64 MiB quota.
func limitedClient(t *testing.T, script string, env ...string) *exec.Cmd {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("testdata", "clients", script))
	if err != nil {
		t.Fatal(err)
	}
	cmd := harness.PythonCommand(t, path)
	harness.SetEnv(cmd, "LD_PRELOAD="+harness.Front(t), "SPILLWAY_MEMORY_LIMIT=64MiB")
	harness.SetEnv(cmd, env...)
	return cmd
}

// runLimitedClient runs script and decodes the JSON object it prints into seen.
func runLimitedClient(t *testing.T, script string, seen any, env ...string) {
	t.Helper()
	res := harness.Run(t, limitedClient(t, script, env...))
	if res.ExitCode != 0 {
		t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", script, res.ExitCode, res.Stdout, res.Stderr)
	}
	if err := json.Unmarshal([]byte(res.Stdout), seen); err != nil {
		t.Fatalf("%s printed no JSON object: %v\nstdout:\n%s\nstderr:\n%s", script, err, res.Stdout, res.Stderr)
	}
}

// peakWithinQuota checks simcuda's ground truth: the device never held more than the quota.
func peakWithinQuota(t *testing.T, stats string) {
	t.Helper()
	if peak := harness.ReadStats(t, stats).Devices[0].DeviceBytesPeak; peak > clientQuota {
		t.Errorf("simcuda held %d bytes at its peak, above the 64 MiB quota", peak)
	}
}

// runNumba runs a numba.cuda script under the 64 MiB quota on a 4 GiB
// simcuda device, with ALLOC_MIB=40 and env, decodes what it prints into
// seen, and checks the device never held more than the quota.
func runNumba(t *testing.T, script string, seen any, env ...string) {
	t.Helper()
	harness.RequirePythonModules(t, "numpy", "numba.cuda")
	stats := filepath.Join(t.TempDir(), "stats.json")
	runLimitedClient(t, script, seen, append([]string{"SIMCUDA_DEVICES=4GiB", "SIMCUDA_STATS_FILE=" + stats,
		"NUMBA_CUDA_DRIVER=" + filepath.Join(harness.SimcudaDir(t), "libcuda.so.1"), "ALLOC_MIB=40"}, env...)...)
	peakWithinQuota(t, stats)
}

// TestNumbaUnderQuota: numba.cuda sees the quota as the device's memory, and
// an allocation beyond it raises numba's CudaAPIError with
// CUDA_ERROR_OUT_OF_MEMORY; freeing makes room again.
func TestNumbaUnderQuota(t *testing.T) {
	var seen struct {
		Total         uint64 `json:"total"`
		FreeBefore    uint64 `json:"free_before"`
		FreeAllocated uint64 `json:"free_allocated"`
		Second        string `json:"second"`
		SecondCode    int    `json:"second_code"`
		SecondError   string `json:"second_error"`
		Third         string `json:"third"`
	}
	runNumba(t, "numba_limited.py", &seen)
	if seen.Total != clientQuota || seen.FreeBefore != clientQuota || seen.FreeAllocated != clientQuota-40*clientMiB {
		t.Errorf("get_memory_info: total %d, free %d -> %d after 40 MiB; want the 64 MiB quota, 64 MiB -> 24 MiB",
			seen.Total, seen.FreeBefore, seen.FreeAllocated)
	}
	if seen.Second != "refused" || seen.SecondCode != cuOutOfMemory || !strings.Contains(seen.SecondError, "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("a second 40 MiB array: %s (code %d, %q); want CudaAPIError with CUDA_ERROR_OUT_OF_MEMORY",
			seen.Second, seen.SecondCode, seen.SecondError)
	}
	if seen.Third != "allocated" {
		t.Errorf("40 MiB after freeing the first array: %s", seen.Third)
	}
}

// TestNumbaClose: numba's cuda.close() resets the primary context with
// cuDevicePrimaryCtxReset, and numba has no runtime: the pool goes with the
// context, the quota is whole again, and the next context's memory holds
// data.
func TestNumbaClose(t *testing.T) {
	var seen struct {
		FreeBeforeClose uint64 `json:"free_before_close"`
		FreeAfterClose  uint64 `json:"free_after_close"`
		Intact          bool   `json:"intact"`
		FreeAllocated   uint64 `json:"free_allocated"`
	}
	// The pool keeps what is freed cached (a release threshold of the whole
	// quota), in fixed segments, which are the context's allocations: only
	// the reset may end them.
	runNumba(t, "numba_close.py", &seen, "SPILLWAY_POOL_RELEASE_THRESHOLD=100%", "SPILLWAY_VMM=0")
	if seen.FreeBeforeClose != clientQuota-40*clientMiB || seen.FreeAfterClose != clientQuota ||
		seen.FreeAllocated != clientQuota-40*clientMiB {
		t.Errorf("free memory %d MiB with 40 MiB allocated, %d MiB after cuda.close(), %d MiB with 40 MiB again; want 24, 64, 24",
			seen.FreeBeforeClose/clientMiB, seen.FreeAfterClose/clientMiB, seen.FreeAllocated/clientMiB)
	}
	if !seen.Intact {
		t.Error("data copied through an array allocated after cuda.close() came back wrong")
	}
}

// TestPycudaUnderQuota: pycuda's contexts are contexts of its own (not the
// primary one): what it allocates in them counts against the quota, beyond
// which pycuda raises its MemoryError, and is given back when freed or when
// the context is detached.
func TestPycudaUnderQuota(t *testing.T) {
	harness.RequirePythonModules(t, "numpy", "pycuda.driver")
	var seen struct {
		Total         uint64 `json:"total"`
		FreeBefore    uint64 `json:"free_before"`
		FreeAllocated uint64 `json:"free_allocated"`
		Second        string `json:"second"`
		SecondError   string `json:"second_error"`
		InOther       string `json:"in_other"`
		Third         string `json:"third"`
		FreeEnd       uint64 `json:"free_end"`
	}
	stats := filepath.Join(t.TempDir(), "stats.json")
	runLimitedClient(t, "pycuda_limited.py", &seen, "SIMCUDA_DEVICES=4GiB", "SIMCUDA_STATS_FILE="+stats, "ALLOC_MIB=40")
	if seen.Total != clientQuota || seen.FreeBefore != clientQuota || seen.FreeAllocated != clientQuota-40*clientMiB {
		t.Errorf("mem_get_info: total %d, free %d -> %d after 40 MiB; want the 64 MiB quota, 64 MiB -> 24 MiB",
			seen.Total, seen.FreeBefore, seen.FreeAllocated)
	}
	if seen.Second != "refused" || !strings.Contains(seen.SecondError, "out of memory") {
		t.Errorf("a second 40 MiB allocation: %s (%q); want pycuda's MemoryError, out of memory", seen.Second, seen.SecondError)
	}
	if seen.InOther != "refused" || seen.Third != "allocated" || seen.FreeEnd != clientQuota-40*clientMiB {
		t.Errorf("second context: 40 MiB %s; after it was detached and the first freed: 40 MiB %s, free %d; want refused, allocated, 24 MiB",
			seen.InOther, seen.Third, seen.FreeEnd)
	}
	peakWithinQuota(t, stats)
}

// clientView is what a client script saw at one point: cuMemGetInfo, and
// NVML's used bytes for the device and for the process's own entry.
type clientView struct {
	Free        uint64 `json:"free"`
	Total       uint64 `json:"total"`
	NVMLUsed    uint64 `json:"nvml_used"`
	NVMLProcess uint64 `json:"nvml_process"`
}

// checkView checks that a view shows the 64 MiB quota with used bytes in
// use, by cuMemGetInfo and by NVML alike.
func checkView(t *testing.T, what string, v clientView, used uint64) {
	t.Helper()
	if v.Total != clientQuota || v.Free != clientQuota-used || v.NVMLUsed != used || v.NVMLProcess != used {
		t.Errorf("%s: mem_get_info %d of %d bytes free, NVML %d used (own process %d); want %d in use of the 64 MiB quota by both",
			what, v.Free, v.Total, v.NVMLUsed, v.NVMLProcess, used)
	}
}

// TestPycudaArraysUnderQuota: pycuda's CUDA arrays (pycuda.driver.Array:
// cuArrayCreate_v2 and cuArray3DCreate_v2, which it links directly) and
// pitched allocations (mem_alloc_pitch: cuMemAllocPitch_v2) count against
// the quota in its contexts, and cuMemGetInfo and NVML (pynvml, in the same
// process) agree on them: four 16 MiB arrays fill 64 MiB, the next is
// refused with pycuda's MemoryError, freeing one makes room; an array in a
// second context goes with it; a pitched allocation is charged its pitch
// times its rows; and in the primary context an array fits in memory just
// freed.
func TestPycudaArraysUnderQuota(t *testing.T) {
	harness.RequirePythonModules(t, "numpy", "pycuda.driver", "pynvml")
	var seen struct {
		Before         clientView   `json:"before"`
		Made           []clientView `json:"made"`
		Refused        string       `json:"refused"`
		FreedOne       clientView   `json:"freed_one"`
		MadeAgain      clientView   `json:"made_again"`
		Refused3D      string       `json:"refused_3d"`
		InOther        clientView   `json:"in_other"`
		OtherDetached  clientView   `json:"other_detached"`
		Pitch          uint64       `json:"pitch"`
		Pitched        clientView   `json:"pitched"`
		OneRowOver     string       `json:"one_row_over"`
		WholePitch     uint64       `json:"whole_pitch"`
		Whole          clientView   `json:"whole"`
		PrimaryFreed   clientView   `json:"primary_freed"`
		PrimaryArray   string       `json:"primary_array"`
		PrimaryWithArr clientView   `json:"primary_with_array"`
	}
	stats := filepath.Join(t.TempDir(), "stats.json")
	runLimitedClient(t, "pycuda_arrays.py", &seen, "SIMCUDA_DEVICES=4GiB", "SIMCUDA_STATS_FILE="+stats)
	checkView(t, "before any array", seen.Before, 0)
	if len(seen.Made) != 4 {
		t.Fatalf("%d arrays of 16 MiB fit in the 64 MiB quota, want 4 (refusal: %q)", len(seen.Made), seen.Refused)
	}
	for i, v := range seen.Made {
		checkView(t, fmt.Sprintf("with %d arrays", i+1), v, uint64(i+1)*16*clientMiB)
	}
	if !strings.Contains(seen.Refused, "cuArrayCreate failed: out of memory") ||
		!strings.Contains(seen.Refused3D, "cuArray3DCreate failed: out of memory") {
		t.Errorf("arrays past the quota: %q and %q; want pycuda's MemoryError, out of memory, from cuArrayCreate and cuArray3DCreate",
			seen.Refused, seen.Refused3D)
	}
	checkView(t, "one array freed", seen.FreedOne, 48*clientMiB)
	checkView(t, "an array made in its room", seen.MadeAgain, 64*clientMiB)
	checkView(t, "an array in a second context", seen.InOther, 16*clientMiB)
	checkView(t, "the second context detached", seen.OtherDetached, 0)
	if seen.Pitch != 1024 {
		t.Errorf("mem_alloc_pitch(1000, 100, 4) returned a pitch of %d bytes, want simcuda's 1024", seen.Pitch)
	}
	checkView(t, "100 rows of a 1024-byte pitch", seen.Pitched, 100*1024)
	if !strings.Contains(seen.OneRowOver, "refused: cuMemAllocPitch failed: out of memory") {
		t.Errorf("131073 rows of 1 byte at a 512-byte pitch (64 MiB + 512): %s; want pycuda's MemoryError", seen.OneRowOver)
	}
	if seen.WholePitch != 512 {
		t.Errorf("mem_alloc_pitch(1, 131072, 4) returned a pitch of %d bytes, want 512", seen.WholePitch)
	}
	checkView(t, "131072 rows at a 512-byte pitch", seen.Whole, 64*clientMiB)
	if seen.PrimaryFreed.Free != clientQuota {
		t.Errorf("primary context, 48 MiB allocated and freed: mem_get_info %d bytes free, want the whole 64 MiB",
			seen.PrimaryFreed.Free)
	}
	if seen.PrimaryArray != "allocated" {
		t.Fatalf("primary context, a 32 MiB array after freeing 48 MiB: %s", seen.PrimaryArray)
	}
	checkView(t, "primary context, a 32 MiB array", seen.PrimaryWithArr, 32*clientMiB)
	peakWithinQuota(t, stats)
}

// TestNVMLClientsUnderQuota: inside a process with a quota, pynvml and
// gpustat see the quota as the device's total and what Spillway counts as
// used (memory, BAR1, the process list); gpustat outside it sees the truth.
func TestNVMLClientsUnderQuota(t *testing.T) {
	harness.RequirePythonModules(t, "pynvml", "gpustat")
	state := t.TempDir()
	env := []string{"SIMCUDA_STATE_DIR=" + state, "SIMCUDA_DEVICES=8GiB"}
	cmd := limitedClient(t, "nvml_limited.py", append(env, "HOLD_MIB=16")...)
	cmd.Args = append(cmd.Args, "hold")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("nvml_limited.py: %v\n%s", err, stderr.String())
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("nvml_limited.py printed nothing: %v\n%s", err, stderr.String())
	}
	var inside struct {
		PID               int     `json:"pid"`
		Total             uint64  `json:"total"`
		Used              uint64  `json:"used"`
		Free              uint64  `json:"free"`
		Bar1Total         uint64  `json:"bar1_total"`
		ProcessUsed       *uint64 `json:"process_used"`
		GpustatTotalMiB   uint64  `json:"gpustat_total_mib"`
		GpustatUsedMiB    uint64  `json:"gpustat_used_mib"`
		GpustatProcessMiB *uint64 `json:"gpustat_process_mib"`
	}
	if err := json.Unmarshal([]byte(line), &inside); err != nil {
		t.Fatalf("nvml_limited.py: %v\n%s", err, line)
	}
	if inside.Total != clientQuota || inside.Used != 16*clientMiB || inside.Free != 48*clientMiB || inside.Bar1Total != clientQuota {
		t.Errorf("pynvml inside: total %d used %d free %d, BAR1 %d; want the 64 MiB quota, 16 MiB, 48 MiB, 64 MiB",
			inside.Total, inside.Used, inside.Free, inside.Bar1Total)
	}
	if inside.ProcessUsed == nil || *inside.ProcessUsed != 16*clientMiB {
		t.Errorf("pynvml's process list inside: own entry %v, want 16 MiB", inside.ProcessUsed)
	}
	if inside.GpustatTotalMiB != 64 || inside.GpustatUsedMiB != 16 || inside.GpustatProcessMiB == nil || *inside.GpustatProcessMiB != 16 {
		t.Errorf("gpustat inside: %d of %d MiB, own process %v; want 16 of 64, 16", inside.GpustatUsedMiB,
			inside.GpustatTotalMiB, inside.GpustatProcessMiB)
	}

	outside := harness.PythonCommand(t, "-m", "gpustat", "--json")
	harness.SetEnv(outside, env...)
	res := harness.Run(t, outside)
	if res.ExitCode != 0 {
		t.Fatalf("gpustat --json outside: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	var out struct {
		GPUs []struct {
			MemoryUsed  uint64 `json:"memory.used"`
			MemoryTotal uint64 `json:"memory.total"`
			Processes   []struct {
				PID            int    `json:"pid"`
				GPUMemoryUsage uint64 `json:"gpu_memory_usage"`
			} `json:"processes"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &out); err != nil || len(out.GPUs) != 1 {
		t.Fatalf("gpustat --json outside: %v\n%s", err, res.Stdout)
	}
	g := out.GPUs[0]
	// NVML's truth: the driver's reserve is in its total and its used (v1).
	reserved := uint64(harness.NVMLReserved >> 20)
	if g.MemoryTotal != 8192+reserved || g.MemoryUsed != reserved+16 || len(g.Processes) != 1 || g.Processes[0].PID != inside.PID ||
		g.Processes[0].GPUMemoryUsage != 16 {
		t.Errorf("gpustat outside: %d of %d MiB, processes %+v; want the truth: %d+16 of 8192+%d MiB, pid %s with 16 MiB",
			g.MemoryUsed, g.MemoryTotal, g.Processes, reserved, reserved, strconv.Itoa(inside.PID))
	}
}

// TestNumbaExtents: numba's device_extents (cuMemGetAddressRange) of a pooled
// array, or of a view into it, is that array's own allocation: its pointer
// and at least its bytes, short of the next 512 (the pool's rounding), not
// the segment the pool cut both arrays from.
func TestNumbaExtents(t *testing.T) {
	type extents struct {
		Ptr       uint64 `json:"ptr"`
		Begin     uint64 `json:"begin"`
		End       uint64 `json:"end"`
		ViewBegin uint64 `json:"view_begin"`
		ViewEnd   uint64 `json:"view_end"`
	}
	var seen struct{ A, B extents }
	runNumba(t, "numba_extents.py", &seen)
	for name, e := range map[string]extents{"first": seen.A, "second": seen.B} {
		if e.Begin != e.Ptr || e.End < e.Ptr+1000 || e.End >= e.Ptr+1000+512 {
			t.Errorf("%s 1000-byte array at %#x: extents [%#x, %#x), want [%#x, %#x up to %#x]",
				name, e.Ptr, e.Begin, e.End, e.Ptr, e.Ptr+1000, e.Ptr+1000+511)
		}
		if e.ViewBegin != e.Begin || e.ViewEnd != e.End {
			t.Errorf("%s array's view from byte 100: extents [%#x, %#x), want its array's [%#x, %#x)",
				name, e.ViewBegin, e.ViewEnd, e.Begin, e.End)
		}
	}
}

// numbaSuite is the part of numba's own test suite (shipped with Debian's
// python3-numba) that simcuda can run, with no kernel to compile: host
// and mapped allocations, pinned and mapped host memory registered with
// cuMemHostRegister, device memory objects and their deallocation,
// external memory managers, events, device reset, array attributes and
// streams.
var numbaSuite = []string{
	"numba.cuda.tests.cudadrv.test_host_alloc",
	"numba.cuda.tests.cudadrv.test_pinned",
	"numba.cuda.tests.cudadrv.test_cuda_memory",
	"numba.cuda.tests.cudadrv.test_deallocations",
	"numba.cuda.tests.cudadrv.test_emm_plugins",
	"numba.cuda.tests.cudadrv.test_events",
	"numba.cuda.tests.cudadrv.test_reset_device",
	"numba.cuda.tests.cudadrv.test_array_attr",
	"numba.cuda.tests.cudadrv.test_streams",
}

// numbaSkipsAlways are the tests of numbaSuite that numba itself skips
// unconditionally (@unittest.skip): this one corrupts its context.
var numbaSkipsAlways = map[string]bool{
	"test_failed_stream (numba.cuda.tests.cudadrv.test_streams.TestFailingStream.test_failed_stream)": true,
}

// TestNumbaOwnSuite runs numbaSuite on simcuda, then under the shim with a
// 64 MiB quota on fixed segments and on virtual memory: every test passes
// (but those numba always skips), and each has the same outcome under the
// shim as without it.
func TestNumbaOwnSuite(t *testing.T) {
	harness.RequirePythonModules(t, "numpy", "numba.cuda")
	run := func(t *testing.T, shim []string) map[string]string {
		t.Helper()
		cmd := harness.PythonCommand(t, append([]string{"-m", "unittest", "-v"}, numbaSuite...)...)
		harness.SetEnv(cmd, "SIMCUDA_DEVICES=4GiB",
			"NUMBA_CUDA_DRIVER="+filepath.Join(harness.SimcudaDir(t), "libcuda.so.1"))
		harness.SetEnv(cmd, shim...)
		res := harness.Run(t, cmd)
		if res.ExitCode != 0 {
			t.Fatalf("numba's tests failed (exit %d):\n%s", res.ExitCode, res.Stderr)
		}
		// unittest -v: "test_name (module.Class...) ... ok" on standard error.
		outcomes := map[string]string{}
		for _, line := range strings.Split(res.Stderr, "\n") {
			if name, outcome, ok := strings.Cut(line, " ... "); ok {
				outcomes[name] = outcome
			}
		}
		if len(outcomes) == 0 {
			t.Fatalf("no test outcome in numba's output:\n%s", res.Stderr)
		}
		return outcomes
	}
	plain := run(t, nil)
	for name, outcome := range plain {
		// A test skipped in both runs would match and check nothing.
		if outcome != "ok" && !numbaSkipsAlways[name] {
			t.Errorf("%s: %q on simcuda, want ok", name, outcome)
		}
	}
	for _, vmm := range []string{"0", "1"} {
		t.Run("vmm="+vmm, func(t *testing.T) {
			shimmed := run(t, []string{"LD_PRELOAD=" + harness.Front(t), "SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_VMM=" + vmm})
			for name, outcome := range plain {
				if shimmed[name] != outcome {
					t.Errorf("%s: %q under the shim, %q without it", name, shimmed[name], outcome)
				}
			}
			if len(shimmed) != len(plain) {
				t.Errorf("%d tests ran under the shim, %d without it", len(shimmed), len(plain))
			}
		})
	}
}
