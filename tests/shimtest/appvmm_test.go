package shimtest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// The application's own virtual-memory calls under a quota, edge by edge,
// each run of testdata/appvmm.c ending with what the shim reports
// (cuMemGetInfo_v2, cudaMemGetInfo, NVML) compared with simcuda's ground
// truth at exit.

const cuInvalidValue = 1

// appTruth is simcuda's ground truth at exit: device 0's physical memory
// of cuMemCreate, and the host-located memory of it.
type appTruth struct {
	DeviceVMM, HostVMM, DevicePeak uint64
	Handles                        uint64
}

func readAppTruth(t *testing.T, path string) appTruth {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read simcuda stats: %v", err)
	}
	var s struct {
		Devices []struct {
			Peak uint64 `json:"device_bytes_peak"`
			VMM  uint64 `json:"vmm_physical_bytes"`
		}
		VMM struct {
			Host    uint64 `json:"host_physical_bytes"`
			Handles uint64 `json:"handles"`
		}
	}
	if err := json.Unmarshal(data, &s); err != nil || len(s.Devices) == 0 {
		t.Fatalf("parse simcuda stats %s: %v\n%s", path, err, data)
	}
	return appTruth{DeviceVMM: s.Devices[0].VMM, HostVMM: s.VMM.Host, DevicePeak: s.Devices[0].Peak, Handles: s.VMM.Handles}
}

// runApp runs appvmm with ops under quota (the pool in fixed segments, so
// that simcuda's figures are the program's handles alone) and vars, then
// checks that the device never held more than the quota and that the
// shim's three reports at exit agree with simcuda: what they say is used is
// exactly the physical memory simcuda still holds for the program.
func runApp(t *testing.T, quota uint64, vars []string, ops ...string) (harness.Output, appTruth) {
	t.Helper()
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/appvmm.c"}, Cudart: true, ProjectHeaders: true,
		Flags: []string{"-lcuda", "-lnvidia-ml"}})
	stats := filepath.Join(t.TempDir(), "stats.json")
	env := append([]string{"SPILLWAY_MEMORY_LIMIT=" + sizeArg(quota), "SIMCUDA_STATS_FILE=" + stats, "SPILLWAY_VMM=0"}, vars...)
	ops = append(ops, "info", "rtinfo", "nvml")
	_, out := harness.RunOK(t, harness.Shimmed(t, env, prog, ops...))
	truth := readAppTruth(t, stats)
	if truth.DevicePeak > quota {
		t.Errorf("simcuda held %d bytes at its peak, above the quota of %d\n%v", truth.DevicePeak, quota, out)
	}
	last := func(op string) int { return out.Count(op) - 1 }
	if free, total := out.Num(t, "info", last("info"), 2), out.Num(t, "info", last("info"), 3); total != quota || free != quota-truth.DeviceVMM {
		t.Errorf("cuMemGetInfo_v2 at exit: %d free of %d, want %d of %d (simcuda holds %d bytes of cuMemCreate memory)\n%v",
			free, total, quota-truth.DeviceVMM, quota, truth.DeviceVMM, out)
	}
	if free := out.Num(t, "rtinfo", 0, 2); free != quota-truth.DeviceVMM {
		t.Errorf("cudaMemGetInfo at exit: %d free, want %d (simcuda holds %d bytes)", free, quota-truth.DeviceVMM, truth.DeviceVMM)
	}
	if used := out.Num(t, "nvml", last("nvml"), 3); used != truth.DeviceVMM {
		t.Errorf("NVML at exit: %d used, want the %d bytes simcuda holds", used, truth.DeviceVMM)
	}
	return out, truth
}

// used returns what the i-th info line says is used of quota.
func used(t *testing.T, out harness.Output, quota uint64, i int) uint64 {
	t.Helper()
	return quota - out.Num(t, "info", i, 2)
}

// checkUsed checks the info lines, in order, against want (MiB each).
func checkUsed(t *testing.T, out harness.Output, quota uint64, want ...uint64) {
	t.Helper()
	for i, w := range want {
		if u := used(t, out, quota, i); u != w<<20 {
			t.Errorf("cuMemGetInfo_v2 #%d: %d MiB used, want %d MiB\n%v", i, u>>20, w, out)
		}
	}
}

// TestAppVMMRetainNeedsTwoReleases: cuMemRetainAllocationHandle of an
// address inside a mapping (not its start) is one more reference: the
// memory stays counted after the mapping is gone and the creating handle
// released, until the retained handle is released too.
func TestAppVMMRetainNeedsTwoReleases(t *testing.T) {
	out, truth := runApp(t, 8<<20, nil,
		"reserve", "64M", "create", "4M", "map", "0", "0", "4M", "retain", "3M", "info",
		"release", "0", "unmap", "0", "4M", "info", "create", "6M", "release", "1", "info", "create", "6M")
	checkSteps(t, out, []step{{"create", 0, cuSuccess}, {"map", 0, cuSuccess}, {"retain", 0, cuSuccess},
		{"release", 0, cuSuccess}, {"unmap", 0, cuSuccess}, {"create", 1, cuOutOfMemory},
		{"release", 1, cuSuccess}, {"create", 2, cuSuccess}})
	checkUsed(t, out, 8<<20, 4, 4, 0, 6)
	if truth.DeviceVMM != 6<<20 {
		t.Errorf("simcuda holds %d bytes, want the last 6 MiB handle", truth.DeviceVMM)
	}
}

// TestAppVMMReleaseUnmapOrders: a handle mapped at two addresses is given
// back only with its last reference and its last mapping, whichever comes
// last: released first then unmapped one mapping at a time, or unmapped
// first then released.
func TestAppVMMReleaseUnmapOrders(t *testing.T) {
	out, truth := runApp(t, 8<<20, nil,
		"reserve", "64M",
		"create", "2M", "map", "0", "0", "2M", "map", "0", "8M", "2M", "info", // h0 twice: 2 MiB
		"release", "0", "unmap", "8M", "2M", "info", "unmap", "0", "2M", "info", // released, then unmapped twice
		"create", "2M", "map", "1", "0", "2M", "map", "1", "2M", "2M", "unmap", "2M", "2M", "unmap", "0", "2M", "info",
		"release", "1", "info")
	checkSteps(t, out, []step{{"create", 0, cuSuccess}, {"map", 0, cuSuccess}, {"map", 1, cuSuccess},
		{"release", 0, cuSuccess}, {"unmap", 0, cuSuccess}, {"unmap", 1, cuSuccess},
		{"create", 1, cuSuccess}, {"map", 2, cuSuccess}, {"map", 3, cuSuccess}, {"unmap", 2, cuSuccess},
		{"unmap", 3, cuSuccess}, {"release", 1, cuSuccess}})
	checkUsed(t, out, 8<<20, 2, 2, 0, 2, 0)
	if truth.DeviceVMM != 0 {
		t.Errorf("simcuda holds %d bytes at exit, want 0", truth.DeviceVMM)
	}
}

// TestAppVMMUnmapSpansMappings: one cuMemUnmap of a range covering the
// mappings of two released handles (and a handle mapped twice side by
// side) frees them all.
func TestAppVMMUnmapSpansMappings(t *testing.T) {
	out, _ := runApp(t, 8<<20, nil,
		"reserve", "64M", "create", "2M", "create", "4M",
		"map", "0", "0", "2M", "map", "1", "2M", "4M", "map", "0", "6M", "2M", "info",
		"release", "0", "release", "1", "info", "unmap", "0", "8M", "info", "create", "8M")
	checkSteps(t, out, []step{{"create", 0, cuSuccess}, {"create", 1, cuSuccess}, {"map", 0, cuSuccess},
		{"map", 1, cuSuccess}, {"map", 2, cuSuccess}, {"release", 0, cuSuccess}, {"release", 1, cuSuccess},
		{"unmap", 0, cuSuccess}, {"create", 2, cuSuccess}})
	checkUsed(t, out, 8<<20, 6, 6, 0)
}

// TestAppVMMFailedCalls: a cuMemCreate the driver fails (out of memory, or
// another error) leaves nothing counted; a cuMemMap it fails leaves the
// handle counted once, and its release gives it back.
func TestAppVMMFailedCalls(t *testing.T) {
	out, truth := runApp(t, 8<<20, []string{"SIMCUDA_FAIL=cuMemCreate:2,cuMemCreate:3=101,cuMemMap:1"},
		"reserve", "64M", "create", "2M", "create", "2M", "create", "2M", "info",
		"map", "0", "0", "2M", "info", "map", "0", "0", "2M", "create", "6M", "release", "0", "info",
		"unmap", "0", "2M", "info", "create", "8M")
	checkSteps(t, out, []step{{"create", 0, cuSuccess}, {"create", 1, cuOutOfMemory}, {"create", 2, 101},
		{"map", 0, cuOutOfMemory}, {"map", 1, cuSuccess}, {"create", 3, cuSuccess}, {"release", 0, cuSuccess},
		{"unmap", 0, cuSuccess}, {"create", 4, cuOutOfMemory}})
	checkUsed(t, out, 8<<20, 2, 2, 8, 6)
	if truth.DeviceVMM != 6<<20 {
		t.Errorf("simcuda holds %d bytes, want the 6 MiB handle", truth.DeviceVMM)
	}
}

// TestAppVMMExportImportOwnHandle: a handle exported and imported again in
// the same process is the same physical memory: counted once, and given
// back when every reference and mapping is gone, whether the import came
// while the original was live or after it was released but still mapped.
func TestAppVMMExportImportOwnHandle(t *testing.T) {
	out, truth := runApp(t, 8<<20, nil,
		"reserve", "64M", "createx", "4M", "export", "0", "import", "0", "info", "create", "4M", // h1: the import
		"map", "1", "0", "4M", "release", "0", "release", "1", "info", // released both, still mapped
		"import", "0", "unmap", "0", "4M", "info", "release", "3", "info", "create", "8M")
	checkSteps(t, out, []step{{"createx", 0, cuSuccess}, {"export", 0, cuSuccess}, {"import", 0, cuSuccess},
		{"create", 0, cuSuccess}, {"map", 0, cuSuccess}, {"release", 0, cuSuccess}, {"release", 1, cuSuccess},
		{"import", 1, cuSuccess}, {"unmap", 0, cuSuccess}, {"release", 2, cuSuccess}, {"create", 1, cuOutOfMemory}})
	checkUsed(t, out, 8<<20, 4, 8, 8, 4)
	if truth.DeviceVMM != 4<<20 {
		t.Errorf("simcuda holds %d bytes, want the 4 MiB handle", truth.DeviceVMM)
	}
}

// TestAppVMMThreads: threads creating, mapping, unmapping and releasing
// handles concurrently (half of the rounds releasing before unmapping)
// leave the quota whole, with room for all (exactly full) and without.
func TestAppVMMThreads(t *testing.T) {
	for _, c := range []struct {
		quota   uint64
		refused bool
	}{{16 << 20, false}, {6 << 20, true}} {
		out, truth := runApp(t, c.quota, nil, "reserve", "64M", "threads", "8", "300", "2M", "info", "create", sizeArg(c.quota)[:len(sizeArg(c.quota))-2]+"M")
		if failed, refused := out.Num(t, "threads", 0, 1), out.Num(t, "threads", 0, 2); failed != 0 || (refused != 0) != c.refused {
			t.Errorf("quota %d MiB: %d calls failed, %d cuMemCreate refused; want none failed, refusals %v", c.quota>>20, failed, refused, c.refused)
		}
		checkUsed(t, out, c.quota, 0, c.quota>>20)
		if truth.DeviceVMM != c.quota {
			t.Errorf("simcuda holds %d bytes, want the whole quota's handle", truth.DeviceVMM)
		}
	}
}

// TestAppVMMAddressFreeWhileMapped: cuMemAddressFree of a range still
// mapped is refused and changes nothing; once unmapped it is freed.
func TestAppVMMAddressFreeWhileMapped(t *testing.T) {
	out, _ := runApp(t, 8<<20, nil,
		"reserve", "64M", "create", "2M", "map", "0", "0", "2M", "release", "0", "afree", "info",
		"unmap", "0", "2M", "afree", "info")
	checkSteps(t, out, []step{{"afree", 0, cuInvalidValue}, {"unmap", 0, cuSuccess}, {"afree", 1, cuSuccess}})
	checkUsed(t, out, 8<<20, 2, 0)
}

// TestAppVMMResetWithHandles: handles alive (mapped, released or not)
// across cuDevicePrimaryCtxReset_v2 and cudaDeviceReset stay counted, and
// are given back when CUDA frees them after the reset.
func TestAppVMMResetWithHandles(t *testing.T) {
	out, truth := runApp(t, 8<<20, nil,
		"reserve", "64M", "create", "2M", "create", "2M", "map", "0", "0", "2M", "release", "0",
		"reset", "info", "create", "6M", "unmap", "0", "2M", "info",
		"rtreset", "info", "map", "1", "0", "2M", "release", "1", "rtreset", "info", "unmap", "0", "2M", "info",
		"create", "8M")
	checkSteps(t, out, []step{{"reset", 0, cuSuccess}, {"create", 2, cuOutOfMemory}, {"unmap", 0, cuSuccess},
		{"rtreset", 0, 0}, {"map", 1, cuSuccess}, {"release", 1, cuSuccess}, {"rtreset", 1, 0},
		{"unmap", 1, cuSuccess}, {"create", 3, cuSuccess}})
	checkUsed(t, out, 8<<20, 4, 2, 2, 2, 0)
	if truth.DeviceVMM != 8<<20 {
		t.Errorf("simcuda holds %d bytes, want the 8 MiB handle", truth.DeviceVMM)
	}
}

// TestAppVMMOversubscribedLifetimes: with oversubscription, a handle
// placed on the host follows the same lifetime rules (retained, mapped
// twice, released before unmapped) and gives the host limit back; one that
// cannot live on the host (exportable) is refused with
// CUDA_ERROR_OUT_OF_MEMORY; the device's reports never count host memory.
func TestAppVMMOversubscribedLifetimes(t *testing.T) {
	out, truth := runApp(t, 4<<20, []string{"SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_HOST_LIMIT=4MiB"},
		"reserve", "64M", "create", "4M", "create", "4M", "createx", "2M", "create", "2M", "info", // h0 device, h1 host
		"map", "1", "0", "4M", "map", "1", "8M", "4M", "retain", "9M", "release", "1", "unmap", "0", "4M",
		"create", "2M", "release", "2", "unmap", "8M", "4M", "reset", "create", "4M", "info")
	checkSteps(t, out, []step{{"create", 0, cuSuccess}, {"create", 1, cuSuccess}, {"createx", 0, cuOutOfMemory},
		{"create", 2, cuOutOfMemory}, {"map", 0, cuSuccess}, {"map", 1, cuSuccess}, {"retain", 0, cuSuccess},
		{"release", 0, cuSuccess}, {"unmap", 0, cuSuccess}, {"create", 3, cuOutOfMemory}, {"release", 1, cuSuccess},
		{"unmap", 1, cuSuccess}, {"reset", 0, cuSuccess}, {"create", 4, cuSuccess}})
	checkUsed(t, out, 4<<20, 4, 4)
	if truth.DeviceVMM != 4<<20 || truth.HostVMM != 4<<20 {
		t.Errorf("simcuda holds %d bytes on the device and %d on the host, want 4 MiB each", truth.DeviceVMM, truth.HostVMM)
	}
}

// TestAppVMMThroughEntryPoints: a program that finds the virtual-memory
// calls with cudaGetDriverEntryPoint, as PyTorch does, is counted as one
// linked against them: retained, imported, mapped twice, released and
// unmapped in either order, all given back.
func TestAppVMMThroughEntryPoints(t *testing.T) {
	out, truth := runApp(t, 8<<20, nil, "entry",
		"reserve", "64M", "createx", "2M", "create", "4M", "map", "0", "0", "2M", "map", "0", "2M", "2M",
		"map", "1", "4M", "4M", "retain", "5M", "export", "0", "import", "0", "info", "create", "4M",
		"release", "0", "release", "1", "unmap", "0", "8M", "info", "release", "2", "info", "release", "3", "info",
		"create", "8M")
	checkSteps(t, out, []step{{"entry", 0, 0}, {"createx", 0, cuSuccess}, {"create", 0, cuSuccess},
		{"map", 0, cuSuccess}, {"map", 1, cuSuccess}, {"map", 2, cuSuccess}, {"retain", 0, cuSuccess},
		{"export", 0, cuSuccess}, {"import", 0, cuSuccess}, {"create", 1, cuOutOfMemory},
		{"release", 0, cuSuccess}, {"release", 1, cuSuccess}, {"unmap", 0, cuSuccess},
		{"release", 2, cuSuccess}, {"release", 3, cuSuccess}, {"create", 2, cuSuccess}})
	checkUsed(t, out, 8<<20, 6, 6, 2, 0)
	if truth.DeviceVMM != 8<<20 {
		t.Errorf("simcuda holds %d bytes, want the 8 MiB handle", truth.DeviceVMM)
	}
}

// TestAppVMMFailedUnmapRelease: a cuMemUnmap, cuMemRelease or
// cuMemRetainAllocationHandle the driver fails changes nothing: the
// memory stays counted until the calls made again succeed, and a release
// too many (CUDA refuses it) gives nothing back twice.
func TestAppVMMFailedUnmapRelease(t *testing.T) {
	out, truth := runApp(t, 8<<20, []string{"SIMCUDA_FAIL=cuMemUnmap:1=1,cuMemRelease:1=1,cuMemRetainAllocationHandle:1=1"},
		"reserve", "64M", "create", "4M", "create", "2M", "map", "0", "0", "4M", "retain", "0", "release", "0", "release", "0",
		"unmap", "0", "4M", "info", "unmap", "0", "4M", "info", "release", "0", "release", "1", "release", "1", "info",
		"create", "6M", "create", "4M")
	checkSteps(t, out, []step{{"retain", 0, cuInvalidValue}, {"release", 0, cuInvalidValue}, {"release", 1, cuSuccess},
		{"unmap", 0, cuInvalidValue}, {"unmap", 1, cuSuccess}, {"release", 2, cuInvalidValue},
		{"release", 3, cuSuccess}, {"release", 4, cuInvalidValue}, {"create", 2, cuSuccess}, {"create", 3, cuOutOfMemory}})
	checkUsed(t, out, 8<<20, 6, 2, 0)
	if truth.DeviceVMM != 6<<20 {
		t.Errorf("simcuda holds %d bytes, want the 6 MiB handle", truth.DeviceVMM)
	}
}

// TestAppVMMThreadsOversubscribed: threads whose cuMemCreate the quota
// refuses get host memory within the host limit, or a clean
// CUDA_ERROR_OUT_OF_MEMORY beyond it; at the end both the quota and the
// host limit are whole again.
func TestAppVMMThreadsOversubscribed(t *testing.T) {
	out, truth := runApp(t, 4<<20, []string{"SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_HOST_LIMIT=4MiB"},
		"reserve", "64M", "threads", "8", "200", "2M", "info", "create", "4M", "create", "4M", "create", "2M")
	if failed, refused := out.Num(t, "threads", 0, 1), out.Num(t, "threads", 0, 2); failed != 0 || refused == 0 {
		t.Errorf("%d calls failed, %d cuMemCreate refused; want none failed, some refused (8 threads, room for 4)", failed, refused)
	}
	checkSteps(t, out, []step{{"create", 0, cuSuccess}, {"create", 1, cuSuccess}, {"create", 2, cuOutOfMemory}})
	checkUsed(t, out, 4<<20, 0, 4)
	if truth.DeviceVMM != 4<<20 || truth.HostVMM != 4<<20 {
		t.Errorf("simcuda holds %d bytes on the device and %d on the host, want 4 MiB each", truth.DeviceVMM, truth.HostVMM)
	}
}
