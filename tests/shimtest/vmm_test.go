package shimtest

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// TestExpandableSegmentsQuota: shaped like PyTorch's expandable segments. A
// large range is reserved, 2 MiB granules are created and mapped as it
// grows until the quota refuses one, unmapped and released as it shrinks,
// and grown again: the quota admits exactly its size in granules each time,
// and everything is given back at the end.
func TestExpandableSegmentsQuota(t *testing.T) {
	out, truth := runScript(t, 64<<20, "r", "1G", "g", "64", "i", "s", "8", "g", "64", "m", "2M", "s", "32", "m", "60M")
	checkSteps(t, out, []step{{"r", 0, cuSuccess}, {"g", 0, cuOutOfMemory}, {"i", 0, cuSuccess}, {"s", 0, cuSuccess},
		{"g", 1, cuOutOfMemory}, {"m", 0, cuOutOfMemory}, {"s", 1, cuSuccess}, {"m", 1, cuSuccess}})
	for i, want := range []uint64{32, 32} {
		if mapped := out.Num(t, "g", i, 2); mapped != want {
			t.Errorf("growth #%d stopped at %d granules, want %d (64 MiB)", i, mapped, want)
		}
	}
	if free, total := out.Num(t, "i", 0, 2), out.Num(t, "i", 0, 3); free != 0 || total != 64<<20 {
		t.Errorf("cuMemGetInfo_v2 with the quota in granules: free %d total %d, want 0 of 64 MiB", free, total)
	}
	if truth.VMMPhysicalBytes != 0 {
		t.Errorf("simcuda holds %d bytes of physical memory at exit, want 0", truth.VMMPhysicalBytes)
	}
}

// TestExpandableSegmentsOversubscribed: with oversubscription, granules the
// quota refuses are created on the host instead, within the host limit, and
// behave as device memory to the program (mapped, accessed, copied to and
// from); a request the host cannot serve (an exportable handle) is refused
// as before, and released host granules give the host limit back.
func TestExpandableSegmentsOversubscribed(t *testing.T) {
	const deviceLocated, hostLocated = 1, 3 // CU_MEM_LOCATION_TYPE_DEVICE, _HOST_NUMA
	out, truth := runScriptWith(t, ctxvmm(t, false), 16<<20, []string{"SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_HOST_LIMIT=16MiB"},
		"r", "1G", "g", "12", "h", "0", "h", "7", "h", "8", "h", "11", "w", "x", "2M", "i",
		"g", "20", "w", "s", "20", "g", "16", "h", "7", "w", "s", "16")
	checkSteps(t, out, []step{{"g", 0, cuSuccess}, {"w", 0, cuSuccess}, {"x", 0, cuOutOfMemory},
		{"g", 1, cuOutOfMemory}, {"w", 1, cuSuccess}, {"s", 0, cuSuccess}, {"g", 2, cuSuccess}, {"w", 2, cuSuccess}, {"s", 1, cuSuccess}})
	for i, want := range []uint64{deviceLocated, deviceLocated, hostLocated, hostLocated, deviceLocated} {
		if where := out.Num(t, "h", i, 2); where != want {
			t.Errorf("granule query #%d: location type %d, want %d", i, where, want)
		}
	}
	for i := 1; i <= 2; i++ { // the second time after everything was released
		if mapped := out.Num(t, "g", i, 2); mapped != 16 {
			t.Errorf("growth #%d reached %d granules, want 16: 8 on the device (16 MiB quota), 8 on the host (16 MiB host limit)", i, mapped)
		}
	}
	for i := range 3 {
		if wrong := out.Num(t, "w", i, 2); wrong != 0 {
			t.Errorf("copy #%d read %d bytes wrong", i, wrong)
		}
	}
	if free := out.Num(t, "i", 0, 2); free != 0 {
		t.Errorf("cuMemGetInfo_v2 with host granules: free %d, want 0 (host memory is not the device's)", free)
	}
	if truth.VMMPhysicalBytes != 0 {
		t.Errorf("simcuda holds %d bytes of physical memory at exit, want 0", truth.VMMPhysicalBytes)
	}
}

// hostPlacedNoCPULine is what the core logs once when the driver refuses
// the CPU the program's cuMemCreate memory placed on the host.
const hostPlacedNoCPULine = "the CPU cannot reach the program's cuMemCreate memory placed on the host"

// runHostPlaced runs ctxvmm under an 8 MiB quota (4 granules) with
// oversubscription into 16 MiB of host memory, and vars.
func runHostPlaced(t *testing.T, vars []string, ops ...string) harness.Result {
	env := append([]string{"SPILLWAY_MEMORY_LIMIT=8MiB", "SPILLWAY_VMM=0", "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_HOST_LIMIT=16MiB"}, vars...)
	res := harness.Run(t, harness.Shimmed(t, env, ctxvmm(t, false), ops...))
	if res.ExitCode != 0 {
		t.Fatalf("the program died (exit %d, -1 for a signal such as SIGSEGV)\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	return res
}

// TestVMMHostPlacedReachableByCPU: the program's cuMemCreate placed on the
// host beyond the quota is host memory to CUDA's pointer queries, so a
// CUDA-aware library (MPI) writes it with the CPU at its address: the
// program granted only its device access, and the shim adds the CPU's to
// each host-placed mapping the grant covers, whether the grant is one per
// granule or one over a run that mixes device and host granules (which the
// driver refuses the CPU for device memory). A program that names the CPU's
// access itself gets what it named.
func TestVMMHostPlacedReachableByCPU(t *testing.T) {
	const deviceMemory, hostMemory = 2, 1 // CU_MEMORYTYPE_DEVICE, _HOST
	const protRead = 1                    // CU_MEM_ACCESS_FLAGS_PROT_READ
	// 4 granules on the device, 2 on the host, each granted as mapped; then
	// 4 more on the host, mapped bare and granted with the 6 before them.
	res := runHostPlaced(t, nil, "r", "1G", "g", "6", "u", "0", "u", "4", "u", "5", "j", "10", "u", "9", "w",
		"k", "8", "1", "s", "10")
	out := harness.ParseOutput(res.Stdout)
	checkSteps(t, out, []step{{"g", 0, cuSuccess}, {"j", 0, cuSuccess}, {"w", 0, cuSuccess}, {"k", 0, cuSuccess}, {"s", 0, cuSuccess}})
	if flags := out.Num(t, "k", 0, 2); flags != protRead {
		t.Errorf("the program granted the CPU read access to a host-placed granule, and it has %d, want %d", flags, protRead)
	}
	if grown := out.Num(t, "j", 0, 2); grown != 10 {
		t.Fatalf("grew %d granules, want 10 (4 on the device, 6 on the host)", grown)
	}
	for i, want := range []uint64{deviceMemory, hostMemory, hostMemory, hostMemory} {
		if rc, typ, wrong := out.Code(t, "u", i), out.Num(t, "u", i, 2), out.Num(t, "u", i, 3); rc != cuSuccess || typ != want || wrong != 0 {
			t.Errorf("granule query #%d: rc %d, memory type %d, %d bytes read wrong; want 0, %d, 0", i, rc, typ, wrong, want)
		}
	}
	if wrong := out.Num(t, "w", 0, 2); wrong != 0 {
		t.Errorf("copy over the grown range read %d bytes wrong", wrong)
	}
	if strings.Contains(res.Stderr, hostPlacedNoCPULine) {
		t.Errorf("the shim says the CPU cannot reach host-placed memory, where the driver grants it:\n%s", res.Stderr)
	}
}

// TestVMMHostPlacedWithoutCPUAccess: a driver that refuses the CPU
// host-located memory (SIMCUDA_NO_HOST_ACCESS=1) still grants the program
// what it asked, the device's access, and the shim says once what that
// means.
func TestVMMHostPlacedWithoutCPUAccess(t *testing.T) {
	res := runHostPlaced(t, []string{"SIMCUDA_NO_HOST_ACCESS=1"}, "r", "1G", "g", "6", "j", "8", "w", "s", "8")
	out := harness.ParseOutput(res.Stdout)
	checkSteps(t, out, []step{{"g", 0, cuSuccess}, {"j", 0, cuSuccess}, {"w", 0, cuSuccess}, {"s", 0, cuSuccess}})
	if grown := out.Num(t, "j", 0, 2); grown != 8 {
		t.Errorf("grew %d granules, want 8 (4 on the device, 4 on the host)", grown)
	}
	if wrong := out.Num(t, "w", 0, 2); wrong != 0 {
		t.Errorf("copy over the grown range read %d bytes wrong", wrong)
	}
	if n := strings.Count(res.Stderr, hostPlacedNoCPULine); n != 1 {
		t.Errorf("the shim said %d times that the CPU cannot reach host-placed memory, want once:\n%s", n, res.Stderr)
	}
	if !strings.Contains(res.Stderr, "SPILLWAY_OVERSUBSCRIBE") {
		t.Errorf("the warning does not name SPILLWAY_OVERSUBSCRIBE, which keeps such memory off the host:\n%s", res.Stderr)
	}
}

// TestVMMHostPlacementFails: where the driver cannot create a refused
// cuMemCreate on the host, the quota's refusal stands and the host limit
// gets its bytes back: a later growth still reaches the host limit.
func TestVMMHostPlacementFails(t *testing.T) {
	// The 9th cuMemCreate is the first placed on the host.
	out, _ := runScriptWith(t, ctxvmm(t, false), 16<<20,
		[]string{"SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_HOST_LIMIT=16MiB", "SIMCUDA_FAIL=cuMemCreate:9"},
		"r", "1G", "g", "9", "g", "16", "s", "16")
	checkSteps(t, out, []step{{"g", 0, cuOutOfMemory}, {"g", 1, cuSuccess}, {"s", 0, cuSuccess}})
	for i, want := range []uint64{8, 16} {
		if mapped := out.Num(t, "g", i, 2); mapped != want {
			t.Errorf("growth #%d reached %d granules, want %d", i, mapped, want)
		}
	}
}

// TestSleepModeQuota: shaped like vLLM's sleep mode. Weights in granules
// beside the pool's memory; sleeping unmaps and releases every granule,
// which gives the quota back; waking creates and maps them again.
func TestSleepModeQuota(t *testing.T) {
	out, truth := runScript(t, 64<<20, "r", "256M", "g", "24", "m", "16M", "i", "s", "24", "i", "g", "24", "g", "25", "i", "s", "24")
	checkSteps(t, out, []step{{"g", 0, cuSuccess}, {"m", 0, cuSuccess}, {"s", 0, cuSuccess},
		{"g", 1, cuSuccess}, {"g", 2, cuOutOfMemory}, {"s", 1, cuSuccess}})
	for i, want := range []uint64{0, 48 << 20, 0} {
		if free := out.Num(t, "i", i, 2); free != want {
			t.Errorf("cuMemGetInfo_v2 #%d: free %d, want %d", i, free, want)
		}
	}
	if mapped := out.Num(t, "g", 2, 2); mapped != 24 {
		t.Errorf("awake with %d granules, want 24", mapped)
	}
	if truth.VMMPhysicalBytes != 0 {
		t.Errorf("simcuda holds %d bytes of physical memory at exit, want 0", truth.VMMPhysicalBytes)
	}
}

// TestHandleLifetimeQuota: a handle's bytes count once however often it is
// mapped, stay counted while it is released but still mapped (or retained
// again through a mapping), and are given back when CUDA frees them.
func TestHandleLifetimeQuota(t *testing.T) {
	out, _ := runScript(t, 8<<20,
		"r", "64M", "c", "2M", "M", "0", "0", "M", "0", "2M", // h0 mapped twice
		"c", "2M", "c", "2M", "c", "2M", "c", "2M", // h1..h3 fit, a fifth does not
		"L", "0", "c", "2M", "N", "0", "c", "2M", "N", "1", "c", "2M", // h0: released, unmapped once, twice
		"M", "1", "4M", "K", "2", "L", "1", "N", "2", "c", "2M", "L", "5", "c", "2M") // h1 retained through its mapping
	checkSteps(t, out, []step{
		{"c", 0, cuSuccess}, {"M", 0, cuSuccess}, {"M", 1, cuSuccess},
		{"c", 1, cuSuccess}, {"c", 2, cuSuccess}, {"c", 3, cuSuccess}, {"c", 4, cuOutOfMemory},
		{"L", 0, cuSuccess}, {"c", 5, cuOutOfMemory}, {"N", 0, cuSuccess}, {"c", 6, cuOutOfMemory},
		{"N", 1, cuSuccess}, {"c", 7, cuSuccess},
		{"M", 2, cuSuccess}, {"K", 0, cuSuccess}, {"L", 1, cuSuccess}, {"N", 2, cuSuccess},
		{"c", 8, cuOutOfMemory}, {"L", 2, cuSuccess}, {"c", 9, cuSuccess},
	})
}

// TestImportedHandleQuota: importing a handle this process exported is one
// more reference to its memory: releasing the original leaves the bytes
// counted until the imported handle is released too.
func TestImportedHandleQuota(t *testing.T) {
	out, _ := runScript(t, 8<<20,
		"x", "8M", "E", "0", "J", "0", "L", "0", "c", "2M", // the memory lives on through h1
		"L", "1", "c", "8M") // both released: the whole quota fits
	checkSteps(t, out, []step{
		{"x", 0, cuSuccess}, {"E", 0, cuSuccess}, {"J", 0, cuSuccess}, {"L", 0, cuSuccess},
		{"c", 0, cuOutOfMemory}, {"L", 1, cuSuccess}, {"c", 1, cuSuccess},
	})
}

// TestMapUnmapRace: two threads mapping and unmapping their own handles at
// one address leave the count exact: the core hears each call in the order
// CUDA made it, so once both handles are released the whole quota fits
// again and cuMemGetInfo says so. (Heard out of order, an unmap forgot the
// other thread's mapping in most runs of this test.)
func TestMapUnmapRace(t *testing.T) {
	out, _ := runScript(t, 8<<20,
		"r", "2M", "c", "2M", "c", "2M", "q", "0", "1", "20000", "L", "0", "L", "1", "i", "c", "8M")
	checkSteps(t, out, []step{
		{"c", 0, cuSuccess}, {"c", 1, cuSuccess}, {"L", 0, cuSuccess}, {"L", 1, cuSuccess},
		{"i", 0, cuSuccess}, {"c", 2, cuSuccess},
	})
	if free := out.Num(t, "i", 0, 2); free != 8<<20 {
		t.Errorf("cuMemGetInfo: %d bytes free once both handles are gone, want 8 MiB", free)
	}
	if a, b, busy := out.Num(t, "q", 0, 1), out.Num(t, "q", 0, 2), out.Num(t, "q", 0, 3); a == 0 || b == 0 || busy == 0 {
		t.Errorf("the threads did not race (maps %d and %d, %d refused for a busy address)", a, b, busy)
	}
}

// TestResetReportsHandles: the application's cuMemCreate handles outlive a
// reset of the primary context (which ends the pool and its allocation),
// and so does what cuMemGetInfo and NVML report of them until they are
// released.
func TestResetReportsHandles(t *testing.T) {
	out, _ := runScript(t, 8<<20, "m", "2M", "c", "6M", "D", "i", "n", "c", "4M", "L", "0", "i", "n")
	checkSteps(t, out, []step{
		{"m", 0, cuSuccess}, {"c", 0, cuSuccess}, {"D", 0, cuSuccess}, {"i", 0, cuSuccess}, {"n", 0, 0},
		{"c", 1, cuOutOfMemory}, {"L", 0, cuSuccess}, {"i", 1, cuSuccess}, {"n", 1, 0},
	})
	for k, want := range []uint64{6 << 20, 0} {
		if free, total := out.Num(t, "i", k, 2), out.Num(t, "i", k, 3); free != 8<<20-want || total != 8<<20 {
			t.Errorf("cuMemGetInfo #%d after the reset: %d free of %d, want %d of 8 MiB", k, free, total, 8<<20-want)
		}
		if total, used := out.Num(t, "n", k, 2), out.Num(t, "n", k, 3); used != want || total != 8<<20 {
			t.Errorf("NVML #%d after the reset: %d used of %d, want %d of 8 MiB", k, used, total, want)
		}
	}
}

// TestStreamFreeServesOutsideRequest: memory freed with cudaFreeAsync on a
// stream the application then synchronized itself is free for a request
// outside the pool (here cudaMallocFromPoolAsync): the pool asks the stream
// whether it is idle rather than keep the memory until a device
// synchronization. With fixed segments and with virtual memory.
func TestStreamFreeServesOutsideRequest(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/streamfree.c"}, Cudart: true, ProjectHeaders: true})
	for _, vmm := range []string{"SPILLWAY_VMM=0", "SPILLWAY_VMM=1"} {
		_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=64MiB", vmm}, prog))
		if out.Code(t, "async", 0) != 0 || out.Code(t, "frompool", 0) != 0 {
			t.Errorf("%s: %v: want both to succeed", vmm, out)
		}
	}
}

// TestPrimaryResetOfMissingDevice: a driver-only program that resets a
// device it does not have gets CUDA's CUDA_ERROR_INVALID_DEVICE, and the
// device it uses keeps its memory.
func TestPrimaryResetOfMissingDevice(t *testing.T) {
	out, _ := runScript(t, 8<<20, "m", "2M", "b", "5", "t", "0", "i")
	checkSteps(t, out, []step{{"m", 0, cuSuccess}, {"b", 0, cuInvalidDevice}, {"t", 0, cuSuccess}, {"i", 0, cuSuccess}})
	if free := out.Num(t, "i", 0, 2); free != 6<<20 {
		t.Errorf("cuMemGetInfo: %d bytes free, want 6 MiB (the 2 MiB block still counted)", free)
	}
}

// TestPooledMemoryReachesPeers: the pool's granules are granted to every
// device that can reach them as a peer, so a copy made while another device
// is current reaches pooled memory as it reaches cudaMalloc's; where the
// devices are not peers it fails, the documented limit of virtual memory
// (SPILLWAY_VMM=0 lifts it).
func TestPooledMemoryReachesPeers(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/peercopy.c"}, Cudart: true, ProjectHeaders: true})
	for _, c := range []struct {
		env  []string
		code int // the copy's cudaError_t
	}{
		{[]string{"SIMCUDA_PEER=1"}, 0},
		{nil, harness.ErrInvalidValue},
		{[]string{"SPILLWAY_VMM=0"}, 0},
	} {
		env := append([]string{"SIMCUDA_DEVICES=2x1GiB", "SPILLWAY_MEMORY_LIMIT=64MiB"}, c.env...)
		_, out := harness.RunOK(t, harness.Shimmed(t, env, prog))
		if out.Code(t, "malloc", 0) != 0 || out.Code(t, "memset", 0) != 0 {
			t.Fatalf("%v: %v", c.env, out)
		}
		if code := out.Code(t, "copy", 0); code != c.code || (code == 0 && out.Num(t, "copy", 0, 2) != 7) {
			t.Errorf("%v: copy of device 0's memory with device 1 current: %v, want code %d with the byte 7 copied",
				c.env, out, c.code)
		}
	}
}

// TestVMMTakesPoolCache: a cuMemCreate that fits only once the pool returns
// the memory it holds cached (a freed 12 MiB segment the release threshold
// keeps) succeeds, and simcuda never holds more than the quota. The pool
// does not synchronize for it: the front cannot say which context a
// cuMemCreate runs in, so the free synchronizes (SPILLWAY_FREE_SYNC=1).
func TestVMMTakesPoolCache(t *testing.T) {
	stats := filepath.Join(t.TempDir(), "stats.json")
	env := []string{"SPILLWAY_MEMORY_LIMIT=16MiB", "SPILLWAY_FREE_SYNC=1", "SPILLWAY_POOL_RELEASE_THRESHOLD=100%",
		"SIMCUDA_STATS_FILE=" + stats}
	_, out := harness.RunOK(t, harness.Shimmed(t, env, ctxvmm(t, false), "m", "12M", "f", "0", "i", "c", "8M", "i"))
	checkSteps(t, out, []step{{"m", 0, cuSuccess}, {"f", 0, cuSuccess}, {"c", 0, cuSuccess}})
	truth := readTruth(t, stats)
	if truth.VMMPhysicalBytes != 8<<20 || truth.DeviceBytesPeak > 16<<20 {
		t.Errorf("simcuda holds %d bytes of physical memory (peak %d), want the handle's %d", truth.VMMPhysicalBytes, truth.DeviceBytesPeak, 8<<20)
	}
	if cached, free := out.Num(t, "i", 0, 2), out.Num(t, "i", 1, 2); cached != 16<<20 || free != 8<<20 {
		t.Errorf("cuMemGetInfo_v2: free %d with the cache, then %d beside the handle, want %d and %d", cached, free, 16<<20, 8<<20)
	}
}

// TestVMMCreateInvalidOverQuota: a cuMemCreate CUDA itself refuses (a size
// that is no multiple of the granularity, flags other than 0) gets CUDA's
// answer, CUDA_ERROR_INVALID_VALUE, whether or not the size fits the quota:
// an out-of-memory error would send the program looking for memory to free
// instead of at its arguments.
func TestVMMCreateInvalidOverQuota(t *testing.T) {
	const cuInvalidValue = 1
	for _, vars := range [][]string{nil, {"SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_HOST_LIMIT=64MiB"}} {
		out, truth := runScriptWith(t, ctxvmm(t, false), 8<<20, vars,
			"c", "3M", "c", "17M", "v", "16M", "0", "1", "v", "2M", "0", "1", "c", "2M")
		checkSteps(t, out, []step{{"c", 0, cuInvalidValue}, {"c", 1, cuInvalidValue},
			{"v", 0, cuInvalidValue}, {"v", 1, cuInvalidValue}, {"c", 2, cuSuccess}})
		if truth.VMMPhysicalBytes != 2<<20 {
			t.Errorf("%v: simcuda holds %d bytes of physical memory at exit, want the one 2 MiB handle",
				vars, truth.VMMPhysicalBytes)
		}
	}
}

// TestVMMAfterStreamFreeInPassThrough: with the pool passing allocations
// through (SPILLWAY_POOL=0), the bytes of a cudaFreeAsync stay counted until
// the device reaches the free; a cuMemCreate that needs them settles the
// frees the device has reached and is admitted, rather than refused for
// memory already free.
func TestVMMAfterStreamFreeInPassThrough(t *testing.T) {
	out, _ := runScriptWith(t, ctxvmm(t, true), 64<<20, []string{"SPILLWAY_POOL=0"},
		"Y", "40M", "Z", "0", "c", "64M", "i")
	checkSteps(t, out, []step{{"Y", 0, 0}, {"Z", 0, 0}, {"c", 0, cuSuccess}, {"i", 0, cuSuccess}})
	if free := out.Num(t, "i", 0, 2); free != 0 {
		t.Errorf("cuMemGetInfo_v2 beside a 64 MiB handle: %d bytes free, want 0", free)
	}
}

// TestVMMRefusalWarnings: a cuMemCreate the quota refuses is warned about
// once, naming what refused it: the quota alone without oversubscription,
// the host limit too with it; one placed on the host instead is no refusal
// and is not warned about.
func TestVMMRefusalWarnings(t *testing.T) {
	run := func(vars []string, ops ...string) (harness.Output, string) {
		env := append([]string{"SPILLWAY_MEMORY_LIMIT=4MiB", "SPILLWAY_VMM=0"}, vars...)
		res, out := harness.RunOK(t, harness.Shimmed(t, env, ctxvmm(t, false), ops...))
		return out, res.Stderr
	}
	out, stderr := run(nil, "r", "1G", "g", "3")
	checkSteps(t, out, []step{{"r", 0, cuSuccess}, {"g", 0, cuOutOfMemory}})
	want := "cuMemCreate of 2MiB refused on device 0: 4MiB in use of a quota of 4MiB"
	if !strings.Contains(stderr, want) || strings.Count(stderr, "refused") != 1 {
		t.Errorf("without oversubscription: want one warning %q\nstderr:\n%s", want, stderr)
	}

	oversubscribe := []string{"SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_HOST_LIMIT=4MiB"}
	out, stderr = run(oversubscribe, "r", "1G", "g", "4")
	checkSteps(t, out, []step{{"r", 0, cuSuccess}, {"g", 0, cuSuccess}})
	if strings.Contains(stderr, "refused") {
		t.Errorf("two granules placed on the host: want no refusal warned\nstderr:\n%s", stderr)
	}
	out, stderr = run(oversubscribe, "r", "1G", "g", "5")
	checkSteps(t, out, []step{{"r", 0, cuSuccess}, {"g", 0, cuOutOfMemory}})
	want = "cuMemCreate (nor could the host limit hold it) of 2MiB refused on device 0"
	if !strings.Contains(stderr, want) || strings.Count(stderr, "refused") != 1 {
		t.Errorf("past the host limit: want one warning %q\nstderr:\n%s", want, stderr)
	}
}

// TestVMMHostLocatedNotCounted: physical memory the application asks CUDA
// to place on the host (CU_MEM_LOCATION_TYPE_HOST_NUMA) counts on no
// device: 16 MiB of it are made under an 8 MiB quota, and the device's
// quota stays whole for device memory (cuMemGetInfo_v2 shows 8 MiB free
// before the 2 MiB handle, 6 MiB after).
func TestVMMHostLocatedNotCounted(t *testing.T) {
	out, _ := runScript(t, 8<<20, "l", "16M", "i", "c", "2M", "i")
	checkSteps(t, out, []step{{"l", 0, cuSuccess}, {"i", 0, cuSuccess}, {"c", 0, cuSuccess}, {"i", 1, cuSuccess}})
	if free := out.Num(t, "i", 0, 2); free != 8<<20 {
		t.Errorf("cuMemGetInfo_v2 after 16 MiB on the host: %d bytes free, want the whole 8 MiB quota", free)
	}
	if free := out.Num(t, "i", 1, 2); free != 6<<20 {
		t.Errorf("cuMemGetInfo_v2 after 2 MiB on the device: %d bytes free, want 6 MiB", free)
	}
}

// TestVMMAfterFreeInPrimaryContext: memory the pool holds freed but
// awaiting a device synchronization is free to the program (cuMemGetInfo
// counts it), so a cuMemCreate or an explicit pool's allocation made in the
// device's primary context, the pool's own, after a cuMemFree fits: the
// pool synchronizes and gives the memory back first, as for arrays. In a
// context the program created the pool does not synchronize for it, and the
// request is refused at the quota.
func TestVMMAfterFreeInPrimaryContext(t *testing.T) {
	for _, c := range []struct {
		name    string
		runtime bool
		ops     []string
		want    int
	}{
		{"cuMemCreate", false, []string{"c", "8M"}, cuSuccess},
		{"cuMemAllocFromPoolAsync", false, []string{"P", "a", "8M"}, cuSuccess},
		{"cudaMallocFromPoolAsync", true, []string{"P", "Q", "8M"}, cuSuccess},
		{"cuMemCreate in a created context", false, []string{"C", "c", "8M"}, cuOutOfMemory},
	} {
		t.Run(c.name, func(t *testing.T) {
			stats := filepath.Join(t.TempDir(), "stats.json")
			env := []string{"SPILLWAY_MEMORY_LIMIT=16MiB", "SPILLWAY_POOL_RELEASE_THRESHOLD=100%", "SIMCUDA_STATS_FILE=" + stats}
			ops := append([]string{"m", "12M", "f", "0", "i"}, c.ops...)
			_, out := harness.RunOK(t, harness.Shimmed(t, env, ctxvmm(t, c.runtime), ops...))
			if free := out.Num(t, "i", 0, 2); free != 16<<20 {
				t.Fatalf("cuMemGetInfo_v2 after the free: %d bytes free, want the whole 16 MiB quota", free)
			}
			last := c.ops[len(c.ops)-2]
			if rc := out.Code(t, last, 0); rc != c.want {
				t.Errorf("8 MiB after freeing 12 of a 16 MiB quota: %d, want %d", rc, c.want)
			}
			if peak := readTruth(t, stats).DeviceBytesPeak; peak > 16<<20 {
				t.Errorf("simcuda held %d bytes at its peak, above the 16 MiB quota", peak)
			}
		})
	}
}
