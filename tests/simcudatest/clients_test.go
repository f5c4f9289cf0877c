package simcudatest

// Real CUDA clients on simcuda, unmodified: Debian's pycuda (driver API),
// numba.cuda (driver API through ctypes, NUMBA_CUDA_DRIVER), pynvml and
// gpustat (NVML). .ci/run installs them; without them these tests skip,
// except where everything must run (harness.EverythingMustRun).

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

const clientMiB = 1 << 20

// runClient runs testdata/clients/<script> with Debian's python3 and env, and
// decodes the JSON object it prints into out.
func runClient(t *testing.T, script string, out any, env ...string) {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("testdata", "clients", script))
	if err != nil {
		t.Fatal(err)
	}
	cmd := harness.PythonCommand(t, path)
	harness.SetEnv(cmd, env...)
	res := harness.Run(t, cmd)
	if res.ExitCode != 0 {
		t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", script, res.ExitCode, res.Stdout, res.Stderr)
	}
	if err := json.Unmarshal([]byte(res.Stdout), out); err != nil {
		t.Fatalf("%s printed no JSON object: %v\nstdout:\n%s\nstderr:\n%s", script, err, res.Stdout, res.Stderr)
	}
}

func TestPycuda(t *testing.T) {
	harness.RequirePythonModules(t, "numpy", "pycuda.driver")
	var seen struct {
		Count                   int    `json:"count"`
		Name                    string `json:"name"`
		ComputeCapability       []int  `json:"compute_capability"`
		TotalMemory             uint64 `json:"total_memory"`
		Attributes              int    `json:"attributes"`
		Total                   uint64 `json:"total"`
		FreeBefore              uint64 `json:"free_before"`
		FreeAllocated           uint64 `json:"free_allocated"`
		Roundtrip               bool   `json:"roundtrip"`
		RegisteredRoundtrip     bool   `json:"registered_roundtrip"`
		RegisteredDevicePointer bool   `json:"registered_device_pointer"`
		FreeRegistered          uint64 `json:"free_registered"`
		OtherIsDistinct         bool   `json:"other_is_distinct"`
		CurrentIsOther          bool   `json:"current_is_other"`
		FreeInOther             uint64 `json:"free_in_other"`
		CurrentAfterPop         bool   `json:"current_after_pop"`
		CurrentAfterDetach      bool   `json:"current_after_detach"`
		FreeAfter               uint64 `json:"free_after"`
	}
	stats := filepath.Join(t.TempDir(), "stats.json")
	runClient(t, "pycuda_client.py", &seen, "SIMCUDA_DEVICES=2x8GiB", "SIMCUDA_STATS_FILE="+stats)

	const total = 8 << 30
	if seen.Count != 2 || seen.Name != "simcuda GPU 8GiB" || len(seen.ComputeCapability) != 2 ||
		seen.ComputeCapability[0] != 9 || seen.ComputeCapability[1] != 0 || seen.TotalMemory != total {
		t.Errorf("device as pycuda sees it: %+v, want 2 devices, the first \"simcuda GPU 8GiB\", 9.0, 8 GiB", seen)
	}
	// pycuda asks for every attribute its enum knows; one refusal would raise.
	if seen.Attributes < 100 {
		t.Errorf("pycuda read %d device attributes, want every one it knows (over 100)", seen.Attributes)
	}
	if seen.Total != total || seen.FreeBefore != total || seen.FreeAllocated != total-4*clientMiB ||
		seen.FreeInOther != total-5*clientMiB || seen.FreeAfter != total {
		t.Errorf("mem_get_info: total %d, free %d -> %d (4 MiB) -> %d (+1 MiB in a second context) -> %d (all freed); want %d, %d, %d, %d, %d",
			seen.Total, seen.FreeBefore, seen.FreeAllocated, seen.FreeInOther, seen.FreeAfter,
			total, total, total-4*clientMiB, total-5*clientMiB, total)
	}
	if !seen.Roundtrip {
		t.Error("memcpy_htod then memcpy_dtoh did not return the bytes written")
	}
	// register_host_memory: pinned in place, not device memory.
	if !seen.RegisteredRoundtrip || !seen.RegisteredDevicePointer || seen.FreeRegistered != total-4*clientMiB {
		t.Errorf("registered host memory: copy into it %v, device pointer its address %v, free %d; want true, true, %d",
			seen.RegisteredRoundtrip, seen.RegisteredDevicePointer, seen.FreeRegistered, total-4*clientMiB)
	}
	if !seen.OtherIsDistinct || !seen.CurrentIsOther || !seen.CurrentAfterPop || !seen.CurrentAfterDetach {
		t.Errorf("context stack as pycuda sees it: %+v; want a distinct second context, current until popped and detached", seen)
	}
	st := harness.ReadStats(t, stats)
	if st.Calls["cuCtxCreate_v2"] != 2 || st.Calls["cuCtxDetach"] == 0 && st.Calls["cuCtxDestroy_v2"] == 0 ||
		st.MemcpyBytes["h2d"] != 4*clientMiB || st.MemcpyBytes["d2h"] != 8*clientMiB {
		t.Errorf("simcuda's ground truth: calls %v, copies %v; want 2 cuCtxCreate_v2, a detach or destroy, 4 MiB to the device, 8 MiB back",
			st.Calls, st.MemcpyBytes)
	}
	if d := st.Devices[0]; d.DeviceBytes != 0 || d.DeviceBytesPeak != 5*clientMiB || d.LiveAllocations != 0 ||
		d.HostRegisteredBytes != 0 {
		t.Errorf("device 0 at exit: %+v, want nothing left (nor registered) and a 5 MiB peak", d)
	}
}

func TestNumbaCuda(t *testing.T) {
	harness.RequirePythonModules(t, "numpy", "numba.cuda")
	var seen struct {
		DriverAvailable  bool   `json:"driver_available"`
		Total            uint64 `json:"total"`
		FreeBefore       uint64 `json:"free_before"`
		FreeAllocated    uint64 `json:"free_allocated"`
		Roundtrip        bool   `json:"roundtrip"`
		ScratchRoundtrip bool   `json:"scratch_roundtrip"`
		FreeAfter        uint64 `json:"free_after"`
	}
	stats := filepath.Join(t.TempDir(), "stats.json")
	driver := filepath.Join(harness.SimcudaDir(t), "libcuda.so.1")
	runClient(t, "numba_client.py", &seen, "SIMCUDA_DEVICES=4GiB", "SIMCUDA_STATS_FILE="+stats,
		"NUMBA_CUDA_DRIVER="+driver)

	const total = 4 << 30
	if !seen.DriverAvailable {
		t.Fatal("numba reports the driver unavailable")
	}
	if seen.Total != total || seen.FreeBefore != total || seen.FreeAllocated != total-10*clientMiB || seen.FreeAfter != total {
		t.Errorf("get_memory_info: total %d, free %d -> %d (8 + 2 MiB) -> %d (freed); want %d, %d, %d, %d",
			seen.Total, seen.FreeBefore, seen.FreeAllocated, seen.FreeAfter, total, total, total-10*clientMiB, total)
	}
	if !seen.Roundtrip || !seen.ScratchRoundtrip {
		t.Errorf("to_device/copy_to_host round trips: %v, %v; want both true", seen.Roundtrip, seen.ScratchRoundtrip)
	}
	st := harness.ReadStats(t, stats)
	if st.Calls["cuMemAlloc_v2"] != 2 || st.Calls["cuMemFree_v2"] != 2 {
		t.Errorf("simcuda's ground truth: calls %v; want numba's 2 cuMemAlloc_v2 and 2 cuMemFree_v2", st.Calls)
	}
	if d := st.Devices[0]; d.DeviceBytesPeak != 10*clientMiB {
		t.Errorf("device 0 at exit: %+v, want a 10 MiB peak", d)
	}
}

// TestPynvml: pynvml lists a simcuda process with the memory it holds.
func TestPynvml(t *testing.T) {
	harness.RequirePythonModules(t, "pynvml")
	state := t.TempDir()
	holder := startNVMLHolder(t, buildNVMLHolder(t), state,
		nvmlHolderSpec{devices: "16GiB", sizes: []uint64{64 * clientMiB, 32 * clientMiB}})
	var seen struct {
		Driver  string `json:"driver"`
		Devices []struct {
			Index             int               `json:"index"`
			Name              string            `json:"name"`
			UUID              string            `json:"uuid"`
			Total             uint64            `json:"total"`
			Used              uint64            `json:"used"`
			Free              uint64            `json:"free"`
			Bar1Total         uint64            `json:"bar1_total"`
			BusID             string            `json:"bus_id"`
			UtilizationGPU    int               `json:"utilization_gpu"`
			Temperature       string            `json:"temperature"`
			Processes         map[string]uint64 `json:"processes"`
			GraphicsProcesses int               `json:"graphics_processes"`
		} `json:"devices"`
	}
	runClient(t, "nvml_client.py", &seen, "SIMCUDA_STATE_DIR="+state, "SIMCUDA_DEVICES=16GiB")
	if seen.Driver != "550.54.15" || len(seen.Devices) != 1 {
		t.Fatalf("pynvml sees driver %q and %d devices, want 550.54.15 and 1", seen.Driver, len(seen.Devices))
	}
	d := seen.Devices[0]
	// NVML's total is CUDA's 16 GiB and the driver's reserve, which
	// nvmlDeviceGetMemoryInfo (v1, pynvml's default) counts as used. BAR1
	// spans all of it: the next power of two.
	const capacity = 16 << 30
	if d.Index != 0 || d.Name != "simcuda GPU 16GiB" || !nvmlUUIDPattern.MatchString(d.UUID) ||
		d.BusID != "00000000:18:00.0" || d.Bar1Total != 32<<30 || d.UtilizationGPU != 0 ||
		d.Temperature != "not supported" || d.GraphicsProcesses != 0 {
		t.Errorf("device as pynvml sees it: %+v", d)
	}
	if d.Total != capacity+harness.NVMLReserved || d.Used != harness.NVMLReserved+96*clientMiB || d.Free != capacity-96*clientMiB {
		t.Errorf("memory info: total %d used %d free %d, want %d, %d, %d", d.Total, d.Used, d.Free,
			uint64(capacity+harness.NVMLReserved), harness.NVMLReserved+96*clientMiB, capacity-96*clientMiB)
	}
	want := map[string]uint64{strconv.Itoa(holder.pid): 96 * clientMiB}
	if len(d.Processes) != 1 || d.Processes[strconv.Itoa(holder.pid)] != want[strconv.Itoa(holder.pid)] {
		t.Errorf("compute processes %v, want %v", d.Processes, want)
	}
}

// TestGpustat: gpustat --json shows a simcuda process and its memory.
func TestGpustat(t *testing.T) {
	harness.RequirePythonModules(t, "gpustat")
	state := t.TempDir()
	holder := startNVMLHolder(t, buildNVMLHolder(t), state,
		nvmlHolderSpec{devices: "8GiB", sizes: []uint64{256 * clientMiB}})
	cmd := harness.PythonCommand(t, "-m", "gpustat", "--json")
	harness.SetEnv(cmd, "SIMCUDA_STATE_DIR="+state, "SIMCUDA_DEVICES=8GiB")
	res := harness.Run(t, cmd)
	if res.ExitCode != 0 {
		t.Fatalf("gpustat --json: exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	var out struct {
		DriverVersion string `json:"driver_version"`
		GPUs          []struct {
			Index       int    `json:"index"`
			Name        string `json:"name"`
			MemoryUsed  uint64 `json:"memory.used"`
			MemoryTotal uint64 `json:"memory.total"`
			Processes   []struct {
				PID            int    `json:"pid"`
				GPUMemoryUsage uint64 `json:"gpu_memory_usage"`
			} `json:"processes"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &out); err != nil {
		t.Fatalf("gpustat --json: %v\n%s", err, res.Stdout)
	}
	if out.DriverVersion != "550.54.15" || len(out.GPUs) != 1 {
		t.Fatalf("gpustat: driver %q, %d GPUs; want 550.54.15 and 1\n%s", out.DriverVersion, len(out.GPUs), res.Stdout)
	}
	g := out.GPUs[0]
	// gpustat reports MiB, from nvmlDeviceGetMemoryInfo (v1): the driver's
	// reserve is in the total and in what is used, as on a GPU.
	reserved := uint64(harness.NVMLReserved >> 20)
	if g.Index != 0 || g.Name != "simcuda GPU 8GiB" || g.MemoryTotal != 8192+reserved || g.MemoryUsed != reserved+256 {
		t.Errorf("gpustat GPU: %+v, want index 0, \"simcuda GPU 8GiB\", %d+256 of 8192+%d MiB used", g, reserved, reserved)
	}
	if len(g.Processes) != 1 || g.Processes[0].PID != holder.pid || g.Processes[0].GPUMemoryUsage != 256 {
		t.Errorf("gpustat processes: %+v, want pid %d with 256 MiB", g.Processes, holder.pid)
	}
}
