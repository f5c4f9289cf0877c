package shimtest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// ctxvmm builds testdata/ctxvmm.c against the driver alone, or with
// runtime also against the dynamic runtime.
func ctxvmm(t testing.TB, runtime bool) string {
	b := harness.CBuild{Sources: []string{"testdata/ctxvmm.c"}, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lcuda", "-lnvidia-ml"}}
	if runtime {
		b.Cudart = true
		b.Flags = append(b.Flags, "-DWITH_RUNTIME")
	}
	return harness.Compile(t, b)
}

// ctxvmmHooked builds ctxvmm with ctxhook linked ahead of the driver, so
// that the shim's real cuCtxDestroy_v2 is ctxhook's (its S operation).
func ctxvmmHooked(t testing.TB) string {
	hook := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ctxhook.c"}, Shared: true,
		ProjectHeaders: true, Flags: []string{"-ldl"}})
	return harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ctxvmm.c"}, ProjectHeaders: true,
		Flags: []string{"-DCTX_HOOK", hook, "-Wl,-rpath," + filepath.Dir(hook),
			"-L", harness.SimcudaDir(t), "-lcuda", "-lnvidia-ml"}})
}

// step is one expected line of a scripted program: the i-th line of op has code want.
type step struct {
	op      string
	i, want int
}

func checkSteps(t *testing.T, out harness.Output, steps []step) {
	t.Helper()
	for _, s := range steps {
		if rc := out.Code(t, s.op, s.i); rc != s.want {
			t.Errorf("%s #%d: %d, want %d\n%v", s.op, s.i, rc, s.want, out)
		}
	}
}

// vmmTruth is simcuda's ground truth for device 0, with the VMM figure.
type vmmTruth struct {
	DeviceBytesPeak  uint64 `json:"device_bytes_peak"`
	VMMPhysicalBytes uint64 `json:"vmm_physical_bytes"`
}

func readTruth(t *testing.T, path string) vmmTruth {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read simcuda stats: %v", err)
	}
	var s struct{ Devices []vmmTruth }
	if err := json.Unmarshal(data, &s); err != nil || len(s.Devices) == 0 {
		t.Fatalf("parse simcuda stats %s: %v\n%s", path, err, data)
	}
	return s.Devices[0]
}

// runScript runs ctxvmm with ops under quota and returns its output and
// simcuda's ground truth, checking that the device never held more than
// the quota.
func runScript(t *testing.T, quota uint64, ops ...string) (harness.Output, vmmTruth) {
	t.Helper()
	return runScriptOf(t, ctxvmm(t, false), quota, ops...)
}

func runScriptOf(t *testing.T, prog string, quota uint64, ops ...string) (harness.Output, vmmTruth) {
	t.Helper()
	return runScriptWith(t, prog, quota, nil, ops...)
}

// runScriptWith is runScriptOf with more variables set.
func runScriptWith(t *testing.T, prog string, quota uint64, vars []string, ops ...string) (harness.Output, vmmTruth) {
	t.Helper()
	stats := filepath.Join(t.TempDir(), "stats.json")
	// The pool keeps fixed segments, so that simcuda's VMM figures are the
	// application's handles alone.
	env := append([]string{"SPILLWAY_MEMORY_LIMIT=" + sizeArg(quota), "SIMCUDA_STATS_FILE=" + stats, "SPILLWAY_VMM=0"}, vars...)
	_, out := harness.RunOK(t, harness.Shimmed(t, env, prog, ops...))
	truth := readTruth(t, stats)
	if truth.DeviceBytesPeak > quota {
		t.Errorf("simcuda held %d bytes at its peak, above the quota of %d\n%v", truth.DeviceBytesPeak, quota, out)
	}
	return out, truth
}

func sizeArg(n uint64) string { return itoa(n>>20) + "MiB" }

func itoa(n uint64) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// TestCreatedContextQuota: what a program allocates in a context it created
// counts against the device's quota beside the primary context's pool, is
// given back when freed, and when the context is destroyed.
func TestCreatedContextQuota(t *testing.T) {
	out, _ := runScript(t, 64<<20,
		"C", "m", "40M", "m", "32M", "i", // in the created context
		"O", "m", "24M", "m", "2M", // the primary context's pool, beside it
		"U", "0", "f", "0", "m", "16M", "p", "1M", "16", "m", "16M", // freed, and allocated again
		"X", "0", "m", "40M", "i") // destroyed: what it held is given back
	checkSteps(t, out, []step{
		{"C", 0, cuSuccess}, {"m", 0, cuSuccess}, {"m", 1, cuOutOfMemory}, {"i", 0, cuSuccess},
		{"O", 0, cuSuccess}, {"m", 2, cuSuccess}, {"m", 3, cuOutOfMemory},
		{"U", 0, cuSuccess}, {"f", 0, cuSuccess}, {"m", 4, cuSuccess}, {"p", 0, cuSuccess}, {"m", 5, cuOutOfMemory},
		{"X", 0, cuSuccess}, {"m", 6, cuSuccess}, {"i", 1, cuSuccess},
	})
	if free, total := out.Num(t, "i", 0, 2), out.Num(t, "i", 0, 3); total != 64<<20 || free != 24<<20 {
		t.Errorf("cuMemGetInfo_v2 in the created context: free %d total %d, want 24 MiB of the 64 MiB quota", free, total)
	}
	if total := out.Num(t, "i", 1, 3); total != 64<<20 {
		t.Errorf("cuMemGetInfo_v2 total %d, want the 64 MiB quota", total)
	}
}

// TestDetachedContextQuota: pycuda's usage counts (cuCtxAttach, cuCtxDetach):
// the context's memory is given back when the last detach destroys it.
func TestDetachedContextQuota(t *testing.T) {
	out, _ := runScript(t, 64<<20, "C", "A", "m", "40M", "T", "0", "m", "32M", "T", "0", "m", "60M")
	checkSteps(t, out, []step{
		{"C", 0, cuSuccess}, {"A", 0, cuSuccess}, {"m", 0, cuSuccess}, {"T", 0, cuSuccess},
		{"m", 1, cuOutOfMemory}, // still attached once: still held
		{"T", 1, cuSuccess}, {"m", 2, cuSuccess},
	})
}

// TestCreatedContextAddressReusedDuringDestroy: destroying a created
// context (cuCtxDestroy_v2, the last cuCtxDetach) frees its memory before
// the call returns, and another thread may be handed one of its addresses
// meanwhile, here for the primary context. Freeing that address frees the
// primary context's block, and every byte of both is given back: none
// stays counted against the quota.
func TestCreatedContextAddressReusedDuringDestroy(t *testing.T) {
	prog := ctxvmmHooked(t)
	for _, destroy := range []string{"X", "T"} {
		t.Run(destroy, func(t *testing.T) {
			out, _ := runScriptWith(t, prog, 64<<20, []string{"SPILLWAY_POOL=0"},
				"C", "m", "1M", "m", "1M", "S", "1M", destroy, "0", "i", "m", "64M")
			if out.Code(t, "S", 0) != cuSuccess || out.Num(t, "S", 0, 2) != 1 {
				t.Fatalf("the other thread was not handed an address of the destroyed context: %v", out)
			}
			checkSteps(t, out, []step{
				{"C", 0, cuSuccess}, {"m", 0, cuSuccess}, {"m", 1, cuSuccess}, {destroy, 0, cuSuccess},
				{"i", 0, cuSuccess}, {"m", 2, cuSuccess},
			})
			if rc := out.Num(t, "S", 0, 3); rc != cuSuccess {
				t.Errorf("cuMemFree_v2 of the primary context's block at a reused address: %d, want 0\n%v", rc, out)
			}
			if free := out.Num(t, "i", 0, 2); free != 64<<20 {
				t.Errorf("cuMemGetInfo_v2: %d bytes free with nothing allocated, want the whole 64 MiB quota\n%v", free, out)
			}
		})
	}
}

// TestCreatedContextDestroyFailedKeepsCount: a cuCtxDestroy_v2 that fails
// leaves the context and its memory as they were: still counted, and
// given back when freed.
func TestCreatedContextDestroyFailedKeepsCount(t *testing.T) {
	out, _ := runScriptWith(t, ctxvmm(t, false), 64<<20, []string{"SIMCUDA_FAIL=cuCtxDestroy_v2:1"},
		"C", "m", "40M", "X", "0", "m", "32M", "f", "0", "m", "60M", "X", "0", "m", "64M")
	checkSteps(t, out, []step{
		{"C", 0, cuSuccess}, {"m", 0, cuSuccess}, {"X", 0, cuOutOfMemory},
		{"m", 1, cuOutOfMemory}, // the context lives on, and so does its memory
		{"f", 0, cuSuccess}, {"m", 2, cuSuccess}, {"X", 1, cuSuccess}, {"m", 3, cuSuccess},
	})
}

// TestRuntimeInCreatedContext: the runtime's allocations while a created
// context is current are that context's, as CUDA makes them: counted,
// passed through (a refusal is the runtime's, with its last error), and
// given back with the context.
func TestRuntimeInCreatedContext(t *testing.T) {
	out, _ := runScriptOf(t, ctxvmm(t, true), 64<<20,
		"C", "R", "40M", "R", "32M", "e", "e", "m", "16M", "F", "0", "X", "0", "R", "60M")
	checkSteps(t, out, []step{
		{"C", 0, cuSuccess}, {"R", 0, 0}, {"R", 1, harness.ErrMemoryAllocation},
		{"e", 0, harness.ErrMemoryAllocation}, {"e", 1, 0}, {"m", 0, cuSuccess}, {"F", 0, 0},
		{"X", 0, cuSuccess}, {"R", 2, 0},
	})
}

// TestRuntimeKindsInCreatedContext: cudaMallocPitch, cudaMallocManaged and
// cudaMallocAsync in a created context are counted like cudaMalloc (a
// pitched allocation at the widest pitch CUDA may choose: 8,000-byte rows
// at 8,192 bytes), refused past the quota with the runtime's error, given
// back by cudaFree and with the context (cudaMallocAsync's pool memory,
// which outlives the context, once freed).
func TestRuntimeKindsInCreatedContext(t *testing.T) {
	out, _ := runScriptOf(t, ctxvmm(t, true), 64<<20,
		"C", "W", "8000", "4096", "V", "24M", "Y", "16M", "e", "I", // slots 0 and 1: 56 MiB
		"F", "0", "Y", "16M", "X", "0", "F", "2", "R", "64M") // slot 2, then the whole quota
	checkSteps(t, out, []step{
		{"C", 0, cuSuccess}, {"W", 0, 0}, {"V", 0, 0}, {"Y", 0, harness.ErrMemoryAllocation},
		{"e", 0, harness.ErrMemoryAllocation}, {"I", 0, 0}, {"F", 0, 0}, {"Y", 1, 0},
		{"X", 0, cuSuccess}, {"F", 1, 0}, {"R", 0, 0},
	})
	if pitch := out.Num(t, "W", 0, 3); pitch < 8000 || pitch > 8192 {
		t.Errorf("cudaMallocPitch: pitch %d for 8,000-byte rows, want 8,000 to 8,192", pitch)
	}
	if free := out.Num(t, "I", 0, 2); free != 8<<20 {
		t.Errorf("cudaMemGetInfo: %d bytes free, want 8 MiB (32 MiB pitched, 24 MiB managed, of 64 MiB)", free)
	}
}

// TestExplicitPoolQuota: allocations from a memory pool the application
// created (cuMemAllocFromPoolAsync, cudaMallocFromPoolAsync) are counted
// against the device's quota and passed through, refused past it, and given
// back by every free path; cuMemGetInfo and cudaMemGetInfo agree.
func TestExplicitPoolQuota(t *testing.T) {
	out, _ := runScriptOf(t, ctxvmm(t, true), 64<<20,
		"P", "a", "40M", "a", "32M", "i", // slot 0; refused at the quota
		"z", "0", "a", "32M", "f", "1", // cuMemFreeAsync, cuMemFree_v2 give back
		"Q", "40M", "Q", "32M", "e", "I", // slot 2; refused with the runtime's error
		"Z", "2", "Q", "60M", "F", "3", // cudaFreeAsync, cudaFree give back
		"a", "64M", "z", "4") // the whole quota fits again
	checkSteps(t, out, []step{
		{"P", 0, cuSuccess}, {"a", 0, cuSuccess}, {"a", 1, cuOutOfMemory}, {"i", 0, cuSuccess},
		{"z", 0, cuSuccess}, {"a", 2, cuSuccess}, {"f", 0, cuSuccess},
		{"Q", 0, 0}, {"Q", 1, harness.ErrMemoryAllocation}, {"e", 0, harness.ErrMemoryAllocation},
		{"I", 0, 0}, {"Z", 0, 0}, {"Q", 2, 0}, {"F", 0, 0}, {"a", 3, cuSuccess}, {"z", 1, cuSuccess},
	})
	for _, op := range []string{"i", "I"} {
		if free, total := out.Num(t, op, 0, 2), out.Num(t, op, 0, 3); total != 64<<20 || free != 24<<20 {
			t.Errorf("%s: free %d total %d, want 24 MiB free of the 64 MiB quota", op, free, total)
		}
	}
}

// TestOddSizesGivenBackExactly: an allocation outside the pool whose size is
// no multiple of the 512 bytes the quota counts in (here 1,000 bytes: in a
// created context, and from the application's own pool) gives back all it
// was charged, by each free path and with its context: cuMemGetInfo shows
// the whole quota free again, not a few hundred bytes short of it.
func TestOddSizesGivenBackExactly(t *testing.T) {
	out, _ := runScript(t, 64<<20,
		"C", "m", "1000", "f", "0", "i", // slot 0: cuMemFree_v2
		"m", "1000", "X", "0", "i", // slot 1: with its context
		"P", "a", "1000", "z", "2", "i") // slot 2: cuMemFreeAsync
	checkSteps(t, out, []step{
		{"C", 0, cuSuccess}, {"m", 0, cuSuccess}, {"f", 0, cuSuccess}, {"i", 0, cuSuccess},
		{"m", 1, cuSuccess}, {"X", 0, cuSuccess}, {"i", 1, cuSuccess},
		{"P", 0, cuSuccess}, {"a", 0, cuSuccess}, {"z", 0, cuSuccess}, {"i", 2, cuSuccess},
	})
	for i, after := range []string{"cuMemFree_v2", "cuCtxDestroy_v2", "cuMemFreeAsync"} {
		if free := out.Num(t, "i", i, 2); free != 64<<20 {
			t.Errorf("cuMemGetInfo_v2 after %s of 1,000 bytes: %d bytes free, want the whole 64 MiB quota", after, free)
		}
	}
}

// TestExplicitPoolResetQuota: a reset of the primary context destroys the
// allocations made in it from the application's own pool, and gives their
// bytes back: cuMemGetInfo and NVML show the whole quota free, and the
// pool serves it again. A reset of another device leaves them counted.
func TestExplicitPoolResetQuota(t *testing.T) {
	out, _ := runScriptWith(t, ctxvmm(t, false), 64<<20, []string{"SIMCUDA_DEVICES=2x1GiB"},
		"P", "a", "40M", "b", "1", "i", "D", "i", "n", "a", "64M")
	checkSteps(t, out, []step{
		{"P", 0, cuSuccess}, {"a", 0, cuSuccess}, {"b", 0, cuSuccess}, {"i", 0, cuSuccess},
		{"D", 0, cuSuccess}, {"i", 1, cuSuccess}, {"n", 0, 0}, {"a", 1, cuSuccess},
	})
	if free := out.Num(t, "i", 0, 2); free != 24<<20 {
		t.Errorf("cuMemGetInfo_v2 after a reset of device 1: %d bytes free, want 24 MiB (device 0's 40 MiB still counted)", free)
	}
	if free := out.Num(t, "i", 1, 2); free != 64<<20 {
		t.Errorf("cuMemGetInfo_v2 after the reset: %d bytes free, want the whole 64 MiB quota", free)
	}
	if used := out.Num(t, "n", 0, 3); used != 0 {
		t.Errorf("NVML after the reset: %d bytes used, want 0", used)
	}
}

// TestExplicitPoolGraphQuota: an allocation from the application's own pool
// freed during a stream capture belongs to the graph, which keeps the
// memory until it is destroyed: its bytes stay counted until then, so
// graphs captured one after another cannot hold more than the quota, and
// cuMemGetInfo and NVML count what the graph keeps.
func TestExplicitPoolGraphQuota(t *testing.T) {
	out, _ := runScriptOf(t, ctxvmm(t, true), 64<<20,
		"P", "G", "40M", "G", "40M", "i", "n", // graph 0 keeps 40 MiB; graph 1 is refused them
		"H", "0", "G", "40M", // graph 0 destroyed: graph 2 gets them
		"B", "40M", "e", "H", "2", "B", "40M") // graph 3 refused with the runtime's error; graph 4 fits
	checkSteps(t, out, []step{
		{"P", 0, cuSuccess}, {"G", 0, cuSuccess}, {"G", 1, cuOutOfMemory}, {"i", 0, cuSuccess},
		{"n", 0, 0}, {"H", 0, cuSuccess}, {"G", 2, cuSuccess},
		{"B", 0, harness.ErrMemoryAllocation}, {"e", 0, harness.ErrMemoryAllocation},
		{"H", 1, cuSuccess}, {"B", 1, 0},
	})
	if free := out.Num(t, "i", 0, 2); free != 24<<20 {
		t.Errorf("cuMemGetInfo with a graph keeping 40 MiB: %d bytes free, want 24 MiB of the 64 MiB quota", free)
	}
	if used := out.Num(t, "n", 0, 3); used != 40<<20 {
		t.Errorf("NVML with a graph keeping 40 MiB: %d bytes used, want 40 MiB", used)
	}
}

// TestExplicitPoolGraphFreeFailedKeepsCount: a cuMemFreeAsync that CUDA
// refuses during a capture frees nothing into the graph: the allocation
// stays the program's and counted, so destroying the graph gives nothing
// back, and 40 MiB more are refused while the device still holds the 40 MiB.
func TestExplicitPoolGraphFreeFailedKeepsCount(t *testing.T) {
	out, _ := runScriptWith(t, ctxvmm(t, false), 64<<20, []string{"SIMCUDA_FAIL=cuMemFreeAsync:1"},
		"P", "G", "40M", "H", "0", "i", "n", "a", "40M")
	checkSteps(t, out, []step{
		{"P", 0, cuSuccess}, {"G", 0, cuOutOfMemory}, {"H", 0, cuSuccess}, {"i", 0, cuSuccess}, {"n", 0, 0},
		{"a", 0, cuOutOfMemory},
	})
	if used := out.Num(t, "n", 0, 3); used != 40<<20 {
		t.Fatalf("NVML after the graph was destroyed: %d bytes used, want the 40 MiB whose free failed", used)
	}
	if free := out.Num(t, "i", 0, 2); free != 24<<20 {
		t.Errorf("cuMemGetInfo_v2 after the graph was destroyed: %d bytes free, want 24 MiB (the 40 MiB whose free failed still counted)", free)
	}
}

// ctxswitch builds testdata/ctxswitch.c, the runtime with contexts the
// program creates or pushes.
func ctxswitch(t testing.TB) string {
	return harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ctxswitch.c"}, ProjectHeaders: true,
		Cudart: true, Flags: []string{"-L", harness.SimcudaDir(t), "-lcuda"}})
}

// runSwitch runs ctxswitch with ops under the shim, with vars set.
func runSwitch(t *testing.T, vars []string, ops ...string) harness.Output {
	t.Helper()
	_, out := harness.RunOK(t, harness.Shimmed(t, vars, ctxswitch(t), ops...))
	return out
}

// TestInternalCallsKeepCreatedContext: the calls the core makes on a device
// for its own purposes (a marker for a stream-ordered free, a reset of
// another device's primary context) leave the thread's context as the
// program made it: a created context of another device stays current, and
// the program's next allocation is still counted there.
func TestInternalCallsKeepCreatedContext(t *testing.T) {
	out := runSwitch(t, []string{"SIMCUDA_DEVICES=2x1GiB", "SPILLWAY_MEMORY_LIMIT=64MiB"},
		"R", "1M", "R", "1M", // two blocks of device 0's pool
		"C", "1", "c", // a created context on device 1, current
		"Z", "0", "c", // device 0's block freed in stream order from it
		"b", "0", "c", // device 0's primary context reset from it
		"G", "R", "64M", "R", "1M", // device 1's quota, taken in the created context
		"X", "0", "c", "R", "64M") // destroyed: its memory is given back
	checkSteps(t, out, []step{
		{"R", 0, 0}, {"R", 1, 0}, {"C", 0, cuSuccess}, {"Z", 0, 0}, {"b", 0, cuSuccess},
		{"G", 0, 0}, {"R", 2, 0}, {"R", 3, harness.ErrMemoryAllocation}, {"X", 0, cuSuccess}, {"R", 4, 0},
	})
	for i := range 3 {
		if who := out.Line(t, "c", i)[2]; who != "c0" {
			t.Errorf("current context #%d: %s, want the created context c0\n%v", i, who, out)
		}
	}
	if dev := out.Num(t, "G", 0, 2); dev != 1 {
		t.Errorf("cudaGetDevice in device 1's created context: %d", dev)
	}
}

// TestCreatedContextForms: a context created with cuCtxCreate_v3 (what
// cuGetProcAddress answers for cuCtxCreate from CUDA 11.4 on) or
// cuCtxCreate_v4 (CUDA 13's cuCtxCreate) is a created context like one of
// cuCtxCreate_v2: what is allocated in it is counted on its device, served
// by CUDA in that context rather than from the primary context's pool, and
// given back when it is destroyed.
func TestCreatedContextForms(t *testing.T) {
	for _, form := range []string{"v3", "v4", "proc"} {
		t.Run(form, func(t *testing.T) {
			out := runSwitch(t, []string{"SIMCUDA_DEVICES=2x1GiB", "SPILLWAY_MEMORY_LIMIT=64MiB"},
				"N", form, "1", // a created context on device 1, current
				"R", "64M", "R", "1M", // device 1's quota, taken in it
				"X", "0", "U", "p1", "R", "64M") // destroyed: its memory is given back
			checkSteps(t, out, []step{
				{"C", 0, cuSuccess}, {"R", 0, 0}, {"R", 1, harness.ErrMemoryAllocation},
				{"X", 0, cuSuccess}, {"U", 0, cuSuccess}, {"R", 2, 0},
			})
		})
	}
}

// TestCreatedContextSyncKeepsPoolPending: a synchronization made while a
// created context is current (cudaDeviceSynchronize, cuCtxSynchronize)
// waits for that context's work only, as in CUDA, so it does not complete
// the pool's frees: a block freed while the primary context's stream still
// writes to it is not handed out again until the primary context is
// synchronized, and what the program then writes there stays as written.
func TestCreatedContextSyncKeepsPoolPending(t *testing.T) {
	for _, sync := range []string{"y", "k"} {
		t.Run(sync, func(t *testing.T) {
			last := 0 // the primary context's cudaDeviceSynchronize
			if sync == "y" {
				last = 1
			}
			out := runSwitch(t, []string{"SPILLWAY_MEMORY_LIMIT=64MiB"},
				"R", "1M", "B", "W", "0", "0", "170", // a memset of slot 0 queued behind a blocked stream
				"F", "0", // freed: the pool waits for a synchronization
				"C", "0", sync, "O", // synchronized in a created context, popped
				"R", "1M", "P", "1", "85", // slot 1 written with 0x55
				"H", "y", "V", "1", "85") // the memset runs; slot 1 must still hold 0x55
			checkSteps(t, out, []step{
				{"R", 0, 0}, {"B", 0, 0}, {"W", 0, 0}, {"F", 0, 0}, {"C", 0, cuSuccess}, {sync, 0, 0},
				{"O", 0, cuSuccess}, {"R", 1, 0}, {"P", 0, 0}, {"H", 0, 0}, {"y", last, 0}, {"V", 0, 0},
			})
			if a, b := out.Num(t, "R", 0, 3), out.Num(t, "R", 1, 3); a == b {
				t.Errorf("cudaMalloc handed out %#x again while the primary context's stream still wrote to it", b)
			}
			if wrong := out.Num(t, "V", 0, 2); wrong != 0 {
				t.Errorf("%d of 4096 bytes overwritten by a memset queued before the free\n%v", wrong, out)
			}
		})
	}
}

// TestExplicitPoolFailureGivesBack: an allocation from the application's own
// pool that the quota admitted but CUDA then failed gives its bytes back:
// the whole quota is free and allocated afterwards.
func TestExplicitPoolFailureGivesBack(t *testing.T) {
	out, _ := runScriptWith(t, ctxvmm(t, false), 64<<20, []string{"SIMCUDA_FAIL=cuMemAllocFromPoolAsync:1"},
		"P", "a", "40M", "i", "a", "64M")
	checkSteps(t, out, []step{{"P", 0, cuSuccess}, {"a", 0, cuOutOfMemory}, {"i", 0, cuSuccess}, {"a", 1, cuSuccess}})
	if free := out.Num(t, "i", 0, 2); free != 64<<20 {
		t.Errorf("cuMemGetInfo_v2 after a failed allocation from the pool: %d bytes free, want the whole 64 MiB quota", free)
	}
}

// TestPoolMemoryOutlivesCreatedContext: memory from a memory pool
// (cuMemAllocAsync, cuMemAllocFromPoolAsync, cudaMallocAsync) and from
// cuMemCreate, made in a created context, is no context's: cuCtxDestroy
// leaves it (CUDA: it "need[s] to be destroyed explicitly"), so its bytes
// stay counted against the quota (cuMemGetInfo, cudaMemGetInfo, NVML, and
// a refusal past it) until the program frees it from another context. Pool
// memory left so goes with a primary context reset, as on the device.
func TestPoolMemoryOutlivesCreatedContext(t *testing.T) {
	out, _ := runScriptOf(t, ctxvmm(t, true), 64<<20,
		"P", "C", "y", "16M", "a", "8M", "Y", "4M", "m", "2M", "c", "2M", // slots 0-3, handle 0
		"X", "0", "i", "I", "n", "m", "40M", // 30 MiB still held: 40 more are refused
		"z", "0", "f", "1", "F", "2", "L", "0", "i", // freed from the primary context
		"C", "y", "8M", "X", "1", "i", "D", "i", "m", "64M") // left to the primary context, reset
	checkSteps(t, out, []step{
		{"P", 0, cuSuccess}, {"C", 0, cuSuccess}, {"y", 0, cuSuccess}, {"a", 0, cuSuccess}, {"Y", 0, 0},
		{"m", 0, cuSuccess}, {"c", 0, cuSuccess}, {"X", 0, cuSuccess}, {"i", 0, cuSuccess}, {"I", 0, 0},
		{"n", 0, 0}, {"m", 1, cuOutOfMemory},
		{"z", 0, cuSuccess}, {"f", 0, cuSuccess}, {"F", 0, 0}, {"L", 0, cuSuccess}, {"i", 1, cuSuccess},
		{"C", 1, cuSuccess}, {"y", 1, cuSuccess}, {"X", 1, cuSuccess}, {"i", 2, cuSuccess},
		{"D", 0, cuSuccess}, {"i", 3, cuSuccess}, {"m", 2, cuSuccess},
	})
	for _, op := range []string{"i", "I"} {
		if free := out.Num(t, op, 0, 2); free != 34<<20 {
			t.Errorf("%s after cuCtxDestroy_v2: %d bytes free, want 34 MiB (the 30 MiB of pool and cuMemCreate memory still counted)", op, free)
		}
	}
	if used := out.Num(t, "n", 0, 3); used != 30<<20 {
		t.Errorf("NVML after cuCtxDestroy_v2: %d bytes used, want 30 MiB", used)
	}
	if free := out.Num(t, "i", 1, 2); free != 64<<20 {
		t.Errorf("cuMemGetInfo_v2 once the program freed it all: %d bytes free, want the whole 64 MiB quota", free)
	}
	if free := out.Num(t, "i", 2, 2); free != 56<<20 {
		t.Errorf("cuMemGetInfo_v2 after the second cuCtxDestroy_v2: %d bytes free, want 56 MiB (8 MiB of cuMemAllocAsync still counted)", free)
	}
	if free := out.Num(t, "i", 3, 2); free != 64<<20 {
		t.Errorf("cuMemGetInfo_v2 after the primary context reset: %d bytes free, want the whole 64 MiB quota", free)
	}
}

// TestCreatedContextFailedCallsKeepCount: a call on a created context that
// CUDA fails changes nothing, and neither does the quota's count: an
// allocation CUDA refuses gives its bytes back (40 MiB then fit), a free
// CUDA refuses keeps the block counted until its context is destroyed (pool
// memory, which outlives its context, until it is freed), and
// a cuCtxDestroy_v2 or cuCtxDetach CUDA refuses leaves the context, and
// what it holds, counted (40 MiB more are refused) and the context's still:
// freed afterwards, it gives its bytes back (40 MiB then fit).
func TestCreatedContextFailedCallsKeepCount(t *testing.T) {
	for _, c := range []struct {
		name, fail string
		ops        []string
		steps      []step
	}{
		{"alloc", "cuMemAlloc_v2:1", []string{"C", "m", "40M", "m", "40M"},
			[]step{{"m", 0, cuOutOfMemory}, {"m", 1, cuSuccess}}},
		{"free", "cuMemFree_v2:1", []string{"C", "m", "40M", "f", "0", "m", "40M", "X", "0", "m", "40M"},
			[]step{{"m", 0, cuSuccess}, {"f", 0, cuOutOfMemory}, {"m", 1, cuOutOfMemory}, {"X", 0, cuSuccess},
				{"m", 2, cuSuccess}}},
		{"pool free", "cuMemFree_v2:1", []string{"C", "y", "16M", "f", "0", "X", "0", "m", "56M", "f", "0", "m", "64M"},
			[]step{{"y", 0, cuSuccess}, {"f", 0, cuOutOfMemory}, {"X", 0, cuSuccess}, {"m", 0, cuOutOfMemory},
				{"f", 1, cuSuccess}, {"m", 1, cuSuccess}}},
		{"destroy", "cuCtxDestroy_v2:1", []string{"C", "m", "40M", "X", "0", "m", "40M", "f", "0", "m", "40M"},
			[]step{{"m", 0, cuSuccess}, {"X", 0, cuOutOfMemory}, {"m", 1, cuOutOfMemory}, {"f", 0, cuSuccess},
				{"m", 2, cuSuccess}}},
		{"detach", "cuCtxDetach:1", []string{"C", "m", "40M", "T", "0", "m", "40M", "f", "0", "m", "40M"},
			[]step{{"m", 0, cuSuccess}, {"T", 0, cuOutOfMemory}, {"m", 1, cuOutOfMemory}, {"f", 0, cuSuccess},
				{"m", 2, cuSuccess}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, _ := runScriptWith(t, ctxvmm(t, false), 64<<20, []string{"SIMCUDA_FAIL=" + c.fail}, c.ops...)
			checkSteps(t, out, append([]step{{"C", 0, cuSuccess}}, c.steps...))
		})
	}
}

// TestCreatedContextWithoutCore: with Spillway turned off
// (SPILLWAY_DISABLE=1), or no core and no quota, contexts the program
// creates, allocates in, detaches and destroys are CUDA's alone: every call
// passes through and succeeds.
func TestCreatedContextWithoutCore(t *testing.T) {
	for name, vars := range map[string][]string{
		"disabled": {"SPILLWAY_DISABLE=1"},
		"no core":  {"SPILLWAY_CORE=" + filepath.Join(t.TempDir(), "libspillway-core.so")},
	} {
		t.Run(name, func(t *testing.T) {
			_, out := harness.RunOK(t, harness.Shimmed(t, vars, ctxvmm(t, false),
				"C", "m", "1M", "X", "0", "C", "A", "m", "1M", "T", "1", "T", "1"))
			checkSteps(t, out, []step{
				{"C", 0, cuSuccess}, {"m", 0, cuSuccess}, {"X", 0, cuSuccess},
				{"C", 1, cuSuccess}, {"A", 0, cuSuccess}, {"m", 1, cuSuccess}, {"T", 0, cuSuccess}, {"T", 1, cuSuccess},
			})
		})
	}
}

// TestCreatedContextHandleReused: CUDA hands a destroyed context's handle
// to a context created later (simcuda once 64 destroyed ones are kept). A
// context destroyed by cuCtxDestroy_v2 or its last cuCtxDetach is
// forgotten, so that the new context under its handle is a created context
// like any: what is allocated in it is counted there, and given back when
// it is destroyed in turn (the whole quota is free again).
func TestCreatedContextHandleReused(t *testing.T) {
	const destroyed = 65
	for _, destroy := range []string{"X", "T"} {
		t.Run(destroy, func(t *testing.T) {
			var ops []string
			for i := range destroyed {
				ops = append(ops, "C", destroy, itoa(uint64(i)))
			}
			ops = append(ops, "C", "m", "40M", "i", destroy, itoa(destroyed), "i")
			out, _ := runScript(t, 64<<20, ops...)
			checkSteps(t, out, []step{
				{"C", destroyed, cuSuccess}, {"m", 0, cuSuccess}, {"i", 0, cuSuccess},
				{destroy, destroyed, cuSuccess}, {"i", 1, cuSuccess},
			})
			if reused := int64(out.Num(t, "C", destroyed, 3)); reused < 0 {
				t.Fatalf("context %d got a handle no destroyed context had: the test reuses none\n%v", destroyed, out)
			}
			if free := out.Num(t, "i", 0, 2); free != 24<<20 {
				t.Errorf("cuMemGetInfo_v2 with 40 MiB allocated: %d bytes free, want 24 MiB", free)
			}
			if free := out.Num(t, "i", 1, 2); free != 64<<20 {
				t.Errorf("cuMemGetInfo_v2 once the context under a reused handle was destroyed: %d bytes free, want the whole 64 MiB quota\n%v", free, out)
			}
		})
	}
}

// TestPrimaryCtxResetDuringPoolMemoryCall: another thread resets the
// primary context (cudaDeviceReset) between the real call on memory from a
// pool the program created and the shim's record of it: after
// cudaMallocFromPoolAsync's real allocation, and after the free's lookup
// of its block, before the real free. The reset destroys the memory either
// way, and none of it stays counted against the quota.
func TestPrimaryCtxResetDuringPoolMemoryCall(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/resetrace.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-I", filepath.Join(harness.Root(t), "tests", "simcuda"), "-lcuda"}})
	for _, mode := range []string{"alloc", "free"} {
		t.Run(mode, func(t *testing.T) {
			_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=64MiB"}, prog, mode))
			if out.Code(t, "alloc", 0) != 0 || out.Code(t, "reset", 0) != 0 || out.Code(t, "info", 0) != 0 {
				t.Fatalf("the allocation, the reset or cudaMemGetInfo failed: %v", out)
			}
			if free, total := out.Num(t, "info", 0, 2), out.Num(t, "info", 0, 3); free != 64<<20 || total != 64<<20 {
				t.Errorf("cudaMemGetInfo after the reset destroyed the only allocation: free %d of %d, want the whole 64 MiB quota\n%v",
					free, total, out)
			}
		})
	}
}

// TestCreatedContextHandleReusedDuringDestroy: CUDA may hand a context
// created on another thread the handle of one whose cuCtxDestroy_v2 has
// destroyed it but not yet returned. What the new context allocates is its
// own: counted against the quota while it lives, and given back when it is
// destroyed in turn, never as the old context's.
func TestCreatedContextHandleReusedDuringDestroy(t *testing.T) {
	hook := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ctxhook.c"}, Shared: true,
		ProjectHeaders: true, Flags: []string{"-ldl"}})
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ctxreuse.c"}, ProjectHeaders: true,
		Flags: []string{hook, "-Wl,-rpath," + filepath.Dir(hook), "-L", harness.SimcudaDir(t), "-lcuda"}})
	_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=64MiB"}, prog))
	if out.Code(t, "destroy", 0) != cuSuccess || out.Code(t, "create", 0) != cuSuccess ||
		out.Code(t, "alloc", 0) != cuSuccess || out.Code(t, "last", 0) != cuSuccess {
		t.Fatalf("a context call failed: %v", out)
	}
	if out.Num(t, "create", 0, 2) != 1 {
		t.Fatalf("the new context did not get the destroyed one's handle: the test reuses none\n%v", out)
	}
	if free := out.Num(t, "info", 0, 2); free != 62<<20 {
		t.Errorf("cuMemGetInfo_v2 with 2 MiB held in the new context: %d bytes free, want 62 MiB\n%v", free, out)
	}
	if free := out.Num(t, "info", 1, 2); free != 64<<20 {
		t.Errorf("cuMemGetInfo_v2 once the new context was destroyed: %d bytes free, want the whole 64 MiB quota\n%v", free, out)
	}
}

// TestResetsAndContextsRaceWithAllocations: threads allocate and free
// (arrays, the pool's memory, memory from a pool the program created, in
// the primary context through the runtime or the driver; or in contexts of
// their own, which they destroy with what they hold and create again) while
// another thread resets the primary context. Once they stop, the quota
// counts exactly what simcuda still holds for the program: nothing lost,
// nothing left counted.
func TestResetsAndContextsRaceWithAllocations(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/resetstress.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-lcuda"}})
	const quota = 256 << 20
	for _, mode := range []string{"runtime", "driver", "contexts"} {
		t.Run(mode, func(t *testing.T) {
			stats := filepath.Join(t.TempDir(), "stats.json")
			cmd := harness.Shimmed(t, []string{"SIMCUDA_DEVICES=1GiB", "SPILLWAY_MEMORY_LIMIT=256MiB", "SPILLWAY_REPORT=1",
				"SIMCUDA_STATS_FILE=" + stats}, prog, mode, "4", "700", "1")
			res, out := harness.RunOK(t, cmd)
			if out.Num(t, "failed", 0, 1) != 0 || out.Code(t, "info", 0) != 0 || out.Num(t, "info", 0, 3) != quota {
				t.Fatalf("calls failed: %v\n%s", out, res.Stderr)
			}
			reports, err := harness.ParseReports(res.Stderr)
			if err != nil {
				t.Fatal(err)
			}
			rep := reports[0] // none when the last reset left no pool
			s := harness.ReadStats(t, stats)
			// What the quota counts beside the pool's cache; what simcuda holds beside the pool's reservations.
			counted := quota - out.Num(t, "info", 0, 2)
			held := s.Devices[0].DeviceBytes - rep.Reserved + rep.Live
			if counted != held {
				t.Errorf("the quota counts %d bytes in use, simcuda holds %d for the program\n%v\n%s", counted, held, out, res.Stderr)
			}
		})
	}
}

// TestPrimaryCtxResetDuringCreatedContextDestroy: another thread resets
// the primary context while cuCtxDestroy_v2 of a created context holding
// memory from a memory pool is under way, once the driver has destroyed
// the context. That memory, the primary context's once its context is
// gone, is destroyed by the reset, and none of it stays counted.
func TestPrimaryCtxResetDuringCreatedContextDestroy(t *testing.T) {
	hook := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ctxhook.c"}, Shared: true,
		ProjectHeaders: true, Flags: []string{"-ldl"}})
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ctxreset.c"}, ProjectHeaders: true,
		Flags: []string{hook, "-Wl,-rpath," + filepath.Dir(hook), "-L", harness.SimcudaDir(t), "-lcuda"}})
	_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=64MiB"}, prog))
	if out.Code(t, "destroy", 0) != cuSuccess || out.Code(t, "reset", 0) != cuSuccess || out.Code(t, "info", 0) != cuSuccess {
		t.Fatalf("a context call failed: %v", out)
	}
	if free := out.Num(t, "info", 0, 2); free != 64<<20 {
		t.Errorf("cuMemGetInfo_v2 once the reset destroyed the only allocation: %d bytes free, want the whole 64 MiB quota\n%v", free, out)
	}
}
